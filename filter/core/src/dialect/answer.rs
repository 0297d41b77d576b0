//! What an answer says, read by its dialect: usage, the stream's grammar,
//! the stored entry, the local-reply and error shapes and the error classes.
//! Each API's file says it in its own words ([`Answer`]); the concerns
//! (limits, the cache, the budget's replies, fallback, capture) keep their
//! policy and ask the call's dialect here, through the one `match` below.

use serde_json::{Map, Value};

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

    /// How the cache keeps its answers; `None`: they are never cached.
    fn stored(&self) -> Option<Stored> {
        None
    }

    /// A JSON answer (an object without an `error`) is complete: all of
    /// it came, and it ended as an answer should (worth keeping).
    fn complete(&self, _answer: &Map<String, Value>) -> bool {
        false
    }
}

/// How the cache keeps a dialect's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// In one canonical form, the provider's non-streamed JSON, which
    /// answers a call either way: with `Some`, a stream is rebuilt into it
    /// and replayed from it in these choices' shape; with `None` the
    /// dialect never streams, and a hit is always JSON.
    Canonical(Option<Choices>),
    /// As the upstream sent it, the JSON or every byte of the stream: it
    /// answers only calls that ask for the same delivery.
    AsSent,
}

/// The shape of an answer of OpenAI's `choices`, which the cache rebuilds
/// from a stream of chunks and replays as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choices {
    /// The `object` of the whole answer (`chat.completion`).
    pub object: &'static str,
    /// The `object` of each chunk of its stream (`chat.completion.chunk`).
    pub chunk: &'static str,
    /// Each choice is a `message`, streamed as `delta`s; else a `text`,
    /// streamed in pieces of text.
    pub message: bool,
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
