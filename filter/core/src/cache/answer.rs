//! What the cache entry, the assembler of streams and the replay of streams
//! agree on about an answer: how it was delivered (for the dialects kept as
//! the upstream sent them; the dialect says which, [`Stored`]), and which
//! chunk fields describe the whole answer or identify a part. A leaf, so the
//! three never import each other in a circle.

use serde::{Deserialize, Serialize};

use crate::dialect::answer::Stored;
use crate::dialect::Dialect;

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

/// The delivery an answer of `dialect` for a call (`stream`: it asked for
/// a stream) is kept in, when the dialect's answers are kept as the upstream
/// sent them; `None` for those kept in one form that answers either way, and
/// for those never kept.
pub fn kept_as_sent(dialect: Dialect, stream: bool) -> Option<Delivery> {
    (dialect.answer().stored() == Some(Stored::AsSent)).then(|| Delivery::of(stream))
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
