//! The few things the core needs from the host, as small traits and values, so
//! policy never calls proxy-wasm directly and tests can stand in for Envoy.

use std::cell::RefCell;
use std::collections::HashMap;

pub mod cas;
pub mod codec;
pub mod footprint;
pub mod lease;

/// Failure of a shared-store write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Another writer changed the value since it was read: an expected case,
    /// the caller retries or skips.
    CasMismatch,
    /// The host refused the call for another reason.
    Host,
}

/// A value read from the shared store with its compare-and-swap token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Versioned {
    /// The bytes, `None` when the key was never written.
    pub value: Option<Vec<u8>>,
    /// Token to pass to [`SharedStore::set`] for a conditional write.
    pub cas: Option<u32>,
}

impl Versioned {
    /// The token under which a write is conditional. A key never written has
    /// none, and Envoy writes unconditionally with a token of 0 or none; see
    /// [`cas`] for the helpers that deal with it.
    pub fn token(&self) -> Option<u32> {
        self.cas.filter(|c| *c != 0)
    }
}

/// Key/value store shared by every worker VM of a proxy (Envoy shared data).
/// It has no eviction: callers bound what they put in it.
pub trait SharedStore {
    /// Reads a key.
    fn get(&self, key: &str) -> Result<Versioned, StoreError>;
    /// Writes a key; with `cas` the write only happens if nobody wrote since
    /// the read that returned that token.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

/// An in-memory [`SharedStore`] with Envoy's semantics (a CAS token of 0 or
/// `None` writes unconditionally; tokens grow on every write), for tests and
/// native tools.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    next_cas: RefCell<u32>,
    /// Reads of each key so far.
    reads: RefCell<HashMap<String, usize>>,
    /// What every key written must be (a family of the key registry).
    named: Option<fn(&str) -> bool>,
    /// Keys written that `named` refused, in order.
    unnamed: RefCell<Vec<String>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that notes every key written that `named` refuses
    /// ([`MemoryStore::unnamed`]); the write itself goes ahead, as Envoy's would.
    pub fn checked(named: fn(&str) -> bool) -> Self {
        Self {
            named: Some(named),
            ..Self::default()
        }
    }

    /// Keys written that the store's check refused, in order.
    pub fn unnamed(&self) -> Vec<String> {
        self.unnamed.borrow().clone()
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.map.borrow().len()
    }

    /// True when no key was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys held, in no order.
    pub fn keys(&self) -> Vec<String> {
        self.map.borrow().keys().cloned().collect()
    }

    /// How many times `key` was read so far.
    pub fn reads(&self, key: &str) -> usize {
        self.reads.borrow().get(key).copied().unwrap_or(0)
    }

    /// Total bytes of all values held.
    pub fn value_bytes(&self) -> usize {
        self.map.borrow().values().map(|(v, _)| v.len()).sum()
    }
}

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        let mut reads = self.reads.borrow_mut();
        match reads.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                reads.insert(key.to_string(), 1);
            }
        }
        drop(reads);
        Ok(match self.map.borrow().get(key) {
            Some((v, cas)) => Versioned {
                value: Some(v.clone()),
                cas: Some(*cas),
            },
            None => Versioned::default(),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        if self.named.is_some_and(|named| !named(key)) {
            self.unnamed.borrow_mut().push(key.to_string());
        }
        let mut map = self.map.borrow_mut();
        if let (Some(want), Some((_, have))) = (cas.filter(|c| *c != 0), map.get(key)) {
            if want != *have {
                return Err(StoreError::CasMismatch);
            }
        }
        let mut next = self.next_cas.borrow_mut();
        *next = next.wrapping_add(1).max(1);
        map.insert(key.to_string(), (value.to_vec(), *next));
        Ok(())
    }
}

/// A source of randomness; the core never draws it on its own.
pub trait Random {
    /// The next 64 random bits.
    fn next_u64(&mut self) -> u64;

    /// A uniform float in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        // 53 bits fill an f64 mantissa exactly.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// SplitMix64: fast, statistically sound, seeded once from the host's entropy.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl Random for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Stat sink. Names come fully encoded by the `metrics` module.
pub trait Metrics {
    /// Adds to a counter.
    fn counter(&mut self, name: &str, delta: u64);
    /// Sets a gauge.
    fn gauge(&mut self, name: &str, value: i64);
    /// Moves a gauge by `delta`; every worker adds to the same gauge.
    fn gauge_add(&mut self, name: &str, delta: i64);
    /// Records one histogram sample.
    fn histogram(&mut self, name: &str, value: u64);

    /// Adds to the counter `metric` with `labels`, which
    /// [`crate::stat_name::name`] encodes into the stat's name: a host may
    /// resolve the stat once per label set instead of building its name on
    /// every call.
    fn counter_with(&mut self, metric: &'static str, labels: &[(&'static str, &str)], delta: u64) {
        self.counter(&crate::stat_name::name(metric, labels), delta);
    }

    /// Sets the gauge `metric` with `labels` (see [`Metrics::counter_with`]).
    fn gauge_with(&mut self, metric: &'static str, labels: &[(&'static str, &str)], value: i64) {
        self.gauge(&crate::stat_name::name(metric, labels), value);
    }

    /// Records one sample of the histogram `metric` with `labels` (see
    /// [`Metrics::counter_with`]).
    fn histogram_with(
        &mut self,
        metric: &'static str,
        labels: &[(&'static str, &str)],
        value: u64,
    ) {
        self.histogram(&crate::stat_name::name(metric, labels), value);
    }
}

/// A [`Metrics`] that remembers everything, for tests.
#[derive(Debug, Default)]
pub struct MemoryMetrics {
    /// Counter totals by name.
    pub counters: HashMap<String, u64>,
    /// Last gauge values by name.
    pub gauges: HashMap<String, i64>,
    /// Histogram samples by name.
    pub histograms: HashMap<String, Vec<u64>>,
}

impl Metrics for MemoryMetrics {
    fn counter(&mut self, name: &str, delta: u64) {
        *self.counters.entry(name.to_string()).or_default() += delta;
    }
    fn gauge(&mut self, name: &str, value: i64) {
        self.gauges.insert(name.to_string(), value);
    }
    fn gauge_add(&mut self, name: &str, delta: i64) {
        let g = self.gauges.entry(name.to_string()).or_default();
        *g = g.saturating_add(delta);
    }
    fn histogram(&mut self, name: &str, value: u64) {
        self.histograms
            .entry(name.to_string())
            .or_default()
            .push(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_store_cas() {
        let s = MemoryStore::new();
        assert_eq!(s.get("k").unwrap(), Versioned::default());
        s.set("k", b"a", None).unwrap();
        let v = s.get("k").unwrap();
        assert_eq!(v.value.as_deref(), Some(&b"a"[..]));
        s.set("k", b"b", v.cas).unwrap();
        assert_eq!(s.set("k", b"c", v.cas), Err(StoreError::CasMismatch));
        assert_eq!(s.get("k").unwrap().value.as_deref(), Some(&b"b"[..]));
    }

    #[test]
    fn random_float_in_unit_interval() {
        let mut r = SplitMix64::new(0);
        for _ in 0..10_000 {
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
    }
}
