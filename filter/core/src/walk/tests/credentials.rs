//! A call for a mesh-credentialed backend leaves keyless, on its tenant's
//! credential set, and a missing or refused mesh key is the gateway's 503,
//! not a 401.

use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

const MESH: &str = r#"{
  "routing": {
    "models": {
      "gpt-4o": [{"cluster": "openai"}],
      "claude": [{"cluster": "anthropic"}],
      "gemini-2.5-flash": [{"cluster": "gemini"}],
      "local": [{"cluster": "vllm"}]
    }
  },
  "tenant": {"from": "header", "header": "x-team"},
  "credentials": {"clusters": {
    "openai": {"team-a": "openai-a"},
    "anthropic": {},
    "gemini": {}
  }}
}"#;

const STRAYS: [(&str, &str); 4] = [
    ("authorization", "Bearer stray"),
    ("api-key", "stray"),
    ("x-api-key", "stray"),
    ("x-goog-api-key", "stray"),
];

fn call(w: &mut World, path: &str, body: &str, extra: &[(&str, &str)]) -> (Call, FakeHost) {
    let mut host = FakeHost::post(path);
    for (k, v) in STRAYS.iter().chain(extra) {
        host = host.with_header(k, v);
    }
    let mut host = host.with_body(body);
    let (call, _) = w.request(&mut host).unwrap();
    (call, host)
}

fn keyless(host: &FakeHost) -> bool {
    STRAYS.iter().all(|(k, _)| host.header(k).is_none())
}

#[test]
fn a_call_for_a_mesh_backend_leaves_without_the_clients_key() {
    let mut w = World::new(MESH);
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let (_, host) = call(&mut w, "/v1/chat/completions", chat, &[]);
    assert!(keyless(&host), "{:?}", host.request_headers);
    assert_eq!(host.header("x-llm-cluster"), Some("openai"));
    // Team A's calls go to the cluster with team A's key.
    let (_, host) = call(
        &mut w,
        "/v1/chat/completions",
        chat,
        &[("x-team", "team-a")],
    );
    assert!(keyless(&host));
    assert_eq!(host.header("x-llm-cluster"), Some("openai-a"));
    // Anthropic's version is added when the client sent none, kept when it did.
    let m = r#"{"model":"claude","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let (_, host) = call(&mut w, "/v1/messages", m, &[]);
    assert!(keyless(&host));
    assert_eq!(host.header("anthropic-version"), Some("2023-06-01"));
    let (_, host) = call(
        &mut w,
        "/v1/messages",
        m,
        &[("anthropic-version", "2024-01-01")],
    );
    assert_eq!(host.header("anthropic-version"), Some("2024-01-01"));
    // Gemini's query key goes too, every other parameter kept.
    let g = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    let path = "/v1beta/models/gemini-2.5-flash:generateContent?key=stray&alt=json";
    let (_, host) = call(&mut w, path, g, &[]);
    assert!(keyless(&host));
    assert_eq!(
        host.header(":path"),
        Some("/v1beta/models/gemini-2.5-flash:generateContent?alt=json")
    );
}

#[test]
fn a_backend_that_takes_the_clients_key_gets_it() {
    let mut w = World::new(MESH);
    let body = r#"{"model":"local","messages":[{"role":"user","content":"hi"}]}"#;
    let (_, host) = call(&mut w, "/v1/chat/completions", body, &[]);
    assert_eq!(host.header("authorization"), Some("Bearer stray"));
    assert_eq!(host.header("x-llm-cluster"), Some("vllm"));
    // No credentials section: nothing is stripped, whatever the backend.
    let mut w = World::new(r#"{"routing":{"models":{"gpt-4o":[{"cluster":"openai"}]}}}"#);
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let (_, host) = call(&mut w, "/v1/chat/completions", chat, &[]);
    assert_eq!(host.header("x-api-key"), Some("stray"));
}

#[test]
fn every_call_is_keyless_at_a_gateway_that_says_so() {
    let mut w = World::new(r#"{"credentials":{"every_call":true}}"#);
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let (_, host) = call(&mut w, "/v1/chat/completions", chat, &[]);
    assert!(keyless(&host), "{:?}", host.request_headers);
}

#[test]
fn a_missing_mesh_key_is_the_gateways_503_in_the_callers_shape() {
    let mut w = World::new(MESH);
    let m = r#"{"model":"claude","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let (mut call, host) = call(&mut w, "/v1/messages", m, &[]);
    let mut host = host.with_response(401, "text/plain", "Failed to inject credential.");
    host.code_details = Some(crate::credentials::NOT_INJECTED_DETAILS.into());
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response(":status"), Some("503"));
    let size = host.response_body.len();
    call.on_response_body(&mut w.env(), &mut host, size, true);
    let body: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "api_error");
    assert_eq!(body["error"]["code"], "llm_filter_credential_unavailable");
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_credential_unavailable_totalllm_cluster=.=anthropic;.;"),
        1
    );
    // A provider's 401 to a keyless call refused the mesh's credential (an
    // expired token Envoy still held): the gateway's 503 too, counted.
    let (mut call, host) = call_again(&mut w, m);
    let mut host = host.with_response(401, "application/json", r#"{"type":"error"}"#);
    host.code_details = Some("via_upstream".into());
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response(":status"), Some("503"));
    let size = host.response_body.len();
    call.on_response_body(&mut w.env(), &mut host, size, true);
    let body: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(body["error"]["code"], "llm_filter_credential_unavailable");
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_credential_unavailable_totalllm_cluster=.=anthropic;.;"),
        2
    );
}

#[test]
fn a_providers_401_to_a_call_with_the_clients_key_is_the_providers_word() {
    let mut w = World::new(MESH);
    let body = r#"{"model":"local","messages":[{"role":"user","content":"hi"}]}"#;
    let (mut call, host) = call(&mut w, "/v1/chat/completions", body, &[]);
    let mut host = host.with_response(401, "application/json", r#"{"error":{}}"#);
    host.code_details = Some("via_upstream".into());
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response(":status"), Some("401"));
}

fn call_again(w: &mut World, body: &str) -> (Call, FakeHost) {
    call(w, "/v1/messages", body, &[])
}

const TWO: &str = r#"{
  "routing": {"models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]}, "eject_after_failures": 100},
  "tenant": {"from": "header", "header": "x-team"},
  "credentials": {"clusters": {"a": {"team-a": "a-team"}}}
}"#;

/// A call of team A routed to `cluster` whose 503 is held back and sent to
/// the other backend: the callout's cluster and headers.
fn failed_over_from(cluster: &str) -> (String, Vec<(String, String)>) {
    let mut w = World::new(TWO);
    for n in 0..100 {
        let chat =
            format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi {n}"}}]}}"#);
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("authorization", "Bearer k")
            .with_header("x-team", "team-a")
            .with_body(&chat);
        let (mut call, _) = w.request(&mut host).unwrap();
        let routed = host.header("x-llm-cluster").unwrap_or_default().to_string();
        if !routed.starts_with(cluster) {
            call.on_log(&mut w.env());
            continue;
        }
        let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
        assert_eq!(
            call.on_response_headers(&mut w.env(), &mut host, false),
            Step::Pause
        );
        let (to, headers, _, _) = host.callouts.pop().unwrap();
        return (to, headers);
    }
    panic!("never routed to {cluster}");
}

#[test]
fn a_failover_never_carries_a_key_to_the_wrong_backend() {
    let auth = |h: &[(String, String)]| {
        h.iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.clone())
    };
    // From b (the client's key) to a (the mesh's, team A's set): keyless.
    let (to, headers) = failed_over_from("b");
    assert_eq!(to, "a-team");
    assert_eq!(auth(&headers), None);
    // From a (stripped; its cluster's key may be on the request by now) to
    // b: no key of the mesh's goes to another cluster.
    let (to, headers) = failed_over_from("a");
    assert_eq!(to, "b");
    assert_eq!(auth(&headers), None);
}

#[test]
fn a_credential_outage_adds_no_breaker_pressure() {
    // The mesh's token is missing for a while (its token endpoint is down):
    // calls are the gateway's 503, but the breaker does not shed or open
    // the circuit on them, so the first call after the token is back goes.
    let config = MESH.replacen(
        "\"tenant\"",
        r#""budget": {"min_calls": 1, "probe_fraction": 0}, "tenant""#,
        1,
    );
    let mut w = World::new(&config);
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..20 {
        let (mut call, host) = call(&mut w, "/v1/chat/completions", chat, &[]);
        let mut host = host.with_response(401, "text/plain", "Failed to inject credential.");
        host.code_details = Some(crate::credentials::NOT_INJECTED_DETAILS.into());
        w.respond(&mut call, &mut host);
        assert_eq!(host.response(":status"), Some("503"));
        call.on_log(&mut w.env());
    }
    let (_, host) = call(
        &mut w,
        "/v1/chat/completions",
        chat,
        &[("x-request-priority", "P2")],
    );
    assert!(host.local_reply.is_none(), "{:?}", host.local_reply);
    assert_eq!(host.header("x-llm-cluster"), Some("openai"));
}
