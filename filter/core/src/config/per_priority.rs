//! A setting given once for every priority or once per priority
//! (`512` or `{"P1": 1024, "P2": 512}`), the form budgets, shaping caps and
//! degrade actions share. A leaf: only the priority and the reader, so any
//! section can read it.

use serde_json::Value;

use super::error::ConfigError;
use super::read::{self, Read};
use crate::priority::Priority;

/// A number for every priority, or one per priority as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawPerPriority {
    /// One number for every priority.
    All(u64),
    /// A number per priority; a missing one is left to the section's default.
    PerPriority([Option<u64>; 3]),
}

impl RawPerPriority {
    /// The value given for `p`, when written one per priority, or the one
    /// number when given for all.
    pub fn get(&self, p: Priority) -> Option<u64> {
        match self {
            Self::All(v) => Some(*v),
            Self::PerPriority(per) => per.get(p.index()).copied().flatten(),
        }
    }
}

/// What either form refuses a value as.
const EXPECTED: &str = r#"a whole number, or an object {"P0": n, "P1": n, "P2": n}"#;

impl Read for RawPerPriority {
    /// A typo gets an error naming the key and value, not "did not match
    /// any variant".
    fn read(v: &Value) -> Result<Self, ConfigError> {
        match v {
            Value::Number(n) => n.as_u64().map(Self::All).ok_or_else(|| match n.is_i64() {
                true => ConfigError::new(
                    ".",
                    format!("invalid value: integer `{n}`, expected {EXPECTED}"),
                ),
                false => read::invalid(v, EXPECTED),
            }),
            Value::Object(_) => {
                let mut out = [None; 3];
                for (key, n) in read::fields(v, &["P0", "P1", "P2"])? {
                    if let Some(slot) = Priority::parse(key).and_then(|p| out.get_mut(p.index())) {
                        *slot = Some(u64::read(n).map_err(|e| e.within(key))?);
                    }
                }
                Ok(Self::PerPriority(out))
            }
            other => Err(read::invalid(other, EXPECTED)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_number_or_one_per_priority() {
        let all: RawPerPriority = read::parse(b"512").unwrap();
        assert_eq!(all, RawPerPriority::All(512));
        assert_eq!(all.get(Priority::P0), Some(512));
        let per: RawPerPriority = read::parse(br#"{"P2":256,"P0":9}"#).unwrap();
        assert_eq!(per, RawPerPriority::PerPriority([Some(9), None, Some(256)]));
        assert_eq!(per.get(Priority::P1), None);
        for bad in ["-1", "1.5", r#""x""#, r#"{"P3":1}"#, r#"{"p1":1}"#] {
            assert!(
                read::parse::<RawPerPriority>(bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
    }
}
