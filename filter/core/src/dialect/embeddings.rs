//! OpenAI embeddings (`…/embeddings`), in its own words.

/// OpenAI embeddings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Embeddings;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::request::Request;

impl Request for Embeddings {
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
