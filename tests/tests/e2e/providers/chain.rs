//! One client call walks the chain of a model's backends across clouds:
//! Anthropic overloaded (529 `overloaded_error`), Bedrock throttling (429
//! `ThrottlingException`) or unavailable (503 `ServiceUnavailableException`),
//! then Vertex answers, all inside the one call the official `anthropic`
//! SDK makes, within its budget; each mock asserts the call reached it in
//! its own shape. And what walking the chain adds to a call's latency.

use llm_filter_e2e::{skip_without_envoy, MockUpstream, Provider};
use serde_json::{json, Value};

use super::{answered_by_sonnet_on_vertex, refused_by_vertexs_quota};
use super::{body, envoy_with, last_post, mock, percentile, posts, sdk};
use super::{sonnet_on_bedrock_and_vertex, streamed_by_vertex};
use super::{BEDROCK_ID, CLAUDE, VERTEX_ID, VERTEX_PATH};

/// A second Claude, served by Anthropic, bedrock-mantle (Bedrock's Messages
/// endpoint that streams SSE) and Vertex, for the stream's chain.
const OPUS: &str = "claude-opus-4-1";
const MANTLE_ID: &str = "anthropic.claude-opus-4-1-20250805-v1:0";
const OPUS_VERTEX_ID: &str = "claude-opus-4-1@20250805";
/// The caller's budget, ms.
const BUDGET_MS: u64 = 10_000;

/// Both Claudes over the providers, most weight first, nothing ejected by
/// the failures the test injects; `budget` the budget section.
fn config(budget: Value) -> Value {
    json!({
        "budget": budget,
        "routing": {
            "eject_after_failures": 1000,
            "models": {
                CLAUDE: chain(json!({"cluster": "bedrock", "provider": "bedrock", "model": BEDROCK_ID}), VERTEX_ID),
                OPUS: chain(json!({"cluster": "mantle", "provider": "bedrock_mantle", "model": MANTLE_ID}), OPUS_VERTEX_ID),
            }
        }
    })
}

/// Anthropic, then `bedrock` (a backend), then Vertex's `vertex_id`, by weight.
fn chain(mut bedrock: Value, vertex_id: &str) -> Value {
    bedrock["weight"] = json!(1_000);
    json!([
        {"cluster": "anthropic", "provider": "anthropic", "weight": 1_000_000},
        bedrock,
        {"cluster": "vertex", "provider": "vertex", "apis": ["messages"], "weight": 1,
         "model": vertex_id,
         "paths": {"messages": format!("{VERTEX_PATH}/{{model}}:rawPredict")}}
    ])
}

struct Clouds {
    default: MockUpstream,
    anthropic: MockUpstream,
    bedrock: MockUpstream,
    mantle: MockUpstream,
    vertex: MockUpstream,
}

impl Clouds {
    fn new() -> Self {
        Self {
            default: MockUpstream::backend("default", 0),
            anthropic: mock("anthropic", Provider::Anthropic),
            bedrock: mock("bedrock", Provider::Bedrock),
            mantle: mock("mantle", Provider::BedrockMantle),
            vertex: mock("vertex", Provider::Vertex),
        }
    }

    fn backends(&self) -> [&MockUpstream; 4] {
        [&self.anthropic, &self.bedrock, &self.mantle, &self.vertex]
    }
}

fn budget_header() -> String {
    format!("x-request-timeout-ms:{BUDGET_MS}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sdk_call_walks_anthropic_bedrock_vertex() {
    if skip_without_envoy("one_sdk_call_walks_anthropic_bedrock_vertex") {
        return;
    }
    let c = Clouds::new();
    // The budget's defaults: at most two failovers a call, each within
    // what is left of the caller's budget and the retry budget.
    let envoy = envoy_with(&c.default, &c.backends(), config(json!({})));
    let base = envoy.url("");
    let base = base.trim_end_matches('/');
    let budget = budget_header();

    c.anthropic.set_status(Some(529));
    c.bedrock.set_status(Some(429));
    c.mantle.set_status(Some(429));
    let args = ["--model", CLAUDE, "--header", &budget];
    let out = sdk::run(sdk::ANTHROPIC, "messages_raw", base, &args).await;
    let call = &out["calls"][0];
    eprintln!("one call, three clouds: {call}");
    answered_by_sonnet_on_vertex(&out);
    assert!(call["elapsed_ms"].as_f64().unwrap() < BUDGET_MS as f64);
    // Each cloud was asked once, in its own shape.
    let a = posts(&c.anthropic);
    let b = posts(&c.bedrock);
    let v = posts(&c.vertex);
    assert_eq!((a.len(), b.len(), v.len()), (1, 1, 1));
    let (a, b, v) = (&a[0], &b[0], &v[0]);
    assert_eq!(a.path, "/v1/messages");
    assert!(a.header("anthropic-version").is_some(), "the SDK's version");
    assert_eq!(body(a)["model"], CLAUDE);
    sonnet_on_bedrock_and_vertex(a, b, v);
    assert!(posts(&c.mantle).is_empty(), "another model's backend");
    let failovers =
        |result: &str| envoy.metric("llm_filter_routing_failovers_total", &[("result", result)]);
    assert_eq!((failovers("failed"), failovers("answered")), (1.0, 1.0));

    // A stream fails over before its first byte: Bedrock's InvokeModel
    // streams no SSE, so its chain is Anthropic, bedrock-mantle, Vertex.
    let args = ["--model", OPUS, "--header", &budget];
    let out = sdk::run(sdk::ANTHROPIC, "messages_stream", base, &args).await;
    streamed_by_vertex(&out);
    let a = last_post(&c.anthropic).unwrap();
    let m = last_post(&c.mantle).expect("bedrock-mantle was asked");
    let v = last_post(&c.vertex).unwrap();
    assert_eq!(
        (body(&a)["model"].as_str(), body(&a)["stream"].as_bool()),
        (Some(OPUS), Some(true))
    );
    assert_eq!(m.path, "/anthropic/v1/messages");
    assert!(m.header("anthropic-version").is_some());
    assert_eq!(body(&m)["model"], MANTLE_ID);
    assert_eq!(body(&m)["stream"], true);
    assert_eq!(
        v.path,
        format!("{VERTEX_PATH}/{OPUS_VERTEX_ID}:streamRawPredict")
    );
    assert_eq!(body(&v)["stream"], true);
    assert_eq!(posts(&c.bedrock).len(), 1, "no stream reached InvokeModel");
    assert_eq!((failovers("failed"), failovers("answered")), (2.0, 2.0));

    // Every cloud fails (Bedrock unavailable, Vertex's quota for now): each
    // is asked once, and the last one's error is the client's.
    c.bedrock.set_status(Some(503));
    c.vertex.set_status(Some(429));
    let args = ["--model", CLAUDE, "--header", &budget];
    let out = sdk::run(sdk::ANTHROPIC, "messages_error", base, &args).await;
    refused_by_vertexs_quota(&out);
    assert_eq!(out["attempts"].as_array().unwrap().len(), 1, "{out}");
    let asked = [&c.anthropic, &c.bedrock, &c.vertex].map(|m| posts(m).len());
    assert_eq!(asked, [3, 2, 3], "one more each, none twice");
    assert_eq!(failovers("failed"), 4.0);
}

/// The clients' latencies of `calls` calls, ms, sorted, and the providers
/// that answered them.
async fn timed(base: &str, calls: usize) -> (Vec<f64>, Vec<String>) {
    let n = calls.to_string();
    let args = ["--model", CLAUDE, "--calls", &n, "--max-tokens", "8"];
    let out = sdk::run(sdk::ANTHROPIC, "messages_raw", base, &args).await;
    let calls = out["calls"].as_array().unwrap();
    let mut ms: Vec<f64> = calls
        .iter()
        .map(|c| c["elapsed_ms"].as_f64().unwrap())
        .collect();
    ms.sort_by(f64::total_cmp);
    let who = calls
        .iter()
        .map(|c| {
            c["headers"]["x-llm-provider"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    (ms, who)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_walking_the_chain_adds_to_a_call() {
    if skip_without_envoy("what_walking_the_chain_adds_to_a_call") {
        return;
    }
    let c = Clouds::new();
    // Every timed call walks the whole chain: the breaker's window and the
    // retry budget warm up over more calls than are timed (with the
    // defaults, the retry budget stops failing over after ten calls in a
    // row, as it should).
    let envoy = envoy_with(
        &c.default,
        &c.backends(),
        config(json!({"min_calls": 1000})),
    );
    let base = envoy.url("");
    let base = base.trim_end_matches('/');
    for m in c.backends() {
        m.set_default_delay_ms(20);
    }
    const CALLS: usize = 200;
    let (healthy, who) = timed(base, CALLS).await;
    assert!(who.iter().filter(|p| *p == "anthropic").count() >= CALLS * 95 / 100);
    c.anthropic.set_status(Some(529));
    c.bedrock.set_status(Some(429));
    for m in c.backends() {
        m.clear();
    }
    let (walked, who) = timed(base, CALLS).await;
    assert!(who.iter().all(|p| p == "vertex"), "{who:?}");
    let hops = posts(&c.anthropic).len() + posts(&c.bedrock).len();
    assert!(hops >= 2 * CALLS * 95 / 100, "{hops} failed tries");
    eprintln!(
        "one-call failover Anthropic -> Bedrock -> Vertex, {CALLS} SDK calls each, every \
         provider 20 ms: p50 {:.1} -> {:.1} ms, p99 {:.1} -> {:.1} ms ({hops} failed tries)",
        percentile(&healthy, 0.5),
        percentile(&walked, 0.5),
        percentile(&healthy, 0.99),
        percentile(&walked, 0.99),
    );
}
