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
    use crate::dialect::answer::head::{self, count, detail, optional_count};

    use crate::dialect::answer::{Answer, Hear, Stored};
    use crate::dialect::chat::stream;
    use crate::dialect::gemini::candidate_reasons;
    use crate::dialect::messages::stop_reason;
    use crate::dialect::openai::choice_reasons;
    use crate::dialect::responses::response_reason;
    use crate::dialect::AnyGrammar;
    use crate::dialect::Dialect;
    use crate::json::Json;
    use crate::usage::{Head, Usage};

    /// Every dialect's members a head is read from.
    const HEAD: &[&str] = &[
        "usage",
        "id",
        "model",
        "choices",
        "candidates",
        "stop_reason",
        "object",
        "status",
        "incomplete_details",
    ];

    impl Answer for Other {
        /// Any dialect's names, added up: a path of another shape may
        /// answer in any of them (Gemini's `usageMetadata` aside).
        fn usage(&self, usage: &Value) -> Option<Usage> {
            let u = usage.as_object()?;
            let read = optional_count(u, "cache_read_input_tokens")?;
            let written = optional_count(u, "cache_creation_input_tokens")?;
            let prompt_details = detail(u, "prompt_tokens_details", "cached_tokens")?;
            let input_details = detail(u, "input_tokens_details", "cached_tokens")?;
            let completion_details = detail(u, "completion_tokens_details", "reasoning_tokens")?;
            let output_details = detail(u, "output_tokens_details", "reasoning_tokens")?;
            Some(Usage {
                prompt_tokens: count(u, "prompt_tokens")?
                    .saturating_add(count(u, "input_tokens")?)
                    .saturating_add(read)
                    .saturating_add(written),
                completion_tokens: count(u, "completion_tokens")?
                    .saturating_add(count(u, "output_tokens")?),
                cached_tokens: prompt_details
                    .or(input_details)
                    .unwrap_or(0)
                    .saturating_add(read),
                cache_write_tokens: written,
                cache_write_1h_tokens: detail(u, "cache_creation", "ephemeral_1h_input_tokens")?
                    .unwrap_or(0)
                    .min(written),
                reasoning_tokens: completion_details.or(output_details).unwrap_or(0),
            })
        }

        /// Its usage, id and model, and why it ended in any dialect's
        /// words: each choice's, each candidate's, a message's stop, a
        /// response's end.
        fn head(&self, body: &[u8]) -> Head {
            head::read(body, HEAD, |m| {
                let mut head = m.head(|u| self.usage(u))?;
                choice_reasons(m, &mut head)?;
                candidate_reasons(m, &mut head)?;
                stop_reason(m, &mut head)?;
                response_reason(m, &mut head);
                Some(head)
            })
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
