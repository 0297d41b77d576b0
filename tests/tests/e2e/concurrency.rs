//! Every worker tags its calls: with two Envoy workers and a new connection per
//! call, concurrent calls each reach the upstream with their own priority,
//! baggage and trace, and new traces never share an id across workers.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures_util::future::join_all;
use llm_filter_e2e::{
    chat_body, http_client_without_reuse, send_bytes, skip_without_envoy, EnvoyBuilder, MockConfig,
    MockUpstream,
};
use reqwest::Method;

const CALLS: usize = 32;
const PRIORITIES: [&str; 3] = ["P0", "P1", "P2"];

/// A valid trace id of its own for call `i` (never all zero).
fn trace_id(i: usize) -> String {
    format!("{:016x}{:016x}", 0x1000 + i, 0xabc0 + i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_on_new_connections_are_each_tagged() {
    if skip_without_envoy("concurrent_calls_on_new_connections_are_each_tagged") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("conc"));
    // Calls overlap at the upstream, so both workers are busy at once.
    mock.set_default_delay_ms(150);
    let envoy = EnvoyBuilder::new()
        .plugin_config("{}")
        .concurrency(2)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter");
    let client = http_client_without_reuse();
    let url = envoy.url("/v1/chat/completions");

    let calls = (0..CALLS).map(|i| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let call = i.to_string();
            let priority = PRIORITIES[i % 3].to_lowercase();
            let baggage = format!("call={i}");
            // Every other call continues a trace; the rest start one.
            let traceparent = format!("00-{}-00f067aa0ba902b7-01", trace_id(i));
            let mut headers = vec![
                ("content-type", "application/json"),
                ("connection", "close"),
                ("x-call", call.as_str()),
                ("x-request-priority", priority.as_str()),
                ("baggage", baggage.as_str()),
            ];
            if i % 2 == 0 {
                headers.push(("traceparent", traceparent.as_str()));
            }
            let body = chat_body("gpt-4o", &format!("call {i}"))
                .to_string()
                .into_bytes();
            let response = send_bytes(&client, Method::POST, &url, Some(body), &headers)
                .await
                .unwrap_or_else(|e| panic!("call {i}: {e:#}"));
            (i, response)
        }
    });
    let responses = join_all(calls).await;

    assert!(
        mock.requests_reach(CALLS, Duration::from_secs(10)).await,
        "upstream saw {} of {CALLS} calls",
        mock.request_count()
    );
    let seen: HashMap<String, _> = mock
        .requests()
        .into_iter()
        .map(|r| (r.header("x-call").unwrap_or_default().to_string(), r))
        .collect();
    assert_eq!(seen.len(), CALLS, "one upstream request per call");

    let mut new_traces = HashSet::new();
    for (i, response) in responses {
        assert_eq!(response.status, 200, "call {i}: {}", response.text());
        let request = &seen[&i.to_string()];
        let priority = PRIORITIES[i % 3];
        assert_eq!(
            request.header_all("x-request-priority"),
            [priority],
            "call {i}"
        );
        let baggage = format!("call={i},priority={priority}");
        assert_eq!(
            request.header_all("baggage"),
            [baggage.as_str()],
            "call {i}"
        );
        let traceparent = request.header("traceparent").expect("traceparent");
        let upstream_trace = traceparent.get(3..35).unwrap_or_default();
        assert_eq!(
            response.header("x-trace-id"),
            Some(upstream_trace),
            "call {i}"
        );
        assert!(
            response.json()["choices"][0]["message"]["content"]
                .as_str()
                .is_some_and(|c| c.contains(&format!("call {i} "))),
            "call {i} got another call's answer: {}",
            response.text()
        );
        if i % 2 == 0 {
            assert_eq!(upstream_trace, trace_id(i), "call {i} continued");
        } else {
            assert!(
                new_traces.insert(upstream_trace.to_string()),
                "call {i}: trace id {upstream_trace} already used"
            );
        }
    }

    // Each call came on its own connection.
    let connections = envoy.wait_for_stat(
        "http.ingress.downstream_cx_total",
        CALLS as u64,
        Duration::from_secs(5),
    );
    assert!(connections >= CALLS as u64, "{connections} connections");
    // Both workers, each with its own VM, served some of them (the kernel spreads
    // 32 connections over two workers; all on one has odds of 2^-31).
    let per_worker: Vec<(String, u64)> = envoy
        .stats_matching(".downstream_cx_total")
        .into_iter()
        .filter(|(name, _)| name.starts_with("listener.") && name.contains(".worker_"))
        .collect();
    assert_eq!(per_worker.len(), 2, "{per_worker:?}");
    assert!(
        per_worker.iter().all(|(_, n)| *n > 0),
        "a worker served nothing: {per_worker:?}"
    );
}
