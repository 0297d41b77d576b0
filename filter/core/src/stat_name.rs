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

/// The words Istio's default bootstrap takes a tag after wherever they stand
/// before a dot: its rules `(cache\.(.+?)\.)`, `(component\.(.+?)\.)`,
/// `(tag\.(.+?);\.)` and `(wasm_filter\.(.+?)\.)` are not anchored, so in a
/// value such as `api.cache.example.com` they would add a label `cache`.
const ISTIO_TAG_WORDS: [&str; 4] = ["cache", "component", "tag", "wasm_filter"];

/// Appends a label value with every character outside the kept set turned
/// into `_`, and a dot right after one of [`ISTIO_TAG_WORDS`] too, cut to
/// [`MAX_VALUE_LEN`] characters, never empty.
pub fn push_value(out: &mut String, value: &str) {
    if value.is_empty() {
        out.push_str(UNKNOWN);
        return;
    }
    let start = out.len();
    for c in value.chars().take(MAX_VALUE_LEN) {
        let kept = kept(c) && !(c == '.' && after_istio_tag_word(out.get(start..)));
        out.push(if kept { c } else { '_' });
    }
}

fn after_istio_tag_word(written: Option<&str>) -> bool {
    written.is_some_and(|w| ISTIO_TAG_WORDS.iter().any(|word| w.ends_with(word)))
}
