//! OpenAI chat completions (`…/chat/completions`), in its own words.

/// OpenAI chat completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Chat;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::request::{
    items, one, only_role, role, Prefix, Prompt, Question, Request, Turns, PINNED_ROLES,
};
use crate::json::{Document, Json};
use crate::shaping::TokenField;

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
        crate::usage::ask_for_usage(doc)
    }
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
    use serde::Serialize;
    use serde_json::{Map, Value};

    use super::Chat;
    use crate::budget::reply::ReplyKind;
    use crate::dialect::answer::stream;
    use crate::dialect::answer::{list, string, Answer, Choices, Hear, RateHeaders, Reset, Stored};
    use crate::dialect::Dialect;
    use crate::json::Json;
    use crate::sse::AnyGrammar;
    use crate::usage::{Reported, Usage};

    impl Answer for Chat {
        fn usage(&self, reported: &Reported) -> Usage {
            openai_usage(reported)
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

    /// A local reply in OpenAI's shape, with the reply module's status.
    pub(crate) fn openai_local_error(kind: ReplyKind, message: &str) -> (u32, Vec<u8>) {
        (
            kind.status(),
            error_body(message, kind.error_type(), kind.code()),
        )
    }

    /// OpenAI's names of what is left of a caller's limits; the reset is
    /// in seconds from now.
    pub(crate) const RATE_HEADERS: RateHeaders = RateHeaders {
        requests: [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
        tokens: [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ],
        reset: Reset::Seconds,
    };

    #[derive(Serialize)]
    struct Body<'a> {
        error: Error<'a>,
    }

    /// The error object of OpenAI's shape, and of Anthropic's beside its
    /// `type` (the filter's stable `code` among its fields).
    #[derive(Serialize)]
    pub(crate) struct Error<'a> {
        pub(crate) message: &'a str,
        #[serde(rename = "type")]
        pub(crate) kind: &'a str,
        pub(crate) code: &'a str,
    }

    /// `{"error":{"message":…,"type":…,"code":…}}`: OpenAI's error shape,
    /// which its chat, completions, embeddings and Responses share, every
    /// string JSON-escaped.
    pub fn error_body(message: &str, error_type: &str, code: &str) -> Vec<u8> {
        let body = Body {
            error: Error {
                message,
                kind: error_type,
                code,
            },
        };
        // Serialising borrowed strings cannot fail; the fallback keeps the
        // data path free of `unwrap` all the same.
        serde_json::to_vec(&body).unwrap_or_else(|_| {
            br#"{"error":{"message":"request refused","type":"service_unavailable","code":null}}"#
                .to_vec()
        })
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
    /// `prompt_tokens_details.cached_tokens`) and `completion_tokens`.
    pub(crate) fn openai_usage(r: &Reported) -> Usage {
        Usage {
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cached_tokens: Reported::cached(r.prompt_tokens_details),
        }
    }
}

pub use answers::error_body;
pub(crate) use answers::{
    choices_finished, choices_said, openai_local_error, openai_usage, Error, RATE_HEADERS,
};
