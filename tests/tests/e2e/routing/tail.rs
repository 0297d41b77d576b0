//! Tail-aware routing through the real Envoy: a backend that is usually fast
//! but now and then takes seconds loses most of its traffic to a steady one,
//! which a mean latency alone would not do.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llm_filter_e2e::{
    chat_body, http_client, prometheus, send_bytes, skip_without_envoy, EnvoyBuilder, MockUpstream,
    Script,
};
use serde_json::{json, Value};

const CLUSTER_HEADER: &str = "x-llm-cluster";
const WEIGHT: &str = "llm_filter_routing_weight_milli";

/// `(sent since the start, x-llm-cluster, status)` of every call `clients`
/// loops send to `url` for `duration`, in the order sent. Each call's content
/// is numbered, so no cache answers in a backend's place.
async fn load(
    url: &str,
    model: &str,
    clients: usize,
    duration: Duration,
) -> Vec<(Duration, Option<String>, u16)> {
    let start = Instant::now();
    let client = http_client();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, model, next) = (
            client.clone(),
            url.to_string(),
            model.to_string(),
            Arc::clone(&next),
        );
        tasks.push(tokio::spawn(async move {
            let mut replies = Vec::new();
            loop {
                let sent = start.elapsed();
                if sent >= duration {
                    break;
                }
                let n = next.fetch_add(1, Ordering::SeqCst);
                let body = chat_body(&model, &format!("hello #{n}")).to_string();
                let r = send_bytes(
                    &client,
                    reqwest::Method::POST,
                    &url,
                    Some(body.into_bytes()),
                    &[("content-type", "application/json")],
                )
                .await;
                replies.push(match r {
                    Ok(r) => (sent, r.header(CLUSTER_HEADER).map(str::to_string), r.status),
                    Err(_) => (sent, None, 0),
                });
            }
            replies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client loop"));
    }
    all.sort_by_key(|r| r.0);
    all
}

/// Calls sent in `[from, to)` and how many of them `cluster` served.
fn served(
    replies: &[(Duration, Option<String>, u16)],
    cluster: &str,
    from: Duration,
    to: Duration,
) -> (usize, usize) {
    let window: Vec<_> = replies.iter().filter(|r| r.0 >= from && r.0 < to).collect();
    let n = window
        .iter()
        .filter(|r| r.1.as_deref() == Some(cluster))
        .count();
    (n, window.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_tailed_backend_keeps_a_trickle() {
    if skip_without_envoy("heavy_tailed_backend_keeps_a_trickle") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    // `tail` answers nine calls in ten in 100 ms and the tenth in 3 s: a mean
    // of 390 ms, barely above `steady`'s 300 ms, which alone would leave
    // `tail` about 40% of the calls.
    let (tail, steady) = (
        MockUpstream::backend("tail", 100),
        MockUpstream::backend("steady", 300),
    );
    for k in 0..3_000 {
        let delay_ms = if k % 10 == 9 { 3_000 } else { 100 };
        tail.push_script(Script {
            delay_ms: Some(delay_ms),
            ..Script::default()
        });
    }
    // Routing's weights alone: the budget's per-try timeout would cut the
    // slow calls into retries, and hedging (on by default) would answer
    // them from `steady` before they end. No probe in the test's time: a
    // probe takes the next script, and one given 3 s would time out and
    // eject `tail`.
    let config: Value = json!({
        "routing": {
            "models": {"gpt-4o": [{"cluster": "tail"}, {"cluster": "steady"}]},
            "probe_interval_s": 60,
            "hedge": {"priorities": []}
        },
        "budget": {"enabled": false}
    });
    let envoy = EnvoyBuilder::new()
        .plugin_config(&config)
        .concurrency(2)
        .upstream(default.name(), default.port())
        .upstream(tail.name(), tail.port())
        .upstream(steady.name(), steady.port())
        .header_route(CLUSTER_HEADER)
        .route_timeout_ms(30_000)
        .start()
        .expect("envoy with the filter and routing");
    let total = Duration::from_secs(14);
    let replies = load(&envoy.url("/v1/chat/completions"), "gpt-4o", 8, total).await;
    let failed: Vec<_> = replies.iter().filter(|r| r.2 != 200).collect();
    assert!(failed.is_empty(), "{failed:?}");

    let secs = Duration::from_secs;
    let (early_tail, early) = served(&replies, "tail", secs(0), secs(3));
    // The first slow calls end after 3 s; by 6 s the tail is known.
    let (late_tail, late) = served(&replies, "tail", secs(6), total);
    let late_steady = served(&replies, "steady", secs(6), total).0;
    let share = late_tail as f64 / late.max(1) as f64;
    let samples = envoy.metrics();
    let weight = |cluster| prometheus::sum(&samples, WEIGHT, &[("llm_cluster", cluster)]);
    let (w_tail, w_steady) = (weight("tail"), weight("steady"));
    eprintln!(
        "heavy tail: first 3 s {early_tail} of {early} calls to tail; after 6 s {late_tail} \
         of {late} (share {share:.3}), steady {late_steady}; weights tail {w_tail}, \
         steady {w_steady}"
    );
    assert!(late >= 100, "too few calls to judge: {late}");
    assert!(late_tail > 0, "tail keeps a trickle to stay measured");
    assert!(share < 0.3, "share of tail {share}");
    assert!(late_tail * 2 < late_steady, "{late_tail} vs {late_steady}");
    // Steady's weight may carry an in-flight factor at the instant it was
    // last computed; tail's is mostly its latency factor, about 0.18.
    assert!(w_tail > 0.0, "tail was ejected: weight {w_tail}");
    assert!(
        w_tail * 2.0 < w_steady,
        "weights tail {w_tail}, steady {w_steady}"
    );
}
