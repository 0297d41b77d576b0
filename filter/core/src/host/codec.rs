//! The one encoding of the filter's records in shared data: bincode with
//! fixed-width little-endian integers, and a bound on the bytes a record may
//! take. Another filter (or an older build) may have written any key, so
//! nothing read is trusted: bytes past the bound are refused unread, and
//! bincode reading from a slice refuses a length prefix longer than what is
//! left of it (bincode skips its own limit then), so a corrupt length cannot
//! make the decoder allocate more than the record's bytes.

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The most bytes one record other than the cache's may take, encoded or
/// decoded: far above the largest (the active alerts at their bound, about
/// 83 KB), far below what would hurt a worker.
pub const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// The options every record is encoded with, bounded at `limit` bytes. The
/// cache's entries use them with their own limit.
pub fn options(limit: u64) -> impl Options + Copy {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(limit)
}

/// A record's bytes; `None` past [`MAX_RECORD_BYTES`].
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Option<Vec<u8>> {
    options(MAX_RECORD_BYTES)
        .allow_trailing_bytes()
        .serialize(value)
        .ok()
}

/// The record `bytes` hold; `None` for anything that is not one, or that
/// would take more than [`MAX_RECORD_BYTES`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    if u64::try_from(bytes.len()).map_or(true, |n| n > MAX_RECORD_BYTES) {
        return None;
    }
    options(MAX_RECORD_BYTES)
        .allow_trailing_bytes()
        .deserialize(bytes)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_the_encoding_they_had() {
        // What the records were written with before: bincode 1.3's legacy
        // functions (fixed-width, little-endian, trailing bytes allowed).
        let legacy = |v: &(u64, String, Vec<u32>)| bincode::serialize(v).unwrap();
        let v = (7u64, "gpt-4o".to_string(), vec![1u32, 2, 3]);
        assert_eq!(encode(&v), Some(legacy(&v)));
        let mut bytes = legacy(&v);
        bytes.push(0);
        assert_eq!(decode::<(u64, String, Vec<u32>)>(&bytes), Some(v));
    }

    #[test]
    fn a_length_past_the_limit_is_refused_not_allocated() {
        // A string claiming `MAX_RECORD_BYTES + 1` bytes, with them all there,
        // and one claiming far more than it holds.
        let len = MAX_RECORD_BYTES + 1;
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.resize(8 + len as usize, b'a');
        assert_eq!(decode::<String>(&bytes), None);
        let mut lying = u64::MAX.to_le_bytes().to_vec();
        lying.extend_from_slice(b"abc");
        assert_eq!(decode::<String>(&lying), None);
        assert_eq!(decode::<Vec<u64>>(&lying), None);
        let within = "a".repeat(MAX_RECORD_BYTES as usize - 8);
        assert_eq!(decode::<String>(&encode(&within).unwrap()), Some(within));
        assert_eq!(encode(&"a".repeat(MAX_RECORD_BYTES as usize)), None);
    }
}
