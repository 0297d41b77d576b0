//! The OpenAI Responses and Anthropic Messages APIs through the real Envoy
//! with the filter: each a call the filter understands in its own dialect,
//! routed with the backend's model name, continued on the backend that holds
//! its state, counted from its own usage, refused in its own error shape.

use std::collections::BTreeSet;
use std::time::Duration;

use llm_filter_e2e::{
    messages_body, post_json, post_raw, responses_body, skip_without_envoy, stream_sse, Envoy,
    EnvoyBuilder, MockUpstream,
};
use serde_json::{json, Value};

use crate::support::alerts::fire;

const CLUSTER_HEADER: &str = "x-llm-cluster";
const DEADLINE: Duration = Duration::from_secs(20);
const TOKEN: &str = "e2e-admin-token-0123456789";

/// Two backends, a and b, of `gpt-4o` and of `claude`, each with its own
/// name of the model, behind a default route to `default`.
fn routed(default: &MockUpstream, a: &MockUpstream, b: &MockUpstream, extra: Value) -> Envoy {
    let mut config = json!({"routing": {"models": {
        "gpt-4o": [{"cluster": "a", "model": "gpt-4o-a"}, {"cluster": "b", "model": "gpt-4o-b"}],
        "claude": [{"cluster": "a", "model": "claude-a"}, {"cluster": "b", "model": "claude-b"}]
    }}});
    if let (Some(c), Value::Object(more)) = (config.as_object_mut(), extra) {
        c.extend(more);
    }
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream(default.name(), default.port())
        .upstream(a.name(), a.port())
        .upstream(b.name(), b.port())
        .header_route(CLUSTER_HEADER)
        .route_timeout_ms(10_000)
        .start()
        .expect("envoy with the filter and routing")
}

fn backends() -> (MockUpstream, MockUpstream, MockUpstream) {
    (
        MockUpstream::backend("default", 0),
        MockUpstream::backend("a", 0),
        MockUpstream::backend("b", 0),
    )
}

/// The last call a backend got on `path`, as JSON.
fn last_sent(
    backend: &MockUpstream,
    path: &str,
) -> Option<(Value, llm_filter_e2e::RecordedRequest)> {
    let r = backend
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path == path)?;
    Some((r.json()?, r))
}

#[tokio::test]
async fn both_apis_are_routed_tagged_and_counted_in_their_own_words() {
    if skip_without_envoy("both_apis_are_routed_tagged_and_counted_in_their_own_words") {
        return;
    }
    let (default, a, b) = backends();
    let envoy = routed(&default, &a, &b, json!({}));
    for (path, body, model) in [
        (
            "/v1/responses",
            responses_body("gpt-4o", "hello responses"),
            "gpt-4o",
        ),
        (
            "/v1/messages",
            messages_body("claude", "hello messages"),
            "claude",
        ),
    ] {
        let r = post_json(&envoy.url(path), &body, &[("x-api-key", "sk-ant-e2e")])
            .await
            .expect("call");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let cluster = r.header(CLUSTER_HEADER).expect("routed").to_string();
        assert!(r.header("x-trace-id").is_some(), "{path}");
        let backend = if cluster == "a" { &a } else { &b };
        let (sent, req) = last_sent(backend, path).expect("the backend got the call");
        // The backend's name of the model, every other byte the client's.
        let mut want = body.clone();
        want["model"] = json!(format!("{model}-{cluster}"));
        assert_eq!(sent, want, "{path}");
        assert!(req.header("traceparent").is_some(), "{path}");
        assert!(
            req.header("baggage")
                .unwrap_or_default()
                .contains("priority=P1"),
            "{path}"
        );
        assert_eq!(req.header("x-api-key"), Some("sk-ant-e2e"));
        // The answer is the backend's, in its dialect.
        let answer = r.json();
        match path {
            "/v1/responses" => assert_eq!(answer["object"], "response"),
            _ => assert_eq!(answer["type"], "message"),
        }
        let usage = &answer["usage"];
        let input = usage["input_tokens"].as_f64().unwrap();
        let output = usage["output_tokens"].as_f64().unwrap();
        for (kind, n) in [("input", input), ("output", output)] {
            let got = envoy.wait_for_metric(
                "gen_ai_client_token_usage_total",
                &[("model", model), ("token_type", kind)],
                n,
                DEADLINE,
            );
            assert_eq!(got, n, "{path} {kind}");
        }
        let calls = envoy.wait_for_metric(
            "llm_filter_requests_total",
            &[("model", model), ("outcome", "success")],
            1.0,
            DEADLINE,
        );
        assert_eq!(calls, 1.0, "{path}");
    }
    assert_eq!(default.request_count(), 0, "every call was routed");
}

#[tokio::test]
async fn streams_reach_the_client_as_the_backend_sent_them_and_are_counted() {
    if skip_without_envoy("streams_reach_the_client_as_the_backend_sent_them_and_are_counted") {
        return;
    }
    let (default, a, b) = backends();
    let envoy = routed(&default, &a, &b, json!({}));
    for (path, model, mut body, first, last) in [
        (
            "/v1/responses",
            "gpt-4o",
            responses_body("gpt-4o", "stream the response"),
            "response.created",
            "response.completed",
        ),
        (
            "/v1/messages",
            "claude",
            messages_body("claude", "stream the message"),
            "message_start",
            "message_stop",
        ),
    ] {
        body["stream"] = json!(true);
        let sse = stream_sse(&envoy.url(path), &body, &[])
            .await
            .expect("stream");
        assert_eq!(sse.status, 200, "{path}");
        let cluster = sse.header(CLUSTER_HEADER).expect("routed").to_string();
        let names = sse.event_names();
        assert_eq!(names.first().copied(), Some(first), "{path}: {names:?}");
        assert_eq!(names.last().copied(), Some(last), "{path}: {names:?}");
        assert!(!sse.done(), "no [DONE] in {path}");
        assert!(sse.trailing.is_empty());
        assert_eq!(
            sse.content(),
            format!("echo: {} [{cluster}]", body_text(&body))
        );
        // Nothing was asked of the backend on the client's behalf.
        let backend = if cluster == "a" { &a } else { &b };
        let (sent, _) = last_sent(backend, path).expect("the backend got it");
        assert!(sent.get("stream_options").is_none(), "{sent}");
        let usage = sse.usage().expect("the stream's usage");
        let output = usage["output_tokens"].as_f64().unwrap();
        let got = envoy.wait_for_metric(
            "gen_ai_client_token_usage_total",
            &[("model", model), ("token_type", "output")],
            output,
            DEADLINE,
        );
        assert_eq!(got, output, "{path}");
    }
}

/// The user text of a Responses or Messages body.
fn body_text(body: &Value) -> String {
    body.get("input")
        .or_else(|| body.pointer("/messages/0/content"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_continued_response_reaches_the_backend_that_holds_it() {
    if skip_without_envoy("a_continued_response_reaches_the_backend_that_holds_it") {
        return;
    }
    let (default, a, b) = backends();
    let envoy = routed(&default, &a, &b, json!({}));
    let url = envoy.url("/v1/responses");
    let first = post_json(&url, &responses_body("gpt-4o", "first turn"), &[])
        .await
        .expect("call");
    assert_eq!(first.status, 200, "{}", first.text());
    let holder = first.header(CLUSTER_HEADER).expect("routed").to_string();
    let mut id = first.json()["id"]
        .as_str()
        .expect("a response id")
        .to_string();
    // A conversation of 12 turns, each continuing the last: every one goes
    // to the backend holding the previous response (the other backend
    // would answer 400, as a provider does for an id it never stored).
    for turn in 0..12 {
        let mut body = responses_body("gpt-4o", &format!("turn {turn}"));
        body["previous_response_id"] = json!(id);
        let r = post_json(&url, &body, &[]).await.expect("call");
        assert_eq!(r.status, 200, "turn {turn}: {}", r.text());
        assert_eq!(
            r.header(CLUSTER_HEADER),
            Some(holder.as_str()),
            "turn {turn}"
        );
        id = r.json()["id"].as_str().expect("a response id").to_string();
    }
    // New conversations still spread over both backends.
    let mut seen = BTreeSet::new();
    for n in 0..30 {
        let r = post_json(&url, &responses_body("gpt-4o", &format!("fresh {n}")), &[])
            .await
            .expect("call");
        seen.insert(r.header(CLUSTER_HEADER).map(str::to_string));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[tokio::test]
async fn a_shed_call_is_refused_in_its_callers_error_shape() {
    if skip_without_envoy("a_shed_call_is_refused_in_its_callers_error_shape") {
        return;
    }
    let (default, a, b) = backends();
    let envoy = routed(
        &default,
        &a,
        &b,
        json!({"admin": {"token": TOKEN}, "degrade": {"alerts": [{"severity": "page", "level": 2}]}}),
    );
    fire(
        &envoy,
        TOKEN,
        json!({"alertname": "LLMSlow", "severity": "page"}),
    )
    .await;
    let p2 = [("x-request-priority", "P2")];
    let before = a.request_count() + b.request_count();

    let m = post_json(
        &envoy.url("/v1/messages"),
        &messages_body("claude", "shed me"),
        &p2,
    )
    .await
    .expect("call");
    assert_eq!(m.status, 529, "{}", m.text());
    assert!(m.header("retry-after").is_some());
    let v = m.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(v["error"]["code"], "llm_filter_degraded_shed");

    let r = post_json(
        &envoy.url("/v1/responses"),
        &responses_body("gpt-4o", "shed me"),
        &p2,
    )
    .await
    .expect("call");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "llm_filter_degraded_shed");
    assert_eq!(
        a.request_count() + b.request_count(),
        before,
        "nothing went upstream"
    );

    // P1 goes on, degraded.
    let ok = post_json(
        &envoy.url("/v1/messages"),
        &messages_body("claude", "still served"),
        &[],
    )
    .await
    .expect("call");
    assert_eq!(ok.status, 200, "{}", ok.text());
}

#[tokio::test]
async fn each_dialect_is_shaped_by_its_own_fields() {
    if skip_without_envoy("each_dialect_is_shaped_by_its_own_fields") {
        return;
    }
    let (default, a, b) = backends();
    let envoy = routed(
        &default,
        &a,
        &b,
        json!({"shaping": {"max_history_turns": {"P1": 1}, "max_tokens_cap": {"P1": 64}}}),
    );
    let messages = json!({"model": "claude", "max_tokens": 4096, "system": "be brief", "messages": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
        {"role": "assistant", "content": "sunny"},
        {"role": "user", "content": "last"}
    ]});
    let responses = json!({"model": "gpt-4o", "instructions": "be brief", "max_output_tokens": 4096, "input": [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "last"}
    ]});
    for (path, body, field, list, kept) in [
        ("/v1/messages", messages, "max_tokens", "messages", 1),
        ("/v1/responses", responses, "max_output_tokens", "input", 2),
    ] {
        let r = post_json(&envoy.url(path), &body, &[]).await.expect("call");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(
            r.header("x-llm-shaped"),
            Some("max_tokens,history"),
            "{path}"
        );
        let backend = if r.header(CLUSTER_HEADER) == Some("a") {
            &a
        } else {
            &b
        };
        let (sent, _) = last_sent(backend, path).expect("the backend got it");
        assert_eq!(sent[field], 64, "{path}: {sent}");
        let items = sent[list].as_array().expect("the conversation");
        assert_eq!(items.len(), kept, "{path}: {sent}");
        assert_eq!(items.last().unwrap()["content"], "last", "{path}");
        // The system prompt and instructions are never trimmed.
        assert_eq!(
            sent.get("system").or_else(|| sent.get("instructions")),
            Some(&json!("be brief"))
        );
    }
}

#[tokio::test]
async fn a_body_that_is_not_the_dialects_json_reaches_the_upstream_as_sent() {
    if skip_without_envoy("a_body_that_is_not_the_dialects_json_reaches_the_upstream_as_sent") {
        return;
    }
    let (default, a, b) = backends();
    let envoy = routed(&default, &a, &b, json!({}));
    for path in ["/v1/messages", "/v1/responses"] {
        let broken = r#"{"model":"claude","messages":[{"role":"user","content":"#;
        let r = post_raw(&envoy.url(path), broken, &[]).await.expect("call");
        // The upstream's own refusal, in its own shape.
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.header("x-cache"), Some("BYPASS"), "{path}");
        let seen = default
            .requests()
            .into_iter()
            .rev()
            .find(|q| q.path == path)
            .expect("the default route got it");
        assert_eq!(seen.body.as_ref(), broken.as_bytes(), "{path}");
        assert!(seen.header("traceparent").is_some(), "{path}");
    }
}
