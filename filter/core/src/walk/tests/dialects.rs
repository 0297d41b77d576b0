//! Scenario tests of the OpenAI Responses and Anthropic Messages dialects
//! through the whole walk: what the upstream gets, what the client gets,
//! what is learnt.

use crate::walk::fake::{fire, with_alerts, FakeHost, World};
use crate::walk::*;

const TWO_BACKENDS: &str = r#"{
  "routing": {
    "models": {"gpt-4o": [
      {"cluster": "a", "model": "gpt-4o-a"},
      {"cluster": "b", "model": "gpt-4o-b"}
    ]},
    "eject_after_failures": 100
  }
}"#;

const RESPONSES: &str = r#"{"model":"gpt-4o","input":"hi"}"#;

fn responses(body: &str) -> FakeHost {
    FakeHost::post("/v1/responses")
        .with_header("authorization", "Bearer k")
        .with_body(body)
}

/// The answer a backend gives a Responses call: the response `id`.
fn answered(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","object":"response","status":"completed","output":[],"usage":{{"input_tokens":3,"input_tokens_details":{{"cached_tokens":2}},"output_tokens":2,"total_tokens":5}}}}"#
    )
}

/// An alert of severity `page`, firing.
const PAGE: &str = r#"{"version":"4","alerts":[{"status":"firing","labels":{"severity":"page"},"fingerprint":"f"}]}"#;

/// A world whose every model is at degrade level 2, by an alert.
fn degraded_to_level_two() -> World {
    let w = World::new(&with_alerts(
        r#"{"degrade":{"alerts":[{"severity":"page","level":2}]}}"#,
    ));
    fire(&w, PAGE);
    w
}

#[test]
fn a_shed_messages_call_gets_anthropics_overloaded_error() {
    let mut w = degraded_to_level_two();
    let mut host = FakeHost::post("/v1/messages")
        .with_header("x-api-key", "sk-ant")
        .with_header("x-request-priority", "P2")
        .with_body(
            r#"{"model":"claude","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#,
        );
    w.request(&mut host).unwrap();
    let (status, headers, body) = host.local_reply.clone().expect("a local reply");
    assert_eq!(status, 529);
    assert_eq!(headers["retry-after"], "5");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(v["error"]["code"], "llm_filter_degraded_shed");
}

#[test]
fn a_messages_stream_is_counted_from_its_own_events_and_passes_whole() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/messages").with_body(
        r#"{"model":"claude","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let (mut call, _) = w.request(&mut host).unwrap();
    // Nothing asked of the provider on the client's behalf.
    assert_eq!(host.body_writes, 0);
    let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"yo\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let mut host = host.with_response(200, "text/event-stream", stream);
    w.respond(&mut call, &mut host);
    assert_eq!(host.response_body, stream.as_bytes());
    call.on_log(&mut w.env());
    for (counter, n) in [
        (
            "gen_ai_client_token_usage_totalmodel=.=claude;.;token_type=.=input;.;api=.=messages;.;",
            5,
        ),
        (
            "gen_ai_client_token_usage_totalmodel=.=claude;.;token_type=.=output;.;api=.=messages;.;",
            4,
        ),
        (
            "llm_filter_requests_totalpriority=.=P1;.;model=.=claude;.;outcome=.=success;.;api=.=messages;.;",
            1,
        ),
    ] {
        assert_eq!(w.counter(counter), n, "{counter}");
    }
}

#[test]
fn a_degraded_gemini_call_goes_on_the_fallback_models_path() {
    let mut w = World::new(&with_alerts(
        r#"{"degrade":{"alerts":[{"severity":"page","level":2}],
            "fallback_model":{"gemini-pro":"gemini-lite"}}}"#,
    ));
    fire(&w, PAGE);
    let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    let mut host =
        FakeHost::post("/v1beta/models/gemini-pro:generateContent?key=k").with_body(body);
    w.request(&mut host).unwrap();
    assert_eq!(
        host.header(":path"),
        Some("/v1beta/models/gemini-lite:generateContent?key=k")
    );
    assert!(host.route_cache_cleared > 0, "Envoy picks the route again");
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert!(sent.get("model").is_none(), "{sent}");
    assert_eq!(sent["contents"][0]["parts"][0]["text"], "hi");
    assert_eq!(
        w.counter("llm_filter_degraded_totalaction=.=fallback_model;.;priority=.=P1;.;"),
        1
    );
}

#[test]
fn a_gemini_call_is_shaped_in_its_config_and_contents() {
    let mut w =
        World::new(r#"{"shaping":{"max_tokens_cap":{"P1":50},"max_history_turns":{"P1":2}}}"#);
    let body = r#"{"contents":[
        {"role":"user","parts":[{"text":"one"}]},{"role":"model","parts":[{"text":"1"}]},
        {"role":"user","parts":[{"text":"two"}]},{"role":"model","parts":[{"text":"2"}]},
        {"parts":[{"text":"three"}]}],
        "generationConfig":{"maxOutputTokens":500,"temperature":0.5}}"#;
    let mut host = FakeHost::post("/v1beta/models/g:generateContent").with_body(body);
    let (mut call, _) = w.request(&mut host).unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["generationConfig"]["maxOutputTokens"], 50);
    assert_eq!(sent["generationConfig"]["temperature"], 0.5);
    let texts: Vec<&str> = sent["contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["parts"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["two", "2", "three"], "the last two turns");
    let mut host = host.with_response(200, "application/json", "{}");
    w.respond(&mut call, &mut host);
    assert_eq!(host.response("x-llm-shaped"), Some("max_tokens,history"));
}

#[test]
fn the_output_cap_is_set_in_each_dialects_own_field() {
    let mut w = World::new(r#"{"shaping":{"max_tokens_cap":{"P1":50}}}"#);
    let mut host = responses(r#"{"model":"m","input":"hi","max_output_tokens":500}"#);
    w.request(&mut host).unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["max_output_tokens"], 50);
    assert!(sent.get("max_tokens").is_none());
    let mut host = FakeHost::post("/v1/messages").with_body(
        r#"{"model":"claude","max_tokens":4096,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    w.request(&mut host).unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["max_tokens"], 50);
}

#[test]
fn degrade_skips_and_counts_what_a_dialect_has_no_field_for() {
    let mut w = degraded_to_level_two();
    let mut host = FakeHost::post("/v1/embeddings").with_body(r#"{"model":"e","input":"hi"}"#);
    w.request(&mut host).unwrap();
    assert_eq!(
        host.body_writes, 0,
        "an embeddings body gains no sampling field"
    );
    for action in ["max_tokens", "temperature"] {
        let name =
            format!("llm_filter_degrade_skipped_totalaction=.={action};.;api=.=embeddings;.;");
        assert_eq!(w.counter(&name), 1, "{name}");
    }
    // Gemini nests both in its `generationConfig`.
    let gemini = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"temperature":1}}"#;
    let mut host = FakeHost::post("/v1beta/models/g:generateContent").with_body(gemini);
    w.request(&mut host).unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    let config = &sent["generationConfig"];
    assert!(config["maxOutputTokens"].as_u64().is_some(), "{sent}");
    assert!(config["temperature"].as_f64().unwrap() < 1.0, "{sent}");
    assert!(sent.get("temperature").is_none() && sent.get("max_tokens").is_none());
    for action in ["max_tokens", "temperature"] {
        let name = format!("llm_filter_degrade_skipped_totalaction=.={action};.;api=.=gemini;.;");
        assert_eq!(w.counter(&name), 0, "{name}");
    }
    // A Messages call under the same level gets both.
    let mut host = FakeHost::post("/v1/messages")
        .with_body(r#"{"model":"claude","max_tokens":4096,"temperature":1,"messages":[{"role":"user","content":"hi"}]}"#);
    w.request(&mut host).unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert!(sent["max_tokens"].as_u64().unwrap() < 4096, "{sent}");
    assert!(sent["temperature"].as_f64().unwrap() < 1.0, "{sent}");
}

/// The Responses dialect's memory of which backend produced a response
/// (the `routing` feature).
#[cfg(feature = "routing")]
mod routed {
    use super::*;

    #[test]
    fn a_responses_call_continuing_a_response_goes_to_the_backend_that_produced_it() {
        let mut w = World::new(TWO_BACKENDS);
        // Calls until one is routed to b, which answers with its response id.
        let (mut call, host) = (0..100)
            .find_map(|n| {
                let mut host = responses(RESPONSES).with_header("x-session-id", &format!("s{n}"));
                let (call, _) = w.request(&mut host).unwrap();
                if host.header("x-llm-cluster") == Some("b") {
                    return Some((call, host));
                }
                call.on_log(&mut w.env());
                None
            })
            .expect("a call routed to b");
        // The backend's own name of the model.
        assert!(String::from_utf8_lossy(&host.request_body).contains("gpt-4o-b"));
        let mut host = host.with_response(200, "application/json", &answered("resp_b1"));
        w.respond(&mut call, &mut host);
        call.on_log(&mut w.env());
        for (counter, n) in [
            (
                "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=input;.;api=.=responses;.;",
                3,
            ),
            (
                "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=output;.;api=.=responses;.;",
                2,
            ),
            (
                "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=cached_input;.;api=.=responses;.;",
                2,
            ),
        ] {
            assert_eq!(w.counter(counter), n, "{counter}");
        }

        let next = r#"{"model":"gpt-4o","input":"and then?","previous_response_id":"resp_b1"}"#;
        for _ in 0..20 {
            let mut host = responses(next);
            let (mut call, _) = w.request(&mut host).unwrap();
            assert_eq!(host.header("x-llm-cluster"), Some("b"));
            // b failing it is b's answer: no other backend holds the response.
            let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
            assert_eq!(
                call.on_response_headers(&mut w.env(), &mut host, false),
                Step::Continue
            );
            assert!(host.callouts.is_empty());
            call.on_log(&mut w.env());
        }
        // An id nobody remembers is routed as any call: both backends get some
        // of the conversations.
        let mut seen = std::collections::BTreeSet::new();
        for n in 0..40 {
            let mut host = responses(&format!(
                r#"{{"model":"gpt-4o","input":"x{n}","previous_response_id":"resp_unknown"}}"#
            ));
            let (call, _) = w.request(&mut host).unwrap();
            seen.insert(host.header("x-llm-cluster").map(str::to_string));
            call.on_log(&mut w.env());
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
    }

    #[test]
    fn a_response_the_provider_does_not_store_is_not_remembered() {
        let mut w = World::new(TWO_BACKENDS);
        let mut host = responses(r#"{"model":"gpt-4o","input":"hi","store":false}"#);
        let (mut call, _) = w.request(&mut host).unwrap();
        let mut host = host.with_response(200, "application/json", &answered("resp_x"));
        w.respond(&mut call, &mut host);
        call.on_log(&mut w.env());
        let mut seen = std::collections::BTreeSet::new();
        for n in 0..40 {
            let mut host = responses(&format!(
                r#"{{"model":"gpt-4o","input":"x{n}","previous_response_id":"resp_x"}}"#
            ));
            let (call, _) = w.request(&mut host).unwrap();
            seen.insert(host.header("x-llm-cluster").map(str::to_string));
            call.on_log(&mut w.env());
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
    }
}

/// The cost of a call, priced by the catalog (the `limits` feature).
#[cfg(feature = "limits")]
mod priced {
    use super::*;

    #[test]
    fn a_messages_streams_cache_reads_and_writes_are_counted_with_their_saving() {
        // Priced by the catalog alone: no rule, no model the configuration names.
        let mut w = World::new(
            r#"{"limits":{"catalog_as_of":"2026-12-03","catalog":{"claude-sonnet-4-5*":
                {"input":3,"cached_input":0.3,"cache_write":3.75,"cache_write_1h":6,"output":15}}}}"#,
        );
        let mut host = FakeHost::post("/v1/messages").with_body(
            r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        );
        let (mut call, _) = w.request(&mut host).unwrap();
        // Anthropic's usage: reads and writes in message_start, split by how
        // long the writes are kept; the output in message_delta.
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":50,\"cache_read_input_tokens\":10000,\"cache_creation_input_tokens\":3000,\"cache_creation\":{\"ephemeral_5m_input_tokens\":2000,\"ephemeral_1h_input_tokens\":1000},\"output_tokens\":1}}}\n\n\
    event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n\
    event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let mut host = host.with_response(200, "text/event-stream", stream);
        w.respond(&mut call, &mut host);
        call.on_log(&mut w.env());
        let tokens = |kind: &str| {
            w.counter(&format!(
                "gen_ai_client_token_usage_totalmodel=.=claude-sonnet-4-5;.;token_type=.={kind};.;api=.=messages;.;"
            ))
        };
        assert_eq!(
            (
                tokens("input"),
                tokens("cached_input"),
                tokens("cache_creation_input")
            ),
            (13_050, 10_000, 3_000)
        );
        // 10,000 × $2.70 saved; 2,000 × $0.75 + 1,000 × $3 of premium, per
        // million, in millionths.
        assert_eq!(
            w.counter("llm_filter_prompt_cache_saved_micros_totalmodel=.=claude-sonnet-4-5;.;"),
            27_000
        );
        assert_eq!(
            w.counter(
                "llm_filter_prompt_cache_write_premium_micros_totalmodel=.=claude-sonnet-4-5;.;"
            ),
            4_500
        );
        // An unpriced model's cache is counted in tokens, not in money.
        let mut host = FakeHost::post("/v1/messages").with_body(
            r#"{"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#,
        );
        let (mut call, _) = w.request(&mut host).unwrap();
        let answer = r#"{"type":"message","content":[],"stop_reason":"end_turn","usage":{"input_tokens":1,"cache_read_input_tokens":9,"output_tokens":1}}"#;
        let mut host = host.with_response(200, "application/json", answer);
        w.respond(&mut call, &mut host);
        call.on_log(&mut w.env());
        assert_eq!(
            w.counter("gen_ai_client_token_usage_totalmodel=.=claude-x;.;token_type=.=cached_input;.;api=.=messages;.;"),
            9
        );
        assert_eq!(
            w.counter("llm_filter_prompt_cache_saved_micros_totalmodel=.=claude-x;.;"),
            0
        );
    }
}
