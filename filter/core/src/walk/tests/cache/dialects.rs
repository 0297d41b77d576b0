//! Scenario tests of the cache for the OpenAI Responses and Anthropic
//! Messages dialects: answers kept as the upstream sent them and replayed
//! byte for byte, one entry per delivery, the dialect's own credential as
//! the tenant, the opt-ins of calls without a temperature, and calls that
//! continue state left out.

use std::collections::BTreeMap;

use crate::host::SharedStore;
use crate::sse::tests::{MESSAGES, RESPONSES as RESPONSE_STREAM};
use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

use super::reply;

const MESSAGES_PATH: &str = "/v1/messages";
const RESPONSES_PATH: &str = "/v1/responses";
const API_KEY: &str = "sk-ant-api03-tenant-a";

/// A Messages call with a temperature: cacheable by the rule chat follows.
const MESSAGE: &str = r#"{"model":"claude-haiku-4-5","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;

/// The JSON answer, with the newline the upstream ended it with.
const MESSAGE_ANSWER: &str = "{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-haiku-4-5\",\"content\":[{\"type\":\"text\",\"text\":\"Hello!\"}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":3}}\n";

/// The Messages stream of the grammar's tests (a `ping` among its events)
/// with an event type no grammar knows.
fn message_stream() -> String {
    let unknown = "event: content_block_future\n\
data: {\"type\":\"content_block_future\",\"index\":0,\"note\":\"kept\"}\n\n";
    let at = "event: content_block_stop";
    MESSAGES.replace(at, &format!("{unknown}{at}"))
}

const RESPONSE: &str = r#"{"model":"gpt-5","input":"hi","temperature":0}"#;

const RESPONSE_ANSWER: &str = r#"{"id":"resp_1","object":"response","status":"completed","model":"gpt-5","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello!"}]}],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}"#;

fn messages(body: &str) -> FakeHost {
    FakeHost::post(MESSAGES_PATH)
        .with_header("x-api-key", API_KEY)
        .with_header("accept-encoding", "gzip")
        .with_body(body)
}

fn responses(body: &str) -> FakeHost {
    FakeHost::post(RESPONSES_PATH)
        .with_header("authorization", "Bearer t1")
        .with_body(body)
}

fn streamed(body: &str) -> String {
    body.replacen('{', r#"{"stream":true,"#, 1)
}

/// `text` cut into pieces at uneven places, as a network delivers it.
fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut n = 7;
    while !rest.is_empty() {
        let (piece, tail) = rest.split_at(n.min(rest.len()));
        out.push(piece);
        rest = tail;
        n = n * 3 % 113 + 1;
    }
    out
}

impl World {
    /// A whole call that goes upstream and gets a stream of `chunks`.
    fn stream_call(&mut self, mut host: FakeHost, chunks: &[&str]) -> FakeHost {
        let (mut call, step) = self.hold_request(&mut host);
        assert_eq!(step, Step::Continue, "goes upstream");
        let mut host = host.with_response(200, "text/event-stream", "");
        let mut client = Vec::new();
        assert_eq!(
            call.on_response_headers(&mut self.env(), &mut host, false),
            Step::Continue
        );
        for (i, chunk) in chunks.iter().enumerate() {
            host.response_body = chunk.as_bytes().to_vec();
            let last = i + 1 == chunks.len();
            call.on_response_body(&mut self.env(), &mut host, chunk.len(), last);
            client.extend_from_slice(&host.response_body);
        }
        call.on_log(&mut self.env());
        host.response_body = client;
        host
    }

    /// The local reply a call got from the cache: status, headers, body.
    fn answered_by_cache(
        &mut self,
        mut host: FakeHost,
    ) -> (u32, BTreeMap<String, String>, Vec<u8>) {
        let (_, step) = self.hold_request(&mut host);
        assert_eq!(step, Step::Pause, "answered from the cache");
        reply(&host)
    }

    /// The call is not answered from the cache: it goes upstream.
    fn goes_upstream(&mut self, mut host: FakeHost) {
        let (call, step) = self.hold_request(&mut host);
        assert_eq!(step, Step::Continue);
        assert!(host.local_reply.is_none());
        call.on_log(&mut self.env());
    }
}

#[test]
fn a_messages_answer_is_kept_as_sent_and_replayed_byte_for_byte() {
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0}}"#);
    let host = w.upstream_call(messages(MESSAGE), 200, "application/json", MESSAGE_ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(host.header("accept-encoding"), None);
    assert_eq!(w.stores("stored"), 1);
    w.now_ms += 2_500;
    let (status, headers, body) = w.answered_by_cache(messages(MESSAGE));
    assert_eq!(status, 200);
    assert_eq!(
        body,
        MESSAGE_ANSWER.as_bytes(),
        "every byte, the newline too"
    );
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(
        (headers["x-cache"].as_str(), headers["age"].as_str()),
        ("HIT", "2")
    );
    assert!(headers.contains_key("x-trace-id"));
}

#[test]
fn a_messages_stream_is_kept_as_sent_and_replayed_byte_for_byte() {
    let stream = message_stream();
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0}}"#);
    let host = w.stream_call(messages(&streamed(MESSAGE)), &pieces(&stream));
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(host.response_body, stream.as_bytes(), "passed untouched");
    assert_eq!(w.stores("stored"), 1);
    w.now_ms += 1_200;
    let (status, headers, body) = w.answered_by_cache(messages(&streamed(MESSAGE)));
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8(body).unwrap(),
        stream,
        "every event, `ping` and the unknown one included"
    );
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(
        (headers["x-cache"].as_str(), headers["age"].as_str()),
        ("HIT", "1")
    );
}

#[test]
fn a_responses_stream_and_answer_are_kept_as_sent() {
    let mut w = World::new("{}");
    w.stream_call(responses(&streamed(RESPONSE)), &pieces(RESPONSE_STREAM));
    w.upstream_call(
        responses(RESPONSE),
        200,
        "application/json",
        RESPONSE_ANSWER,
    );
    assert_eq!(w.stores("stored"), 2);
    let (_, headers, body) = w.answered_by_cache(responses(&streamed(RESPONSE)));
    assert_eq!(body, RESPONSE_STREAM.as_bytes());
    assert_eq!(headers["content-type"], "text/event-stream");
    let (_, headers, body) = w.answered_by_cache(responses(RESPONSE));
    assert_eq!(body, RESPONSE_ANSWER.as_bytes());
    assert_eq!(headers["content-type"], "application/json");
}

#[test]
fn an_entry_answers_only_calls_of_its_own_delivery() {
    let stream = message_stream();
    let mut w = World::new("{}");
    w.upstream_call(messages(MESSAGE), 200, "application/json", MESSAGE_ANSWER);
    // The streamed twin is another key: it goes upstream and fills its own.
    w.goes_upstream(messages(&streamed(MESSAGE)));
    w.stream_call(messages(&streamed(MESSAGE)), &pieces(&stream));
    assert_eq!(w.stores("stored"), 2);
    let (_, _, json) = w.answered_by_cache(messages(MESSAGE));
    let (_, _, replayed) = w.answered_by_cache(messages(&streamed(MESSAGE)));
    assert_eq!(
        (json.as_slice(), replayed.as_slice()),
        (MESSAGE_ANSWER.as_bytes(), stream.as_bytes())
    );
    // An answer in another delivery than the call asked for is not kept.
    let other = MESSAGE.replace("hi", "hello");
    w.upstream_call(messages(&other), 200, "text/event-stream", &stream);
    assert_eq!(w.stores("delivery"), 1);
    w.goes_upstream(messages(&other));
}

#[test]
fn two_api_keys_never_share_an_entry_and_neither_is_kept() {
    let mut w = World::new(r#"{"cache":{"tenant_headers":["x-tenant"]}}"#);
    let other_key = |body: &str| {
        FakeHost::post(MESSAGES_PATH)
            .with_header("x-api-key", "sk-ant-api03-tenant-b")
            .with_body(body)
    };
    w.upstream_call(messages(MESSAGE), 200, "application/json", MESSAGE_ANSWER);
    let host = w.upstream_call(other_key(MESSAGE), 200, "application/json", MESSAGE_ANSWER);
    assert_eq!(host.response("x-cache"), Some("MISS"), "another tenant");
    let without = FakeHost::post(MESSAGES_PATH).with_body(MESSAGE);
    let host = w.upstream_call(without, 200, "application/json", MESSAGE_ANSWER);
    assert_eq!(
        host.response("x-cache"),
        Some("MISS"),
        "no key, a tenant of its own"
    );
    assert_eq!(w.answered_by_cache(messages(MESSAGE)).1["x-cache"], "HIT");
    assert_eq!(w.answered_by_cache(other_key(MESSAGE)).1["x-cache"], "HIT");
    // Neither credential is in shared data, in a key or a value.
    for key in w.store.keys() {
        let value = w.store.get(&key).unwrap().value.unwrap_or_default();
        for secret in [API_KEY.as_bytes(), b"sk-ant-api03-tenant-b"] {
            assert!(!key.as_bytes().windows(secret.len()).any(|x| x == secret));
            assert!(!value.windows(secret.len()).any(|x| x == secret), "{key}");
        }
    }
}

#[test]
fn a_call_without_temperature_is_cacheable_only_when_opted_in() {
    let mut w = World::new(r#"{"cache":{"ttl_jitter":0,"deterministic_models":["gpt-5-mini"]}}"#);
    // Anthropic's SDK sends no temperature: not cacheable by itself.
    let cold = MESSAGE.replace(r#""temperature":0,"#, "");
    let host = w.upstream_call(messages(&cold), 200, "application/json", MESSAGE_ANSWER);
    assert_eq!(host.response("x-cache"), Some("BYPASS"));
    let warm = MESSAGE.replace(r#""temperature":0"#, r#""temperature":0.7"#);
    let host = w.upstream_call(messages(&warm), 200, "application/json", MESSAGE_ANSWER);
    assert_eq!(host.response("x-cache"), Some("BYPASS"));
    // The caller's max-age opts it in, and caps the age it is served.
    let within = |s: &str| messages(&cold).with_header("cache-control", s);
    let host = w.upstream_call(
        within("max-age=60"),
        200,
        "application/json",
        MESSAGE_ANSWER,
    );
    assert_eq!(host.response("x-cache"), Some("MISS"));
    w.now_ms += 30_000;
    let (_, headers, body) = w.answered_by_cache(within("max-age=60"));
    assert_eq!(
        (headers["x-cache"].as_str(), headers["age"].as_str()),
        ("HIT", "30")
    );
    assert_eq!(body, MESSAGE_ANSWER.as_bytes());
    w.goes_upstream(within("max-age=10"));
    w.goes_upstream(messages(&cold));
    // A model the operator declared deterministic is cacheable as it is.
    let reasoning = r#"{"model":"gpt-5-mini","input":"hi","reasoning":{"effort":"low"}}"#;
    let host = w.upstream_call(
        responses(reasoning),
        200,
        "application/json",
        RESPONSE_ANSWER,
    );
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(
        w.answered_by_cache(responses(reasoning)).1["x-cache"],
        "HIT"
    );
}

#[test]
fn a_responses_call_that_continues_state_is_never_cached() {
    let mut w = World::new("{}");
    for field in [
        r#""previous_response_id":"resp_0""#,
        r#""conversation":"conv_1""#,
        r#""background":true"#,
    ] {
        let body = RESPONSE.replacen('{', &format!("{{{field},"), 1);
        for _ in 0..2 {
            let host = w.upstream_call(responses(&body), 200, "application/json", RESPONSE_ANSWER);
            assert_eq!(host.response("x-cache"), Some("BYPASS"), "{field}");
        }
    }
    assert_eq!(w.stores("stored"), 0);
    assert_eq!(w.lookups("bypass"), 6);
    // `store` itself changes nothing: either way the call is cacheable.
    for store in ["true", "false"] {
        let body = RESPONSE.replacen('{', &format!("{{\"store\":{store},"), 1);
        let host = w.upstream_call(responses(&body), 200, "application/json", RESPONSE_ANSWER);
        assert_eq!(host.response("x-cache"), Some("MISS"), "store {store}");
        assert_eq!(w.answered_by_cache(responses(&body)).1["x-cache"], "HIT");
    }
}

#[test]
fn only_complete_answers_are_kept() {
    let stream = message_stream();
    let mut w = World::new("{}");
    let stop = "event: message_stop\n";
    let (head, _) = stream.split_at(stream.find(stop).unwrap());
    let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let errored = format!("{head}{error}");
    let failed = RESPONSE_STREAM
        .replace("response.completed", "response.failed")
        .replace("\"completed\"", "\"failed\"");
    for (host, stream) in [
        (messages(&streamed(MESSAGE)), head),
        (messages(&streamed(MESSAGE)), errored.as_str()),
        (responses(&streamed(RESPONSE)), failed.as_str()),
    ] {
        let twin = host.clone();
        let seen = w.stream_call(host, &pieces(stream));
        assert_eq!(
            seen.response_body,
            stream.as_bytes(),
            "the client got it all"
        );
        w.goes_upstream(twin);
    }
    for (host, answer) in [
        (
            responses(RESPONSE),
            RESPONSE_ANSWER.replace("\"completed\"", "\"incomplete\""),
        ),
        (
            messages(MESSAGE),
            MESSAGE_ANSWER.replace("\"end_turn\"", "null"),
        ),
    ] {
        let twin = host.clone();
        w.upstream_call(host, 200, "application/json", &answer);
        w.goes_upstream(twin);
    }
    assert_eq!((w.stores("incomplete"), w.stores("stored")), (5, 0));
    let host = w.upstream_call(
        messages(MESSAGE),
        529,
        "application/json",
        r#"{"type":"error"}"#,
    );
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(w.stores("status"), 1);
}

#[test]
fn a_stream_past_the_entry_bound_passes_but_is_not_kept() {
    let stream = message_stream();
    let mut w = World::new(r#"{"cache":{"max_entry_bytes":1024}}"#);
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"more \"}}\n\n";
    let at = stream.find("event: content_block_stop").unwrap();
    let long = format!("{}{}{}", &stream[..at], delta.repeat(20), &stream[at..]);
    assert!(long.len() > 2048);
    let host = w.stream_call(messages(&streamed(MESSAGE)), &pieces(&long));
    assert_eq!(host.response_body, long.as_bytes());
    assert_eq!((w.stores("too_large"), w.stores("stored")), (1, 0));
    w.goes_upstream(messages(&streamed(MESSAGE)));
}

#[test]
fn twins_of_a_stream_in_flight_get_its_bytes() {
    let stream = message_stream();
    let mut w = World::new("{}");
    let mut leader_host = messages(&streamed(MESSAGE));
    let (mut leader, step) = w.hold_request(&mut leader_host);
    assert_eq!(step, Step::Continue);
    let mut twin_host = messages(&streamed(MESSAGE));
    let (mut twin, step) = w.hold_request(&mut twin_host);
    assert_eq!(step, Step::Pause);
    let mut leader_host = leader_host.with_response(200, "text/event-stream", "");
    w.respond_chunks(&mut leader, &mut leader_host, &pieces(&stream));
    w.now_ms += 25;
    assert_eq!(twin.on_tick(&mut w.env(), &mut twin_host), Wake::Answered);
    let (_, headers, body) = reply(&twin_host);
    assert_eq!(headers["x-cache"], "COALESCED");
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(body, stream.as_bytes());
    leader.on_log(&mut w.env());
    twin.on_log(&mut w.env());
}
