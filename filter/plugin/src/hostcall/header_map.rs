//! The ABI's header-map codec: the bytes the host hands over for a whole
//! map, parsed without trusting a single length, and the same encoding for
//! the headers of a local reply.

use std::ops::Range;

/// A header map in the ABI's encoding: the pair count, each pair's name and
/// value lengths (all `u32` little-endian), then each name and value followed
/// by a NUL. Kept as the bytes and the spans of each name and value.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeaderMap {
    bytes: Vec<u8>,
    spans: Vec<(Range<usize>, Range<usize>)>,
}

impl HeaderMap {
    /// The map `bytes` encode; `None` for a malformed one: nothing is trusted.
    pub fn parse(bytes: Vec<u8>) -> Option<Self> {
        if bytes.is_empty() {
            return Some(Self::default());
        }
        let word = |at: usize| -> Option<usize> {
            let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
            usize::try_from(u32::from_le_bytes(b)).ok()
        };
        let count = word(0)?;
        let mut at = count.checked_mul(8)?.checked_add(4)?;
        if at > bytes.len() {
            return None;
        }
        let mut next = |len: usize| -> Option<Range<usize>> {
            let end = at.checked_add(len)?;
            bytes.get(at..end)?;
            let span = at..end;
            at = end.checked_add(1)?;
            Some(span)
        };
        let mut spans = Vec::with_capacity(count);
        for n in 0..count {
            let lens = n.checked_mul(8)?.checked_add(4)?;
            let (key_len, value_len) = (word(lens)?, word(lens.checked_add(4)?)?);
            let key = next(key_len)?;
            let value = next(value_len)?;
            spans.push((key, value));
        }
        Some(Self { bytes, spans })
    }

    /// Each pair's name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|(k, v)| {
            (
                self.bytes.get(k.clone()).unwrap_or_default(),
                self.bytes.get(v.clone()).unwrap_or_default(),
            )
        })
    }
}

/// The inverse of [`HeaderMap::parse`]; `None` when a length does not fit in `u32`.
pub fn serialize_map(pairs: &[(&str, &str)]) -> Option<Vec<u8>> {
    let len = |n: usize| u32::try_from(n).ok().map(u32::to_le_bytes);
    let size = pairs
        .iter()
        .fold(4, |acc, (k, v)| acc + 10 + k.len() + v.len());
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&len(pairs.len())?);
    for (k, v) in pairs {
        out.extend_from_slice(&len(k.len())?);
        out.extend_from_slice(&len(v.len())?);
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    Some(out)
}
