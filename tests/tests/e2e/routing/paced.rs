//! Latency judged per output token through the real Envoy: a backend that
//! gets long answers is not judged slower than one that gets short answers
//! at the same speed, while the plain time to the end would leave it a
//! tenth of the weight.

use std::time::Duration;

use llm_filter_e2e::{chat_body, prometheus, skip_without_envoy, MockUpstream};
use serde_json::json;

use super::{failures, load, CLUSTER_HEADER, WEIGHT};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_answers_at_the_same_speed_keep_their_weight() {
    if skip_without_envoy("long_answers_at_the_same_speed_keep_their_weight") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    // Both decode 2 ms a token after 64 ms: `long` answers 400 tokens in
    // 864 ms, `short` 20 in 104 ms.
    let (long, short) = (
        MockUpstream::backend("long", 64 + 2 * 400),
        MockUpstream::backend("short", 64 + 2 * 20),
    );
    long.set_answer_words(Some(400));
    short.set_answer_words(Some(20));
    let config = json!({
        "routing": {
            "models": {"gpt-4o": [{"cluster": "long"}, {"cluster": "short"}]},
            "probe_interval_s": 600
        },
        "cache": {"enabled": false}
    });
    let envoy = super::envoy(&config, &default, &[&long, &short]);
    let replies = load(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "tell me"),
        6,
        Duration::from_secs(8),
    )
    .await;
    assert!(failures(&replies).is_empty(), "{:?}", failures(&replies));
    let on_long = replies
        .iter()
        .filter(|r| r.cluster.as_deref() == Some("long"))
        .count();
    // What the backends answered: the lengths the usage reports.
    let answered = long.request_count();
    assert_eq!(answered, on_long, "every call to long reached it");
    let samples = envoy.metrics();
    let weight = |cluster| prometheus::sum(&samples, WEIGHT, &[("llm_cluster", cluster)]);
    let (w_long, w_short) = (weight("long"), weight("short"));
    let output = |cluster| {
        envoy.metric(
            "llm_filter_routing_tokens_total",
            &[("llm_cluster", cluster), ("token_type", "output")],
        )
    };
    eprintln!(
        "paced: {on_long} of {} calls to long; weights long {w_long}, short {w_short}; \
         output tokens long {}, short {}",
        replies.len(),
        output("long"),
        output("short")
    );
    assert!(on_long >= 5, "long kept too few calls to judge: {on_long}");
    assert_eq!(output("long"), 400.0 * on_long as f64);
    assert!(
        w_long > 0.6 * w_short,
        "long answers judged slower: weights long {w_long}, short {w_short}"
    );
    assert!(
        replies.iter().all(|r| r.cluster.is_some()),
        "{CLUSTER_HEADER} on every answer"
    );
}
