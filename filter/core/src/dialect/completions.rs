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

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use serde_json::{Map, Value};

    use super::Completions;

    use crate::dialect::answer::{Answer, Choices, Hear, Stored};
    use crate::dialect::chat::stream;
    use crate::dialect::chat::{choices_finished, choices_said, openai_head, openai_usage};
    use crate::dialect::AnyGrammar;
    use crate::dialect::Dialect;
    use crate::json::Json;
    use crate::usage::{Head, Usage};

    impl Answer for Completions {
        fn usage(&self, usage: &Value) -> Option<Usage> {
            openai_usage(usage)
        }

        fn head(&self, body: &[u8]) -> Head {
            openai_head(body)
        }

        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Chat(stream::Chat::of(Dialect::Completions))
        }

        fn stored(&self) -> Option<Stored> {
            Some(Stored::Canonical(Some(Choices {
                object: "text_completion",
                chunk: "text_completion",
                message: false,
            })))
        }

        fn complete(&self, answer: &Map<String, Value>) -> bool {
            choices_finished(answer)
        }

        /// Each choice: its `message`, or a completion's `text`.
        fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool {
            choices_said(answer, out);
            true
        }
    }
}
