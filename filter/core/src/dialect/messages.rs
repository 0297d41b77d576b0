//! Anthropic Messages (`…/messages`), in its own words.

/// Anthropic Messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

// The request: where the call says what it says, and how it is edited
// (the [`super::request`] side).

// The answer: usage, the stream's grammar, the stored entry, the error shape
// and classes (the [`super::answer`] side).

mod answers {
    use super::Messages;
    use crate::dialect::answer::Answer;
    use crate::sse::{self, AnyGrammar};
    use crate::usage::{Reported, Usage};

    impl Answer for Messages {
        /// `input_tokens` counts only the input not read from or written
        /// to the prompt cache: the input is all three.
        fn usage(&self, r: &Reported) -> Usage {
            let read = r.cache_read_input_tokens.unwrap_or(0);
            let written = r.cache_creation_input_tokens.unwrap_or(0);
            Usage {
                prompt_tokens: r.input_tokens.saturating_add(read).saturating_add(written),
                completion_tokens: r.output_tokens,
                cached_tokens: read,
            }
        }

        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Messages(sse::Messages::default())
        }
    }
}
