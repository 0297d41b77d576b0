//! The tiered breaker: how much of their callers' budgets a backend's recent
//! calls consumed decides whether to pass, shed low priorities, or reject all
//! but P0. Its window lives in shared data so every worker sees the same backend.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::config::{BudgetConfig, BUCKETS};
use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::{SharedStore, StoreError};
use crate::priority::Priority;

/// Why a call was not forwarded, as it appears in metric labels and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The backend's budget pressure put the breaker in the shed tier.
    Pressure,
    /// The backend's budget pressure put the breaker in the reject tier.
    CircuitOpen,
    /// The caller's budget was spent before the call could be forwarded.
    BudgetExhausted,
}

impl Reason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pressure => "pressure",
            Self::CircuitOpen => "circuit_open",
            Self::BudgetExhausted => "budget_exhausted",
        }
    }
}

/// Prefix of the shared-data key of a backend's window; the rest is the
/// cluster (or route) name. The version moves when the encoding changes.
pub const KEY_PREFIX: &str = crate::keyspace::BREAKER.key;

/// Names longer than this are hashed into the key, which keeps keys bounded.
const MAX_NAME_LEN: usize = 128;

const FULL: u32 = 1000;

/// The decision about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Forward the call (half-open probes included).
    Pass,
    /// Answer locally: shed in the shed tier.
    Shed {
        /// Why, for metrics and the reply.
        reason: Reason,
    },
    /// Answer locally: rejected in the reject tier.
    Reject {
        /// Why, for metrics and the reply.
        reason: Reason,
    },
}

/// Where a backend's pressure puts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Pressure below `shed_at`: everything passes.
    Pass,
    /// Pressure in `[shed_at, reject_at)`: P2 and a share of P1 are shed.
    Shed,
    /// Pressure at or above `reject_at`: only P0 (and probes) pass.
    Reject,
}

impl Tier {
    /// The gauge value: 0 pass, 1 shed, 2 reject.
    pub fn gauge(self) -> i64 {
        match self {
            Self::Pass => 0,
            Self::Shed => 1,
            Self::Reject => 2,
        }
    }
}

/// What one completed call adds to its backend's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Share of the budget consumed, in per-mille (0..=1000).
    pub consumed_permille: u32,
    /// Retries Envoy made for the call.
    pub retries: u32,
}

impl Sample {
    /// A call that took `elapsed_ms` of a `budget_ms` budget; a failed one
    /// (timeout, 5xx, no response — see [`super::learn::failed`]) consumed all of it,
    /// because the caller got nothing for its wait. `retries` are the retries
    /// Envoy made (its attempt count minus one), or those planned when the
    /// host does not say.
    pub fn new(elapsed_ms: u64, budget_ms: u64, failed: bool, retries: u32) -> Self {
        Self {
            consumed_permille: if failed {
                FULL
            } else {
                used_permille(elapsed_ms, budget_ms)
            },
            retries,
        }
    }
}

/// Retries Envoy made for a call: its `x-envoy-attempt-count` minus one when
/// the route reports it (`include_attempt_count_in_response`), else an
/// estimate — a failed call used every retry it was allowed (the retry
/// conditions cover the failures that count), a successful one none. The
/// estimate errs towards spending the retry budget, never towards a storm.
pub fn retries_made(attempts: Option<u32>, planned: u32, failed: bool) -> u32 {
    match attempts {
        Some(a) => a.saturating_sub(1),
        None if failed => planned,
        None => 0,
    }
}

/// `elapsed / budget` in per-mille, capped at 1000; an empty budget is all used.
pub fn used_permille(elapsed_ms: u64, budget_ms: u64) -> u32 {
    let used = elapsed_ms
        .saturating_mul(u64::from(FULL))
        .checked_div(budget_ms)
        .unwrap_or(u64::from(FULL));
    u32::try_from(used.min(u64::from(FULL))).unwrap_or(FULL)
}

/// A pressure as the per-mille gauge value.
pub fn permille(pressure: f64) -> i64 {
    // `as` saturates and maps NaN to 0: the gauge can never trap.
    (pressure * f64::from(FULL)).round() as i64
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Bucket {
    /// `now_ms / bucket_ms` of the calls counted here; a slot whose epoch has
    /// left the window is empty, whatever it still holds.
    epoch: u64,
    calls: u32,
    consumed: u32,
    retries: u32,
}

/// Totals over the live window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Completed calls.
    pub calls: u64,
    /// Sum of their consumed budget shares, in per-mille.
    pub consumed_permille: u64,
    /// Retries Envoy made for them.
    pub retries: u64,
}

/// A backend's sliding window: a ring of [`BUCKETS`] buckets indexed by
/// `now_ms / bucket_ms`. Every reading is relative to the `now` passed in, so
/// old calls age out even when no call arrives to overwrite them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerState {
    bucket_ms: u64,
    // A fixed-size array has no length prefix: a corrupt value cannot make the
    // decoder allocate.
    buckets: [Bucket; BUCKETS],
}

impl BreakerState {
    /// An empty window for `cfg`.
    pub fn new(cfg: &BudgetConfig) -> Self {
        Self {
            bucket_ms: cfg.bucket_ms.max(1),
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    /// Decodes a stored window; bytes that do not decode, or a window of
    /// another bucket length (the configuration changed), give an empty one.
    pub fn decode(bytes: &[u8], cfg: &BudgetConfig) -> Self {
        match codec::decode::<Self>(bytes) {
            Some(s) if s.bucket_ms == cfg.bucket_ms.max(1) => s,
            _ => Self::new(cfg),
        }
    }

    /// The stored form (bincode, a couple of hundred bytes).
    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        codec::encode(self).ok_or(StoreError::Host)
    }

    fn epoch(&self, now_ms: u64) -> u64 {
        now_ms.checked_div(self.bucket_ms).unwrap_or(0)
    }

    fn live(epoch: u64, now_epoch: u64) -> bool {
        epoch <= now_epoch && now_epoch - epoch < BUCKETS as u64
    }

    /// Adds a completed call at `now_ms`, recycling its bucket if that slot
    /// still holds an older epoch.
    pub fn record(&mut self, now_ms: u64, sample: Sample) {
        let e = self.epoch(now_ms);
        let slot = (e % BUCKETS as u64) as usize;
        if let Some(b) = self.buckets.get_mut(slot) {
            if b.epoch != e {
                *b = Bucket {
                    epoch: e,
                    ..Bucket::default()
                };
            }
            b.calls = b.calls.saturating_add(1);
            b.consumed = b
                .consumed
                .saturating_add(sample.consumed_permille.min(FULL));
            b.retries = b.retries.saturating_add(sample.retries);
        }
    }

    /// Totals of the buckets still inside the window at `now_ms`.
    pub fn window(&self, now_ms: u64) -> Window {
        let e = self.epoch(now_ms);
        self.buckets
            .iter()
            .filter(|b| Self::live(b.epoch, e))
            .fold(Window::default(), |w, b| Window {
                calls: w.calls.saturating_add(u64::from(b.calls)),
                consumed_permille: w.consumed_permille.saturating_add(u64::from(b.consumed)),
                retries: w.retries.saturating_add(u64::from(b.retries)),
            })
    }

    /// Mean budget share consumed by the window's calls, in `[0, 1]`, over at
    /// least `min_calls` calls: the calls a thin window lacks count as healthy
    /// ones. So a handful of failures cannot trip the breaker, and as failures
    /// age out the pressure only falls — a window that drops below `min_calls`
    /// does not read as healthy and then jump back up when the next success
    /// brings the old failures back over the threshold.
    pub fn pressure(&self, now_ms: u64, cfg: &BudgetConfig) -> f64 {
        let w = self.window(now_ms);
        let calls = w.calls.max(u64::from(cfg.min_calls)).max(1);
        (w.consumed_permille as f64 / (calls as f64 * f64::from(FULL))).min(1.0)
    }

    /// The tier at `now_ms`.
    pub fn tier(&self, now_ms: u64, cfg: &BudgetConfig) -> Tier {
        let p = self.pressure(now_ms, cfg);
        if !cfg.enabled {
            Tier::Pass
        } else if p >= cfg.reject_at {
            Tier::Reject
        } else if p >= cfg.shed_at {
            Tier::Shed
        } else {
            Tier::Pass
        }
    }

    /// The retry budget: retries stay allowed while the window's retries are
    /// below `retry_ratio` of its calls (always while it is warming up, below
    /// `min_calls`), so a failing backend cannot be hit by a retry storm.
    pub fn retries_allowed(&self, now_ms: u64, cfg: &BudgetConfig) -> bool {
        if cfg.max_retries == 0 || cfg.retry_ratio <= 0.0 {
            return false;
        }
        let w = self.window(now_ms);
        w.calls < u64::from(cfg.min_calls) || (w.retries as f64) < cfg.retry_ratio * w.calls as f64
    }
}

/// Decides about one call of `priority` at `now_ms`, `r` being a uniform draw
/// in `[0, 1)`. P0 always passes: it keeps probing the backend. In the upper
/// tiers `probe_fraction` of the calls that would be refused still pass, so the
/// window keeps learning and the breaker closes once the backend heals.
pub fn admit(
    state: &BreakerState,
    priority: Priority,
    now_ms: u64,
    r: f64,
    cfg: &BudgetConfig,
) -> Admit {
    if !cfg.enabled || priority == Priority::P0 {
        return Admit::Pass;
    }
    let (share, refusal) = match (state.tier(now_ms, cfg), priority) {
        (Tier::Pass, _) => return Admit::Pass,
        (Tier::Shed, Priority::P1) => (
            cfg.shed_fraction,
            Admit::Shed {
                reason: Reason::Pressure,
            },
        ),
        (Tier::Shed, _) => (
            1.0,
            Admit::Shed {
                reason: Reason::Pressure,
            },
        ),
        (Tier::Reject, _) => (
            1.0,
            Admit::Reject {
                reason: Reason::CircuitOpen,
            },
        ),
    };
    if r < share * (1.0 - cfg.probe_fraction) {
        refusal
    } else {
        Admit::Pass
    }
}

/// The `retry-after` (seconds) to suggest with a refusal: about one bucket
/// when shedding (the tier may drop as soon as the window slides), half a
/// window when rejecting, spread by `r` in `[0, 1)` over `[base, 2·base)` so
/// refused clients do not come back in step.
pub fn retry_after_s(admit: &Admit, cfg: &BudgetConfig, r: f64) -> Option<u64> {
    let base_ms = match admit {
        Admit::Pass => return None,
        Admit::Shed { .. } => cfg.bucket_ms,
        Admit::Reject { .. } => cfg.window_ms / 2,
    };
    let base = base_ms.div_ceil(1000).max(1);
    let r = if r.is_finite() {
        r.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // `as` saturates; `base` is at most half an hour, so this cannot wrap.
    Some(base.saturating_add((base as f64 * r) as u64))
}

/// The shared-data key of the window of `name` (a cluster or route name from
/// the configuration — never a client-supplied value, as keys are never evicted).
pub fn key(name: &str) -> String {
    if name.len() <= MAX_NAME_LEN {
        return format!("{KEY_PREFIX}{name}");
    }
    let digest = Sha256::digest(name.as_bytes());
    let mut out = String::with_capacity(KEY_PREFIX.len() + 40);
    out.push_str(KEY_PREFIX);
    out.push_str("sha256-");
    for b in digest.iter().take(16) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Reads the window of `name`; a missing or undecodable value is an empty window.
pub fn load(
    store: &dyn SharedStore,
    name: &str,
    cfg: &BudgetConfig,
) -> Result<BreakerState, StoreError> {
    let v = store.get(&key(name))?;
    Ok(v.value
        .map(|bytes| BreakerState::decode(&bytes, cfg))
        .unwrap_or_else(|| BreakerState::new(cfg)))
}

/// Adds a completed call to the window of `name` with compare-and-swap,
/// retried up to [`cas::ATTEMPTS`] times; returns the window as written, for
/// the tier gauge. On error the sample is lost and the caller goes on. A
/// missing window is created unconditionally: two workers creating it at once
/// lose one sample.
pub fn record(
    store: &dyn SharedStore,
    name: &str,
    now_ms: u64,
    sample: Sample,
    cfg: &BudgetConfig,
) -> Result<BreakerState, StoreError> {
    let u = cas::update(
        store,
        &key(name),
        Unguarded::Overwrite,
        |bytes| bytes.map_or_else(|| BreakerState::new(cfg), |b| BreakerState::decode(b, cfg)),
        |state| state.encode().ok(),
        |state| {
            state.record(now_ms, sample);
            Change::Write(())
        },
    )?;
    Ok(u.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{MemoryStore, Random, SplitMix64, Versioned};
    use std::cell::Cell;

    const FAIL: Sample = Sample {
        consumed_permille: 1000,
        retries: 0,
    };
    const FAST: Sample = Sample {
        consumed_permille: 100,
        retries: 0,
    };

    fn cfg() -> BudgetConfig {
        BudgetConfig::default() // 30 s window of 3 s buckets, min 10 calls
    }

    fn state_with(n: u32, sample: Sample, now: u64) -> BreakerState {
        let mut s = BreakerState::new(&cfg());
        for _ in 0..n {
            s.record(now, sample);
        }
        s
    }

    #[test]
    fn samples_and_failures() {
        assert_eq!(used_permille(500, 1000), 500);
        assert_eq!(used_permille(5000, 1000), 1000);
        assert_eq!(used_permille(0, 1000), 0);
        assert_eq!(used_permille(1, 0), 1000);
        assert_eq!(used_permille(u64::MAX, 1), 1000);
        assert_eq!(used_permille(u64::MAX, u64::MAX), 1);
        assert_eq!(Sample::new(100, 1000, false, 1).consumed_permille, 100);
        assert_eq!(Sample::new(100, 1000, true, 1).consumed_permille, 1000);
        for (attempts, planned, failed, want) in [
            (Some(3), 2, true, 2),
            (Some(1), 2, true, 0),
            (Some(2), 0, false, 1),
            (Some(0), 2, true, 0),
            (Some(u32::MAX), 0, false, u32::MAX - 1),
            (None, 2, true, 2),
            (None, 2, false, 0),
            (None, 0, true, 0),
        ] {
            assert_eq!(
                retries_made(attempts, planned, failed),
                want,
                "{attempts:?} {planned} {failed}"
            );
        }
        assert_eq!(permille(0.7), 700);
        assert_eq!(permille(f64::NAN), 0);
    }

    #[test]
    fn pressure_needs_min_calls() {
        let c = cfg();
        assert_eq!(c.min_calls, 10);
        assert_eq!(BreakerState::new(&c).pressure(0, &c), 0.0);
        // A handful of failures cannot trip it: the missing calls count as healthy.
        assert!((state_with(6, FAIL, 0).pressure(0, &c) - 0.6).abs() < 1e-9);
        assert_eq!(state_with(6, FAIL, 0).tier(0, &c), Tier::Pass);
        assert!((state_with(9, FAIL, 0).pressure(0, &c) - 0.9).abs() < 1e-9);
        assert_eq!(state_with(10, FAIL, 0).pressure(0, &c), 1.0);
        let mut s = state_with(10, FAIL, 0);
        for _ in 0..10 {
            s.record(0, FAST);
        }
        assert!((s.pressure(0, &c) - 0.55).abs() < 1e-9);
    }

    #[test]
    fn a_success_after_a_lull_never_raises_the_tier() {
        // Failures aging out of a thin window, then one healthy call: the tier
        // must not go back up (it used to read 0 below `min_calls`, then jump
        // to the old failures' pressure once the success made the count).
        let c = cfg();
        for fails in 0..c.min_calls {
            let mut s = state_with(fails, FAIL, 0);
            let before = s.tier(0, &c);
            s.record(0, FAST);
            assert!(s.tier(0, &c) <= before, "{fails} failures");
        }
    }

    #[test]
    fn window_ages_without_traffic() {
        let c = cfg();
        let t0 = 1_000_000;
        let s = state_with(20, FAIL, t0);
        assert_eq!(s.tier(t0, &c), Tier::Reject);
        // Still inside the window nine buckets later...
        assert_eq!(s.tier(t0 + 9 * c.bucket_ms, &c), Tier::Reject);
        // ...gone once its bucket leaves it, with nothing written meanwhile.
        assert_eq!(
            s.window(t0 + 10 * c.bucket_ms + c.bucket_ms),
            Window::default()
        );
        assert_eq!(s.tier(t0 + c.window_ms + c.bucket_ms, &c), Tier::Pass);
        // A clock read from before the samples does not see them either.
        assert_eq!(s.window(t0 - c.window_ms - c.bucket_ms).calls, 0);
    }

    #[test]
    fn old_slots_are_recycled() {
        let c = cfg();
        let mut s = state_with(20, FAIL, 0);
        // Same slot, one lap later: the old bucket is replaced, not added to.
        let lap = c.bucket_ms * BUCKETS as u64;
        for _ in 0..10 {
            s.record(lap, FAST);
        }
        let w = s.window(lap);
        assert_eq!((w.calls, w.consumed_permille), (10, 1000));
    }

    #[test]
    fn tiers_follow_thresholds() {
        let c = cfg();
        for (consumed, tier) in [
            (0, Tier::Pass),
            (699, Tier::Pass),
            (700, Tier::Shed),
            (899, Tier::Shed),
            (900, Tier::Reject),
            (1000, Tier::Reject),
        ] {
            let s = state_with(
                20,
                Sample {
                    consumed_permille: consumed,
                    retries: 0,
                },
                0,
            );
            assert_eq!(s.tier(0, &c), tier, "{consumed}");
        }
        let off = BudgetConfig {
            enabled: false,
            ..cfg()
        };
        assert_eq!(state_with(20, FAIL, 0).tier(0, &off), Tier::Pass);
        assert_eq!(Tier::Reject.gauge(), 2);
    }

    /// The share of each priority refused per tier, over evenly spread draws.
    fn refused_share(s: &BreakerState, p: Priority, c: &BudgetConfig) -> f64 {
        let n = 100_000;
        let refused = (0..n)
            .filter(|i| admit(s, p, 0, *i as f64 / n as f64, c) != Admit::Pass)
            .count();
        refused as f64 / n as f64
    }

    #[test]
    fn admit_sheds_by_priority() {
        let c = cfg();
        let shed = state_with(
            20,
            Sample {
                consumed_permille: 800,
                retries: 0,
            },
            0,
        );
        let open = state_with(20, FAIL, 0);
        let healthy = state_with(20, FAST, 0);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-3;
        for s in [&healthy, &shed, &open] {
            assert_eq!(refused_share(s, Priority::P0, &c), 0.0);
        }
        assert_eq!(refused_share(&healthy, Priority::P2, &c), 0.0);
        assert!(near(refused_share(&shed, Priority::P1, &c), 0.2 * 0.95));
        assert!(near(refused_share(&shed, Priority::P2, &c), 0.95));
        assert!(near(refused_share(&open, Priority::P1, &c), 0.95));
        assert!(near(refused_share(&open, Priority::P2, &c), 0.95));
        assert_eq!(
            admit(&shed, Priority::P2, 0, 0.0, &c),
            Admit::Shed {
                reason: Reason::Pressure
            }
        );
        assert_eq!(
            admit(&open, Priority::P1, 0, 0.0, &c),
            Admit::Reject {
                reason: Reason::CircuitOpen
            }
        );
        // A draw outside [0, 1) fails open.
        assert_eq!(admit(&open, Priority::P2, 0, f64::NAN, &c), Admit::Pass);
        let off = BudgetConfig {
            enabled: false,
            ..cfg()
        };
        assert_eq!(admit(&open, Priority::P2, 0, 0.0, &off), Admit::Pass);
    }

    #[test]
    fn retry_budget() {
        let c = cfg(); // ratio 0.2, min 10 calls
        let mut s = BreakerState::new(&c);
        // Warming up: allowed whatever the retries.
        for _ in 0..9 {
            s.record(
                0,
                Sample {
                    consumed_permille: 1000,
                    retries: 2,
                },
            );
        }
        assert!(s.retries_allowed(0, &c));
        s.record(0, FAIL);
        assert!(!s.retries_allowed(0, &c)); // 18 retries over 10 calls
        for _ in 0..80 {
            s.record(0, FAST);
        }
        assert!(!s.retries_allowed(0, &c)); // 18 / 90 = 0.2, not below
        s.record(0, FAST);
        assert!(s.retries_allowed(0, &c));
        // The retries age out with the window.
        let mut s = state_with(10, FAST, 0);
        s.record(
            0,
            Sample {
                consumed_permille: 0,
                retries: 100,
            },
        );
        assert!(!s.retries_allowed(0, &c));
        assert!(s.retries_allowed(c.window_ms + c.bucket_ms, &c));
        for (ratio, max) in [(0.0, 2), (0.2, 0)] {
            let off = BudgetConfig {
                retry_ratio: ratio,
                max_retries: max,
                ..cfg()
            };
            assert!(!BreakerState::new(&off).retries_allowed(0, &off));
        }
    }

    #[test]
    fn retry_after_is_jittered_and_bounded() {
        let c = cfg();
        let shed = Admit::Shed {
            reason: Reason::Pressure,
        };
        let reject = Admit::Reject {
            reason: Reason::CircuitOpen,
        };
        assert_eq!(retry_after_s(&Admit::Pass, &c, 0.5), None);
        assert_eq!(retry_after_s(&shed, &c, 0.0), Some(3));
        assert_eq!(retry_after_s(&shed, &c, 0.999), Some(5));
        assert_eq!(retry_after_s(&reject, &c, 0.0), Some(15));
        assert_eq!(retry_after_s(&reject, &c, 0.5), Some(22));
        assert_eq!(retry_after_s(&reject, &c, f64::NAN), Some(15));
        assert_eq!(retry_after_s(&reject, &c, 7.0), Some(30));
        let tiny = BudgetConfig {
            bucket_ms: 100,
            window_ms: 1000,
            ..cfg()
        };
        assert_eq!(retry_after_s(&shed, &tiny, 0.0), Some(1));
        assert_eq!(retry_after_s(&reject, &tiny, 0.0), Some(1));
    }

    #[test]
    fn encoding_round_trips_and_tolerates_garbage() {
        let c = cfg();
        let s = state_with(12, FAIL, 123_456);
        let bytes = s.encode().unwrap();
        assert!(bytes.len() <= 256, "{}", bytes.len());
        assert_eq!(BreakerState::decode(&bytes, &c), s);
        let empty = BreakerState::new(&c);
        assert_eq!(BreakerState::decode(&[], &c), empty);
        assert_eq!(BreakerState::decode(&bytes[..bytes.len() - 1], &c), empty);
        assert_eq!(BreakerState::decode(&[0xff; 4096], &c), empty);
        // A window of another bucket length is not misread.
        let other = BudgetConfig {
            bucket_ms: 1000,
            window_ms: 10_000,
            ..cfg()
        };
        assert_eq!(
            BreakerState::decode(&bytes, &other),
            BreakerState::new(&other)
        );
    }

    #[test]
    fn keys_are_prefixed_and_bounded() {
        assert_eq!(key("openai"), "llm_filter.budget.v1.breaker.openai");
        let long = "x".repeat(500);
        let k = key(&long);
        assert!(k.starts_with("llm_filter.budget.v1.breaker.sha256-"));
        assert_eq!(k.len(), KEY_PREFIX.len() + "sha256-".len() + 32);
        assert_ne!(k, key(&"y".repeat(500)));
    }

    #[test]
    fn store_round_trip() {
        let c = cfg();
        let store = MemoryStore::new();
        assert_eq!(load(&store, "a", &c).unwrap(), BreakerState::new(&c));
        for _ in 0..10 {
            record(&store, "a", 5_000, FAIL, &c).unwrap();
        }
        let s = load(&store, "a", &c).unwrap();
        assert_eq!(s.window(5_000).calls, 10);
        assert_eq!(s.tier(5_000, &c), Tier::Reject);
        assert_eq!(load(&store, "b", &c).unwrap().window(5_000).calls, 0);
        store.set(&key("c"), b"junk", None).unwrap();
        assert_eq!(load(&store, "c", &c).unwrap(), BreakerState::new(&c));
        record(&store, "c", 0, FAST, &c).unwrap();
        assert_eq!(load(&store, "c", &c).unwrap().window(0).calls, 1);
    }

    /// A store whose first `conflicts` conditional writes lose a race.
    struct Contended {
        inner: MemoryStore,
        conflicts: Cell<usize>,
        host_error: bool,
    }

    impl SharedStore for Contended {
        fn get(&self, key: &str) -> Result<Versioned, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            if self.host_error {
                return Err(StoreError::Host);
            }
            if self.conflicts.get() > 0 {
                self.conflicts.set(self.conflicts.get() - 1);
                // Another worker wrote in between.
                self.inner
                    .set(key, &BreakerState::new(&cfg()).encode()?, None)?;
                return Err(StoreError::CasMismatch);
            }
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn record_retries_lost_races_then_gives_up() {
        let c = cfg();
        let store = |conflicts, host_error| Contended {
            inner: MemoryStore::new(),
            conflicts: Cell::new(conflicts),
            host_error,
        };
        let s = store(cas::ATTEMPTS - 1, false);
        assert_eq!(record(&s, "a", 0, FAIL, &c).unwrap().window(0).calls, 1);
        assert_eq!(load(&s, "a", &c).unwrap().window(0).calls, 1);
        let s = store(cas::ATTEMPTS, false);
        assert_eq!(record(&s, "a", 0, FAIL, &c), Err(StoreError::CasMismatch));
        let s = store(0, true);
        assert_eq!(record(&s, "a", 0, FAIL, &c), Err(StoreError::Host));
    }

    /// Drives a backend through an outage and a recovery with a fake clock:
    /// mixed traffic while it times out, then only P2 traffic once it is fast.
    /// Returns the tier seen each second.
    fn simulate(c: &BudgetConfig, outage_s: u64, after_s: u64, rps: u64) -> Vec<Tier> {
        let store = MemoryStore::new();
        let mut rng = SplitMix64::new(9);
        let mut tiers = Vec::new();
        let step = 1000 / rps;
        let mut now = 1_700_000_000_000u64;
        for second in 0..outage_s + after_s {
            let healthy = second >= outage_s;
            for i in 0..rps {
                let priority = if healthy {
                    Priority::P2
                } else {
                    Priority::ALL[(i % 3) as usize]
                };
                let state = load(&store, "backend", c).unwrap();
                if admit(&state, priority, now, rng.next_f64(), c) == Admit::Pass {
                    let sample = if healthy { FAST } else { FAIL };
                    record(&store, "backend", now, sample, c).unwrap();
                }
                now += step;
            }
            tiers.push(load(&store, "backend", c).unwrap().tier(now, c));
        }
        tiers
    }

    #[test]
    fn breaker_opens_then_closes_with_only_low_priority_traffic() {
        let c = cfg();
        let tiers = simulate(&c, 60, 60, 20);
        assert_eq!(tiers[59], Tier::Reject, "{tiers:?}");
        // Healed: the probes (5 % of P2) and the sliding window bring it back
        // to pass within about one window, and it stays there.
        let closed_at = tiers.iter().rposition(|t| *t != Tier::Pass).unwrap() + 1;
        assert!(
            closed_at > 60 && closed_at <= 60 + 33,
            "{closed_at} {tiers:?}"
        );
        // On the way down it passes through the shed tier, not straight to pass.
        assert!(tiers[60..closed_at].contains(&Tier::Shed), "{tiers:?}");
    }

    #[test]
    fn breaker_closes_by_aging_alone_without_probes() {
        let c = BudgetConfig {
            probe_fraction: 0.0,
            ..cfg()
        };
        let tiers = simulate(&c, 60, 60, 20);
        assert_eq!(tiers[59], Tier::Reject);
        let closed_at = tiers.iter().rposition(|t| *t != Tier::Pass).unwrap() + 1;
        assert!(closed_at <= 60 + 33, "{closed_at} {tiers:?}");
    }
}
