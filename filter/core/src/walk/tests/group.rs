//! Scenario tests of the A/B step: which group a call joins, what goes
//! upstream and back, and the group's overrides.

use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

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
                "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=success;.;api=.=chat;.;group=.={name};.;"
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

#[test]
fn at_one_level_a_group_is_shed_while_another_is_capped() {
    let mut w = World::new(
        r#"{"admin":{"token":"0123456789abcdef"},
          "degrade":{"max_tokens_cap":64},
          "ab":{"groups":[
            {"name":"control","percent":50},
            {"name":"b","percent":50,"overrides":{"degrade":{
              "levels":{"2":{"P2":["max_tokens"]}},"max_tokens_cap":16}}}]}}"#,
    );
    let hook = r#"{"version":"4","alerts":[{"status":"firing","labels":{"severity":"critical"},"fingerprint":"f"}]}"#;
    let reports = crate::degrade::alerts::parse(hook.as_bytes(), w.now_ms).unwrap();
    crate::degrade::alerts::apply(&w.store, &w.config.degrade, &reports, w.now_ms).unwrap();
    // Level 3 (critical): the group keeps level 3's top-level actions, so
    // both groups' P2 calls are rejected.
    for group in [0, 1] {
        let user = user_in(&w, group);
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("x-user-id", &user)
            .with_header("x-request-priority", "P2")
            .with_body(BODY);
        send(&mut w, &mut host);
        assert_eq!(host.local_reply.unwrap().0, 503, "group {group}");
    }
    // Level 2 from an operators' rule: control is shed, b is capped.
    w.config.degrade.alerts = vec![crate::degrade::config::AlertRule {
        matchers: vec![("severity", "critical".into())],
        level: 2,
    }];
    let control = user_in(&w, 0);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-user-id", &control)
        .with_header("x-request-priority", "P2")
        .with_body(BODY);
    let call = send(&mut w, &mut host);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!((status, headers["retry-after"].as_str()), (503, "5"));
    assert_eq!(headers["x-llm-degraded"], "2");
    assert_eq!(headers["x-user-group"], "control");
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_degraded_totalaction=.=shed;.;priority=.=P2;.;"),
        1
    );

    let b = user_in(&w, 1);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-user-id", &b)
        .with_header("x-request-priority", "P2")
        .with_body(BODY);
    let mut call = send(&mut w, &mut host);
    assert_eq!(host.local_reply, None);
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(
        sent["max_tokens"], 16,
        "the group's cap, not the top-level 64"
    );
    let mut host = host.with_response(200, "application/json", "{}");
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response("x-llm-degraded"), Some("2"));
    assert_eq!(host.response("x-user-group"), Some("b"));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_degraded_totalaction=.=max_tokens;.;priority=.=P2;.;"),
        1
    );
}
