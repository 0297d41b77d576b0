//! A fallback chain across clouds, inside one call of the official
//! `anthropic` SDK: Opus's walk (Anthropic overloaded, then bedrock-mantle)
//! ends on a refusal for a spent credit, which moves the call to Sonnet;
//! Sonnet's first backend (Bedrock) throttles it and Sonnet's walk goes on
//! to Vertex, which answers. Each mock asserts the call reached it in its
//! own shape and with its own name of the model.

use llm_filter_e2e::{skip_without_envoy, MockUpstream, Provider};
use serde_json::{json, Value};

use super::{answered_by_sonnet_on_vertex, body, envoy_with, mock, posts, sdk};
use super::{refused_by_vertexs_quota, sonnet_on_bedrock_and_vertex};
use super::{BEDROCK_ID, CLAUDE, VERTEX_ID, VERTEX_PATH};

const OPUS: &str = "claude-opus-4-1";
const MANTLE_ID: &str = "anthropic.claude-opus-4-1-20250805-v1:0";
/// Anthropic's words for a spent credit (a 400 `invalid_request_error`).
const NO_CREDIT: &str = "Your credit balance is too low to access the Anthropic API.";

/// Opus on Anthropic then bedrock-mantle, Sonnet on Bedrock then Vertex,
/// most weight first, Sonnet Opus's fallback; nothing ejected.
fn config() -> Value {
    json!({
        "routing": {
            "eject_after_failures": 1000,
            "models": {
                OPUS: [
                    {"cluster": "anthropic", "provider": "anthropic", "weight": 1_000_000},
                    {"cluster": "mantle", "provider": "bedrock_mantle", "apis": ["messages"], "weight": 1,
                     "model": MANTLE_ID}
                ],
                CLAUDE: [
                    {"cluster": "bedrock", "provider": "bedrock", "weight": 1_000_000, "model": BEDROCK_ID},
                    {"cluster": "vertex", "provider": "vertex", "apis": ["messages"], "weight": 1,
                     "model": VERTEX_ID,
                     "paths": {"messages": format!("{VERTEX_PATH}/{{model}}:rawPredict")}}
                ]
            },
            "fallbacks": {OPUS: {"to": [CLAUDE]}}
        },
        "cache": {"enabled": false}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_a_failover_falls_back_and_the_fallback_model_fails_over() {
    if skip_without_envoy("a_refusal_after_a_failover_falls_back") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let anthropic = mock("anthropic", Provider::Anthropic);
    let mantle = mock("mantle", Provider::BedrockMantle);
    let bedrock = mock("bedrock", Provider::Bedrock);
    let vertex = mock("vertex", Provider::Vertex);
    let clouds = [&anthropic, &mantle, &bedrock, &vertex];
    let envoy = envoy_with(&default, &clouds, config());
    let base = envoy.url("");
    let base = base.trim_end_matches('/');

    anthropic.set_status(Some(529));
    mantle.set_error(Some((400, NO_CREDIT)));
    bedrock.set_status(Some(429));
    let budget = "x-request-timeout-ms:10000";
    let args = ["--model", OPUS, "--header", budget];
    let out = sdk::run(sdk::ANTHROPIC, "messages_raw", base, &args).await;
    let call = &out["calls"][0];
    eprintln!("one call, two models, four clouds: {call}");
    answered_by_sonnet_on_vertex(&out);
    // Each cloud was asked once, in its shape, with its name of the model.
    let [a, m, b, v] = clouds.map(posts);
    assert_eq!((a.len(), m.len(), b.len(), v.len()), (1, 1, 1, 1), "{out}");
    let (a, m, b, v) = (&a[0], &m[0], &b[0], &v[0]);
    assert_eq!(a.path, "/v1/messages");
    assert_eq!(body(a)["model"], OPUS);
    assert_eq!(m.path, "/anthropic/v1/messages");
    assert_eq!(body(m)["model"], MANTLE_ID);
    sonnet_on_bedrock_and_vertex(a, b, v);
    assert_eq!(m.header("idempotency-key"), a.header("idempotency-key"));
    let fallbacks = |result: &str| {
        envoy.metric(
            "llm_filter_routing_model_fallbacks_total",
            &[("model", OPUS), ("reason", "quota"), ("result", result)],
        )
    };
    // Sonnet's first backend failed (then its walk answered).
    assert_eq!((fallbacks("failed"), fallbacks("answered")), (1.0, 0.0));
    let failovers =
        |result: &str| envoy.metric("llm_filter_routing_failovers_total", &[("result", result)]);
    assert_eq!((failovers("answered"), failovers("failed")), (2.0, 0.0));

    // Vertex's quota for the moment too: Sonnet's walk ends there, and its
    // error (no class a chain names) is the client's, once.
    vertex.set_status(Some(429));
    let out = sdk::run(sdk::ANTHROPIC, "messages_error", base, &args).await;
    refused_by_vertexs_quota(&out);
    assert_eq!(clouds.map(|c| posts(c).len()), [2, 2, 2, 2], "{out}");
}
