//! A lease in shared data: `on_tick` fires on every worker, so a lease
//! elects the one worker that does a proxy-wide chore this interval (the
//! routing probes, each degrade source's pull), each chore under its own key.

use serde::{Deserialize, Serialize};

use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::SharedStore;

/// Who does the chore until when. `owner` 0 is nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Id of the worker holding the lease (random per worker VM, non-zero).
    pub owner: u64,
    /// The lease ends at this time.
    pub expires_ms: u64,
}

/// Tries to win this interval's lease under `key` for `worker_id`; true
/// means this worker does the chore now and the others skip until
/// `now_ms + interval_ms`.
///
/// Envoy writes a key that does not exist unconditionally, whatever CAS token
/// is passed, so two workers could both "create" the lease. Hence a worker
/// that finds no lease only creates an unowned one that nobody may take
/// before a full interval has passed, and wins nothing this tick. Even if a
/// late creation overwrites a lease won meanwhile, it pushes the next win past
/// that lease's end, so at most one worker wins per interval (provided no
/// worker stalls a whole interval between its read and its write). After the
/// first interval every win is a compare-and-swap on an existing key.
pub fn try_lease<S: SharedStore + ?Sized>(
    store: &S,
    key: &str,
    worker_id: u64,
    now_ms: u64,
    interval_ms: u64,
) -> bool {
    let mine = Lease {
        owner: worker_id,
        expires_ms: now_ms.saturating_add(interval_ms.max(1)),
    };
    // Without a real token the write would be unconditional: never take the
    // lease so (`Skip`).
    let taken = cas::update(
        store,
        key,
        Unguarded::Skip,
        |bytes| bytes.and_then(codec::decode::<Lease>),
        |lease| lease.as_ref().and_then(codec::encode),
        |lease| {
            // An unreadable lease (older format, corruption) counts as
            // expired; the compare-and-swap still lets only one worker
            // replace it.
            if lease.is_some_and(|l| now_ms < l.expires_ms) {
                return Change::Keep(false);
            }
            *lease = Some(mine);
            Change::Write(true)
        },
    );
    match taken {
        Ok(u) if u.written => true,
        // Free to take but no token: the lease was never created.
        Ok(u) if u.out => {
            let unowned = Lease {
                owner: 0,
                expires_ms: now_ms.saturating_add(interval_ms),
            };
            if let Some(b) = codec::encode(&unowned) {
                // A host error leaves the creation to the next tick.
                let _ = cas::create_if_absent(store, key, &b);
            }
            false
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::host::{MemoryStore, Random, SplitMix64, StoreError, Versioned};

    const I: u64 = 5_000;
    const LEASE_KEY: &str = "test.lease";

    #[test]
    fn first_tick_creates_then_one_worker_wins_per_interval() {
        let s = MemoryStore::new();
        assert!(!try_lease(&s, LEASE_KEY, 1, 0, I));
        assert!(!try_lease(&s, LEASE_KEY, 2, 0, I));
        assert!(!try_lease(&s, LEASE_KEY, 1, I - 1, I));
        assert!(try_lease(&s, LEASE_KEY, 2, I, I));
        assert!(!try_lease(&s, LEASE_KEY, 1, I, I));
        assert!(
            !try_lease(&s, LEASE_KEY, 2, I + 1, I),
            "the owner too waits for its lease to end"
        );
        assert!(try_lease(&s, LEASE_KEY, 1, 2 * I, I));
        let v = s.get(LEASE_KEY).unwrap();
        let l: Lease = codec::decode(&v.value.unwrap()).unwrap();
        assert_eq!(
            l,
            Lease {
                owner: 1,
                expires_ms: 3 * I
            }
        );
    }

    #[test]
    fn unreadable_lease_is_taken_over() {
        let s = MemoryStore::new();
        s.set(LEASE_KEY, b"?", None).unwrap();
        assert!(try_lease(&s, LEASE_KEY, 7, 0, I));
        assert!(!try_lease(&s, LEASE_KEY, 8, 0, I));
    }

    /// Another worker's tick, run in the middle of this one's.
    type Interloper<'a> = Box<dyn FnOnce(&MemoryStore) + 'a>;

    /// A store that runs other workers' ticks between this worker's read and
    /// its write, the interleaving Envoy allows across threads.
    struct Racy<'a> {
        inner: &'a MemoryStore,
        before_set: RefCell<Vec<Interloper<'a>>>,
    }

    impl SharedStore for Racy<'_> {
        fn get(&self, key: &str) -> Result<Versioned, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            let pending: Vec<_> = self.before_set.borrow_mut().drain(..).collect();
            for f in pending {
                f(self.inner);
            }
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn racing_creators_never_both_win() {
        let s = MemoryStore::new();
        let wins = RefCell::new(Vec::new());
        // Worker 2 reads "missing", then worker 1 creates the lease and, a
        // little later in the interval, tries to take it; then worker 2's
        // creation lands over it.
        let racy = Racy {
            inner: &s,
            before_set: RefCell::new(vec![Box::new(|s: &MemoryStore| {
                assert!(!try_lease(s, LEASE_KEY, 1, 0, I));
                if try_lease(s, LEASE_KEY, 1, I - 1, I) {
                    wins.borrow_mut().push((1, I - 1));
                }
            })]),
        };
        assert!(!try_lease(&racy, LEASE_KEY, 2, 0, I));
        for now in [I - 1, I, I + 1] {
            for w in [1, 2, 3] {
                if try_lease(&s, LEASE_KEY, w, now, I) {
                    wins.borrow_mut().push((w, now));
                }
            }
        }
        assert_eq!(*wins.borrow(), vec![(1, I)]);
    }

    #[test]
    fn racing_takers_never_both_win() {
        let s = MemoryStore::new();
        assert!(!try_lease(&s, LEASE_KEY, 1, 0, I));
        let other_won = RefCell::new(false);
        // Both read an expired lease; worker 1 writes first.
        let racy = Racy {
            inner: &s,
            before_set: RefCell::new(vec![Box::new(|s: &MemoryStore| {
                *other_won.borrow_mut() = try_lease(s, LEASE_KEY, 1, I, I);
            })]),
        };
        let won = try_lease(&racy, LEASE_KEY, 2, I, I);
        assert!(*other_won.borrow());
        assert!(!won);
    }

    #[test]
    fn random_interleavings_keep_one_winner_per_interval() {
        let mut rng = SplitMix64::new(42);
        for _ in 0..50 {
            let s = MemoryStore::new();
            let wins: RefCell<Vec<u64>> = RefCell::new(Vec::new());
            let mut now = 0u64;
            for _ in 0..400 {
                now += rng.next_u64() % 700;
                let worker = 1 + rng.next_u64() % 4;
                let nested = 1 + rng.next_u64() % 4;
                let race = rng.next_u64().is_multiple_of(3);
                let wins_ref = &wins;
                let racy = Racy {
                    inner: &s,
                    before_set: RefCell::new(if race {
                        vec![Box::new(move |s: &MemoryStore| {
                            if try_lease(s, LEASE_KEY, nested, now, I) {
                                wins_ref.borrow_mut().push(now);
                            }
                        })]
                    } else {
                        vec![]
                    }),
                };
                if try_lease(&racy, LEASE_KEY, worker, now, I) {
                    wins.borrow_mut().push(now);
                }
            }
            let wins = wins.into_inner();
            assert!(wins.len() > 10, "{wins:?}");
            for pair in wins.windows(2) {
                assert!(pair[1] >= pair[0] + I, "{wins:?}");
            }
        }
    }

    #[test]
    fn lease_is_not_taken_without_a_token() {
        struct NoCas(MemoryStore);
        impl SharedStore for NoCas {
            fn get(&self, key: &str) -> Result<Versioned, StoreError> {
                let mut v = self.0.get(key)?;
                v.cas = None;
                Ok(v)
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
                self.0.set(key, value, cas)
            }
        }
        let s = NoCas(MemoryStore::new());
        assert!(!try_lease(&s, LEASE_KEY, 1, 0, I));
        assert!(!try_lease(&s, LEASE_KEY, 1, 10 * I, I));
    }
}
