//! Affinity through the real Envoy: the turns of one conversation (the same
//! beginning, a growing history) reach one backend while conversations
//! spread over the model's backends; a conversation whose backend fails
//! moves to another and comes back once its backend is back; inside a pool
//! behind one cluster, Envoy's consistent hashing on the affinity header
//! keeps a conversation on one server; a backend that takes it gets the key
//! as `prompt_cache_key`, and its cached input tokens are counted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use llm_filter_e2e::{post_json, skip_without_envoy, EnvoyBuilder, MockUpstream, RecordedRequest};
use serde_json::{json, Value};

use super::CLUSTER_HEADER;
use crate::support::two_backends;

const AFFINITY_HEADER: &str = "x-llm-affinity";
const CHAT: &str = "/v1/chat/completions";

/// Turn `turns` of conversation `topic`: the same system prompt and first
/// user turn, and a history that grows by two messages a turn.
fn turn(topic: &str, turns: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a travel agent. Be brief."}),
        json!({"role": "user", "content": format!("Plan a trip about {topic}")}),
    ];
    for n in 0..turns {
        messages.push(json!({"role": "assistant", "content": format!("Option {n} for {topic}")}));
        messages.push(json!({"role": "user", "content": format!("More on option {n}")}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

/// Sends turn `turns` of `topic`; the cluster that answered.
async fn ask(url: &str, topic: &str, turns: usize) -> String {
    let r = post_json(url, &turn(topic, turns), &[])
        .await
        .unwrap_or_else(|e| panic!("{topic} turn {turns}: {e:#}"));
    assert_eq!(r.status, 200, "{topic} turn {turns}: {}", r.text());
    r.header(CLUSTER_HEADER).unwrap_or("-").to_string()
}

/// The conversation a recorded chat call belongs to, by its first user turn.
fn topic_of(r: &RecordedRequest) -> Option<String> {
    let body = r.json()?;
    let first = body.pointer("/messages/1/content")?.as_str()?;
    first.strip_prefix("Plan a trip about ").map(str::to_string)
}

/// Conversation → the affinity headers its calls to `mock` carried.
fn keys_seen(mock: &MockUpstream) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in mock.requests().iter().filter(|r| r.path == CHAT) {
        if let Some(topic) = topic_of(r) {
            let key = r.header(AFFINITY_HEADER).unwrap_or("-").to_string();
            out.entry(topic).or_default().insert(key);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_stays_on_its_backend_moves_off_a_failing_one_and_comes_back() {
    let test = "a_conversation_stays_on_its_backend_moves_off_a_failing_one_and_comes_back";
    if skip_without_envoy(test) {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    // Equal backends, slow enough that a loaded machine's hiccups (tens of
    // ms) stay within the quarter of the best weight that keeps keys put.
    let backends = [
        MockUpstream::backend("a", 100),
        MockUpstream::backend("b", 100),
        MockUpstream::backend("c", 100),
    ];
    // No probe in the test's time (a probe of the failing backend would keep
    // it out longer); short ejection and ramp, so it comes back in seconds.
    let config = json!({
        "routing": {
            "models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}, {"cluster": "c"}]},
            "probe_interval_s": 600, "eject_s": 2, "ramp_s": 1
        },
        "cache": {"enabled": false}
    });
    let refs: Vec<&MockUpstream> = backends.iter().collect();
    let envoy = super::envoy(&config, &default, &refs);
    let url = envoy.url(CHAT);

    // 24 conversations of 5 turns each, interleaved.
    let topics: Vec<String> = (0..24).map(|i| format!("city {i}")).collect();
    let mut home: BTreeMap<String, String> = BTreeMap::new();
    for turns in 0..5 {
        for topic in &topics {
            let cluster = ask(&url, topic, turns).await;
            let first = home.entry(topic.clone()).or_insert_with(|| cluster.clone());
            assert_eq!(*first, cluster, "{topic} moved at turn {turns}");
        }
    }
    let mut per_backend: BTreeMap<&str, usize> = BTreeMap::new();
    for cluster in home.values() {
        *per_backend.entry(cluster.as_str()).or_default() += 1;
    }
    eprintln!("conversations per backend: {per_backend:?}");
    assert_eq!(per_backend.len(), 3, "{per_backend:?}");
    assert!(per_backend.values().all(|n| *n >= 3), "{per_backend:?}");
    // What the backends received: every call of a conversation on its home,
    // each with one affinity key; no two conversations share a key.
    let mut keys = BTreeSet::new();
    for mock in &backends {
        for (topic, seen) in keys_seen(mock) {
            assert_eq!(home[&topic], mock.name(), "{topic} reached {}", mock.name());
            assert_eq!(seen.len(), 1, "{topic}: {seen:?}");
            let key = seen.into_iter().next().unwrap_or_default();
            assert_eq!(key.len(), 16, "{key}");
            assert!(keys.insert(key), "{topic} shares a key");
        }
    }
    assert_eq!(default.count("POST", CHAT), 0);

    // The home of the first conversation fails: its turns fail over, then
    // (ejected after three failures) go straight to one other backend.
    let topic = topics[0].clone();
    let failing = home[&topic].clone();
    let mock = backends
        .iter()
        .find(|b| b.name() == failing)
        .expect("the home is a backend");
    mock.set_status(Some(503));
    let mut turns = 5;
    let mut during = Vec::new();
    for _ in 0..8 {
        during.push(ask(&url, &topic, turns).await);
        turns += 1;
    }
    eprintln!("{topic} (home {failing}) while it fails: {during:?}");
    assert!(during.iter().all(|c| *c != failing), "{during:?}");
    let moved_to = during.last().cloned().unwrap_or_default();
    assert!(
        during.iter().skip(3).all(|c| *c == moved_to),
        "ejected, the conversation goes to one other backend: {during:?}"
    );
    // Conversations at home elsewhere did not move.
    for t in topics.iter().filter(|t| home[*t] != failing).take(6) {
        assert_eq!(ask(&url, t, 5).await, home[t], "{t}");
    }

    // Back: after the ejection and the ramp, the conversation goes home.
    mock.set_status(None);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut back = false;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if ask(&url, &topic, turns).await == failing {
            back = true;
            break;
        }
        turns += 1;
    }
    assert!(back, "{topic} never came back to {failing}");
    for _ in 0..5 {
        turns += 1;
        assert_eq!(ask(&url, &topic, turns).await, failing);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_hashing_on_the_affinity_header_keeps_a_conversation_on_one_server() {
    let test = "a_pool_hashing_on_the_affinity_header_keeps_a_conversation_on_one_server";
    if skip_without_envoy(test) {
        return;
    }
    let servers: Vec<MockUpstream> = (0..4)
        .map(|i| MockUpstream::backend(&format!("vllm-{i}"), 5))
        .collect();
    let ports: Vec<u16> = servers.iter().map(MockUpstream::port).collect();
    // One backend, the pool: routing on, every call of the model keyed.
    let config = json!({
        "routing": {"models": {"gpt-4o": [{"cluster": "pool", "model": "llama-3.1-8b"}]}},
        "cache": {"enabled": false}
    });
    let envoy = EnvoyBuilder::new()
        .plugin_config(&config)
        .upstream_pool(
            "pool",
            &ports,
            "lb_policy: RING_HASH\ncommon_lb_config:\n  consistent_hashing_lb_config:\n    hash_balance_factor: 200\n",
        )
        .header_route(CLUSTER_HEADER)
        .extra_route_yaml(&format!(
            "hash_policy:\n- header: {{header_name: {AFFINITY_HEADER}}}"
        ))
        .route_timeout_ms(30_000)
        .start()
        .expect("envoy with a hashed pool");
    let url = envoy.url(CHAT);
    let topics: Vec<String> = (0..16).map(|i| format!("town {i}")).collect();
    for turns in 0..4 {
        for topic in &topics {
            assert_eq!(ask(&url, topic, turns).await, "pool");
        }
    }
    // Which servers each conversation reached, as the servers saw it.
    let mut reached: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &servers {
        for (topic, keys) in keys_seen(s) {
            assert_eq!(keys.len(), 1, "{topic}: {keys:?}");
            reached
                .entry(topic)
                .or_default()
                .insert(s.name().to_string());
        }
        for r in s.requests().iter().filter(|r| r.path == CHAT) {
            assert_eq!(r.json().unwrap_or_default()["model"], "llama-3.1-8b");
        }
    }
    assert_eq!(reached.len(), topics.len());
    for (topic, at) in &reached {
        assert_eq!(at.len(), 1, "{topic} reached {at:?}");
    }
    let used: BTreeSet<&String> = reached.values().flatten().collect();
    eprintln!(
        "pool: {} conversations over servers {used:?}",
        reached.len()
    );
    assert!(used.len() >= 3, "conversations spread: {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_that_takes_it_gets_the_key_as_prompt_cache_key_and_its_cache_is_counted() {
    let test = "a_backend_that_takes_it_gets_the_key_as_prompt_cache_key_and_its_cache_is_counted";
    if skip_without_envoy(test) {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (MockUpstream::backend("a", 5), MockUpstream::backend("b", 5));
    a.set_prompt_cache(true);
    b.set_prompt_cache(true);
    let envoy = two_backends::envoy(
        &default,
        &a,
        &b,
        json!({"models": {"gpt-4o": [{"cluster": "a", "prompt_cache_key": true}, {"cluster": "b"}]}}),
    );
    let url = envoy.url(CHAT);
    let topics: Vec<String> = (0..12).map(|i| format!("village {i}")).collect();
    // Backend → conversations it answered a later turn of after their first.
    let mut revisited: BTreeMap<String, usize> = BTreeMap::new();
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    for turns in 0..3 {
        for topic in &topics {
            let by = ask(&url, topic, turns).await;
            if turns == 0 {
                first.insert(topic.clone(), by);
            } else if first.get(topic) == Some(&by) && turns == 1 {
                *revisited.entry(by).or_default() += 1;
            }
        }
    }
    // On a loaded machine routing may weigh one backend down for a while
    // (a latency hiccup) and start every conversation on the other: more
    // conversations, one after another, until each backend holds one past
    // its first turn.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut more = 0;
    while ["a", "b"].iter().any(|c| !revisited.contains_key(*c)) && Instant::now() < deadline {
        let topic = format!("town {more}");
        more += 1;
        let by = ask(&url, &topic, 0).await;
        let again = ask(&url, &topic, 1).await;
        ask(&url, &topic, 2).await;
        if by == again {
            *revisited.entry(by).or_default() += 1;
        }
    }
    eprintln!("conversations revisited on their backend: {revisited:?} ({more} more played)");
    // a got the affinity key as prompt_cache_key; b, which does not take
    // it, got none.
    let on_a: Vec<RecordedRequest> = a
        .requests()
        .into_iter()
        .filter(|r| r.path == CHAT)
        .collect();
    assert!(!on_a.is_empty(), "no conversation on a");
    for r in &on_a {
        let body = r.json().unwrap_or_default();
        assert_eq!(
            body["prompt_cache_key"].as_str(),
            r.header(AFFINITY_HEADER),
            "{body}"
        );
    }
    let on_b: Vec<RecordedRequest> = b
        .requests()
        .into_iter()
        .filter(|r| r.path == CHAT)
        .collect();
    assert!(!on_b.is_empty(), "no conversation on b");
    assert!(on_b.iter().all(|r| r
        .json()
        .unwrap_or_default()
        .get("prompt_cache_key")
        .is_none()));
    // A caller's own key stays, and is the key.
    let own = json!({"model": "gpt-4o", "prompt_cache_key": "mine",
                     "messages": [{"role": "user", "content": "Plan a trip about mine"}]});
    let r = post_json(&url, &own, &[]).await.expect("own key");
    assert_eq!(r.status, 200);
    let last = if r.header(CLUSTER_HEADER) == Some("a") {
        a.last_request()
    } else {
        b.last_request()
    };
    let last = last.expect("the call reached a backend");
    assert_eq!(last.json().unwrap_or_default()["prompt_cache_key"], "mine");

    // Later turns of a conversation found its earlier prompt cached: the
    // cached input tokens are counted per backend and model.
    let cached = |cluster: &str| {
        envoy.wait_for_metric(
            "llm_filter_routing_tokens_total",
            &[
                ("llm_cluster", cluster),
                ("model", "gpt-4o"),
                ("token_type", "cached_input"),
            ],
            1.0,
            Duration::from_secs(10),
        )
    };
    let input = |cluster: &str| {
        envoy.metric(
            "llm_filter_routing_tokens_total",
            &[
                ("llm_cluster", cluster),
                ("model", "gpt-4o"),
                ("token_type", "input"),
            ],
        )
    };
    for cluster in ["a", "b"] {
        let (c, i) = (cached(cluster), input(cluster));
        eprintln!("{cluster}: {c} of {i} input tokens cached");
        assert!(c > 0.0 && c < i, "{cluster}: cached {c}, input {i}");
    }
}
