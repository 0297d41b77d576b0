//! The mesh-scale cache (`cache.mode: shard`): a front Envoy whose filter
//! only keys the call, hashing (`RING_HASH` on the shard header) onto three
//! gateway Envoys, each its own process and so its own shared data, whose
//! filters cache in `local` mode, in front of one mock provider.
//!
//! What it shows: one upstream call per key for the whole tier (round-robin
//! pays once per key and gateway); a gateway lost mid-run costs no client
//! error and re-fetches only its own keys; a forged shard header reads and
//! fills nothing of another key.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use llm_filter_core::cache::{self, CacheConfig, CacheRequest, Decision};
use llm_filter_core::dialect::Dialect;
use llm_filter_core::json::Json;
use llm_filter_e2e::{
    post_json, skip_without_envoy, Envoy, EnvoyBuilder, HttpResponse, MockConfig, MockUpstream,
    RecordedRequest,
};
use serde_json::{json, Value};

use crate::support::cache::{cacheable, eventually, message, x_cache, CHAT, FILTER_STATS};

const SHARD_HEADER: &str = "x-llm-cache-key";
/// Which gateway sent a request on to the provider (added by each gateway).
const GATEWAY_HEADER: &str = "x-gateway";
const TENANT: &str = "Bearer tenant-1";
const GATEWAYS: usize = 3;
/// Distinct prompts, and how often each is asked. Not a multiple of the
/// gateway count, so round-robin does not happen to keep each key on one.
const KEYS: usize = 10;
const ROUNDS: usize = 6;

/// The front's route: hash on the shard header; a retry goes to another
/// host (the next on the ring) when a gateway refuses or resets.
const FRONT_ROUTE: &str = r#"hash_policy:
- header: {header_name: x-llm-cache-key}
retry_policy:
  retry_on: connect-failure,reset,refused-stream,unavailable
  num_retries: 2
  retry_host_predicate:
  - name: envoy.retry_host_predicates.previous_hosts
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
  host_selection_retry_max_attempts: 3
"#;

/// How the front spreads calls over the gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Balance {
    /// `RING_HASH` on the shard header.
    RingHash,
    /// `MAGLEV` on the shard header.
    Maglev,
    /// `ROUND_ROBIN`, the shard header unused.
    RoundRobin,
}

/// The gateway cluster after its `lb_policy`: a replica that fails its
/// health check or keeps failing calls leaves the table, and its keys move
/// to other replicas.
const HASHED_CLUSTER: &str = r#"health_checks:
- timeout: 1s
  interval: 1s
  unhealthy_threshold: 1
  healthy_threshold: 1
  tcp_health_check: {}
outlier_detection:
  consecutive_5xx: 2
  interval: 1s
  base_ejection_time: 30s
  max_ejection_percent: 50
"#;

struct Tier {
    mock: MockUpstream,
    front: Envoy,
    gateways: Vec<Envoy>,
}

impl Tier {
    /// `None` (skipped) without Envoy.
    fn start(test: &str, balance: Balance) -> Option<Self> {
        if skip_without_envoy(test) {
            return None;
        }
        let mock = MockUpstream::start(MockConfig::named("provider"));
        let gateways: Vec<Envoy> = (0..GATEWAYS)
            .map(|i| {
                EnvoyBuilder::new()
                    .concurrency(1)
                    .plugin_config(json!({"cache": {"mode": "local", "ttl_jitter": 0}}))
                    .upstream("provider", mock.port())
                    .virtual_host_yaml(&format!(
                        "request_headers_to_add:\n- header: {{key: {GATEWAY_HEADER}, value: gw{i}}}"
                    ))
                    .start()
                    .unwrap_or_else(|e| panic!("gateway {i}: {e:#}"))
            })
            .collect();
        let ports: Vec<u16> = gateways.iter().map(Envoy::port).collect();
        let (cluster, route) = match balance {
            Balance::RingHash => (
                format!("lb_policy: RING_HASH\n{HASHED_CLUSTER}"),
                FRONT_ROUTE,
            ),
            Balance::Maglev => (format!("lb_policy: MAGLEV\n{HASHED_CLUSTER}"), FRONT_ROUTE),
            Balance::RoundRobin => ("lb_policy: ROUND_ROBIN\n".to_string(), ""),
        };
        let front = EnvoyBuilder::new()
            .concurrency(1)
            .plugin_config(json!({"cache": {"mode": "shard"}}))
            .upstream_pool("gateways", &ports, &cluster)
            .extra_route_yaml(route)
            .start()
            .unwrap_or_else(|e| panic!("front: {e:#}"));
        Some(Self {
            mock,
            front,
            gateways,
        })
    }

    async fn ask(&self, envoy: &Envoy, body: &Value, headers: &[(&str, &str)]) -> HttpResponse {
        post_json(&envoy.url(CHAT), body, headers)
            .await
            .unwrap_or_else(|e| panic!("call: {e:#}"))
    }

    /// A call through the front as tenant 1, answered with its own prompt.
    async fn call(&self, prompt: &str) -> HttpResponse {
        let r = self
            .ask(
                &self.front,
                &cacheable(prompt),
                &[("authorization", TENANT)],
            )
            .await;
        assert_eq!(r.status, 200, "{prompt}: {}", r.text());
        assert!(
            message(&r).contains(prompt),
            "{prompt} answered with another's entry: {}",
            message(&r)
        );
        r
    }

    /// `ROUNDS` rounds over `KEYS` prompts; the hit ratio (HIT or COALESCED).
    async fn workload(&self, prompts: &[String]) -> f64 {
        let mut hits = 0;
        for _ in 0..ROUNDS {
            for p in prompts {
                let r = self.call(p).await;
                hits += usize::from(matches!(x_cache(&r), "HIT" | "COALESCED"));
            }
        }
        hits as f64 / (ROUNDS * prompts.len()) as f64
    }

    /// The provider's requests by prompt: which gateways fetched it.
    fn fetches(&self) -> BTreeMap<String, Vec<String>> {
        by_prompt(&self.mock.requests())
    }

    fn shard_keys(envoy: &Envoy, result: &str) -> u64 {
        envoy.stat(&format!(
            "{FILTER_STATS}llm_filter_cache_shard_keys_totalresult=.={result};.;"
        ))
    }

    fn wait_shard_keys(envoy: &Envoy, result: &str, at_least: u64) -> u64 {
        envoy.wait_for_stat(
            &format!("{FILTER_STATS}llm_filter_cache_shard_keys_totalresult=.={result};.;"),
            at_least,
            Duration::from_secs(5),
        )
    }
}

fn by_prompt(requests: &[RecordedRequest]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in requests {
        let prompt = r
            .json()
            .and_then(|b| b["messages"][0]["content"].as_str().map(str::to_string))
            .unwrap_or_default();
        let gateway = r.header(GATEWAY_HEADER).unwrap_or("?").to_string();
        out.entry(prompt).or_default().push(gateway);
    }
    out
}

fn prompts(tag: &str) -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("{tag} question number {i}"))
        .collect()
}

/// The cache key of a chat call of `prompt` by `tenant`, in hex, from the
/// filter's own code.
fn key_hex(prompt: &str, tenant: &str) -> String {
    let body = serde_json::to_vec(&cacheable(prompt)).unwrap();
    let tree = Json::parse(&body);
    let req = CacheRequest {
        dialect: Dialect::Chat,
        path: CHAT,
        body: tree.as_ref(),
        cache_control: None,
        credentials: &[Some(tenant), None],
    };
    match cache::decide(&CacheConfig::compile(Default::default()).unwrap(), &req) {
        Decision::Cacheable(c) => cache::key_hex(&c.key),
        d => panic!("{d:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashing_answers_each_key_once_for_the_tier_and_round_robin_does_not() {
    let Some(hashed) = Tier::start("hashing_answers_each_key_once", Balance::RingHash) else {
        return;
    };
    let keys = prompts("hashed");
    let ratio = hashed.workload(&keys).await;
    let calls = (KEYS * ROUNDS) as u64;
    // One upstream call per key, made by the gateway that owns it.
    let fetches = hashed.fetches();
    assert_eq!(fetches.len(), KEYS, "{fetches:?}");
    assert!(fetches.values().all(|g| g.len() == 1), "{fetches:?}");
    let owners: BTreeSet<&String> = fetches.values().flatten().collect();
    assert!(
        owners.len() > 1,
        "the keys spread over the gateways: {fetches:?}"
    );
    // The front wrote a key on every call; the gateways found it theirs.
    assert_eq!(
        Tier::wait_shard_keys(&hashed.front, "written", calls),
        calls
    );
    // As Prometheus reads it, with its label.
    let written = hashed.front.metric(
        "llm_filter_cache_shard_keys_total",
        &[("result", "written")],
    );
    assert_eq!(written, calls as f64);
    let sum = |result: &str| -> u64 {
        hashed
            .gateways
            .iter()
            .map(|g| Tier::shard_keys(g, result))
            .sum()
    };
    // Counters move when each gateway logs its stream.
    eventually(Duration::from_secs(5), || sum("matched") >= calls);
    let (matched, mismatched) = (sum("matched"), sum("mismatched"));
    assert_eq!((matched, mismatched), (calls, 0));
    // The provider never sees the header.
    let requests = hashed.mock.requests();
    assert!(requests.iter().all(|r| r.header(SHARD_HEADER).is_none()));
    assert_eq!(ratio, 1.0 - 1.0 / ROUNDS as f64);
    drop(hashed);

    let Some(spread) = Tier::start("round_robin", Balance::RoundRobin) else {
        return;
    };
    let rr_ratio = spread.workload(&prompts("spread")).await;
    let rr_upstream = spread.mock.request_count();
    eprintln!(
        "shard tier, {KEYS} keys x {ROUNDS} rounds over {GATEWAYS} gateways: \
         ring hash hit ratio {ratio:.3} ({KEYS} upstream calls), \
         round-robin hit ratio {rr_ratio:.3} ({rr_upstream} upstream calls)"
    );
    // Round-robin misses once per key and gateway it lands on.
    assert!(rr_upstream > KEYS, "{rr_upstream}");
    assert!(rr_ratio < ratio, "{rr_ratio} vs {ratio}");
}

/// With `MAGLEV`: Envoy's ring hash gives each host `minimum_ring_size / N`
/// points, so a ring of fewer hosts also moves keys between the survivors;
/// Maglev's table moves (almost) only the lost host's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_lost_mid_run_costs_no_error_and_moves_only_its_keys() {
    let Some(mut tier) = Tier::start("a_gateway_lost_mid_run", Balance::Maglev) else {
        return;
    };
    let keys = prompts("failover");
    for p in &keys {
        tier.call(p).await;
    }
    let owners = tier.fetches();
    // Lose the gateway that owns the most keys, in the middle of a round.
    let mut per_gateway: BTreeMap<String, usize> = BTreeMap::new();
    for g in owners.values().flatten() {
        *per_gateway.entry(g.clone()).or_default() += 1;
    }
    let (lost, _) = per_gateway.iter().max_by_key(|(_, n)| **n).unwrap();
    let lost = lost.clone();
    let index: usize = lost.trim_start_matches("gw").parse().unwrap();
    let moved: BTreeSet<&String> = owners
        .iter()
        .filter(|(_, g)| g[0] == lost)
        .map(|(p, _)| p)
        .collect();
    for (i, p) in keys.iter().enumerate() {
        if i == KEYS / 2 {
            tier.gateways[index].stop();
        }
        tier.call(p).await;
    }
    for _ in 0..2 {
        for p in &keys {
            tier.call(p).await;
        }
    }
    // Only the lost gateway's keys were fetched again, each by a survivor.
    let after = tier.fetches();
    for (prompt, gateways) in &after {
        if moved.contains(prompt) {
            assert!(
                (2..=3).contains(&gateways.len()) && gateways[1..].iter().all(|g| *g != lost),
                "{prompt}: {gateways:?}"
            );
        } else {
            assert_eq!(gateways.len(), 1, "{prompt} moved: {gateways:?}");
        }
    }
    eprintln!(
        "lost {lost} owning {} of {KEYS} keys: {} upstream calls after the loss, no client error",
        moved.len(),
        tier.mock.request_count() - KEYS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_shard_header_reads_and_fills_nothing() {
    let Some(tier) = Tier::start("a_forged_shard_header", Balance::RingHash) else {
        return;
    };
    let a = "the cached question";
    let first = tier.call(a).await;
    assert_eq!(x_cache(&first), "MISS");
    let key_a = key_hex(a, TENANT);
    let owner = tier.fetches()[a][0].clone();
    let owner: usize = owner.trim_start_matches("gw").parse().unwrap();
    let gateway = &tier.gateways[owner];

    // Through the front: the client's value is replaced by the real key.
    let b = "another question";
    let r = tier
        .ask(
            &tier.front,
            &cacheable(b),
            &[("authorization", TENANT), (SHARD_HEADER, &key_a)],
        )
        .await;
    assert_eq!((r.status, x_cache(&r)), (200, "MISS"));
    assert!(message(&r).contains(b));
    // A call that is not cacheable loses the client's value and gets none.
    let mut warm = cacheable(b);
    warm["temperature"] = json!(1);
    let r = tier
        .ask(
            &tier.front,
            &warm,
            &[("authorization", TENANT), (SHARD_HEADER, &key_a)],
        )
        .await;
    assert_eq!((r.status, x_cache(&r)), (200, "BYPASS"));
    // Straight at the owner of A, past the front: another tenant asking A
    // under A's key, and another question under it, both miss and are
    // answered with their own answers.
    for (prompt, tenant) in [(a, "Bearer tenant-2"), ("a third question", TENANT)] {
        let r = tier
            .ask(
                gateway,
                &cacheable(prompt),
                &[("authorization", tenant), (SHARD_HEADER, &key_a)],
            )
            .await;
        assert_eq!((r.status, x_cache(&r)), (200, "MISS"), "{prompt} {tenant}");
        assert!(message(&r).contains(prompt));
    }
    assert_eq!(Tier::wait_shard_keys(gateway, "mismatched", 2), 2);
    let mismatched: u64 = tier
        .gateways
        .iter()
        .map(|g| Tier::shard_keys(g, "mismatched"))
        .sum();
    assert_eq!(mismatched, 2, "the front's own keys all matched");
    // A's entry is A's: tenant 1 still hits it with A's answer.
    let again = tier.call(a).await;
    assert_eq!(x_cache(&again), "HIT");
    assert_eq!(message(&again), message(&first));
    assert!(tier
        .mock
        .requests()
        .iter()
        .all(|r| r.header(SHARD_HEADER).is_none()));
}
