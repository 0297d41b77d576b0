//! The one way labels are encoded into a stat name (the `metrics` module says
//! why): `metric` then `label=.=value;.;` per label, Istio's form, each value
//! kept to a safe set of characters and bounded. Apart from the stats themselves, so that the
//! host's traits can name a stat by its parts without depending on them.

/// Label value for a value that is absent.
pub const UNKNOWN: &str = "unknown";

/// Longest label value kept, in characters (a fully qualified Istio cluster
/// name with a subset fits).
pub const MAX_VALUE_LEN: usize = 128;

/// Encodes a stat name with labels: `metric` then `label=.=value;.;` for
/// each label, with nothing in between (`llm_filter_requests_totalpriority=.=P0;.;`):
/// the form Istio's `extraStatTags` rules extract, `(label=\.=(.*?);\.;)`,
/// which remove exactly each label's part and leave the metric.
pub fn name(metric: &str, labels: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(metric.len() + labels.len() * 32);
    out.push_str(metric);
    for (label, value) in labels {
        out.push_str(label);
        out.push_str("=.=");
        push_value(&mut out, value);
        out.push_str(";.;");
    }
    out
}

/// Whether a value keeps `c` as it is.
fn kept(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '|' | '/' | ':' | '@' | '+')
}

/// A label value as [`name`] writes it: the kept characters only, bounded,
/// never empty.
pub fn label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_VALUE_LEN));
    push_value(&mut out, value);
    out
}

/// Appends a label value with every character outside the kept set turned
/// into `_`, cut to [`MAX_VALUE_LEN`] characters, never empty.
pub fn push_value(out: &mut String, value: &str) {
    if value.is_empty() {
        out.push_str(UNKNOWN);
        return;
    }
    for c in value.chars().take(MAX_VALUE_LEN) {
        out.push(if kept(c) { c } else { '_' });
    }
}
