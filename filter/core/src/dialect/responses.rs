//! OpenAI Responses (`…/responses`), in its own words.

/// OpenAI Responses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde_json::{Map, Value};

    use super::Responses;
    use crate::budget::reply::ReplyKind;
    use crate::dialect::answer::{
        list, refusal_of, stream, string, Answer, Hear, RateHeaders, Refusal, Stored,
    };
    use crate::dialect::chat::{openai_local_error, RATE_HEADERS};
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

        fn local_error(&self, kind: ReplyKind, message: &str) -> (u32, Vec<u8>) {
            openai_local_error(kind, message)
        }

        fn rate_headers(&self) -> &'static RateHeaders {
            &RATE_HEADERS
        }

        fn refusal(&self, status: u16, body: &Value) -> Option<Refusal> {
            refusal_of(status, body)
        }

        fn provider(&self) -> &'static str {
            "openai"
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
