//! Prompt-cache markers through the walk: a Messages call of a model that
//! opts in leaves with them (and its `content-length`), counted; a call of
//! another model, or one the client marked, leaves as it came; and a tenant's
//! `prompt_cache_key` is its own.

use super::*;
use crate::json::Json;

const CONFIG: &str = r#"{
  "routing": {"prompt_cache": {"claude-*": {"min_prefix_tokens": 100}}},
  "access_log": {"enabled": true}
}"#;

fn conversation(model: &str, marked: bool) -> String {
    let mark = if marked {
        r#","cache_control":{"type":"ephemeral"}"#
    } else {
        ""
    };
    format!(
        r#"{{"model":"{model}","max_tokens":64,"system":"{}",
        "messages":[{{"role":"user","content":"a"}},{{"role":"assistant","content":"b"}},
        {{"role":"user","content":[{{"type":"text","text":"c"{mark}}}]}}]}}"#,
        "be brief. ".repeat(60)
    )
}

/// A Messages call of `body`, answered: the host as the call left it,
/// and the record of the call.
fn send(w: &mut World, body: &str) -> FakeHost {
    let mut host = FakeHost::post("/v1/messages").with_body(body);
    let (mut call, _) = w.request(&mut host).unwrap();
    let answer = r#"{"type":"message","content":[],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":1}}"#;
    let mut answered = host.clone().with_response(200, "application/json", answer);
    call.on_response_headers(&mut w.env(), &mut answered, false);
    answered.response_body = answer.as_bytes().to_vec();
    call.on_response_body(&mut w.env(), &mut answered, answer.len(), true);
    call.on_log(&mut w.env());
    host.properties = answered.properties;
    host
}

#[test]
fn a_model_that_opts_in_gets_markers_the_client_placed_none_of() {
    let mut w = World::new(CONFIG);
    let host = send(&mut w, &conversation("claude-x", false));
    let sent = String::from_utf8(host.request_body.clone()).unwrap();
    assert_eq!(sent.matches("cache_control").count(), 3, "{sent}");
    assert_eq!(
        host.header("content-length"),
        Some(sent.len().to_string().as_str())
    );
    assert_eq!(
        w.counter("llm_filter_prompt_cache_markers_totalmodel=.=claude-x;.;api=.=messages;.;"),
        3
    );
    let record: serde_json::Value =
        serde_json::from_slice(&host.properties["llm_filter.call"]).unwrap();
    assert_eq!(record["cache_markers"], 3, "{record}");
    // Another model, and a client's own marker: as they came.
    for body in [conversation("gpt-x", false), conversation("claude-x", true)] {
        let host = send(&mut w, &body);
        let sent = String::from_utf8(host.request_body.clone()).unwrap();
        assert!(sent.is_empty() || sent == body, "{sent}");
    }
    assert_eq!(
        w.counter("llm_filter_prompt_cache_markers_totalmodel=.=claude-x;.;api=.=messages;.;"),
        3
    );
}

#[test]
fn a_tenants_prompt_cache_key_is_its_own() {
    let mut w = World::new(
        r#"{"routing": {"models": {"gpt-4o": [{"cluster": "a", "prompt_cache_key": true}]}},
            "tenant": {"from": "header", "header": "x-team"}}"#,
    );
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let key = |w: &mut World, team: &str| {
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("x-team", team)
            .with_body(body);
        let (call, _) = w.request(&mut host).unwrap();
        call.on_log(&mut w.env());
        let sent = Json::parse(&host.request_body).unwrap();
        let Some(Json::String(k)) = sent.get("prompt_cache_key") else {
            panic!("no key: {sent:?}");
        };
        assert_eq!(host.header("x-llm-affinity"), Some(k.as_str()));
        k.clone()
    };
    let a = key(&mut w, "team-a");
    assert_eq!(key(&mut w, "team-a"), a);
    assert_ne!(key(&mut w, "team-b"), a);
    assert!(!a.contains("team"));
}
