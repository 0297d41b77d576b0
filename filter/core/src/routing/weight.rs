//! Effective weights: a cluster's configured weight scaled by what its health
//! says, so traffic leaves slow, failing or loaded backends within seconds and
//! returns gradually. Every factor is bounded, so the arithmetic never yields
//! NaN, infinity or an all-zero table by accident.
//!
//! For each backend `i` of a model at time `now`:
//!
//! ```text
//! effective_i = base_i × L_i × E_i × Q_i × R_i × F_i      (0 while i is ejected)
//!
//! L_i latency  = min over k of 1 − c_ik × (1 − clamp(max(best_k, 1) / max(s_ik, 1), 0.05, 1))
//!                k: the kind of call, judged apart: non-streamed (time to the
//!                end, paced per output token: `health::paced_ms`) and streams
//!                (time to the first byte); a kind i has no
//!                fresh sample of, or no backend sets a bar for, counts 1.
//!                s_ik = ½ mean_ik + ½ tail_ik, i's latency score for kind k:
//!                mean_ik the decayed mean of i's successful calls of kind k,
//!                tail_ik the mean of their slowest 10% (see `ewma`); best_k:
//!                the lowest score among the model's clusters that are not
//!                ejected and not stale; c_ik = 2^(−age_ik / half_life), the
//!                confidence left in i's samples, so stale knowledge fades
//!                to neutral.
//! E_i errors   = max((1 − c_i × err_i)^4, 0.02)
//!                err_i: EWMA share of failed calls (5xx, 429, reset, timeout).
//! Q_i load     = max(1 / (1 + waiting_i / 8) × kv(usage_i), 0.05)
//!                kv(u) = 1 for u ≤ 0.7, falling linearly to 0.1 at u = 1;
//!                1 when the server exports no load or the reading is older
//!                than 3 probe intervals.
//! R_i ramp     = 0.1 + 0.9 × min(1, (now − recovering_since_i) / ramp)
//!                1 when not recovering from an ejection (or ramp = 0).
//! F_i in flight = max(1 / (1 + excess_i / (fair_i + 4)), 0.25)
//!                n_i: calls in flight to i across workers (0 once untouched
//!                for 10 minutes, a leak); excess_i = max(0, n_i − fair_i);
//!                fair_i = N × w_i × d_i / Σ_j w_j × d_j, the calls i holds at
//!                its share of the weight w_i = base_i × L_i × E_i × Q_i × R_i
//!                when each lasts its usual d_i (Little's law); d_i: the
//!                average time of i's successful calls to their end, streams
//!                included (the mean of the others' when unknown, at least
//!                1 ms); N and the sum run over the model's clusters not ejected.
//! ```
//!
//! The tail is what a caller waits for when unlucky: a backend that is fast
//! but now and then takes seconds scores far behind a steady one, so it keeps
//! a trickle of calls. Kinds are judged apart because a stream's length is the
//! answer's, not the backend's; a backend is as good as its worse kind. Calls
//! in flight show a stall before any of its calls completes; only calls beyond
//! what the backend's share and usual call time explain count, so the factor
//! does not charge a slow backend a second time for the calls it holds.
//!
//! Unknown health (no record, no sample yet) gives each factor 1. If every
//! backend of the model is ejected, the base weights are used: sending to a
//! probably-bad backend beats failing every call locally.

use super::config::{Backend, RoutingConfig};
use super::ewma::MAX_SAMPLE_MS;
use super::health::{Health, Histogram, Load};

/// Floor of the latency factor: even a much slower cluster keeps a trickle of
/// calls, which keeps its average fresh.
pub const LATENCY_FLOOR: f64 = 0.05;
/// Exponent of the error factor: a 10% error rate costs about a third.
pub const ERROR_EXPONENT: i32 = 4;
/// Floor of the error factor.
pub const ERROR_FLOOR: f64 = 0.02;
/// Waiting requests that halve the load factor.
pub const QUEUE_HALF: f64 = 8.0;
/// KV-cache usage up to which the server is not considered loaded.
pub const KV_KNEE: f64 = 0.7;
/// KV factor at full cache.
pub const KV_FLOOR: f64 = 0.1;
/// Floor of the load factor.
pub const LOAD_FLOOR: f64 = 0.05;
/// Ramp factor right after an ejection ends.
pub const RAMP_START: f64 = 0.1;
pub use super::ewma::TAIL_SHARE;
/// Weight of the tail in a backend's latency score; the mean has the rest.
pub const TAIL_BLEND: f64 = 0.5;
/// Calls in flight beyond its share a backend may hold before the in-flight
/// factor halves its weight, on top of the share itself.
pub const IN_FLIGHT_SLACK: f64 = 4.0;
/// Floor of the in-flight factor: a backend holding many calls still gets
/// some, which it answers once the stall ends.
pub const IN_FLIGHT_FLOOR: f64 = 0.25;
/// Confidence below which latencies no longer set the bar for others.
const STALE_CONFIDENCE: f64 = 0.125;
/// Load readings older than this many probe intervals are ignored.
const LOAD_FRESH_INTERVALS: u64 = 3;

/// `x` bounded to `[floor, 1]`; anything not finite is treated as unknown (1).
fn unit(x: f64, floor: f64) -> f64 {
    if x.is_finite() {
        x.clamp(floor, 1.0)
    } else {
        1.0
    }
}

/// Latency factor of a cluster whose score is `this_ms`, given the best
/// score `best_ms` of the model and the confidence left in `this_ms`.
/// Latencies under 1 ms count as 1 ms, so zero never divides.
pub fn latency_factor(best_ms: f64, this_ms: f64, confidence: f64) -> f64 {
    if !(best_ms.is_finite() && this_ms.is_finite()) {
        return 1.0;
    }
    let raw = unit(best_ms.max(1.0) / this_ms.max(1.0), LATENCY_FLOOR);
    let c = unit(confidence, 0.0);
    unit(1.0 - c * (1.0 - raw), LATENCY_FLOOR)
}

/// Error factor for an error rate in `[0, 1]` (clamped).
pub fn error_factor(error_rate: f64) -> f64 {
    // Unknown (not finite) means no evidence of errors.
    let e = if error_rate.is_finite() {
        error_rate.clamp(0.0, 1.0)
    } else {
        0.0
    };
    unit((1.0 - e).powi(ERROR_EXPONENT), ERROR_FLOOR)
}

/// Load factor from a model server's queue and KV-cache usage.
pub fn load_factor(load: &Load) -> f64 {
    let queue = match load.waiting {
        Some(w) if w.is_finite() && w > 0.0 => 1.0 / (1.0 + w / QUEUE_HALF),
        _ => 1.0,
    };
    let kv = match load.kv_usage {
        Some(u) if u.is_finite() && u > KV_KNEE => {
            let over = (u.min(1.0) - KV_KNEE) / (1.0 - KV_KNEE);
            1.0 - over * (1.0 - KV_FLOOR)
        }
        _ => 1.0,
    };
    unit(queue * kv, LOAD_FLOOR)
}

/// Ramp factor: rises linearly from [`RAMP_START`] to 1 over `ramp_ms` after
/// an ejection ends at `recovering_since_ms`.
pub fn ramp_factor(now_ms: u64, recovering_since_ms: Option<u64>, ramp_ms: u64) -> f64 {
    let Some(since) = recovering_since_ms else {
        return 1.0;
    };
    if ramp_ms == 0 {
        return 1.0;
    }
    let progress = now_ms.saturating_sub(since) as f64 / ramp_ms as f64;
    unit(
        RAMP_START + (1.0 - RAMP_START) * progress.min(1.0),
        RAMP_START,
    )
}

/// Latency score from a mean and a tail latency: [`TAIL_BLEND`] of the tail,
/// the rest of the mean; `None` unless both are finite.
pub fn latency_score(mean_ms: f64, tail_ms: f64) -> Option<f64> {
    let s = (1.0 - TAIL_BLEND) * mean_ms + TAIL_BLEND * tail_ms;
    s.is_finite().then_some(s.max(0.0))
}

/// In-flight factor of a backend holding `in_flight` calls where its share of
/// the weight and its usual call time would hold `fair`.
pub fn in_flight_factor(in_flight: f64, fair: f64) -> f64 {
    if !(in_flight.is_finite() && fair.is_finite()) {
        return 1.0;
    }
    let fair = fair.max(0.0);
    let excess = (in_flight - fair).max(0.0);
    unit(
        1.0 / (1.0 + excess / (fair + IN_FLIGHT_SLACK)),
        IN_FLIGHT_FLOOR,
    )
}

/// The lowest latency score of each kind of call among a model's clusters
/// that are not ejected, from samples fresh enough.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Best {
    /// Non-streamed calls, by their time to the end paced per output token.
    pub calls: Option<f64>,
    /// Streams, by their time to the first byte.
    pub streams: Option<f64>,
}

impl Best {
    /// Each kind's best with the scores of `h` taken in.
    fn with(self, h: &Health, now_ms: u64, half_life_ms: f64) -> Self {
        let min = |best: Option<f64>, hist: Option<Histogram>| {
            let mine = hist.and_then(|x| fresh_score(&x, now_ms, half_life_ms));
            match (best, mine) {
                (Some(b), Some((m, _))) => Some(b.min(m)),
                (b, m) => b.or(m.map(|(m, _)| m)),
            }
        };
        Self {
            calls: min(self.calls, h.paced.or(h.calls)),
            streams: min(self.streams, h.streams),
        }
    }
}

/// The latency score of a histogram and the confidence left in it, if fresh
/// enough to set the bar.
fn fresh_score(h: &Histogram, now_ms: u64, half_life_ms: f64) -> Option<(f64, f64)> {
    let c = h.confidence(now_ms, half_life_ms);
    if c < STALE_CONFIDENCE {
        return None;
    }
    let score = latency_score(h.mean()?, h.tail_mean(TAIL_SHARE)?)?;
    Some((score, c))
}

/// Health factor of one cluster (the product of the latency, error, load and
/// ramp factors), in `(0, 1]`; the in-flight factor needs the whole model and
/// is applied by [`effective_weights`].
pub fn health_factor(config: &RoutingConfig, h: &Health, best: &Best, now_ms: u64) -> f64 {
    let half_life = config.ewma_half_life_ms;
    // A backend is as good as its worse kind: the weight is one per model,
    // whatever kind the next call is.
    let latency = [(best.calls, h.paced.or(h.calls)), (best.streams, h.streams)]
        .into_iter()
        .filter_map(|(best, hist)| {
            let (mine, c) = fresh_score(&hist?, now_ms, half_life)?;
            Some(latency_factor(best?, mine, c))
        })
        .fold(1.0, f64::min);
    let errors = match h.errors {
        Some(e) => error_factor(e.value * e.confidence(now_ms, half_life)),
        None => 1.0,
    };
    let fresh_for = config
        .probe_interval_ms
        .saturating_mul(LOAD_FRESH_INTERVALS)
        .saturating_add(config.probe_timeout_ms);
    let load = match h.load {
        Some(l) if now_ms.saturating_sub(h.load_at_ms) <= fresh_for => load_factor(&l),
        _ => 1.0,
    };
    let ramp = ramp_factor(now_ms, h.recovering_since_ms, config.ramp_ms);
    unit(latency * errors * load * ramp, 0.0)
}

/// Effective weights of a model's backends.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// One weight per backend, in backend order; finite and `>= 0`.
    pub values: Vec<f64>,
    /// Every backend was ejected and the base weights were used.
    pub fallback: bool,
}

/// Effective weights of `backends` given their health (`health[i]` for
/// `backends[i]`; missing or `None` is unknown).
pub fn effective_weights(
    config: &RoutingConfig,
    backends: &[Backend],
    health: &[Option<Health>],
    now_ms: u64,
) -> Weights {
    let health_of = |i: usize| health.get(i).copied().flatten();
    let ejected: Vec<bool> = (0..backends.len())
        .map(|i| health_of(i).is_some_and(|h| h.is_ejected(now_ms)))
        .collect();
    if !ejected.is_empty() && ejected.iter().all(|e| *e) {
        return Weights {
            values: backends.iter().map(|b| f64::from(b.weight)).collect(),
            fallback: true,
        };
    }
    let is_out = |i: usize| ejected.get(i).copied().unwrap_or(false);
    let best = (0..backends.len())
        .filter(|i| !is_out(*i))
        .filter_map(health_of)
        .fold(Best::default(), |best, h| {
            best.with(&h, now_ms, config.ewma_half_life_ms)
        });
    let mut values: Vec<f64> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if is_out(i) {
                return 0.0;
            }
            let factor = health_of(i).map_or(1.0, |h| health_factor(config, &h, &best, now_ms));
            let w = f64::from(b.weight) * factor;
            if w.is_finite() {
                w.max(0.0)
            } else {
                0.0
            }
        })
        .collect();
    apply_in_flight(
        &mut values,
        backends.len(),
        |i| health_of(i).filter(|_| !is_out(i)),
        now_ms,
    );
    Weights {
        values,
        fallback: false,
    }
}

/// Scales `values` (the weights before the in-flight factor) by each
/// backend's in-flight factor; `health(i)` is `None` for an ejected or unknown
/// backend, which holds no share.
fn apply_in_flight(
    values: &mut [f64],
    n: usize,
    health: impl Fn(usize) -> Option<Health>,
    now_ms: u64,
) {
    let in_flight: Vec<f64> = (0..n)
        .map(|i| health(i).map_or(0.0, |h| f64::from(h.in_flight_at(now_ms))))
        .collect();
    let calls: f64 = in_flight.iter().sum();
    if calls <= 0.0 {
        return;
    }
    let durations: Vec<Option<f64>> = (0..n)
        .map(|i| {
            let d = health(i)?.latency?.value;
            d.is_finite().then(|| d.clamp(1.0, MAX_SAMPLE_MS))
        })
        .collect();
    let known: Vec<f64> = durations.iter().flatten().copied().collect();
    let usual = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    // Each backend's expected share of the calls in flight.
    let held: Vec<f64> = values
        .iter()
        .zip(&durations)
        .map(|(w, d)| w * d.unwrap_or(usual))
        .collect();
    let total: f64 = held.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        return;
    }
    for ((w, n), h) in values.iter_mut().zip(&in_flight).zip(&held) {
        *w *= in_flight_factor(*n, calls * (h / total));
    }
}

/// A weight as the integer gauge value (×1000, rounded).
pub fn gauge_value(weight: f64) -> i64 {
    if weight.is_finite() {
        // `as` saturates at the i64 bounds.
        (weight * 1_000.0).round() as i64
    } else {
        0
    }
}

/// Weighted random choice: the index whose share of the total covers `r` in
/// `[0, 1)`. Weights that are not finite or not positive never win; `None`
/// when none is positive.
pub fn pick(weights: &[f64], r: f64) -> Option<usize> {
    let usable = |w: f64| if w.is_finite() && w > 0.0 { w } else { 0.0 };
    let max = weights.iter().map(|w| usable(*w)).fold(0.0, f64::max);
    if max <= 0.0 {
        return None;
    }
    // Scaling by the largest weight keeps the sum finite whatever the inputs.
    let total: f64 = weights.iter().map(|w| usable(*w) / max).sum();
    let r = if r.is_finite() {
        r.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let target = r * total;
    let mut acc = 0.0;
    let mut last = None;
    for (i, w) in weights.iter().enumerate() {
        let w = usable(*w) / max;
        if w <= 0.0 {
            continue;
        }
        acc += w;
        last = Some(i);
        if target < acc {
            return Some(i);
        }
    }
    // Rounding left `target` at the very top: the last positive weight covers it.
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryStore;
    use crate::routing::ewma::BUCKETS;
    use crate::routing::health::{self, Ewma};
    use crate::routing::outcome::{CallResult, CallSample};

    fn backend(cluster: &str, weight: u32) -> Backend {
        Backend {
            cluster: cluster.into(),
            weight,
            model: None,
            authority: None,
            prompt_cache_key: false,
            provider: None,
            speaks: None,
        }
    }

    /// Non-streamed calls of one latency, the last at `at_ms`.
    fn with_latency(ms: f64, at_ms: u64) -> Health {
        let mut calls = None;
        Histogram::observe(&mut calls, ms, at_ms, 10_000.0);
        Health {
            calls,
            ..Health::default()
        }
    }

    /// Shares of the total weight.
    fn shares(w: &[f64]) -> Vec<f64> {
        let total: f64 = w.iter().sum();
        w.iter().map(|x| x / total).collect()
    }

    fn answered(latency_ms: u64, ttft_ms: u64, streamed: bool) -> CallSample {
        CallSample {
            result: CallResult::Status(200),
            latency_ms,
            ttft_ms: Some(ttft_ms),
            streamed,
            output_tokens: None,
        }
    }

    fn finite_in(x: f64, lo: f64, hi: f64) -> bool {
        x.is_finite() && x >= lo && x <= hi
    }

    const ODD: [f64; 9] = [
        0.0,
        -1.0,
        0.5,
        1.0,
        1e-300,
        1e300,
        f64::MAX,
        f64::NAN,
        f64::INFINITY,
    ];

    #[test]
    fn latency_factor_is_relative_and_bounded() {
        assert_eq!(latency_factor(100.0, 100.0, 1.0), 1.0);
        assert!((latency_factor(100.0, 200.0, 1.0) - 0.5).abs() < 1e-12);
        assert!((latency_factor(100.0, 1e9, 1.0) - LATENCY_FLOOR).abs() < 1e-12);
        // Half the confidence: half way back to neutral.
        assert!((latency_factor(100.0, 200.0, 0.5) - 0.75).abs() < 1e-12);
        assert_eq!(latency_factor(100.0, 200.0, 0.0), 1.0);
        // Zero latencies: 1 ms each, no division by zero.
        assert_eq!(latency_factor(0.0, 0.0, 1.0), 1.0);
        assert!((latency_factor(0.0, 4.0, 1.0) - 0.25).abs() < 1e-12);
        for a in ODD {
            for b in ODD {
                for c in ODD {
                    let f = latency_factor(a, b, c);
                    assert!(finite_in(f, LATENCY_FLOOR, 1.0), "{a} {b} {c}: {f}");
                }
            }
        }
    }

    #[test]
    fn error_factor_penalises_and_floors() {
        assert_eq!(error_factor(0.0), 1.0);
        assert!((error_factor(0.1) - 0.6561).abs() < 1e-9);
        assert!((error_factor(0.5) - 0.0625).abs() < 1e-9);
        assert_eq!(error_factor(1.0), ERROR_FLOOR);
        for e in ODD {
            let f = error_factor(e);
            assert!(finite_in(f, ERROR_FLOOR, 1.0), "{e}: {f}");
        }
        assert_eq!(error_factor(f64::NAN), 1.0);
    }

    #[test]
    fn load_factor_from_queue_and_cache() {
        assert_eq!(load_factor(&Load::default()), 1.0);
        let q = |w| {
            load_factor(&Load {
                waiting: Some(w),
                kv_usage: None,
            })
        };
        let kv = |u| {
            load_factor(&Load {
                waiting: None,
                kv_usage: Some(u),
            })
        };
        assert_eq!(q(0.0), 1.0);
        assert!((q(8.0) - 0.5).abs() < 1e-12);
        assert!((q(24.0) - 0.25).abs() < 1e-12);
        assert_eq!(q(1e12), LOAD_FLOOR);
        assert_eq!(kv(0.5), 1.0);
        assert_eq!(kv(0.7), 1.0);
        assert!((kv(0.85) - 0.55).abs() < 1e-9);
        assert!((kv(1.0) - KV_FLOOR).abs() < 1e-9);
        let both = load_factor(&Load {
            waiting: Some(8.0),
            kv_usage: Some(0.85),
        });
        assert!((both - 0.275).abs() < 1e-9);
        for w in ODD {
            for u in ODD {
                let f = load_factor(&Load {
                    waiting: Some(w),
                    kv_usage: Some(u),
                });
                assert!(finite_in(f, LOAD_FLOOR, 1.0), "{w} {u}: {f}");
            }
        }
    }

    #[test]
    fn ramp_factor_rises_linearly() {
        assert_eq!(ramp_factor(0, None, 20_000), 1.0);
        assert_eq!(ramp_factor(10_000, Some(10_000), 20_000), RAMP_START);
        assert!((ramp_factor(20_000, Some(10_000), 20_000) - 0.55).abs() < 1e-12);
        assert_eq!(ramp_factor(30_000, Some(10_000), 20_000), 1.0);
        assert_eq!(ramp_factor(u64::MAX, Some(0), 20_000), 1.0);
        assert_eq!(ramp_factor(5, Some(10), 20_000), RAMP_START);
        assert_eq!(ramp_factor(5, Some(5), 0), 1.0);
    }

    #[test]
    fn unknown_health_is_full_weight() {
        let c = RoutingConfig::default();
        let b = [backend("a", 3), backend("b", 1)];
        let w = effective_weights(&c, &b, &[None, None], 0);
        assert_eq!(
            w,
            Weights {
                values: vec![3.0, 1.0],
                fallback: false
            }
        );
        // A short health slice is the same as unknown.
        assert_eq!(effective_weights(&c, &b, &[], 0).values, vec![3.0, 1.0]);
        assert_eq!(effective_weights(&c, &[], &[], 0).values, Vec::<f64>::new());
        let best = Best {
            calls: Some(5.0),
            streams: Some(5.0),
        };
        assert_eq!(health_factor(&c, &Health::default(), &best, 0), 1.0);
    }

    #[test]
    fn slower_cluster_loses_share() {
        let c = RoutingConfig::default();
        let b = [backend("fast", 1), backend("slow", 1), backend("new", 1)];
        let h = [
            Some(with_latency(100.0, 1_000)),
            Some(with_latency(500.0, 1_000)),
            None,
        ];
        let w = effective_weights(&c, &b, &h, 1_000).values;
        assert_eq!(w[0], 1.0);
        assert!((w[1] - 0.2).abs() < 1e-12);
        assert_eq!(w[2], 1.0);
        // Without fresh samples the difference fades back to neutral.
        let w = effective_weights(&c, &b, &h, 1_000 + 10_000).values;
        assert!((w[1] - 0.6).abs() < 1e-12, "{w:?}");
        // Once stale, a latency sets no bar.
        let h = [
            Some(with_latency(100.0, 0)),
            Some(with_latency(500.0, 100_000)),
        ];
        let w = effective_weights(&c, &b[..2], &h, 100_000).values;
        assert_eq!(w, vec![1.0, 1.0]);
    }

    #[test]
    fn errors_load_and_ramp_multiply() {
        let c = RoutingConfig::default();
        let h = Health {
            errors: Some(Ewma::new(0.5, 100)),
            load: Some(Load {
                waiting: Some(8.0),
                kv_usage: None,
            }),
            load_at_ms: 100,
            recovering_since_ms: Some(100),
            ..Health::default()
        };
        let f = health_factor(&c, &h, &Best::default(), 100 + 10_000);
        // errors: 0.5 seen 10 s (one half-life) ago → 0.25 → 0.75^4; load 0.5; ramp 0.1 + 0.9/2.
        let want = 0.75f64.powi(4) * 0.5 * 0.55;
        assert!((f - want).abs() < 1e-12, "{f} {want}");
        // Load older than 3 intervals + timeout no longer counts.
        let now = 100 + 17_001;
        let f = health_factor(&c, &h, &Best::default(), now);
        let want = error_factor(0.5 * (-1.7001f64).exp2()) * ramp_factor(now, Some(100), 20_000);
        assert!((f - want).abs() < 1e-12, "{f} {want}");
    }

    #[test]
    fn ejected_clusters_weigh_nothing_unless_all_are() {
        let c = RoutingConfig::default();
        let b = [backend("a", 2), backend("b", 5)];
        let out = Health {
            ejected_until_ms: 1_000,
            // A fast-failing ejected cluster must not set the latency bar,
            // nor its calls in flight count.
            in_flight: 50,
            in_flight_at_ms: 999,
            ..with_latency(1.0, 999)
        };
        let w = effective_weights(&c, &b, &[Some(out), Some(with_latency(400.0, 999))], 999);
        assert_eq!(
            w,
            Weights {
                values: vec![0.0, 5.0],
                fallback: false
            }
        );
        let w = effective_weights(&c, &b, &[Some(out), Some(out)], 999);
        assert_eq!(
            w,
            Weights {
                values: vec![2.0, 5.0],
                fallback: true
            }
        );
        // At the end of the ejection it is back, calls in flight and all.
        let w = effective_weights(&c, &b, &[Some(out), Some(out)], 1_000);
        assert!(!w.fallback);
        // 100 calls, 50 on each: a holds 50 - 100 × 2/7 beyond its share.
        let want = 2.0 / (1.0 + (50.0 - 200.0 / 7.0) / (200.0 / 7.0 + 4.0));
        assert!((w.values[0] - want).abs() < 1e-12, "{w:?}");
        assert_eq!(w.values[1], 5.0);
        let back = Health {
            in_flight: 0,
            ..out
        };
        let w = effective_weights(&c, &b, &[Some(back), Some(back)], 1_000);
        assert!(!w.fallback);
        assert_eq!(w.values, vec![2.0, 5.0]);
    }

    #[test]
    fn weights_stay_finite_and_positive_for_extremes() {
        let c = RoutingConfig::default();
        let b = [backend("a", u32::MAX), backend("b", 1)];
        for lat in ODD {
            for err in ODD {
                let h = Health {
                    calls: Some(Histogram {
                        counts: [lat; BUCKETS],
                        sums: [err; BUCKETS],
                        at_ms: u64::MAX,
                    }),
                    streams: Some(Histogram {
                        counts: [err; BUCKETS],
                        sums: [lat; BUCKETS],
                        at_ms: 0,
                    }),
                    in_flight: u32::MAX,
                    in_flight_at_ms: u64::MAX,
                    errors: Some(Ewma::new(err, 0)),
                    load: Some(Load {
                        waiting: Some(lat),
                        kv_usage: Some(err),
                    }),
                    recovering_since_ms: Some(u64::MAX),
                    ..Health::default()
                };
                for now in [0, 1, u64::MAX] {
                    let w =
                        effective_weights(&c, &b, &[Some(h), Some(with_latency(0.0, now))], now);
                    for v in &w.values {
                        assert!(v.is_finite() && *v > 0.0, "{lat} {err} {now}: {w:?}");
                    }
                    assert!(pick(&w.values, 0.5).is_some());
                }
            }
        }
    }

    #[test]
    fn scores_and_in_flight_factor_are_bounded() {
        assert_eq!(latency_score(100.0, 5_000.0), Some(2_550.0));
        assert_eq!(latency_score(300.0, 300.0), Some(300.0));
        assert_eq!(latency_score(f64::NAN, 1.0), None);
        assert_eq!(latency_score(1.0, f64::INFINITY), None);
        assert_eq!(latency_score(-5.0, -5.0), Some(0.0));
        assert_eq!(in_flight_factor(0.0, 0.0), 1.0);
        assert_eq!(in_flight_factor(4.0, 4.0), 1.0);
        assert_eq!(in_flight_factor(2.0, 6.0), 1.0);
        // Eight calls beyond a share of four: the share and the slack again.
        assert!((in_flight_factor(12.0, 4.0) - 0.5).abs() < 1e-12);
        assert!((in_flight_factor(4.0, 0.0) - 0.5).abs() < 1e-12);
        assert_eq!(in_flight_factor(1e9, 1.0), IN_FLIGHT_FLOOR);
        for a in ODD {
            for b in ODD {
                let f = in_flight_factor(a, b);
                assert!(finite_in(f, IN_FLIGHT_FLOOR, 1.0), "{a} {b}: {f}");
                if let Some(s) = latency_score(a, b) {
                    assert!(s.is_finite() && s >= 0.0, "{a} {b}: {s}");
                }
            }
        }
    }

    #[test]
    fn a_heavy_tail_keeps_a_trickle() {
        // Ten seconds of calls, one every 50 ms to each: `tail` answers 9 in
        // 10 in 100 ms and the 10th in 5 s; `steady` always in 300 ms.
        let c = RoutingConfig::default();
        let s = MemoryStore::new();
        let mut now = 0;
        for k in 0..200 {
            now = k * 50;
            let ms = if k % 10 == 9 { 5_000 } else { 100 };
            health::record_outcome(&s, &c, "tail", &answered(ms, ms, false), now).unwrap();
            health::record_outcome(&s, &c, "steady", &answered(300, 300, false), now).unwrap();
        }
        let b = [backend("tail", 1), backend("steady", 1)];
        let h = [health::read(&s, "tail"), health::read(&s, "steady")];
        let w = effective_weights(&c, &b, &h, now).values;
        let share = shares(&w);
        // What the mean alone would give (the former latency factor).
        let tail = h[0].unwrap();
        let mean = tail.latency.unwrap().value;
        let by_mean = latency_factor(300.0, mean, 1.0);
        let calls = tail.calls.unwrap();
        eprintln!(
            "heavy tail: mean {:.0} ms, tail {:.0} ms; weights {w:?}, shares {share:?}; \
             by the mean alone: weight {by_mean:.3}, share {:.3}",
            calls.mean().unwrap(),
            calls.tail_mean(TAIL_SHARE).unwrap(),
            by_mean / (1.0 + by_mean)
        );
        assert_eq!(w[1], 1.0);
        assert!(share[0] < 0.12, "{share:?}");
        assert!(by_mean / (1.0 + by_mean) > 0.3, "{by_mean}");
        // A steady backend three times slower than the typical call still wins:
        // the tail costs more than the typical latency gains.
        assert!(w[0] < 0.15 && w[0] >= LATENCY_FLOOR, "{w:?}");
    }

    #[test]
    fn streams_are_judged_by_their_first_byte_apart_from_calls() {
        let c = RoutingConfig::default();
        let s = MemoryStore::new();
        // Both answer calls in 200 ms and start streams in 50 ms; `long` serves
        // longer answers, whose streams last 8 s rather than 1 s.
        for k in 0..40 {
            let now = k * 100;
            for (cluster, length) in [("long", 8_000), ("short", 1_000)] {
                health::record_outcome(&s, &c, cluster, &answered(200, 200, false), now).unwrap();
                health::record_outcome(&s, &c, cluster, &answered(length, 50, true), now).unwrap();
            }
        }
        let b = [backend("long", 1), backend("short", 1)];
        let read = |s: &MemoryStore| [health::read(s, "long"), health::read(s, "short")];
        let w = effective_weights(&c, &b, &read(&s), 4_000).values;
        assert_eq!(w, vec![1.0, 1.0]);
        // Now `long` starts one stream in ten after 3 s: its stream score falls
        // behind, and so does its weight, though its calls stay as fast.
        for k in 40..80 {
            let now = k * 100;
            let ttft = if k % 10 == 9 { 3_000 } else { 50 };
            health::record_outcome(&s, &c, "long", &answered(8_000, ttft, true), now).unwrap();
            health::record_outcome(&s, &c, "short", &answered(1_000, 50, true), now).unwrap();
        }
        let h = read(&s);
        let w = effective_weights(&c, &b, &h, 8_000).values;
        let long = h[0].unwrap();
        let calls_tail = long.calls.unwrap().tail_mean(TAIL_SHARE).unwrap();
        assert!((calls_tail - 200.0).abs() < 1e-9, "{calls_tail}");
        assert!(long.streams.unwrap().tail_mean(TAIL_SHARE).unwrap() > 1_000.0);
        eprintln!("stream first-byte tail: weights {w:?}");
        assert_eq!(w[1], 1.0);
        assert!(w[0] < 0.2, "{w:?}");
    }

    #[test]
    fn calls_in_flight_beyond_a_share_lower_the_weight() {
        let c = RoutingConfig::default();
        let busy = |n: u32, at_ms: u64| Health {
            in_flight: n,
            in_flight_at_ms: at_ms,
            ..Health::default()
        };
        let b = [backend("a", 1), backend("b", 1)];
        // Ten calls on a, none on b: a holds five beyond its share of five.
        let w = effective_weights(&c, &b, &[Some(busy(10, 0)), Some(busy(0, 0))], 0).values;
        assert!((w[0] - 1.0 / (1.0 + 5.0 / 9.0)).abs() < 1e-12, "{w:?}");
        assert_eq!(w[1], 1.0);
        // Calls in proportion to the base weights cost nothing.
        let b3 = [backend("a", 3), backend("b", 1)];
        let w = effective_weights(&c, &b3, &[Some(busy(6, 0)), Some(busy(2, 0))], 0).values;
        assert_eq!(w, vec![3.0, 1.0]);
        // Nor do calls in proportion to what latency left of the weights: b,
        // four times slower, holds as many calls at a quarter of the rate.
        let timed = |ms: f64, n: u32| Health {
            in_flight: n,
            latency: Some(Ewma::new(ms, 0)),
            ..with_latency(ms, 0)
        };
        let h = [Some(timed(100.0, 4)), Some(timed(400.0, 4))];
        let w = effective_weights(&c, &b, &h, 0).values;
        assert_eq!(w, vec![1.0, 0.25]);
        // Stuck calls on b, twice what its rate and call time explain.
        let h = [Some(timed(100.0, 4)), Some(timed(400.0, 12))];
        let w = effective_weights(&c, &b, &h, 0).values;
        // 16 in flight, 8 of them b's share: 4 beyond it.
        let want = 0.25 / (1.0 + 4.0 / 12.0);
        assert!(w[0] == 1.0 && (w[1] - want).abs() < 1e-12, "{w:?}");
        // A backend without a measured call time counts the others' mean.
        let h = [
            Some(timed(100.0, 4)),
            Some(busy(4, 0)),
            Some(timed(300.0, 0)),
        ];
        let b3 = [backend("a", 1), backend("b", 1), backend("c", 1)];
        let w = effective_weights(&c, &b3, &h, 0).values;
        // Held: 100, 200 and 100 parts of 8 calls; a holds 2 beyond its 2.
        let want = [1.0 / (1.0 + 2.0 / 6.0), 1.0, 1.0 / 3.0];
        assert!(
            w.iter().zip(want).all(|(w, x)| (w - x).abs() < 1e-12),
            "{w:?}"
        );
        // All the calls on one of two: about half, whatever their number.
        let w = effective_weights(&c, &b, &[Some(busy(1_000, 0)), None], 0).values;
        assert!((w[0] - 1.0 / (1.0 + 500.0 / 504.0)).abs() < 1e-12, "{w:?}");
        // All on one of eight: the floor.
        let b8: Vec<Backend> = (0..8).map(|i| backend(&i.to_string(), 1)).collect();
        let mut h = vec![None; 8];
        h[0] = Some(busy(1_000, 0));
        let w = effective_weights(&c, &b8, &h, 0).values;
        assert_eq!(w[..2], [IN_FLIGHT_FLOOR, 1.0]);
        // A count nobody touched for ten minutes is a leak and weighs nothing.
        let w = effective_weights(&c, &b, &[Some(busy(1_000, 0)), None], 600_001).values;
        assert_eq!(w, vec![1.0, 1.0]);
    }

    #[test]
    fn a_stale_tail_fades_to_neutral() {
        let c = RoutingConfig::default();
        let b = [backend("tail", 1), backend("steady", 1)];
        let mut tail = None;
        for k in 0..10 {
            let ms = if k == 9 { 5_000.0 } else { 100.0 };
            Histogram::observe(&mut tail, ms, 0, c.ewma_half_life_ms);
        }
        let tail = Health {
            calls: tail,
            ..Health::default()
        };
        let mut last = 0.0;
        // `steady` keeps being measured, `tail` gets no more calls.
        for (now, c_tail) in [(0, 1.0), (10_000, 0.5), (20_000, 0.25), (29_000, 0.13)] {
            let h = [Some(tail), Some(with_latency(300.0, now))];
            let w = effective_weights(&c, &b, &h, now).values;
            // Mean 590 ms, tail 5 s: a score of 2795 ms.
            let raw = 300.0 / 2_795.0;
            let want = 1.0 - c_tail * (1.0 - raw);
            assert!((w[0] - want).abs() < 0.01, "{now}: {w:?} {want}");
            assert!(w[0] > last, "{now}: {w:?}");
            last = w[0];
        }
        // Past three half-lives it is stale: no longer judged at all.
        let h = [Some(tail), Some(with_latency(300.0, 31_000))];
        assert_eq!(effective_weights(&c, &b, &h, 31_000).values, vec![1.0, 1.0]);
    }

    #[test]
    fn pick_follows_weights() {
        assert_eq!(pick(&[], 0.5), None);
        assert_eq!(pick(&[0.0, 0.0], 0.5), None);
        assert_eq!(pick(&[f64::NAN, -1.0, f64::INFINITY], 0.5), None);
        assert_eq!(pick(&[1.0, 3.0], 0.0), Some(0));
        assert_eq!(pick(&[1.0, 3.0], 0.2499), Some(0));
        assert_eq!(pick(&[1.0, 3.0], 0.25), Some(1));
        assert_eq!(pick(&[1.0, 3.0], 0.999_999_999), Some(1));
        assert_eq!(pick(&[1.0, 3.0, 0.0], 1.0), Some(1));
        assert_eq!(pick(&[0.0, 2.0, f64::NAN], 0.0), Some(1));
        assert_eq!(pick(&[f64::MAX, f64::MAX], 0.75), Some(1));
        assert_eq!(pick(&[1.0, 1.0], f64::NAN), Some(0));
        assert_eq!(pick(&[1.0, 1.0], -3.0), Some(0));
        assert_eq!(pick(&[1.0, 1.0], 7.0), Some(1));
        // Shares over a uniform sweep match the weights.
        let w = [1.0, 2.0, 0.0, 7.0];
        let mut counts = [0usize; 4];
        for k in 0..10_000 {
            counts[pick(&w, k as f64 / 10_000.0).unwrap()] += 1;
        }
        assert_eq!(counts, [1_000, 2_000, 0, 7_000]);
    }

    #[test]
    fn gauge_is_scaled_and_saturating() {
        assert_eq!(gauge_value(0.5), 500);
        assert_eq!(gauge_value(1.0), 1_000);
        assert_eq!(gauge_value(f64::NAN), 0);
        assert_eq!(gauge_value(1e300), i64::MAX);
    }
}
