//! Effective weights: a cluster's configured weight scaled by what its health
//! says, so traffic leaves slow, failing or loaded backends within seconds and
//! returns gradually. Every factor is bounded, so the arithmetic never yields
//! NaN, infinity or an all-zero table by accident.
//!
//! For each backend `i` of a model at time `now`:
//!
//! ```text
//! effective_i = base_i × L_i × E_i × Q_i × R_i      (0 while i is ejected)
//!
//! L_i latency  = 1 − c_i × (1 − clamp(max(best, 1) / max(lat_i, 1), 0.05, 1))
//!                lat_i: EWMA latency of i's successful calls; best: the lowest
//!                such latency among the model's clusters that are not ejected
//!                and not stale; c_i = 2^(−age_i / half_life), the confidence
//!                left in i's average, so stale knowledge fades to neutral.
//! E_i errors   = max((1 − c_i × err_i)^4, 0.02)
//!                err_i: EWMA share of failed calls (5xx, 429, reset, timeout).
//! Q_i load     = max(1 / (1 + waiting_i / 8) × kv(usage_i), 0.05)
//!                kv(u) = 1 for u ≤ 0.7, falling linearly to 0.1 at u = 1;
//!                1 when the server exports no load or the reading is older
//!                than 3 probe intervals.
//! R_i ramp     = 0.1 + 0.9 × min(1, (now − recovering_since_i) / ramp)
//!                1 when not recovering from an ejection (or ramp = 0).
//! ```
//!
//! Unknown health (no record, no sample yet) gives each factor 1. If every
//! backend of the model is ejected, the base weights are used: sending to a
//! probably-bad backend beats failing every call locally.

use super::config::{Backend, RoutingConfig};
use super::health::{Ewma, Health, Load};

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
/// Confidence below which a latency average no longer sets the bar for others.
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

/// Latency factor of a cluster whose average is `this_ms`, given the best
/// average `best_ms` of the model and the confidence left in `this_ms`.
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

/// The latency average of `h` that may set the bar, if fresh enough.
fn fresh_latency(h: &Health, now_ms: u64, half_life_ms: f64) -> Option<(f64, f64)> {
    let e: Ewma = h.latency?;
    let c = e.confidence(now_ms, half_life_ms);
    (e.value.is_finite() && c >= STALE_CONFIDENCE).then_some((e.value, c))
}

/// Health factor of one cluster (product of the four factors), in `(0, 1]`.
pub fn health_factor(config: &RoutingConfig, h: &Health, best_ms: Option<f64>, now_ms: u64) -> f64 {
    let half_life = config.ewma_half_life_ms;
    let latency = match (best_ms, fresh_latency(h, now_ms, half_life)) {
        (Some(best), Some((mine, c))) => latency_factor(best, mine, c),
        _ => 1.0,
    };
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
    let best = (0..backends.len())
        .filter(|i| !ejected.get(*i).copied().unwrap_or(false))
        .filter_map(|i| fresh_latency(&health_of(i)?, now_ms, config.ewma_half_life_ms))
        .map(|(v, _)| v)
        .fold(None, |acc: Option<f64>, v| {
            Some(acc.map_or(v, |a| a.min(v)))
        });
    let values = backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if ejected.get(i).copied().unwrap_or(false) {
                return 0.0;
            }
            let factor = health_of(i).map_or(1.0, |h| health_factor(config, &h, best, now_ms));
            let w = f64::from(b.weight) * factor;
            if w.is_finite() {
                w.max(0.0)
            } else {
                0.0
            }
        })
        .collect();
    Weights {
        values,
        fallback: false,
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
    use crate::routing::health::Ewma;

    fn backend(cluster: &str, weight: u32) -> Backend {
        Backend {
            cluster: cluster.into(),
            weight,
            model: None,
            authority: None,
        }
    }

    fn with_latency(ms: f64, at_ms: u64) -> Health {
        Health {
            latency: Some(Ewma::new(ms, at_ms)),
            ..Health::default()
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
        assert_eq!(health_factor(&c, &Health::default(), Some(5.0), 0), 1.0);
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
        let f = health_factor(&c, &h, None, 100 + 10_000);
        // errors: 0.5 seen 10 s (one half-life) ago → 0.25 → 0.75^4; load 0.5; ramp 0.1 + 0.9/2.
        let want = 0.75f64.powi(4) * 0.5 * 0.55;
        assert!((f - want).abs() < 1e-12, "{f} {want}");
        // Load older than 3 intervals + timeout no longer counts.
        let now = 100 + 17_001;
        let f = health_factor(&c, &h, None, now);
        let want = error_factor(0.5 * (-1.7001f64).exp2()) * ramp_factor(now, Some(100), 20_000);
        assert!((f - want).abs() < 1e-12, "{f} {want}");
    }

    #[test]
    fn ejected_clusters_weigh_nothing_unless_all_are() {
        let c = RoutingConfig::default();
        let b = [backend("a", 2), backend("b", 5)];
        let out = Health {
            ejected_until_ms: 1_000,
            // A fast-failing ejected cluster must not set the latency bar.
            latency: Some(Ewma::new(1.0, 999)),
            ..Health::default()
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
        // At the end of the ejection it is back.
        let w = effective_weights(&c, &b, &[Some(out), Some(out)], 1_000);
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
                    latency: Some(Ewma::new(lat, u64::MAX)),
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
