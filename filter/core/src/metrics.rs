//! Every stat the filter defines, by name, and the one way labels are encoded
//! into a stat name. Envoy has no label API: `<metric>.<label>.<value>…` names
//! are split back into Prometheus labels by the `stats_tags` rules in
//! `envoy/envoy.yaml`, so values are restricted to `[A-Za-z0-9_-]`.

use hashbrown::HashSet;

/// Calls seen, by `priority`, `model` and `outcome`.
pub const REQUESTS: &str = "llm_filter_requests_total";
/// Whole-call duration in milliseconds, by `model` (OpenTelemetry GenAI
/// `gen_ai.client.operation.duration`, in ms because Envoy histograms are integral).
pub const OPERATION_DURATION: &str = "gen_ai_client_operation_duration_ms";
/// Time from the request to the first byte of the response body, by `model`
/// (GenAI `gen_ai.server.time_to_first_token`).
pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai_server_time_to_first_token_ms";
/// Tokens reported in `usage`, by `model` and `token_type` (`input` | `output`),
/// as in GenAI `gen_ai.client.token.usage`.
pub const TOKEN_USAGE: &str = "gen_ai_client_token_usage_total";
/// The filter's own trouble, by `reason`; the request continued untouched.
pub const INTERNAL_ERRORS: &str = "llm_filter_internal_errors_total";

/// Label value used once a label has seen too many distinct values.
pub const OTHER: &str = "other";
/// Label value for a value that is absent.
pub const UNKNOWN: &str = "unknown";

const MAX_VALUE_LEN: usize = 64;

/// Encodes a stat name with labels: `metric.label.value…`.
pub fn name(metric: &str, labels: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(metric.len() + labels.len() * 24);
    out.push_str(metric);
    for (label, value) in labels {
        out.push('.');
        out.push_str(label);
        out.push('.');
        push_value(&mut out, value);
    }
    out
}

/// Appends a label value with every byte outside `[A-Za-z0-9_-]` turned into
/// `_`, cut to a bounded length, never empty.
fn push_value(out: &mut String, value: &str) {
    if value.is_empty() {
        out.push_str(UNKNOWN);
        return;
    }
    for c in value.chars().take(MAX_VALUE_LEN) {
        out.push(if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '_'
        });
    }
}

/// Bounds the distinct values of a label (each stat lives as long as Envoy):
/// the first `cap` values are kept, later ones become [`OTHER`].
#[derive(Debug)]
pub struct BoundedLabel {
    seen: HashSet<String>,
    cap: usize,
}

impl BoundedLabel {
    /// A bound of `cap` distinct values.
    pub fn new(cap: usize) -> Self {
        Self {
            seen: HashSet::new(),
            cap,
        }
    }

    /// The label value to use for `raw`.
    pub fn value<'a>(&mut self, raw: Option<&'a str>) -> &'a str {
        let Some(raw) = raw.filter(|r| !r.is_empty()) else {
            return UNKNOWN;
        };
        if self.seen.contains(raw) {
            return raw;
        }
        if self.seen.len() < self.cap {
            self.seen.insert(raw.to_string());
            return raw;
        }
        OTHER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_labels_in_order() {
        assert_eq!(
            name(REQUESTS, &[("priority", "P1"), ("model", "gpt-4o")]),
            "llm_filter_requests_total.priority.P1.model.gpt-4o"
        );
    }

    #[test]
    fn sanitises_values() {
        assert_eq!(
            name("m", &[("model", "meta-llama/Llama-3.1 8B"), ("x", "")]),
            "m.model.meta-llama_Llama-3_1_8B.x.unknown"
        );
        let long = "a".repeat(500);
        assert_eq!(name("m", &[("l", &long)]).len(), "m.l.".len() + MAX_VALUE_LEN);
    }

    #[test]
    fn bounded_label_caps_distinct_values() {
        let mut l = BoundedLabel::new(2);
        assert_eq!(l.value(Some("a")), "a");
        assert_eq!(l.value(Some("b")), "b");
        assert_eq!(l.value(Some("c")), OTHER);
        assert_eq!(l.value(Some("a")), "a");
        assert_eq!(l.value(None), UNKNOWN);
        assert_eq!(l.value(Some("")), UNKNOWN);
    }
}
