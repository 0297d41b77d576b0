//! Reading JSON another party sends — an answer the filter pulls, a webhook
//! posted to it — with bounds that hold while it is read. A tree of the whole
//! body (`serde_json::Value`) costs some thirty times the bytes of a body of
//! small items before any count on it can be checked, and a VM's memory never
//! shrinks back. Here a reader takes each item as it comes and keeps only what
//! it needs; any other value is read in place, as its text borrowed from the
//! body, and a string is decoded only when short; an array is refused on its
//! first item past the bound. Nesting is bounded before the read starts:
//! serde_json skips a value with a stack of one byte per level, which a body
//! of brackets would grow to its own size.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::MAX_DEPTH;

/// Most bytes an escape takes in JSON text (`\u00e9`) per byte it stands for.
const MAX_ESCAPE_RATIO: usize = 6;

/// Reads a whole `body` with `seed`. Refused, the error saying why: nested
/// deeper than [`MAX_DEPTH`], not JSON, not what `seed` reads, or followed by
/// more than whitespace.
pub fn read<'de, S: DeserializeSeed<'de>>(body: &'de [u8], seed: S) -> Result<S::Value, String> {
    let depth = nesting(body);
    if depth > MAX_DEPTH {
        return Err(format!("nested {depth} deep, at most {MAX_DEPTH}"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = seed.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// How deep the arrays and objects of `body` nest, brackets inside strings
/// left out; counted without allocating, on any bytes (JSON or not).
pub fn nesting(body: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth = depth.saturating_add(1);
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A value read in place: its JSON text, borrowed from the body, without the
/// whitespace around it. Reads a map key too.
#[derive(Debug, Clone, Copy)]
pub struct Raw;

impl<'de> DeserializeSeed<'de> for Raw {
    type Value = &'de str;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<&'de str, D::Error> {
        <&'de RawValue>::deserialize(d).map(RawValue::get)
    }
}

/// A value read in place as a string of at most a bound of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text<'de> {
    /// A string of at most the bound, decoded (borrowed when it has no escape).
    Short(Cow<'de, str>),
    /// A string longer than the bound, not decoded.
    Long,
    /// Not a string.
    Other,
}

impl<'de> Text<'de> {
    /// Reads the JSON text `raw` of one value (as [`Raw`] gives it) as a
    /// string of at most `max` bytes. Decoding one with escapes takes at most
    /// twelve times `max` (the text, then the string), whatever `raw` holds.
    pub fn of(raw: &'de str, max: usize) -> Self {
        let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
            return Self::Other;
        };
        if !inner.contains('\\') {
            return if inner.len() <= max {
                Self::Short(Cow::Borrowed(inner))
            } else {
                Self::Long
            };
        }
        // Every byte it stands for takes at most six of its own.
        if inner.len() > max.saturating_mul(MAX_ESCAPE_RATIO) {
            return Self::Long;
        }
        // Read as bytes, as every other JSON the filter parses: one reader
        // compiled into the module instead of two.
        match serde_json::from_slice::<String>(raw.as_bytes()) {
            Ok(s) if s.len() <= max => Self::Short(Cow::Owned(s)),
            Ok(_) => Self::Long,
            Err(_) => Self::Other,
        }
    }

    /// The string, when it is one of at most the bound.
    pub fn short(&self) -> Option<&str> {
        match self {
            Self::Short(s) => Some(s),
            Self::Long | Self::Other => None,
        }
    }
}

/// Which of `names` the map key `raw` (as [`Raw`] reads it) is.
pub fn name(raw: &str, names: &[&'static str]) -> Option<&'static str> {
    let longest = names.iter().map(|n| n.len()).max().unwrap_or(0);
    let text = Text::of(raw, longest);
    let key = text.short()?;
    names.iter().copied().find(|n| *n == key)
}

/// The JSON text `raw` of one value is an empty array.
pub fn is_empty_array(raw: &str) -> bool {
    raw.strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .is_some_and(|r| r.trim_matches([' ', '\t', '\n', '\r']).is_empty())
}

/// The JSON text `raw` of one value is a number.
pub fn is_number(raw: &str) -> bool {
    raw.starts_with(|c: char| c == '-' || c.is_ascii_digit())
}

/// Hands each item of the array `seq` to `each`, as `seed` reads it; an array
/// of more than `max` items (`what` they are, for the error) is refused on the
/// first item past the bound, which is read in place. The error of `each`
/// refuses the array.
pub fn each_item<'de, A, S, F>(
    mut seq: A,
    max: usize,
    what: &str,
    seed: S,
    mut each: F,
) -> Result<(), A::Error>
where
    A: SeqAccess<'de>,
    S: DeserializeSeed<'de> + Clone,
    F: FnMut(S::Value) -> Result<(), String>,
{
    for _ in 0..max {
        match seq.next_element_seed(seed.clone())? {
            Some(item) => each(item).map_err(A::Error::custom)?,
            None => return Ok(()),
        }
    }
    match seq.next_element::<IgnoredAny>()? {
        None => Ok(()),
        Some(_) => Err(A::Error::custom(format!("more than {max} {what}"))),
    }
}

/// Hands each member of the object `map` whose key is one of `names` to
/// `each`, with that name and the map to read its value from (which `each`
/// reads, once); any other member is read past, in place. Of a key given
/// twice, each member is handed over in turn. The error of `each` refuses the
/// object.
pub fn each_member<'de, A, F>(
    mut map: A,
    names: &[&'static str],
    mut each: F,
) -> Result<(), A::Error>
where
    A: MapAccess<'de>,
    F: FnMut(&'static str, &mut A) -> Result<(), A::Error>,
{
    while let Some(key) = map.next_key_seed(Raw)? {
        match name(key, names) {
            Some(wanted) => each(wanted, &mut map)?,
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
