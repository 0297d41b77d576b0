use serde_json::json;

use super::census::{counted, max_keys, plan, publish, Counted};
use super::*;
use crate::budget::breaker::Sample;
use crate::budget::{breaker, DEFAULT_BREAKER};
use crate::cache::coalesce;
use crate::cache::store::{marker_key, STATS_KEY};
use crate::cache::{semantic, Store};
use crate::config::Config;
use crate::degrade::sources;
use crate::host::footprint::Footprint;
use crate::host::footprint::{Census, INTERVAL_MS};
use crate::host::SharedStore;
use crate::host::{MemoryMetrics, MemoryStore};
use crate::limits;
use crate::priority::Priority;
use crate::routing::health::{Ewma, Histogram, Load, ProbeRecord};
use crate::routing::{health, hedge, probe};
use crate::routing::{stateful, CallResult, CallSample, Health};
use crate::{load, metrics};

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
        },
        "limits": {"max_keys": LIMIT_SLOTS, "rules": [
            {"name": "team", "by": ["tenant"], "requests_per_minute": 100},
            {"name": "per-model", "by": ["model"], "requests_per_minute": 100}
        ]}
    });
    Config::parse(cfg.to_string().as_bytes()).unwrap()
}

/// Records of each limits rule.
const LIMIT_SLOTS: u32 = 4;

/// A store that notes every key no family names.
fn checked() -> MemoryStore {
    MemoryStore::checked(is_named)
}

/// Every limits record of every rule held: far more tenants than records.
fn fill_limits(store: &MemoryStore, config: &Config) {
    let mut m = MemoryMetrics::default();
    for n in 0..64 {
        let tenant = format!("tenant-{n}");
        let ask = limits::Ask {
            priority: Priority::P1,
            model: Some("m1"),
            tenant: Some(&tenant),
            tenant_label: &tenant,
            user: None,
            prompt_tokens: 10,
            max_tokens: Some(10),
            now_ms: 1_000,
        };
        let _ = limits::admit(store, &config.limits, &mut m, &ask);
    }
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
    fill_limits(store, config);
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
        let tried = crate::summary::Try {
            cluster: Some(cluster),
            ..crate::summary::Try::ended(crate::summary::End::Answered(200))
        };
        load::tried(store, &mut m, &config.names, &tried);
    }
}

fn run(
    census: &mut Census<Config>,
    store: &MemoryStore,
    config: &Config,
    now_ms: u64,
) -> Footprint {
    for _ in 0..10_000 {
        if let Some(f) = census.step(store, config, now_ms, 4) {
            return f;
        }
    }
    panic!("the count never ended");
}

#[test]
fn every_family_is_named_once_in_the_versioned_scheme() {
    let mut keys: Vec<&str> = FAMILIES.iter().map(|f| f.key).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), FAMILIES.len(), "a key named twice");
    for f in FAMILIES {
        let scheme = format!("llm_filter.{}.v{}.", f.area, f.version);
        assert!(f.key.starts_with(&scheme), "{}: not {scheme}…", f.key);
        // A key of the family is found in it, and in no other.
        let sample = match f.rest {
            None => f.key.to_string(),
            Some(_) => f.at("x.1"),
        };
        let holders: Vec<_> = FAMILIES.iter().filter(|g| g.holds(&sample)).collect();
        assert_eq!(holders.len(), 1, "{sample}: {holders:?}");
        assert_eq!(family_of(&sample).map(|g| g.key), Some(f.key));
        if let Some(Counted::With(key)) = counted(f) {
            assert!(
                FAMILIES
                    .iter()
                    .any(|g| g.key == key && matches!(counted(g), Some(Counted::Owner { .. }))),
                "{}: counted with {key}, which counts nothing",
                f.key
            );
        }
    }
    // A family's bare prefix is no key of it, nor is a key of an old layout.
    assert!(!is_named(CACHE_SLOT.key));
    assert!(!is_named("llm_filter/limits/team/1"));
    assert!(!is_named("llm_filter.degrade.v1.alerts"));
    assert!(!is_named("llm_filter.cache.v2.slot.1"));
}

#[test]
fn the_owners_build_their_keys_from_the_registry() {
    let named = [
        marker_key(3),
        crate::cache::store::slot_key(3),
        crate::cache::semantic::store::group_key(3),
        health::key("a"),
        breaker::key("a"),
        breaker::key(&"long".repeat(100)),
        stateful::key("resp_1"),
        load::Scope::Model("m").key(),
        load::Scope::Cluster("c").key(),
        limits::store::record_key("team", 7),
        STATS_KEY.to_string(),
        sources::ALERTMANAGER_LEASE_KEY.to_string(),
    ];
    for k in &named {
        assert!(is_named(k), "{k}");
    }
    assert_eq!(
        limits::store::record_key("team", 7),
        "llm_filter.limits.v1.team.7"
    );
}

#[test]
fn a_checked_store_notes_keys_of_no_family() {
    let store = checked();
    store.set("llm_filter/limits/team/1", b"x", None).unwrap();
    store.set(ALERTS.key, b"x", None).unwrap();
    store.set("someone.else", b"x", None).unwrap();
    assert_eq!(
        store.unnamed(),
        vec![
            "llm_filter/limits/team/1".to_string(),
            "someone.else".to_string()
        ]
    );
    // The writes themselves went ahead, as Envoy's would.
    assert_eq!(store.len(), 3);
}

/// The largest value of any family, the alert table at its bound (every
/// label at its longest), fits the shared-data codec with room to spare.
#[test]
fn the_largest_record_fits_the_codec() {
    use crate::degrade::alerts::{MAX_ALERTS, MAX_LABEL_LEN};
    use crate::host::codec::{encode, MAX_RECORD_BYTES};
    let label = "a".repeat(MAX_LABEL_LEN);
    let labels: [Option<String>; 4] = std::array::from_fn(|_| Some(label.clone()));
    let alert = (label.clone(), labels, u64::MAX);
    let table = vec![alert; MAX_ALERTS];
    let bytes = encode(&table).unwrap();
    assert!(
        bytes.len() as u64 <= MAX_RECORD_BYTES / 2,
        "{}",
        bytes.len()
    );
}

/// The store as every feature fills it: the full build's count and bounds.
#[cfg(feature = "full")]
mod every_feature {
    use super::*;

    #[test]
    fn the_count_matches_the_store() {
        let (config, store) = (config(), checked());
        fill(&store, &config);
        let f = run(&mut Census::new(plan(&config)), &store, &config, 0);
        assert_eq!(f.keys, store.len() as u64);
        assert_eq!(f.bytes, store.value_bytes() as u64);
        assert_eq!(store.unnamed(), Vec::<String>::new());
        // Stats, layout, lease, alerts, the estimate's calibration, 3 health, 4 breakers, 2 hedge windows,
        // 8 markers, 8 slots, 3 Responses ids, the load records (64 unknown
        // models, the overflow, 2 routed models, 3 clusters) and their index,
        // 4 records of the tenants' rule and 1 of the model's.
        let load = load::MAX_UNKNOWN as u64 + 1 + 2 + 3 + 1;
        let limits = u64::from(LIMIT_SLOTS) + 1;
        assert_eq!(
            f.keys,
            5 + 3 + 4 + 2 + 2 * u64::from(SLOTS) + 3 + load + limits
        );
        // The bound counts every slot of the Responses table, 3 taken here, a
        // record for the rewritten `m2-large` and the clusters' overflow, and
        // every record of the model's rule, 1 taken.
        assert_eq!(
            max_keys(&config),
            f.keys - 3 + u64::from(stateful::SLOTS) + 2 + u64::from(LIMIT_SLOTS) - 1
        );
    }

    #[test]
    fn counts_are_spread_over_steps_and_spaced_out() {
        let (config, store) = (config(), checked());
        fill(&store, &config);
        let mut census = Census::new(plan(&config));
        // 21 keys, the Responses table and both rules' limits records read (the 8
        // cache slots are not; the load records at the end) at 4 a step: the
        // count ends on the last.
        let steps = (21 + stateful::SLOTS + 2 * LIMIT_SLOTS).div_ceil(4);
        for _ in 0..steps - 1 {
            assert_eq!(census.step(&store, &config, 0, 4), None);
        }
        let f = census.step(&store, &config, 0, 4).unwrap();
        assert_eq!(census.step(&store, &config, INTERVAL_MS - 1, 100), None);
        let again = (0..100).find_map(|_| census.step(&store, &config, INTERVAL_MS, 100));
        assert_eq!(again, Some(f));
        let mut m = MemoryMetrics::default();
        publish(&f, &mut m);
        assert_eq!(m.gauges[metrics::SHARED_DATA_KEYS], f.keys as i64);
        assert_eq!(m.gauges[metrics::SHARED_DATA_BYTES], f.bytes as i64);
    }

    #[test]
    fn an_empty_store_holds_nothing() {
        let (config, store) = (config(), checked());
        let f = run(&mut Census::new(plan(&config)), &store, &config, 0);
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
                run(&mut Census::new(plan(&off)), &store, &off, 0),
                Footprint::default()
            );
            assert_eq!(
                max_keys(&off),
                max_keys(&Config::parse(br#"{"cache": {"enabled": false}}"#).unwrap())
            );
        }
    }

    /// The key bound of docs/design.md: `2 × max_entries + 3 × clusters +
    /// models + names + 73`, 4096 more with `routing.models`, and
    /// `limits.max_keys` per limits rule.
    #[test]
    fn the_documented_key_bound_holds() {
        let defaults = Config::parse(b"{}").unwrap();
        assert_eq!(max_keys(&defaults), 2 * 1024 + 73);
        assert_eq!(max_keys(&defaults), 2121);
        // 3 clusters, 2 routed models, 3 models named (`m2-large` too).
        let c = config();
        let (clusters, models, names) = (3, 2, 3);
        let bound = 2 * u64::from(SLOTS) + 3 * clusters + models + names + 73;
        let limits = 2 * u64::from(LIMIT_SLOTS);
        assert_eq!(max_keys(&c), bound + u64::from(stateful::SLOTS) + limits);
    }

    /// The value-size bounds documented in the key-family table of docs/design.md.
    #[test]
    fn values_stay_within_the_documented_sizes() {
        let (config, store) = (config(), checked());
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
            ("limits", max_of(LIMITS.key)),
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
            // docs/configuration.md's `limits.max_keys`: about 40 bytes and 24
            // per limit (one here).
            "limits" => 40 + 24,
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
        let store = checked();
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
        let f = run(&mut Census::new(plan(&config)), &store, &config, 0);
        assert_eq!(f.keys, store.len() as u64);
        assert_eq!(f.bytes, store.value_bytes() as u64);
        assert_eq!(store.unnamed(), Vec::<String>::new());
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

    #[test]
    fn limits_records_are_counted_and_bounded() {
        let config = config();
        let store = checked();
        fill_limits(&store, &config);
        let written = store.keys().iter().filter(|k| LIMITS.holds(k)).count() as u64;
        // 64 tenants in the tenants' rule's 4 records, one model in the other's.
        assert_eq!(written, u64::from(LIMIT_SLOTS) + 1);
        let f = run(&mut Census::new(plan(&config)), &store, &config, 0);
        // And the cache's slots, counted from the configuration (none written).
        assert_eq!(f.keys, written + u64::from(SLOTS));
        assert_eq!(f.bytes, store.value_bytes() as u64);
        assert_eq!(store.unnamed(), Vec::<String>::new());
        assert_eq!(
            counted(&LIMITS).unwrap().max_keys(&config),
            2 * u64::from(LIMIT_SLOTS)
        );
    }
}
