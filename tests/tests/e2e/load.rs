//! Live load signals through the real Envoy: a streamed call asks the
//! provider for its usage, the client gets exactly the stream it would have
//! had without that (byte for byte, the usage-only chunk taken out), and the
//! calls, output tokens and in-flight counts show as shared gauges.

use std::time::Duration;

use llm_filter_e2e::{
    chat_body, chat_stream_body, post_json, skip_without_envoy, stream_sse, EnvoyBuilder,
    MockConfig, MockUpstream,
};
use serde_json::json;

#[tokio::test]
async fn a_stream_gets_usage_upstream_and_the_client_never_sees_it() {
    let test = "a_stream_gets_usage_upstream_and_the_client_never_sees_it";
    if skip_without_envoy(test) {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("load"));
    mock.set_chunk_delay_ms(5);
    let envoy = EnvoyBuilder::new()
        .plugin_config(json!({"cache": {"enabled": false}}))
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter");
    let url = envoy.url("/v1/chat/completions");

    let first_call = std::time::Instant::now();
    let body = chat_stream_body("gpt-4o", "one two three four", false);
    let r = stream_sse(&url, &body, &[]).await.unwrap();
    assert_eq!(r.status, 200);
    let sent = mock.last_request().unwrap().json().unwrap();
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    let stripped = sent.as_object().unwrap().len() - 1;
    assert_eq!(
        stripped,
        body.as_object().unwrap().len(),
        "nothing else changed"
    );
    let streams = mock.sent_streams();
    let upstream = String::from_utf8(streams.last().unwrap().clone()).unwrap();
    let usage_chunks: Vec<&str> = upstream
        .split_inclusive("\n\n")
        .filter(|e| e.contains(r#""choices":[]"#))
        .collect();
    assert_eq!(usage_chunks.len(), 1, "{upstream}");
    assert!(usage_chunks[0].contains("completion_tokens"));
    let expected = upstream.replace(usage_chunks[0], "");
    assert_eq!(String::from_utf8(r.raw.to_vec()).unwrap(), expected);
    assert!(r.usage().is_none());

    // A client that asked for usage gets the stream as sent, usage and all.
    let body = chat_stream_body("gpt-4o", "five six seven", true);
    let r = stream_sse(&url, &body, &[]).await.unwrap();
    let upstream = mock.sent_streams().last().unwrap().clone();
    assert_eq!(r.raw.to_vec(), upstream);
    assert!(r.usage().is_some());
    assert_eq!(
        mock.last_request().unwrap().body,
        body.to_string().into_bytes(),
        "the client's request went upstream byte for byte"
    );

    // Plain calls count too; the gauges come from shared data every second.
    for _ in 0..3 {
        let r = post_json(&url, &chat_body("gpt-4o", "a b c"), &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let rps = envoy.wait_for_metric(
        "llm_filter_load_rps_milli",
        &[("model", "gpt-4o")],
        500.0,
        Duration::from_secs(5),
    );
    if first_call.elapsed() < Duration::from_secs(9) {
        assert_eq!(rps, 500.0, "5 calls over the 10 s window");
    } else {
        // A slow machine: the first calls may have left the window already.
        assert!(rps > 0.0 && rps <= 500.0, "{rps}");
    }
    let tokens = envoy.metric("llm_filter_load_tokens_per_s", &[("model", "gpt-4o")]);
    assert!(tokens >= 1.0, "output tokens per second {tokens}");
    assert_eq!(
        envoy.metric("llm_filter_load_in_flight", &[("model", "gpt-4o")]),
        0.0,
        "every call left the in-flight count"
    );
    assert_eq!(envoy.metric("llm_filter_internal_errors_total", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_are_counted_until_they_end() {
    let test = "calls_in_flight_are_counted_until_they_end";
    if skip_without_envoy(test) {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("load"));
    // Long enough that all three are upstream together for several of the
    // gauge's one-second publications, however a busy machine staggers them.
    mock.set_default_delay_ms(8_000);
    let envoy = EnvoyBuilder::new()
        .plugin_config("{}")
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter");
    let url = envoy.url("/v1/chat/completions");
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                post_json(&url, &chat_body("slow-model", &format!("q {i}")), &[]).await
            })
        })
        .collect();
    assert!(
        mock.in_flight_reaches(3, Duration::from_secs(3)).await,
        "the three calls were never upstream together ({} were)",
        mock.peak_in_flight()
    );
    let seen = envoy.wait_for_metric(
        "llm_filter_load_in_flight",
        &[("model", "slow-model")],
        3.0,
        Duration::from_secs(6),
    );
    assert_eq!(
        seen,
        3.0,
        "in flight while the mock held 3 (internal errors: {})",
        envoy.metric("llm_filter_internal_errors_total", &[])
    );
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap().status, 200);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while envoy.metric("llm_filter_load_in_flight", &[("model", "slow-model")]) != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "in flight never fell back to 0"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// More made-up model names than the load records (64) and the model labels
/// a worker keeps (100) for names the configuration does not give.
const MADE_UP: usize = 110;

#[tokio::test]
async fn made_up_models_never_switch_off_a_routed_models_threshold() {
    let test = "made_up_models_never_switch_off_a_routed_models_threshold";
    if skip_without_envoy(test) {
        return;
    }
    let default = MockUpstream::start(MockConfig::named("default"));
    let routed = MockUpstream::start(MockConfig::named("routed"));
    let config = json!({
        "cache": {"enabled": false},
        "routing": {"models": {"busy": [{"cluster": "routed", "model": "busy-v2"}]}},
        "degrade": {"thresholds": [
            {"model": "busy", "signal": "rps", "above": 0.25, "level": 2}
        ]}
    });
    // One worker: every made-up name reaches the same table of labels.
    let envoy = EnvoyBuilder::new()
        .plugin_config(&config)
        .concurrency(1)
        .upstream(default.name(), default.port())
        .upstream(routed.name(), routed.port())
        .header_route("x-llm-cluster")
        .start()
        .expect("envoy with the filter and routing");
    let url = envoy.url("/v1/chat/completions");
    let p2 = [("x-request-priority", "P2")];

    // A client names a new model in every call before the routed one is used.
    for i in 0..MADE_UP {
        let r = post_json(&url, &chat_body(&format!("made-up-{i}"), "hi"), &p2)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "made-up call {i}: {}", r.text());
    }
    assert_eq!(default.request_count(), MADE_UP);

    // Three calls of the routed model in the 10 s window: 0.3 per second.
    for i in 0..3 {
        let r = post_json(&url, &chat_body("busy", &format!("q{i}")), &p2)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "call {i}: {}", r.text());
        assert_eq!(r.header("x-llm-degraded"), None);
        assert_eq!(r.header("x-llm-cluster"), Some("routed"));
    }
    assert_eq!(routed.request_count(), 3);
    let sent = routed.last_request().unwrap().json().unwrap();
    assert_eq!(sent["model"], "busy-v2");
    // The threshold still acts: the fourth is shed, and never leaves.
    let r = post_json(&url, &chat_body("busy", "one more"), &p2)
        .await
        .unwrap();
    assert_eq!(
        r.status,
        503,
        "the threshold on `busy` no longer sheds: {}",
        r.text()
    );
    assert_eq!(r.header("x-llm-degraded"), Some("2"));
    assert_eq!(r.json()["error"]["code"], "llm_filter_degraded_shed");
    assert_eq!(
        routed.request_count(),
        3,
        "the shed call never went upstream"
    );
    assert_eq!(default.request_count(), MADE_UP);

    // The routed model keeps its own record and label; the made-up names
    // beyond the bound share the overflow record `other`.
    let busy = envoy.wait_for_metric(
        "llm_filter_load_rps_milli",
        &[("model", "busy")],
        300.0,
        Duration::from_secs(5),
    );
    assert!(busy >= 300.0, "busy at {busy} milli-calls per second");
    let other = envoy.wait_for_metric(
        "llm_filter_load_rps_milli",
        &[("model", "other")],
        1.0,
        Duration::from_secs(5),
    );
    assert!(other > 0.0, "no load under `other`");
    let mut measured: Vec<String> = envoy
        .metrics()
        .into_iter()
        .filter(|s| s.name == "llm_filter_load_rps_milli")
        .filter_map(|s| s.labels.get("model").cloned())
        .collect();
    measured.sort();
    measured.dedup();
    assert_eq!(measured.len(), 64 + 2, "{measured:?}");
    assert!(envoy.metric("llm_filter_requests_total", &[("model", "busy")]) >= 4.0);
    assert!(envoy.metric("llm_filter_requests_total", &[("model", "other")]) >= 1.0);
    assert_eq!(envoy.metric("llm_filter_internal_errors_total", &[]), 0.0);
}
