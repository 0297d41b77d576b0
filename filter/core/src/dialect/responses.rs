//! OpenAI Responses (`…/responses`), in its own words.

/// OpenAI Responses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::request::{one, only_role, role, Prefix, Prompt, Request, Turns, PINNED_ROLES};
use crate::json::Json;
use crate::routing::stateful::Continues;
use crate::shaping::TokenField;

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
    use crate::dialect::answer::{list, stream, string, Answer, Hear, Stored};
    use crate::json::Json;
    use crate::sse::AnyGrammar;
    use crate::usage::{Reported, Usage};

    impl Answer for Responses {
        /// `input_tokens` (the cached ones among them, in
        /// `input_tokens_details.cached_tokens`) and `output_tokens`.
        fn usage(&self, r: &Reported) -> Usage {
            Usage {
                prompt_tokens: r.input_tokens,
                completion_tokens: r.output_tokens,
                cached_tokens: Reported::cached(r.input_tokens_details),
            }
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
    }
}
