//! Scenario tests of the A/B step: which group a call joins, what goes
//! upstream and back, and the group's overrides.

use super::fake::{FakeHost, World};
use super::*;

const AB: &str = r#"{
  "routing": {"models": {"gpt-4o": [{"cluster": "a"}]}},
  "shaping": {"max_tokens_cap": 512},
  "ab": {"groups": [
    {"name": "control", "percent": 50},
    {"name": "b", "percent": 50, "overrides": {
      "routing": {"models": {"gpt-4o": [{"cluster": "b", "model": "small"}]}},
      "shaping": {"max_tokens_cap": 32},
      "cache": {"enabled": false}}}
  ]}
}"#;

const BODY: &str =
    r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;

/// A user id that lands in group `want` (0: control, 1: b).
fn user_in(w: &World, want: usize) -> String {
    (0..)
        .map(|i| format!("user-{i}"))
        .find(|u| w.config.ab.assign(Some(u)) == Some(want))
        .unwrap()
}

fn send(w: &mut World, host: &mut FakeHost) -> Call {
    let (mut call, _) = Call::start(&mut w.env(), host, false).unwrap();
    let size = host.request_body.len();
    call.on_request_body(&mut w.env(), host, size, true);
    call
}

#[test]
fn a_call_joins_its_users_group_with_its_overrides() {
    let mut w = World::new(AB);
    for (group, cluster, cap, x_cache) in [(0, "a", "512", Some("MISS")), (1, "b", "32", None)] {
        let user = user_in(&w, group);
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("x-user-id", &user)
            .with_header("baggage", "k=v")
            .with_body(BODY);
        let mut call = send(&mut w, &mut host);
        let name = ["control", "b"][group];
        assert_eq!(host.header("x-user-group"), Some(name));
        assert_eq!(
            host.header("baggage"),
            Some(format!("k=v,priority=P1,user_group={name}").as_str())
        );
        assert_eq!(host.header("x-llm-cluster"), Some(cluster));
        let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
        assert_eq!(sent["max_tokens"].to_string(), cap);
        let mut host = host.with_response(200, "application/json", "{}");
        call.on_response_headers(&mut w.env(), &mut host, false);
        assert_eq!(host.response("x-user-group"), Some(name));
        assert_eq!(host.response("x-cache"), x_cache, "group {name}");
        call.on_response_body(&mut w.env(), &mut host, 2, true);
        call.on_log(&mut w.env());
        assert_eq!(
            w.counter(&format!(
                "llm_filter_requests_total.priority.P1.model.gpt-4o.outcome.success.group.{name}"
            )),
            1
        );
    }
}

#[test]
fn the_body_user_counts_when_the_header_is_absent() {
    let mut w = World::new(AB);
    let user = user_in(&w, 1);
    let body = format!(
        r#"{{"model":"gpt-4o","user":"{user}","messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let mut host = FakeHost::post("/v1/chat/completions").with_body(&body);
    send(&mut w, &mut host);
    assert_eq!(host.header("x-user-group"), Some("b"));
    // No key at all: the first group.
    let mut host = FakeHost::post("/v1/chat/completions").with_body(BODY);
    send(&mut w, &mut host);
    assert_eq!(host.header("x-user-group"), Some("control"));
}

#[test]
fn without_groups_nothing_is_added() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-user-id", "u")
        .with_body(BODY);
    let mut call = send(&mut w, &mut host);
    assert_eq!(host.header("x-user-group"), None);
    let mut host = host.with_response(200, "application/json", "{}");
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response("x-user-group"), None);
}

#[test]
fn a_user_header_spares_holding_the_body() {
    let mut w = World::new(
        r#"{"cache":{"enabled":false},"budget":{"enabled":false},
            "ab":{"groups":[{"name":"a","percent":50},{"name":"b","percent":50}]}}"#,
    );
    let user = user_in(&w, 1);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-user-id", &user)
        .with_body(BODY);
    let (_, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Continue, "streams through");
    assert_eq!(host.header("x-user-group"), Some("b"));
    // Without the header, the body is held for its `user`.
    let mut host = FakeHost::post("/v1/chat/completions").with_body(BODY);
    let (_, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Pause);
}
