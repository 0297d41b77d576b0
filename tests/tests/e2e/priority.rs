//! The call's priority as the upstream sees it: the client's `x-request-priority`
//! normalised when valid and trusted, `priority.default` otherwise, forwarded as
//! `x-request-priority` and as the `priority` member of `baggage`.

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, unique, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

/// What the client sends (`None`: no header at all).
const SENT: [Option<&str>; 9] = [
    Some("P0"),
    Some("p2"),
    Some("P1"),
    Some("p0"),
    Some("P9"),
    Some("high"),
    Some(""),
    Some("P 1"),
    None,
];

fn start(mock: &MockUpstream, config: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

/// Sends one chat call per `(sent, expected)` row and checks both headers upstream.
async fn check(envoy: &Envoy, mock: &MockUpstream, config: &Value, rows: &[(Option<&str>, &str)]) {
    for (sent, want) in rows {
        let case = format!("config {config}, x-request-priority {sent:?}");
        let headers: Vec<(&str, &str)> = sent
            .iter()
            .map(|value| ("x-request-priority", *value))
            .collect();
        mock.clear();
        let response = post_json(
            &envoy.url("/v1/chat/completions"),
            &chat_body("gpt-4o", &unique("which priority")),
            &headers,
        )
        .await
        .unwrap_or_else(|e| panic!("{case}: {e:#}"));
        assert_eq!(response.status, 200, "{case}: {}", response.text());

        let seen = mock.last_request().expect("upstream saw the call");
        assert_eq!(seen.header_all("x-request-priority"), [*want], "{case}");
        let baggage = format!("priority={want}");
        assert_eq!(seen.header_all("baggage"), [baggage.as_str()], "{case}");
    }
}

#[tokio::test]
async fn client_priority_is_normalised_with_p1_as_default() {
    if skip_without_envoy("client_priority_is_normalised_with_p1_as_default") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("prio"));
    let config = json!({});
    let envoy = start(&mock, config.clone());
    let expected = ["P0", "P2", "P1", "P0", "P1", "P1", "P1", "P1", "P1"];
    let rows: Vec<_> = SENT.into_iter().zip(expected).collect();
    check(&envoy, &mock, &config, &rows).await;
}

#[tokio::test]
async fn default_applies_to_missing_and_invalid() {
    if skip_without_envoy("default_applies_to_missing_and_invalid") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("prio-default"));
    let config = json!({"priority": {"default": "P2"}});
    let envoy = start(&mock, config.clone());
    let expected = ["P0", "P2", "P1", "P0", "P2", "P2", "P2", "P2", "P2"];
    let rows: Vec<_> = SENT.into_iter().zip(expected).collect();
    check(&envoy, &mock, &config, &rows).await;
}

#[tokio::test]
async fn untrusted_client_always_gets_the_default() {
    if skip_without_envoy("untrusted_client_always_gets_the_default") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("prio-untrusted"));
    for (config, default) in [
        (json!({"priority": {"trust_client": false}}), "P1"),
        (
            json!({"priority": {"trust_client": false, "default": "p0"}}),
            "P0",
        ),
    ] {
        let envoy = start(&mock, config.clone());
        let rows: Vec<_> = SENT.into_iter().map(|sent| (sent, default)).collect();
        check(&envoy, &mock, &config, &rows).await;
    }
}

/// A request body for an LLM `path`, its own for each call so that none is
/// answered without the upstream.
fn body_for(path: &str) -> Value {
    let text = unique("path");
    if path.starts_with("/v1/embeddings") {
        json!({"model": "text-embedding-3-small", "input": text})
    } else if path.starts_with("/v1/completions") {
        json!({"model": "gpt-4o", "prompt": text})
    } else {
        chat_body("gpt-4o", &text)
    }
}

#[tokio::test]
async fn every_llm_path_is_tagged_once() {
    if skip_without_envoy("every_llm_path_is_tagged_once") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("prio-paths"));
    let envoy = start(&mock, json!({}));
    let paths = [
        "/v1/chat/completions",
        "/v1/completions?api-version=2024-06-01",
        "/v1/embeddings",
    ];
    for path in paths {
        // A repeated header is not forwarded twice: one normalised value goes on.
        for sent in [&["p0"][..], &["p2", "P0"][..]] {
            let case = format!("{path} with x-request-priority {sent:?}");
            let headers: Vec<(&str, &str)> =
                sent.iter().map(|v| ("x-request-priority", *v)).collect();
            mock.clear();
            let response = post_json(&envoy.url(path), &body_for(path), &headers)
                .await
                .unwrap_or_else(|e| panic!("{case}: {e:#}"));
            assert_eq!(response.status, 200, "{case}: {}", response.text());
            assert!(response.header("x-trace-id").is_some(), "{case}");
            let seen = mock.last_request().expect("upstream saw the call");
            let priority = seen.header_all("x-request-priority");
            assert_eq!(priority.len(), 1, "{case}: {priority:?}");
            assert!(
                sent.iter().any(|s| s.eq_ignore_ascii_case(priority[0])),
                "{case}: {priority:?}"
            );
            let baggage = format!("priority={}", priority[0]);
            assert_eq!(seen.header_all("baggage"), [baggage.as_str()], "{case}");
            assert_eq!(seen.header_all("traceparent").len(), 1, "{case}");
        }
    }
}
