//! Each provider's refusals that say what another backend or another model
//! could do, through the real Envoy with the official SDKs: Google's 429
//! `RESOURCE_EXHAUSTED` names the quota it broke (a `QuotaFailure`'s
//! `quotaId`), and a minute's quota fails over to the model's next backend
//! while a day's, where the walk ends, takes the model's fallback chain
//! (google-genai); Bedrock's 424 `ModelErrorException` and its account's
//! quota (a 400 `ServiceQuotaExceededException`) fail over to the same
//! model on another cloud, its bad request does not (anthropic). Each mock refuses a call not in
//! its provider's shape, and says what it received.

use llm_filter_e2e::{skip_without_envoy, MockUpstream, Provider};
use serde_json::json;

use super::{body, envoy, last_post, mock, posts, sdk};
use super::{BEDROCK_ID, CLAUDE, FLASH, FLASH_ID, VERTEX_GOOGLE};

/// Flash's fallback.
const LITE: &str = "gemini-2.5-flash-lite";
const PER_MINUTE: &str = "GenerateRequestsPerMinutePerProjectPerModel";
const PER_DAY: &str = "GenerateRequestsPerDayPerProjectPerModel";
/// Google's words for a quota broken, a minute's or a day's alike.
const OVER: &str = "You exceeded your current quota, please check your plan and billing details.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minutes_quota_fails_over_and_a_days_where_the_walk_ends_takes_the_chain() {
    if skip_without_envoy("a_minutes_quota_fails_over_and_a_days_takes_the_chain") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let vertex = mock("vertex", Provider::Vertex);
    let gemini = mock("gemini", Provider::Gemini);
    let lite = mock("lite", Provider::Gemini);
    let routing = json!({
        "eject_after_failures": 1000,
        "models": {
            FLASH: [
                {"cluster": "vertex", "provider": "vertex", "apis": ["gemini"], "weight": 1_000_000,
                 "paths": {"gemini": format!("{VERTEX_GOOGLE}/{{model}}:generateContent")}},
                {"cluster": "gemini", "provider": "gemini", "weight": 1, "model": FLASH_ID}
            ],
            LITE: [{"cluster": "lite", "provider": "gemini"}]
        },
        "fallbacks": {FLASH: {"to": [LITE]}}
    });
    let envoy = envoy(&default, &[&vertex, &gemini, &lite], routing);
    let base = envoy.url("");
    let base = base.trim_end_matches('/');
    let vertex_path = format!("{VERTEX_GOOGLE}/{FLASH}:generateContent");
    let gemini_path = format!("/v1beta/models/{FLASH_ID}:generateContent");
    let asked = || [&vertex, &gemini, &lite].map(|m| posts(m).len());

    // Vertex's quota for the minute: the Gemini API answers Flash.
    vertex.set_error(Some((429, OVER)));
    vertex.set_quota(Some(PER_MINUTE));
    let out = sdk::run(sdk::GENAI, "generate", base, &[]).await;
    assert_eq!(out["headers"]["x-llm-provider"], "gemini", "{out}");
    assert_eq!(out["headers"]["x-llm-model"], FLASH_ID, "{out}");
    assert_eq!(out["finish_reason"], "STOP", "{out}");
    assert_eq!(asked(), [1, 1, 0], "{out}");
    let (v, g) = (last_post(&vertex).unwrap(), last_post(&gemini).unwrap());
    assert_eq!(v.path, vertex_path);
    assert_eq!(g.path, gemini_path);
    assert_eq!(body(&g)["contents"], body(&v)["contents"]);
    assert_eq!(g.header("idempotency-key"), v.header("idempotency-key"));

    // Vertex's quota for the day: failover still comes first (the Gemini
    // API's quota is its own), and the Gemini API answers Flash.
    vertex.set_quota(Some(PER_DAY));
    let out = sdk::run(sdk::GENAI, "generate", base, &[]).await;
    assert_eq!(out["headers"]["x-llm-model"], FLASH_ID, "{out}");
    assert_eq!(asked(), [2, 2, 0], "{out}");

    // Both backends' quota for the day: Flash's walk ends on a spent quota,
    // and its chain's Lite answers, named to the client.
    gemini.set_error(Some((429, OVER)));
    gemini.set_quota(Some(PER_DAY));
    let out = sdk::run(sdk::GENAI, "generate", base, &[]).await;
    assert_eq!(out["headers"]["x-llm-model"], LITE, "{out}");
    assert_eq!(out["headers"]["x-llm-cluster"], "lite", "{out}");
    assert_eq!(out["finish_reason"], "STOP", "{out}");
    assert!(out["text"].as_str().is_some_and(|t| !t.is_empty()), "{out}");
    assert_eq!(asked(), [3, 3, 1], "{out}");
    let l = last_post(&lite).unwrap();
    assert_eq!(l.path, format!("/v1beta/models/{LITE}:generateContent"));
    assert_eq!(body(&l)["contents"], body(&v)["contents"]);
    assert_eq!(
        l.header("idempotency-key"),
        last_post(&vertex).unwrap().header("idempotency-key")
    );
    let fallbacks = |result: &str| {
        envoy.metric(
            "llm_filter_routing_model_fallbacks_total",
            &[("model", FLASH), ("reason", "quota"), ("result", result)],
        )
    };
    assert_eq!(fallbacks("answered"), 1.0);

    // The walk ends on the Gemini API's quota for the minute: no class a
    // chain names, though its message says "exceeded your current quota",
    // and the client gets that 429 as Google wrote it.
    gemini.set_quota(Some(PER_MINUTE));
    let out = sdk::run(sdk::GENAI, "generate_error", base, &[]).await;
    assert_eq!(out["error_class"], "ClientError", "{out}");
    assert_eq!(out["code"], 429, "{out}");
    assert_eq!(out["status_name"], "RESOURCE_EXHAUSTED", "{out}");
    assert_eq!(out["message"], OVER, "{out}");
    assert_eq!(asked(), [4, 4, 1], "{out}");
    assert_eq!(fallbacks("answered"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrocks_model_error_and_spent_quota_fail_over_to_the_same_model_on_another_cloud() {
    if skip_without_envoy("bedrocks_model_error_fails_over") {
        return;
    }
    const OPUS: &str = "claude-opus-4-1";
    const OPUS_ID: &str = "anthropic.claude-opus-4-1-20250805-v1:0";
    let default = MockUpstream::backend("default", 0);
    let bedrock = mock("bedrock", Provider::Bedrock);
    let anthropic = mock("anthropic", Provider::Anthropic);
    // Sonnet on Bedrock then Anthropic; Opus on Bedrock alone.
    let routing = json!({
        "eject_after_failures": 1000,
        "models": {
            CLAUDE: [
                {"cluster": "bedrock", "provider": "bedrock", "weight": 1_000_000, "model": BEDROCK_ID},
                {"cluster": "anthropic", "provider": "anthropic", "weight": 1}
            ],
            OPUS: [{"cluster": "bedrock", "provider": "bedrock", "model": OPUS_ID}]
        }
    });
    let envoy = envoy(&default, &[&bedrock, &anthropic], routing);
    let base = envoy.url("");
    let base = base.trim_end_matches('/');
    bedrock.set_error(Some((424, "Model failed to process the request.")));

    let out = sdk::run(sdk::ANTHROPIC, "messages_raw", base, &["--model", CLAUDE]).await;
    let call = &out["calls"][0];
    assert_eq!(call["status"], 200, "{out}");
    assert_eq!(call["headers"]["x-llm-provider"], "anthropic", "{out}");
    assert_eq!(call["headers"]["x-llm-model"], CLAUDE, "{out}");
    assert!(
        call["text"].as_str().unwrap().ends_with("[anthropic]"),
        "{out}"
    );
    let (b, a) = (posts(&bedrock), posts(&anthropic));
    assert_eq!((b.len(), a.len()), (1, 1), "{out}");
    let (b, a) = (&b[0], &a[0]);
    assert_eq!(
        b.path,
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    );
    assert_eq!(body(b)["anthropic_version"], "bedrock-2023-05-31");
    assert_eq!(a.path, "/v1/messages");
    assert_eq!(body(a)["model"], CLAUDE);
    assert_eq!(body(a)["messages"], body(b)["messages"]);
    assert_eq!(a.header("idempotency-key"), b.header("idempotency-key"));
    let failovers =
        |result: &str| envoy.metric("llm_filter_routing_failovers_total", &[("result", result)]);
    assert_eq!(failovers("answered"), 1.0);

    // Bedrock's account quota spent (a 400 AWS names only in its header)
    // is Bedrock's account's: Anthropic answers Sonnet.
    bedrock.set_error(Some((
        400,
        "Your request exceeds the service quota for your account.",
    )));
    bedrock.set_quota(Some("account"));
    let out = sdk::run(sdk::ANTHROPIC, "messages_raw", base, &["--model", CLAUDE]).await;
    let call = &out["calls"][0];
    assert_eq!(call["status"], 200, "{out}");
    assert_eq!(call["headers"]["x-llm-provider"], "anthropic", "{out}");
    assert_eq!(call["headers"]["x-llm-model"], CLAUDE, "{out}");
    assert_eq!(
        (posts(&bedrock).len(), posts(&anthropic).len()),
        (2, 2),
        "{out}"
    );
    assert_eq!(failovers("answered"), 2.0);
    // A bad request, as AWS names it, is the caller's: no failover.
    bedrock.set_quota(None);
    let out = sdk::run(sdk::ANTHROPIC, "messages_error", base, &["--model", CLAUDE]).await;
    assert_eq!(out["status"], 400, "{out}");
    assert_eq!(
        (posts(&bedrock).len(), posts(&anthropic).len()),
        (3, 2),
        "{out}"
    );
    bedrock.set_error(Some((424, "Model failed to process the request.")));

    // No other backend serves Opus: the client gets Bedrock's 424 as the
    // SDK's status error, Bedrock's message in it.
    let out = sdk::run(sdk::ANTHROPIC, "messages_error", base, &["--model", OPUS]).await;
    assert_eq!(out["status"], 424, "{out}");
    assert_eq!(out["error_class"], "APIStatusError", "{out}");
    let b = last_post(&bedrock).unwrap();
    assert_eq!(
        b.path,
        "/model/anthropic.claude-opus-4-1-20250805-v1%3A0/invoke"
    );
    assert_eq!(
        (posts(&bedrock).len(), posts(&anthropic).len()),
        (4, 2),
        "{out}"
    );
}
