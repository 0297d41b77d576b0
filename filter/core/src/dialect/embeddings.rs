//! OpenAI embeddings (`…/embeddings`), in its own words.

/// OpenAI embeddings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Embeddings;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).
