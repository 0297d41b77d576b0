//! Scenario tests of the identify step: the tenant a verified identity
//! names is the one the limits count, the cache isolates and the record
//! tells; a call without it is refused before anything is spent; a virtual
//! key never goes on.

use crate::build;
use crate::identity::digest;
use crate::walk::fake::{with_section, FakeHost, World};
use crate::walk::*;

const PATH: &str = "/v1/chat/completions";
const CHAT: &str =
    r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"id":"x","object":"chat.completion","created":7,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

fn hex(key: &str) -> String {
    digest(key).iter().map(|b| format!("{b:02x}")).collect()
}

/// Keys `vk-a1` and `vk-a2` of team `a`, `vk-b` of team `b`; three requests
/// a minute per tenant and the cache on, in a build with limits and the
/// cache; the record on.
fn world() -> World {
    let config = format!(
        r#"{{"tenant":{{"from":"virtual_key","keys":{{"a":"{} {}","b":"{}"}}}},
          "access_log":{{"enabled":true}}}}"#,
        hex("vk-a1"),
        hex("vk-a2"),
        hex("vk-b")
    );
    let config = with_section(build::CACHE, r#""cache":{"max_entries":8}"#, &config);
    World::new(&with_section(
        build::LIMITS,
        r#""limits":{"rules":[{"name":"t","by":["tenant"],"requests_per_minute":3}]}"#,
        &config,
    ))
}

fn run(w: &mut World, host: &mut FakeHost) -> Step {
    let (mut call, step) = Call::start(&mut w.env(), host, false).unwrap();
    if step == Step::Pause && host.local_reply.is_some() {
        call.on_log(&mut w.env());
        return step;
    }
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), host, size, true);
    if step == Step::Continue {
        let mut answered = host.clone().with_response(200, "application/json", ANSWER);
        answered
            .response_headers
            .push(("content-length".into(), ANSWER.len().to_string()));
        call.on_response_headers(&mut w.env(), &mut answered, false);
        answered.response_body = ANSWER.as_bytes().to_vec();
        call.on_response_body(&mut w.env(), &mut answered, ANSWER.len(), true);
        *host = answered;
    }
    call.on_log(&mut w.env());
    step
}

fn chat(key: &str) -> FakeHost {
    FakeHost::post(PATH)
        .with_header("authorization", &format!("Bearer {key}"))
        .with_body(CHAT)
}

fn record(host: &FakeHost) -> serde_json::Value {
    serde_json::from_slice(&host.properties["llm_filter.call"]).unwrap()
}

#[test]
fn an_unknown_or_missing_key_is_refused_before_anything_is_spent() {
    for (host, api, reason, status_of) in [
        (chat("sk-real"), "chat", "unknown", "invalid_api_key"),
        (
            FakeHost::post(PATH).with_body(CHAT),
            "chat",
            "missing",
            "invalid_api_key",
        ),
        (
            FakeHost::post("/v1/messages")
                .with_header("x-api-key", "nope")
                .with_body(r#"{"model":"m","max_tokens":5,"messages":[]}"#),
            "messages",
            "unknown",
            "authentication_error",
        ),
        (
            FakeHost::post("/v1beta/models/g:generateContent?key=nope")
                .with_body(r#"{"contents":[]}"#),
            "gemini",
            "unknown",
            "UNAUTHENTICATED",
        ),
    ] {
        let mut w = world();
        let mut host = host;
        assert_eq!(run(&mut w, &mut host), Step::Pause, "{api}");
        let (status, headers, body) = host.local_reply.clone().unwrap();
        assert_eq!(status, 401, "{api}");
        assert_eq!(headers["content-type"], "application/json");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let said = match api {
            "chat" => {
                assert_eq!(v["error"]["type"], "invalid_request_error");
                &v["error"]["code"]
            }
            "messages" => &v["error"]["type"],
            _ => &v["error"]["status"],
        };
        assert_eq!(said, status_of, "{api}: {v}");
        assert!(!String::from_utf8_lossy(&body).contains("nope"));
        assert!(!String::from_utf8_lossy(&body).contains("sk-real"));
        let counted =
            format!("llm_filter_identity_refused_totalreason=.={reason};.;api=.={api};.;");
        assert_eq!(w.counter(&counted), 1, "{api}");
        // Nothing spent: no limit count, no cache read, the body not read.
        assert!(w.store.keys().is_empty(), "{api}: {:?}", w.store.keys());
        assert_eq!(host.body_reads.get(), 0, "{api}");
        assert_eq!(record(&host)["status"], 401);
    }
}

#[test]
fn geminis_key_leaves_the_query() {
    let mut w = world();
    let mut host = FakeHost::post("/v1beta/models/g:generateContent?alt=sse&key=vk-b")
        .with_body(r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#);
    let (_call, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Pause, "the body is held");
    assert_eq!(
        host.header(":path"),
        Some("/v1beta/models/g:generateContent?alt=sse")
    );
}

/// What a tenant is counted and cached under (the `limits` and `cache`
/// features).
#[cfg(all(feature = "limits", feature = "cache"))]
mod counted {
    use super::*;

    #[test]
    fn a_known_key_is_its_tenant_and_never_goes_on() {
        let mut w = world();
        let mut host = chat("vk-a1");
        assert_eq!(run(&mut w, &mut host), Step::Continue);
        assert_eq!(host.header("authorization"), None, "taken off the call");
        assert_eq!(host.response("x-cache"), Some("MISS"));
        let r = record(&host);
        assert_eq!(r["tenant"], "a");
        assert!(!r.to_string().contains("vk-a1"));
        // The other key of team a reads team a's entry, and shares its count.
        let mut host = chat("vk-a2");
        assert_eq!(run(&mut w, &mut host), Step::Pause);
        assert_eq!(host.local_reply.as_ref().unwrap().1["x-cache"], "HIT");
        // Team b never reads it.
        let mut host = chat("vk-b");
        assert_eq!(run(&mut w, &mut host), Step::Continue);
        assert_eq!(host.response("x-cache"), Some("MISS"));
        assert_eq!(record(&host)["tenant"], "b");
        // Team a's third call is its last of the minute, b still has two.
        let third = FakeHost::post(PATH)
            .with_header("api-key", "vk-a2")
            .with_header("cache-control", "no-cache")
            .with_body(CHAT);
        let mut host = third.clone();
        assert_eq!(run(&mut w, &mut host), Step::Continue);
        assert_eq!(host.header("api-key"), None);
        let mut host = third;
        assert_eq!(run(&mut w, &mut host), Step::Pause);
        assert_eq!(host.local_reply.unwrap().0, 429);
    }

    #[test]
    fn a_jwt_claim_is_the_tenant_and_no_claim_is_refused() {
        let mut w = World::new(
            r#"{"tenant":{"from":"jwt","claim":"team"},
                "limits":{"rules":[{"name":"t","by":["tenant"],"requests_per_minute":1}]},
                "access_log":{"enabled":true}}"#,
        );
        let at = "metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.team";
        let with_claim = |team: &str| {
            let mut h = FakeHost::post(PATH)
                .with_header("authorization", "Bearer e30.e30.sig")
                .with_body(CHAT);
            h.properties.insert(at.into(), team.as_bytes().to_vec());
            h
        };
        let mut host = with_claim("payments");
        assert_eq!(run(&mut w, &mut host), Step::Continue);
        assert_eq!(record(&host)["tenant"], "payments");
        let mut host = with_claim("payments");
        assert_eq!(run(&mut w, &mut host), Step::Pause);
        assert_eq!(host.local_reply.unwrap().0, 429);
        let mut host = with_claim("search");
        assert_eq!(run(&mut w, &mut host), Step::Continue);
        // A token the filter before did not verify leaves no claim: refused,
        // not counted under some shared tenant.
        let mut host = FakeHost::post(PATH)
            .with_header("authorization", "Bearer e30.e30.sig")
            .with_body(CHAT);
        assert_eq!(run(&mut w, &mut host), Step::Pause);
        assert_eq!(host.local_reply.unwrap().0, 401);
        assert_eq!(
            w.counter("llm_filter_identity_refused_totalreason=.=missing;.;api=.=chat;.;"),
            1
        );
    }
}
