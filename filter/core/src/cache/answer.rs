//! The shape of an answer that the cache entry, the assembler of streams and
//! the replay of streams agree on: which kind of answer it is, and which chunk
//! fields describe the whole answer or identify a part. A leaf, so the three
//! never import each other in a circle.

use serde::{Deserialize, Serialize};

use crate::classify::Endpoint;

/// The kind of answer an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A `chat.completion`.
    Chat,
    /// A `text_completion`.
    Completions,
    /// An embeddings list.
    Embeddings,
}

impl EntryKind {
    /// The kind of answer an endpoint gives; `None` for endpoints never cached.
    pub fn of(endpoint: Endpoint) -> Option<Self> {
        match endpoint {
            Endpoint::Chat => Some(Self::Chat),
            Endpoint::Completions => Some(Self::Completions),
            Endpoint::Embeddings => Some(Self::Embeddings),
            // Their answers are not stored yet: the calls bypass the cache.
            Endpoint::Responses | Endpoint::Messages | Endpoint::Other => None,
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
