//! Scenario tests of the limits step: reservation, refusal in each API's
//! shape, the rate-limit headers, settling at the end and degrade.

use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

const PATH: &str = "/v1/chat/completions";
const ANSWER: &str = r#"{"id":"x","object":"chat.completion","created":7,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
const CHAT: &str =
    r#"{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"hi there"}]}"#;

fn world(rules: &str) -> World {
    World::new(&format!(r#"{{"limits":{{"rules":[{rules}]}}}}"#))
}

fn call(key: &str, body: &str) -> FakeHost {
    FakeHost::post(PATH)
        .with_header("authorization", key)
        .with_body(body)
}

fn run(w: &mut World, host: &mut FakeHost) -> (Call, Step) {
    let (mut call, _) = Call::start(&mut w.env(), host, false).unwrap();
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), host, size, true);
    (call, step)
}

fn answered(w: &mut World, mut c: Call, host: FakeHost) -> FakeHost {
    let mut host = host.with_response(200, "application/json", ANSWER);
    c.on_response_headers(&mut w.env(), &mut host, false);
    let n = ANSWER.len();
    c.on_response_body(&mut w.env(), &mut host, n, true);
    c.on_log(&mut w.env());
    host
}

#[test]
fn calls_pass_with_what_is_left_and_are_refused_in_openai_shape() {
    let mut w =
        world(r#"{"name":"t","by":["tenant"],"tokens_per_minute":250,"requests_per_minute":5}"#);
    // Reserves 2 prompt tokens + 100: the second call sees 250 − 2 × 102.
    let (c, step) = run(&mut w, &mut call("Bearer a", CHAT));
    assert_eq!(step, Step::Continue);
    let (c2, _) = run(&mut w, &mut call("Bearer a", CHAT));
    let host = answered(&mut w, c2, call("Bearer a", CHAT));
    assert_eq!(host.response("x-ratelimit-limit-tokens"), Some("250"));
    assert_eq!(host.response("x-ratelimit-remaining-tokens"), Some("46"));
    assert_eq!(host.response("x-ratelimit-remaining-requests"), Some("3"));
    // The answer used 4 tokens: 98 came back; still 102 + 4 = 106 used.
    let mut host = call("Bearer a", CHAT);
    let (_third, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    let mut host = call("Bearer a", CHAT);
    let (refused, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Pause);
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "llm_filter_limit_exceeded");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tokens_per_minute"));
    assert!(headers["retry-after"].parse::<u64>().unwrap() >= 1);
    // Both measures, as OpenAI's own 429 says them: 208 of 250 tokens used
    // (too few left for this call's 102), 3 of 5 requests.
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "42");
    assert_eq!(headers["x-ratelimit-limit-tokens"], "250");
    assert!(headers["x-ratelimit-reset-tokens"].ends_with('s'));
    assert_eq!(headers["x-ratelimit-remaining-requests"], "2");
    assert_eq!(headers["x-ratelimit-limit-requests"], "5");
    refused.on_log(&mut w.env());
    // Another key is another tenant.
    let (_, step) = run(&mut w, &mut call("Bearer b", CHAT));
    assert_eq!(step, Step::Continue);
    drop(c);
}

#[test]
fn a_messages_caller_gets_anthropics_429_and_header_names() {
    let mut w = world(r#"{"name":"t","requests_per_minute":1}"#);
    let body = r#"{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    let host = || {
        FakeHost::post("/v1/messages")
            .with_header("x-api-key", "k")
            .with_body(body)
    };
    let (mut c, _) = run(&mut w, &mut host());
    let mut h = host().with_response(200, "application/json", "{}");
    c.on_response_headers(&mut w.env(), &mut h, false);
    assert_eq!(
        h.response("anthropic-ratelimit-requests-remaining"),
        Some("0")
    );
    assert!(h
        .response("anthropic-ratelimit-requests-reset")
        .unwrap()
        .ends_with('Z'));
    let mut refused = host();
    run(&mut w, &mut refused);
    let (status, _, body) = refused.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    // Anthropic's 429 says what is left in its own names, reset as a time.
    let (_, headers, _) = refused.local_reply.clone().unwrap();
    assert_eq!(headers["anthropic-ratelimit-requests-limit"], "1");
    assert_eq!(headers["anthropic-ratelimit-requests-remaining"], "0");
    assert!(headers["anthropic-ratelimit-requests-reset"].ends_with('Z'));
    assert!(headers["retry-after"].parse::<u64>().unwrap() >= 1);
}

#[test]
fn one_key_is_one_tenant_whatever_else_the_call_carries() {
    let mut w = world(r#"{"name":"t","by":["tenant"],"requests_per_minute":2}"#);
    run(&mut w, &mut call("Bearer sk-one", CHAT));
    // Junk the provider ignores: the same key, the same count.
    let steps: Vec<Step> = [
        call("bearer sk-one", CHAT).with_header("api-key", "x"),
        call("BEARER  sk-one", CHAT).with_header("api-key", ""),
        call("Bearer sk-one", CHAT).with_header("x-api-key", "junk"),
    ]
    .into_iter()
    .map(|mut host| run(&mut w, &mut host).1)
    .collect();
    // The key's second call fits; the two after it are over its limit.
    assert_eq!(steps, [Step::Continue, Step::Pause, Step::Pause]);
    assert_eq!(
        w.counter("llm_filter_limits_calls_totalrule=.=t;.;result=.=rejected;.;"),
        2
    );
    // Another key is another tenant.
    let (_, step) = run(&mut w, &mut call("Bearer sk-two", CHAT));
    assert_eq!(step, Step::Continue);
}

#[test]
fn a_shard_front_names_the_tenant_and_a_replica_drops_the_name() {
    let mut front = World::new(r#"{"limits":{"mode":"shard"}}"#);
    let mut named = |key: &str, junk: &str| {
        let mut host = call(key, CHAT)
            .with_header("api-key", junk)
            .with_header("x-llm-tenant-key", "forged");
        run(&mut front, &mut host);
        host.header("x-llm-tenant-key").map(str::to_string)
    };
    let a = named("Bearer sk-one", "x");
    assert_eq!(a.as_deref().map(str::len), Some(12));
    assert_eq!(named("bearer  sk-one", "y"), a);
    assert_ne!(named("Bearer sk-two", "x"), a);
    // Anthropic's key is the same tenant id as the replica counts.
    let mut m = FakeHost::post("/v1/messages")
        .with_header("x-api-key", "sk-one")
        .with_header("authorization", "junk")
        .with_body(r#"{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#);
    run(&mut front, &mut m);
    assert_eq!(m.header("x-llm-tenant-key").map(str::to_string), a);
    // A replica enforcing rules never lets the name reach the upstream.
    let mut w = world(r#"{"name":"t","by":["tenant"],"requests_per_minute":5}"#);
    let mut host = call("Bearer sk-one", CHAT).with_header("x-llm-tenant-key", "forged");
    run(&mut w, &mut host);
    assert_eq!(host.header("x-llm-tenant-key"), None);
}

#[test]
fn a_degrading_rule_sends_the_call_cheaper_and_says_so() {
    let mut w = world(
        r#"{"name":"d","requests_per_minute":1,"degrade":{"max_tokens":16,"model":"gpt-4o-mini","until":3}}"#,
    );
    run(&mut w, &mut call("k", CHAT));
    let mut host = call("k", CHAT);
    let (c, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["model"], "gpt-4o-mini");
    assert_eq!(sent["max_tokens"], 16);
    let host = answered(&mut w, c, host);
    assert_eq!(host.response("x-llm-limited"), Some("degraded"));
}

#[test]
fn a_degrading_rule_switches_a_gemini_model_in_its_path() {
    let mut w = world(
        r#"{"name":"d","requests_per_minute":1,"degrade":{"max_tokens":16,"model":"gemini-lite","until":3}}"#,
    );
    let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    let gemini = || {
        FakeHost::post("/v1beta/models/gemini-pro:streamGenerateContent?alt=sse")
            .with_header("x-goog-api-key", "k")
            .with_body(body)
    };
    run(&mut w, &mut gemini());
    let mut host = gemini();
    let (_, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    assert_eq!(
        host.header(":path"),
        Some("/v1beta/models/gemini-lite:streamGenerateContent?alt=sse")
    );
    assert!(host.route_cache_cleared > 0, "Envoy picks the route again");
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["generationConfig"]["maxOutputTokens"], 16);
    assert!(sent.get("model").is_none(), "the body names no model");
}

#[test]
fn a_long_window_refusal_tells_sdks_not_to_retry_and_p0_passes() {
    let mut w = world(r#"{"name":"day","tokens_per_day":150}"#);
    run(&mut w, &mut call("k", CHAT));
    let mut host = call("k", CHAT);
    run(&mut w, &mut host);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    assert_eq!(headers["x-should-retry"], "false");
    let mut p0 = call("k", CHAT).with_header("x-request-priority", "P0");
    let (_, step) = run(&mut w, &mut p0);
    assert_eq!(step, Step::Continue);
}

#[test]
fn a_gemini_key_in_the_header_or_the_query_is_one_tenant() {
    let mut w = world(r#"{"name":"t","by":["tenant"],"requests_per_minute":2}"#);
    let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    let path = "/v1beta/models/g:generateContent";
    let in_header = || {
        FakeHost::post(path)
            .with_header("x-goog-api-key", "gk-one")
            .with_body(body)
    };
    let in_query = |key: &str| FakeHost::post(&format!("{path}?key={key}")).with_body(body);
    let steps: Vec<Step> = [in_header(), in_query("gk-one"), in_header()]
        .into_iter()
        .map(|mut host| run(&mut w, &mut host).1)
        .collect();
    // The key's third call, header or query, is over its limit.
    assert_eq!(steps, [Step::Continue, Step::Continue, Step::Pause]);
    // Another key in the query is another tenant.
    let (_, step) = run(&mut w, &mut in_query("gk-two"));
    assert_eq!(step, Step::Continue);
}
