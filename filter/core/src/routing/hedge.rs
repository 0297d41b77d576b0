//! Hedging: a held, non-streamed call of a priority that asks for it, whose
//! backend has not answered after about its usual slow latency, is also sent
//! to the best other backend of its model; the first good answer wins and the
//! other is abandoned. A hedge costs tokens, so hedges are capped by a share
//! (`routing.hedge.max_ratio`) of the hedgeable calls of a sliding window
//! (the budget's `window_s`), counted per model in shared data.

use serde::{Deserialize, Serialize};

use super::config::HedgeConfig;
use super::health::Health;
use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::{Metrics, SharedStore};
use crate::metrics as names;

/// Prefix of the shared-data key of a model's hedge window; the rest is the
/// model name, one of the configured ones (so the keys are bounded).
pub const KEY_PREFIX: &str = crate::keyspace::HEDGE.key;
/// Buckets of the sliding window.
const BUCKETS: usize = 10;
/// The share of the backend's calls that answer before a hedge is sent: the
/// hedge waits out the backend's 90th percentile, so only the slowest tenth
/// of its calls could ever be hedged.
pub const DELAY_QUANTILE: f64 = 0.9;
/// Without a latency histogram yet, the hedge waits this many times the
/// backend's average latency.
pub const DELAY_LATENCY_FACTOR: f64 = 2.0;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Bucket {
    /// `now_ms / bucket_ms` of the calls counted here.
    epoch: u64,
    calls: u32,
    hedges: u32,
}

/// Hedgeable calls and hedges of one model over the window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Window {
    buckets: [Bucket; BUCKETS],
}

impl Window {
    fn decode(bytes: Option<&[u8]>) -> Self {
        bytes.and_then(codec::decode).unwrap_or_default()
    }

    fn encode(&self) -> Option<Vec<u8>> {
        codec::encode(self)
    }

    /// The bucket of `now_ms`, emptied when it last served an older epoch.
    fn current(&mut self, now_ms: u64, bucket_ms: u64) -> Option<&mut Bucket> {
        let epoch = now_ms / bucket_ms.max(1);
        let b = self.buckets.get_mut((epoch % BUCKETS as u64) as usize)?;
        if b.epoch != epoch {
            *b = Bucket {
                epoch,
                ..Bucket::default()
            };
        }
        Some(b)
    }

    /// Calls and hedges of the buckets still in the window at `now_ms`.
    fn totals(&self, now_ms: u64, bucket_ms: u64) -> (u64, u64) {
        let epoch = now_ms / bucket_ms.max(1);
        self.buckets
            .iter()
            .filter(|b| epoch.saturating_sub(b.epoch) < BUCKETS as u64)
            .fold((0, 0), |(c, h), b| {
                (c + u64::from(b.calls), h + u64::from(b.hedges))
            })
    }
}

fn key(model: &str) -> String {
    format!("{KEY_PREFIX}{model}")
}

/// A hedgeable call of `model` started: it counts toward the cap.
pub fn count_call(store: &dyn SharedStore, model: &str, now_ms: u64, window_ms: u64) {
    let bucket_ms = window_ms / BUCKETS as u64;
    let _ = cas::update(
        store,
        &key(model),
        Unguarded::Overwrite,
        Window::decode,
        Window::encode,
        |w| match w.current(now_ms, bucket_ms) {
            Some(b) => {
                b.calls = b.calls.saturating_add(1);
                Change::Write(())
            }
            None => Change::Keep(()),
        },
    );
}

/// Takes one hedge of `model` when the cap allows: hedges stay at most
/// `max_ratio` of the hedgeable calls of the window. False when it does not,
/// or when the window could not be updated.
pub fn take(
    store: &dyn SharedStore,
    model: &str,
    now_ms: u64,
    window_ms: u64,
    max_ratio: f64,
) -> bool {
    let bucket_ms = window_ms / BUCKETS as u64;
    cas::update(
        store,
        &key(model),
        Unguarded::Overwrite,
        Window::decode,
        Window::encode,
        |w| {
            let (calls, hedges) = w.totals(now_ms, bucket_ms);
            if (hedges.saturating_add(1) as f64) > max_ratio * calls as f64 {
                return Change::Keep(false);
            }
            match w.current(now_ms, bucket_ms) {
                Some(b) => {
                    b.hedges = b.hedges.saturating_add(1);
                    Change::Write(true)
                }
                None => Change::Keep(false),
            }
        },
    )
    .is_ok_and(|u| u.out && u.written)
}

/// A call that has waited this many times its backend's median, and as long
/// as the best other backend takes for nine calls in ten, is hedged even
/// before its own backend's 90th percentile.
pub const MEDIAN_FACTOR: f64 = 2.0;

/// How long a call waits for its backend before it is hedged, at least the
/// configured floor: the backend's 90th percentile of non-streamed calls
/// (twice its average before it has one), or sooner, once the call has
/// waited both [`MEDIAN_FACTOR`] times its backend's median and the 90th
/// percentile of `elsewhere`, the best other backend (where the hedge
/// goes). A backend whose slow calls are far slower than its median and
/// than the other backend, a heavy tail, is then not waited out: past that
/// point a fresh try there is the better bet. A backend without such a
/// tail keeps its 90th percentile, which is the sooner of the two.
pub fn delay_ms(cfg: &HedgeConfig, own: Option<&Health>, elsewhere: Option<&Health>) -> u64 {
    let median = own
        .and_then(|h| h.calls)
        .and_then(|c| c.quantile(0.5))
        .map(|m| m * MEDIAN_FACTOR);
    let early = match (median, elsewhere.and_then(slow_ms)) {
        (Some(median), Some(other)) => Some(median.max(other)),
        _ => None,
    };
    let wait = [own.and_then(slow_ms), early]
        .into_iter()
        .flatten()
        .filter(|v| v.is_finite() && *v > 0.0)
        .reduce(f64::min);
    // `as` saturates: a huge latency gives a huge delay, never a trap.
    wait.map_or(0, |v| v as u64).max(cfg.min_delay_ms)
}

/// A backend's 90th percentile of non-streamed calls, or twice its average
/// before it has one.
fn slow_ms(h: &Health) -> Option<f64> {
    h.calls
        .and_then(|c| c.quantile(DELAY_QUANTILE))
        .or_else(|| h.latency.map(|e| e.value * DELAY_LATENCY_FACTOR))
}

/// How a hedge ended, as the `result` label of the hedges counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeResult {
    /// The hedge answered first: the client got its answer.
    Won,
    /// The first backend answered first (or the hedge failed).
    Lost,
    /// The call ended before either answered.
    Abandoned,
}

impl HedgeResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Won => "won",
            Self::Lost => "lost",
            Self::Abandoned => "abandoned",
        }
    }
}

/// Counts a hedge by how it ended.
pub fn count(m: &mut dyn Metrics, result: HedgeResult) {
    m.counter(
        &names::name(names::ROUTING_HEDGES, &[("result", result.as_str())]),
        1,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryStore;
    use crate::priority::Priority;
    use crate::routing::ewma::{Ewma, Histogram};

    const WINDOW: u64 = 10_000;

    #[test]
    fn hedges_stay_within_their_share_of_the_window() {
        let s = MemoryStore::new();
        assert!(!take(&s, "m", 0, WINDOW, 0.05), "no calls, no hedge");
        for _ in 0..40 {
            count_call(&s, "m", 100, WINDOW);
        }
        // 5% of 40 calls: two hedges.
        assert!(take(&s, "m", 200, WINDOW, 0.05));
        assert!(take(&s, "m", 200, WINDOW, 0.05));
        assert!(!take(&s, "m", 200, WINDOW, 0.05));
        // Another model has its own window.
        assert!(!take(&s, "other", 200, WINDOW, 0.05));
        // Once the calls leave the window, so does the allowance.
        for _ in 0..20 {
            count_call(&s, "m", 20_000, WINDOW);
        }
        assert!(take(&s, "m", 20_000, WINDOW, 0.05));
        assert!(!take(&s, "m", 20_000, WINDOW, 0.05));
        assert!(!take(&s, "m", 20_000, WINDOW, 0.0));
    }

    #[test]
    fn the_delay_follows_the_backend_and_has_a_floor() {
        let cfg = HedgeConfig {
            priorities: vec![Priority::P0],
            min_delay_ms: 250,
            max_ratio: 0.05,
        };
        assert_eq!(delay_ms(&cfg, None, None), 250);
        let mut h = Health {
            latency: Some(Ewma::new(400.0, 0)),
            ..Health::default()
        };
        assert_eq!(delay_ms(&cfg, Some(&h), None), 800);
        h.latency = Some(Ewma::new(50.0, 0));
        assert_eq!(delay_ms(&cfg, Some(&h), None), 250);
        h.latency = Some(Ewma::new(f64::NAN, 0));
        assert_eq!(delay_ms(&cfg, Some(&h), None), 250);
        h.latency = Some(Ewma::new(f64::MAX / 4.0, 0));
        assert_eq!(delay_ms(&cfg, Some(&h), None), u64::MAX);
        // Once calls are measured, their 90th percentile rules.
        for i in 0..100 {
            let ms = if i % 10 == 0 { 5_000.0 } else { 600.0 };
            Histogram::observe(&mut h.calls, ms, 0, 10_000.0);
        }
        assert_eq!(delay_ms(&cfg, Some(&h), None), 600);
    }

    #[test]
    fn a_heavy_tail_is_not_waited_out() {
        let cfg = HedgeConfig {
            priorities: vec![Priority::P0],
            min_delay_ms: 250,
            max_ratio: 0.05,
        };
        let backend = |ms: &dyn Fn(u32) -> f64| {
            let mut h = Health::default();
            for i in 0..100 {
                Histogram::observe(&mut h.calls, ms(i), 0, 10_000.0);
            }
            h
        };
        // 210 ms, but one call in eight takes 4 s: its 90th percentile is
        // in the tail. The other backend answers in 390 ms.
        let near = backend(&|i| if i % 8 == 0 { 4_000.0 } else { 210.0 });
        let mid = backend(&|_| 390.0);
        assert_eq!(delay_ms(&cfg, Some(&near), None), 4_000);
        assert_eq!(delay_ms(&cfg, Some(&near), Some(&mid)), 420);
        // Slower elsewhere: wait as long as a try there takes.
        let far = backend(&|_| 640.0);
        assert_eq!(delay_ms(&cfg, Some(&near), Some(&far)), 640);
        // Without a tail the backend's own 90th percentile is sooner.
        assert_eq!(delay_ms(&cfg, Some(&mid), Some(&far)), 390);
        assert_eq!(delay_ms(&cfg, Some(&mid), Some(&near)), 390);
        // Long answers everywhere: nothing sooner than the own percentile.
        let long = backend(&|i| if i % 3 == 0 { 8_000.0 } else { 2_000.0 });
        assert_eq!(delay_ms(&cfg, Some(&long), Some(&long)), 8_000);
        // An elsewhere with no history leaves the own percentile.
        let unknown = Health::default();
        assert_eq!(delay_ms(&cfg, Some(&near), Some(&unknown)), 4_000);
    }

    #[test]
    fn a_broken_window_reads_as_empty() {
        assert_eq!(Window::decode(Some(b"junk")), Window::default());
        assert_eq!(Window::decode(None), Window::default());
    }
}
