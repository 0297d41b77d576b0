//! Anthropic Messages (`…/messages`), in its own words.

/// Anthropic Messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde::Serialize;
    use serde_json::{Map, Value};

    use super::Messages;
    use crate::budget::reply::ReplyKind;
    use crate::dialect::answer::stream;
    use crate::dialect::answer::{
        refusal_of, string, Answer, Hear, RateHeaders, Refusal, Reset, Stored,
    };
    use crate::dialect::chat::Error;
    use crate::json::Json;
    use crate::sse::AnyGrammar;
    use crate::usage::{Reported, Usage};

    impl Answer for Messages {
        /// `input_tokens` counts only the input not read from or written
        /// to the prompt cache: the input is all three.
        fn usage(&self, r: &Reported) -> Usage {
            let read = r.cache_read_input_tokens.unwrap_or(0);
            let written = r.cache_creation_input_tokens.unwrap_or(0);
            Usage {
                prompt_tokens: r.input_tokens.saturating_add(read).saturating_add(written),
                completion_tokens: r.output_tokens,
                cached_tokens: read,
            }
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

        fn refusal(&self, status: u16, body: &Value) -> Option<Refusal> {
            refusal_of(status, body)
        }

        /// One turn: the message's `content` blocks, ended for its
        /// `stop_reason`.
        fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool {
            out.content(answer.get("content"));
            out.end_turn(answer.get("stop_reason").and_then(string));
            true
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
}
