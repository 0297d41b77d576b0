//! Coalescing of concurrent identical calls: the first (the leader) goes
//! upstream, the others (followers, on any worker) wait for its entry instead of
//! paying for the same answer again. A marker in shared data says a key is in
//! flight; it carries a deadline, so a leader that dies never strands anyone.
//!
//! Markers are bounded like the slots: one per slot, at the key's primary slot,
//! so two keys in flight on the same slot do not coalesce (the second simply
//! goes upstream).

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::entry::{self, Entry};
use super::key::Key;
use super::store::{marker_key, Lookup, Store};
use crate::host::cas::{self, Change, Unguarded};
use crate::host::SharedStore;

/// Version of the marker encoding.
const FORMAT: u32 = 1;

/// The outcome of [`claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Go upstream, store the answer, then [`release`] (also on failure).
    Leader(Lease),
    /// An identical call is in flight: [`poll`] until `deadline_ms`.
    Follower {
        /// Give up waiting at this time (ms since the epoch).
        deadline_ms: u64,
    },
    /// Coalescing is not possible now (the marker slot is busy with another
    /// key, contended, or the host failed): go upstream without a marker.
    Unavailable,
}

/// A leader's hold on a key's marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: Key,
    slot: u32,
    token: u64,
}

impl Lease {
    /// The key led.
    pub fn key(&self) -> &Key {
        &self.key
    }
}

/// The outcome of [`poll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// The leader stored the answer: serve it (`x-cache: COALESCED`).
    Ready {
        /// The entry.
        entry: Entry,
        /// Seconds since it was stored.
        age_s: u64,
    },
    /// Still in flight: poll again later.
    KeepWaiting,
    /// The leader finished without an entry, its marker expired, or the wait
    /// is over: go upstream (a new [`claim`] may make this call the leader).
    GoUpstream,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Marker {
    format: u32,
    key: Key,
    deadline_ms: u64,
    token: u64,
}

impl Marker {
    fn encode(&self) -> Vec<u8> {
        entry::options().serialize(self).unwrap_or_default()
    }

    /// An empty, unreadable or other-version marker reads as no marker.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let m: Self = entry::options().deserialize(bytes).ok()?;
        (m.format == FORMAT).then_some(m)
    }

    /// A marker slot as read: `None` when there is no marker.
    fn read(bytes: Option<&[u8]>) -> Option<Self> {
        bytes.and_then(Self::decode)
    }

    /// A marker slot as written: empty once cleared.
    fn write(slot: &Option<Self>) -> Option<Vec<u8>> {
        Some(slot.as_ref().map(Self::encode).unwrap_or_default())
    }
}

/// Claims the lead on `key` at `now_ms`, or joins the call already in flight.
/// `wait_ms` bounds both the marker's life and a follower's wait (the glue may
/// pass less than `cache.coalesce_wait_ms`, e.g. the caller's remaining budget).
/// `token` is a random value telling this leader from any other.
pub fn claim<S: SharedStore + ?Sized>(
    store: &Store<'_, S>,
    key: &Key,
    now_ms: u64,
    wait_ms: u64,
    token: u64,
) -> Claim {
    let shared = store.shared();
    let slot = store.primary(key);
    let name = marker_key(slot);
    let deadline_ms = now_ms.saturating_add(wait_ms);
    let mine = Marker {
        format: FORMAT,
        key: *key,
        deadline_ms,
        token,
    };
    // A missing marker key is written unconditionally by Envoy: read back to
    // see whether another claimant overwrote us.
    let claimed = cas::update(
        shared,
        &name,
        Unguarded::Verify,
        Marker::read,
        Marker::write,
        |marker| {
            if let Some(m) = marker.as_ref().filter(|m| m.deadline_ms > now_ms) {
                if m.key == *key && m.token != token {
                    return Change::Keep(Claim::Follower {
                        deadline_ms: m.deadline_ms.min(deadline_ms),
                    });
                }
                if m.key != *key {
                    return Change::Keep(Claim::Unavailable);
                }
            }
            // None, or expired (its leader died or overran): free to take.
            *marker = Some(mine.clone());
            Change::Write(Claim::Leader(Lease {
                key: *key,
                slot,
                token,
            }))
        },
    );
    claimed.map_or(Claim::Unavailable, |c| c.out)
}

/// Ends a lead, after the entry was stored or when the call failed; followers
/// then find the entry or go upstream. Idempotent, and a marker another leader
/// took over is left alone. Returns true when this call cleared the marker.
pub fn release<S: SharedStore + ?Sized>(store: &Store<'_, S>, lease: &Lease) -> bool {
    let released = cas::update(
        store.shared(),
        &marker_key(lease.slot),
        Unguarded::Overwrite,
        Marker::read,
        Marker::write,
        |marker| match marker {
            Some(m) if m.key == lease.key && m.token == lease.token => {
                *marker = None;
                Change::Write(())
            }
            _ => Change::Keep(()),
        },
    );
    released.is_ok_and(|r| r.written)
}

/// A follower's check at `now_ms`, `deadline_ms` being the one [`claim`]
/// returned. While the leader's marker stands only the small marker is read;
/// the entry is looked up once the marker is gone or the wait is over (the
/// leader stores before it releases, so a released marker means the entry is
/// there or will not come).
pub fn poll<S: SharedStore + ?Sized>(
    store: &Store<'_, S>,
    key: &Key,
    now_ms: u64,
    deadline_ms: u64,
) -> Poll {
    if now_ms < deadline_ms {
        let in_flight = store
            .shared()
            .get(&marker_key(store.primary(key)))
            .ok()
            .and_then(|v| v.value)
            .and_then(|b| Marker::decode(&b))
            .is_some_and(|m| m.key == *key && m.deadline_ms > now_ms);
        if in_flight {
            return Poll::KeepWaiting;
        }
    }
    match store.lookup(key, now_ms) {
        Lookup::Hit { entry, age_s } => Poll::Ready { entry, age_s },
        Lookup::Stale { .. } | Lookup::Miss => Poll::GoUpstream,
    }
}

#[cfg(all(test, feature = "cache"))]
mod tests {
    use super::*;
    use crate::cache::config::{CacheConfig, Stamp};
    use crate::cache::tests::HookStore;
    use crate::dialect::Dialect;
    use crate::host::{MemoryStore, StoreError};

    const WAIT: u64 = 1_000;

    fn cfg(slots: u32) -> CacheConfig {
        CacheConfig {
            max_entries: slots,
            ..CacheConfig::default()
        }
    }

    fn key(n: u8) -> Key {
        [n; 32]
    }

    fn entry(now: u64) -> Entry {
        let body = br#"{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}"#;
        let stamp = Stamp {
            stored_at_ms: now,
            expires_at_ms: now + 60_000,
        };
        Entry::from_json(Dialect::Chat, 200, body, stamp, 4096).unwrap()
    }

    fn lead<S: SharedStore + ?Sized>(s: &Store<'_, S>, k: &Key, now: u64, token: u64) -> Lease {
        match claim(s, k, now, WAIT, token) {
            Claim::Leader(l) => l,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn followers_get_the_leaders_entry() {
        let c = cfg(16);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let k = key(1);
        let lease = lead(&s, &k, 0, 1);
        assert_eq!(lease.key(), &k);
        // A later twin waits until the leader's deadline at most.
        assert_eq!(
            claim(&s, &k, 100, WAIT, 2),
            Claim::Follower { deadline_ms: 1_000 }
        );
        assert_eq!(
            claim(&s, &k, 100, 500, 3),
            Claim::Follower { deadline_ms: 600 }
        );
        assert_eq!(poll(&s, &k, 200, 1_000), Poll::KeepWaiting);
        // Stored but not yet released: still waiting, one more round.
        s.insert(&k, &entry(300), 300).unwrap();
        assert_eq!(poll(&s, &k, 310, 1_000), Poll::KeepWaiting);
        assert!(release(&s, &lease));
        assert!(!release(&s, &lease), "idempotent");
        assert_eq!(
            poll(&s, &k, 320, 1_000),
            Poll::Ready {
                entry: entry(300),
                age_s: 0
            }
        );
        // The marker slot is free again.
        let _ = lead(&s, &k, 400, 4);
    }

    #[test]
    fn a_failed_leader_sends_followers_upstream() {
        let c = cfg(16);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let k = key(1);
        let lease = lead(&s, &k, 0, 1);
        assert!(matches!(claim(&s, &k, 10, WAIT, 2), Claim::Follower { .. }));
        assert!(release(&s, &lease));
        assert_eq!(poll(&s, &k, 20, 1_000), Poll::GoUpstream);
    }

    #[test]
    fn no_follower_waits_forever() {
        let c = cfg(16);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let k = key(1);
        // The leader dies without releasing.
        let dead = lead(&s, &k, 0, 1);
        assert_eq!(poll(&s, &k, 999, 1_000), Poll::KeepWaiting);
        assert_eq!(poll(&s, &k, 1_000, 1_000), Poll::GoUpstream);
        // A follower's own deadline ends its wait even if the marker stands.
        assert_eq!(poll(&s, &k, 500, 500), Poll::GoUpstream);
        // The stale marker is taken over by the next claimant…
        let next = lead(&s, &k, 1_000, 2);
        // …and the dead leader's late release leaves the new marker alone.
        assert!(!release(&s, &dead));
        assert!(matches!(
            claim(&s, &k, 1_001, WAIT, 3),
            Claim::Follower { .. }
        ));
        assert!(release(&s, &next));
    }

    #[test]
    fn another_key_on_the_marker_slot_is_unavailable() {
        let c = cfg(1);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        let _a = lead(&s, &key(1), 0, 1);
        assert_eq!(claim(&s, &key(2), 10, WAIT, 2), Claim::Unavailable);
        // Once the first marker expires the slot can be taken.
        let _b = lead(&s, &key(2), 1_000, 2);
    }

    #[test]
    fn corrupt_marker_is_taken_over() {
        let c = cfg(1);
        let shared = MemoryStore::new();
        let s = Store::new(&shared, &c);
        shared.set(&marker_key(0), b"junk", None).unwrap();
        assert_eq!(poll(&s, &key(1), 0, 100), Poll::GoUpstream);
        let _ = lead(&s, &key(1), 0, 1);
    }

    #[test]
    fn two_claimants_on_an_existing_marker_key_one_leads() {
        let c = cfg(4);
        let shared = HookStore::default();
        let s = Store::new(&shared, &c);
        s.prepare().unwrap();
        let k = key(1);
        let slot = s.primary(&k);
        // B wins the race between A's read and A's write.
        let base = shared.calls();
        shared.before_call(base + 1, move |m| {
            let v = m.get(&marker_key(slot)).unwrap();
            let b = Marker {
                format: FORMAT,
                key: [1; 32],
                deadline_ms: 900,
                token: 2,
            };
            m.set(&marker_key(slot), &b.encode(), v.cas).unwrap();
        });
        assert_eq!(
            claim(&s, &k, 0, WAIT, 1),
            Claim::Follower { deadline_ms: 900 }
        );
    }

    #[test]
    fn two_claimants_on_a_missing_marker_key() {
        let c = cfg(4);
        let k = key(1);
        // B writes after A's unconditional write but before A reads back:
        // A sees it lost and follows.
        let shared = HookStore::default();
        let s = Store::new(&shared, &c);
        let slot = s.primary(&k);
        let base = shared.calls();
        shared.before_call(base + 2, move |m| {
            let b = Marker {
                format: FORMAT,
                key: [1; 32],
                deadline_ms: 900,
                token: 2,
            };
            m.set(&marker_key(slot), &b.encode(), None).unwrap();
        });
        assert_eq!(
            claim(&s, &k, 0, WAIT, 1),
            Claim::Follower { deadline_ms: 900 }
        );
        // B writes before A's write: A overwrites it and both lead. That costs
        // one extra upstream call, never a wrong answer, and B's release then
        // leaves A's marker alone.
        let shared = HookStore::default();
        let s = Store::new(&shared, &c);
        let base = shared.calls();
        shared.before_call(base + 1, move |m| {
            let b = Marker {
                format: FORMAT,
                key: [1; 32],
                deadline_ms: 900,
                token: 2,
            };
            m.set(&marker_key(slot), &b.encode(), None).unwrap();
        });
        let a = lead(&s, &k, 0, 1);
        let b = Lease {
            key: k,
            slot,
            token: 2,
        };
        assert!(!release(&s, &b));
        assert!(release(&s, &a));
    }

    #[test]
    fn host_failures_are_unavailable_not_panics() {
        let c = cfg(4);
        let shared = HookStore::default();
        let s = Store::new(&shared, &c);
        shared.fail_sets.set(Some(StoreError::Host));
        assert_eq!(claim(&s, &key(1), 0, WAIT, 1), Claim::Unavailable);
        shared.fail_sets.set(Some(StoreError::CasMismatch));
        assert_eq!(claim(&s, &key(1), 0, WAIT, 1), Claim::Unavailable);
    }
}
