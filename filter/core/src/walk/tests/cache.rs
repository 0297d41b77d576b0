//! Scenario tests of the cache's steps in the walk: every way a call meets the
//! cache, against a fake host and in-memory shared data.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::cache::store::{slot_key, Store};
use crate::host::SharedStore;
use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

mod dialects;

impl World {
    /// Request headers, then the whole body: the call and the last step.
    fn hold_request(&mut self, host: &mut FakeHost) -> (Call, Step) {
        let (mut call, step) = Call::start(&mut self.env(), host, false).unwrap();
        assert_eq!(step, Step::Pause, "the body is held");
        let size = host.request_body.len();
        let step = call.on_request_body(&mut self.env(), host, size, true);
        (call, step)
    }

    /// The upstream's answer: headers, then `chunks` one callback each.
    fn respond_chunks(&mut self, call: &mut Call, host: &mut FakeHost, chunks: &[&str]) {
        assert_eq!(
            call.on_response_headers(&mut self.env(), host, false),
            Step::Continue
        );
        for (i, chunk) in chunks.iter().enumerate() {
            host.response_body = chunk.as_bytes().to_vec();
            let last = i + 1 == chunks.len();
            let step = call.on_response_body(&mut self.env(), host, chunk.len(), last);
            if step == Step::Pause {
                assert!(!last);
            }
        }
    }

    /// A whole call that goes upstream and gets `status`/`body`.
    fn upstream_call(&mut self, mut host: FakeHost, status: u16, ct: &str, body: &str) -> FakeHost {
        let (mut call, step) = self.hold_request(&mut host);
        assert_eq!(step, Step::Continue, "goes upstream");
        let mut host = host.with_response(status, ct, body);
        host.response_headers
            .push(("content-length".into(), body.len().to_string()));
        self.respond_chunks(&mut call, &mut host, &[body]);
        call.on_log(&mut self.env());
        host
    }

    fn lookups(&self, result: &str) -> u64 {
        self.counter(&format!(
            "llm_filter_cache_lookups_totalresult=.={result};.;"
        ))
    }

    fn stores(&self, result: &str) -> u64 {
        self.counter(&format!(
            "llm_filter_cache_stores_totalresult=.={result};.;"
        ))
    }

    fn gauge(&self, name: &str) -> i64 {
        self.metrics.gauges.get(name).copied().unwrap_or(-1)
    }
}

const PATH: &str = "/v1/chat/completions";
const CHAT: &str =
    r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you doing on this fine day?"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":11,"total_tokens":14}}"#;

fn chat(body: &str) -> FakeHost {
    FakeHost::post(PATH)
        .with_header("authorization", "Bearer t1")
        .with_header("accept-encoding", "gzip")
        .with_body(body)
}

fn streamed(include_usage: bool) -> String {
    let opts = if include_usage {
        r#","stream_options":{"include_usage":true}"#
    } else {
        ""
    };
    CHAT.replace(
        r#""temperature":0"#,
        &format!(r#""temperature":0,"stream":true{opts}"#),
    )
}

/// A provider stream with the answer in pieces, ending with usage and `[DONE]`.
fn upstream_stream() -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id":"c9","object":"chat.completion.chunk","created":7,"model":"gpt-4o",
                   "choices":[{"index":0,"delta":delta,"logprobs":null,"finish_reason":finish}]})
        )
    };
    vec![
        chunk(json!({"role":"assistant","content":""}), Value::Null),
        chunk(json!({"content":"Streamed "}), Value::Null),
        chunk(
            json!({"content":"answer, long enough to be cut into pieces."}),
            Value::Null,
        ),
        chunk(json!({}), json!("stop")),
        format!(
            "data: {}\n\ndata: [DONE]\n\n",
            json!({"id":"c9","object":"chat.completion.chunk","created":7,"model":"gpt-4o",
                   "choices":[],"usage":{"prompt_tokens":3,"completion_tokens":8,"total_tokens":11}})
        ),
    ]
}

/// The local reply: status, headers, body.
fn reply(host: &FakeHost) -> (u32, BTreeMap<String, String>, Vec<u8>) {
    host.local_reply.clone().expect("a local reply")
}

/// The `data:` payloads of an SSE body.
fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8(body.to_vec())
        .unwrap()
        .split_terminator("\n\n")
        .map(|e| e.strip_prefix("data: ").unwrap().to_string())
        .collect()
}

#[test]
fn a_miss_is_stored_and_the_twin_hits() {
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0}}"#);
    let host = w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(
        host.header("accept-encoding"),
        None,
        "stripped so it can be stored"
    );
    assert_eq!(host.response_body, ANSWER.as_bytes(), "passed untouched");
    assert_eq!((w.lookups("miss"), w.stores("stored")), (1, 1));
    assert_eq!(w.gauge("llm_filter_cache_entries"), 1);
    assert!(w.gauge("llm_filter_cache_bytes") > ANSWER.len() as i64);

    w.now_ms += 2_500;
    let mut host = chat(&CHAT.replace(r#""model":"gpt-4o","#, r#""model" : "gpt-4o" ,"#));
    let (call, step) = w.hold_request(&mut host);
    assert_eq!(step, Step::Pause);
    let (status, headers, body) = reply(&host);
    assert_eq!(status, 200);
    assert_eq!(body, ANSWER.as_bytes());
    assert_eq!(headers["x-cache"], "HIT");
    assert_eq!(headers["age"], "2");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-trace-id"].len(), 32);
    assert_eq!(
        host.header("x-envoy-upstream-rq-timeout-ms"),
        None,
        "not planned"
    );
    call.on_log(&mut w.env());
    assert_eq!(w.lookups("hit"), 1);
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=success;.;api=.=chat;.;"
        ),
        2
    );
}

#[test]
fn the_cache_reads_the_path_the_call_read_at_its_start() {
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0}}"#);
    let mut host = chat(CHAT);
    let (_call, step) = w.hold_request(&mut host);
    assert_eq!(step, Step::Continue, "a miss goes upstream");
    assert_eq!(host.header("accept-encoding"), None, "the cache keyed it");
    let reads = host.header_reads.borrow();
    let paths = reads.iter().filter(|n| *n == ":path").count();
    assert_eq!(paths, 1, "the host is asked once: {reads:?}");
}

#[test]
fn a_hit_is_served_while_the_backend_sheds() {
    let mut w = World::new(r#"{"budget":{"probe_fraction":0}}"#);
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    // Timed-out calls (not cacheable: no temperature) open the breaker.
    for _ in 0..40 {
        let mut host = FakeHost::post(PATH)
            .with_header("x-request-priority", "P0")
            .with_body(r#"{"model":"gpt-4o","messages":[]}"#);
        let (mut call, _) = w.hold_request(&mut host);
        let mut host = host.with_response(504, "text/plain", "upstream request timeout");
        host.code_details = Some("upstream_response_timeout".into());
        w.respond_chunks(&mut call, &mut host, &["upstream request timeout"]);
        assert_eq!(host.response("x-cache"), Some("BYPASS"));
        call.on_log(&mut w.env());
        w.now_ms += 10;
    }
    // A low-priority twin of the cached call is answered from the cache…
    let mut host = chat(CHAT).with_header("x-request-priority", "P2");
    w.hold_request(&mut host);
    let (status, headers, _) = reply(&host);
    assert_eq!((status, headers["x-cache"].as_str()), (200, "HIT"));
    // …while an uncached one is shed, and says it was a miss.
    let mut host = chat(&CHAT.replace("hi", "other")).with_header("x-request-priority", "P2");
    let (call, _) = w.hold_request(&mut host);
    let (status, headers, _) = reply(&host);
    assert_eq!((status, headers["x-cache"].as_str()), (503, "MISS"));
    call.on_log(&mut w.env());
}

#[test]
fn a_stream_fills_the_entry_and_both_forms_replay_it() {
    let mut w = World::new("{}");
    let mut host = chat(&streamed(true));
    let (mut call, step) = w.hold_request(&mut host);
    assert_eq!(step, Step::Continue);
    let mut host = host.with_response(200, "text/event-stream", "");
    let chunks = upstream_stream();
    let parts: Vec<&str> = chunks.iter().map(String::as_str).collect();
    w.respond_chunks(&mut call, &mut host, &parts);
    // Every chunk went on to the client as it came.
    assert_eq!(host.response_body, chunks.last().unwrap().as_bytes());
    assert_eq!(host.response("x-cache"), Some("MISS"));
    call.on_log(&mut w.env());
    assert_eq!(w.stores("stored"), 1);

    // A plain twin gets the assembled JSON answer.
    let mut host = chat(CHAT);
    w.hold_request(&mut host);
    let (_, headers, body) = reply(&host);
    assert_eq!(headers["content-type"], "application/json");
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "Streamed answer, long enough to be cut into pieces."
    );
    assert_eq!(answer["usage"]["total_tokens"], 11);

    // A streamed twin gets events, with the usage chunk only when asked.
    for include_usage in [true, false] {
        let mut host = chat(&streamed(include_usage));
        w.hold_request(&mut host);
        let (_, headers, body) = reply(&host);
        assert_eq!(headers["content-type"], "text/event-stream");
        assert_eq!(headers["x-cache"], "HIT");
        let ev = events(&body);
        assert!(ev.len() >= 5, "{ev:?}");
        assert_eq!(ev.last().unwrap(), "[DONE]");
        let has_usage = ev.iter().any(|e| e.contains("\"usage\""));
        assert_eq!(has_usage, include_usage);
    }
}

#[test]
fn a_plain_answer_replays_as_a_stream() {
    let mut w = World::new("{}");
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    let mut host = chat(&streamed(true));
    w.hold_request(&mut host);
    let (_, headers, body) = reply(&host);
    assert_eq!(headers["content-type"], "text/event-stream");
    let ev = events(&body);
    let text: String = ev
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "Hello there, how are you doing on this fine day?");
    assert!(ev.len() > 4);
}

#[test]
fn bypasses_say_so_and_store_nothing() {
    let mut w = World::new(r#"{"cache":{"dynamic_markers":["{{now}}"]},"max_body_bytes":4096}"#);
    for (host, reason) in [
        (
            chat(r#"{"model":"gpt-4o","messages":[]}"#),
            "no temperature",
        ),
        (chat(&CHAT.replace("hi", "it is {{now}}")), "marker"),
        (
            chat(CHAT).with_header("cache-control", "no-store"),
            "no-store",
        ),
        (chat("{not json"), "not JSON"),
    ] {
        let host = w.upstream_call(host, 200, "application/json", ANSWER);
        assert_eq!(host.response("x-cache"), Some("BYPASS"), "{reason}");
        assert_eq!(host.header("accept-encoding"), Some("gzip"), "{reason}");
    }
    // A body too large to hold streams through, uncached.
    let big = CHAT.replace("hi", &"x".repeat(5000));
    let mut host = chat(&big);
    let (mut call, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Continue);
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond_chunks(&mut call, &mut host, &[ANSWER]);
    assert_eq!(host.response("x-cache"), Some("BYPASS"));
    call.on_log(&mut w.env());
    assert_eq!(w.lookups("bypass"), 5);
    assert_eq!(w.stores("stored"), 0);
    let store = Store::new(&w.store, &w.config.cache);
    assert_eq!(store.totals(), None, "nothing written");
}

#[test]
fn a_disabled_cache_is_silent() {
    let mut w = World::new(r#"{"cache":{"enabled":false},"budget":{"enabled":false}}"#);
    let mut host = chat(CHAT);
    let (_, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Continue, "no body held for nothing");
    let mut w = World::new(r#"{"cache":{"enabled":false}}"#);
    let host = w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), None);
    assert_eq!(host.header("accept-encoding"), Some("gzip"));
    assert!(w.metrics.counters.keys().all(|k| !k.contains("cache")));
}

#[test]
fn no_cache_refetches_and_refreshes() {
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0}}"#);
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    w.now_ms += 5_000;
    let fresh = ANSWER.replace("Hello there", "Fresh words");
    let host = w.upstream_call(
        chat(CHAT).with_header("cache-control", "no-cache"),
        200,
        "application/json",
        &fresh,
    );
    assert_eq!(host.response("x-cache"), Some("MISS"));
    let mut host = chat(CHAT);
    w.hold_request(&mut host);
    let (_, headers, body) = reply(&host);
    assert_eq!(body, fresh.as_bytes());
    assert_eq!(headers["age"], "0");
    assert_eq!(w.gauge("llm_filter_cache_entries"), 1, "replaced in place");
}

#[test]
fn max_age_makes_a_call_cacheable_and_caps_the_age_served() {
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0,"stale_if_error_s":600}}"#);
    // No temperature: the provider's default, not cacheable by itself.
    let warm = CHAT.replace(r#""temperature":0,"#, "");
    let within = |s: &str| chat(&warm).with_header("cache-control", s);
    let host = w.upstream_call(chat(&warm), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("BYPASS"));
    let host = w.upstream_call(within("max-age=60"), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(w.stores("stored"), 1);

    w.now_ms += 30_000;
    let mut host = within("max-age=60");
    w.hold_request(&mut host);
    let (_, headers, body) = reply(&host);
    assert_eq!(
        (headers["x-cache"].as_str(), headers["age"].as_str()),
        ("HIT", "30")
    );
    assert_eq!(body, ANSWER.as_bytes());
    // A caller without the header gets no stored answer.
    let host = w.upstream_call(chat(&warm), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("BYPASS"));
    // Older than this caller accepts: a miss, nor served in place of a failure.
    let mut host = within("max-age=29");
    let (mut call, step) = w.hold_request(&mut host);
    assert_eq!(step, Step::Continue, "goes upstream");
    let mut host = host
        .with_response(503, "application/json", r#"{"error":{}}"#)
        .with_response_header("content-length", "10");
    w.respond_chunks(&mut call, &mut host, &[r#"{"error":{}}"#]);
    assert_eq!(host.response(":status"), Some("503"));
    assert_eq!(host.response("x-cache"), Some("MISS"));
    call.on_log(&mut w.env());
    let fresh = ANSWER.replace("Hello there", "Fresh words");
    let host = w.upstream_call(within("max-age=29"), 200, "application/json", &fresh);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    let mut host = within("max-age=60");
    w.hold_request(&mut host);
    assert_eq!(
        reply(&host).2,
        fresh.as_bytes(),
        "the fresh answer replaced it"
    );
}

#[test]
fn a_model_declared_deterministic_is_cacheable_at_any_temperature() {
    let mut w = World::new(r#"{"cache":{"deterministic_models":["gpt-4o"]}}"#);
    let warm = CHAT.replace(r#""temperature":0"#, r#""temperature":1.3"#);
    let host = w.upstream_call(chat(&warm), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    let mut host = chat(&warm);
    w.hold_request(&mut host);
    assert_eq!(reply(&host).1["x-cache"], "HIT");
    let other = warm.replace("gpt-4o", "gpt-4o-mini");
    let host = w.upstream_call(chat(&other), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("BYPASS"));
}

#[test]
fn failures_and_compressed_answers_are_never_stored() {
    let mut w = World::new("{}");
    w.upstream_call(
        chat(CHAT),
        503,
        "application/json",
        r#"{"error":{"message":"busy"}}"#,
    );
    w.upstream_call(
        chat(CHAT),
        200,
        "application/json",
        r#"{"error":{"message":"odd"}}"#,
    );
    let mut host = chat(CHAT);
    let (mut call, _) = w.hold_request(&mut host);
    let mut host = host
        .with_response(200, "application/json", ANSWER)
        .with_response_header("content-encoding", "gzip");
    w.respond_chunks(&mut call, &mut host, &[ANSWER]);
    call.on_log(&mut w.env());
    assert_eq!(
        (
            w.stores("status"),
            w.stores("incomplete"),
            w.stores("encoded")
        ),
        (1, 1, 1)
    );
    assert_eq!(w.lookups("miss"), 3);
    // The next twin still goes upstream.
    let host = w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"));
}

#[test]
fn answers_larger_than_an_entry_pass_but_are_not_stored() {
    let mut w = World::new(r#"{"cache":{"max_entry_bytes":1024}}"#);
    let long = ANSWER.replace("Hello there", &"word ".repeat(300));
    w.upstream_call(chat(CHAT), 200, "application/json", &long);
    let mut host = chat(&streamed(false));
    let (mut call, _) = w.hold_request(&mut host);
    let mut host = host.with_response(200, "text/event-stream", "");
    let piece = format!(
        "data: {}\n\n",
        json!({"choices":[{"index":0,"delta":{"content":"x".repeat(300)}}]})
    );
    let parts = vec![piece.as_str(); 10];
    w.respond_chunks(&mut call, &mut host, &parts);
    call.on_log(&mut w.env());
    assert_eq!(w.stores("too_large"), 2);
    assert_eq!(w.stores("stored"), 0);
}

#[test]
fn twins_in_flight_wait_for_the_first() {
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0}}"#);
    let mut leader_host = chat(CHAT);
    let (mut leader, step) = w.hold_request(&mut leader_host);
    assert_eq!(step, Step::Continue);

    let mut twin_host = chat(CHAT);
    let (mut twin, step) = w.hold_request(&mut twin_host);
    assert_eq!(step, Step::Pause);
    assert!(twin.is_parked());
    w.now_ms += 25;
    assert_eq!(twin.on_tick(&mut w.env(), &mut twin_host), Wake::Wait);

    let mut leader_host = leader_host.with_response(200, "application/json", ANSWER);
    w.now_ms += 1_000;
    w.respond_chunks(&mut leader, &mut leader_host, &[ANSWER]);
    w.now_ms += 25;
    assert_eq!(twin.on_tick(&mut w.env(), &mut twin_host), Wake::Answered);
    assert!(!twin.is_parked());
    let (status, headers, body) = reply(&twin_host);
    assert_eq!(status, 200);
    assert_eq!(headers["x-cache"], "COALESCED");
    assert_eq!(body, ANSWER.as_bytes());
    assert_eq!(twin_host.header("x-envoy-upstream-rq-timeout-ms"), None);
    leader.on_log(&mut w.env());
    twin.on_log(&mut w.env());
    assert_eq!((w.lookups("miss"), w.lookups("coalesced")), (1, 1));
    assert_eq!(
        w.counter("llm_filter_cache_coalesced_waits_totaloutcome=.=served;.;"),
        1
    );
}

#[test]
fn a_twin_whose_leader_fails_goes_upstream_and_leads() {
    let mut w = World::new(r#"{"routing":{"models":{"gpt-4o":[{"cluster":"azure"}]}}}"#);
    let mut leader_host = chat(CHAT);
    let (mut leader, _) = w.hold_request(&mut leader_host);
    let mut twin_host = chat(CHAT);
    let (mut twin, step) = w.hold_request(&mut twin_host);
    assert_eq!(step, Step::Pause);
    assert_eq!(
        twin_host.header("x-llm-cluster"),
        None,
        "not routed while waiting"
    );

    // The leader's failure lets the twin go at once, not at its deadline.
    let mut leader_host = leader_host.with_response(503, "application/json", "{}");
    w.respond_chunks(&mut leader, &mut leader_host, &["{}"]);
    w.now_ms += 25;
    assert_eq!(twin.on_tick(&mut w.env(), &mut twin_host), Wake::Resume);
    assert!(!twin.is_parked());
    // Routed and planned at resume time.
    assert_eq!(twin_host.header("x-llm-cluster"), Some("azure"));
    assert!(twin_host.header("x-envoy-upstream-rq-timeout-ms").is_some());
    assert_eq!(
        w.counter("llm_filter_cache_coalesced_waits_totaloutcome=.=upstream;.;"),
        1
    );

    // A third twin now waits for the second, which stores its answer.
    let mut third_host = chat(CHAT);
    let (mut third, step) = w.hold_request(&mut third_host);
    assert_eq!(step, Step::Pause);
    let mut twin_host = twin_host.with_response(200, "application/json", ANSWER);
    w.respond_chunks(&mut twin, &mut twin_host, &[ANSWER]);
    assert_eq!(twin_host.response("x-cache"), Some("MISS"));
    assert_eq!(third.on_tick(&mut w.env(), &mut third_host), Wake::Answered);
    assert_eq!(reply(&third_host).1["x-cache"], "COALESCED");
}

#[test]
fn no_twin_waits_past_its_deadline() {
    let mut w = World::new(r#"{"cache":{"coalesce_wait_ms":500}}"#);
    let mut leader_host = chat(CHAT);
    let (_leader, _) = w.hold_request(&mut leader_host);
    let mut twin_host = chat(CHAT);
    let (mut twin, _) = w.hold_request(&mut twin_host);
    w.now_ms += 499;
    assert_eq!(twin.on_tick(&mut w.env(), &mut twin_host), Wake::Wait);
    w.now_ms += 1;
    assert_eq!(twin.on_tick(&mut w.env(), &mut twin_host), Wake::Resume);
    // Nor past its own budget.
    let mut w = World::new("{}");
    let mut leader_host = chat(CHAT);
    let (_leader, _) = w.hold_request(&mut leader_host);
    let mut twin_host = chat(CHAT).with_header("x-request-timeout-ms", "300");
    let (mut twin, _) = w.hold_request(&mut twin_host);
    w.now_ms += 300;
    assert_ne!(twin.on_tick(&mut w.env(), &mut twin_host), Wake::Wait);
}

#[test]
fn a_leader_that_never_answers_releases_at_log() {
    let mut w = World::new("{}");
    let mut host = chat(CHAT);
    let (leader, _) = w.hold_request(&mut host);
    leader.on_log(&mut w.env());
    let mut twin_host = chat(CHAT);
    let (_, step) = w.hold_request(&mut twin_host);
    assert_eq!(step, Step::Continue, "leads, no marker left");
}

#[test]
fn coalescing_can_be_turned_off() {
    let mut w = World::new(r#"{"cache":{"coalesce":false}}"#);
    let mut a = chat(CHAT);
    let (_a, step_a) = w.hold_request(&mut a);
    let mut b = chat(CHAT);
    let (_b, step_b) = w.hold_request(&mut b);
    assert_eq!((step_a, step_b), (Step::Continue, Step::Continue));
}

#[test]
fn an_expired_entry_answers_an_upstream_failure() {
    let mut w = World::new(r#"{"cache":{"ttl_s":1,"ttl_jitter":0,"stale_if_error_s":60}}"#);
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    w.now_ms += 3_000;
    let error = r#"{"error":{"message":"overloaded"}}"#;
    let host = w.upstream_call(chat(CHAT), 503, "application/json", error);
    assert_eq!(host.response(":status"), Some("200"));
    assert_eq!(host.response("x-cache"), Some("STALE"));
    assert_eq!(host.response("age"), Some("3"));
    assert_eq!(host.response("content-length"), None);
    assert_eq!(host.response_body, ANSWER.as_bytes());
    assert_eq!(w.lookups("stale"), 1);

    // Envoy's own timeout, for a streamed call: the entry as a stream.
    let mut host = chat(&streamed(false));
    let (mut call, _) = w.hold_request(&mut host);
    let timeout = "upstream request timeout";
    let mut host = host
        .with_response(504, "text/plain", timeout)
        .with_response_header("content-length", &timeout.len().to_string());
    host.code_details = Some("upstream_response_timeout".into());
    w.respond_chunks(&mut call, &mut host, &["upstream ", "request timeout"]);
    assert_eq!(host.response("content-type"), Some("text/event-stream"));
    assert_eq!(events(&host.response_body).last().unwrap(), "[DONE]");
    call.on_log(&mut w.env());

    // Past the window, the failure goes through.
    w.now_ms += 60_000;
    let host = w.upstream_call(chat(CHAT), 503, "application/json", error);
    assert_eq!(host.response(":status"), Some("503"));
    assert_eq!(host.response("x-cache"), Some("MISS"));
}

#[test]
fn stale_needs_the_window_and_a_body_to_replace() {
    // Off by default.
    let mut w = World::new(r#"{"cache":{"ttl_s":1,"ttl_jitter":0}}"#);
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    w.now_ms += 2_000;
    let host = w.upstream_call(chat(CHAT), 503, "application/json", "{}");
    assert_eq!(host.response("x-cache"), Some("MISS"));
    // A failure without a body has no body callback to carry the entry.
    let mut w = World::new(r#"{"cache":{"ttl_s":1,"ttl_jitter":0,"stale_if_error_s":60}}"#);
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    w.now_ms += 2_000;
    let mut host = chat(CHAT);
    let (mut call, _) = w.hold_request(&mut host);
    let mut host = host.with_response(502, "text/plain", "");
    host.response_headers
        .push(("content-length".into(), "0".into()));
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response(":status"), Some("502"));
    assert_eq!(host.response("x-cache"), Some("MISS"));
}

#[test]
fn a_corrupt_entry_is_a_miss_and_is_replaced() {
    let mut w = World::new("{}");
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    let mut corrupted = 0;
    for i in 0..w.config.cache.max_entries {
        let v = w.store.get(&slot_key(i)).unwrap();
        if let Some(mut bytes) = v.value.filter(|b| !b.is_empty()) {
            let last = bytes.len() - 1;
            bytes.truncate(last);
            w.store.set(&slot_key(i), &bytes, None).unwrap();
            corrupted += 1;
        }
    }
    assert_eq!(corrupted, 1);
    let host = w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    let mut host = chat(CHAT);
    w.hold_request(&mut host);
    assert_eq!(reply(&host).1["x-cache"], "HIT");
}

#[test]
fn tenants_do_not_share_unless_global() {
    let mut w = World::new("{}");
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    let other = FakeHost::post(PATH)
        .with_header("authorization", "Bearer t2")
        .with_body(CHAT);
    let host = w.upstream_call(other, 200, "application/json", ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"));

    let mut w = World::new(r#"{"cache":{"scope":"global"}}"#);
    w.upstream_call(chat(CHAT), 200, "application/json", ANSWER);
    let mut other = FakeHost::post(PATH)
        .with_header("authorization", "Bearer t2")
        .with_body(CHAT);
    w.hold_request(&mut other);
    assert_eq!(reply(&other).1["x-cache"], "HIT");
}

#[test]
fn a_stream_cut_short_is_neither_stored_nor_a_success() {
    let mut w = World::new("{}");
    let mut host = chat(&streamed(true));
    let (mut call, _) = w.hold_request(&mut host);
    let mut host = host.with_response(200, "text/event-stream", "");
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    // The first events pass, then the stream ends without its end.
    let chunks = upstream_stream();
    for chunk in chunks.iter().take(2) {
        host.response_body = chunk.as_bytes().to_vec();
        call.on_response_body(&mut w.env(), &mut host, chunk.len(), false);
    }
    call.on_log(&mut w.env());
    assert_eq!(w.stores("incomplete"), 1);
    assert_eq!(w.stores("stored"), 0);
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=incomplete;.;api=.=chat;.;"
        ),
        1
    );
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=success;.;api=.=chat;.;"
        ),
        0
    );
    // The twin finds nothing partial: it goes upstream.
    let mut host = chat(&streamed(true));
    let (_, step) = w.hold_request(&mut host);
    assert_eq!(step, Step::Continue);
    assert!(host.local_reply.is_none());
}

const SHARD: &str = r#"{"cache":{"mode":"shard"}}"#;
const SHARD_HEADER: &str = "x-llm-cache-key";

impl World {
    fn shard_keys(&self, result: &str) -> u64 {
        self.counter(&format!(
            "llm_filter_cache_shard_keys_totalresult=.={result};.;"
        ))
    }
}

/// The key a filter in `shard` mode writes for `host`'s request.
fn shard_key_of(host: FakeHost) -> Option<String> {
    let mut w = World::new(SHARD);
    let mut host = host;
    let (call, step) = w.hold_request(&mut host);
    assert_eq!(step, Step::Continue);
    call.on_log(&mut w.env());
    host.header(SHARD_HEADER).map(str::to_string)
}

#[test]
fn a_shard_writes_the_key_and_keeps_no_cache() {
    let mut w = World::new(SHARD);
    // The client's own value never goes on; the filter writes the key.
    for _ in 0..2 {
        let host = w.upstream_call(
            chat(CHAT).with_header(SHARD_HEADER, "forged"),
            200,
            "application/json",
            ANSWER,
        );
        let key = host.header(SHARD_HEADER).unwrap();
        assert_eq!(key.len(), 64);
        assert!(key
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        // The next tier's `x-cache` reaches the client as it is.
        assert_eq!(host.response("x-cache"), None);
        assert_eq!(host.header("accept-encoding"), Some("gzip"));
        assert_eq!(host.response_body, ANSWER.as_bytes());
    }
    // Nothing looked up, stored or coalesced here: both went upstream.
    assert_eq!(w.shard_keys("written"), 2);
    assert_eq!((w.lookups("miss"), w.lookups("hit")), (0, 0));
    assert_eq!(w.stores("stored"), 0);
    assert_eq!(w.gauge("llm_filter_cache_entries"), -1);
    let mut first = chat(CHAT);
    let mut twin = chat(CHAT);
    let (a, step_a) = w.hold_request(&mut first);
    let (b, step_b) = w.hold_request(&mut twin);
    assert_eq!((step_a, step_b), (Step::Continue, Step::Continue));
    a.on_log(&mut w.env());
    b.on_log(&mut w.env());

    // The same request spelled otherwise is the same key; another tenant,
    // another prompt, another key; not cacheable, no header at all.
    let k = shard_key_of(chat(CHAT)).unwrap();
    let respelled = CHAT.replace(r#""model":"gpt-4o","#, r#""model" : "gpt-4o" ,"#);
    assert_eq!(shard_key_of(chat(&respelled)).as_deref(), Some(k.as_str()));
    let other_tenant = FakeHost::post(PATH)
        .with_header("authorization", "Bearer t2")
        .with_body(CHAT);
    assert_ne!(shard_key_of(other_tenant).unwrap(), k);
    assert_ne!(shard_key_of(chat(&CHAT.replace("hi", "ho"))).unwrap(), k);
    let warm = CHAT.replace(r#""temperature":0"#, r#""temperature":1"#);
    assert_eq!(
        shard_key_of(chat(&warm).with_header(SHARD_HEADER, &k)),
        None
    );
}

#[test]
fn a_local_cache_checks_the_shard_key_and_never_trusts_it() {
    let key_a = shard_key_of(chat(CHAT)).unwrap();
    let other = CHAT.replace("hi", "something else");
    let key_b = shard_key_of(chat(&other)).unwrap();
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0}}"#);
    // The sidecar's key matches the gateway's own and goes no further.
    let host = w.upstream_call(
        chat(CHAT).with_header(SHARD_HEADER, &key_a),
        200,
        "application/json",
        ANSWER,
    );
    assert_eq!(host.header(SHARD_HEADER), None);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(w.shard_keys("matched"), 1);

    // Another request under A's key reads nothing of A's entry…
    let other_answer = ANSWER.replace("Hello there", "Something else");
    let host = w.upstream_call(
        chat(&other).with_header(SHARD_HEADER, &key_a),
        200,
        "application/json",
        &other_answer,
    );
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(host.header(SHARD_HEADER), None);
    assert_eq!(w.shard_keys("mismatched"), 1);
    // …nor overwrote it: A still gets its own answer, B its own.
    for (body, forged, answer) in [
        (CHAT, key_b.as_str(), ANSWER),
        (other.as_str(), "zz", other_answer.as_str()),
    ] {
        let mut host = chat(body).with_header(SHARD_HEADER, forged);
        let (call, _) = w.hold_request(&mut host);
        let (_, headers, got) = reply(&host);
        assert_eq!(headers["x-cache"], "HIT");
        assert_eq!(got, answer.as_bytes());
        call.on_log(&mut w.env());
    }
    assert_eq!(w.shard_keys("mismatched"), 3);
    // A not-cacheable call with a key is a mismatch, and passes without it;
    // a call without one is not counted.
    let warm = CHAT.replace(r#""temperature":0"#, r#""temperature":1"#);
    let host = w.upstream_call(
        chat(&warm).with_header(SHARD_HEADER, &key_a),
        200,
        "application/json",
        ANSWER,
    );
    assert_eq!(host.header(SHARD_HEADER), None);
    assert_eq!(w.shard_keys("mismatched"), 4);
    w.upstream_call(chat(&warm), 200, "application/json", ANSWER);
    assert_eq!(w.shard_keys("mismatched") + w.shard_keys("matched"), 5);

    // Whatever the mode or the call, the header never reaches the upstream.
    for config in [r#"{"cache":{"enabled":false}}"#, "{}"] {
        let mut w = World::new(config);
        let mut host = FakeHost::new()
            .with_header(":method", "GET")
            .with_header(":path", "/healthz")
            .with_header(SHARD_HEADER, &key_a);
        assert!(Call::start(&mut w.env(), &mut host, true).is_none());
        assert_eq!(host.header(SHARD_HEADER), None);
        let host = w.upstream_call(
            chat(CHAT).with_header(SHARD_HEADER, &key_a),
            200,
            "application/json",
            ANSWER,
        );
        assert_eq!(host.header(SHARD_HEADER), None, "{config}");
    }
}
