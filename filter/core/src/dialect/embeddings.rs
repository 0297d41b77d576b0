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

// The answer: OpenAI's family's (the [`super::answer`] side), a list of
// vectors.

use serde_json::{Map, Value};

use super::answer::Stored;
use super::openai::Family;
use super::Dialect;

impl Family for Embeddings {
    const DIALECT: Dialect = Dialect::Embeddings;
    /// Never streamed: a hit is always the JSON list.
    const STORED: Stored = Stored::Canonical(None);
    /// Vectors: no text to tell or check.
    const SAYS_TEXT: bool = false;

    fn complete(answer: &Map<String, Value>) -> bool {
        answer.get("data").is_some_and(Value::is_array)
    }
}
