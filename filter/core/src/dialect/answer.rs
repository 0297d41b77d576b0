//! What an answer says, read by its dialect: usage, the stream's grammar,
//! the stored entry, the local-reply and error shapes and the error classes.
//! Each API's file says it in its own words ([`Answer`]); the concerns
//! (limits, the cache, the budget's replies, fallback, capture) keep their
//! policy and ask the call's dialect here, through the one `match` below.

use super::{chat, completions, embeddings, messages, other, responses, Dialect};
use crate::sse::AnyGrammar;
use crate::usage::{Reported, Usage};

/// What one API's answers say, and where.
pub trait Answer: Sync {
    /// The tokens a `usage` object reports, read by the dialect's names
    /// (each count as `u64`; a count of another type costs the whole object
    /// before this is asked).
    fn usage(&self, reported: &Reported) -> Usage;

    /// The grammar its streams are read with, one per stream.
    fn grammar(&self) -> AnyGrammar;
}

impl Dialect {
    /// What the dialect's answers say.
    pub fn answer(self) -> &'static dyn Answer {
        match self {
            Self::Chat => &chat::Chat,
            Self::Completions => &completions::Completions,
            Self::Embeddings => &embeddings::Embeddings,
            Self::Responses => &responses::Responses,
            Self::Messages => &messages::Messages,
            Self::Other => &other::Other,
        }
    }
}
