//! The official SDKs on the OpenAI Responses and Anthropic Messages APIs
//! against the mock through plain Envoy (no filter): proof that the mock
//! answers as the providers do, in shapes the SDKs parse, and that the
//! scenarios of `tests/sdk/openai_client.py` (`responses*`) and
//! `tests/sdk/anthropic_client.py` print what the filter's scenarios assert
//! on: answers, streams event by event with their usage, raw headers, and
//! errors as the SDKs' typed exceptions after the retries `retry-after` and
//! `x-should-retry` ask for.

use futures_util::future::join_all;
use llm_filter_e2e::{skip_without_envoy, Envoy, EnvoyBuilder, MockConfig, MockUpstream};
use serde_json::{json, Value};

use crate::support::alerts::fire;
use crate::support::sdk::{run, ANTHROPIC, OPENAI};

fn plain_envoy(mock: &MockUpstream) -> Envoy {
    EnvoyBuilder::new()
        .no_filter()
        .upstream("mock", mock.port())
        .start()
        .expect("plain envoy")
}

async fn openai(envoy: &Envoy, scenario: &str, args: &[&str]) -> Value {
    run(OPENAI, scenario, &envoy.url("/v1"), args).await
}

async fn anthropic(envoy: &Envoy, scenario: &str, args: &[&str]) -> Value {
    run(ANTHROPIC, scenario, &envoy.url(""), args).await
}

/// The last call the mock got on `path`, as JSON.
fn last_body(mock: &MockUpstream, path: &str) -> (llm_filter_e2e::RecordedRequest, Value) {
    let seen = mock
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path == path)
        .unwrap_or_else(|| panic!("the mock got no call on {path}"));
    let body = seen.json().expect("a JSON body");
    (seen, body)
}

/// The event types of a stream of `words` text deltas, in order.
fn stream_events(head: &[&str], delta: &[&str], words: usize, tail: &[&str]) -> Value {
    let mut events: Vec<&str> = head.to_vec();
    for _ in 0..words {
        events.extend_from_slice(delta);
    }
    events.extend_from_slice(tail);
    json!(events)
}

/// Milliseconds from the first event of type `from` to the last event the
/// SDK yielded: the pace of the stream once the SDK's parser is warm.
fn spread_from(out: &Value, from: &str) -> u64 {
    let events = out["events"].as_array().expect("events");
    let at = out["at_ms"].as_array().expect("at_ms");
    let first = events.iter().position(|e| e == from).expect("the event");
    let ms = |v: &Value| v.as_u64().expect("ms");
    ms(at.last().expect("an event")) - ms(&at[first])
}

/// Milliseconds between the SDK's consecutive attempts, and the
/// `retry-after` each earlier one carried.
fn waits(out: &Value) -> Vec<(u64, Option<u64>)> {
    let attempts = out["attempts"].as_array().expect("attempts");
    attempts
        .windows(2)
        .map(|pair| {
            let sent = |a: &Value| a["sent_ms"].as_u64().expect("sent_ms");
            let asked = pair[0]["retry_after"].as_str().and_then(|s| s.parse().ok());
            (sent(&pair[1]) - sent(&pair[0]), asked)
        })
        .collect()
}

#[tokio::test]
async fn responses_through_the_openai_sdk() {
    if skip_without_envoy("responses_through_the_openai_sdk") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        chunk_delay_ms: 50,
        ..MockConfig::named("resp")
    });
    let envoy = plain_envoy(&mock);
    let prompt = ["--prompt", "one two three", "--instructions", "be brief"];

    let out = openai(&envoy, "responses", &prompt).await;
    let text = "echo: one two three [resp]";
    assert_eq!(out["output_text"], text, "{out}");
    assert_eq!(out["status"], "completed", "{out}");
    assert!(out["id"].as_str().unwrap().starts_with("resp_"), "{out}");
    // 2 + 3 words in, 5 out.
    assert_eq!(
        out["usage"],
        json!({"input": 5, "output": 5, "cached": 0, "total": 10}),
        "{out}"
    );
    let (seen, body) = last_body(&mock, "/v1/responses");
    assert_eq!(seen.header("authorization"), Some("Bearer sk-e2e-sdk"));
    assert!(seen
        .header("user-agent")
        .unwrap_or_default()
        .starts_with("OpenAI/Python"));
    assert_eq!(body["input"], "one two three");
    assert_eq!(body["instructions"], "be brief");

    let out = openai(&envoy, "responses_stream", &prompt).await;
    let expected = stream_events(
        &[
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ],
        &["response.output_text.delta"],
        5,
        &[
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ],
    );
    assert_eq!(out["events"], expected, "{out}");
    let count = expected.as_array().map_or(0, Vec::len);
    assert_eq!(
        out["sequence_numbers"],
        json!((0..count).collect::<Vec<_>>())
    );
    assert_eq!(
        (&out["text"], &out["output_text"]),
        (&json!(text), &json!(text))
    );
    assert_eq!(out["usage"]["total"], 10, "{out}");
    // Event by event, 50 ms apart, not all at once: 8 gaps from the first
    // delta to response.completed.
    let spread = spread_from(&out, "response.output_text.delta");
    assert!(spread >= 200, "events within {spread} ms: {out}");
    assert_eq!(last_body(&mock, "/v1/responses").1["stream"], true);

    let out = openai(
        &envoy,
        "responses_raw",
        &["--calls", "2", "--header", "cache-control: max-age=60"],
    )
    .await;
    let calls = out["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2, "{out}");
    for call in calls {
        assert_eq!(call["status"], 200, "{out}");
        assert_eq!(call["headers"]["x-mock-instance"], "resp", "{out}");
        assert!(call["x_cache"].is_null(), "no filter, no x-cache: {out}");
        assert_eq!(call["output_text"], "echo: hello from the SDK [resp]");
    }
    assert_ne!(calls[0]["id"], calls[1]["id"], "two answers: {out}");
    let (seen, _) = last_body(&mock, "/v1/responses");
    assert_eq!(seen.header("cache-control"), Some("max-age=60"));

    let out = openai(&envoy, "responses_chain", &[]).await;
    let calls = out["calls"].as_array().expect("calls");
    assert_eq!(calls[1]["previous_response_id"], calls[0]["id"], "{out}");
    assert!(calls.iter().all(|c| c["status"] == 200), "{out}");
    let (_, body) = last_body(&mock, "/v1/responses");
    assert_eq!(body["previous_response_id"], calls[0]["id"]);
}

#[tokio::test]
async fn a_failed_responses_call_is_the_openai_sdks_status_error_after_retry_after() {
    if skip_without_envoy(
        "a_failed_responses_call_is_the_openai_sdks_status_error_after_retry_after",
    ) {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("resp"));
    let envoy = plain_envoy(&mock);
    let args = [
        "--max-retries",
        "1",
        "--header",
        "x-mock-status: 503",
        "--header",
        "x-mock-retry-after: 1",
    ];
    let out = openai(&envoy, "responses_shed", &args).await;
    assert_eq!(out["error_class"], "InternalServerError", "{out}");
    assert_eq!(out["status"], 503, "{out}");
    assert_eq!(out["code"], "mock_status", "{out}");
    assert_eq!(out["type"], "server_error", "{out}");
    let waits = waits(&out);
    assert_eq!(waits.len(), 1, "one retry: {out}");
    let (waited, asked) = waits[0];
    assert_eq!(asked, Some(1), "{out}");
    assert!((1000..2500).contains(&waited), "waited {waited} ms: {out}");
    assert_eq!(mock.count("POST", "/v1/responses"), 2);
    let (seen, _) = last_body(&mock, "/v1/responses");
    assert_eq!(seen.header("x-request-priority"), Some("P2"));
}

#[tokio::test]
async fn messages_through_the_anthropic_sdk() {
    if skip_without_envoy("messages_through_the_anthropic_sdk") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        chunk_delay_ms: 50,
        ..MockConfig::named("claude")
    });
    let envoy = plain_envoy(&mock);
    let prompt = [
        "--prompt",
        "one two three",
        "--system",
        "be brief",
        "--user-id",
        "u-42",
    ];

    let out = anthropic(&envoy, "messages", &prompt).await;
    let text = "echo: one two three [claude]";
    assert_eq!(out["text"], text, "{out}");
    assert_eq!(out["stop_reason"], "end_turn", "{out}");
    assert!(out["id"].as_str().unwrap().starts_with("msg_"), "{out}");
    assert_eq!(
        out["usage"],
        json!({"input": 5, "output": 5, "cache_read": 0, "cache_creation": 0}),
        "{out}"
    );
    let (seen, body) = last_body(&mock, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some("sk-ant-e2e-sdk"));
    assert!(
        seen.header("anthropic-version").is_some(),
        "{:?}",
        seen.headers
    );
    assert!(seen.header("authorization").is_none());
    assert_eq!(body["system"], "be brief");
    assert_eq!(body["metadata"]["user_id"], "u-42");
    assert_eq!(body["max_tokens"], 1024);
    assert!(body.get("temperature").is_none(), "{body}");

    let out = anthropic(&envoy, "messages_stream", &prompt).await;
    // As the SDK's helper yields them: ping dropped, a text event after
    // each text delta.
    let expected = stream_events(
        &["message_start", "content_block_start"],
        &["content_block_delta", "text"],
        5,
        &["content_block_stop", "message_delta", "message_stop"],
    );
    assert_eq!(out["events"], expected, "{out}");
    assert_eq!(
        (&out["text"], &out["final_text"]),
        (&json!(text), &json!(text))
    );
    assert_eq!(out["usage"]["input"], 5, "from message_start: {out}");
    assert_eq!(out["usage"]["output"], 5, "from message_delta: {out}");
    // 50 ms apart: 7 gaps from the first delta to message_stop.
    let spread = spread_from(&out, "content_block_delta");
    assert!(spread >= 200, "events within {spread} ms: {out}");
    let sent = mock.sent_streams();
    let wire = String::from_utf8_lossy(sent.last().expect("a stream"));
    assert!(wire.contains("event: ping\n"), "the wire had the ping");

    // Raw, with the key where the SDK itself puts it (--auth bearer).
    let raw = ["--calls", "2", "--auth", "bearer"];
    let out = anthropic(&envoy, "messages_raw", &raw).await;
    let calls = out["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2, "{out}");
    for call in calls {
        assert_eq!(call["status"], 200, "{out}");
        assert_eq!(call["headers"]["x-mock-instance"], "claude", "{out}");
        assert!(call["request_id"].as_str().unwrap().starts_with("req_"));
        assert_eq!(call["text"], "echo: hello from the SDK [claude]");
    }
    let (seen, _) = last_body(&mock, "/v1/messages");
    assert_eq!(seen.header("authorization"), Some("Bearer sk-ant-e2e-sdk"));
    assert!(seen.header("x-api-key").is_none());
}

#[tokio::test]
async fn anthropic_errors_are_the_sdks_typed_exceptions() {
    if skip_without_envoy("anthropic_errors_are_the_sdks_typed_exceptions") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("claude"));
    let envoy = plain_envoy(&mock);
    // Scripted answers, the retries allowed, and what the SDK must make of
    // them: its exception, the status and error type, its attempts.
    struct Case {
        args: &'static [&'static str],
        retries: &'static str,
        class: &'static str,
        status: Value,
        kind: Value,
        attempts: usize,
    }
    let cases = [
        Case {
            args: &[
                "--header",
                "x-mock-status: 529",
                "--header",
                "x-mock-retry-after: 1",
            ],
            retries: "1",
            class: "OverloadedError",
            status: json!(529),
            kind: json!("overloaded_error"),
            attempts: 2,
        },
        Case {
            args: &[
                "--header",
                "x-mock-status: 429",
                "--header",
                "x-mock-should-retry: false",
            ],
            retries: "2",
            class: "RateLimitError",
            status: json!(429),
            kind: json!("rate_limit_error"),
            attempts: 1,
        },
        Case {
            args: &["--header", "x-mock-delay-ms: 3000", "--timeout", "0.5"],
            retries: "0",
            class: "APITimeoutError",
            status: Value::Null,
            kind: Value::Null,
            attempts: 1,
        },
    ];
    let runs = cases.iter().map(|case| {
        let mut args = case.args.to_vec();
        args.extend(["--max-retries", case.retries]);
        let envoy = &envoy;
        async move { anthropic(envoy, "messages_error", &args).await }
    });
    let outs = join_all(runs).await;
    for (case, out) in cases.iter().zip(&outs) {
        assert_eq!(out["error_class"], case.class, "{out}");
        assert_eq!(out["status"], case.status, "{out}");
        assert_eq!(out["type"], case.kind, "{out}");
        let attempts = out["attempts"].as_array().map(Vec::len);
        assert_eq!(attempts, Some(case.attempts), "{out}");
    }
    let overloaded = &outs[0];
    let (waited, asked) = waits(overloaded)[0];
    assert_eq!(asked, Some(1), "{overloaded}");
    assert!(
        (1000..2500).contains(&waited),
        "waited {waited} ms: {overloaded}"
    );
    assert_eq!(
        outs[1]["attempts"][0]["should_retry"], "false",
        "{}",
        outs[1]
    );
    assert!(outs[0]["request_id"].as_str().unwrap().starts_with("req_"));
}

// Through the filter: the same SDKs and scenarios, Envoy with llm-filter in
// front of the mock.

const ADMIN_TOKEN: &str = "e2e-admin-token-0123456789";

fn filtered_envoy(mock: &MockUpstream, config: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

#[tokio::test]
async fn both_sdks_call_their_apis_through_the_filter() {
    if skip_without_envoy("both_sdks_call_their_apis_through_the_filter") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("sdkf"));
    let envoy = filtered_envoy(&mock, json!({}));
    let echo = "echo: hello from the SDK [sdkf]";

    let (r, s, m, ms) = tokio::join!(
        openai(&envoy, "responses", &[]),
        openai(&envoy, "responses_stream", &[]),
        anthropic(&envoy, "messages", &[]),
        anthropic(&envoy, "messages_stream", &[]),
    );
    assert_eq!(r["output_text"], echo, "{r}");
    assert!(r["usage"]["input"].as_u64() > Some(0), "{r}");
    assert_eq!(s["output_text"], echo, "{s}");
    let events = s["events"].as_array().expect("events");
    assert_eq!(events.first(), Some(&json!("response.created")), "{s}");
    assert_eq!(events.last(), Some(&json!("response.completed")), "{s}");
    assert!(s["usage"]["output"].as_u64() > Some(0), "{s}");
    assert_eq!(m["text"], echo, "{m}");
    assert_eq!(m["stop_reason"], "end_turn", "{m}");
    assert_eq!(ms["final_text"], echo, "{ms}");
    let events = ms["events"].as_array().expect("events");
    assert_eq!(events.first(), Some(&json!("message_start")), "{ms}");
    assert_eq!(events.last(), Some(&json!("message_stop")), "{ms}");

    // Each call went upstream tagged, the key as the SDK sent it.
    for path in ["/v1/responses", "/v1/messages"] {
        let (seen, _) = last_body(&mock, path);
        assert!(seen.header("traceparent").is_some(), "{path}");
        assert!(
            seen.header("baggage")
                .unwrap_or_default()
                .contains("priority=P1"),
            "{path}"
        );
    }
    let (seen, _) = last_body(&mock, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some("sk-ant-e2e-sdk"));
    // Both streams and both answers counted under their models.
    for (model, calls) in [("gpt-4o-mini", 2.0), ("claude-sonnet-4-5", 2.0)] {
        let n = envoy.wait_for_metric(
            "llm_filter_requests_total",
            &[("model", model), ("outcome", "success")],
            calls,
            std::time::Duration::from_secs(20),
        );
        assert_eq!(n, calls, "{model}");
        let out = envoy.metric(
            "gen_ai_client_token_usage_total",
            &[("model", model), ("token_type", "output")],
        );
        assert!(out > 0.0, "{model}");
    }
}

/// The waits between an SDK's attempts, each against the `retry-after` the
/// attempt before asked for.
fn assert_waited_as_asked(out: &Value) {
    let attempts = out["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{out}");
    let asked_s: u64 = attempts[0]["retry_after"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no retry-after: {out}"));
    let waited =
        attempts[1]["sent_ms"].as_u64().unwrap_or(0) - attempts[0]["sent_ms"].as_u64().unwrap_or(0);
    assert!(
        waited >= asked_s * 1000 && waited < asked_s * 1000 + 2000,
        "asked {asked_s} s, waited {waited} ms: {out}"
    );
}

#[tokio::test]
async fn a_shed_call_is_each_sdks_typed_error_after_retry_after() {
    if skip_without_envoy("a_shed_call_is_each_sdks_typed_error_after_retry_after") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("sdks"));
    let envoy = filtered_envoy(
        &mock,
        json!({"admin": {"token": ADMIN_TOKEN},
               "degrade": {"alerts": [{"severity": "page", "level": 2}]}}),
    );
    fire(
        &envoy,
        ADMIN_TOKEN,
        json!({"alertname": "LLMSlow", "severity": "page"}),
    )
    .await;
    let before = mock.request_count();

    let (o, a) = tokio::join!(
        openai(&envoy, "responses_shed", &["--max-retries", "1"]),
        anthropic(
            &envoy,
            "messages_error",
            &["--max-retries", "1", "--header", "x-request-priority:P2"],
        ),
    );
    assert_eq!(o["error_class"], "InternalServerError", "{o}");
    assert_eq!(o["status"], 503, "{o}");
    assert_eq!(o["code"], "llm_filter_degraded_shed", "{o}");
    assert_waited_as_asked(&o);
    assert_eq!(a["error_class"], "OverloadedError", "{a}");
    assert_eq!(a["status"], 529, "{a}");
    assert_eq!(a["type"], "overloaded_error", "{a}");
    assert_waited_as_asked(&a);
    assert_eq!(
        mock.request_count(),
        before,
        "shed calls never reach the backend"
    );
}

#[tokio::test]
async fn each_sdk_gets_a_cache_hit_when_it_opts_in_by_max_age() {
    if skip_without_envoy("each_sdk_gets_a_cache_hit_when_it_opts_in_by_max_age") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("sdkc"));
    let envoy = filtered_envoy(&mock, json!({}));
    let opt_in = ["--calls", "2", "--header", "cache-control:max-age=300"];
    let (o, a, plain) = tokio::join!(
        openai(&envoy, "responses_raw", &opt_in),
        anthropic(&envoy, "messages_raw", &opt_in),
        // Without the opt-in a Messages call has no temperature to tell it
        // deterministic: never cached.
        anthropic(
            &envoy,
            "messages_raw",
            &["--calls", "2", "--prompt", "not opted in"]
        ),
    );
    for out in [&o, &a] {
        let calls = out["calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 2, "{out}");
        assert_eq!(calls[0]["x_cache"], "MISS", "{out}");
        assert_eq!(calls[1]["x_cache"], "HIT", "{out}");
        assert_eq!(calls[1]["status"], 200, "{out}");
        // The SDK parsed the replay as it parsed the answer.
        assert_eq!(calls[0]["id"], calls[1]["id"], "{out}");
    }
    assert_eq!(o["calls"][1]["output_text"], o["calls"][0]["output_text"]);
    assert_eq!(a["calls"][1]["text"], a["calls"][0]["text"]);
    let plain = plain["calls"].as_array().expect("calls");
    assert!(plain.iter().all(|c| c["x_cache"] == "BYPASS"), "{plain:?}");
    // One upstream call per opted-in API, two for the one not opted in.
    let count = |path: &str| mock.requests().iter().filter(|r| r.path == path).count();
    assert_eq!(count("/v1/responses"), 1);
    assert_eq!(count("/v1/messages"), 3);
}
