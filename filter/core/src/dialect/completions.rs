//! OpenAI legacy text completions (`…/completions`), in its own words.

/// OpenAI legacy text completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Completions;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

use super::prompt::{one, Prompt};
use super::request::{Prefix, Question, Request};
use crate::dialect::request::TokenField;
use crate::json::{Document, Json};

impl Request for Completions {
    fn operation(&self) -> &'static str {
        "text_completion"
    }

    fn samples(&self) -> bool {
        true
    }

    fn absent_temperature_is_default(&self) -> bool {
        true
    }

    fn output_cap_field(&self, configured: TokenField) -> Option<TokenField> {
        Some(configured)
    }

    fn prompt<'a>(&self, body: &'a Json) -> Option<Prompt<'a>> {
        Some(Prompt::new(None, Some(body.get("prompt")), None))
    }

    fn prompt_fields(&self) -> &'static [&'static str] {
        &["messages", "prompt", "suffix"]
    }

    fn question(&self) -> Option<Question> {
        Some(Question::Member("prompt"))
    }

    fn converses(&self) -> bool {
        true
    }

    /// The prompt alone: nothing is shared apart from it.
    fn prefix<'a>(&self, body: &'a Json) -> Option<Prefix<'a>> {
        Some(Prefix {
            shared: [None, None],
            turn: one(body.get("prompt")),
        })
    }

    fn ask_for_usage(&self, doc: &mut Document) -> bool {
        crate::dialect::chat::ask_for_usage(doc)
    }
}

// The answer: OpenAI's family's (the [`super::answer`] side), each choice a
// `text`, streamed in pieces.

use super::answer::{Choices, Stored};
use super::openai::Family;
use super::Dialect;

impl Family for Completions {
    const DIALECT: Dialect = Dialect::Completions;
    const STORED: Stored = Stored::Canonical(Some(Choices {
        object: "text_completion",
        chunk: "text_completion",
        message: false,
    }));
}
