//! Calls that continue state one backend holds. An OpenAI Responses call
//! with `previous_response_id` continues a response the provider stored:
//! only the backend that produced it knows it. The walk remembers which
//! backend produced each response id as answers pass, and a call that names
//! one goes to that backend, never failed over or hedged to another.
//!
//! The memory is a fixed table of [`SLOTS`] keys in shared data, a slot per
//! id by its hash: shared data never evicts, so the table is its own bound.
//! A newer id takes the slot of an older one; an id whose slot was taken,
//! or that is older than [`TTL_MS`], is routed as any call (the provider then
//! says it does not know the id, as it would without the filter).

use sha2::{Digest, Sha256};

use crate::host::SharedStore;

/// Prefix of the table's keys; the slot number follows.
pub const KEY_PREFIX: &str = crate::keyspace::RESPONSE.key;
/// Slots of the table: the most response ids remembered at once.
pub const SLOTS: u32 = 4096;
/// How long an id is remembered: a conversation continued later than this
/// is routed afresh.
pub const TTL_MS: u64 = 24 * 3600 * 1000;
/// Longest response id remembered; a longer one is not.
pub const MAX_ID_BYTES: usize = 256;

/// One remembered response, as stored: when it expires (8 bytes, little
/// endian), the length of the cluster's name (2 bytes), the name, the id.
fn encode(id: &str, cluster: &str, expires_ms: u64) -> Option<Vec<u8>> {
    let name_len = u16::try_from(cluster.len()).ok()?;
    let mut out = Vec::with_capacity(10 + cluster.len() + id.len());
    out.extend_from_slice(&expires_ms.to_le_bytes());
    out.extend_from_slice(&name_len.to_le_bytes());
    out.extend_from_slice(cluster.as_bytes());
    out.extend_from_slice(id.as_bytes());
    Some(out)
}

/// The id, the cluster and the expiry a record holds; `None` for anything
/// that is not one.
fn decode(bytes: &[u8]) -> Option<(&str, &str, u64)> {
    let (expires, rest) = bytes.split_first_chunk::<8>()?;
    let (len, rest) = rest.split_first_chunk::<2>()?;
    let (cluster, id) = rest.split_at_checked(usize::from(u16::from_le_bytes(*len)))?;
    Some((
        std::str::from_utf8(id).ok()?,
        std::str::from_utf8(cluster).ok()?,
        u64::from_le_bytes(*expires),
    ))
}

/// The key of `id`'s slot.
pub fn key(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0u8; 4];
    first.copy_from_slice(digest.get(..4).unwrap_or(&[0; 4]));
    slot_key(u32::from_le_bytes(first) % SLOTS)
}

/// The key of slot `n`.
pub fn slot_key(n: u32) -> String {
    format!("{KEY_PREFIX}{n}")
}

/// Remembers that `cluster` produced the response `id`. A host error or a
/// record too large leaves nothing remembered: the call that continues it
/// is then routed as any other.
pub fn remember(store: &dyn SharedStore, id: &str, cluster: &str, now_ms: u64) -> bool {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return false;
    }
    encode(id, cluster, now_ms.saturating_add(TTL_MS))
        .is_some_and(|bytes| store.set(&key(id), &bytes, None).is_ok())
}

/// The cluster that produced the response `id`, while it is remembered.
pub fn holder(store: &dyn SharedStore, id: &str, now_ms: u64) -> Option<String> {
    let bytes = store.get(&key(id)).ok()?.value?;
    let (held, cluster, expires_ms) = decode(&bytes)?;
    (held == id && expires_ms > now_ms).then(|| cluster.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryStore;

    #[test]
    fn a_response_is_held_by_the_cluster_that_produced_it_until_it_expires() {
        let s = MemoryStore::new();
        assert_eq!(holder(&s, "resp_1", 0), None);
        assert!(remember(&s, "resp_1", "b", 1_000));
        assert_eq!(holder(&s, "resp_1", 2_000).as_deref(), Some("b"));
        assert_eq!(holder(&s, "resp_2", 2_000), None);
        assert_eq!(holder(&s, "resp_1", 1_000 + TTL_MS), None);
        assert!(!remember(&s, "", "b", 0));
        assert!(!remember(&s, &"x".repeat(MAX_ID_BYTES + 1), "b", 0));
    }

    #[test]
    fn the_table_never_holds_more_than_its_slots() {
        let s = MemoryStore::new();
        for i in 0..(SLOTS * 3) {
            remember(&s, &format!("resp_{i}"), "a", 0);
        }
        assert!(s.len() <= SLOTS as usize, "{}", s.len());
        // A slot taken by a newer id no longer answers for the older one.
        let last = format!("resp_{}", SLOTS * 3 - 1);
        assert_eq!(holder(&s, &last, 1).as_deref(), Some("a"));
    }

    #[test]
    fn a_slot_of_garbage_is_no_holder() {
        let s = MemoryStore::new();
        s.set(
            &key("resp_1"),
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff",
            None,
        )
        .unwrap();
        assert_eq!(holder(&s, "resp_1", 0), None);
    }
}
