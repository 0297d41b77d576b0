//! The semantic index in shared data: a fixed table of `max_contexts` group
//! slots addressed by the context key's hash. A slot holds at most
//! `max_per_context` records, each a quantised vector, its context key and
//! the exact-cache key of the answer it stands for, so a lookup reads one
//! slot and scans only it. Writes are compare-and-swap updates of the slot;
//! a full slot drops its expired records first, then the one expiring
//! soonest. The answers themselves stay in the exact cache.
//!
//! Slot layout (little-endian): `FORMAT u32, count u32`, then `count`
//! records of `exact key [32], context [32], stored_at_ms u64, expires_at_ms
//! u64, norm f32, dims u16, values [i8; dims]`. Anything that does not parse
//! reads as an empty slot.

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::config::SemanticConfig;
use super::vector::{self, Quantised};
use crate::cache::entry;
use crate::cache::key::Key;
use crate::host::cas::{self, Change, Unguarded};
use crate::host::{Metrics, SharedStore, StoreError};
use crate::keyspace;
use crate::metrics;

/// The shared-data key of the index's vector and byte totals.
pub const STATS_KEY: &str = keyspace::SEMANTIC_STATS.key;
/// Bytes before the first record of a slot.
pub const GROUP_HEADER_BYTES: usize = 8;
/// Version of the slot layout.
const FORMAT: u32 = 1;
/// Most matches above the threshold tried, best first, when the answer of a
/// better one has left the exact cache.
pub const MAX_CANDIDATES: usize = 3;

/// The shared-data key of group slot `i`.
pub fn group_key(i: u32) -> String {
    keyspace::SEMANTIC_GROUP.at(i)
}

/// One record, read in place from a slot's bytes.
#[derive(Debug, Clone, Copy)]
struct RecordRef<'a> {
    exact: &'a [u8],
    context: &'a [u8],
    expires_at_ms: u64,
    norm: f32,
    values: &'a [u8],
    /// The whole record, to copy it on rewrite.
    raw: &'a [u8],
}

/// Fixed part of a record: what one stored vector takes beyond its values.
const FIXED: usize = 32 + 32 + 8 + 8 + 4 + 2;
/// Shared-data cost of a group slot beyond its records: key, header and
/// Envoy's map node. An estimate, for the logged footprint.
pub const GROUP_OVERHEAD_BYTES: u64 = 128;

/// The footprint of a configuration, sized here beside the layout it counts.
impl SemanticConfig {
    /// Largest value of one group slot, bytes.
    pub fn max_group_bytes(&self) -> u64 {
        let record = (FIXED as u64).saturating_add(u64::from(self.max_dimensions));
        u64::from(self.max_per_context)
            .saturating_mul(record)
            .saturating_add(GROUP_HEADER_BYTES as u64)
    }

    /// The most shared data the semantic index can hold: every group slot
    /// full of the longest vectors. Logged at start.
    pub fn worst_case_bytes(&self) -> u64 {
        u64::from(self.max_contexts)
            .saturating_mul(self.max_group_bytes().saturating_add(GROUP_OVERHEAD_BYTES))
    }
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let w = b.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(<[u8; 8]>::try_from(w).ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let w = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(<[u8; 4]>::try_from(w).ok()?))
}

/// The record at `at` of a slot's bytes, `None` when it does not parse.
fn record_at(bytes: &[u8], at: usize) -> Option<RecordRef<'_>> {
    let fixed = bytes.get(at..at.checked_add(FIXED)?)?;
    let dims = usize::from(u16::from_le_bytes([*fixed.get(84)?, *fixed.get(85)?]));
    let end = at.checked_add(FIXED)?.checked_add(dims)?;
    let raw = bytes.get(at..end)?;
    Some(RecordRef {
        exact: fixed.get(0..32)?,
        context: fixed.get(32..64)?,
        expires_at_ms: u64_at(fixed, 72)?,
        norm: f32::from_le_bytes(<[u8; 4]>::try_from(fixed.get(80..84)?).ok()?),
        values: raw.get(FIXED..)?,
        raw,
    })
}

/// The records of a slot's bytes, in order; stops at the first that does not
/// parse, and yields nothing for another format.
fn records(bytes: &[u8]) -> impl Iterator<Item = RecordRef<'_>> {
    let count = match u32_at(bytes, 0) {
        Some(FORMAT) => u32_at(bytes, 4).unwrap_or(0),
        _ => 0,
    };
    let mut at = GROUP_HEADER_BYTES;
    (0..count).map_while(move |_| {
        let r = record_at(bytes, at)?;
        at = at.checked_add(r.raw.len())?;
        Some(r)
    })
}

/// Encodes one record.
fn record(exact: &Key, context: &Key, stored: u64, expires: u64, q: &Quantised) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED + q.values.len());
    out.extend_from_slice(exact);
    out.extend_from_slice(context);
    out.extend_from_slice(&stored.to_le_bytes());
    out.extend_from_slice(&expires.to_le_bytes());
    out.extend_from_slice(&q.norm.to_le_bytes());
    // Dimensions are bounded by the configuration far below u16::MAX.
    out.extend_from_slice(&(q.values.len().min(usize::from(u16::MAX)) as u16).to_le_bytes());
    out.extend(q.values.iter().map(|v| *v as u8));
    out
}

/// A slot's bytes from its records.
fn encode(records: &[Vec<u8>]) -> Vec<u8> {
    let len: usize = records.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(GROUP_HEADER_BYTES + len);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        out.extend_from_slice(r);
    }
    out
}

/// What a lookup found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Matches {
    /// The best similarity of any fresh record of the context, whatever the
    /// threshold (`None`: the context has none).
    pub best: Option<f32>,
    /// Exact keys of the records at or above the threshold, best first, at
    /// most [`MAX_CANDIDATES`].
    pub above: Vec<(f32, Key)>,
    /// Records of the context scanned.
    pub scanned: u32,
}

/// Vectors and bytes the index holds, shared by every worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Vectors stored.
    pub vectors: u64,
    /// Bytes of all group slot values.
    pub bytes: u64,
}

impl Totals {
    /// Sets the vectors gauge.
    pub fn set_gauges(&self, m: &mut dyn Metrics) {
        m.gauge(
            metrics::CACHE_SEMANTIC_VECTORS,
            i64::try_from(self.vectors).unwrap_or(i64::MAX),
        );
    }
}

/// What an insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    /// A fresh record of some context was dropped to make room.
    pub evicted: bool,
    /// The totals after it, when they could be updated.
    pub totals: Option<Totals>,
}

/// The group table over a shared store.
#[derive(Debug)]
pub struct Index<'a, S: SharedStore + ?Sized> {
    shared: &'a S,
    cfg: &'a SemanticConfig,
}

impl<'a, S: SharedStore + ?Sized> Index<'a, S> {
    /// The table `cfg` describes over `shared`.
    pub fn new(shared: &'a S, cfg: &'a SemanticConfig) -> Self {
        Self { shared, cfg }
    }

    /// The group slot of a context.
    pub fn slot(&self, context: &Key) -> u32 {
        let word = context
            .get(..8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map_or(0, u64::from_le_bytes);
        // Below `max_contexts`, a u32.
        (word % u64::from(self.cfg.max_contexts.max(1))) as u32
    }

    /// Creates every group slot empty and the totals at zero where missing,
    /// so compare-and-swap guards each from the first write and the census
    /// knows the key count. Call once at configure time.
    pub fn prepare(&self) -> Result<(), StoreError> {
        let zero = entry::options()
            .serialize(&Totals::default())
            .unwrap_or_default();
        cas::create_if_absent(self.shared, STATS_KEY, &zero)?;
        for i in 0..self.cfg.max_contexts {
            cas::create_if_absent(self.shared, &group_key(i), b"")?;
        }
        Ok(())
    }

    /// The fresh records of `context` most similar to the unit vector
    /// `query` at `now_ms`. A host error or a corrupt slot finds nothing.
    pub fn lookup(&self, context: &Key, query: &[f32], now_ms: u64) -> Matches {
        let Ok(v) = self.shared.get(&group_key(self.slot(context))) else {
            return Matches::default();
        };
        scan(
            v.value.as_deref().unwrap_or_default(),
            context,
            query,
            self.cfg.threshold as f32,
            now_ms,
        )
    }

    /// Adds the vector of the answer stored under `exact` (valid until
    /// `expires_at_ms`) to the group of `context`, replacing a record of the
    /// same answer. A lost race is given up: the next miss adds it again.
    pub fn insert(
        &self,
        context: &Key,
        exact: &Key,
        unit: &[f32],
        stored_at_ms: u64,
        expires_at_ms: u64,
    ) -> Result<Added, StoreError> {
        if unit.is_empty() || unit.len() > self.cfg.max_dimensions as usize {
            return Err(StoreError::Host);
        }
        let q = vector::quantise(unit);
        let new = record(exact, context, stored_at_ms, expires_at_ms, &q);
        let max = self.cfg.max_per_context as usize;
        let key = group_key(self.slot(context));
        // (records, old length, old count) as read.
        let u = cas::update(
            self.shared,
            &key,
            Unguarded::Overwrite,
            |b| {
                let b = b.unwrap_or_default();
                let kept: Vec<Vec<u8>> = records(b).map(|r| r.raw.to_vec()).collect();
                let count = kept.len();
                (kept, b.len(), count)
            },
            |(records, _, _)| Some(encode(records)),
            |(records, _, _)| {
                let mut evicted = false;
                let mut parsed: Vec<(u64, Vec<u8>)> = Vec::with_capacity(records.len() + 1);
                for raw in records.drain(..) {
                    let Some(r) = record_at(&raw, 0) else {
                        continue;
                    };
                    // Expired records and an older copy of this one go.
                    if r.expires_at_ms <= stored_at_ms
                        || (r.exact == exact.as_slice() && r.context == context.as_slice())
                    {
                        continue;
                    }
                    parsed.push((r.expires_at_ms, raw));
                }
                while parsed.len() >= max {
                    let Some(i) = parsed
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, (exp, _))| *exp)
                        .map(|(i, _)| i)
                    else {
                        break;
                    };
                    parsed.remove(i);
                    evicted = true;
                }
                records.extend(parsed.into_iter().map(|(_, r)| r));
                records.push(new.clone());
                Change::Write(evicted)
            },
        )?;
        let (records, old_len, old_count) = &u.value;
        let new_len = GROUP_HEADER_BYTES + records.iter().map(Vec::len).sum::<usize>();
        let vectors = records.len() as i64 - *old_count as i64;
        let bytes = new_len as i64 - *old_len as i64;
        Ok(Added {
            evicted: u.out,
            totals: self.add_totals(vectors, bytes),
        })
    }

    /// The index's totals as last recorded.
    pub fn totals(&self) -> Option<Totals> {
        let v = self.shared.get(STATS_KEY).ok()?;
        entry::options().deserialize(v.value.as_deref()?).ok()
    }

    fn add_totals(&self, vectors: i64, bytes: i64) -> Option<Totals> {
        let u = cas::update(
            self.shared,
            STATS_KEY,
            Unguarded::Overwrite,
            |b| {
                b.and_then(|b| entry::options().deserialize::<Totals>(b).ok())
                    .unwrap_or_default()
            },
            |t| entry::options().serialize(t).ok(),
            |t| {
                t.vectors = t.vectors.saturating_add_signed(vectors);
                t.bytes = t.bytes.saturating_add_signed(bytes);
                Change::Write(())
            },
        );
        u.ok().map(|u| u.value)
    }
}

/// Scans a slot's bytes for the fresh records of `context` (see
/// [`Index::lookup`]); public for the bench.
pub fn scan(bytes: &[u8], context: &Key, query: &[f32], threshold: f32, now_ms: u64) -> Matches {
    let mut m = Matches::default();
    for r in records(bytes) {
        if r.context != context.as_slice() || now_ms >= r.expires_at_ms {
            continue;
        }
        m.scanned = m.scanned.saturating_add(1);
        let Some(s) = vector::similarity(query, r.values, r.norm) else {
            continue;
        };
        if m.best.is_none_or(|b| s > b) {
            m.best = Some(s);
        }
        if s >= threshold {
            let Ok(key) = <Key>::try_from(r.exact) else {
                continue;
            };
            m.above.push((s, key));
            m.above.sort_by(|a, b| b.0.total_cmp(&a.0));
            m.above.truncate(MAX_CANDIDATES);
        }
    }
    m
}

#[cfg(test)]
mod tests;
