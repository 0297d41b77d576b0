//! The official OpenAI Python SDK (pinned in the Makefile, installed into the
//! project venv) as a real client of Envoy with the filter: each test starts
//! the mock and Envoy, runs `tests/sdk/openai_client.py <scenario>` with its
//! `base_url` on Envoy, and asserts on the JSON it prints and on what the mock
//! received. What an SDK user sees: answers, streams chunk by chunk with the
//! final usage, embeddings, the cache's `x-cache` through `with_raw_response`,
//! a shed call as the SDK's status error carrying the filter's `code` after
//! retries spaced by `retry-after`, and a spent budget not retried.

use std::time::Duration;

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, Envoy, EnvoyBuilder, HttpResponse, MockConfig,
    MockUpstream,
};
use serde_json::{json, Value};

use crate::support;

const KEY: &str = "Bearer sk-e2e-sdk";
const DEADLINE: Duration = Duration::from_secs(20);

/// Runs one scenario of the OpenAI SDK script against `envoy`; its JSON output.
async fn sdk(envoy: &Envoy, scenario: &str, args: &[&str]) -> Value {
    support::sdk::run(support::sdk::OPENAI, scenario, &envoy.url("/v1"), args).await
}

fn start(mock: &MockUpstream, config: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

/// What the SDK sent: its key, its own user agent, the filter's trace.
fn assert_sent_by_the_sdk(mock: &MockUpstream, path: &str) -> Value {
    let seen = mock
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path == path)
        .unwrap_or_else(|| panic!("the mock got no call on {path}"));
    assert_eq!(seen.header("authorization"), Some(KEY));
    let agent = seen.header("user-agent").unwrap_or_default();
    assert!(agent.starts_with("OpenAI/Python"), "user-agent {agent}");
    assert!(seen.header("traceparent").is_some(), "the filter ran");
    seen.json().expect("a JSON body")
}

#[tokio::test]
async fn chat_through_the_sdk() {
    if skip_without_envoy("chat_through_the_sdk") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("sdk"));
    let envoy = start(&mock, json!({}));
    let out = sdk(&envoy, "chat", &["--prompt", "hi there"]).await;
    assert_eq!(out["content"], "echo: hi there [sdk]", "{out}");
    assert_eq!(out["model"], "gpt-4o-mini", "{out}");
    assert_eq!(out["finish_reason"], "stop", "{out}");
    assert!(
        out["usage"]["total"].as_u64().is_some_and(|n| n > 0),
        "{out}"
    );
    let body = assert_sent_by_the_sdk(&mock, "/v1/chat/completions");
    assert_eq!(body["messages"][0]["content"], "hi there");
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn a_stream_arrives_chunk_by_chunk_with_its_usage() {
    if skip_without_envoy("a_stream_arrives_chunk_by_chunk_with_its_usage") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        chunk_delay_ms: 100,
        ..MockConfig::named("sdk")
    });
    let envoy = start(&mock, json!({}));
    let prompt = "one two three four five";
    let out = sdk(&envoy, "stream", &["--prompt", prompt]).await;
    assert_eq!(out["content"], format!("echo: {prompt} [sdk]"), "{out}");
    let chunks = out["chunks"].as_array().expect("chunks");
    // A role chunk, one per word, the finish, the usage.
    assert!(chunks.len() >= 8, "{out}");
    let last = chunks.last().expect("a last chunk");
    assert!(
        last["usage"]["total"].as_u64().is_some_and(|n| n > 0),
        "the final chunk carries the usage: {out}"
    );
    assert!(
        chunks.iter().rev().skip(1).all(|c| c["usage"].is_null()),
        "{out}"
    );
    // Chunk by chunk: the SDK read them as the mock wrote them, 100 ms apart,
    // not all at once at the end.
    let at = |c: &Value| c["at_ms"].as_u64().expect("at_ms");
    let spread = at(last) - at(&chunks[0]);
    assert!(spread >= 500, "chunks within {spread} ms: {out}");
    let body = assert_sent_by_the_sdk(&mock, "/v1/chat/completions");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn embeddings_through_the_sdk() {
    if skip_without_envoy("embeddings_through_the_sdk") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("sdk"));
    let envoy = start(&mock, json!({}));
    let out = sdk(&envoy, "embeddings", &["--model", "text-embedding-3-small"]).await;
    assert_eq!(out["count"], 3, "{out}");
    assert_eq!(out["indexes"], json!([0, 1, 2]), "{out}");
    let dims = llm_filter_e2e::mock::EMBEDDING_DIMENSIONS;
    assert_eq!(out["dimensions"], json!([dims, dims, dims]), "{out}");
    assert!(
        out["usage"]["prompt"].as_u64().is_some_and(|n| n > 0),
        "{out}"
    );
    let body = assert_sent_by_the_sdk(&mock, "/v1/embeddings");
    assert_eq!(body["input"].as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn a_cache_hit_shows_through_with_raw_response() {
    if skip_without_envoy("a_cache_hit_shows_through_with_raw_response") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("sdk"));
    let envoy = start(&mock, json!({"cache": {"enabled": true}}));
    let prompt = llm_filter_e2e::unique("cache me through the SDK");
    let out = sdk(&envoy, "cache", &["--prompt", &prompt]).await;
    let calls = out["calls"].as_array().expect("calls");
    assert_eq!(calls[0]["x_cache"], "MISS", "{out}");
    assert_eq!(calls[1]["x_cache"], "HIT", "{out}");
    assert!(calls[1]["age"].is_string(), "a hit has an age: {out}");
    // The SDK parses the stored answer like the fresh one.
    assert_eq!(calls[0]["content"], calls[1]["content"], "{out}");
    assert_eq!(calls[0]["id"], calls[1]["id"], "{out}");
    assert!(calls.iter().all(|c| c["status"] == 200), "{out}");
    assert_eq!(mock.request_count(), 1, "the hit never reached the mock");
}

/// One call with `budget_ms` at `priority`, straight to Envoy.
async fn call(envoy: &Envoy, priority: &str, budget_ms: u64, delay: Option<&str>) -> HttpResponse {
    let budget = budget_ms.to_string();
    let mut headers = vec![
        ("x-request-priority", priority),
        ("x-request-timeout-ms", budget.as_str()),
    ];
    if let Some(d) = delay {
        headers.push(("x-mock-delay-ms", d));
    }
    post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", priority),
        &headers,
    )
    .await
    .expect("call")
}

#[tokio::test]
async fn a_shed_call_is_the_sdks_status_error_retried_after_retry_after() {
    if skip_without_envoy("a_shed_call_is_the_sdks_status_error_retried_after_retry_after") {
        return;
    }
    // A backend that times out every call drives the breaker into its shed
    // tier (as budget_breaker.rs does): 10 good calls then 30 timeouts is 3/4
    // of the budgets spent, between shed_at and reject_at. A 20 s window
    // (2 s buckets, so retry-after is 2 to 4 s) holds the whole test; no
    // half-open probes, so every P2 call is shed.
    let mock = MockUpstream::start(MockConfig {
        default_delay_ms: 5000,
        ..MockConfig::named("sdk")
    });
    let config = json!({"budget": {"window_s": 20, "min_calls": 10, "probe_fraction": 0}});
    let envoy = start(&mock, config);
    for _ in 0..10 {
        let r = call(&envoy, "P0", 1000, Some("0")).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for _ in 0..3 {
        let burst = (0..10).map(|_| call(&envoy, "P0", 300, None));
        for r in futures_util::future::join_all(burst).await {
            assert_eq!(r.status, 504, "{}", r.text());
        }
    }
    let tier = envoy.wait_for_metric(
        "llm_filter_budget_breaker_tier",
        &[("llm_cluster", "default")],
        1.0,
        DEADLINE,
    );
    assert_eq!(tier, 1.0, "shed tier");
    let before = mock.request_count();

    let out = sdk(&envoy, "shed", &["--max-retries", "2"]).await;
    eprintln!("shed through the SDK: {out}");
    assert_eq!(out["error_class"], "InternalServerError", "{out}");
    assert_eq!(out["status"], 503, "{out}");
    assert_eq!(out["code"], "llm_filter_shed", "{out}");
    assert_eq!(out["type"], "service_unavailable", "{out}");
    // Three attempts (max_retries 2), each shed with a retry-after, and the
    // SDK waited what each one asked before the next.
    let attempts = out["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 3, "{out}");
    for pair in attempts.windows(2) {
        let asked_s: u64 = pair[0]["retry_after"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no retry-after: {out}"));
        assert!((2..=4).contains(&asked_s), "retry-after {asked_s}: {out}");
        let waited =
            pair[1]["sent_ms"].as_u64().unwrap_or(0) - pair[0]["sent_ms"].as_u64().unwrap_or(0);
        assert!(
            waited >= asked_s * 1000 && waited < asked_s * 1000 + 1500,
            "asked {asked_s} s, waited {waited} ms: {out}"
        );
    }
    assert!(attempts.iter().all(|a| a["status"] == 503), "{out}");
    assert_eq!(
        mock.request_count(),
        before,
        "shed calls never reach the backend"
    );
    let shed = envoy.wait_for_metric(
        "llm_filter_budget_shed_total",
        &[("priority", "P2")],
        3.0,
        DEADLINE,
    );
    assert_eq!(shed, 3.0, "one shed per SDK attempt");
}

#[tokio::test]
async fn a_spent_budget_is_the_sdks_timeout_status_and_not_retried() {
    if skip_without_envoy("a_spent_budget_is_the_sdks_timeout_status_and_not_retried") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        default_delay_ms: 3000,
        ..MockConfig::named("sdk")
    });
    let envoy = start(&mock, json!({}));
    // The caller can wait 500 ms (x-request-timeout-ms through extra_headers);
    // the backend takes 3 s; the SDK would retry twice and wait 30 s itself.
    let out = sdk(
        &envoy,
        "budget",
        &[
            "--budget-ms",
            "500",
            "--max-retries",
            "2",
            "--timeout",
            "30",
        ],
    )
    .await;
    eprintln!("spent budget through the SDK: {out}");
    assert_eq!(out["error_class"], "InternalServerError", "{out}");
    assert_eq!(out["status"], 504, "{out}");
    assert_eq!(out["type"], "timeout", "{out}");
    assert_eq!(out["code"], "llm_filter_upstream_timeout", "{out}");
    let attempts = out["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "x-should-retry: false is obeyed: {out}");
    assert_eq!(attempts[0]["should_retry"], "false", "{out}");
    // From the attempt to the SDK's error: the budget, not the backend's 3 s.
    let answered = out["elapsed_ms"].as_u64().expect("elapsed_ms")
        - attempts[0]["sent_ms"].as_u64().expect("sent_ms");
    assert!(
        (450..2000).contains(&answered),
        "raised {answered} ms after the call was sent"
    );
    // The budget the SDK sent became the upstream's timeout.
    let seen = mock.last_request().expect("the call went upstream once");
    let told: u64 = seen
        .header("x-envoy-expected-rq-timeout-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no expected timeout in {:?}", seen.headers));
    assert!((100..=500).contains(&told), "upstream told {told} ms");
    assert_eq!(mock.request_count(), 1);
}
