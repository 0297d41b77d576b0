//! Cross-cluster failover through the real Envoy: when the backend routing
//! chose fails a held call (a 5xx, a reset, a timeout), the filter sends the
//! same request to another backend of the model and the client gets that
//! backend's answer; the caller's budget still ends the call on time.

use std::time::{Duration, Instant};

use llm_filter_e2e::{
    chat_body, chat_stream_body, post_json, skip_without_envoy, stream_sse, unique, Envoy,
    MockUpstream,
};
use serde_json::json;

use crate::support::two_backends;

const FAILOVERS: &str = "llm_filter_routing_failovers_total";
const CALLS: &str = "llm_filter_routing_calls_total";

/// Two backends of `gpt-4o`, `a` and `b`, equal weights; ejection needs many
/// failures in a row so the failing one keeps being chosen.
fn envoy(default: &MockUpstream, a: &MockUpstream, b: &MockUpstream) -> Envoy {
    two_backends::envoy(default, a, b, json!({"eject_after_failures": 1000}))
}

fn idempotency_keys(mock: &MockUpstream) -> Vec<String> {
    mock.requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .filter_map(|r| r.header("idempotency-key").map(str::to_string))
        .collect()
}

/// Every call that `b` failed reached `a` too, with the same idempotency key,
/// and the client only ever saw `a`'s answers.
async fn failing_b_is_answered_by_a(failing: impl Fn(&MockUpstream)) {
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 10),
        MockUpstream::backend("b", 10),
    );
    failing(&b);
    let envoy = envoy(&default, &a, &b);
    let url = envoy.url("/v1/chat/completions");
    for i in 0..16 {
        let r = post_json(&url, &chat_body("gpt-4o", &unique(&format!("q{i}"))), &[])
            .await
            .expect("call");
        assert_eq!(r.status, 200, "{}: {}", i, r.text());
        assert_eq!(r.header("x-llm-cluster"), Some("a"), "{i}");
        assert!(r.json()["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|c| c.ends_with("[a]")));
    }
    let (keys_a, keys_b) = (idempotency_keys(&a), idempotency_keys(&b));
    eprintln!("a saw {} calls, b {}", keys_a.len(), keys_b.len());
    assert!(!keys_b.is_empty(), "b was never chosen");
    assert_eq!(keys_a.len(), 16, "a answered every call once");
    for k in &keys_b {
        assert!(keys_a.contains(k), "{k} failed on b and never reached a");
    }
    let answered = envoy.metric(FAILOVERS, &[("result", "answered")]);
    assert_eq!(answered, keys_b.len() as f64);
    // Both backends learn: b its failures, a the calls it answered.
    let b_failed = envoy.metric(CALLS, &[("llm_cluster", "b")])
        - envoy.metric(CALLS, &[("llm_cluster", "b"), ("outcome", "success")]);
    assert_eq!(b_failed, keys_b.len() as f64);
    assert_eq!(
        envoy.metric(CALLS, &[("llm_cluster", "a"), ("outcome", "success")]),
        16.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_answering_503_is_answered_by_the_other() {
    if skip_without_envoy("a_backend_answering_503_is_answered_by_the_other") {
        return;
    }
    failing_b_is_answered_by_a(|b| b.set_status(Some(503))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_resetting_is_answered_by_the_other() {
    if skip_without_envoy("a_backend_resetting_is_answered_by_the_other") {
        return;
    }
    failing_b_is_answered_by_a(|b| b.set_reset(true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_fails_over_before_anything_reached_the_client() {
    if skip_without_envoy("a_stream_fails_over_before_anything_reached_the_client") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 10),
        MockUpstream::backend("b", 10),
    );
    b.set_status(Some(500));
    let envoy = envoy(&default, &a, &b);
    let url = envoy.url("/v1/chat/completions");
    for i in 0..8 {
        let body = chat_stream_body("gpt-4o", &unique(&format!("s{i}")), true);
        let sse = stream_sse(&url, &body, &[]).await.expect("stream");
        assert_eq!(sse.status, 200, "{i}");
        assert_eq!(sse.header("x-llm-cluster"), Some("a"));
        assert!(sse.done(), "{i}: the whole stream of a");
        assert!(sse.content().ends_with("[a]"), "{}", sse.content());
    }
    assert!(!idempotency_keys(&b).is_empty(), "b was never chosen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_failover_the_failure_reaches_the_client() {
    if skip_without_envoy("without_failover_the_failure_reaches_the_client") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 10),
        MockUpstream::backend("b", 10),
    );
    b.set_status(Some(503));
    let envoy = two_backends::envoy(
        &default,
        &a,
        &b,
        json!({"eject_after_failures": 1000, "failover": false}),
    );
    let url = envoy.url("/v1/chat/completions");
    let mut statuses = Vec::new();
    for i in 0..12 {
        let r = post_json(&url, &chat_body("gpt-4o", &unique(&format!("n{i}"))), &[])
            .await
            .expect("call");
        statuses.push((r.status, r.header("x-llm-cluster").map(str::to_string)));
    }
    assert!(
        statuses.contains(&(503, Some("b".to_string()))),
        "{statuses:?}"
    );
    assert_eq!(envoy.metric(FAILOVERS, &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_budget_ends_the_call_on_time_when_both_backends_hang() {
    if skip_without_envoy("the_budget_ends_the_call_on_time_when_both_backends_hang") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 5_000),
        MockUpstream::backend("b", 5_000),
    );
    let envoy = envoy(&default, &a, &b);
    let url = envoy.url("/v1/chat/completions");
    for i in 0..3 {
        let started = Instant::now();
        let r = post_json(
            &url,
            &chat_body("gpt-4o", &unique(&format!("h{i}"))),
            &[("x-request-timeout-ms", "1500")],
        )
        .await
        .expect("call");
        let took = started.elapsed();
        eprintln!(
            "hanging backends: {} after {took:?}: {}",
            r.status,
            r.text()
        );
        assert_eq!(r.status, 504, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "llm_filter_upstream_timeout");
        assert!(took < Duration::from_millis(2_300), "{took:?}");
    }
}
