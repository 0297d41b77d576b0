//! One model served by several clouds in the same shape, through the real
//! Envoy: each backend declares its provider, each mock plays that provider
//! and refuses any call not in its shape (path, model in the body or in the
//! path, version header or body field), and a call that one provider paces
//! or overloads fails over to the next that speaks its API, with the
//! official SDKs as clients.

use std::time::Instant;

use llm_filter_e2e::{
    post_json, skip_without_envoy, Envoy, EnvoyBuilder, MockUpstream, Provider, RecordedRequest,
};
use serde_json::{json, Value};

use crate::support::sdk;

mod chain;
mod fallback;
mod presets;
mod quota;

const CLAUDE: &str = "claude-sonnet-4-5";
const BEDROCK_ID: &str = "anthropic.claude-sonnet-4-5-20250929-v1:0";
const VERTEX_ID: &str = "claude-sonnet-4-5@20250929";
const VERTEX_PATH: &str = "/v1/projects/e2e/locations/us-east5/publishers/anthropic/models";
const FLASH: &str = "gemini-2.5-flash";
/// The name the Gemini API backend knows Flash by.
const FLASH_ID: &str = "gemini-2.5-flash-preview-09-2025";
/// Gemini's models on Vertex.
const VERTEX_GOOGLE: &str = "/v1/projects/e2e/locations/us-central1/publishers/google/models";

fn mock(name: &str, provider: Provider) -> MockUpstream {
    let m = MockUpstream::backend(name, 0);
    m.set_provider(Some(provider));
    m
}

/// Envoy routing `models` over `backends` (the catch-all route is `default`).
fn envoy(default: &MockUpstream, backends: &[&MockUpstream], routing: Value) -> Envoy {
    envoy_with(default, backends, json!({ "routing": routing }))
}

/// Envoy with the filter configured by `config` in front of `backends`.
fn envoy_with(default: &MockUpstream, backends: &[&MockUpstream], config: Value) -> Envoy {
    let mut b = EnvoyBuilder::new()
        .plugin_config(config)
        .upstream(default.name(), default.port());
    for m in backends {
        b = b.upstream(m.name(), m.port());
    }
    b.header_route("x-llm-cluster")
        .route_timeout_ms(30_000)
        .start()
        .expect("envoy with the filter and the providers")
}

/// Claude on Anthropic, Bedrock and Vertex, in that order of weight, and a
/// failure ejecting its backend for the test's length.
fn claude_routing() -> Value {
    json!({
        "eject_after_failures": 1, "eject_s": 600,
        "models": {CLAUDE: [
            {"cluster": "anthropic", "provider": "anthropic", "weight": 1_000_000},
            {"cluster": "bedrock", "provider": "bedrock", "weight": 1_000, "model": BEDROCK_ID},
            {"cluster": "vertex", "provider": "vertex", "apis": ["messages"], "weight": 1,
             "model": VERTEX_ID,
             "paths": {"messages": format!("{VERTEX_PATH}/{{model}}:rawPredict")}}
        ]}
    })
}

/// The model calls `m` received (its health probes left out).
fn posts(m: &MockUpstream) -> Vec<RecordedRequest> {
    m.requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect()
}

/// The last model call `m` received.
fn last_post(m: &MockUpstream) -> Option<RecordedRequest> {
    posts(m).pop()
}

fn body(r: &RecordedRequest) -> Value {
    r.json().expect("a JSON body")
}

/// The SDK's one call was answered by Sonnet on Vertex, and told so.
fn answered_by_sonnet_on_vertex(out: &Value) {
    let call = &out["calls"][0];
    assert_eq!(call["status"], 200, "{out}");
    assert_eq!(call["headers"]["x-llm-provider"], "vertex", "{out}");
    assert_eq!(call["headers"]["x-llm-model"], VERTEX_ID, "{out}");
    assert_eq!(call["headers"]["x-llm-cluster"], "vertex", "{out}");
    assert!(
        call["text"].as_str().unwrap().ends_with("[vertex]"),
        "{out}"
    );
}

/// The SDK's call ended with Vertex's 429, in Vertex's own words, as the
/// SDK's rate-limit error.
fn refused_by_vertexs_quota(out: &Value) {
    assert_eq!(out["status"], 429, "{out}");
    assert_eq!(out["error_class"], "RateLimitError", "{out}");
    assert!(
        out["message"].as_str().unwrap().contains("vertex"),
        "Vertex's own message: {out}"
    );
}

/// Sonnet reached Bedrock (`b`) and Vertex (`v`) each in its own shape,
/// with the messages and the idempotency key the first backend (`a`) had.
fn sonnet_on_bedrock_and_vertex(a: &RecordedRequest, b: &RecordedRequest, v: &RecordedRequest) {
    assert_eq!(
        b.path,
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    );
    assert_eq!(body(b)["anthropic_version"], "bedrock-2023-05-31");
    assert!(body(b).get("model").is_none());
    assert_eq!(v.path, format!("{VERTEX_PATH}/{VERTEX_ID}:rawPredict"));
    assert_eq!(body(v)["anthropic_version"], "vertex-2023-10-16");
    assert!(body(v).get("model").is_none());
    assert_eq!(body(v)["messages"], body(a)["messages"]);
    for r in [b, v] {
        assert_eq!(r.header("idempotency-key"), a.header("idempotency-key"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_fails_over_from_anthropic_to_bedrock_to_vertex_in_the_messages_shape() {
    if skip_without_envoy("claude_fails_over_from_anthropic_to_bedrock_to_vertex") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let anthropic = mock("anthropic", Provider::Anthropic);
    let bedrock = mock("bedrock", Provider::Bedrock);
    let vertex = mock("vertex", Provider::Vertex);
    // Each mock refuses a call in another provider's shape.
    let messages =
        json!({"model": CLAUDE, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let version = [("anthropic-version", "2023-06-01")];
    for (m, path, headers) in [
        (&anthropic, "/v1/messages", &[][..]),
        (&bedrock, "/v1/messages", &version[..]),
        (
            &bedrock,
            &format!("/model/{CLAUDE}/invoke")[..],
            &version[..],
        ),
        (
            &vertex,
            &format!("{VERTEX_PATH}/{CLAUDE}:rawPredict")[..],
            &version[..],
        ),
    ] {
        let r = post_json(&m.url(path), &messages, headers).await.unwrap();
        assert_eq!(r.status, 400, "{} {path}: {}", m.name(), r.text());
    }
    anthropic.clear();
    bedrock.clear();
    vertex.clear();
    let envoy = envoy(&default, &[&anthropic, &bedrock, &vertex], claude_routing());
    let base = envoy.url("");
    let base = base.trim_end_matches('/');
    let raw = |out: &Value| out["calls"][0].clone();

    // Anthropic overloaded (529 overloaded_error): Bedrock answers.
    anthropic.set_status(Some(529));
    let out = sdk::run(sdk::ANTHROPIC, "messages_raw", base, &["--model", CLAUDE]).await;
    let call = raw(&out);
    eprintln!("first call: {call}");
    assert_eq!(call["status"], 200, "{out}");
    assert_eq!(call["headers"]["x-llm-provider"], "bedrock", "{out}");
    assert_eq!(call["headers"]["x-llm-model"], BEDROCK_ID, "{out}");
    assert!(
        call["text"].as_str().unwrap().ends_with("[bedrock]"),
        "{out}"
    );
    let a = last_post(&anthropic).expect("anthropic was asked first");
    assert_eq!(a.path, "/v1/messages");
    assert!(a.header("anthropic-version").is_some(), "the SDK's version");
    assert_eq!(body(&a)["model"], CLAUDE);
    let b = last_post(&bedrock).expect("bedrock took the failover");
    assert_eq!(
        b.path,
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    );
    let sent = body(&b);
    assert_eq!(sent["anthropic_version"], "bedrock-2023-05-31");
    assert!(sent.get("model").is_none(), "{sent}");
    assert_eq!(sent["messages"], body(&a)["messages"]);
    assert_eq!(b.header("idempotency-key"), a.header("idempotency-key"));

    // Bedrock throttled (429 ThrottlingException), Anthropic out: Vertex answers.
    bedrock.set_status(Some(429));
    let out = sdk::run(sdk::ANTHROPIC, "messages_raw", base, &["--model", CLAUDE]).await;
    let call = raw(&out);
    eprintln!("second call: {call}");
    assert_eq!(call["status"], 200, "{out}");
    assert_eq!(call["headers"]["x-llm-provider"], "vertex", "{out}");
    assert_eq!(call["headers"]["x-llm-model"], VERTEX_ID, "{out}");
    assert!(
        call["text"].as_str().unwrap().ends_with("[vertex]"),
        "{out}"
    );
    assert_eq!(posts(&bedrock).len(), 2, "bedrock was asked, and throttled");
    let v = last_post(&vertex).expect("vertex took the failover");
    assert_eq!(v.path, format!("{VERTEX_PATH}/{VERTEX_ID}:rawPredict"));
    let sent = body(&v);
    assert_eq!(sent["anthropic_version"], "vertex-2023-10-16");
    assert!(sent.get("model").is_none(), "{sent}");

    // A stream: Bedrock's InvokeModel streams no SSE, so Vertex's
    // streamRawPredict serves it, as the SDK's stream helper reads it.
    let out = sdk::run(
        sdk::ANTHROPIC,
        "messages_stream",
        base,
        &["--model", CLAUDE],
    )
    .await;
    streamed_by_vertex(&out);
    let v = last_post(&vertex).unwrap();
    assert_eq!(
        v.path,
        format!("{VERTEX_PATH}/{VERTEX_ID}:streamRawPredict")
    );
    assert_eq!(body(&v)["stream"], true);
    assert_eq!(posts(&bedrock).len(), 2, "no stream reached bedrock");

    let answered = envoy.metric(
        "llm_filter_routing_failovers_total",
        &[("result", "answered")],
    );
    assert_eq!(answered, 2.0);
}

/// The SDK's stream helper read a whole answer that Vertex streamed.
fn streamed_by_vertex(out: &Value) {
    assert!(
        out["text"]
            .as_str()
            .is_some_and(|t| t.ends_with("[vertex]")),
        "{out}"
    );
    assert_eq!(out["stop_reason"], "end_turn", "{out}");
}

/// The client's latencies of 200 chat calls, ms, sorted, the first provider
/// failing one call in `fail_every` (0: none).
async fn timed(openai: &MockUpstream, url: &str, fail_every: usize) -> Vec<f64> {
    let mut ms = Vec::new();
    for i in 0..200 {
        openai.set_status((fail_every > 0 && i % fail_every == 0).then_some(503));
        let chat =
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": format!("q{i}")}]});
        let t = Instant::now();
        let r = post_json(url, &chat, &[("cache-control", "no-store")])
            .await
            .unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    ms.sort_by(f64::total_cmp);
    ms
}

/// The `p` quantile of `sorted`.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpt_fails_over_from_openai_to_azure_for_chat_and_responses() {
    if skip_without_envoy("gpt_fails_over_from_openai_to_azure") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let openai = mock("openai", Provider::OpenAi);
    let azure = mock("azure", Provider::AzureOpenAi);
    let routing = json!({
        "eject_after_failures": 1000,
        "models": {"gpt-4o": [
            {"cluster": "openai", "provider": "openai", "weight": 1_000_000},
            {"cluster": "azure", "provider": "azure_openai", "model": "gpt-4o-east"}
        ]}
    });
    let envoy = envoy(&default, &[&openai, &azure], routing);
    let base = envoy.url("/v1");
    openai.set_status(Some(503));
    for scenario in ["chat_raw", "responses_raw"] {
        let out = sdk::run(sdk::OPENAI, scenario, &base, &["--model", "gpt-4o"]).await;
        let call = &out["calls"][0];
        assert_eq!(call["status"], 200, "{out}");
        assert_eq!(call["headers"]["x-llm-provider"], "azure_openai", "{out}");
        assert_eq!(call["headers"]["x-llm-model"], "gpt-4o-east", "{out}");
        let o = last_post(&openai).unwrap();
        let a = last_post(&azure).unwrap();
        let want = o.path.replace("/v1/", "/openai/v1/");
        assert_eq!(a.path, want, "{scenario}");
        assert_eq!(body(&a)["model"], "gpt-4o-east");
        assert_eq!(body(&o)["model"], "gpt-4o");
    }

    // What failing over across clouds adds to a call's latency: the same
    // calls with the first provider healthy, then failing one call in ten.
    let url = envoy.url("/v1/chat/completions");
    openai.set_default_delay_ms(20);
    azure.set_default_delay_ms(20);
    let healthy = timed(&openai, &url, 0).await;
    let failing = timed(&openai, &url, 10).await;
    eprintln!(
        "cross-cloud failover, 200 chat calls, backends 20 ms: p50 {:.1} -> {:.1} ms, p99 {:.1} -> {:.1} ms (a tenth failed over)",
        percentile(&healthy, 0.5),
        percentile(&failing, 0.5),
        percentile(&healthy, 0.99),
        percentile(&failing, 0.99),
    );
}
