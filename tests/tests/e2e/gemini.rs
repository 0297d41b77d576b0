//! The Gemini API (`generateContent`, `streamGenerateContent?alt=sse`) through
//! the real Envoy, with the official Google Gen AI SDK as the client
//! (`tests/sdk/genai_client.py`): the model is in the path, the usage in
//! `usageMetadata`, errors in Google's `{"error":{"code","message","status"}}`.
//!
//! The mock answers as Google does, in shapes the SDK parses; through the
//! filter a Gemini call is counted under `api="gemini"`, cached on opt-in
//! (and semantically), refused in Google's shape, routed and degraded with
//! the model rewritten in the path, shaped in its `generationConfig` and
//! `contents`.

use std::time::Duration;

use llm_filter_e2e::{
    skip_without_envoy, Envoy, EnvoyBuilder, MockConfig, MockUpstream, RecordedRequest,
};
use serde_json::{json, Value};

use crate::support::alerts::fire;
use crate::support::sdk::{run, GENAI};

const MODEL: &str = "gemini-2.5-flash";
const KEY: &str = "gemini-e2e-sdk";
const CLUSTER_HEADER: &str = "x-llm-cluster";
const ADMIN_TOKEN: &str = "e2e-admin-token-0123456789";
const DEADLINE: Duration = Duration::from_secs(20);

/// The SDK's generation path of `model`.
fn path_of(model: &str, stream: bool) -> String {
    let method = if stream {
        "streamGenerateContent"
    } else {
        "generateContent"
    };
    format!("/v1beta/models/{model}:{method}")
}

async fn genai(envoy: &Envoy, scenario: &str, args: &[&str]) -> Value {
    run(GENAI, scenario, &envoy.url(""), args).await
}

fn plain_envoy(mock: &MockUpstream) -> Envoy {
    EnvoyBuilder::new()
        .no_filter()
        .upstream("mock", mock.port())
        .start()
        .expect("plain envoy")
}

fn filtered_envoy(mock: &MockUpstream, config: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

/// The last call `mock` got on `path`, and its body as JSON.
fn last_on(mock: &MockUpstream, path: &str) -> (RecordedRequest, Value) {
    let seen = mock
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path == path)
        .unwrap_or_else(|| panic!("{} got no call on {path}", mock.name()));
    let body = seen.json().expect("a JSON body");
    (seen, body)
}

/// The body the SDK sends for `--prompt one two three --system be brief
/// --temperature 0 --max-output-tokens 64`, as it writes it.
fn sdk_body() -> Value {
    json!({
        "contents": [{"parts": [{"text": "one two three"}], "role": "user"}],
        "systemInstruction": {"parts": [{"text": "be brief"}], "role": "user"},
        "generationConfig": {"temperature": 0.0, "maxOutputTokens": 64},
    })
}

const SDK_ARGS: [&str; 8] = [
    "--prompt",
    "one two three",
    "--system",
    "be brief",
    "--temperature",
    "0",
    "--max-output-tokens",
    "64",
];

/// What reached the upstream is what the SDK sent: its path, its key, its
/// body byte for byte (as JSON).
fn assert_sent_as_the_sdk_sent_it(mock: &MockUpstream, path: &str) {
    let (seen, body) = last_on(mock, path);
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.header("x-goog-api-key"), Some(KEY), "{path}");
    assert!(
        seen.header("x-goog-api-client")
            .unwrap_or_default()
            .starts_with("google-genai-sdk/"),
        "{path}"
    );
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(body, sdk_body(), "{path}");
}

#[tokio::test]
async fn the_mock_answers_the_genai_sdk_as_google_does() {
    if skip_without_envoy("the_mock_answers_the_genai_sdk_as_google_does") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        chunk_delay_ms: 100,
        ..MockConfig::named("gem")
    });
    let envoy = plain_envoy(&mock);
    let echo = "echo: one two three [gem]";

    let out = genai(&envoy, "generate", &SDK_ARGS).await;
    assert_eq!(out["text"], echo, "{out}");
    assert_eq!(out["finish_reason"], "STOP", "{out}");
    assert_eq!(out["model_version"], MODEL, "{out}");
    assert!(
        out["response_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("gem-")),
        "{out}"
    );
    // 2 + 3 words in, 5 out.
    assert_eq!(
        out["usage"],
        json!({"prompt": 5, "candidates": 5, "total": 10, "cached": null, "thoughts": null}),
        "{out}"
    );
    let path = path_of(MODEL, false);
    assert_sent_as_the_sdk_sent_it(&mock, &path);
    assert_eq!(last_on(&mock, &path).0.query, None);

    let out = genai(&envoy, "generate_stream", &SDK_ARGS).await;
    // One response per word, as the mock streams them, each parsed.
    assert_eq!(
        out["texts"],
        json!(["echo: ", "one ", "two ", "three ", "[gem]"]),
        "{out}"
    );
    assert_eq!(out["text"], echo, "{out}");
    assert_eq!(out["finish_reason"], "STOP", "{out}");
    assert_eq!(out["usage"]["total"], 10, "{out}");
    // As they were sent, 100 ms apart, not all at once (the first one's
    // time includes the SDK warming up its parser: the last gap tells).
    let at: Vec<u64> = out["at_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(at[4] - at[3] >= 80, "the chunks came apart: {out}");
    let stream_path = path_of(MODEL, true);
    assert_sent_as_the_sdk_sent_it(&mock, &stream_path);
    assert_eq!(
        last_on(&mock, &stream_path).0.query.as_deref(),
        Some("alt=sse")
    );
    // Google's framing: `data: {json}` events ended by CRLF CRLF, no [DONE].
    let sent = mock.sent_streams().pop().expect("a stream");
    let sent = String::from_utf8(sent).unwrap();
    assert!(sent.starts_with("data: {\"candidates\":"), "{sent}");
    assert_eq!(sent.matches("\r\n\r\n").count(), 5, "{sent}");
    assert!(!sent.contains("[DONE]"));

    // A scripted 429 is the SDK's ClientError with Google's status name; the
    // SDK retries it only when asked to, without reading retry-after.
    let out = genai(
        &envoy,
        "generate_error",
        &["--header", "x-mock-status:429", "--max-retries", "1"],
    )
    .await;
    assert_eq!(out["error_class"], "ClientError", "{out}");
    assert_eq!(out["code"], 429, "{out}");
    assert_eq!(out["status_name"], "RESOURCE_EXHAUSTED", "{out}");
    assert_eq!(out["message"], "mock gem scripted status 429", "{out}");
    assert_eq!(out["attempts"].as_array().map(Vec::len), Some(2), "{out}");
    let out = genai(&envoy, "generate_error", &["--header", "x-mock-status:503"]).await;
    assert_eq!(out["error_class"], "ServerError", "{out}");
    assert_eq!(out["status_name"], "UNAVAILABLE", "{out}");
    assert_eq!(out["attempts"].as_array().map(Vec::len), Some(1), "{out}");

    // The played prompt cache reports a repeated prompt's tokens as cached.
    mock.set_prompt_cache(true);
    let first = genai(&envoy, "generate", &["--prompt", "a cached question"]).await;
    let again = genai(&envoy, "generate", &["--prompt", "a cached question"]).await;
    assert_eq!(first["usage"]["cached"], Value::Null, "{first}");
    assert_eq!(again["usage"]["cached"], 3, "{again}");
    assert_eq!(again["usage"]["prompt"], 3, "{again}");
}

#[tokio::test]
async fn a_gemini_call_crosses_the_filter_as_the_sdk_sent_it() {
    if skip_without_envoy("a_gemini_call_crosses_the_filter_as_the_sdk_sent_it") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("gemf"));
    let envoy = filtered_envoy(&mock, json!({}));
    let echo = "echo: one two three [gemf]";
    let (plain, streamed) = tokio::join!(
        genai(&envoy, "generate", &SDK_ARGS),
        genai(&envoy, "generate_stream", &SDK_ARGS),
    );
    assert_eq!(plain["text"], echo, "{plain}");
    assert_eq!(plain["usage"]["total"], 10, "{plain}");
    assert_eq!(streamed["text"], echo, "{streamed}");
    assert_eq!(streamed["finish_reason"], "STOP", "{streamed}");
    for stream in [false, true] {
        assert_sent_as_the_sdk_sent_it(&mock, &path_of(MODEL, stream));
    }
    let (seen, _) = last_on(&mock, &path_of(MODEL, true));
    assert_eq!(seen.query.as_deref(), Some("alt=sse"));
}

#[tokio::test]
async fn a_gemini_call_is_classified_and_counted_from_its_usage_metadata() {
    if skip_without_envoy("a_gemini_call_is_classified_and_counted_from_its_usage_metadata") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("gemc"));
    let envoy = filtered_envoy(&mock, json!({}));
    let out = genai(&envoy, "generate", &SDK_ARGS).await;
    assert_eq!(out["text"], "echo: one two three [gemc]", "{out}");
    assert!(out["headers"]["x-trace-id"].is_string(), "{out}");
    assert_sent_as_the_sdk_sent_it(&mock, &path_of(MODEL, false));
    let (seen, _) = last_on(&mock, &path_of(MODEL, false));
    assert!(seen.header("traceparent").is_some());
    assert!(seen
        .header("baggage")
        .unwrap_or_default()
        .contains("priority=P1"));
    let calls = envoy.wait_for_metric(
        "llm_filter_requests_total",
        &[("model", MODEL), ("outcome", "success"), ("api", "gemini")],
        1.0,
        DEADLINE,
    );
    assert_eq!(calls, 1.0);
    for (kind, n) in [("input", 5.0), ("output", 5.0)] {
        let got = envoy.wait_for_metric(
            "gen_ai_client_token_usage_total",
            &[("model", MODEL), ("token_type", kind)],
            n,
            DEADLINE,
        );
        assert_eq!(got, n, "{kind}");
    }
}

#[tokio::test]
async fn a_gemini_stream_reaches_the_sdk_as_sent_and_is_counted() {
    if skip_without_envoy("a_gemini_stream_reaches_the_sdk_as_sent_and_is_counted") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("gems"));
    let envoy = filtered_envoy(&mock, json!({}));
    let out = genai(&envoy, "generate_stream", &SDK_ARGS).await;
    assert_eq!(out["text"], "echo: one two three [gems]", "{out}");
    assert_eq!(out["chunks"], 5, "{out}");
    assert_eq!(out["finish_reason"], "STOP", "{out}");
    // Nothing was asked of the backend on the client's behalf.
    assert_sent_as_the_sdk_sent_it(&mock, &path_of(MODEL, true));
    let calls = envoy.wait_for_metric(
        "llm_filter_requests_total",
        &[("model", MODEL), ("outcome", "success"), ("api", "gemini")],
        1.0,
        DEADLINE,
    );
    assert_eq!(calls, 1.0);
    let output = envoy.wait_for_metric(
        "gen_ai_client_token_usage_total",
        &[("model", MODEL), ("token_type", "output")],
        5.0,
        DEADLINE,
    );
    assert_eq!(output, 5.0, "the last event's usage, counted once");
}

#[tokio::test]
async fn a_gemini_call_opted_in_by_max_age_is_a_cache_hit() {
    if skip_without_envoy("a_gemini_call_opted_in_by_max_age_is_a_cache_hit") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("gemh"));
    let envoy = filtered_envoy(&mock, json!({}));
    let opt_in = ["--calls", "2", "--header", "cache-control:max-age=300"];
    let (cached, plain) = tokio::join!(
        genai(&envoy, "generate_calls", &opt_in),
        // Without the opt-in and without a temperature: never cached.
        genai(
            &envoy,
            "generate_calls",
            &["--calls", "2", "--prompt", "not opted in"]
        ),
    );
    let calls = cached["calls"].as_array().expect("calls");
    assert_eq!(calls[0]["x_cache"], "MISS", "{cached}");
    assert_eq!(calls[1]["x_cache"], "HIT", "{cached}");
    assert_eq!(calls[1]["status"], 200, "{cached}");
    // The SDK parsed the stored answer as it parsed the answer.
    assert_eq!(calls[0]["response_id"], calls[1]["response_id"]);
    assert_eq!(calls[0]["text"], calls[1]["text"]);
    let plain = plain["calls"].as_array().expect("calls");
    assert!(plain.iter().all(|c| c["x_cache"] == "BYPASS"), "{plain:?}");
    assert_eq!(mock.count("POST", &path_of(MODEL, false)), 3);

    // A stream opted in is replayed in Gemini's shape.
    let stream = [
        "--prompt",
        "stream me once",
        "--header",
        "cache-control:max-age=300",
    ];
    let first = genai(&envoy, "generate_stream", &stream).await;
    let again = genai(&envoy, "generate_stream", &stream).await;
    assert_eq!(first["text"], again["text"], "{again}");
    assert_eq!(again["finish_reason"], "STOP", "{again}");
    assert_eq!(again["usage"], first["usage"], "{again}");
    assert_eq!(mock.count("POST", &path_of(MODEL, true)), 1);
}

#[tokio::test]
async fn a_shed_gemini_call_is_the_sdks_error_in_googles_shape() {
    if skip_without_envoy("a_shed_gemini_call_is_the_sdks_error_in_googles_shape") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("gemr"));
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
    let out = genai(
        &envoy,
        "generate_error",
        &["--header", "x-request-priority:P2"],
    )
    .await;
    assert_eq!(out["error_class"], "ServerError", "{out}");
    assert_eq!(out["code"], 503, "{out}");
    assert_eq!(out["status_name"], "UNAVAILABLE", "{out}");
    assert!(
        out["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{out}"
    );
    let attempts = out["attempts"].as_array().expect("attempts");
    assert!(attempts[0]["retry_after"].is_string(), "{out}");
    assert_eq!(
        mock.request_count(),
        0,
        "a shed call never reaches the backend"
    );
    // P1 goes on.
    let ok = genai(&envoy, "generate", &[]).await;
    assert_eq!(ok["finish_reason"], "STOP", "{ok}");
}

#[tokio::test]
async fn a_gemini_call_is_routed_with_the_model_rewritten_in_its_path() {
    if skip_without_envoy("a_gemini_call_is_routed_with_the_model_rewritten_in_its_path") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let a = MockUpstream::backend("a", 0);
    a.set_prompt_cache(true);
    let envoy = EnvoyBuilder::new()
        // The SDK's temperature 0 would make the second call a cache hit:
        // it must reach the backend, whose prompt cache counts it.
        .plugin_config(json!({"cache": {"enabled": false}, "routing": {"models": {
            MODEL: [{"cluster": "a", "model": "gemini-a"}]
        }}}))
        .upstream(default.name(), default.port())
        .upstream(a.name(), a.port())
        .header_route(CLUSTER_HEADER)
        .route_timeout_ms(10_000)
        .start()
        .expect("envoy with the filter and routing");
    let first = genai(&envoy, "generate", &SDK_ARGS).await;
    let again = genai(&envoy, "generate", &SDK_ARGS).await;
    assert_eq!(first["headers"][CLUSTER_HEADER], "a", "{first}");
    // The backend's name of the model, in the path; the body as the SDK
    // wrote it.
    assert_sent_as_the_sdk_sent_it(&a, &path_of("gemini-a", false));
    assert_eq!(a.count("POST", &path_of(MODEL, false)), 0);
    assert_eq!(default.request_count(), 0, "every call was routed");
    assert_eq!(first["model_version"], "gemini-a", "{first}");
    // Usage counted from usageMetadata, the cached tokens apart.
    assert_eq!(again["usage"]["cached"], 5, "{again}");
    for (kind, n) in [("input", 10.0), ("cached_input", 5.0), ("output", 10.0)] {
        let got = envoy.wait_for_metric(
            "llm_filter_routing_tokens_total",
            &[("model", MODEL), ("llm_cluster", "a"), ("token_type", kind)],
            n,
            DEADLINE,
        );
        assert_eq!(got, n, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gemini_call_fails_over_with_the_other_backends_model_in_its_path() {
    if skip_without_envoy("a_gemini_call_fails_over_with_the_other_backends_model_in_its_path") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 10),
        MockUpstream::backend("b", 10),
    );
    b.set_status(Some(503));
    let envoy = EnvoyBuilder::new()
        .plugin_config(json!({"cache": {"enabled": false}, "routing": {
            "eject_after_failures": 1000,
            // No probe during the calls (the first comes after an
            // interval): one b failed would take it out before any call
            // tried it, on a machine slow enough to start the SDK late.
            "probe_interval_s": 3600,
            // b, which fails, is the first choice almost always (a call
            // chosen at equal weights could go to a every time).
            "models": {MODEL: [
                {"cluster": "a", "model": "gemini-a", "weight": 1},
                {"cluster": "b", "model": "gemini-b", "weight": 1000}
            ]}
        }}))
        .upstream(default.name(), default.port())
        .upstream(a.name(), a.port())
        .upstream(b.name(), b.port())
        .header_route(CLUSTER_HEADER)
        .route_timeout_ms(30_000)
        .start()
        .expect("envoy with the filter and two backends");
    for i in 0..8 {
        let prompt = format!("failover {i}");
        let out = genai(&envoy, "generate", &["--prompt", &prompt]).await;
        assert_eq!(out["headers"][CLUSTER_HEADER], "a", "{i}: {out}");
        assert_eq!(out["model_version"], "gemini-a", "{i}: {out}");
        assert_eq!(out["text"], format!("echo: {prompt} [a]"), "{i}: {out}");
    }
    // b was tried on its own name of the model, a answered on its own: each
    // path rewritten from the client's, never the other backend's.
    let on_b = b.count("POST", &path_of("gemini-b", false));
    assert!(on_b > 0, "b was never chosen");
    assert_eq!(b.count("POST", &path_of("gemini-a", false)), 0);
    assert_eq!(a.count("POST", &path_of("gemini-a", false)), 8);
    assert_eq!(a.count("POST", &path_of("gemini-b", false)), 0);
    assert_eq!(a.count("POST", &path_of(MODEL, false)), 0);
    assert_eq!(default.request_count(), 0, "every call was routed");
    let answered = envoy.wait_for_metric(
        "llm_filter_routing_failovers_total",
        &[("result", "answered")],
        on_b as f64,
        DEADLINE,
    );
    assert_eq!(answered, on_b as f64);
}

#[tokio::test]
async fn a_p2_gemini_call_is_shaped_in_its_config_and_contents() {
    if skip_without_envoy("a_p2_gemini_call_is_shaped_in_its_config_and_contents") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("gemsh"));
    let envoy = filtered_envoy(
        &mock,
        json!({"shaping": {"max_tokens_cap": {"P2": 2}, "max_history_turns": {"P2": 2}}}),
    );
    let args = [
        "--turn",
        "user:the oldest question",
        "--turn",
        "model:the oldest answer",
        "--turn",
        "user:an earlier question",
        "--turn",
        "model:an earlier answer",
        "--prompt",
        "the question now",
        "--max-output-tokens",
        "64",
    ];
    let mut p2 = args.to_vec();
    p2.extend(["--header", "x-request-priority:P2"]);
    let out = genai(&envoy, "generate", &p2).await;
    // The cap reached the backend: two words of the echo, cut there.
    assert_eq!(out["text"], "echo: the", "{out}");
    assert_eq!(out["finish_reason"], "MAX_TOKENS", "{out}");
    assert_eq!(
        out["headers"]["x-llm-shaped"], "max_tokens,history",
        "{out}"
    );
    let (_, sent) = last_on(&mock, &path_of(MODEL, false));
    assert_eq!(sent["generationConfig"], json!({"maxOutputTokens": 2}));
    let texts: Vec<&str> = sent["contents"]
        .as_array()
        .expect("contents")
        .iter()
        .map(|c| c["parts"][0]["text"].as_str().expect("a text part"))
        .collect();
    assert_eq!(
        texts,
        [
            "an earlier question",
            "an earlier answer",
            "the question now"
        ],
        "the last two turns, each as the SDK wrote it"
    );
    let shaped = envoy.wait_for_metric(
        "llm_filter_shaped_total",
        &[("what", "history"), ("priority", "P2")],
        1.0,
        DEADLINE,
    );
    assert_eq!(shaped, 1.0);
    // P1 is not shaped: the body goes as the SDK wrote it.
    let out = genai(&envoy, "generate", &args).await;
    assert_eq!(out["text"], "echo: the question now [gemsh]", "{out}");
    assert!(out["headers"].get("x-llm-shaped").is_none(), "{out}");
    let (_, sent) = last_on(&mock, &path_of(MODEL, false));
    assert_eq!(sent["contents"].as_array().map(Vec::len), Some(5));
    assert_eq!(sent["generationConfig"], json!({"maxOutputTokens": 64}));
}

#[tokio::test]
async fn a_degraded_gemini_call_goes_out_with_the_fallback_model_in_its_path() {
    if skip_without_envoy("a_degraded_gemini_call_goes_out_with_the_fallback_model_in_its_path") {
        return;
    }
    const LITE: &str = "gemini-2.5-flash-lite";
    let mock = MockUpstream::start(MockConfig::named("gemd"));
    let envoy = filtered_envoy(
        &mock,
        json!({"admin": {"token": ADMIN_TOKEN},
               "degrade": {"alerts": [{"severity": "page", "level": 2}],
                           "fallback_model": {MODEL: LITE}, "max_tokens_cap": 3}}),
    );
    fire(
        &envoy,
        ADMIN_TOKEN,
        json!({"alertname": "LLMSlow", "severity": "page"}),
    )
    .await;
    let args = [
        "--prompt",
        "a degraded question",
        "--temperature",
        "0.9",
        "--max-output-tokens",
        "1000",
    ];
    let (plain, streamed) = tokio::join!(
        genai(&envoy, "generate", &args),
        genai(&envoy, "generate_stream", &args),
    );
    // The fallback model answered, its output capped.
    assert_eq!(plain["model_version"], LITE, "{plain}");
    assert_eq!(plain["text"], "echo: a degraded", "{plain}");
    assert_eq!(plain["headers"]["x-llm-degraded"], "2", "{plain}");
    assert_eq!(streamed["text"], "echo: a degraded", "{streamed}");
    for stream in [false, true] {
        let (seen, sent) = last_on(&mock, &path_of(LITE, stream));
        assert_eq!(seen.query.as_deref(), stream.then_some("alt=sse"));
        assert_eq!(seen.header("x-goog-api-key"), Some(KEY));
        let config = &sent["generationConfig"];
        assert_eq!(config["maxOutputTokens"], 3, "{sent}");
        let t = config["temperature"].as_f64().expect("a temperature");
        assert!(t < 0.9, "lowered: {sent}");
        assert!(
            sent.get("model").is_none(),
            "the body names no model: {sent}"
        );
        assert_eq!(
            sent["contents"][0]["parts"][0]["text"],
            "a degraded question"
        );
    }
    assert_eq!(mock.count("POST", &path_of(MODEL, false)), 0);
    assert_eq!(mock.count("POST", &path_of(MODEL, true)), 0);
    for action in ["fallback_model", "max_tokens", "temperature"] {
        let n = envoy.wait_for_metric(
            "llm_filter_degraded_total",
            &[("action", action), ("priority", "P1")],
            2.0,
            DEADLINE,
        );
        assert_eq!(n, 2.0, "{action}");
    }
}

#[tokio::test]
async fn a_reworded_gemini_question_is_a_semantic_hit() {
    if skip_without_envoy("a_reworded_gemini_question_is_a_semantic_hit") {
        return;
    }
    const QUESTION: &str = "What is the capital of France?";
    // The same words, reordered and re-cased: the mock embeds it identically.
    const REWORDED: &str = "france: THE capital of, what is";
    let mock = MockUpstream::start(MockConfig::named("gemq"));
    let emb = MockUpstream::start(MockConfig::named("emb"));
    let envoy = EnvoyBuilder::new()
        .plugin_config(json!({"cache": {"semantic": {"embeddings": {
            "cluster": "emb", "model": "text-embedding-3-small", "timeout_ms": 2000
        }}}}))
        .upstream("mock", mock.port())
        .upstream("emb", emb.port())
        .start()
        .expect("envoy with the semantic cache");
    let ask = |system: &'static str, prompt: &'static str| {
        let envoy = &envoy;
        async move {
            genai(
                envoy,
                "generate",
                &[
                    "--system",
                    system,
                    "--turn",
                    "user:hello",
                    "--turn",
                    "model:hi",
                    "--temperature",
                    "0",
                    "--prompt",
                    prompt,
                ],
            )
            .await
        }
    };
    let first = ask("be brief", QUESTION).await;
    assert_eq!(first["headers"]["x-cache"], "MISS", "{first}");
    let stored = envoy.wait_for_metric(
        "llm_filter_cache_semantic_stores_total",
        &[("result", "stored")],
        1.0,
        DEADLINE,
    );
    assert_eq!(stored, 1.0, "the question's vector was indexed");
    let asked = emb.last_request().expect("the embeddings callout");
    assert_eq!(
        asked.json().unwrap(),
        json!({"model": "text-embedding-3-small", "input": QUESTION}),
        "the last user content's text alone"
    );

    let again = ask("be brief", REWORDED).await;
    assert_eq!(again["headers"]["x-cache"], "SEMANTIC", "{again}");
    assert_eq!(again["text"], format!("echo: {QUESTION} [gemq]"), "{again}");
    assert_eq!(again["response_id"], first["response_id"], "{again}");
    assert_eq!(mock.count("POST", &path_of(MODEL, false)), 1);
    assert_eq!(emb.count("POST", "/v1/embeddings"), 2);

    // Another system instruction is another context: a miss.
    let other = ask("be long", REWORDED).await;
    assert_eq!(other["headers"]["x-cache"], "MISS", "{other}");
    assert_eq!(other["text"], format!("echo: {REWORDED} [gemq]"), "{other}");
    assert_eq!(mock.count("POST", &path_of(MODEL, false)), 2);
}
