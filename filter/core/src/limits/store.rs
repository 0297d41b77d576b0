//! The counts of one rule in shared data: a fixed number of records per rule
//! (`max_keys`), a key (a tenant, a user, a model or a mix) addressed by its
//! hash, with a few probes past a record another live key holds. A record
//! whose counts have all emptied is free for the next key. When every probe
//! is held by a live key, the key counts in the first probe's record with
//! its holder: both then see each other's use, which can refuse early but
//! never lets a call past a limit (and is counted).
//!
//! Every change is one compare-and-swap of one record: a reservation checks
//! and adds in the same write, so concurrent calls cannot both take the last
//! of a limit.

use serde::{Deserialize, Serialize};

use super::config::{Limit, Rule};
use super::window::Count;
use crate::host::cas::{self, Change, Unguarded};
use crate::host::{codec, SharedStore, StoreError};

/// Records probed for a key before it shares one.
pub const PROBES: u64 = 4;

/// One key's counts, one per limit of the rule, in the rule's order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The hash of the key that holds the record; 0: none.
    pub owner: u64,
    /// The counts.
    pub counts: Vec<Count>,
}

/// The shared-data key of record `slot` of `rule`.
pub fn record_key(rule: &str, slot: u64) -> String {
    format!("{}{slot}", crate::keyspace::limits_prefix(rule))
}

fn decode(bytes: Option<&[u8]>) -> Record {
    bytes.and_then(codec::decode).unwrap_or_default()
}

fn encode(r: &Record) -> Option<Vec<u8>> {
    codec::encode(r)
}

impl Record {
    /// Rolls every count to `now_ms`; counts of another shape (the rule's
    /// limits changed) start again.
    fn roll(&mut self, limits: &[Limit], now_ms: u64) {
        if self.counts.len() != limits.len() {
            self.counts = vec![Count::default(); limits.len()];
        }
        for (c, l) in self.counts.iter_mut().zip(limits) {
            c.roll(l.span, now_ms);
        }
    }

    /// Nothing counts any more: another key may take the record.
    fn is_empty(&self, limits: &[Limit], now_ms: u64) -> bool {
        self.counts
            .iter()
            .zip(limits)
            .all(|(c, l)| c.used(l.span, now_ms) == 0)
    }
}

/// What a change of a record decided, when it decided to write.
pub enum Decided<T> {
    /// Write the record as changed, and say `T`.
    Write(T),
    /// Leave it, and say `T`.
    Keep(T),
}

/// Where a key's record is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// Its shared-data key.
    pub key: String,
    /// The key holds it alone (false: it shares another key's record).
    pub own: bool,
}

/// Runs `change` on the record of key `hash` of `rule`, rolled to `now_ms`,
/// in one compare-and-swap: the key's own record, a free one it then takes,
/// or (every probe held) the first probe's, shared. `slots`: records of the
/// rule.
pub fn change<S, T>(
    store: &S,
    rule: &Rule,
    slots: u64,
    hash: u64,
    now_ms: u64,
    mut change: impl FnMut(&mut Record) -> Decided<T>,
) -> Result<(Place, T), StoreError>
where
    S: SharedStore + ?Sized,
{
    let slots = slots.max(1);
    let probes = PROBES.min(slots);
    for probe in 0..=probes {
        // The last round shares the first probe's record.
        let shared = probe == probes;
        let slot = hash.wrapping_add(if shared { 0 } else { probe }) % slots;
        let key = record_key(&rule.name, slot);
        let updated = cas::update(
            store,
            &key,
            Unguarded::Verify,
            decode,
            encode,
            |r: &mut Record| {
                r.roll(&rule.limits, now_ms);
                let free = r.owner == 0 || r.is_empty(&rule.limits, now_ms);
                if r.owner != hash && !free && !shared {
                    return Change::Keep(None);
                }
                if r.owner != hash && free {
                    *r = Record {
                        owner: hash,
                        counts: vec![Count::default(); rule.limits.len()],
                    };
                    r.roll(&rule.limits, now_ms);
                }
                match change(r) {
                    Decided::Write(t) => Change::Write(Some(t)),
                    Decided::Keep(t) => Change::Keep(Some(t)),
                }
            },
        )?;
        if let Some(out) = updated.out {
            let own = updated.value.owner == hash;
            return Ok((Place { key, own }, out));
        }
    }
    Err(StoreError::Host)
}

/// Runs `change` on the record at `place` rolled to `now_ms`, when it is
/// still the key's (or still shared); a record another key took since is
/// left alone. True when written.
pub fn change_at<S>(
    store: &S,
    rule: &Rule,
    place: &Place,
    hash: u64,
    now_ms: u64,
    mut change: impl FnMut(&mut Record),
) -> Result<bool, StoreError>
where
    S: SharedStore + ?Sized,
{
    let updated = cas::update(
        store,
        &place.key,
        Unguarded::Skip,
        decode,
        encode,
        |r: &mut Record| {
            if place.own && r.owner != hash {
                return Change::Keep(());
            }
            r.roll(&rule.limits, now_ms);
            change(r);
            Change::Write(())
        },
    )?;
    Ok(updated.written)
}
