//! OpenAI legacy text completions (`…/completions`), in its own words.

/// OpenAI legacy text completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Completions;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).
