//! Request priority (P0 most important) decides who is protected longest under
//! load; it travels to every hop in W3C baggage.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::config::read::Read;
use crate::config::ConfigError;

/// Request header carrying the caller's priority, and written toward the
/// upstream with the priority the call was given.
pub const HEADER: &str = "x-request-priority";
/// The baggage member that carries the priority to every later hop.
pub const BAGGAGE_KEY: &str = "priority";

/// A call's priority. In the configuration it is spelled as in the header,
/// any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum Priority {
    /// Most important: never shed by the breaker.
    P0,
    /// Normal traffic.
    #[default]
    P1,
    /// Best effort: shed first.
    P2,
}

impl Priority {
    /// All priorities, most important first.
    pub const ALL: [Priority; 3] = [Priority::P0, Priority::P1, Priority::P2];

    /// Parses `P0` | `P1` | `P2` in any case, surrounding spaces ignored.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw.trim().as_bytes() {
            [b'p' | b'P', b'0'] => Some(Self::P0),
            [b'p' | b'P', b'1'] => Some(Self::P1),
            [b'p' | b'P', b'2'] => Some(Self::P2),
            _ => None,
        }
    }

    /// The canonical spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::P0 => "P0",
            Self::P1 => "P1",
            Self::P2 => "P2",
        }
    }

    /// Index 0..3, for per-priority tables.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl TryFrom<String> for Priority {
    type Error = String;

    /// What [`Priority::parse`] accepts; the error quotes the value.
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        Self::parse(&raw).ok_or_else(|| format!("{raw:?} is not one of P0, P1, P2"))
    }
}

impl Read for Priority {
    /// A string [`Priority::parse`] accepts.
    fn read(v: &Value) -> Result<Self, ConfigError> {
        Self::try_from(String::read(v)?).map_err(|e| ConfigError::new(".", e))
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The priority of a call from a trusted client: its `x-request-priority`
/// when valid, else its baggage's `priority` member when valid, else the
/// default. The header wins over the baggage: it is what the caller set for
/// this very call, while baggage carries what an earlier hop set for the
/// whole request. An untrusted client gets the default whatever it sent, so
/// it can raise its priority by neither.
pub fn resolve(
    header: Option<&str>,
    baggage: Option<&str>,
    trust_client: bool,
    default: Priority,
) -> Priority {
    if !trust_client {
        return default;
    }
    header
        .and_then(Priority::parse)
        .or_else(|| baggage.and_then(Priority::parse))
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_any_case() {
        for (raw, want) in [
            ("P0", Some(Priority::P0)),
            ("p1", Some(Priority::P1)),
            (" P2 ", Some(Priority::P2)),
            ("P3", None),
            ("P", None),
            ("", None),
            ("P01", None),
            ("high", None),
            ("Р1", None), // Cyrillic Er
        ] {
            assert_eq!(Priority::parse(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn deserialises_as_parsed_naming_the_value() {
        let p: Priority = serde_json::from_str(r#"" p2 ""#).unwrap();
        assert_eq!(p, Priority::P2);
        let e = serde_json::from_str::<Priority>(r#""P7""#).unwrap_err();
        assert!(
            e.to_string().contains(r#""P7" is not one of P0, P1, P2"#),
            "{e}"
        );
        assert!(serde_json::from_str::<Priority>("1").is_err());
    }

    #[test]
    fn resolve_respects_trust_and_default() {
        assert_eq!(resolve(Some("p0"), None, true, Priority::P1), Priority::P0);
        assert_eq!(resolve(Some("p0"), None, false, Priority::P2), Priority::P2);
        assert_eq!(resolve(Some("bad"), None, true, Priority::P2), Priority::P2);
        assert_eq!(resolve(None, None, true, Priority::P1), Priority::P1);
        // Baggage, when the header says nothing valid.
        assert_eq!(resolve(None, Some("P0"), true, Priority::P1), Priority::P0);
        assert_eq!(
            resolve(Some("bad"), Some("p2"), true, Priority::P1),
            Priority::P2
        );
        assert_eq!(resolve(None, Some("P9"), true, Priority::P1), Priority::P1);
        // The header wins when both are valid.
        assert_eq!(
            resolve(Some("P2"), Some("P0"), true, Priority::P1),
            Priority::P2
        );
        // Untrusted: neither raises it.
        assert_eq!(resolve(None, Some("P0"), false, Priority::P2), Priority::P2);
    }
}
