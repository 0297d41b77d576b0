//! Reads Envoy's `/stats/prometheus` text into samples, so tests assert on a
//! metric's labels and value instead of matching lines of text.

use std::collections::BTreeMap;

/// One sample line: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, with `_bucket`/`_sum`/`_count` for histogram series.
    pub name: String,
    /// Labels by name.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// Whether every `(label, value)` of `labels` is on this sample (others may be too).
    pub fn has_labels(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(k, v)| self.labels.get(*k).map(String::as_str) == Some(*v))
    }
}

/// Every sample of an exposition; comments and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

/// Sum of the samples named `name` carrying `labels` (0 when there is none).
pub fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && s.has_labels(labels))
        .fold(0.0, |total, s| total + s.value)
}

/// Samples named `name` (exactly, or as a histogram series `name_*`), for messages.
pub fn family<'a>(samples: &'a [Sample], name: &str) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                || s.name
                    .strip_prefix(name)
                    .is_some_and(|r| r.starts_with('_'))
        })
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let (labels, rest) = parse_labels(line.get(open + 1..)?)?;
            (line.get(..open)?, labels, rest)
        }
        None => {
            let (name, rest) = line.split_once(' ')?;
            (name, BTreeMap::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `k="v",k2="v2"}` (escapes `\\`, `\"`, `\n`); returns the labels and the rest.
fn parse_labels(text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.insert(key.trim().to_string(), value);
        rest = after.get(end + 1..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE llm_filter_requests_total counter
llm_filter_requests_total{priority="P0",model="gpt-4o",outcome="success"} 2
llm_filter_requests_total{priority="P1",model="gpt-4o",outcome="reset"} 1
envoy_server_live{} 1
up 1
gen_ai_client_operation_duration_ms_bucket{model="m",le="+Inf"} 3
weird{l="a \"q\" \\ b\nc"} 4
broken{l="x" 5
"#;

    #[test]
    fn parses_samples_with_labels() {
        let samples = parse(TEXT);
        assert_eq!(samples.len(), 6, "{samples:?}");
        assert_eq!(
            sum(
                &samples,
                "llm_filter_requests_total",
                &[("model", "gpt-4o")]
            ),
            3.0
        );
        assert_eq!(
            sum(
                &samples,
                "llm_filter_requests_total",
                &[("priority", "P0"), ("outcome", "success")]
            ),
            2.0
        );
        assert_eq!(
            sum(&samples, "llm_filter_requests_total", &[("model", "x")]),
            0.0
        );
        assert_eq!(sum(&samples, "up", &[]), 1.0);
        assert_eq!(sum(&samples, "envoy_server_live", &[]), 1.0);
        let bucket = &family(&samples, "gen_ai_client_operation_duration_ms")[0];
        assert_eq!(bucket.labels["le"], "+Inf");
        assert_eq!(bucket.value, 3.0);
        assert_eq!(family(&samples, "weird")[0].labels["l"], "a \"q\" \\ b\nc");
    }
}
