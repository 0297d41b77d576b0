//! Response cache: deterministic LLM calls answered from Envoy shared data, per
//! tenant, in JSON or SSE whichever way the entry was filled, with concurrent
//! identical calls coalesced onto one upstream call.
//!
//! The walk: [`key::decide`] on the parsed request body; on a cacheable call
//! [`store::Store::lookup`], then [`coalesce::claim`] on a miss; a leader feeds
//! the answer to [`entry::Entry::from_json`] or an [`assemble::StreamAssembler`]
//! (or, for the dialects kept as the upstream sent them, the stream's bytes to
//! [`entry::Entry::from_stream`]), [`store::Store::insert`]s it and
//! [`coalesce::release`]s; followers [`coalesce::poll`] until the entry lands.

mod answer;
pub mod assemble;
pub mod coalesce;
pub mod config;
pub mod entry;
pub mod key;
mod replay;
pub mod semantic;
pub mod store;

pub use answer::{kept_as_sent, Delivery};
pub use assemble::StreamAssembler;
pub use coalesce::{Claim, Lease, Poll};
pub use config::{CacheConfig, Mode, RawCacheConfig, Scope, Stamp};
pub use entry::{Entry, EntryError, Reply};
pub use key::{
    decide, key_hex, BypassReason, CacheControl, CacheRequest, Cacheable, Decision, Key,
};
pub use store::{
    Dropped, InsertError, Inserted, Lookup, Replaced, Seen, Store, Totals, PREPARE_MAX_SLOTS,
};

/// Response header telling the client how the cache served the call.
pub const X_CACHE: &str = "x-cache";
/// Response header with the whole seconds since a served entry was stored.
pub const AGE_HEADER: &str = "age";

/// How the cache took part in a call, for `x-cache` and the lookups metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Answered from a fresh entry.
    Hit,
    /// Cacheable, no usable entry: went upstream.
    Miss,
    /// Not cacheable (or the cache is off).
    Bypass,
    /// Answered from the entry an identical call in flight stored.
    Coalesced,
    /// The upstream failed; answered from an expired entry.
    Stale,
    /// Answered from the entry of a reworded question in the same context.
    Semantic,
}

impl CacheStatus {
    /// The `x-cache` header value.
    pub fn header(self) -> &'static str {
        match self {
            Self::Hit => "HIT",
            Self::Miss => "MISS",
            Self::Bypass => "BYPASS",
            Self::Coalesced => "COALESCED",
            Self::Stale => "STALE",
            Self::Semantic => "SEMANTIC",
        }
    }

    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Bypass => "bypass",
            Self::Coalesced => "coalesced",
            Self::Stale => "stale",
            Self::Semantic => "semantic",
        }
    }
}

#[cfg(all(test, feature = "cache"))]
mod tests;
