use super::*;
use crate::cache::semantic::config::{RawEmbeddingsConfig, RawSemanticConfig};
use crate::cache::semantic::vector::normalise;
use crate::host::MemoryStore;

fn cfg(per_context: u32, contexts: u32) -> SemanticConfig {
    SemanticConfig::compile(RawSemanticConfig {
        embeddings: Some(RawEmbeddingsConfig {
            cluster: Some("emb".into()),
            model: Some("e".into()),
            ..RawEmbeddingsConfig::default()
        }),
        max_per_context: Some(per_context),
        max_contexts: Some(contexts),
        max_dimensions: Some(16),
        threshold: Some(0.9),
        ..RawSemanticConfig::default()
    })
    .unwrap()
}

#[test]
fn the_default_footprint_counts_every_record() {
    let c = SemanticConfig::compile(RawSemanticConfig {
        embeddings: Some(RawEmbeddingsConfig {
            cluster: Some("emb".into()),
            model: Some("e5".into()),
            ..RawEmbeddingsConfig::default()
        }),
        ..RawSemanticConfig::default()
    })
    .unwrap();
    // 64 groups of 256 vectors of 1536 int8 values and their records.
    assert_eq!(
        c.worst_case_bytes(),
        64 * (256 * (1536 + FIXED as u64) + 8 + GROUP_OVERHEAD_BYTES)
    );
}

fn key(n: u8) -> Key {
    let mut k = [n; 32];
    k[31] = 0xee;
    k
}

/// A unit vector along axis `i` of 8, tilted toward axis `j` by `t`.
fn axis(i: usize, j: usize, t: f32) -> Vec<f32> {
    let mut v = vec![0.0; 8];
    v[i] = 1.0;
    v[j] += t;
    normalise(&v).unwrap()
}

#[test]
fn finds_the_closest_fresh_vector_of_its_context_only() {
    let c = cfg(8, 4);
    let s = MemoryStore::new();
    let idx = Index::new(&s, &c);
    idx.prepare().unwrap();
    let (ctx, other_ctx) = (key(1), key(2));
    idx.insert(&ctx, &key(10), &axis(0, 1, 0.0), 0, 1_000)
        .unwrap();
    idx.insert(&ctx, &key(11), &axis(0, 1, 0.3), 0, 1_000)
        .unwrap();
    idx.insert(&ctx, &key(12), &axis(2, 1, 0.0), 0, 1_000)
        .unwrap();
    idx.insert(&other_ctx, &key(13), &axis(0, 1, 0.1), 0, 1_000)
        .unwrap();
    let m = idx.lookup(&ctx, &axis(0, 1, 0.1), 500);
    assert_eq!(m.scanned, 3);
    let keys: Vec<Key> = m.above.iter().map(|(_, k)| *k).collect();
    // cos(θ) of a tilt of 0.1 vs 0 is 0.995, vs 0.3 is 0.985; axis 2 is far.
    assert_eq!(keys, [key(10), key(11)]);
    assert!((m.best.unwrap() - 0.995).abs() < 0.003, "{:?}", m.best);
    assert!(m.above[0].0 >= m.above[1].0);
    // Nothing above the threshold: still a best similarity, no candidate.
    let far = idx.lookup(&ctx, &axis(5, 6, 0.0), 500);
    assert_eq!(far.above, []);
    assert!(far.best.unwrap() < 0.1);
    // Another context sees only its own.
    let m = idx.lookup(&other_ctx, &axis(0, 1, 0.1), 500);
    assert_eq!(m.scanned, 1);
    assert_eq!(m.above[0].1, key(13));
    // A context never stored finds nothing.
    assert_eq!(
        idx.lookup(&key(3), &axis(0, 1, 0.1), 500),
        Matches::default()
    );
}

#[test]
fn expired_vectors_never_match_and_make_room() {
    let c = cfg(2, 1);
    let s = MemoryStore::new();
    let idx = Index::new(&s, &c);
    let ctx = key(1);
    idx.insert(&ctx, &key(10), &axis(0, 1, 0.0), 0, 100)
        .unwrap();
    assert_eq!(idx.lookup(&ctx, &axis(0, 1, 0.0), 99).above.len(), 1);
    assert_eq!(idx.lookup(&ctx, &axis(0, 1, 0.0), 100), Matches::default());
    idx.insert(&ctx, &key(11), &axis(1, 0, 0.0), 50, 1_000)
        .unwrap();
    // Stored after the first expired: it is dropped, not counted an eviction.
    let added = idx
        .insert(&ctx, &key(12), &axis(2, 0, 0.0), 200, 1_000)
        .unwrap();
    assert!(!added.evicted);
    assert_eq!(added.totals.unwrap().vectors, 2);
}

#[test]
fn a_full_group_drops_the_vector_expiring_soonest() {
    let c = cfg(3, 1);
    let s = MemoryStore::new();
    let idx = Index::new(&s, &c);
    idx.prepare().unwrap();
    let ctx = key(1);
    for (n, exp) in [(10u8, 5_000u64), (11, 3_000), (12, 4_000)] {
        assert!(
            !idx.insert(&ctx, &key(n), &axis(usize::from(n - 10), 7, 0.0), 0, exp)
                .unwrap()
                .evicted
        );
    }
    // The same answer again replaces its record.
    let again = idx
        .insert(&ctx, &key(12), &axis(2, 7, 0.0), 1, 4_000)
        .unwrap();
    assert!(!again.evicted);
    assert_eq!(again.totals.unwrap().vectors, 3);
    let added = idx
        .insert(&ctx, &key(13), &axis(3, 7, 0.0), 1, 6_000)
        .unwrap();
    assert!(added.evicted);
    assert_eq!(added.totals.unwrap().vectors, 3);
    let gone = idx.lookup(&ctx, &axis(1, 7, 0.0), 2);
    assert!(gone.above.is_empty(), "key 11 expired soonest: {gone:?}");
    for n in [0usize, 2, 3] {
        assert_eq!(idx.lookup(&ctx, &axis(n, 7, 0.0), 2).above.len(), 1, "{n}");
    }
}

#[test]
fn memory_stays_bounded_under_churn() {
    let c = cfg(4, 2);
    let s = MemoryStore::new();
    let idx = Index::new(&s, &c);
    idx.prepare().unwrap();
    let keys_before = s.len();
    for i in 0..500u32 {
        let mut ctx = [0u8; 32];
        ctx[..4].copy_from_slice(&(i % 7).to_le_bytes());
        let mut exact = [0u8; 32];
        exact[..4].copy_from_slice(&i.to_le_bytes());
        let v: Vec<f32> = (0..16).map(|d| ((i * 31 + d) % 17) as f32 - 8.0).collect();
        let unit = normalise(&v).unwrap();
        idx.insert(&ctx, &exact, &unit, u64::from(i), u64::from(i) + 1_000_000)
            .unwrap();
    }
    assert_eq!(s.len(), keys_before, "no key beyond the table");
    let t = idx.totals().unwrap();
    assert_eq!(t.vectors, 8);
    let slots: u64 = (0..2)
        .map(|i| s.get(&group_key(i)).unwrap().value.unwrap().len() as u64)
        .sum();
    assert_eq!(t.bytes, slots);
    assert!(slots <= 2 * c.max_group_bytes());
}

#[test]
fn refuses_vectors_longer_than_configured() {
    let c = cfg(4, 1);
    let s = MemoryStore::new();
    let idx = Index::new(&s, &c);
    let long = normalise(&[1.0; 17]).unwrap();
    assert!(idx.insert(&key(1), &key(2), &long, 0, 10).is_err());
    assert!(idx.insert(&key(1), &key(2), &[], 0, 10).is_err());
    assert!(s.get(&group_key(0)).unwrap().value.is_none());
}

#[test]
fn corrupt_slots_read_as_empty_and_never_panic() {
    let c = cfg(4, 1);
    let s = MemoryStore::new();
    let idx = Index::new(&s, &c);
    let ctx = key(1);
    idx.insert(&ctx, &key(10), &axis(0, 1, 0.0), 0, 1_000)
        .unwrap();
    idx.insert(&ctx, &key(11), &axis(1, 0, 0.0), 0, 1_000)
        .unwrap();
    let good = s.get(&group_key(0)).unwrap().value.unwrap();
    for cut in 0..good.len() {
        let m = scan(&good[..cut], &ctx, &axis(0, 1, 0.0), 0.9, 0);
        assert!(m.scanned <= 1, "cut {cut}");
    }
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0x5a;
        let _ = scan(&b, &ctx, &axis(0, 1, 0.0), 0.9, 0);
    }
    // Another format is empty, and the next insert starts it afresh.
    let mut other = good.clone();
    other[0] = 9;
    s.set(&group_key(0), &other, None).unwrap();
    assert_eq!(idx.lookup(&ctx, &axis(0, 1, 0.0), 0), Matches::default());
    idx.insert(&ctx, &key(12), &axis(2, 1, 0.0), 0, 1_000)
        .unwrap();
    assert_eq!(idx.lookup(&ctx, &axis(2, 1, 0.0), 0).scanned, 1);
}
