//! OpenAI embeddings (`…/embeddings`), in its own words.

/// OpenAI embeddings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Embeddings;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::request::Request;

impl Request for Embeddings {
    fn guarded_fields(&self) -> &'static [&'static str] {
        &["input"]
    }

    fn operation(&self) -> &'static str {
        "embeddings"
    }

    /// Embeddings are never streamed, whatever the body says.
    fn streams(&self) -> bool {
        false
    }
}

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde_json::{Map, Value};

    use super::Embeddings;

    use crate::dialect::answer::{Answer, Hear, Stored};
    use crate::dialect::chat::stream;
    use crate::dialect::chat::{openai_head, openai_usage};
    use crate::dialect::AnyGrammar;
    use crate::dialect::Dialect;
    use crate::json::Json;
    use crate::usage::{Head, Usage};

    impl Answer for Embeddings {
        fn usage(&self, usage: &Value) -> Option<Usage> {
            openai_usage(usage)
        }

        fn head(&self, body: &[u8]) -> Head {
            openai_head(body)
        }

        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Chat(stream::Chat::of(Dialect::Embeddings))
        }

        /// A list of vectors: no text to tell.
        fn said(&self, _answer: &Json, _out: &mut dyn Hear) -> bool {
            false
        }

        /// Vectors: no text to check.
        fn said_fields(&self) -> &'static [&'static str] {
            &[]
        }

        /// Never streamed: a hit is always the JSON list.
        fn stored(&self) -> Option<Stored> {
            Some(Stored::Canonical(None))
        }

        fn complete(&self, answer: &Map<String, Value>) -> bool {
            answer.get("data").is_some_and(Value::is_array)
        }
    }
}
