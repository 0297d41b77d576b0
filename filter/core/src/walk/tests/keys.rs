//! One scenario with every feature that writes shared data on: the cache,
//! routing with hedging, a continued Responses call, the prompt estimate's
//! calibration, limits, load and an alert through the admin webhook. Every
//! key it writes belongs to a family of the key registry (the fake world
//! notes any other, and fails), and each family a call can write is written.

use std::collections::BTreeSet;

use crate::admin::AdminCall;
use crate::keyspace::{self, family_of};
use crate::walk::fake::{FakeHost, World};

const TOKEN: &str = "0123456789abcdef-token";

fn world() -> World {
    World::new(&format!(
        r#"{{
  "admin": {{"token": "{TOKEN}"}},
  "cache": {{"max_entries": 8}},
  "routing": {{
    "models": {{"gpt-4o": [{{"cluster": "a"}}, {{"cluster": "b"}}]}},
    "hedge": {{}}
  }},
  "limits": {{"max_keys": 16, "rules": [
    {{"name": "team", "by": ["tenant"], "requests_per_minute": 100}}
  ]}},
  "shaping": {{"max_prompt_tokens": 100000}}
}}"#
    ))
}

/// A chat call of a prompt long enough to learn the estimate's ratio from,
/// answered with its usage.
fn chat(w: &mut World, question: &str) {
    let text = "word ".repeat(60);
    let body = format!(
        r#"{{"model":"gpt-4o","temperature":0,"messages":[{{"role":"user","content":"{question} {text}"}}]}}"#
    );
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("authorization", "Bearer tenant-a")
        .with_body(&body);
    let (mut call, _) = w.request(&mut host).unwrap();
    let answer = r#"{"id":"x","object":"chat.completion","created":7,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":90,"completion_tokens":1,"total_tokens":91}}"#;
    let mut host = host.with_response(200, "application/json", answer);
    w.respond(&mut call, &mut host);
    call.on_log(&mut w.env());
}

/// A stored Responses call, whose id the routing remembers.
fn responses(w: &mut World) {
    let mut host = FakeHost::post("/v1/responses")
        .with_header("authorization", "Bearer tenant-b")
        .with_body(r#"{"model":"gpt-4o","input":"hi"}"#);
    let (mut call, _) = w.request(&mut host).unwrap();
    let answer = r#"{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}"#;
    let mut host = host.with_response(200, "application/json", answer);
    w.respond(&mut call, &mut host);
    call.on_log(&mut w.env());
}

/// An alert through the admin webhook.
fn alert(w: &mut World) {
    let body = r#"{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"LLMSlow","severity":"warning"},"fingerprint":"fp1"}]}"#;
    let mut host = FakeHost::new()
        .with_header(":method", "POST")
        .with_header(":path", "/llm-filter/alerts")
        .with_header("authorization", &format!("Bearer {TOKEN}"))
        .with_body(body);
    let (mut admin, _) = AdminCall::start(&mut w.env(), &mut host, false).unwrap();
    let size = host.request_body.len();
    admin.on_request_body(&mut w.env(), &mut host, size, true);
    assert_eq!(host.local_reply.as_ref().map(|r| r.0), Some(200));
}

#[test]
fn every_key_a_walk_writes_is_in_a_registered_family() {
    let mut w = world();
    for n in 0..4 {
        chat(&mut w, &format!("question {n}"));
    }
    // The same question again: a hit.
    chat(&mut w, "question 0");
    responses(&mut w);
    alert(&mut w);
    assert_eq!(w.store.unnamed(), Vec::<String>::new());
    let written: BTreeSet<&str> = w
        .store
        .keys()
        .iter()
        .filter_map(|k| family_of(k))
        .map(|f| f.key)
        .collect();
    let expected = [
        &keyspace::CACHE_SLOT,
        &keyspace::CACHE_INFLIGHT,
        &keyspace::CACHE_STATS,
        &keyspace::HEALTH,
        &keyspace::BREAKER,
        &keyspace::HEDGE,
        &keyspace::RESPONSE,
        &keyspace::LOAD_MODEL,
        &keyspace::LOAD_CLUSTER,
        &keyspace::LOAD_INDEX,
        &keyspace::ALERTS,
        &keyspace::CALIBRATION,
        &keyspace::LIMITS,
    ];
    let missing: Vec<&str> = expected
        .iter()
        .map(|f| f.key)
        .filter(|k| !written.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "not written: {missing:?}; written: {written:?}"
    );
}
