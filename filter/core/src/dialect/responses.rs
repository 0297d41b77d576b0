//! OpenAI Responses (`…/responses`), in its own words.

/// OpenAI Responses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

pub mod stream;

use super::prompt::{one, only_role, role, Prompt};
use super::request::{Prefix, Request, Turns, PINNED_ROLES};
use crate::dialect::request::{Continues, TokenField};
use crate::json::Json;

impl Request for Responses {
    fn samples(&self) -> bool {
        true
    }

    fn output_cap_field(&self, _configured: TokenField) -> Option<TokenField> {
        Some(TokenField::MaxOutputTokens)
    }

    /// `previous_response_id`, a `conversation` and a `background` run are
    /// state the backend keeps; `store: false` keeps no response.
    fn continues(&self, body: &Json) -> Continues {
        let previous_response_id = match body.get("previous_response_id") {
            Some(Json::String(id)) if !id.is_empty() => Some(id.clone()),
            _ => None,
        };
        let conversation = !matches!(body.get("conversation"), None | Some(Json::Null));
        let background = body.get("background") == Some(&Json::Bool(true));
        Continues {
            state: previous_response_id.is_some() || conversation || background,
            previous_response_id,
            stored: body.get("store") != Some(&Json::Bool(false)),
        }
    }

    fn shaped(&self) -> bool {
        true
    }

    fn turns_field(&self) -> Option<&'static str> {
        Some("input")
    }

    /// A user message starts a turn; system and developer messages are
    /// pinned; every other item (an assistant message, a function call and
    /// its output, reasoning) belongs to the turn it sits in.
    fn turns(&self, items: &[Json]) -> Option<Turns> {
        let mut starts = Vec::with_capacity(items.len());
        let mut pinned = Vec::with_capacity(items.len());
        for item in items {
            if !matches!(item, Json::Object(_)) {
                return None;
            }
            let r = match item.members("role").count() {
                0 => None,
                1 => Some(only_role(item)?),
                _ => return None,
            };
            starts.push(r == Some("user"));
            pinned.push(r.is_some_and(|r| PINNED_ROLES.contains(&r)));
        }
        let current = starts.iter().rposition(|s| *s)?;
        Some(Turns {
            starts,
            pinned,
            current,
        })
    }

    /// `instructions`, then `input`: a string is a bare prompt, a list its
    /// items.
    fn prompt<'a>(&self, body: &'a Json) -> Option<Prompt<'a>> {
        let input = body.get("input");
        Some(match input {
            Some(Json::String(_)) => Prompt::new(body.get("instructions"), Some(input), None),
            _ => Prompt::new(body.get("instructions"), None, input),
        })
    }

    fn prompt_fields(&self) -> &'static [&'static str] {
        &["instructions", "input"]
    }

    fn converses(&self) -> bool {
        true
    }

    fn takes_prompt_cache_key(&self) -> bool {
        true
    }

    /// Instructions, tools, and the first user item (else the first item,
    /// or the input itself when it is no list).
    fn prefix<'a>(&self, body: &'a Json) -> Option<Prefix<'a>> {
        let turn = match body.get("input") {
            Some(Json::Array(items)) => items
                .iter()
                .find(|i| role(i) == Some("user"))
                .or(items.first()),
            other => other,
        };
        Some(Prefix {
            shared: [
                Some(one(body.get("instructions"))),
                Some(one(body.get("tools"))),
            ],
            turn: one(turn),
        })
    }
}

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde_json::{Map, Value};

    use super::Responses;
    use crate::dialect::answer::head::{self, count, detail, Members};

    use crate::dialect::answer::{list, string, Answer, Hear, Stored};
    use crate::dialect::responses::stream;
    use crate::dialect::AnyGrammar;
    use crate::json::Json;
    use crate::usage::{Head, Usage};

    impl Answer for Responses {
        /// `input_tokens` (the cached ones among them, in
        /// `input_tokens_details.cached_tokens`) and `output_tokens` (the
        /// reasoning ones among them, in `output_tokens_details.reasoning_tokens`).
        fn usage(&self, usage: &Value) -> Option<Usage> {
            let u = usage.as_object()?;
            Some(Usage {
                prompt_tokens: count(u, "input_tokens")?,
                completion_tokens: count(u, "output_tokens")?,
                cached_tokens: detail(u, "input_tokens_details", "cached_tokens")?.unwrap_or(0),
                reasoning_tokens: detail(u, "output_tokens_details", "reasoning_tokens")?
                    .unwrap_or(0),
                ..Usage::default()
            })
        }

        /// Its usage, id and model, and why it ended when it is a
        /// `response`.
        fn head(&self, body: &[u8]) -> Head {
            head::read(body, HEAD, |m| {
                let mut head = m.head(|u| self.usage(u))?;
                response_reason(m, &mut head);
                Some(head)
            })
        }

        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Responses(stream::Responses::default())
        }

        /// As sent, the JSON or every event of the stream.
        fn stored(&self) -> Option<Stored> {
            Some(Stored::AsSent)
        }

        fn complete(&self, answer: &Map<String, Value>) -> bool {
            answer.get("status").and_then(Value::as_str) == Some("completed")
        }

        /// One turn: the `output` items' message contents and function
        /// calls, ended for the incomplete reason, else the status.
        fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool {
            for item in list(answer.get("output")) {
                if out.full() {
                    break;
                }
                match item.get("type").and_then(string) {
                    Some("message") => out.content(item.get("content")),
                    Some("function_call") => out.item(item),
                    _ => {}
                }
            }
            let reason = answer
                .get("incomplete_details")
                .and_then(|d| d.get("reason"))
                .and_then(string)
                .or_else(|| answer.get("status").and_then(string));
            out.end_turn(reason);
            true
        }

        fn said_fields(&self) -> &'static [&'static str] {
            &["output"]
        }

        /// A `response.*.delta` event's `delta` (output text, refusal,
        /// function call arguments), keyed by its item and part.
        fn deltas(&self, event: &mut Json, f: &mut dyn FnMut(u32, &mut String)) {
            let delta = event
                .get("type")
                .and_then(string)
                .is_some_and(|t| t.starts_with("response.") && t.ends_with(".delta"));
            if !delta {
                return;
            }
            let index = |name: &str| match event.get(name) {
                Some(Json::Number(n)) => n.parse::<u32>().unwrap_or(0),
                _ => 0,
            };
            let key = (index("output_index") << 6) | index("content_index").min(63);
            if let Some(Json::String(s)) = event.get_mut("delta") {
                f(key, s);
            }
        }

        fn error_event(&self) -> Option<&'static str> {
            Some("error")
        }
    }

    /// The members a Responses answer's head is read from.
    const HEAD: &[&str] = &[
        "usage",
        "id",
        "model",
        "object",
        "status",
        "incomplete_details",
    ];

    /// Why a `response` ended: its incomplete reason, else its status (any
    /// JSON in these members: another answer may use the names for
    /// something else, and never loses its head for it).
    pub(crate) fn response_reason(m: &Members<'_>, head: &mut Head) {
        let member = |name| m.get::<Value>(name).flatten();
        if member("object").is_none_or(|o| o != "response") {
            return;
        }
        let (incomplete, status) = (member("incomplete_details"), member("status"));
        let reason = incomplete
            .as_ref()
            .and_then(|d| d.get("reason"))
            .and_then(Value::as_str)
            .or(status.as_ref().and_then(Value::as_str));
        if let Some(reason) = reason {
            head.ended_for(reason);
        }
    }
}

pub(crate) use answers::response_reason;
