//! OpenAI chat completions (`…/chat/completions`), in its own words.

/// OpenAI chat completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Chat;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

pub mod stream;

use super::prompt::{items, one, only_role, role, Prompt};
use super::request::{Prefix, Question, Request, Turns, PINNED_ROLES};
use crate::dialect::request::TokenField;
use crate::json::{Document, Json};

impl Request for Chat {
    fn samples(&self) -> bool {
        true
    }

    fn absent_temperature_is_default(&self) -> bool {
        true
    }

    fn output_cap_field(&self, configured: TokenField) -> Option<TokenField> {
        Some(configured)
    }

    fn shaped(&self) -> bool {
        true
    }

    fn turns_field(&self) -> Option<&'static str> {
        Some("messages")
    }

    /// Turns start at user messages; a tool answer joins its call's turn
    /// even when a user message sits between them; system and developer
    /// messages are pinned.
    fn turns(&self, messages: &[Json]) -> Option<Turns> {
        let roles = messages
            .iter()
            .map(only_role)
            .collect::<Option<Vec<&str>>>()?;
        let last_user = roles.iter().rposition(|r| *r == "user")?;
        let pinned: Vec<bool> = roles.iter().map(|r| PINNED_ROLES.contains(r)).collect();
        let mut starts: Vec<bool> = roles.iter().map(|r| *r == "user").collect();
        // A tool answer and the call it answers share one turn.
        for (t, m) in messages.iter().enumerate() {
            if roles.get(t) != Some(&"tool") {
                continue;
            }
            let Some(caller) = caller_of(messages, t, m) else {
                continue;
            };
            for s in starts.iter_mut().take(t + 1).skip(caller + 1) {
                *s = false;
            }
        }
        Some(Turns {
            starts,
            pinned,
            current: last_user,
        })
    }

    fn prompt<'a>(&self, body: &'a Json) -> Option<Prompt<'a>> {
        Some(Prompt::new(None, None, body.get("messages")))
    }

    fn prompt_fields(&self) -> &'static [&'static str] {
        &["messages", "prompt", "suffix"]
    }

    fn question(&self) -> Option<Question> {
        Some(Question::LastUserMessage)
    }

    fn converses(&self) -> bool {
        true
    }

    fn takes_prompt_cache_key(&self) -> bool {
        true
    }

    /// Tools (or legacy functions), the leading system and developer
    /// messages, and the first user message.
    fn prefix<'a>(&self, body: &'a Json) -> Option<Prefix<'a>> {
        let messages = items(body.get("messages"));
        let system = messages
            .iter()
            .take_while(|m| matches!(role(m), Some("system" | "developer")))
            .count();
        Some(Prefix {
            shared: [
                Some(one(body.get("tools").or(body.get("functions")))),
                Some(messages.get(..system).unwrap_or_default()),
            ],
            turn: one(messages.iter().find(|m| role(m) == Some("user"))),
        })
    }

    fn ask_for_usage(&self, doc: &mut Document) -> bool {
        ask_for_usage(doc)
    }
}

/// The value of `stream_options` that asks the provider for usage.
const ASK_USAGE: &[u8] = br#"{"include_usage":true}"#;

/// Sets `stream_options.include_usage` in the body of a streamed request,
/// every other byte kept (the final chunk then carries `usage`, which the
/// stream's grammar picks up). False, and nothing changed, when it needs no
/// change (not a stream, or usage already asked) or cannot take one without
/// rewriting what the client wrote (a `stream_options` of its own).
pub(crate) fn ask_for_usage(doc: &mut Document) -> bool {
    let Some(tree) = doc.tree() else {
        return false;
    };
    if tree.get("stream") != Some(&Json::Bool(true)) || tree.get("stream_options").is_some() {
        return false;
    }
    doc.set_text("stream_options", ASK_USAGE)
}

/// The index of the assistant message before `t` whose `tool_calls` hold the
/// id the tool message `m` answers; without an id, the nearest assistant
/// message that calls tools.
fn caller_of(messages: &[Json], t: usize, m: &Json) -> Option<usize> {
    let id = match m.get("tool_call_id") {
        Some(Json::String(id)) => Some(id.as_str()),
        _ => None,
    };
    messages.get(..t)?.iter().rposition(|a| {
        let Some(Json::Array(calls)) = a.get("tool_calls") else {
            return false;
        };
        match id {
            Some(id) => calls
                .iter()
                .any(|c| matches!(c.get("id"), Some(Json::String(x)) if x == id)),
            None => !calls.is_empty(),
        }
    })
}

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde::Deserialize;
    use serde_json::{Map, Value};

    use super::Chat;
    use crate::dialect::answer::head::{self, count, optional_count, Members};

    use crate::dialect::answer::{list, string, Answer, Choices, Hear, Stored};
    use crate::dialect::chat::stream;
    use crate::dialect::AnyGrammar;
    use crate::dialect::Dialect;
    use crate::json::Json;
    use crate::usage::{Head, Usage};

    impl Answer for Chat {
        fn usage(&self, usage: &Value) -> Option<Usage> {
            openai_usage(usage)
        }

        fn head(&self, body: &[u8]) -> Head {
            openai_head(body)
        }

        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Chat(stream::Chat::of(Dialect::Chat))
        }

        fn stored(&self) -> Option<Stored> {
            Some(Stored::Canonical(Some(Choices {
                object: "chat.completion",
                chunk: "chat.completion.chunk",
                message: true,
            })))
        }

        fn complete(&self, answer: &Map<String, Value>) -> bool {
            choices_finished(answer)
        }

        /// Each choice: its `message`, or a completion's `text`.
        fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool {
            choices_said(answer, out);
            true
        }
    }

    /// What each choice of an OpenAI answer said: a chat `message`, or a
    /// completion's `text`, with its `finish_reason`.
    pub(crate) fn choices_said(answer: &Json, out: &mut dyn Hear) {
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
    pub(crate) fn choices_finished(answer: &Map<String, Value>) -> bool {
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
    pub(crate) fn openai_usage(usage: &Value) -> Option<Usage> {
        let u = usage.as_object()?;
        Some(Usage {
            prompt_tokens: count(u, "prompt_tokens")?,
            completion_tokens: count(u, "completion_tokens")?,
            cached_tokens: detail(u, "prompt_tokens_details", "cached_tokens")?.unwrap_or(0),
            reasoning_tokens: detail(u, "completion_tokens_details", "reasoning_tokens")?
                .unwrap_or(0),
            ..Usage::default()
        })
    }

    /// The count `field` of a usage's details object `name` (OpenAI's and
    /// Responses' words): `Some(None)` when there are no details (absent or
    /// null), `None` when they are of another type.
    pub(crate) fn detail(
        usage: &Map<String, Value>,
        name: &str,
        field: &str,
    ) -> Option<Option<u64>> {
        match usage.get(name) {
            None | Some(Value::Null) => Some(None),
            Some(Value::Object(details)) => optional_count(details, field).map(Some),
            Some(_) => None,
        }
    }

    /// The members an OpenAI answer's head is read from.
    const OPENAI_HEAD: &[&str] = &["usage", "id", "model", "choices"];

    /// The head of an answer of OpenAI's chat, completions or embeddings
    /// (the one reader the three share): its usage, id, model and each
    /// choice's `finish_reason`.
    pub(crate) fn openai_head(body: &[u8]) -> Head {
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
}

pub(crate) use answers::{
    choice_reasons, choices_finished, choices_said, detail, openai_head, openai_usage,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_asked_of_streams_that_did_not() {
        for (body, want) in [
            (
                r#" {"stream":true,"model":"m"}"#,
                Some(r#" {"stream":true,"model":"m","stream_options":{"include_usage":true}}"#),
            ),
            (r#"{"stream":false}"#, None),
            (r#"{"model":"m"}"#, None),
            (r#"{"stream":true,"stream_options":null}"#, None),
            (
                r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
                None,
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
                None,
            ),
        ] {
            let mut doc = Document::parse(body.as_bytes().to_vec());
            let got = ask_for_usage(&mut doc).then(|| doc.into_bytes());
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{body}");
            if let Some(got) = got {
                let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
                assert_eq!(v["stream_options"]["include_usage"], true);
            }
        }
    }
}
