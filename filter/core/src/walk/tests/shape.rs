//! Scenario tests of the shaping step: what the upstream is sent, what the
//! client hears, and that the cache keys the body as sent.

use crate::build;
use crate::walk::fake::{with_section, FakeHost, World};
use crate::walk::*;

/// The shaping settings, and the cache on in a build that has it.
fn shaping() -> World {
    World::new(&with_section(
        build::CACHE,
        r#""cache":{"enabled":true}"#,
        r#"{"shaping":{"max_tokens_cap":{"P1":256,"P2":64},"max_history_turns":2}}"#,
    ))
}

fn chat(priority: &str, body: &str) -> FakeHost {
    FakeHost::post("/v1/chat/completions")
        .with_header("x-request-priority", priority)
        .with_body(body)
}

/// Headers, then the whole body.
fn send(w: &mut World, host: &mut FakeHost) -> (Call, Step) {
    let (mut call, step) = Call::start(&mut w.env(), host, false).unwrap();
    assert_eq!(step, Step::Pause, "the body is held");
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), host, size, true);
    (call, step)
}

fn conversation(old: &str) -> String {
    format!(
        r#"{{"model":"m","temperature":0,"messages":[{{"role":"system","content":"s"}},{old}{{"role":"user","content":"u2"}},{{"role":"assistant","content":"a2"}},{{"role":"user","content":"now"}}]}}"#
    )
}

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;

#[test]
fn a_p2_call_is_capped_trimmed_told_and_counted() {
    let mut w = shaping();
    let body =
        conversation(r#"{"role":"user","content":"u1"},{"role":"assistant","content":"a1"},"#);
    let mut host = chat("P2", &body);
    let (mut call, step) = send(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    let sent = String::from_utf8(host.request_body.clone()).unwrap();
    assert_eq!(
        sent,
        format!(
            "{},\"max_tokens\":64}}",
            conversation("").trim_end_matches('}')
        )
    );
    assert_eq!(
        host.header("content-length"),
        Some(sent.len().to_string().as_str())
    );
    let mut host = host.with_response(200, "application/json", ANSWER);
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response("x-llm-shaped"), Some("max_tokens,history"));
    for what in ["max_tokens", "history"] {
        assert_eq!(
            w.counter(&format!(
                "llm_filter_shaped_totalwhat=.={what};.;priority=.=P2;.;"
            )),
            1
        );
    }
}

#[test]
fn p0_is_untouched_by_a_plain_number() {
    let mut w = shaping();
    let body =
        conversation(r#"{"role":"user","content":"u1"},{"role":"assistant","content":"a1"},"#);
    let mut host = chat("P0", &body);
    send(&mut w, &mut host);
    assert_eq!(host.request_body, body.as_bytes());
    assert!(w
        .metrics
        .counters
        .keys()
        .all(|k| !k.starts_with("llm_filter_shaped")));
}

#[test]
fn a_body_shaping_does_not_understand_passes_untouched() {
    let mut w = shaping();
    for body in [
        r#"{"model":"m","max_tokens":"lots","messages":[{"role":"user","content":"x"}]}"#,
        r#"{"model":"m","model":"n","messages":[{"role":"user","content":"x"}]}"#,
        "not json",
    ] {
        let mut host = chat("P2", body);
        send(&mut w, &mut host);
        assert_eq!(host.request_body, body.as_bytes(), "{body}");
    }
    // Not a chat call: never shaped.
    let mut host = FakeHost::post("/v1/completions")
        .with_header("x-request-priority", "P2")
        .with_body(r#"{"model":"m","prompt":"x","max_tokens":9000}"#);
    send(&mut w, &mut host);
    assert!(host.request_body.ends_with(b"9000}"));
}

#[test]
fn a_body_no_step_edits_is_not_written() {
    let mut w = shaping();
    let mut host = chat(
        "P0",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let (_call, step) = send(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    assert_eq!(host.body_writes, 0);
}

/// The cache keys the body as sent (the `cache` feature).
#[cfg(feature = "cache")]
mod cached {
    use super::*;

    #[test]
    fn the_cache_keys_the_body_as_sent() {
        let mut w = shaping();
        let first =
            conversation(r#"{"role":"user","content":"u1"},{"role":"assistant","content":"a1"},"#);
        let mut host = chat("P1", &first);
        let (mut call, _) = send(&mut w, &mut host);
        let mut host = host.with_response(200, "application/json", ANSWER);
        host.response_headers
            .push(("content-length".into(), ANSWER.len().to_string()));
        call.on_response_headers(&mut w.env(), &mut host, false);
        call.on_response_body(&mut w.env(), &mut host, ANSWER.len(), true);
        call.on_log(&mut w.env());
        // Another old turn, dropped as well: the same call is sent, and served.
        let second =
            conversation(r#"{"role":"user","content":"zz"},{"role":"assistant","content":"yy"},"#);
        let mut host = chat("P1", &second);
        let (_, step) = send(&mut w, &mut host);
        assert_eq!(step, Step::Pause);
        let (status, headers, _) = host.local_reply.clone().unwrap();
        assert_eq!(status, 200);
        assert_eq!(headers.get("x-cache").map(String::as_str), Some("HIT"));
        assert_eq!(
            headers.get("x-llm-shaped").map(String::as_str),
            Some("max_tokens,history")
        );
    }
}

/// One write of every edit, the route's model among them (the `routing`
/// feature).
#[cfg(feature = "routing")]
mod routed {
    use super::*;

    #[test]
    fn every_edit_reaches_the_host_in_one_write_as_the_call_leaves() {
        // Shaped (history and cap), asked for its stream's usage, and renamed for
        // the chosen backend: four edits, one body written.
        let mut w = World::new(
            r#"{"shaping":{"max_tokens_cap":{"P2":64},"max_history_turns":2},
                "routing":{"models":{"m":[{"cluster":"a","model":"m-a"}]}}}"#,
        );
        let body =
            conversation(r#"{"role":"user","content":"u1"},{"role":"assistant","content":"a1"},"#)
                .replacen('{', r#"{"stream":true,"#, 1);
        let mut host = chat("P2", &body);
        let (_call, step) = send(&mut w, &mut host);
        assert_eq!(step, Step::Continue);
        assert_eq!(host.body_writes, 1);
        let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
        assert_eq!(sent["model"], "m-a");
        assert_eq!(sent["max_tokens"], 64);
        assert_eq!(sent["stream_options"]["include_usage"], true);
        assert_eq!(sent["messages"].as_array().map(Vec::len), Some(4));
        assert_eq!(
            host.header("content-length"),
            Some(host.request_body.len().to_string().as_str())
        );
    }
}
