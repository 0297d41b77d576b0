//! Prometheus's answer to an instant query (`GET /api/v1/query`): a vector
//! of samples, one per model, read into bounded, checked values.
//!
//! Nothing in the answer is trusted: a value that is not a finite number
//! from 0 to [`MAX_VALUE`] is dropped (NaN, ±Inf, negative, absurd), so is a
//! sample without the model label. Every model the configuration names is
//! kept, and at most [`MAX_MODELS`] others, the most loaded first, since
//! those are the ones a threshold may trip: models a client made up, however
//! loaded, never push out one the configuration watches.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{
    DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

use crate::config::Names;
use crate::json::bounded::{self, Raw, Text};
use crate::stat_name;

/// Most models one reading keeps besides those the configuration names.
pub const MAX_MODELS: usize = 64;
/// Largest value believed: more calls, tokens per second or calls in flight
/// than any mesh makes is a broken query or exporter.
pub const MAX_VALUE: f64 = 1e9;
/// Most samples one answer may carry; a larger one is refused whole, on the
/// first sample past the bound.
pub const MAX_SAMPLES: usize = 10_000;
/// Longest model label read; a sample of a longer one is dropped (its stat
/// label keeps the first [`stat_name::MAX_VALUE_LEN`] characters anyway).
pub const MAX_MODEL_LEN: usize = 4 * stat_name::MAX_VALUE_LEN;
/// Longest `status`, `resultType` or sample value read.
const MAX_WORD_LEN: usize = 64;

/// Model label → value.
type Values = Vec<(String, f64)>;

/// A query's reading: each model (as its stat label writes it) and its value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// Model label → value: the configuration's models, then at most
    /// [`MAX_MODELS`] others, each part largest first.
    pub values: Vec<(String, f64)>,
    /// Samples dropped: no model label, or a value not believed.
    pub dropped: u32,
}

/// Reads an answer; the error says why it is not one. Read as it comes: only
/// each model's sum is kept, so what reading takes is bounded by
/// [`MAX_SAMPLES`], not by what the answer is made of.
pub fn parse(body: &[u8], model_label: &str, config_names: &Names) -> Result<Reading, String> {
    let answer = bounded::read(body, Answer { model_label })
        .map_err(|e| format!("not a Prometheus answer: {e}"))?;
    let status = answer.status.as_ref().and_then(Text::short);
    if status != Some("success") {
        return Err(format!("status {status:?}"));
    }
    let data = answer.data.ok_or("no data")?;
    let kind = data.kind.as_ref().and_then(Text::short);
    if kind != Some("vector") {
        return Err(format!("result type {kind:?}, expected \"vector\""));
    }
    let mut reading = data.samples.ok_or("no result list")?;
    let (mut known, mut others): (Values, Values) = std::mem::take(&mut reading.sums)
        .into_iter()
        .partition(|(m, _)| config_names.has_model_label(m));
    for part in [&mut known, &mut others] {
        part.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    }
    let mut dropped = reading.dropped;
    if others.len() > MAX_MODELS {
        let beyond = others.len() - MAX_MODELS;
        dropped = dropped.saturating_add(u32::try_from(beyond).unwrap_or(u32::MAX));
        others.truncate(MAX_MODELS);
    }
    known.append(&mut others);
    Ok(Reading {
        values: known,
        dropped,
    })
}

/// An answer as read.
struct Read<'de> {
    status: Option<Text<'de>>,
    data: Option<Data<'de>>,
}

/// Its `data` as read.
struct Data<'de> {
    kind: Option<Text<'de>>,
    samples: Option<Samples>,
}

/// Its samples, summed per model as they come.
#[derive(Default)]
struct Samples {
    sums: BTreeMap<String, f64>,
    dropped: u32,
}

/// Reads an answer, `data` and its samples with `model_label`.
#[derive(Clone, Copy)]
struct Answer<'a> {
    model_label: &'a str,
}

impl<'de> DeserializeSeed<'de> for Answer<'_> {
    type Value = Read<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Answer<'_> {
    type Value = Read<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Prometheus answer object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let mut read = Read {
            status: None,
            data: None,
        };
        bounded::each_member(map, &["status", "data"], |name, map| {
            if name == "status" {
                read.status = Some(Text::of(map.next_value_seed(Raw)?, MAX_WORD_LEN));
            } else {
                read.data = Some(map.next_value_seed(DataSeed(self))?);
            }
            Ok(())
        })?;
        Ok(read)
    }
}

/// Reads `data`: the result type, and the result when it is a vector
/// (Prometheus writes the type first; a result of another type is read past).
#[derive(Clone, Copy)]
struct DataSeed<'a>(Answer<'a>);

impl<'de> DeserializeSeed<'de> for DataSeed<'_> {
    type Value = Data<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DataSeed<'_> {
    type Value = Data<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a data object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let mut data = Data {
            kind: None,
            samples: None,
        };
        bounded::each_member(map, &["resultType", "result"], |name, map| {
            if name == "resultType" {
                data.kind = Some(Text::of(map.next_value_seed(Raw)?, MAX_WORD_LEN));
            } else if data
                .kind
                .as_ref()
                .is_none_or(|k| k.short() == Some("vector"))
            {
                data.samples = Some(map.next_value_seed(VectorSeed(self.0))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        })?;
        Ok(data)
    }
}

/// Reads a vector: at most [`MAX_SAMPLES`] samples, each summed into its
/// model's value as it comes.
#[derive(Clone, Copy)]
struct VectorSeed<'a>(Answer<'a>);

impl<'de> DeserializeSeed<'de> for VectorSeed<'_> {
    type Value = Samples;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Samples, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for VectorSeed<'_> {
    type Value = Samples;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of samples")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Samples, A::Error> {
        let mut samples = Samples::default();
        bounded::each_item(
            seq,
            MAX_SAMPLES,
            "samples",
            SampleSeed(self.0),
            |(model, value)| {
                let (Some(model), Some(value)) = (model, value.filter(|v| believed(*v))) else {
                    samples.dropped = samples.dropped.saturating_add(1);
                    return Ok(());
                };
                // Two samples of one model (labels beyond it): their sum.
                let slot = samples.sums.entry(model).or_default();
                *slot = (*slot + value).min(MAX_VALUE);
                Ok(())
            },
        )?;
        Ok(samples)
    }
}

/// Reads one sample, `{"metric": {labels}, "value": [unix time, "value"]}`:
/// its model (as its stat label writes it) and its value, each `None` when
/// it has none that can be read.
#[derive(Clone, Copy)]
struct SampleSeed<'a>(Answer<'a>);

impl<'de> DeserializeSeed<'de> for SampleSeed<'_> {
    type Value = (Option<String>, Option<f64>);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SampleSeed<'_> {
    type Value = (Option<String>, Option<f64>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sample object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let (mut model, mut value) = (None, None);
        bounded::each_member(map, &["metric", "value"], |name, map| {
            if name == "metric" {
                model = map.next_value_seed(MetricSeed(self.0))?;
            } else {
                value = Some(map.next_value_seed(PairSeed)?);
            }
            Ok(())
        })?;
        let value =
            value.ok_or_else(|| A::Error::custom("a sample without a [time, \"value\"] pair"))?;
        Ok((model, value))
    }
}

/// Reads a sample's labels: the model label's value, as its stat label
/// writes it; the others are read past.
#[derive(Clone, Copy)]
struct MetricSeed<'a>(Answer<'a>);

impl<'de> DeserializeSeed<'de> for MetricSeed<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetricSeed<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of labels")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let label = self.0.model_label;
        let mut model = None;
        while let Some(key) = map.next_key_seed(Raw)? {
            let raw = map.next_value_seed(Raw)?;
            if Text::of(key, label.len()).short() == Some(label) {
                model = Text::of(raw, MAX_MODEL_LEN)
                    .short()
                    .map(stat_name::label_value);
            }
        }
        Ok(model)
    }
}

/// Reads a sample's `[unix time, "value"]`: the value, `None` when it is not
/// a number.
#[derive(Clone, Copy)]
struct PairSeed;

impl<'de> DeserializeSeed<'de> for PairSeed {
    type Value = Option<f64>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for PairSeed {
    type Value = Option<f64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a [time, \"value\"] pair")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let time = seq.next_element_seed(Raw)?;
        let value = seq.next_element_seed(Raw)?;
        let beyond = seq.next_element_seed(Raw)?;
        match (time, value, beyond) {
            (Some(t), Some(v), None) if bounded::is_number(t) => match Text::of(v, MAX_WORD_LEN) {
                Text::Short(v) => Ok(v.parse::<f64>().ok()),
                Text::Long => Ok(None),
                Text::Other => Err(A::Error::custom("a sample value that is not a string")),
            },
            _ => Err(A::Error::invalid_length(0, &self)),
        }
    }
}

/// A value a mesh can have.
fn believed(v: f64) -> bool {
    v.is_finite() && (0.0..=MAX_VALUE).contains(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(samples: &str) -> Vec<u8> {
        format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{samples}]}}}}"#)
            .into_bytes()
    }

    fn sample(model: &str, value: &str) -> String {
        format!(r#"{{"metric":{{"model":"{model}"}},"value":[1764600000.5,"{value}"]}}"#)
    }

    #[test]
    fn reads_one_value_per_model_largest_first() {
        let body = answer(
            &[
                sample("gpt-4o", "2.5"),
                sample("llama 3", "7"),
                sample("gpt-4o", "0.5"),
            ]
            .join(","),
        );
        let r = parse(&body, "model", &Names::default()).unwrap();
        assert_eq!(
            r.values,
            [("llama_3".to_string(), 7.0), ("gpt-4o".to_string(), 3.0)]
        );
        assert_eq!(r.dropped, 0);
        assert_eq!(
            parse(&answer(""), "model", &Names::default()).unwrap(),
            Reading::default()
        );
    }

    #[test]
    fn values_no_mesh_has_are_dropped() {
        let body = answer(
            &[
                sample("a", "NaN"),
                sample("b", "+Inf"),
                sample("c", "-1"),
                sample("d", "1e12"),
                sample("e", "x"),
                r#"{"metric":{},"value":[0,"1"]}"#.to_string(),
                sample("ok", "1"),
            ]
            .join(","),
        );
        let r = parse(&body, "model", &Names::default()).unwrap();
        assert_eq!(r.values, [("ok".to_string(), 1.0)]);
        assert_eq!(r.dropped, 6);
    }

    #[test]
    fn the_models_are_bounded() {
        let many: Vec<String> = (0..MAX_MODELS + 5)
            .map(|i| sample(&format!("m{i}"), &i.to_string()))
            .collect();
        let r = parse(&answer(&many.join(",")), "model", &Names::default()).unwrap();
        assert_eq!(r.values.len(), MAX_MODELS);
        assert_eq!(r.values[0].0, format!("m{}", MAX_MODELS + 4));
        assert_eq!(r.dropped, 5);
    }

    #[test]
    fn the_configurations_models_are_kept_however_many_others_are_busier() {
        let c = crate::config::Config::parse(
            br#"{"degrade":{"thresholds":[{"model":"watched v1","signal":"rps","above":1,"level":1}]}}"#,
        )
        .unwrap();
        let mut many: Vec<String> = (0..MAX_MODELS + 5)
            .map(|i| sample(&format!("made-up-{i}"), &(100 + i).to_string()))
            .collect();
        many.push(sample("watched v1", "2"));
        let r = parse(&answer(&many.join(",")), "model", &c.names).unwrap();
        assert_eq!(r.values.len(), MAX_MODELS + 1);
        assert_eq!(r.values[0], ("watched_v1".to_string(), 2.0));
        assert_eq!(r.values[1].0, format!("made-up-{}", MAX_MODELS + 4));
        assert_eq!(r.dropped, 5, "the least loaded others");
        // Without it named, it is the least loaded and goes.
        let r = parse(&answer(&many.join(",")), "model", &Names::default()).unwrap();
        assert!(r.values.iter().all(|(m, _)| m != "watched_v1"));
    }

    #[test]
    fn anything_but_a_vector_answer_is_refused() {
        for body in [
            &b"garbage"[..],
            br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
            br#"{"status":"success","data":{"resultType":"scalar","result":[0,"1"]}}"#,
            br#"{"status":"success"}"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[0]}]}}"#,
            br#"[]"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[0,1]}]}}"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[0,"1",2]}]}}"#,
            br#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[0,"1"]]}]}}"#,
        ] {
            assert!(parse(body, "model", &Names::default()).is_err(), "{}", String::from_utf8_lossy(body));
        }
        let matrix =
            br#"{"status":"success","data":{"resultType":"matrix","result":[{"values":[]}]}}"#;
        assert_eq!(
            parse(matrix, "model", &Names::default()).unwrap_err(),
            "result type Some(\"matrix\"), expected \"vector\""
        );
    }

    #[test]
    fn an_answer_is_refused_on_its_first_sample_past_the_bound() {
        let dropped = r#"{"value":[0,"1"]}"#;
        let at = answer(&vec![dropped; MAX_SAMPLES].join(","));
        assert_eq!(
            parse(&at, "model", &Names::default()).unwrap().dropped,
            MAX_SAMPLES as u32
        );
        let past = answer(&vec![dropped; MAX_SAMPLES + 1].join(","));
        let e = parse(&past, "model", &Names::default()).unwrap_err();
        assert!(e.contains("more than 10000 samples"), "{e}");
    }

    #[test]
    fn only_the_model_label_is_read() {
        let many: Vec<String> = (0..10_000)
            .map(|i| format!(r#""l{i}":{{"x":[{i}]}}"#))
            .collect();
        let long = "m".repeat(MAX_MODEL_LEN + 1);
        let body = answer(&format!(
            r#"{{"metric":{{{},"m\u006fdel":"gpt-4o"}},"value":[1,"2"]}},
               {{"metric":{{"model":"{long}"}},"value":[1,"2"]}},
               {{"metric":{{"model":7}},"value":[1,"2"]}}"#,
            many.join(",")
        ));
        let r = parse(&body, "model", &Names::default()).unwrap();
        assert_eq!(r.values, [("gpt-4o".to_string(), 2.0)]);
        assert_eq!(r.dropped, 2);
    }
}
