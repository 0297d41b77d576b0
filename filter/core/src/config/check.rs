//! The checks every section makes, in one place so the same kind of mistake
//! is refused with the same words wherever it is made. Each range check takes
//! the field's path, relative to its section, and returns the value it
//! accepts (a setting with a default is checked through its
//! [`super::setting::Setting`]); the `is_*` predicates are the grammars of
//! names, paths and headers.

use std::fmt::Display;
use std::ops::RangeInclusive;

use super::error::ConfigError;

/// What a section's built-in defaults compile to, as `{}` does: the
/// test-only `Default` of every compiled section, so no default is stated
/// twice.
#[cfg(test)]
pub fn defaults<R: Default, T>(compile: impl FnOnce(R) -> Result<T, ConfigError>) -> T {
    compile(R::default()).expect("the built-in defaults compile")
}

/// A whole number in `range`.
pub fn in_range<T>(field: &str, value: T, range: RangeInclusive<T>) -> Result<T, ConfigError>
where
    T: PartialOrd + Display + Copy,
{
    if range.contains(&value) {
        return Ok(value);
    }
    Err(ConfigError::new(
        field,
        format!("{value} is not in {}..={}", range.start(), range.end()),
    ))
}

/// A number that is not zero (a count, a weight, a duration), `what` it is
/// naming the unit in the message.
pub fn positive<T>(field: &str, value: T, what: &str) -> Result<T, ConfigError>
where
    T: PartialEq + Default + Display + Copy,
{
    if value == T::default() {
        return Err(ConfigError::new(
            field,
            format!("{value} is not a positive {what}"),
        ));
    }
    Ok(value)
}

/// A real number in `[lo, hi]`; NaN and infinities are refused.
pub fn real_in(field: &str, value: f64, range: RangeInclusive<f64>) -> Result<f64, ConfigError> {
    if range.contains(&value) {
        return Ok(value);
    }
    Err(ConfigError::new(
        field,
        format!("{value} is not in [{}, {}]", range.start(), range.end()),
    ))
}

/// A real number above zero; NaN and infinities are refused.
pub fn positive_real(field: &str, value: f64) -> Result<f64, ConfigError> {
    if value.is_finite() && value > 0.0 {
        return Ok(value);
    }
    Err(ConfigError::new(
        field,
        format!("{value} is not a positive number"),
    ))
}

/// A share in `[0, 1]`.
pub fn fraction(field: &str, value: f64) -> Result<f64, ConfigError> {
    real_in(field, value, 0.0..=1.0)
}

/// A list of at most `max` items, `what` naming them in the message.
pub fn at_most<T>(field: &str, items: &[T], max: usize, what: &str) -> Result<(), ConfigError> {
    if items.len() > max {
        return Err(ConfigError::new(
            field,
            format!("{} {what}, at most {max}", items.len()),
        ));
    }
    Ok(())
}

/// Longest Envoy cluster name accepted.
pub const MAX_CLUSTER_LEN: usize = 200;
/// Longest model name or `:authority`.
const MAX_NAME_LEN: usize = 256;
/// Longest path.
const MAX_PATH_LEN: usize = 1_024;

/// An RFC 9110 token, the grammar of header names.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// An RFC 9110 token in lowercase, as HTTP/2 requires of header names.
pub fn is_header_name(s: &str) -> bool {
    is_token(s) && !s.bytes().any(|b| b.is_ascii_uppercase())
}

/// A header value that cannot split the header block: no CR, LF or NUL.
pub fn is_header_value(s: &str) -> bool {
    !s.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
}

/// Envoy cluster names as this filter accepts them. `|` is allowed because
/// Istio names its clusters `outbound|port||host`.
pub fn is_cluster(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_CLUSTER_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'|'))
}

/// A model name: bounded, without control characters.
pub fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_LEN && !s.chars().any(char::is_control)
}

/// An `:authority` of a routed cluster: bounded, visible ASCII, no path,
/// query, fragment or credentials.
pub fn is_authority(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'@' | b'"' | b'\\'))
}

/// A request path of a probe: absolute, bounded, visible ASCII, no fragment.
pub fn is_path(s: &str) -> bool {
    s.starts_with('/')
        && s.len() <= MAX_PATH_LEN
        && s.bytes().all(|b| b.is_ascii_graphic() && b != b'#')
}

/// A path the filter matches requests against: absolute, without query or
/// fragment.
pub fn is_path_without_query(s: &str) -> bool {
    s.starts_with('/') && !s.contains(['?', '#'])
}

/// A value sent as it is, where a blank or a control byte would end it
/// early or smuggle another (an embeddings `:authority` or `:path`).
pub fn has_blank_or_control(s: &str) -> bool {
    s.bytes().any(|b| b <= b' ' || b == 0x7f)
}

/// A label value that is also a header value: 1 to `max_len` of
/// `[A-Za-z0-9_-]`.
pub fn is_label(s: &str, max_len: usize) -> bool {
    !s.is_empty()
        && s.len() <= max_len
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_name_the_value_and_bounds() {
        assert_eq!(in_range("n", 5u64, 1..=5), Ok(5));
        let e = in_range("n", 0u32, 1..=5).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("n", "0 is not in 1..=5")
        );
        assert_eq!(positive("w", 3u32, "weight"), Ok(3));
        assert_eq!(
            positive("w", 0u32, "weight").unwrap_err().message,
            "0 is not a positive weight"
        );
    }

    #[test]
    fn real_checks_refuse_nan_and_the_open_ends() {
        for v in [f64::NAN, f64::INFINITY, -0.1, 1.1] {
            assert!(fraction("f", v).is_err(), "{v}");
        }
        assert_eq!(fraction("f", 1.0), Ok(1.0));
        assert_eq!(real_in("t", 2.0, 0.0..=2.0), Ok(2.0));
        assert_eq!(
            real_in("t", 2.5, 0.0..=2.0).unwrap_err().message,
            "2.5 is not in [0, 2]"
        );
    }

    #[test]
    fn names_paths_and_headers() {
        assert!(is_header_name("x-llm-cluster") && !is_header_name("X-Cluster"));
        assert!(!is_header_name(":authority") && !is_header_name(""));
        assert!(is_header_value("Bearer k") && !is_header_value("a\nb") && !is_header_value("a\0"));
        assert!(is_cluster("outbound|8000||vllm.ns.svc.cluster.local"));
        assert!(!is_cluster("a b") && !is_cluster("") && !is_cluster(&"c".repeat(201)));
        assert!(is_name("gpt-4o") && !is_name("") && !is_name("a\u{7}"));
        assert!(is_authority("api.openai.com:443"));
        for bad in ["", "x/y", "u@h", "a b"] {
            assert!(!is_authority(bad), "{bad:?}");
        }
        assert!(is_path("/v1/models?x=1") && !is_path("health") && !is_path("/a#b"));
        assert!(is_path_without_query("/llm-filter") && !is_path_without_query("/a?b"));
        assert!(!is_path_without_query("v1/chat"));
        assert!(has_blank_or_control("a b") && has_blank_or_control("a\x7f"));
        assert!(!has_blank_or_control("emb.example/é"));
        assert!(is_label("control_1-b", 32) && !is_label("a b", 32) && !is_label("", 32));
        assert!(!is_label(&"g".repeat(33), 32));
    }

    #[test]
    fn lists_and_tokens() {
        assert!(at_most("l", &[1, 2], 2, "items").is_ok());
        assert_eq!(
            at_most("l", &[1, 2, 3], 2, "items").unwrap_err().message,
            "3 items, at most 2"
        );
        assert!(is_token("X-Api_Key.1"));
        for bad in ["", "a b", "a:b", "é"] {
            assert!(!is_token(bad), "{bad:?}");
        }
    }
}
