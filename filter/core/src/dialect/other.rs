//! A configured path of another shape: an LLM call the filter tags, budgets and routes but whose body it does not read by any API's words.

/// A path of another shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct Other;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::request::Request;

impl Request for Other {
    fn operation(&self) -> &'static str {
        "other"
    }
}

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde_json::{Map, Value};

    use super::Other;
    use crate::dialect::answer::{stream, Answer, Hear, Stored};
    use crate::dialect::Dialect;
    use crate::json::Json;
    use crate::sse::AnyGrammar;
    use crate::usage::{Reported, Usage};

    impl Answer for Other {
        /// Any dialect's names, added up: a path of another shape may
        /// answer in any of them.
        fn usage(&self, r: &Reported) -> Usage {
            let read = r.cache_read_input_tokens.unwrap_or(0);
            let written = r.cache_creation_input_tokens.unwrap_or(0);
            let details = r.prompt_tokens_details.or(r.input_tokens_details);
            Usage {
                prompt_tokens: r
                    .prompt_tokens
                    .saturating_add(r.input_tokens)
                    .saturating_add(read)
                    .saturating_add(written),
                completion_tokens: r.completion_tokens.saturating_add(r.output_tokens),
                cached_tokens: Reported::cached(details).saturating_add(read),
            }
        }

        /// Read as a chat stream, the commonest shape.
        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Chat(stream::Chat::of(Dialect::Other))
        }

        /// Never cached: its answers' shape is not known.
        fn stored(&self) -> Option<Stored> {
            None
        }

        fn complete(&self, _answer: &Map<String, Value>) -> bool {
            false
        }

        /// Its answers' shape is not known: no text to tell.
        fn said(&self, _answer: &Json, _out: &mut dyn Hear) -> bool {
            false
        }
    }
}
