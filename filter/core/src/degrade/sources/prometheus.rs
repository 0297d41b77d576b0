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

use serde_json::Value;

use crate::config::Names;
use crate::stat_name;

/// Most models one reading keeps besides those the configuration names.
pub const MAX_MODELS: usize = 64;
/// Largest value believed: more calls, tokens per second or calls in flight
/// than any mesh makes is a broken query or exporter.
pub const MAX_VALUE: f64 = 1e9;
/// Most samples one answer may carry; a larger one is refused whole.
pub const MAX_SAMPLES: usize = 10_000;

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

/// Reads an answer; the error says why it is not one.
pub fn parse(body: &[u8], model_label: &str, config_names: &Names) -> Result<Reading, String> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|e| format!("not a Prometheus answer: {e}"))?;
    let status = answer.get("status").and_then(Value::as_str);
    if status != Some("success") {
        return Err(format!("status {status:?}"));
    }
    let data = answer.get("data").ok_or("no data")?;
    let kind = data.get("resultType").and_then(Value::as_str);
    if kind != Some("vector") {
        return Err(format!("result type {kind:?}, expected \"vector\""));
    }
    let samples = data
        .get("result")
        .and_then(Value::as_array)
        .ok_or("no result list")?;
    if samples.len() > MAX_SAMPLES {
        return Err(format!("{} samples, at most {MAX_SAMPLES}", samples.len()));
    }
    let mut reading = Reading::default();
    let mut values: BTreeMap<String, f64> = BTreeMap::new();
    for sample in samples {
        // `{"metric": {labels}, "value": [unix time, "value"]}`.
        let value = match sample
            .get("value")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            Some([Value::Number(_), Value::String(v)]) => v.parse::<f64>().ok(),
            _ => return Err("a sample without a [time, \"value\"] pair".to_string()),
        };
        let model = sample
            .get("metric")
            .and_then(|m| m.get(model_label))
            .and_then(Value::as_str);
        let (Some(model), Some(value)) = (model, value.filter(|v| believed(*v))) else {
            reading.dropped = reading.dropped.saturating_add(1);
            continue;
        };
        // Two samples of one model (labels beyond it): their sum.
        let slot = values.entry(stat_name::label_value(model)).or_default();
        *slot = (*slot + value).min(MAX_VALUE);
    }
    let (mut known, mut others): (Values, Values) = values
        .into_iter()
        .partition(|(m, _)| config_names.has_model_label(m));
    for part in [&mut known, &mut others] {
        part.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    }
    if others.len() > MAX_MODELS {
        let beyond = others.len() - MAX_MODELS;
        reading.dropped = reading
            .dropped
            .saturating_add(u32::try_from(beyond).unwrap_or(u32::MAX));
        others.truncate(MAX_MODELS);
    }
    known.append(&mut others);
    reading.values = known;
    Ok(reading)
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
        ] {
            assert!(parse(body, "model", &Names::default()).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }
}
