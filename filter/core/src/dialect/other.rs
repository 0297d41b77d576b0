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
