//! The one pass over a whole JSON answer that every dialect's head is read
//! with ([`super::Answer::head`]): the top-level members a dialect names are
//! taken as their JSON text, borrowed from the body, and every other member
//! is read past in place (an embeddings answer's vectors are never made a
//! tree). Each dialect then reads its own members in its own words; the
//! answer's usage, id, model and finish reasons come out in the dialect-free
//! [`Head`].

use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::json::bounded::{self, Raw};
use crate::usage::{Head, Usage};

/// The members of a JSON answer a dialect reads, each as its JSON text.
#[derive(Debug, Default)]
pub(crate) struct Members<'b>(Vec<(&'static str, &'b str)>);

impl<'b> Members<'b> {
    /// The members of the JSON object `body` named in `names`; of a name
    /// given twice, the last (as a parse into a tree keeps). `None` when the
    /// body is no JSON object (or nests deeper than the JSON bound).
    pub(crate) fn of(body: &'b [u8], names: &[&'static str]) -> Option<Self> {
        bounded::read(body, Wanted(names)).ok().map(Self)
    }

    /// The JSON text of the member `name`, when the answer has it.
    pub(crate) fn raw(&self, name: &str) -> Option<&'b str> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, raw)| *raw)
    }

    /// The member `name` read as a `T`: `Some(None)` when absent or null,
    /// `None` when it is no `T` (which costs the whole head: a reader that
    /// meets a field of a type it does not know trusts none of the answer).
    pub(crate) fn get<T: DeserializeOwned>(&self, name: &str) -> Option<Option<T>> {
        match self.raw(name) {
            None => Some(None),
            Some(raw) => serde_json::from_slice::<Option<T>>(raw.as_bytes()).ok(),
        }
    }

    /// The usage object in the member `name`, read by `read`: `Some(None)`
    /// when absent or null, `None` when `read` cannot read it.
    pub(crate) fn usage(
        &self,
        name: &str,
        read: impl Fn(&Value) -> Option<Usage>,
    ) -> Option<Option<Usage>> {
        match self.get::<Value>(name)? {
            None => Some(None),
            Some(v) => read(&v).map(Some),
        }
    }

    /// The head of an answer that reports its usage in `usage` (read by
    /// `read`) beside its `id` and `model`, with no finish reason yet.
    pub(crate) fn head(&self, read: impl Fn(&Value) -> Option<Usage>) -> Option<Head> {
        Some(Head::new(
            self.usage("usage", read)?,
            self.get("id")?,
            self.get("model")?,
        ))
    }
}

/// Reads the members of `body` named in `names` and hands them to `read`;
/// an answer that is no JSON object, or whose members `read` cannot read,
/// has an empty head.
pub(crate) fn read(
    body: &[u8],
    names: &[&'static str],
    read: impl FnOnce(&Members<'_>) -> Option<Head>,
) -> Head {
    Members::of(body, names)
        .and_then(|m| read(&m))
        .unwrap_or_default()
}

/// A usage object's count `name`: 0 when absent, `None` when it is no
/// `u64` (null, a string, negative, fractional, past `u64`).
pub(crate) fn count(usage: &Map<String, Value>, name: &str) -> Option<u64> {
    match usage.get(name) {
        None => Some(0),
        Some(v) => v.as_u64(),
    }
}

/// A count that may be null: 0 when absent or null.
pub(crate) fn optional_count(usage: &Map<String, Value>, name: &str) -> Option<u64> {
    match usage.get(name) {
        None | Some(Value::Null) => Some(0),
        Some(v) => v.as_u64(),
    }
}

/// The count `field` of a usage's details object `name` (OpenAI's,
/// Responses' and Anthropic's words): `Some(None)` when there are no
/// details (absent or null), `None` when they are of another type.
pub(crate) fn detail(usage: &Map<String, Value>, name: &str, field: &str) -> Option<Option<u64>> {
    match usage.get(name) {
        None | Some(Value::Null) => Some(None),
        Some(Value::Object(details)) => optional_count(details, field).map(Some),
        Some(_) => None,
    }
}

/// Reads the top-level members named in its list, each as its JSON text.
struct Wanted<'n>(&'n [&'static str]);

impl<'de> DeserializeSeed<'de> for Wanted<'_> {
    type Value = Vec<(&'static str, &'de str)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Wanted<'_> {
    type Value = Vec<(&'static str, &'de str)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        // At most one entry per name, however often the body repeats it.
        let mut found: Self::Value = Vec::with_capacity(self.0.len());
        bounded::each_member(map, self.0, |name, map| {
            let raw = map.next_value_seed(Raw)?;
            found.retain(|(n, _)| *n != name);
            found.push((name, raw));
            Ok(())
        })?;
        Ok(found)
    }
}

#[cfg(test)]
mod tests;
