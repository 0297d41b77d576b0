//! Time-decayed statistics of a cluster's calls: an average, and a histogram
//! that also tells how slow the slowest calls are. Their memory fades with time
//! (a half-life), not with sample count, so idle and busy series age alike.
//! The clock is an argument, never read here.
//!
//! The tail is the mean of the slowest tenth of the samples (an expected
//! shortfall) read off a [`Histogram`]: [`BUCKETS`] fixed buckets doubling from
//! 16 ms (the last one open-ended, past 262 s), each holding the decayed count
//! and the decayed sum of its samples. Walking the buckets from the slowest
//! down until a tenth of the count is covered gives the tail; the sums make it
//! exact whenever each bucket holds one latency (a steady backend, or one that
//! is fast but now and then very slow), so the coarse buckets only blur a bucket
//! that mixes different latencies, and at most by its width. Unlike a quantile,
//! it grows in proportion to the share of slow calls, up to a tenth, rather
//! than jumping from the typical to the slow latency when that share crosses
//! the quantile. Memory is fixed: 32 numbers and a timestamp.

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
        let sample = clamp_sample(sample);
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

/// Buckets of a [`Histogram`].
pub const BUCKETS: usize = 16;
/// `log2` of the upper edge of the first bucket (16 ms); each next bucket is
/// twice as wide.
const FIRST_EDGE_LOG2: u32 = 4;

/// Share of the slowest calls whose mean is a backend's tail latency.
pub const TAIL_SHARE: f64 = 0.1;

/// A time-decayed latency histogram: per bucket, the decayed count and sum of
/// the samples that fell in it. Samples weigh 1 and halve every half-life, like
/// an [`Ewma`]'s; the total count is capped at [`MAX_WEIGHT`], so a new sample
/// always weighs at least 1/257 of the whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Decayed count of the samples per bucket, `>= 0`.
    pub counts: [f64; BUCKETS],
    /// Decayed sum of the samples per bucket, ms, `>= 0`.
    pub sums: [f64; BUCKETS],
    /// When the last sample was taken.
    pub at_ms: u64,
}

/// The bucket of a sample of `ms`: 0 below 16 ms, then one per doubling, the
/// last one open-ended.
fn bucket(ms: f64) -> usize {
    // `as` saturates; the sample is already finite and in range.
    let ms = (ms as u64).max(1);
    let log2 = 63 - ms.leading_zeros();
    (log2.saturating_sub(FIRST_EDGE_LOG2 - 1) as usize).min(BUCKETS - 1)
}

impl Histogram {
    /// Folds `sample` taken at `now_ms` into `slot` (a new histogram when empty).
    pub fn observe(slot: &mut Option<Histogram>, sample: f64, now_ms: u64, half_life_ms: f64) {
        let sample = clamp_sample(sample);
        let mut h = match *slot {
            Some(h) => {
                let d = decay(now_ms.saturating_sub(h.at_ms), half_life_ms);
                h.scaled(d)
            }
            None => Histogram::default(),
        };
        let total = h.total();
        if total > MAX_WEIGHT - 1.0 {
            h = h.scaled((MAX_WEIGHT - 1.0) / total);
        }
        let b = bucket(sample);
        if let Some(c) = h.counts.get_mut(b) {
            *c += 1.0;
        }
        if let Some(s) = h.sums.get_mut(b) {
            *s += sample;
        }
        // Workers' clocks may disagree by a little: time never goes back.
        h.at_ms = h.at_ms.max(now_ms);
        *slot = Some(h);
    }

    /// Every count and sum times `k` (finite, in `[0, 1]`).
    fn scaled(mut self, k: f64) -> Self {
        let k = if k.is_finite() {
            k.clamp(0.0, 1.0)
        } else {
            0.0
        };
        for x in self.counts.iter_mut().chain(self.sums.iter_mut()) {
            *x *= k;
        }
        self
    }

    /// Decayed count of all samples.
    pub fn total(&self) -> f64 {
        self.counts.iter().sum()
    }

    /// Mean of all samples, ms; `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        let total = self.total();
        let sum: f64 = self
            .counts
            .iter()
            .zip(&self.sums)
            .filter(|(c, _)| **c > 0.0)
            .map(|(_, s)| s)
            .sum();
        let m = sum / total;
        (total > 0.0 && m.is_finite()).then(|| m.clamp(0.0, MAX_SAMPLE_MS))
    }

    /// Mean of the slowest `share` (in `(0, 1]`) of the samples, ms; `None`
    /// when empty. The bucket where that share ends counts at its mean.
    pub fn tail_mean(&self, share: f64) -> Option<f64> {
        let share = if share.is_finite() {
            share.clamp(f64::MIN_POSITIVE, 1.0)
        } else {
            1.0
        };
        let want = self.total() * share;
        if !(want.is_finite() && want > 0.0) {
            return None;
        }
        let (mut count, mut sum) = (0.0, 0.0);
        for (c, s) in self.counts.iter().zip(&self.sums).rev() {
            if *c <= 0.0 {
                continue;
            }
            let take = c.min(want - count);
            sum += take * (s / c);
            count += take;
            if count >= want {
                break;
            }
        }
        let m = sum / count;
        (count > 0.0 && m.is_finite()).then(|| m.clamp(0.0, MAX_SAMPLE_MS))
    }

    /// The latency below which `q` (in `(0, 1]`) of the samples fall, ms, as
    /// the mean of the bucket where that share is reached (a bucket spans a
    /// doubling, so this is within a factor of two); `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let q = if q.is_finite() {
            q.clamp(0.0, 1.0)
        } else {
            1.0
        };
        let want = self.total() * q;
        if !(want.is_finite() && self.total() > 0.0) {
            return None;
        }
        let (mut count, mut at) = (0.0, None);
        for (c, s) in self.counts.iter().zip(&self.sums) {
            if *c <= 0.0 {
                continue;
            }
            count += c;
            at = Some(s / c);
            if count >= want {
                break;
            }
        }
        at.filter(|m| m.is_finite())
            .map(|m| m.clamp(0.0, MAX_SAMPLE_MS))
    }

    /// How much the histogram still says at `now_ms`: 1 when fresh, halving
    /// every half-life without samples.
    pub fn confidence(&self, now_ms: u64, half_life_ms: f64) -> f64 {
        decay(now_ms.saturating_sub(self.at_ms), half_life_ms)
    }

    /// A stored histogram made safe: `None` when a count or sum is not a
    /// finite non-negative number (a foreign or corrupt value); the total is
    /// capped at [`MAX_WEIGHT`].
    pub(crate) fn sanitized(self) -> Option<Self> {
        let sound = |x: &f64| x.is_finite() && *x >= 0.0;
        if !(self.counts.iter().all(sound) && self.sums.iter().all(sound)) {
            return None;
        }
        let total = self.total();
        if !total.is_finite() {
            return None;
        }
        Some(if total > MAX_WEIGHT {
            self.scaled(MAX_WEIGHT / total)
        } else {
            self
        })
    }
}

/// A sample made safe: finite, in `[0, MAX_SAMPLE_MS]` (the cap when not finite).
fn clamp_sample(sample: f64) -> f64 {
    if sample.is_finite() {
        sample.clamp(0.0, MAX_SAMPLE_MS)
    } else {
        MAX_SAMPLE_MS
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

    fn histogram(samples: &[(f64, u64)]) -> Histogram {
        let mut h = None;
        for (ms, at) in samples {
            Histogram::observe(&mut h, *ms, *at, 10_000.0);
        }
        h.unwrap()
    }

    #[test]
    fn buckets_double_from_16_ms() {
        for (ms, b) in [
            (0.0, 0),
            (15.9, 0),
            (16.0, 1),
            (31.0, 1),
            (100.0, 3),
            (300.0, 5),
            (5_000.0, 9),
            (262_143.0, 14),
            (262_144.0, 15),
            (MAX_SAMPLE_MS, 15),
        ] {
            assert_eq!(bucket(ms), b, "{ms}");
        }
    }

    #[test]
    fn tail_is_the_mean_of_the_slowest_tenth() {
        // Nine fast calls and one slow one, all at once: the slowest tenth is
        // exactly the slow call, and the mean is the plain mean.
        let mut samples: Vec<(f64, u64)> = (0..9).map(|_| (100.0, 0)).collect();
        samples.push((5_000.0, 0));
        let h = histogram(&samples);
        assert!((h.mean().unwrap() - 590.0).abs() < 1e-9);
        assert!((h.tail_mean(0.1).unwrap() - 5_000.0).abs() < 1e-9);
        // Half the slowest fifth is fast.
        assert!((h.tail_mean(0.2).unwrap() - 2_550.0).abs() < 1e-9);
        assert!((h.tail_mean(1.0).unwrap() - 590.0).abs() < 1e-9);
        // One slow call in fifty: a fifth of the slowest tenth.
        let mut samples: Vec<(f64, u64)> = (0..49).map(|_| (100.0, 0)).collect();
        samples.push((5_000.0, 0));
        let t = histogram(&samples).tail_mean(0.1).unwrap();
        assert!((t - 1_080.0).abs() < 1e-9, "{t}");
        // A steady backend: mean and tail are its latency, whatever the bucket edges.
        let h = histogram(&[(300.0, 0), (300.0, 5), (300.0, 9)]);
        assert_eq!((h.mean(), h.tail_mean(0.1)), (Some(300.0), Some(300.0)));
        assert_eq!(Histogram::default().mean(), None);
        assert_eq!(Histogram::default().tail_mean(0.1), None);
        for share in [0.0, -1.0, f64::NAN, f64::INFINITY, 2.0] {
            let t = histogram(&samples).tail_mean(share).unwrap();
            assert!((100.0..=5_000.0).contains(&t), "{share}: {t}");
        }
    }

    #[test]
    fn histogram_forgets_with_time_and_caps_its_memory() {
        // A slow call a half-life before 1 fast one weighs half as much.
        let h = histogram(&[(5_000.0, 0), (100.0, 10_000)]);
        assert!((h.total() - 1.5).abs() < 1e-12);
        assert!((h.mean().unwrap() - (2_500.0 + 100.0) / 1.5).abs() < 1e-9);
        assert_eq!(h.at_ms, 10_000);
        assert!((h.confidence(20_000, 10_000.0) - 0.5).abs() < 1e-12);
        // A long silence: the past is gone.
        let h = histogram(&[(5_000.0, 0), (100.0, u64::MAX)]);
        assert_eq!(h.tail_mean(0.1), Some(100.0));
        // Dense samples: the total stays at MAX_WEIGHT, so a new sample still
        // weighs 1/256 of the whole.
        let many: Vec<(f64, u64)> = (0..1_000).map(|_| (100.0, 0)).collect();
        let mut h = Some(histogram(&many));
        assert!((h.unwrap().total() - MAX_WEIGHT).abs() < 1e-9);
        Histogram::observe(&mut h, 100.0 + 256.0, 0, 10_000.0);
        assert!((h.unwrap().mean().unwrap() - 101.0).abs() < 1e-9);
        // A clock behind does not move time back.
        Histogram::observe(&mut h, 100.0, 0, 10_000.0);
        let mut late = h;
        Histogram::observe(&mut late, 100.0, 50, 10_000.0);
        Histogram::observe(&mut late, 100.0, 10, 10_000.0);
        assert_eq!(late.unwrap().at_ms, 50);
    }

    #[test]
    fn histogram_survives_bad_samples_and_records() {
        for (sample, half_life) in [
            (f64::NAN, 10.0),
            (f64::INFINITY, 10.0),
            (-5.0, 10.0),
            (1e300, 10.0),
            (5.0, 0.0),
            (5.0, f64::NAN),
            (5.0, -1.0),
        ] {
            let mut h = Some(histogram(&[(10.0, 0)]));
            Histogram::observe(&mut h, sample, 10, half_life);
            let h = h.unwrap();
            for v in [h.mean(), h.tail_mean(0.1)] {
                let v = v.unwrap();
                assert!(
                    v.is_finite() && (0.0..=MAX_SAMPLE_MS).contains(&v),
                    "{sample}: {v}"
                );
            }
        }
        let good = histogram(&[(10.0, 0), (20.0, 0)]);
        assert_eq!(good.sanitized(), Some(good));
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let mut h = good;
            h.counts[3] = bad;
            assert_eq!(h.sanitized(), None, "{bad}");
            let mut h = good;
            h.sums[0] = bad;
            assert_eq!(h.sanitized(), None, "{bad}");
        }
        // An oversized total is scaled back, its means kept.
        let mut h = good;
        h.counts = h.counts.map(|c| c * 1e6);
        h.sums = h.sums.map(|s| s * 1e6);
        let s = h.sanitized().unwrap();
        assert!((s.total() - MAX_WEIGHT).abs() < 1e-6);
        assert!((s.mean().unwrap() - 15.0).abs() < 1e-9);
        // Sums without counts (corrupt) are ignored.
        let mut h = good;
        h.sums[12] = 1e9;
        assert_eq!((h.mean(), h.tail_mean(0.1)), (Some(15.0), Some(20.0)));
    }

    #[test]
    fn quantiles_come_from_the_bucket_that_reaches_them() {
        let mut h = None;
        for i in 0..100 {
            let ms = if i % 10 == 0 { 5_000.0 } else { 150.0 };
            Histogram::observe(&mut h, ms, 0, 10_000.0);
        }
        let h = h.unwrap();
        assert_eq!(h.quantile(0.5), Some(150.0));
        assert_eq!(h.quantile(0.9), Some(150.0));
        assert_eq!(h.quantile(0.95), Some(5_000.0));
        assert_eq!(h.quantile(1.0), Some(5_000.0));
        assert_eq!(h.quantile(f64::NAN), Some(5_000.0));
        assert_eq!(Histogram::default().quantile(0.9), None);
    }
}
