use serde_json::json;

use super::*;
use crate::budget::breaker::Sample;
use crate::cache::coalesce;
use crate::host::{MemoryMetrics, MemoryStore};
use crate::routing::health::{Ewma, Histogram, Load, ProbeRecord};
use crate::routing::{stateful, CallResult, CallSample, Health};

const SLOTS: u32 = 8;
/// Response ids of three slots, and the clusters that produced them.
const RESPONSES: [(&str, &str); 3] = [("resp_1", "a"), ("resp_2", "b"), ("resp_3", "c")];

fn config() -> Config {
    let cfg = json!({
        "cache": {"max_entries": SLOTS},
        "routing": {
            "models": {
                "m1": [{"cluster": "a"}, {"cluster": "b"}],
                "m2": [{"cluster": "b"}, {"cluster": "c", "model": "m2-large"}]
            },
            "hedge": {}
        }
    });
    Config::parse(cfg.to_string().as_bytes()).unwrap()
}

/// Writes every family through the code that writes it in the walk, with
/// far more cache keys than slots.
fn fill(store: &MemoryStore, config: &Config) {
    let cache = Store::new(store, &config.cache);
    cache.relayout().unwrap();
    cache.prepare().unwrap();
    for n in 0..=255u8 {
        let _ = coalesce::claim(&cache, &[n; 32], 1_000, 5_000, u64::from(n) + 1);
    }
    let _ = crate::host::lease::try_lease(store, probe::LEASE_KEY, 7, 1_000, 5_000);
    let mut m = crate::host::MemoryMetrics::default();
    crate::tokens::calibration::learn(store, &mut m, &config.names, "gpt-4o", 100, 120, 1_000)
        .unwrap();
    for c in ["a", "b", "c"] {
        let sample = CallSample {
            result: CallResult::Status(200),
            latency_ms: 100,
            ttft_ms: Some(10),
            streamed: false,
            output_tokens: None,
        };
        health::record_outcome(store, &config.routing, c, &sample, 1_000).unwrap();
        let load = Load {
            waiting: Some(1.0),
            kv_usage: Some(0.5),
        };
        health::record_probe(store, &config.routing, c, true, 5, Some(load), 1_000).unwrap();
        breaker::record(
            store,
            c,
            1_000,
            Sample::new(10, 100, false, 0),
            &config.budget,
        )
        .unwrap();
    }
    breaker::record(
        store,
        DEFAULT_BREAKER,
        1_000,
        Sample::new(10, 100, true, 1),
        &config.budget,
    )
    .unwrap();
    for m in ["m1", "m2"] {
        hedge::count_call(store, m, 1_000, config.budget.window_ms);
    }
    // Three stored Responses answers, each in a slot of its own.
    for (id, cluster) in RESPONSES {
        assert!(stateful::remember(store, id, cluster, 1_000));
    }
    let hook = br#"{"version":"4","alerts":[{"status":"firing","labels":{"severity":"warning"}}]}"#;
    let reports = crate::degrade::alerts::parse(hook, 1_000).unwrap();
    crate::degrade::alerts::apply(store, &config.degrade, &reports, 1_000).unwrap();
    // Every load record the index admits, and its index.
    let mut m = MemoryMetrics::default();
    for n in 0..load::MAX_UNKNOWN + 3 {
        load::started(store, &mut m, &config.names, &format!("model-{n}"), 1_000);
    }
    // And the configuration's: its models and clusters.
    for model in ["m1", "m2"] {
        load::started(store, &mut m, &config.names, model, 1_000);
    }
    for cluster in ["a", "b", "c"] {
        let call = crate::summary::CallSummary {
            cluster: Some(cluster),
            ..crate::summary::CallSummary::ended(crate::summary::End::Answered(200))
        };
        load::tried(store, &mut m, &config.names, &call);
    }
}

fn run(census: &mut Census, store: &MemoryStore, config: &Config, now_ms: u64) -> Footprint {
    for _ in 0..10_000 {
        if let Some(f) = census.step(store, config, now_ms, 4) {
            return f;
        }
    }
    panic!("the count never ended");
}

#[test]
fn the_count_matches_the_store() {
    let (config, store) = (config(), MemoryStore::new());
    fill(&store, &config);
    let f = run(&mut Census::new(&config), &store, &config, 0);
    assert_eq!(f.keys, store.len() as u64);
    assert_eq!(f.bytes, store.value_bytes() as u64);
    // Stats, layout, lease, alerts, the estimate's calibration, 3 health, 4 breakers, 2 hedge windows,
    // 8 markers, 8 slots, 3 Responses ids, the load records (64 unknown
    // models, the overflow, 2 routed models, 3 clusters) and their index.
    let load = load::MAX_UNKNOWN as u64 + 1 + 2 + 3 + 1;
    assert_eq!(f.keys, 5 + 3 + 4 + 2 + 2 * u64::from(SLOTS) + 3 + load);
    // The bound counts every slot of the Responses table, 3 taken here, and
    // a record for the rewritten `m2-large` and the clusters' overflow.
    assert_eq!(
        max_keys(&config),
        f.keys - 3 + u64::from(stateful::SLOTS) + 2
    );
}

#[test]
fn counts_are_spread_over_steps_and_spaced_out() {
    let (config, store) = (config(), MemoryStore::new());
    fill(&store, &config);
    let mut census = Census::new(&config);
    // 21 keys and the Responses table read (the 8 cache slots are not; the
    // load records at the end) at 4 a step: the count ends on the last.
    let steps = (21 + stateful::SLOTS).div_ceil(4);
    for _ in 0..steps - 1 {
        assert_eq!(census.step(&store, &config, 0, 4), None);
    }
    let f = census.step(&store, &config, 0, 4).unwrap();
    assert_eq!(census.step(&store, &config, INTERVAL_MS - 1, 100), None);
    let again = (0..100).find_map(|_| census.step(&store, &config, INTERVAL_MS, 100));
    assert_eq!(again, Some(f));
    let mut m = MemoryMetrics::default();
    f.set_gauges(&mut m);
    assert_eq!(m.gauges[metrics::SHARED_DATA_KEYS], f.keys as i64);
    assert_eq!(m.gauges[metrics::SHARED_DATA_BYTES], f.bytes as i64);
}

#[test]
fn an_empty_store_holds_nothing() {
    let (config, store) = (config(), MemoryStore::new());
    let f = run(&mut Census::new(&config), &store, &config, 0);
    // The prepared table's slots are counted from the configuration.
    assert_eq!(
        f,
        Footprint {
            keys: u64::from(SLOTS),
            bytes: 0
        }
    );
    // Nor does a shard, which keeps no table.
    for doc in [
        &br#"{"cache": {"enabled": false}}"#[..],
        br#"{"cache": {"mode": "shard", "max_entries": 8}}"#,
    ] {
        let off = Config::parse(doc).unwrap();
        assert_eq!(
            run(&mut Census::new(&off), &store, &off, 0),
            Footprint::default()
        );
        assert_eq!(
            max_keys(&off),
            max_keys(&Config::parse(br#"{"cache": {"enabled": false}}"#).unwrap())
        );
    }
}

/// The key bound of docs/design.md: `2 × max_entries + 3 × clusters +
/// models + names + 73`, and 4096 more with `routing.models`.
#[test]
fn the_documented_key_bound_holds() {
    let defaults = Config::parse(b"{}").unwrap();
    assert_eq!(max_keys(&defaults), 2 * 1024 + 73);
    assert_eq!(max_keys(&defaults), 2121);
    // 3 clusters, 2 routed models, 3 models named (`m2-large` too).
    let c = config();
    let (clusters, models, names) = (3, 2, 3);
    let bound = 2 * u64::from(SLOTS) + 3 * clusters + models + names + 73;
    assert_eq!(max_keys(&c), bound + u64::from(stateful::SLOTS));
}

/// The value-size bounds documented in the key-family table of docs/design.md.
#[test]
fn values_stay_within_the_documented_sizes() {
    let (config, store) = (config(), MemoryStore::new());
    fill(&store, &config);
    let size = |k: &str| store.get(k).unwrap().value.map_or(0, |v| v.len());
    let max_of = |prefix: &str| {
        store
            .keys()
            .iter()
            .filter(|k| k.starts_with(prefix))
            .map(|k| size(k))
            .max()
            .unwrap_or(0)
    };
    let ewma = Ewma {
        value: 1.0,
        at_ms: 1,
        weight: 1.0,
    };
    let histogram = Histogram {
        counts: Default::default(),
        sums: Default::default(),
        at_ms: 1,
    };
    let full = Health {
        latency: Some(ewma),
        ttft: Some(ewma),
        errors: Some(ewma),
        calls: Some(histogram),
        streams: Some(histogram),
        recovering_since_ms: Some(1),
        probe: Some(ProbeRecord {
            ok: true,
            at_ms: 1,
            latency_ms: 1,
        }),
        load: Some(Load {
            waiting: Some(1.0),
            kv_usage: Some(1.0),
        }),
        ..Health::default()
    };
    let sizes = [
        ("totals", size(STATS_KEY)),
        ("lease", size(probe::LEASE_KEY)),
        ("marker", max_of("llm_filter.cache.v1.inflight.")),
        ("health", max_of(health::KEY_PREFIX)),
        ("health, every field set", full.encode().unwrap().len()),
        ("breaker", max_of(breaker::KEY_PREFIX)),
        ("hedge", max_of(hedge::KEY_PREFIX)),
        ("response", max_of(stateful::KEY_PREFIX)),
    ];
    println!("{sizes:?}");
    let bound = |name: &str| match name {
        "totals" | "lease" => 16,
        "marker" => 64,
        "health" | "health, every field set" => 768,
        "breaker" => 256,
        "hedge" => 160,
        // The id and the cluster's name, and 10 bytes.
        "response" => 6 + 1 + 10,
        _ => 0,
    };
    for (name, size) in sizes {
        assert!(size > 0 && size <= bound(name), "{name}: {size} bytes");
    }
}

#[test]
fn the_semantic_index_is_counted_from_its_totals() {
    let cfg = json!({
        "cache": {"max_entries": SLOTS, "semantic": {
            "embeddings": {"cluster": "e", "model": "m"},
            "max_contexts": 4, "max_per_context": 2, "max_dimensions": 8
        }},
        "routing": {
            "models": {
                "m1": [{"cluster": "a"}, {"cluster": "b"}],
                "m2": [{"cluster": "b"}, {"cluster": "c", "model": "m2-large"}]
            },
            "hedge": {}
        }
    });
    let config = Config::parse(cfg.to_string().as_bytes()).unwrap();
    let Some(sem) = config.cache.semantic.as_ref() else {
        panic!()
    };
    let store = MemoryStore::new();
    fill(&store, &config);
    let index = semantic::Index::new(&store, sem);
    index.prepare().unwrap();
    for n in 0..=255u8 {
        let mut v = [0.1f32; 8];
        v[usize::from(n % 8)] = 1.0;
        let unit = crate::cache::semantic::vector::normalise(&v).unwrap();
        index
            .insert(&[n; 32], &[n; 32], &unit, 1_000, 100_000)
            .unwrap();
    }
    let f = run(&mut Census::new(&config), &store, &config, 0);
    assert_eq!(f.keys, store.len() as u64);
    assert_eq!(f.bytes, store.value_bytes() as u64);
    // As above: `m2-large` and the clusters' overflow have no record.
    assert_eq!(
        max_keys(&config),
        f.keys - 3 + u64::from(stateful::SLOTS) + 2
    );
    let totals = index.totals().unwrap();
    assert_eq!(totals.vectors, 4 * 2);
    // Each group slot within the bound of docs/design.md: 8 + per_context × (dims + 86).
    for i in 0..4 {
        let v = store
            .get(&semantic::store::group_key(i))
            .unwrap()
            .value
            .unwrap();
        assert!(v.len() as u64 <= 8 + 2 * (8 + 86), "{}", v.len());
    }
    assert_eq!(
        store
            .get(semantic::store::STATS_KEY)
            .unwrap()
            .value
            .unwrap()
            .len(),
        16
    );
}
