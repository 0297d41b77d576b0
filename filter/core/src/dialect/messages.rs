//! Anthropic Messages (`…/messages`), in its own words.

/// Anthropic Messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

mod markers;
pub mod stream;

use super::prompt::{items, non_empty_string, one, only_role, role, Prompt};
use super::request::{MarkAsk, Prefix, Request, Turns};
use crate::dialect::request::TokenField;
use crate::json::{Document, Json};

impl Request for Messages {
    /// Anthropic's `metadata.user_id`.
    fn user<'a>(&self, body: &'a Json) -> Option<&'a str> {
        non_empty_string(body.get("metadata")?.get("user_id")?)
    }

    /// Anthropic's `x-api-key`, else `authorization`.
    fn authenticates_with(&self) -> &'static [&'static str] {
        &["x-api-key", "authorization"]
    }

    fn credential_header(&self) -> Option<&'static str> {
        Some("x-api-key")
    }

    /// The API version Anthropic requires of every call.
    fn keyless_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[("anthropic-version", "2023-06-01")]
    }

    fn samples(&self) -> bool {
        true
    }

    fn output_cap_field(&self, _configured: TokenField) -> Option<TokenField> {
        Some(TokenField::MaxTokens)
    }

    fn shaped(&self) -> bool {
        true
    }

    fn turns_field(&self) -> Option<&'static str> {
        Some("messages")
    }

    /// A user message starts a turn unless it answers a tool call (a
    /// `tool_result` block); nothing is pinned (the system prompt is apart).
    fn turns(&self, messages: &[Json]) -> Option<Turns> {
        let roles = messages
            .iter()
            .map(only_role)
            .collect::<Option<Vec<&str>>>()?;
        let starts: Vec<bool> = messages
            .iter()
            .zip(&roles)
            .map(|(m, r)| *r == "user" && !answers_a_tool(m))
            .collect();
        let current = starts.iter().rposition(|s| *s)?;
        Some(Turns {
            pinned: vec![false; messages.len()],
            starts,
            current,
        })
    }

    fn prompt<'a>(&self, body: &'a Json) -> Option<Prompt<'a>> {
        Some(Prompt::new(body.get("system"), None, body.get("messages")))
    }

    fn prompt_fields(&self) -> &'static [&'static str] {
        &["system", "messages"]
    }

    fn converses(&self) -> bool {
        true
    }

    /// `cache_control` breakpoints on the last tool, the system prompt and
    /// the conversation's last two user turns (see [`markers`]).
    fn mark_cache(&self, doc: &mut Document, ask: &MarkAsk) -> u32 {
        markers::mark(doc, ask)
    }

    /// Tools then the system prompt, cut after the first block a
    /// `cache_control` marks when one does (what the provider caches: the
    /// mark ends the shared part), and the first user message.
    fn prefix<'a>(&self, body: &'a Json) -> Option<Prefix<'a>> {
        let mut shared = [None, None];
        for (slot, part) in shared
            .iter_mut()
            .zip([body.get("tools"), body.get("system")])
        {
            let Some(Json::Array(blocks)) = part else {
                *slot = Some(one(part));
                continue;
            };
            let mark = blocks.iter().position(|b| b.get("cache_control").is_some());
            let cut = mark.map_or(blocks.len(), |i| i.saturating_add(1));
            *slot = Some(blocks.get(..cut).unwrap_or(blocks));
            if mark.is_some() {
                break;
            }
        }
        Some(Prefix {
            shared,
            turn: one(items(body.get("messages"))
                .iter()
                .find(|m| role(m) == Some("user"))),
        })
    }
}

/// True when an Anthropic message's content holds a `tool_result` block.
fn answers_a_tool(message: &Json) -> bool {
    matches!(message.get("content"), Some(Json::Array(blocks))
        if blocks.iter().any(|b| matches!(b.get("type"), Some(Json::String(t)) if t == "tool_result")))
}

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde::Serialize;
    use serde_json::{Map, Value};

    use super::Messages;
    use crate::dialect::answer::head::{self, count, detail, optional_count, Members};
    use crate::dialect::answer::Error;
    use crate::dialect::answer::ReplyKind;
    use crate::dialect::answer::{string, Answer, Hear, RateHeaders, Reset, Stored};
    use crate::dialect::messages::stream;
    use crate::dialect::AnyGrammar;
    use crate::json::Json;
    use crate::usage::{Head, Usage};

    impl Answer for Messages {
        /// `input_tokens` counts only the input not read from or written
        /// to the prompt cache: the input is all three. The writes are
        /// split by how long they are kept in `cache_creation` (when the
        /// answer says; else all are for five minutes).
        fn usage(&self, usage: &Value) -> Option<Usage> {
            let u = usage.as_object()?;
            let read = optional_count(u, "cache_read_input_tokens")?;
            let short = detail(u, "cache_creation", "ephemeral_5m_input_tokens")?.unwrap_or(0);
            let hour = detail(u, "cache_creation", "ephemeral_1h_input_tokens")?.unwrap_or(0);
            let written =
                optional_count(u, "cache_creation_input_tokens")?.max(short.saturating_add(hour));
            Some(Usage {
                prompt_tokens: count(u, "input_tokens")?
                    .saturating_add(read)
                    .saturating_add(written),
                completion_tokens: count(u, "output_tokens")?,
                cached_tokens: read,
                cache_write_tokens: written,
                cache_write_1h_tokens: hour,
                reasoning_tokens: 0,
            })
        }

        /// Its usage, id and model, and its `stop_reason`.
        fn head(&self, body: &[u8]) -> Head {
            head::read(body, &["usage", "id", "model", "stop_reason"], |m| {
                let mut head = m.head(|u| self.usage(u))?;
                stop_reason(m, &mut head)?;
                Some(head)
            })
        }

        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Messages(stream::Messages::default())
        }

        /// As sent, the JSON or every event of the stream.
        fn stored(&self) -> Option<Stored> {
            Some(Stored::AsSent)
        }

        /// A `message` that gave its `stop_reason`.
        fn complete(&self, answer: &Map<String, Value>) -> bool {
            answer.get("type").and_then(Value::as_str) == Some("message")
                && answer.get("stop_reason").is_some_and(Value::is_string)
        }

        /// Anthropic's shape, with the status its SDKs map to the matching
        /// error (529 `overloaded_error` for a shed or refused call, which
        /// they retry after `retry-after`).
        fn local_error(&self, kind: ReplyKind, message: &str) -> (u32, Vec<u8>) {
            let (status, error_type) = status_and_type(kind);
            (status, error_body(message, error_type, kind.code()))
        }

        fn rate_headers(&self) -> &'static RateHeaders {
            &RATE_HEADERS
        }

        fn provider(&self) -> &'static str {
            "anthropic"
        }

        /// One turn: the message's `content` blocks, ended for its
        /// `stop_reason`.
        fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool {
            out.content(answer.get("content"));
            out.end_turn(answer.get("stop_reason").and_then(string));
            true
        }

        fn said_fields(&self) -> &'static [&'static str] {
            &["content"]
        }

        /// A `content_block_delta`'s text, tool input or thinking, keyed
        /// by its block's `index`.
        fn deltas(&self, event: &mut Json, f: &mut dyn FnMut(u32, &mut String)) {
            if event.get("type").and_then(string) != Some("content_block_delta") {
                return;
            }
            let key = match event.get("index") {
                Some(Json::Number(n)) => n.parse::<u32>().unwrap_or(0),
                _ => 0,
            };
            let Some(delta) = event.get_mut("delta") else {
                return;
            };
            if let Json::Object(members) = delta {
                for (name, v) in members.iter_mut() {
                    if let (true, Json::String(s)) = (
                        matches!(name.as_str(), "text" | "partial_json" | "thinking"),
                        v,
                    ) {
                        f(key, s);
                    }
                }
            }
        }

        fn error_event(&self) -> Option<&'static str> {
            Some("error")
        }
    }

    /// Anthropic's names of what is left of a caller's limits; the reset is
    /// the instant, RFC 3339.
    const RATE_HEADERS: RateHeaders = RateHeaders {
        requests: [
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ],
        tokens: [
            "anthropic-ratelimit-tokens-limit",
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        ],
        reset: Reset::Instant,
    };

    /// Anthropic's status and error `type` for a local reply.
    fn status_and_type(kind: ReplyKind) -> (u32, &'static str) {
        match kind {
            ReplyKind::Shed
            | ReplyKind::Reject
            | ReplyKind::DegradeShed
            | ReplyKind::DegradeReject => (529, "overloaded_error"),
            ReplyKind::BudgetExhausted | ReplyKind::UpstreamTimeout => (504, "timeout_error"),
            ReplyKind::TooLarge => (413, "request_too_large"),
            ReplyKind::OverLimit => (429, "rate_limit_error"),
            ReplyKind::NoCredential | ReplyKind::GuardrailUnavailable => (503, "api_error"),
            ReplyKind::Unauthenticated => (401, "authentication_error"),
            ReplyKind::Blocked | ReplyKind::Unchecked => (400, "invalid_request_error"),
            ReplyKind::AnswerBlocked => (502, "api_error"),
        }
    }

    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: Error<'a>,
    }

    /// `{"type":"error","error":{"type":…,"message":…,"code":…}}`:
    /// Anthropic's error shape, with the filter's stable `code` beside its
    /// fields.
    pub fn error_body(message: &str, error_type: &str, code: &str) -> Vec<u8> {
        let body = Body {
            kind: "error",
            error: Error {
                message,
                kind: error_type,
                code,
            },
        };
        serde_json::to_vec(&body).unwrap_or_else(|_| {
            br#"{"type":"error","error":{"type":"api_error","message":"request refused"}}"#.to_vec()
        })
    }

    /// A message's `stop_reason`; `None` when it is no string.
    pub(crate) fn stop_reason(m: &Members<'_>, head: &mut Head) -> Option<()> {
        if let Some(reason) = m.get::<String>("stop_reason")? {
            head.ended_for(&reason);
        }
        Some(())
    }
}

pub(crate) use answers::stop_reason;
