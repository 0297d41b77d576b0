//! The range checks every section makes, in one place so the same kind of
//! mistake is refused with the same words wherever it is made. Each check takes
//! the field's path, relative to its section, and returns the value it accepts.

use std::fmt::Display;
use std::ops::RangeInclusive;

use super::error::ConfigError;

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

/// A share in `[0, 1)`: all of it would leave nothing.
pub fn fraction_below_one(field: &str, value: f64) -> Result<f64, ConfigError> {
    if (0.0..1.0).contains(&value) {
        return Ok(value);
    }
    Err(ConfigError::new(field, format!("{value} is not in [0, 1)")))
}

/// A threshold in `(0, 1)`: neither end is a level anything can sit below and above.
pub fn open_fraction(field: &str, value: f64) -> Result<f64, ConfigError> {
    if value > 0.0 && value < 1.0 {
        return Ok(value);
    }
    Err(ConfigError::new(field, format!("{value} is not in (0, 1)")))
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

/// An RFC 9110 token, the grammar of header names.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
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
        assert!(fraction_below_one("j", 1.0).is_err());
        assert!(fraction_below_one("j", f64::NAN).is_err());
        assert_eq!(fraction_below_one("j", 0.0), Ok(0.0));
        for v in [0.0, 1.0, f64::NAN] {
            assert!(open_fraction("s", v).is_err(), "{v}");
        }
        assert_eq!(open_fraction("s", 0.5), Ok(0.5));
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
