//! Each model's ratio of the prompt tokens its provider reports to the
//! filter's estimate of the same prompt, learnt from every answered call
//! whose prompt was estimated: the estimate's weights are a compromise
//! between tokenizers, and the ratio makes it the model's own.
//!
//! ```text
//! sample = reported_prompt_tokens / estimate       (a call of ≥ MIN_SAMPLE_TOKENS)
//! ratio  ← ratio + (sample − ratio) × ALPHA        (first sample: ratio = sample)
//! both clamped to [MIN, MAX]
//! ```
//!
//! One record in shared data holds every model's ratio, so a call reads its
//! model's ratio with one get, and learns with one compare-and-swap update.
//! The models the configuration names always keep theirs; of the others at
//! most [`MAX_MODELS`] are kept, the least recently learnt of them making
//! room, so a client naming models of its own never pushes out the ratio of
//! one the configuration routes or limits.

use serde::{Deserialize, Serialize};

use crate::config::Names;
use crate::host::cas::{self, Change, Unguarded};
use crate::host::{codec, Metrics, SharedStore};
use crate::metrics as names;

/// The shared-data key of the record.
pub const KEY: &str = crate::keyspace::CALIBRATION.key;
/// Most models the configuration does not name whose ratio is kept.
pub const MAX_MODELS: usize = 64;
/// Weight of a new sample, in thousandths: a ratio moves most of the way to
/// a new steady value within about ten calls.
pub const ALPHA_MILLI: u64 = 200;
/// Smallest estimate learnt from: below it the provider's framing of the
/// messages (a few tokens each) outweighs the text.
pub const MIN_SAMPLE_TOKENS: u64 = 32;

/// A ratio of real tokens to estimated ones, in thousandths, within
/// [`Ratio::MIN`] and [`Ratio::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Ratio(u32);

impl Ratio {
    /// No correction: what a model has until it is learnt.
    pub const ONE: Ratio = Ratio(1000);
    /// The lowest ratio: the estimate is at most twice the real count.
    pub const MIN: Ratio = Ratio(500);
    /// The highest ratio: the estimate is at least half the real count.
    pub const MAX: Ratio = Ratio(2000);

    /// A ratio of `milli` thousandths, clamped to the bounds.
    pub fn from_milli(milli: u64) -> Ratio {
        let m = milli.clamp(u64::from(Self::MIN.0), u64::from(Self::MAX.0));
        Ratio(u32::try_from(m).unwrap_or(Self::ONE.0))
    }

    /// The ratio in thousandths.
    pub fn milli(self) -> u32 {
        self.0
    }

    /// The ratio as a number, for tests and logs.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    /// `tokens` of the estimate as the model counts them, rounded up.
    pub fn apply(self, tokens: u64) -> u64 {
        let m = u128::from(self.0);
        let t = (u128::from(tokens) * m).div_ceil(1000);
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// The most estimated tokens that stay within `cap` once calibrated: a
    /// cap on calibrated tokens as a cap on the estimate.
    pub fn uncalibrated(self, cap: u64) -> u64 {
        let t = u128::from(cap) * 1000 / u128::from(self.0.max(1));
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// The ratio one call shows, clamped; `None` when the call is too small
    /// to say (see [`MIN_SAMPLE_TOKENS`]) or reported nothing.
    pub fn sample(estimated: u64, reported: u64) -> Option<Ratio> {
        if estimated < MIN_SAMPLE_TOKENS || reported == 0 {
            return None;
        }
        let milli = u128::from(reported) * 1000 / u128::from(estimated);
        Some(Self::from_milli(u64::try_from(milli).unwrap_or(u64::MAX)))
    }

    /// This ratio moved toward `sample` by [`ALPHA_MILLI`].
    fn moved_toward(self, sample: Ratio) -> Ratio {
        let (old, new) = (i64::from(self.0), i64::from(sample.0));
        let alpha = ALPHA_MILLI as i64;
        let moved = old + ((new - old) * alpha) / 1000;
        Self::from_milli(u64::try_from(moved).unwrap_or(0))
    }
}

impl Default for Ratio {
    fn default() -> Self {
        Self::ONE
    }
}

/// One model's learnt ratio.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    model: String,
    ratio: Ratio,
    samples: u32,
    learnt_ms: u64,
}

/// The record: every model's ratio.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    models: Vec<Entry>,
}

/// Most entries of the record under `config_names`.
fn bound(config_names: &Names) -> usize {
    MAX_MODELS.saturating_add(config_names.models().len())
}

fn decode(bytes: Option<&[u8]>, bound: usize) -> Record {
    let mut r: Record = bytes.and_then(codec::decode).unwrap_or_default();
    // A record written by anyone else is trusted no further than its bounds.
    r.models.truncate(bound);
    for e in &mut r.models {
        e.ratio = Ratio::from_milli(u64::from(e.ratio.0));
    }
    r
}

/// The ratio of `model` (a model label, bounded as the metrics' are): one
/// read of shared data; [`Ratio::ONE`] for a model not learnt yet or a store
/// that cannot be read.
pub fn ratio(store: &dyn SharedStore, config_names: &Names, model: &str) -> Ratio {
    let Ok(read) = store.get(KEY) else {
        return Ratio::ONE;
    };
    decode(read.value.as_deref(), bound(config_names))
        .models
        .iter()
        .find(|e| e.model == model)
        .map_or(Ratio::ONE, |e| e.ratio)
}

/// Learns from one answered call of `model` whose prompt was estimated at
/// `estimated` tokens and reported at `reported`, and sets the model's
/// gauge. Returns the model's new ratio; `None` when the call says nothing
/// (see [`Ratio::sample`]) or the update was lost to other workers.
pub fn learn(
    store: &dyn SharedStore,
    metrics: &mut dyn Metrics,
    config_names: &Names,
    model: &str,
    estimated: u64,
    reported: u64,
    now_ms: u64,
) -> Option<Ratio> {
    let sample = Ratio::sample(estimated, reported)?;
    let updated = cas::update(
        store,
        KEY,
        Unguarded::Overwrite,
        |b| decode(b, bound(config_names)),
        codec::encode,
        |r| Change::Write(learn_into(r, config_names, model, sample, now_ms)),
    );
    let ratio = updated.ok()?.out;
    metrics.gauge_with(
        names::TOKEN_ESTIMATE_RATIO,
        &[("model", model)],
        i64::from(ratio.milli()),
    );
    Some(ratio)
}

/// The record with `sample` learnt for `model`; the model's new ratio. A
/// model the configuration names is always added; another one takes the
/// place of the least recently learnt of the others once they are
/// [`MAX_MODELS`].
fn learn_into(
    r: &mut Record,
    config_names: &Names,
    model: &str,
    sample: Ratio,
    now_ms: u64,
) -> Ratio {
    if let Some(e) = r.models.iter_mut().find(|e| e.model == model) {
        e.ratio = e.ratio.moved_toward(sample);
        e.samples = e.samples.saturating_add(1);
        e.learnt_ms = now_ms;
        return e.ratio;
    }
    let entry = Entry {
        model: model.to_string(),
        ratio: sample,
        samples: 1,
        learnt_ms: now_ms,
    };
    let other = |e: &&mut Entry| !config_names.has_model(&e.model);
    let others = r.models.iter_mut().filter(other).count();
    if config_names.has_model(model) || others < MAX_MODELS {
        r.models.push(entry);
    } else if let Some(oldest) = r
        .models
        .iter_mut()
        .filter(other)
        .min_by_key(|e| e.learnt_ms)
    {
        *oldest = entry;
    }
    sample
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{MemoryMetrics, MemoryStore};

    #[test]
    fn ratios_apply_and_invert() {
        let r = Ratio::from_milli(1500);
        assert_eq!(r.apply(100), 150);
        assert_eq!(r.apply(1), 2);
        assert_eq!(r.uncalibrated(150), 100);
        assert_eq!(Ratio::ONE.apply(7), 7);
        assert_eq!(Ratio::ONE.uncalibrated(7), 7);
        assert_eq!(Ratio::MAX.apply(u64::MAX), u64::MAX);
        assert_eq!(Ratio::MIN.uncalibrated(u64::MAX), u64::MAX);
        assert_eq!(Ratio::from_milli(0), Ratio::MIN);
        assert_eq!(Ratio::from_milli(u64::MAX), Ratio::MAX);
    }

    #[test]
    fn samples_need_a_prompt_worth_measuring() {
        assert_eq!(Ratio::sample(31, 100), None);
        assert_eq!(Ratio::sample(100, 0), None);
        assert_eq!(Ratio::sample(100, 150), Some(Ratio::from_milli(1500)));
        assert_eq!(Ratio::sample(100, 10_000), Some(Ratio::MAX));
        assert_eq!(Ratio::sample(u64::MAX, 1), Some(Ratio::MIN));
    }

    #[test]
    fn a_model_learns_its_ratio_and_the_gauge_says_it() {
        let (s, none) = (MemoryStore::new(), Names::default());
        let mut m = MemoryMetrics::default();
        assert_eq!(ratio(&s, &none, "m"), Ratio::ONE);
        assert_eq!(learn(&s, &mut m, &none, "m", 100, 300, 1), Some(Ratio::MAX));
        assert_eq!(ratio(&s, &none, "m"), Ratio::MAX);
        // Then it moves a fifth of the way to each new sample.
        assert_eq!(
            learn(&s, &mut m, &none, "m", 100, 100, 2),
            Some(Ratio::from_milli(1800))
        );
        let gauge = names::name(names::TOKEN_ESTIMATE_RATIO, &[("model", "m")]);
        assert_eq!(m.gauges.get(&gauge), Some(&1800));
        let mut r = Ratio::from_milli(1800);
        for _ in 0..30 {
            r = learn(&s, &mut m, &none, "m", 100, 100, 3).unwrap();
        }
        assert!(r.milli() <= 1010, "{r:?}");
        // Other models keep their own; a small call teaches nothing.
        assert_eq!(ratio(&s, &none, "other"), Ratio::ONE);
        assert_eq!(learn(&s, &mut m, &none, "small", 10, 100, 4), None);
        assert_eq!(ratio(&s, &none, "small"), Ratio::ONE);
        assert_eq!(s.reads(KEY), 36);
    }

    #[test]
    fn the_record_is_bounded() {
        let (s, none) = (MemoryStore::new(), Names::default());
        let mut m = MemoryMetrics::default();
        for i in 0..MAX_MODELS as u64 + 10 {
            learn(&s, &mut m, &none, &format!("m{i}"), 100, 150, i).unwrap();
        }
        let r = decode(s.get(KEY).unwrap().value.as_deref(), usize::MAX);
        assert_eq!(r.models.len(), MAX_MODELS);
        // The least recently learnt made room.
        assert_eq!(ratio(&s, &none, "m0"), Ratio::ONE);
        assert_eq!(ratio(&s, &none, "m73"), Ratio::from_milli(1500));
        assert!(s.value_bytes() < 4096, "{}", s.value_bytes());
    }

    #[test]
    fn a_foreign_record_is_bounded_on_read() {
        let (s, none) = (MemoryStore::new(), Names::default());
        let r = Record {
            models: (0..MAX_MODELS + 5)
                .map(|i| Entry {
                    model: format!("m{i}"),
                    ratio: Ratio(u32::MAX),
                    samples: 1,
                    learnt_ms: 0,
                })
                .collect(),
        };
        s.set(KEY, &codec::encode(&r).unwrap(), None).unwrap();
        assert_eq!(ratio(&s, &none, "m0"), Ratio::MAX);
        assert_eq!(
            ratio(&s, &none, &format!("m{}", MAX_MODELS + 1)),
            Ratio::ONE
        );
        s.set(KEY, b"garbage", None).unwrap();
        assert_eq!(ratio(&s, &none, "m0"), Ratio::ONE);
        let mut m = MemoryMetrics::default();
        assert_eq!(
            learn(&s, &mut m, &none, "m0", 100, 80, 1),
            Some(Ratio::from_milli(800))
        );
    }

    /// The models routing names (the `routing` feature).
    #[cfg(feature = "routing")]
    #[test]
    fn models_of_the_configuration_are_never_pushed_out() {
        let c = crate::config::Config::parse(
            br#"{"routing":{"models":{"routed":[{"cluster":"a","model":"routed-v2"}]}}}"#,
        )
        .unwrap();
        let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        learn(&s, &mut m, &c.names, "routed", 100, 150, 0).unwrap();
        // Then far more models of a client's own, each learnt later.
        for i in 0..MAX_MODELS as u64 * 3 {
            learn(
                &s,
                &mut m,
                &c.names,
                &format!("made-up-{i}"),
                100,
                120,
                1 + i,
            )
            .unwrap();
        }
        assert_eq!(ratio(&s, &c.names, "routed"), Ratio::from_milli(1500));
        // The others took each other's places, least recently learnt first.
        let r = decode(s.get(KEY).unwrap().value.as_deref(), usize::MAX);
        assert_eq!(r.models.len(), MAX_MODELS + 1);
        assert_eq!(ratio(&s, &c.names, "made-up-0"), Ratio::ONE);
        let last = format!("made-up-{}", MAX_MODELS * 3 - 1);
        assert_eq!(ratio(&s, &c.names, &last), Ratio::from_milli(1200));
        // A configured model learnt last still finds its place.
        learn(&s, &mut m, &c.names, "routed-v2", 100, 80, 1_000).unwrap();
        assert_eq!(ratio(&s, &c.names, "routed-v2"), Ratio::from_milli(800));
        assert_eq!(ratio(&s, &c.names, "routed"), Ratio::from_milli(1500));
        // Read back, the bound counts the configuration's models too.
        assert_eq!(ratio(&s, &Names::default(), "routed-v2"), Ratio::ONE);
    }
}
