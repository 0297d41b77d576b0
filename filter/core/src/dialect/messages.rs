//! Anthropic Messages (`…/messages`), in its own words.

/// Anthropic Messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde_json::{Map, Value};

    use super::Messages;
    use crate::dialect::answer::{Answer, Stored};
    use crate::sse::{self, AnyGrammar};
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
            AnyGrammar::Messages(sse::Messages::default())
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
    }
}
