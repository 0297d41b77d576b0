//! Compare-and-swap over a [`SharedStore`], written once. Every record in
//! shared data is updated by the same read-modify-write loop, with one bound
//! on its attempts and one answer to Envoy's quirk: a write to a key that does
//! not exist yet (its read carries no token) is unconditional, whatever token
//! is passed, so two workers creating the same key both "succeed".

use super::{SharedStore, StoreError, Versioned};

/// Attempts of one compare-and-swap update before it is given up: contention
/// between workers is brief, and every caller can afford to lose an update.
pub const ATTEMPTS: usize = 8;

/// What a write does when its read carried no token (the key was missing), so
/// Envoy would write unconditionally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unguarded {
    /// Write anyway: two workers creating the key at once may lose one
    /// update. For statistics that tolerate a lost sample.
    Overwrite,
    /// Write, then read back: the write stands only if our bytes are there,
    /// otherwise the update is retried on what the other writer left. For
    /// records where two winners would be wrong (a lead, a claim).
    Verify,
    /// Create the key empty first, then change it by compare-and-swap. The
    /// empty value is what `decode` makes of a missing key, encoded: every
    /// creator writes the same bytes, so two creating at once lose nothing,
    /// where [`Unguarded::Verify`] lets two writers of equal bytes (the same
    /// count added in the same millisecond) both read their own back. For
    /// counts. Without an encoding of the empty value, as `Verify`.
    CreateEmpty,
    /// Do not write: the update reports nothing written.
    Skip,
}

/// What an update's closure decided, with what it has to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<T> {
    /// Write the value as changed.
    Write(T),
    /// Leave the stored value alone.
    Keep(T),
}

/// The end of an [`update`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Updated<V, T> {
    /// The value as written, or as read when nothing was written.
    pub value: V,
    /// What the closure said on the attempt that ended the update.
    pub out: T,
    /// The value was written.
    pub written: bool,
}

/// Runs `attempt` again while it loses a race (fails with
/// [`StoreError::CasMismatch`]), at most [`ATTEMPTS`] times; any other result
/// ends it. Each attempt must read afresh. For updates that span more than one
/// key; a single key goes through [`update`].
pub fn retry<T>(mut attempt: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
    for _ in 0..ATTEMPTS {
        match attempt() {
            Err(StoreError::CasMismatch) => continue,
            done => return done,
        }
    }
    Err(StoreError::CasMismatch)
}

/// Writes `bytes` to `key` on condition that nobody wrote since `read`; a read
/// without a token is handled as `unguarded` says. True when written; a lost
/// race is [`StoreError::CasMismatch`].
pub fn write<S: SharedStore + ?Sized>(
    store: &S,
    key: &str,
    read: &Versioned,
    bytes: &[u8],
    unguarded: Unguarded,
) -> Result<bool, StoreError> {
    let token = read.token();
    if token.is_none() && unguarded == Unguarded::Skip {
        return Ok(false);
    }
    store.set(key, bytes, token)?;
    if token.is_none() && matches!(unguarded, Unguarded::Verify | Unguarded::CreateEmpty) {
        let back = store.get(key)?;
        if back.value.as_deref() != Some(bytes) {
            return Err(StoreError::CasMismatch);
        }
    }
    Ok(true)
}

/// Read-modify-write of `key`: reads it, `decode`s the bytes (`None` for a
/// missing key), lets `change` change the value and decide whether to write
/// it, `encode`s and writes it with compare-and-swap, and retries from the
/// read when another writer came first ([`retry`]). A value that does not
/// encode is [`StoreError::Host`].
pub fn update<S, V, T>(
    store: &S,
    key: &str,
    unguarded: Unguarded,
    decode: impl Fn(Option<&[u8]>) -> V,
    encode: impl Fn(&V) -> Option<Vec<u8>>,
    mut change: impl FnMut(&mut V) -> Change<T>,
) -> Result<Updated<V, T>, StoreError>
where
    S: SharedStore + ?Sized,
{
    retry(|| {
        let read = store.get(key)?;
        let mut value = decode(read.value.as_deref());
        let out = match change(&mut value) {
            Change::Keep(out) => {
                return Ok(Updated {
                    value,
                    out,
                    written: false,
                })
            }
            Change::Write(out) => out,
        };
        let bytes = encode(&value).ok_or(StoreError::Host)?;
        if read.token().is_none() && unguarded == Unguarded::CreateEmpty {
            if let Some(empty) = encode(&decode(None)) {
                create_if_absent(store, key, &empty)?;
                // Read again, now with a token.
                return Err(StoreError::CasMismatch);
            }
        }
        let written = write(store, key, &read, &bytes, unguarded)?;
        Ok(Updated {
            value,
            out,
            written,
        })
    })
}

/// Writes `bytes` to `key` when the key does not exist; true when this call
/// wrote it. Envoy has no atomic create: two workers creating the same key at
/// once both write and both see true, the last write staying.
pub fn create_if_absent<S: SharedStore + ?Sized>(
    store: &S,
    key: &str,
    bytes: &[u8],
) -> Result<bool, StoreError> {
    if store.get(key)?.value.is_some() {
        return Ok(false);
    }
    store.set(key, bytes, None)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryStore;
    use std::cell::Cell;

    /// A store whose next `races` writes lose to another worker, which adds
    /// 100 to the counter in between; then every set fails with `fail`, if any.
    #[derive(Default)]
    struct Contended {
        inner: MemoryStore,
        races: Cell<usize>,
        fail: Cell<Option<StoreError>>,
        sets: Cell<usize>,
    }

    impl SharedStore for Contended {
        fn get(&self, key: &str) -> Result<Versioned, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            self.sets.set(self.sets.get() + 1);
            if let Some(e) = self.fail.get() {
                return Err(e);
            }
            if self.races.get() > 0 {
                self.races.set(self.races.get() - 1);
                add(&self.inner, 100, Unguarded::Overwrite)?;
            }
            self.inner.set(key, value, cas)
        }
    }

    fn decode(b: Option<&[u8]>) -> u64 {
        b.and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0, u64::from_le_bytes)
    }

    fn encode(v: &u64) -> Option<Vec<u8>> {
        Some(v.to_le_bytes().to_vec())
    }

    fn add<S: SharedStore + ?Sized>(
        s: &S,
        n: u64,
        unguarded: Unguarded,
    ) -> Result<Updated<u64, u64>, StoreError> {
        update(s, "k", unguarded, decode, encode, |v| {
            *v += n;
            Change::Write(*v)
        })
    }

    fn read(s: &MemoryStore) -> u64 {
        decode(s.get("k").unwrap().value.as_deref())
    }

    /// A store where another worker, which read the key missing too, writes
    /// its own count of 1 (no token) right after our first write.
    #[derive(Default)]
    struct StaleCreator {
        inner: MemoryStore,
        sets: Cell<usize>,
    }

    impl SharedStore for StaleCreator {
        fn get(&self, key: &str) -> Result<Versioned, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            self.inner.set(key, value, cas)?;
            self.sets.set(self.sets.get() + 1);
            if self.sets.get() == 1 {
                let theirs = encode(&1).ok_or(StoreError::Host)?;
                self.inner.set(key, &theirs, None)?;
            }
            Ok(())
        }
    }

    #[test]
    fn two_creators_of_equal_counts_both_count_only_when_created_empty() {
        // Verify reads back the other's bytes, equal to ours: one is lost.
        let s = StaleCreator::default();
        assert_eq!(add(&s, 1, Unguarded::Verify).unwrap().value, 1);
        assert_eq!(read(&s.inner), 1);
        // Created empty first, the count then goes through compare-and-swap
        // on what the other left.
        let s = StaleCreator::default();
        let u = add(&s, 1, Unguarded::CreateEmpty).unwrap();
        assert_eq!((u.value, u.written), (2, true));
        assert_eq!(read(&s.inner), 2);
    }

    #[test]
    fn update_creates_then_changes() {
        let s = MemoryStore::new();
        let u = add(&s, 1, Unguarded::Overwrite).unwrap();
        assert_eq!((u.value, u.out, u.written), (1, 1, true));
        add(&s, 2, Unguarded::Overwrite).unwrap();
        assert_eq!(read(&s), 3);
    }

    #[test]
    fn update_retries_lost_races_on_fresh_values() {
        for unguarded in [Unguarded::Overwrite, Unguarded::Verify, Unguarded::Skip] {
            let s = Contended::default();
            add(&s.inner, 1, Unguarded::Overwrite).unwrap();
            s.races.set(ATTEMPTS - 1);
            let u = add(&s, 1, unguarded).unwrap();
            // Every racing write is kept, and ours on top of them.
            assert_eq!(u.value, 2 + 100 * (ATTEMPTS as u64 - 1), "{unguarded:?}");
            assert_eq!(read(&s.inner), u.value);
            assert_eq!(s.sets.get(), ATTEMPTS);
        }
    }

    #[test]
    fn update_gives_up_after_the_bound() {
        let s = Contended::default();
        add(&s.inner, 1, Unguarded::Overwrite).unwrap();
        s.races.set(ATTEMPTS);
        assert_eq!(
            add(&s, 1, Unguarded::Overwrite),
            Err(StoreError::CasMismatch)
        );
        assert_eq!(s.sets.get(), ATTEMPTS);
        assert_eq!(read(&s.inner), 1 + 100 * ATTEMPTS as u64);
    }

    #[test]
    fn host_errors_are_not_retried() {
        let s = Contended::default();
        s.fail.set(Some(StoreError::Host));
        assert_eq!(add(&s, 1, Unguarded::Overwrite), Err(StoreError::Host));
        assert_eq!(s.sets.get(), 1);
        s.fail.set(Some(StoreError::CasMismatch));
        assert_eq!(
            add(&s, 1, Unguarded::Overwrite),
            Err(StoreError::CasMismatch)
        );
        assert_eq!(s.sets.get(), 1 + ATTEMPTS);
        let unencodable = update(
            &s,
            "k",
            Unguarded::Overwrite,
            decode,
            |_| None,
            |_| Change::Write(()),
        );
        assert_eq!(unencodable, Err(StoreError::Host));
        assert_eq!(s.sets.get(), 1 + ATTEMPTS);
    }

    #[test]
    fn a_declined_update_writes_nothing() {
        let s = Contended::default();
        let u = update(&s, "k", Unguarded::Overwrite, decode, encode, |v| {
            *v = 7;
            Change::Keep("no")
        })
        .unwrap();
        assert_eq!((u.value, u.out, u.written), (7, "no", false));
        assert_eq!(s.sets.get(), 0);
        assert!(s.inner.is_empty());
    }

    /// A store where another worker creates the missing key between our read
    /// and our write (`before_set`) or between our write and our read-back.
    #[derive(Default)]
    struct Creators {
        inner: MemoryStore,
        sets: Cell<usize>,
        after_set: Cell<bool>,
    }

    impl SharedStore for Creators {
        fn get(&self, key: &str) -> Result<Versioned, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            self.sets.set(self.sets.get() + 1);
            let other = 100u64.to_le_bytes();
            if self.sets.get() == 1 && !self.after_set.get() {
                self.inner.set(key, &other, None)?;
            }
            self.inner.set(key, value, cas)?;
            if self.sets.get() == 1 && self.after_set.get() {
                self.inner.set(key, &other, None)?;
            }
            Ok(())
        }
    }

    #[test]
    fn a_missing_key_is_written_as_the_caller_says() {
        // Another creator writes just before us: Envoy ignores the (absent)
        // token, so its write is lost whatever we ask.
        for unguarded in [Unguarded::Overwrite, Unguarded::Verify] {
            let s = Creators::default();
            assert_eq!(add(&s, 1, unguarded).unwrap().value, 1);
            assert_eq!(read(&s.inner), 1);
        }
        // Another creator writes just after us: Overwrite believes it won,
        // Verify sees the other write and retries on it.
        let s = Creators {
            after_set: Cell::new(true),
            ..Creators::default()
        };
        assert_eq!(add(&s, 1, Unguarded::Overwrite).unwrap().value, 1);
        assert_eq!(read(&s.inner), 100);
        let s = Creators {
            after_set: Cell::new(true),
            ..Creators::default()
        };
        let u = add(&s, 1, Unguarded::Verify).unwrap();
        assert_eq!((u.value, u.written), (101, true));
        assert_eq!(read(&s.inner), 101);
        // Skip never writes a key without a token.
        let s = MemoryStore::new();
        let u = add(&s, 1, Unguarded::Skip).unwrap();
        assert_eq!((u.value, u.written), (1, false));
        assert!(s.is_empty());
    }

    #[test]
    fn a_zero_token_is_no_token() {
        let read = Versioned {
            value: Some(b"x".to_vec()),
            cas: Some(0),
        };
        assert_eq!(read.token(), None);
        let s = MemoryStore::new();
        s.set("k", b"y", None).unwrap();
        assert_eq!(write(&s, "k", &read, b"z", Unguarded::Skip), Ok(false));
        assert_eq!(write(&s, "k", &read, b"z", Unguarded::Verify), Ok(true));
        assert_eq!(s.get("k").unwrap().value.as_deref(), Some(&b"z"[..]));
    }

    #[test]
    fn retry_stops_at_the_first_other_result() {
        let calls = Cell::new(0);
        let r = retry(|| {
            calls.set(calls.get() + 1);
            if calls.get() < 3 {
                Err(StoreError::CasMismatch)
            } else {
                Ok(calls.get())
            }
        });
        assert_eq!(r, Ok(3));
        calls.set(0);
        let r: Result<(), _> = retry(|| {
            calls.set(calls.get() + 1);
            Err(StoreError::Host)
        });
        assert_eq!((r, calls.get()), (Err(StoreError::Host), 1));
    }

    #[test]
    fn create_if_absent_creates_once() {
        let s = MemoryStore::new();
        assert_eq!(create_if_absent(&s, "k", b"a"), Ok(true));
        assert_eq!(create_if_absent(&s, "k", b"b"), Ok(false));
        assert_eq!(s.get("k").unwrap().value.as_deref(), Some(&b"a"[..]));
        // An empty value exists too.
        assert_eq!(create_if_absent(&s, "e", b""), Ok(true));
        assert_eq!(create_if_absent(&s, "e", b"b"), Ok(false));
        let s = Contended::default();
        s.fail.set(Some(StoreError::Host));
        assert_eq!(create_if_absent(&s, "k", b"a"), Err(StoreError::Host));
    }
}
