//! The shape of an answer that the cache entry, the assembler of streams and
//! the replay of streams agree on: which kind of answer it is (and, for the
//! dialects kept as the upstream sent them, how it was delivered), and which
//! chunk fields describe the whole answer or identify a part. A leaf, so the
//! three never import each other in a circle.

use serde::{Deserialize, Serialize};

use crate::dialect::Dialect;

/// The kind of answer an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A `chat.completion`.
    Chat,
    /// A `text_completion`.
    Completions,
    /// An embeddings list.
    Embeddings,
    /// An OpenAI Responses answer, as the upstream sent it.
    Responses(Delivery),
    /// An Anthropic Messages answer, as the upstream sent it.
    Messages(Delivery),
}

/// How an answer stored as the upstream sent it was delivered: it answers
/// only calls that ask for it that way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Delivery {
    /// One JSON document.
    Json,
    /// An SSE stream, every event of it.
    Stream,
}

impl Delivery {
    /// The delivery a call asks for.
    pub fn of(stream: bool) -> Self {
        if stream {
            Self::Stream
        } else {
            Self::Json
        }
    }
}

impl EntryKind {
    /// The kind of answer a call of `endpoint` gets (`stream`: it asked for
    /// a stream); `None` for endpoints never cached.
    pub fn of(endpoint: Dialect, stream: bool) -> Option<Self> {
        match endpoint {
            Dialect::Chat => Some(Self::Chat),
            Dialect::Completions => Some(Self::Completions),
            Dialect::Embeddings => Some(Self::Embeddings),
            Dialect::Responses => Some(Self::Responses(Delivery::of(stream))),
            Dialect::Messages => Some(Self::Messages(Delivery::of(stream))),
            Dialect::Other => None,
        }
    }

    /// The delivery of an answer kept as the upstream sent it (Responses,
    /// Messages); `None` for the kinds kept in one canonical JSON form that
    /// answers either way (chat, completions, embeddings).
    pub fn verbatim(self) -> Option<Delivery> {
        match self {
            Self::Responses(d) | Self::Messages(d) => Some(d),
            Self::Chat | Self::Completions | Self::Embeddings => None,
        }
    }
}

/// Top-level chunk fields that describe the whole answer; the first value seen
/// is kept. Anything else at the top (e.g. padding fields) is not part of it.
pub(super) const HEAD_FIELDS: [&str; 5] = [
    "id",
    "created",
    "model",
    "system_fingerprint",
    "service_tier",
];

/// Delta fields that are identifiers, replaced rather than concatenated: some
/// providers repeat `role` or `type` in every chunk.
pub(super) const REPLACE_KEYS: [&str; 5] = ["index", "type", "role", "id", "name"];
