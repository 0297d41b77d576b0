//! What OpenAI's chat, completions and embeddings answer alike: the usage
//! and head read by OpenAI's names, the stream of `data:` chunks, and (the
//! [`Answer`] defaults) the error shape, the limits' headers, the refusal
//! reading and the provider. One impl serves the three: each API's file
//! says only how its answers differ ([`Family`]).

use serde::Deserialize;
use serde_json::{Map, Value};

use super::answer::head::{self, count, detail, Members};
use super::answer::{list, string, Answer, Hear, Stored};
use super::chat::stream;
use super::{AnyGrammar, Dialect};
use crate::json::Json;
use crate::usage::{Head, Usage};

/// An API of OpenAI's family, by what its answers hold and how the cache
/// keeps them; its [`Answer`] is the family's.
pub trait Family: Sync {
    /// The dialect, whose names its streams' usage is read by.
    const DIALECT: Dialect;
    /// How the cache keeps its answers.
    const STORED: Stored;
    /// Its answers say text, each choice's; false: vectors, no text to
    /// tell or check (embeddings).
    const SAYS_TEXT: bool = true;

    /// A JSON answer (an object without an `error`) is complete: every
    /// choice finished, and there is one at least.
    fn complete(answer: &Map<String, Value>) -> bool {
        choices_finished(answer)
    }
}

impl<F: Family> Answer for F {
    fn usage(&self, usage: &Value) -> Option<Usage> {
        openai_usage(usage)
    }

    fn head(&self, body: &[u8]) -> Head {
        openai_head(body)
    }

    fn grammar(&self) -> AnyGrammar {
        AnyGrammar::Chat(stream::Chat::of(F::DIALECT))
    }

    fn stored(&self) -> Option<Stored> {
        Some(F::STORED)
    }

    fn complete(&self, answer: &Map<String, Value>) -> bool {
        F::complete(answer)
    }

    /// Each choice: its `message`, or a completion's `text`.
    fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool {
        if F::SAYS_TEXT {
            choices_said(answer, out);
        }
        F::SAYS_TEXT
    }

    fn said_fields(&self) -> &'static [&'static str] {
        if F::SAYS_TEXT {
            &["choices"]
        } else {
            &[]
        }
    }
}

/// What each choice of an OpenAI answer said: a chat `message`, or a
/// completion's `text`, with its `finish_reason`.
fn choices_said(answer: &Json, out: &mut dyn Hear) {
    for choice in list(answer.get("choices")) {
        if out.full() {
            break;
        }
        let reason = choice.get("finish_reason").and_then(string);
        if let Some(t) = choice.get("text").and_then(string) {
            out.text(t, reason);
        } else if let Some(m) = choice.get("message") {
            out.message(m, reason);
        }
    }
}

/// Every choice of an OpenAI answer finished (a `finish_reason`), and
/// there is one at least.
fn choices_finished(answer: &Map<String, Value>) -> bool {
    match answer.get("choices") {
        Some(Value::Array(choices)) => {
            !choices.is_empty()
                && choices
                    .iter()
                    .all(|c| c.get("finish_reason").is_some_and(Value::is_string))
        }
        _ => false,
    }
}

/// The usage OpenAI's chat, completions and embeddings report:
/// `prompt_tokens` (the cached ones among them, in
/// `prompt_tokens_details.cached_tokens`) and `completion_tokens` (the
/// reasoning ones among them, in `completion_tokens_details.reasoning_tokens`).
fn openai_usage(usage: &Value) -> Option<Usage> {
    let u = usage.as_object()?;
    Some(Usage {
        prompt_tokens: count(u, "prompt_tokens")?,
        completion_tokens: count(u, "completion_tokens")?,
        cached_tokens: detail(u, "prompt_tokens_details", "cached_tokens")?.unwrap_or(0),
        reasoning_tokens: detail(u, "completion_tokens_details", "reasoning_tokens")?.unwrap_or(0),
        ..Usage::default()
    })
}

/// The members an OpenAI answer's head is read from.
const OPENAI_HEAD: &[&str] = &["usage", "id", "model", "choices"];

/// The head of an answer of OpenAI's chat, completions or embeddings
/// (the one reader the three share): its usage, id, model and each
/// choice's `finish_reason`.
fn openai_head(body: &[u8]) -> Head {
    head::read(body, OPENAI_HEAD, |m| {
        let mut head = m.head(openai_usage)?;
        choice_reasons(m, &mut head)?;
        Some(head)
    })
}

/// What the head reads of a choice.
#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    finish_reason: Option<String>,
}

/// Each choice's `finish_reason`, in order; `None` when `choices` is
/// not a list of choices.
pub(crate) fn choice_reasons(m: &Members<'_>, head: &mut Head) -> Option<()> {
    for choice in m.get::<Vec<Choice>>("choices")?.unwrap_or_default() {
        if let Some(reason) = choice.finish_reason {
            head.ended_for(&reason);
        }
    }
    Some(())
}
