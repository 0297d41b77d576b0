//! The filter's shared data stays within the bounds docs/design.md documents
//! however many distinct cache keys, tenants, models and cluster names the
//! clients send: the `llm_filter_shared_data_keys` and `_bytes` gauges,
//! counted by the filter itself, never pass them, and count every family,
//! the limits' records too.

use std::time::{Duration, Instant};

use llm_filter_e2e::{
    post_json, skip_without_envoy, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::json;

use crate::support::cache::{cacheable, FILTER_STATS};

const SLOTS: u64 = 8;
const MAX_ENTRY_BYTES: u64 = 4096;
const CLUSTER_HEADER: &str = "x-llm-cluster";
/// Distinct cache keys, tenants and made-up model and cluster names sent.
const CALLS: u64 = 160;

/// The bounds of docs/design.md for this configuration: two routed clusters, two
/// routed models with hedging on.
const CLUSTERS: u64 = 2;
const MODELS: u64 = 2;
/// The load records: 64 for names the configuration does not give, one for
/// each it does (`m1`, `m2`, `m2-on-b`, clusters `a` and `b`), the two
/// overflow records; and their index.
const LOAD_RECORDS: u64 = 64 + 3 + 2 + 2;
const LOAD_KEYS: u64 = LOAD_RECORDS + 1;
const LOAD_BYTES: u64 = LOAD_RECORDS * 212 + 8 + LOAD_RECORDS * (8 + 27 + 64);
/// The active alerts (none are sent here).
const ALERT_KEYS: u64 = 1;
/// Records of the one limits rule (by tenant): more than the tenants sent,
/// so each tenant holds one of its own.
const LIMIT_KEYS: u64 = 1024;
/// A limits record of one limit: about 40 bytes and 24 per limit.
const LIMIT_RECORD_BYTES: u64 = 40 + 24;
const MAX_KEYS: u64 = 2 * SLOTS + 2 * CLUSTERS + MODELS + 4 + LOAD_KEYS + ALERT_KEYS + LIMIT_KEYS;
const MAX_BYTES: u64 = SLOTS * MAX_ENTRY_BYTES
    + SLOTS * 52
    + 16
    + 4
    + 16
    + (CLUSTERS + 1) * (952 + 208)
    + MODELS * 160
    + LOAD_BYTES
    + LIMIT_KEYS * LIMIT_RECORD_BYTES;

/// The least a count after the churn finds: the cache's slots, totals and
/// markers, both clusters' health and breakers, and a limits record for each
/// tenant: more than every other family here can hold, so a census that
/// missed the limits' records never reaches it.
const AFTER: u64 = SLOTS + 1 + 1 + 2 * CLUSTERS + CALLS;
const _: () = assert!(AFTER > MAX_KEYS - LIMIT_KEYS);

fn stat(envoy: &Envoy, name: &str) -> Option<u64> {
    envoy.stat_opt(&format!("{FILTER_STATS}{name}"))
}

#[tokio::test]
async fn churn_beyond_every_bound_leaves_shared_data_bounded() {
    if skip_without_envoy("churn_beyond_every_bound_leaves_shared_data_bounded") {
        return;
    }
    let default = MockUpstream::start(MockConfig::named("up"));
    let a = MockUpstream::start(MockConfig::named("a"));
    let b = MockUpstream::start(MockConfig::named("b"));
    let config = json!({
        "cache": {"max_entries": SLOTS, "max_entry_bytes": MAX_ENTRY_BYTES},
        "routing": {
            "models": {
                "m1": [{"cluster": "a"}, {"cluster": "b"}],
                "m2": [{"cluster": "b", "model": "m2-on-b"}]
            },
            "probe_interval_s": 1,
            "hedge": {}
        },
        "limits": {"max_keys": LIMIT_KEYS, "rules": [
            {"name": "tenants", "by": ["tenant"], "requests_per_minute": 10 * CALLS}
        ]}
    });
    let envoy = EnvoyBuilder::new()
        .plugin_config(&config)
        .concurrency(2)
        .upstream(default.name(), default.port())
        .upstream(a.name(), a.port())
        .upstream(b.name(), b.port())
        .header_route(CLUSTER_HEADER)
        .start()
        .expect("envoy with the filter and routing");
    let url = envoy.url("/v1/chat/completions");

    let mut worst = (0, 0);
    let mut observe = |envoy: &Envoy| {
        let keys = stat(envoy, "llm_filter_shared_data_keys").unwrap_or(0);
        let bytes = stat(envoy, "llm_filter_shared_data_bytes").unwrap_or(0);
        assert!(keys <= MAX_KEYS, "{keys} keys, bound {MAX_KEYS}");
        assert!(bytes <= MAX_BYTES, "{bytes} bytes, bound {MAX_BYTES}");
        worst = (worst.0.max(keys), worst.1.max(bytes));
        (keys, bytes)
    };

    // Every call a new cache key and tenant; the model a routed one, or one
    // never configured; a cluster header the client made up.
    for n in 0..CALLS {
        let mut body = cacheable(&format!("question number {n}"));
        body["model"] = json!(match n % 3 {
            0 => "m1".to_string(),
            1 => "m2".to_string(),
            _ => format!("made-up-model-{n}"),
        });
        let tenant = format!("Bearer sk-tenant-{n}");
        let cluster = format!("cluster-{n}");
        let r = post_json(
            &url,
            &body,
            &[
                ("authorization", tenant.as_str()),
                (CLUSTER_HEADER, cluster.as_str()),
            ],
        )
        .await
        .expect("call");
        assert_eq!(r.status, 200, "call {n}: {}", r.text());
        if n % 20 == 0 {
            observe(&envoy);
        }
    }
    let stored = stat(&envoy, "llm_filter_cache_stores_totalresult=.=stored;.;").unwrap_or(0);
    assert!(stored > SLOTS, "{stored} answers stored");

    // A count that started after the churn.
    let after = AFTER;
    let deadline = Instant::now() + Duration::from_secs(25);
    let (keys, bytes) = loop {
        let (keys, bytes) = observe(&envoy);
        if keys >= after || Instant::now() > deadline {
            break (keys, bytes);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(keys >= after, "{keys} keys counted after the churn");
    assert!(bytes > 0);
    println!(
        "{CALLS} distinct keys/tenants/cluster names: {keys} keys and {bytes} bytes \
         (worst seen {worst:?}), bounds {MAX_KEYS} keys and {MAX_BYTES} bytes"
    );
    // No host call failed with a status the SDK would have trapped on.
    let stats = envoy.stats().expect("stats");
    let host_errors: Vec<_> = stats
        .keys()
        .filter(|k| k.contains("internal_errors_total.reason=host_"))
        .collect();
    assert!(host_errors.is_empty(), "{host_errors:?}");
}
