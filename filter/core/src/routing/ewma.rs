//! A time-decayed average: its memory fades with time (a half-life), not with
//! sample count, so idle and busy series age alike. The clock is an argument,
//! never read here.

use serde::{Deserialize, Serialize};

/// Largest weight of the past in an average: a new sample always moves it by
/// at least 1/256, however dense the samples (same-millisecond samples from
/// several workers included).
pub const MAX_WEIGHT: f64 = 256.0;
/// Samples above this (one hour) are clamped: they can only be clock trouble.
pub(crate) const MAX_SAMPLE_MS: f64 = 3_600_000.0;

/// An exponentially weighted moving average whose memory fades with time
/// (half-life), not with sample count, so idle and busy clusters age alike.
///
/// Each sample weighs 1, halving every half-life; `weight` is what the samples
/// behind the average still weigh, capped at [`MAX_WEIGHT`]. A new sample moves
/// the average by `1 / (weight × decay + 1)`. With samples at a steady pace
/// that is the classic time-based `1 − decay`; right after the first sample
/// (or a long silence) it is a running mean, so one outlier (a cold
/// connection's handshake, a single failure) weighs 1/n rather than holding
/// the average for a half-life.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ewma {
    /// Current average.
    pub value: f64,
    /// When the last sample was taken.
    pub at_ms: u64,
    /// Decayed count of the samples behind `value`, in `[1, MAX_WEIGHT]`.
    pub weight: f64,
}

impl Ewma {
    /// An average of one sample.
    pub fn new(value: f64, at_ms: u64) -> Self {
        Self {
            value,
            at_ms,
            weight: 1.0,
        }
    }

    /// Folds `sample` taken at `now_ms` into `slot` (the first sample is taken as is).
    pub fn observe(slot: &mut Option<Ewma>, sample: f64, now_ms: u64, half_life_ms: f64) {
        let sample = if sample.is_finite() {
            sample.clamp(0.0, MAX_SAMPLE_MS)
        } else {
            MAX_SAMPLE_MS
        };
        *slot = Some(match *slot {
            Some(e) if e.value.is_finite() => {
                let past =
                    unit_weight(e.weight) * decay(now_ms.saturating_sub(e.at_ms), half_life_ms);
                let weight = (past + 1.0).min(MAX_WEIGHT);
                Ewma {
                    value: e.value + (sample - e.value) / weight,
                    // Workers' clocks may disagree by a little: time never goes back.
                    at_ms: e.at_ms.max(now_ms),
                    weight,
                }
            }
            _ => Ewma::new(sample, now_ms),
        });
    }

    /// How much the average still says at `now_ms`: 1 when fresh, halving
    /// every half-life without samples.
    pub fn confidence(&self, now_ms: u64, half_life_ms: f64) -> f64 {
        decay(now_ms.saturating_sub(self.at_ms), half_life_ms)
    }
}

/// A stored weight made safe: finite, in `[1, MAX_WEIGHT]` (1 for garbage).
pub(crate) fn unit_weight(w: f64) -> f64 {
    if w.is_finite() {
        w.clamp(1.0, MAX_WEIGHT)
    } else {
        1.0
    }
}

/// Weight left to knowledge `age_ms` old: `2^(-age / half_life)`, in `[0, 1]`.
fn decay(age_ms: u64, half_life_ms: f64) -> f64 {
    if !(half_life_ms.is_finite() && half_life_ms > 0.0) {
        return 0.0;
    }
    let w = (-(age_ms as f64) / half_life_ms).exp2();
    if w.is_finite() {
        w.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ewma_decays_with_time() {
        let mut e = None;
        Ewma::observe(&mut e, 100.0, 1_000, 10_000.0);
        assert_eq!(e.unwrap(), Ewma::new(100.0, 1_000));
        // One half-life later the first sample weighs half the new one.
        Ewma::observe(&mut e, 400.0, 11_000, 10_000.0);
        assert!((e.unwrap().value - 300.0).abs() < 1e-9);
        assert!((e.unwrap().weight - 1.5).abs() < 1e-12);
        // Samples one half-life apart settle at the time-based 1 − decay.
        for t in 2..40 {
            Ewma::observe(&mut e, 0.0, 1_000 + t * 10_000, 10_000.0);
        }
        assert!((e.unwrap().weight - 2.0).abs() < 1e-6);
        // A sample from a worker whose clock is behind does not move time back.
        Ewma::observe(&mut e, 200.0, 5_000, 10_000.0);
        assert_eq!(e.unwrap().at_ms, 391_000);
        assert!(e.unwrap().value.is_finite());
        // Long silence: the next sample takes over.
        Ewma::observe(&mut e, 50.0, u64::MAX, 10_000.0);
        assert_eq!(e.unwrap().value, 50.0);
        assert_eq!(e.unwrap().weight, 1.0);
    }

    #[test]
    fn ewma_dilutes_a_first_outlier_and_caps_its_memory() {
        // A cold first call, then steady ones in the same second: a running mean.
        let mut e = None;
        Ewma::observe(&mut e, 150.0, 0, 10_000.0);
        for i in 1..10 {
            Ewma::observe(&mut e, 25.0, i, 10_000.0);
        }
        let v = e.unwrap().value;
        assert!((v - 37.5).abs() < 0.1, "{v}");
        // Dense samples: the past never weighs more than MAX_WEIGHT, so a
        // lasting change still moves the average by at least 1/256 a sample.
        for _ in 0..10_000 {
            Ewma::observe(&mut e, 25.0, 10, 10_000.0);
        }
        assert_eq!(e.unwrap().weight, MAX_WEIGHT);
        let before = e.unwrap().value;
        Ewma::observe(&mut e, 25.0 + 256.0, 10, 10_000.0);
        assert!((e.unwrap().value - before - 1.0).abs() < 1e-9);
        // A stored weight that is garbage counts as one sample.
        for w in [f64::NAN, f64::INFINITY, -3.0, 0.0] {
            let mut e = Some(Ewma {
                value: 10.0,
                at_ms: 0,
                weight: w,
            });
            Ewma::observe(&mut e, 20.0, 0, 10_000.0);
            assert_eq!(e.unwrap().value, 15.0, "{w}");
        }
    }

    #[test]
    fn ewma_survives_bad_samples_and_half_lives() {
        for (sample, half_life) in [
            (f64::NAN, 10.0),
            (f64::INFINITY, 10.0),
            (-5.0, 10.0),
            (1e300, 10.0),
            (5.0, 0.0),
            (5.0, f64::NAN),
            (5.0, -1.0),
        ] {
            let mut e = Some(Ewma::new(10.0, 0));
            Ewma::observe(&mut e, sample, 10, half_life);
            let v = e.unwrap().value;
            assert!(
                v.is_finite() && (0.0..=MAX_SAMPLE_MS).contains(&v),
                "{sample} {half_life}: {v}"
            );
            let c = e.unwrap().confidence(20, half_life);
            assert!((0.0..=1.0).contains(&c));
        }
        let e = Ewma::new(1.0, 100);
        assert_eq!(e.confidence(100, 1_000.0), 1.0);
        assert!((e.confidence(1_100, 1_000.0) - 0.5).abs() < 1e-12);
        assert_eq!(e.confidence(50, 1_000.0), 1.0);
        assert_eq!(e.confidence(u64::MAX, 1_000.0), 0.0);
    }
}
