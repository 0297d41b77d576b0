//! The entries in shared data. Shared data never evicts, so the cache is a fixed
//! table of `cache.max_entries` slots addressed by key hash, written with
//! compare-and-swap, with a replacement rule that keeps its memory bounded.
//!
//! Replacement (2-way set-associative): a key may live in two candidate slots,
//! taken from the first two 64-bit words of its hash. An insert takes, in this
//! order: the candidate already holding the same key, an empty one, a corrupt
//! one, one expired past its stale-if-error window, else the one expiring
//! soonest (the primary on a tie).

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::config::CacheConfig;
use super::entry::{self, Entry, EntryHead};
use super::key::Key;
use crate::host::cas::{self, Change, Unguarded};
use crate::host::{Metrics, SharedStore, StoreError, Versioned};
use crate::keyspace;
use crate::metrics;

/// The shared-data key holding the cache's entry and byte totals. Istio
/// leaves `vm_id` empty, so all plugins on a proxy share one namespace: the
/// keys, and their versions, are the registry's.
pub const STATS_KEY: &str = keyspace::CACHE_STATS.key;

/// The shared-data key of the slot count the table was last laid out with.
pub const LAYOUT_KEY: &str = keyspace::CACHE_LAYOUT.key;

/// Largest table worth [`Store::prepare`]-ing at start. Creating every key of
/// a larger one holds Envoy's start for seconds and takes memory for slots
/// that may never fill; such tables create their keys as they fill, at the
/// cost of a rare over-count in the totals (never a wrong answer).
pub const PREPARE_MAX_SLOTS: u32 = 131_072;

/// The shared-data key of slot `i`.
pub fn slot_key(i: u32) -> String {
    keyspace::CACHE_SLOT.at(i)
}

/// The shared-data key of the in-flight marker of slot `i`.
pub fn marker_key(i: u32) -> String {
    keyspace::CACHE_INFLIGHT.at(i)
}

/// The result of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A fresh entry, with its age in whole seconds.
    Hit {
        /// The entry.
        entry: Entry,
        /// Seconds since it was stored.
        age_s: u64,
    },
    /// An expired entry still inside the stale-if-error window: only for
    /// answering an upstream failure.
    Stale {
        /// The entry.
        entry: Entry,
        /// Seconds since it was stored.
        age_s: u64,
    },
    /// No usable entry (absent, expired, corrupt or unreadable).
    Miss,
}

/// What an insert replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    /// A slot never used.
    Empty,
    /// An older entry for the same key.
    SameKey,
    /// Bytes that did not decode.
    Corrupt,
    /// Another key's expired entry.
    Expired,
    /// Another key's fresh entry: an eviction.
    Evicted,
}

/// A successful insert, with what changed so the caller keeps its stats right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    /// The slot written.
    pub slot: u32,
    /// What it held before.
    pub replaced: Replaced,
    /// Change in occupied slots (0 or 1).
    pub entries_delta: i64,
    /// Change in bytes held.
    pub bytes_delta: i64,
    /// The cache's totals after this insert, when they could be updated: set
    /// the entries and bytes gauges from these.
    pub totals: Option<Totals>,
}

impl Inserted {
    /// True when a fresh entry of another key was pushed out (count it).
    pub fn evicted(&self) -> bool {
        self.replaced == Replaced::Evicted
    }
}

/// What [`Store::relayout`] dropped from a table whose size changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Slots beyond the new table, emptied.
    pub slots: u32,
    /// Entries no key reaches any more.
    pub entries: u64,
    /// Bytes those entries held.
    pub bytes: u64,
}

/// Why an insert did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The encoded entry is larger than `cache.max_entry_bytes`.
    TooLarge,
    /// Every compare-and-swap attempt lost to another writer.
    Contended,
    /// The host refused a call.
    Host,
}

impl InsertError {
    /// A short name for logs and the `result` label of store metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::Contended => "contended",
            Self::Host => "host_error",
        }
    }
}

/// Occupied slots and bytes held, shared by every worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Occupied slots.
    pub entries: u64,
    /// Bytes of all slot values.
    pub bytes: u64,
}

impl Totals {
    /// Sets the entries and bytes gauges; every worker sets the same gauges
    /// from the same shared numbers.
    pub fn set_gauges(&self, m: &mut dyn Metrics) {
        m.gauge(
            metrics::CACHE_ENTRIES,
            i64::try_from(self.entries).unwrap_or(i64::MAX),
        );
        m.gauge(
            metrics::CACHE_BYTES,
            i64::try_from(self.bytes).unwrap_or(i64::MAX),
        );
    }
}

/// The slot table over a shared store.
#[derive(Debug)]
pub struct Store<'a, S: SharedStore + ?Sized> {
    shared: &'a S,
    slots: u32,
    stale_ms: u64,
    max_bytes: u32,
}

/// What a candidate slot holds, read for a replacement decision.
#[derive(Debug, Clone, Copy)]
enum Occupant {
    Empty,
    Corrupt,
    Same,
    Other { expires_at_ms: u64 },
}

/// One candidate slot as it was read: enough to decide a replacement and
/// to write it conditionally without reading it again.
#[derive(Debug, Clone, Copy)]
struct SlotSeen {
    slot: u32,
    /// The CAS token of the read (`None`: the slot was never written).
    cas: Option<u32>,
    /// Bytes the slot held.
    len: usize,
    occupant: Occupant,
}

impl SlotSeen {
    fn of(key: &Key, slot: u32, read: &Versioned) -> Self {
        Self {
            slot,
            cas: read.token(),
            len: read.value.as_ref().map_or(0, Vec::len),
            occupant: occupant(key, read.value.as_deref()),
        }
    }
}

/// A key's candidate slots as a missed lookup read them, for the insert of
/// the key's answer ([`Store::insert_after`]): a slot nobody wrote since is
/// written without a second read.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    slots: [Option<SlotSeen>; 2],
}

impl<'a, S: SharedStore + ?Sized> Store<'a, S> {
    /// The table `cfg` describes over `shared`.
    pub fn new(shared: &'a S, cfg: &CacheConfig) -> Self {
        Self {
            shared,
            slots: cfg.max_entries.max(1),
            stale_ms: cfg.stale_if_error_ms,
            max_bytes: cfg.max_entry_bytes,
        }
    }

    /// The same table, with expired entries usable for `stale_ms` past
    /// their expiry (`u64::MAX`: while they are in their slot).
    pub fn with_stale_ms(self, stale_ms: u64) -> Self {
        Self { stale_ms, ..self }
    }

    pub(crate) fn shared(&self) -> &'a S {
        self.shared
    }

    /// The two slots a key may live in (the same one twice in a one-slot table).
    pub fn candidates(&self, key: &Key) -> [u32; 2] {
        let n = u64::from(self.slots);
        let first = word(key, 0) % n;
        let mut second = word(key, 1) % n;
        if second == first {
            second = (first + 1) % n;
        }
        // Both are below `slots`, a u32.
        [first as u32, second as u32]
    }

    /// The slot whose in-flight marker stands for a key.
    pub fn primary(&self, key: &Key) -> u32 {
        let [first, _] = self.candidates(key);
        first
    }

    /// Creates every slot and marker key empty, and the totals at zero, where
    /// missing. Optional but recommended once at configure time: Envoy's
    /// compare-and-swap only protects keys that exist, so without it two
    /// workers filling the same never-used slot at once both succeed and the
    /// totals count one entry too many. Returns the number of keys created.
    pub fn prepare(&self) -> Result<u32, StoreError> {
        let mut created = 0u32;
        let mut ensure = |key: &str, empty: &[u8]| -> Result<(), StoreError> {
            if cas::create_if_absent(self.shared, key, empty)? {
                created = created.saturating_add(1);
            }
            Ok(())
        };
        let zero = encode_totals(Totals::default());
        ensure(STATS_KEY, &zero)?;
        for i in 0..self.slots {
            ensure(&slot_key(i), b"")?;
            ensure(&marker_key(i), b"")?;
        }
        Ok(created)
    }

    /// Records this table's slot count as the layout. When the table had
    /// another size before (a configuration with another `cache.max_entries`),
    /// a key's candidate slots moved with it: every entry that no key reaches
    /// any more is emptied and taken out of the totals, in the table and, when
    /// it shrank, in the slots and markers beyond it. Shared data cannot
    /// delete a key, so those keys stay, empty. Call at configure time.
    pub fn relayout(&self) -> Result<Dropped, StoreError> {
        let before = self.shared.get(LAYOUT_KEY)?;
        let previous = before
            .value
            .as_deref()
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(0, u32::from_le_bytes);
        self.shared
            .set(LAYOUT_KEY, &self.slots.to_le_bytes(), None)?;
        let mut dropped = Dropped::default();
        if previous == 0 || previous == self.slots {
            return Ok(dropped);
        }
        for i in 0..previous.max(self.slots) {
            let slot = self.shared.get(&slot_key(i))?;
            let Some(bytes) = slot.value.filter(|b| !b.is_empty()) else {
                continue;
            };
            let reached = i < self.slots
                && <[u8; 32]>::try_from(bytes.get(..32).unwrap_or_default())
                    .is_ok_and(|key| self.candidates(&key).contains(&i));
            if reached {
                continue;
            }
            dropped.entries = dropped.entries.saturating_add(1);
            dropped.bytes = dropped.bytes.saturating_add(bytes.len() as u64);
            self.shared.set(&slot_key(i), b"", None)?;
        }
        for i in self.slots..previous {
            self.shared.set(&marker_key(i), b"", None)?;
            dropped.slots = dropped.slots.saturating_add(1);
        }
        if dropped.entries > 0 {
            let entries = i64::try_from(dropped.entries).unwrap_or(i64::MAX);
            let bytes = i64::try_from(dropped.bytes).unwrap_or(i64::MAX);
            self.add_totals(-entries, -bytes);
        }
        Ok(dropped)
    }

    /// Finds the entry of `key` at `now_ms`. A corrupt slot, a slot holding
    /// another key or a host error is a miss.
    pub fn lookup(&self, key: &Key, now_ms: u64) -> Lookup {
        self.lookup_seen(key, now_ms).0
    }

    /// [`Self::lookup`], and the candidate slots as it read them.
    pub fn lookup_seen(&self, key: &Key, now_ms: u64) -> (Lookup, Seen) {
        let mut stale = None;
        let mut seen = Seen::default();
        // After a race both candidates may hold the key: a fresh copy wins.
        for (i, slot) in self.distinct_candidates(key).enumerate() {
            let Ok(v) = self.shared.get(&slot_key(slot)) else {
                continue;
            };
            if let Some(s) = seen.slots.get_mut(i) {
                *s = Some(SlotSeen::of(key, slot, &v));
            }
            let Some(bytes) = v.value else { continue };
            if bytes.get(..key.len()) != Some(key.as_slice()) {
                continue;
            }
            let Ok(entry) = Entry::decode(bytes.get(key.len()..).unwrap_or_default()) else {
                continue;
            };
            let age_s = entry.age_s(now_ms);
            if now_ms < entry.expires_at_ms() {
                return (Lookup::Hit { entry, age_s }, seen);
            }
            if now_ms < entry.expires_at_ms().saturating_add(self.stale_ms) {
                stale = Some(Lookup::Stale { entry, age_s });
            }
        }
        (stale.unwrap_or(Lookup::Miss), seen)
    }

    /// Stores `entry` under `key`, following the replacement rule.
    pub fn insert(&self, key: &Key, entry: &Entry, now_ms: u64) -> Result<Inserted, InsertError> {
        self.insert_after(key, entry, now_ms, &Seen::default())
    }

    /// [`Self::insert`], deciding first on the slots as `seen` when it has
    /// every candidate with a CAS token: the write is conditional on nobody
    /// having written the slot since, and a lost race reads them afresh.
    pub fn insert_after(
        &self,
        key: &Key,
        entry: &Entry,
        now_ms: u64,
        seen: &Seen,
    ) -> Result<Inserted, InsertError> {
        let mut value = Vec::with_capacity(entry.body().len().saturating_add(128));
        value.extend_from_slice(key);
        entry
            .encode_into(&mut value)
            .map_err(|_| InsertError::TooLarge)?;
        if value.len() > self.max_bytes as usize {
            return Err(InsertError::TooLarge);
        }
        // Contention on one slot means others are writing the same answers,
        // so losing the race costs nothing. A never-used slot is written
        // unconditionally (see [`Store::prepare`]).
        let mut reuse = self.reusable(key, seen);
        let written = cas::retry(|| {
            let candidates = match reuse.take() {
                Some(c) => c,
                None => self.read_candidates(key)?,
            };
            let best = candidates
                .into_iter()
                .min_by_key(|c| self.rank(c.occupant, now_ms))
                .ok_or(StoreError::Host)?;
            let read = Versioned {
                value: None,
                cas: best.cas,
            };
            let slot = slot_key(best.slot);
            cas::write(self.shared, &slot, &read, &value, Unguarded::Overwrite)?;
            Ok(best)
        });
        let SlotSeen {
            slot,
            len: old_len,
            occupant,
            ..
        } = match written {
            Ok(w) => w,
            Err(StoreError::CasMismatch) => return Err(InsertError::Contended),
            Err(StoreError::Host) => return Err(InsertError::Host),
        };
        let entries_delta = i64::from(matches!(occupant, Occupant::Empty));
        let bytes_delta = (value.len() as i64).saturating_sub(old_len as i64);
        let replaced = match occupant {
            Occupant::Empty => Replaced::Empty,
            Occupant::Same => Replaced::SameKey,
            Occupant::Corrupt => Replaced::Corrupt,
            Occupant::Other { expires_at_ms } if now_ms < expires_at_ms => Replaced::Evicted,
            Occupant::Other { .. } => Replaced::Expired,
        };
        let totals = self.add_totals(entries_delta, bytes_delta);
        Ok(Inserted {
            slot,
            replaced,
            entries_delta,
            bytes_delta,
            totals,
        })
    }

    /// The cache's totals as last recorded, `None` when never recorded or
    /// unreadable.
    pub fn totals(&self) -> Option<Totals> {
        let v = self.shared.get(STATS_KEY).ok()?;
        decode_totals(v.value.as_deref()?)
    }

    /// Moves the totals, one hot key that every insert updates; a missing one
    /// starts at zero, created unconditionally. `None` when the update was
    /// given up.
    fn add_totals(&self, entries: i64, bytes: i64) -> Option<Totals> {
        let u = cas::update(
            self.shared,
            STATS_KEY,
            Unguarded::Overwrite,
            |b| b.and_then(decode_totals).unwrap_or_default(),
            |t| Some(encode_totals(*t)),
            |t| {
                t.entries = t.entries.saturating_add_signed(entries);
                t.bytes = t.bytes.saturating_add_signed(bytes);
                Change::Write(())
            },
        );
        u.ok().map(|u| u.value)
    }

    /// Lower ranks are replaced first; the expiry breaks ties.
    fn rank(&self, occupant: Occupant, now_ms: u64) -> (u8, u64) {
        match occupant {
            Occupant::Same => (0, 0),
            Occupant::Empty => (1, 0),
            Occupant::Corrupt => (2, 0),
            Occupant::Other { expires_at_ms }
                if expires_at_ms.saturating_add(self.stale_ms) <= now_ms =>
            {
                (3, expires_at_ms)
            }
            Occupant::Other { expires_at_ms } => (4, expires_at_ms),
        }
    }

    /// Every candidate of `key` as read now.
    fn read_candidates(&self, key: &Key) -> Result<Vec<SlotSeen>, StoreError> {
        self.distinct_candidates(key)
            .map(|slot| {
                let v = self
                    .shared
                    .get(&slot_key(slot))
                    .map_err(|_| StoreError::Host)?;
                Ok(SlotSeen::of(key, slot, &v))
            })
            .collect()
    }

    /// The candidates as `seen`, when it read every one of them with a CAS
    /// token (a slot never written could only be written blindly).
    fn reusable(&self, key: &Key, seen: &Seen) -> Option<Vec<SlotSeen>> {
        self.distinct_candidates(key)
            .map(|slot| {
                seen.slots
                    .iter()
                    .flatten()
                    .find(|s| s.slot == slot && s.cas.is_some())
                    .copied()
            })
            .collect()
    }

    fn distinct_candidates(&self, key: &Key) -> impl Iterator<Item = u32> {
        let [a, b] = self.candidates(key);
        std::iter::once(a).chain((b != a).then_some(b))
    }
}

fn occupant(key: &Key, value: Option<&[u8]>) -> Occupant {
    let Some(bytes) = value.filter(|b| !b.is_empty()) else {
        return Occupant::Empty;
    };
    let (Some(stored_key), Some(rest)) = (bytes.get(..key.len()), bytes.get(key.len()..)) else {
        return Occupant::Corrupt;
    };
    // Only the head is decoded: the body of another key's entry is never read.
    match EntryHead::decode(rest) {
        None => Occupant::Corrupt,
        Some(_) if stored_key == key.as_slice() => Occupant::Same,
        Some(head) => Occupant::Other {
            expires_at_ms: head.expires_at_ms,
        },
    }
}

fn word(key: &Key, i: usize) -> u64 {
    let start = i.saturating_mul(8);
    key.get(start..start.saturating_add(8))
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        .map_or(0, u64::from_le_bytes)
}

fn encode_totals(t: Totals) -> Vec<u8> {
    entry::options().serialize(&t).unwrap_or_default()
}

fn decode_totals(bytes: &[u8]) -> Option<Totals> {
    entry::options().deserialize(bytes).ok()
}

#[cfg(all(test, feature = "cache"))]
mod tests {
    use super::*;
    use crate::cache::config::Stamp;
    use crate::cache::tests::HookStore;
    use crate::dialect::Dialect;
    use crate::host::MemoryStore;

    fn cfg(slots: u32) -> CacheConfig {
        CacheConfig {
            max_entries: slots,
            max_entry_bytes: 4096,
            stale_if_error_ms: 10_000,
            ..CacheConfig::default()
        }
    }

    fn key(n: u64) -> Key {
        use sha2::{Digest, Sha256};
        Sha256::digest(n.to_le_bytes()).into()
    }

    fn entry(text: &str, stored_at_ms: u64, expires_at_ms: u64) -> Entry {
        let body = format!(
            r#"{{"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"stop"}}]}}"#
        );
        Entry::from_json(
            Dialect::Chat,
            200,
            body.as_bytes(),
            Stamp {
                stored_at_ms,
                expires_at_ms,
            },
            4096,
        )
        .unwrap()
    }

    /// Totals recomputed from the slots themselves.
    fn actual(shared: &MemoryStore, slots: u32) -> Totals {
        let mut t = Totals::default();
        for i in 0..slots {
            if let Some(v) = shared
                .get(&slot_key(i))
                .unwrap()
                .value
                .filter(|v| !v.is_empty())
            {
                t.entries += 1;
                t.bytes += v.len() as u64;
            }
        }
        t
    }

    #[test]
    fn hit_then_stale_then_miss() {
        let c = cfg(16);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let e = entry("a", 1_000, 5_000);
        s.insert(&key(1), &e, 1_000).unwrap();
        assert_eq!(
            s.lookup(&key(1), 3_500),
            Lookup::Hit {
                entry: e.clone(),
                age_s: 2
            }
        );
        assert_eq!(
            s.lookup(&key(1), 5_000),
            Lookup::Stale {
                entry: e.clone(),
                age_s: 4
            }
        );
        assert_eq!(
            s.lookup(&key(1), 14_999),
            Lookup::Stale {
                entry: e,
                age_s: 13
            }
        );
        assert_eq!(s.lookup(&key(1), 15_000), Lookup::Miss);
        assert_eq!(s.lookup(&key(2), 1_000), Lookup::Miss);
    }

    #[test]
    fn corrupt_and_foreign_slots_are_misses_and_get_replaced() {
        let c = cfg(1);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let k = key(1);
        for garbage in [&b"x"[..], &k[..], &[k.as_slice(), b"\x01\x00"].concat()] {
            shared.set(&slot_key(0), garbage, None).unwrap();
            assert_eq!(s.lookup(&k, 0), Lookup::Miss);
        }
        let ins = s.insert(&k, &entry("a", 0, 100), 0).unwrap();
        assert_eq!(ins.replaced, Replaced::Corrupt);
        assert_eq!(ins.entries_delta, 0);
        // A slot holding another key is a miss for this one.
        assert_eq!(s.lookup(&key(2), 0), Lookup::Miss);
        // A truncated entry of the right key is a miss, not a panic.
        let full = shared.get(&slot_key(0)).unwrap().value.unwrap();
        for cut in 0..full.len() {
            shared.set(&slot_key(0), &full[..cut], None).unwrap();
            assert_eq!(s.lookup(&k, 0), Lookup::Miss, "cut at {cut}");
        }
    }

    #[test]
    fn replacement_rule() {
        // Two slots: every key's candidates are {0, 1}.
        let c = cfg(2);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let ins = |n, e: &Entry, now| s.insert(&key(n), e, now).unwrap();
        let a = ins(1, &entry("a", 0, 1_000), 0);
        let b = ins(2, &entry("b", 0, 2_000), 0);
        assert_eq!((a.replaced, b.replaced), (Replaced::Empty, Replaced::Empty));
        assert_ne!(a.slot, b.slot);
        // Same key: overwritten in place, not counted twice.
        let a2 = ins(1, &entry("a2", 0, 3_000), 0);
        assert_eq!(
            (a2.replaced, a2.slot, a2.entries_delta),
            (Replaced::SameKey, a.slot, 0)
        );
        // Full of fresh entries: the one expiring soonest (key 2, at 2000) goes.
        let c3 = ins(3, &entry("c", 0, 9_000), 100);
        assert_eq!((c3.replaced, c3.slot), (Replaced::Evicted, b.slot));
        assert!(c3.evicted());
        assert_eq!(s.lookup(&key(2), 100), Lookup::Miss);
        // Past the stale window (3000 + 10000) key 1 is dead and goes first,
        // even though key 3 expires sooner than the newcomer would.
        let d = ins(4, &entry("d", 13_000, 20_000), 13_000);
        assert_eq!((d.replaced, d.slot), (Replaced::Expired, a.slot));
        let t = s.totals().unwrap();
        assert_eq!(t, actual(&shared, 2));
        assert_eq!(t.entries, 2);
    }

    #[test]
    fn an_insert_after_a_miss_writes_without_reading_the_slots_again() {
        let c = cfg(2);
        let shared = HookStore::default();
        let s = Store::new(&shared, &c);
        s.prepare().unwrap();
        let (lookup, seen) = s.lookup_seen(&key(1), 0);
        assert_eq!(lookup, Lookup::Miss);
        let before = shared.calls();
        let ins = s
            .insert_after(&key(1), &entry("a", 0, 1_000), 0, &seen)
            .unwrap();
        // The slot's write and the totals' read and write: no slot read.
        assert_eq!(shared.calls() - before, 3);
        assert_eq!((ins.replaced, ins.entries_delta), (Replaced::Empty, 1));
        assert!(matches!(s.lookup(&key(1), 0), Lookup::Hit { .. }));
        assert_eq!(s.totals(), Some(actual(&shared.inner, 2)));
    }

    #[test]
    fn slots_written_since_the_lookup_are_read_again() {
        let c = cfg(2);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        s.prepare().unwrap();
        let (_, seen) = s.lookup_seen(&key(1), 0);
        // Meanwhile other calls fill both slots the lookup saw empty.
        s.insert(&key(2), &entry("b", 0, 2_000), 0).unwrap();
        s.insert(&key(3), &entry("c", 0, 3_000), 0).unwrap();
        let ins = s
            .insert_after(&key(1), &entry("a", 0, 9_000), 0, &seen)
            .unwrap();
        // Decided on what the slots hold now: the entry expiring first goes.
        assert_eq!((ins.replaced, ins.entries_delta), (Replaced::Evicted, 0));
        assert_eq!(s.lookup(&key(2), 0), Lookup::Miss);
        assert!(matches!(s.lookup(&key(3), 0), Lookup::Hit { .. }));
        assert!(matches!(s.lookup(&key(1), 0), Lookup::Hit { .. }));
        let t = actual(&shared, 2);
        assert_eq!(s.totals(), Some(t));
        assert_eq!(t.entries, 2);
    }

    #[test]
    fn slots_never_written_are_read_before_the_insert() {
        let c = cfg(2);
        let shared = HookStore::default();
        let s = Store::new(&shared, &c);
        let (_, seen) = s.lookup_seen(&key(1), 0);
        // Another call's entry lands in a slot no one had written: a write
        // decided on the lookup's view could not be made conditional.
        s.insert(&key(2), &entry("b", 0, 2_000), 0).unwrap();
        let before = shared.calls();
        s.insert_after(&key(1), &entry("a", 0, 9_000), 0, &seen)
            .unwrap();
        assert_eq!(shared.calls() - before, 5, "both slots read again");
        assert!(matches!(s.lookup(&key(2), 0), Lookup::Hit { .. }));
        assert!(matches!(s.lookup(&key(1), 0), Lookup::Hit { .. }));
        assert_eq!(s.totals(), Some(actual(&shared.inner, 2)));
    }

    #[test]
    fn churn_stays_bounded_and_totals_stay_right() {
        let c = cfg(8);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let mut evictions = 0;
        let (mut entries, mut bytes) = (0i64, 0i64);
        for n in 0..2_000u64 {
            let text = "x".repeat((n % 50) as usize);
            let ins = s.insert(&key(n), &entry(&text, n, n + 500), n).unwrap();
            evictions += u64::from(ins.evicted());
            entries += ins.entries_delta;
            bytes += ins.bytes_delta;
        }
        // Slots plus the totals key, nothing more.
        assert!(shared.len() <= 8 + 1, "{} keys", shared.len());
        assert!(shared.value_bytes() <= 8 * 4096 + 64);
        let t = actual(&shared, 8);
        assert_eq!(s.totals(), Some(t));
        assert_eq!((entries, bytes), (t.entries as i64, t.bytes as i64));
        assert_eq!(t.entries, 8);
        assert!(evictions > 1_000);
    }

    #[test]
    fn too_large_is_refused() {
        let c = CacheConfig {
            max_entry_bytes: 1024,
            ..cfg(4)
        };
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let e = entry(&"x".repeat(1000), 0, 10);
        assert_eq!(s.insert(&key(1), &e, 0), Err(InsertError::TooLarge));
        assert!(shared.is_empty());
    }

    #[test]
    fn cas_mismatch_is_retried_then_given_up() {
        let c = cfg(1);
        let shared = HookStore::default();
        let s = Store::new(&shared, &c);
        s.insert(&key(1), &entry("a", 0, 100), 0).unwrap();
        // Another worker writes the slot between our read (call 0) and our
        // write: the write fails on its token, the retry succeeds.
        let base = shared.calls();
        shared.before_call(base + 1, |m| {
            let v = m.get(&slot_key(0)).unwrap();
            m.set(&slot_key(0), b"other worker", v.cas).unwrap();
        });
        let ins = s.insert(&key(2), &entry("b", 0, 100), 0).unwrap();
        assert_eq!(ins.replaced, Replaced::Corrupt);
        assert!(matches!(s.lookup(&key(2), 0), Lookup::Hit { .. }));
        // Always losing: bounded attempts, then give up.
        let base = shared.calls();
        for i in 0..cas::ATTEMPTS {
            shared.before_call(base + 2 * i + 1, |m| {
                let v = m.get(&slot_key(0)).unwrap();
                m.set(&slot_key(0), b"busy", v.cas).unwrap();
            });
        }
        assert_eq!(
            s.insert(&key(3), &entry("c", 0, 100), 0),
            Err(InsertError::Contended)
        );
        shared.fail_sets.set(Some(StoreError::Host));
        assert_eq!(
            s.insert(&key(3), &entry("c", 0, 100), 0),
            Err(InsertError::Host)
        );
    }

    #[test]
    fn prepare_creates_every_key_once() {
        let c = cfg(4);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        assert_eq!(s.prepare(), Ok(9));
        assert_eq!(s.prepare(), Ok(0));
        assert_eq!(s.totals(), Some(Totals::default()));
        let ins = s.insert(&key(1), &entry("a", 0, 100), 0).unwrap();
        assert_eq!((ins.replaced, ins.entries_delta), (Replaced::Empty, 1));
        assert_eq!(s.totals(), Some(actual(&shared, 4)));
        assert_eq!(s.lookup(&key(2), 0), Lookup::Miss);
    }

    #[test]
    fn candidates_are_distinct_and_in_range() {
        for slots in [1u32, 2, 3, 1024] {
            let shared = MemoryStore::new();
            let c = cfg(slots);
            let s = Store::new(&shared, &c);
            for n in 0..200 {
                let [a, b] = s.candidates(&key(n));
                assert!(a < slots && b < slots);
                assert_eq!(a == b, slots == 1);
                assert_eq!(s.primary(&key(n)), a);
            }
        }
        assert_eq!(slot_key(7), "llm_filter.cache.v1.slot.7");
        assert_eq!(marker_key(7), "llm_filter.cache.v1.inflight.7");
    }

    #[test]
    fn a_smaller_table_empties_the_slots_no_key_reaches() {
        let shared = MemoryStore::new();
        let big = CacheConfig {
            max_entries: 64,
            ..CacheConfig::default()
        };
        let store = Store::new(&shared, &big);
        assert_eq!(store.relayout().unwrap(), Dropped::default());
        let entry = Entry::from_json(
            crate::dialect::Dialect::Chat,
            200,
            br#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#,
            crate::cache::config::Stamp {
                stored_at_ms: 0,
                expires_at_ms: 1_000_000,
            },
            1 << 20,
        )
        .unwrap();
        for n in 0..40 {
            store.insert(&key(n), &entry, 0).unwrap();
        }
        let before = store.totals().unwrap();
        let small = CacheConfig {
            max_entries: 8,
            ..big.clone()
        };
        let store = Store::new(&shared, &small);
        let dropped = store.relayout().unwrap();
        assert_eq!(dropped.slots, 56);
        let beyond = (8..64)
            .filter(|i| {
                !shared
                    .get(&slot_key(*i))
                    .unwrap()
                    .value
                    .unwrap_or_default()
                    .is_empty()
            })
            .count();
        assert_eq!(beyond, 0, "no entry left where no key reaches");
        let after = store.totals().unwrap();
        assert_eq!(after.entries, before.entries - dropped.entries);
        assert_eq!(after.bytes, before.bytes - dropped.bytes);
        assert!(after.entries <= 8);
        // Every entry left is one its key finds.
        let found = |store: &Store<'_, MemoryStore>| {
            (0..40)
                .filter(|n| matches!(store.lookup(&key(*n), 0), Lookup::Hit { .. }))
                .count() as u64
        };
        assert_eq!(found(&store), after.entries);
        // The same layout again drops nothing.
        assert_eq!(store.relayout().unwrap(), Dropped::default());
        // Growing keeps only what the larger table's keys reach.
        let grown = Store::new(&shared, &big);
        assert_eq!(grown.relayout().unwrap().slots, 0);
        assert_eq!(found(&grown), grown.totals().unwrap().entries);
    }
}
