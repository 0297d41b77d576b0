//! Hedging through the real Envoy: a slow P0 call is also sent to the other
//! backend of its model after its backend's usual latency, the first answer
//! wins, and the share of hedged calls stays under its cap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, unique, Envoy, MockUpstream, TailLatency,
};
use serde_json::{json, Value};

use crate::support::two_backends;

const HEDGES: &str = "llm_filter_routing_hedges_total";

fn envoy(default: &MockUpstream, a: &MockUpstream, b: &MockUpstream, hedge: Value) -> Envoy {
    two_backends::envoy(
        default,
        a,
        b,
        json!({"probe_interval_s": 60, "hedge": hedge}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hedge_wins_against_a_hanging_backend() {
    if skip_without_envoy("a_hedge_wins_against_a_hanging_backend") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 20),
        MockUpstream::backend("b", 4_000),
    );
    let envoy = envoy(
        &default,
        &a,
        &b,
        json!({"priorities": ["P0"], "min_delay_ms": 200, "max_ratio": 1.0}),
    );
    let url = envoy.url("/v1/chat/completions");
    let mut slowest = Duration::ZERO;
    for i in 0..12 {
        let started = Instant::now();
        let r = post_json(
            &url,
            &chat_body("gpt-4o", &unique(&format!("p0-{i}"))),
            &[("x-request-priority", "P0")],
        )
        .await
        .expect("call");
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert_eq!(r.status, 200, "{i}: {}", r.text());
        assert_eq!(r.header("x-llm-cluster"), Some("a"), "{i}");
        assert!(took < Duration::from_millis(1_500), "{i}: {took:?}");
    }
    let to_b = b.count("POST", "/v1/chat/completions");
    let won = envoy.metric(HEDGES, &[("result", "won")]);
    eprintln!("hanging b: {to_b} calls sent there, {won} hedges won, slowest {slowest:?}");
    assert!(to_b >= 1, "b was never chosen");
    assert_eq!(won, to_b as f64, "every call to b was hedged and won by a");
    // b learnt from the calls it lost that it is slow.
    assert!(
        envoy.metric(
            "llm_filter_routing_calls_total",
            &[("llm_cluster", "b"), ("outcome", "outlasted")]
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_of_other_priorities_are_not_hedged() {
    if skip_without_envoy("calls_of_other_priorities_are_not_hedged") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 20),
        MockUpstream::backend("b", 2_000),
    );
    let envoy = envoy(
        &default,
        &a,
        &b,
        json!({"priorities": ["P0"], "min_delay_ms": 200, "max_ratio": 1.0}),
    );
    let url = envoy.url("/v1/chat/completions");
    // Until a P1 call lands on b, which it then waits for.
    let mut waited = false;
    for i in 0..16 {
        let started = Instant::now();
        let r = post_json(&url, &chat_body("gpt-4o", &unique(&format!("p1-{i}"))), &[])
            .await
            .expect("call");
        assert_eq!(r.status, 200);
        if r.header("x-llm-cluster") == Some("b") {
            assert!(started.elapsed() >= Duration::from_millis(1_900));
            waited = true;
            break;
        }
    }
    assert!(waited, "no P1 call went to b");
    assert_eq!(envoy.metric(HEDGES, &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hedges_stay_under_their_cap_under_load() {
    if skip_without_envoy("hedges_stay_under_their_cap_under_load") {
        return;
    }
    // Both backends answer in 30 ms but one call in twelve or so takes
    // 600-800 ms: those all outlast the hedge delay, far more than the cap of
    // one hedge per fifty calls allows.
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 30),
        MockUpstream::backend("b", 30),
    );
    for (m, seed) in [(&a, 1), (&b, 2)] {
        m.set_tail_latency(Some(TailLatency {
            probability: 0.08,
            // Under the budget's per-try timeout (at least 1 s), so a slow
            // call is never cut and failed over: it is hedged or waited for.
            min_ms: 600,
            max_ms: 800,
            seed,
        }));
    }
    let envoy = envoy(
        &default,
        &a,
        &b,
        json!({"priorities": ["P0"], "min_delay_ms": 100, "max_ratio": 0.02}),
    );
    let url = Arc::new(envoy.url("/v1/chat/completions"));
    let mut tasks = Vec::new();
    for c in 0..8 {
        let url = Arc::clone(&url);
        tasks.push(tokio::spawn(async move {
            let mut replies = Vec::new();
            let until = Instant::now() + Duration::from_secs(5);
            let mut i = 0;
            while Instant::now() < until {
                let body = chat_body("gpt-4o", &unique(&format!("load-{c}-{i}")));
                let started = Instant::now();
                let r = post_json(&url, &body, &[("x-request-priority", "P0")])
                    .await
                    .expect("call");
                replies.push((r.status, started.elapsed()));
                i += 1;
            }
            replies
        }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        replies.extend(t.await.expect("client"));
    }
    let calls = replies.len() as f64;
    let hedges = envoy.metric(HEDGES, &[]);
    let waited = replies
        .iter()
        .filter(|(_, took)| *took >= Duration::from_millis(500))
        .count();
    eprintln!(
        "{calls} calls, {hedges} hedges ({:.3}), {waited} waited for a slow answer",
        hedges / calls
    );
    assert!(replies.iter().all(|(s, _)| *s == 200), "{replies:?}");
    assert!(calls >= 150.0, "{calls}");
    assert!(hedges >= 1.0, "no hedge at all");
    // The cap binds: slow calls beyond it waited for their backend, and the
    // hedges stay within a fiftieth of the calls, give or take the calls
    // still in flight when a hedge is taken.
    assert!(waited >= 1, "every slow call was hedged");
    assert!(
        hedges <= 0.02 * calls + 2.0,
        "{hedges} hedges for {calls} calls"
    );
}
