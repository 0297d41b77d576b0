//! A setting given once for every priority or once per priority
//! (`512` or `{"P1": 1024, "P2": 512}`), the form budgets, shaping caps and
//! degrade actions share. A leaf: only the priority and serde, so any section
//! can read it.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

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

impl<'de> Deserialize<'de> for RawPerPriority {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Hand-written rather than `#[serde(untagged)]` so a typo gets an error
        // naming the key and value, not "did not match any variant".
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawPerPriority;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a whole number, or an object {"P0": n, "P1": n, "P2": n}"#)
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(RawPerPriority::All(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map(RawPerPriority::All)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = [None; 3];
                while let Some(PriorityKey(p)) = map.next_key()? {
                    let slot = out
                        .get_mut(p.index())
                        .ok_or_else(|| de::Error::custom("priority out of range"))?;
                    if slot.is_some() {
                        return Err(de::Error::custom(format!("duplicate field `{p}`")));
                    }
                    *slot = Some(map.next_value::<u64>()?);
                }
                Ok(RawPerPriority::PerPriority(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A key of a per-priority object. Refused inside the key's own
/// deserialisation, like a derived field name, so the error path names it.
struct PriorityKey(Priority);

impl<'de> Deserialize<'de> for PriorityKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PriorityKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("P0, P1 or P2")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "P0" => Ok(PriorityKey(Priority::P0)),
                    "P1" => Ok(PriorityKey(Priority::P1)),
                    "P2" => Ok(PriorityKey(Priority::P2)),
                    other => Err(E::unknown_field(other, &["P0", "P1", "P2"])),
                }
            }
        }
        d.deserialize_identifier(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_number_or_one_per_priority() {
        let all: RawPerPriority = serde_json::from_str("512").unwrap();
        assert_eq!(all, RawPerPriority::All(512));
        assert_eq!(all.get(Priority::P0), Some(512));
        let per: RawPerPriority = serde_json::from_str(r#"{"P2":256,"P0":9}"#).unwrap();
        assert_eq!(per, RawPerPriority::PerPriority([Some(9), None, Some(256)]));
        assert_eq!(per.get(Priority::P1), None);
        for bad in ["-1", "1.5", r#""x""#, r#"{"P3":1}"#, r#"{"P1":1,"P1":2}"#] {
            assert!(
                serde_json::from_str::<RawPerPriority>(bad).is_err(),
                "{bad}"
            );
        }
    }
}
