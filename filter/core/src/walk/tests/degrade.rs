//! Scenario tests of the degrade step: each level's actions on each
//! priority, against a fake host and in-memory shared data.

use crate::build;
use crate::load::{self, Scope};
use crate::metrics as names;
use crate::walk::fake::{fire, with_alerts, with_section, FakeHost, World};
use crate::walk::*;

const PATH: &str = "/v1/chat/completions";
const ANSWER: &str = r#"{"id":"x","object":"chat.completion","created":7,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

/// The degrade settings and the way alerts arrive (`with_alerts`), with the
/// cache in a build that has it (an expired entry answered at level 3).
fn world() -> World {
    let config = with_alerts(
        r#"{"degrade":{"fallback_model":{"gpt-4o":"gpt-4o-mini"},"max_tokens_cap":64}}"#,
    );
    World::new(&with_section(
        build::CACHE,
        r#""cache":{"ttl_s":60}"#,
        &config,
    ))
}

fn alert(w: &mut World, severity: &str) {
    fire(
        w,
        &format!(
            r#"{{"version":"4","alerts":[{{"status":"firing","labels":{{"severity":"{severity}"}},"fingerprint":"f"}}]}}"#
        ),
    );
}

fn call(priority: &str, body: &str) -> FakeHost {
    FakeHost::post(PATH)
        .with_header("x-request-priority", priority)
        .with_body(body)
}

/// Runs a call through to the upstream or a local reply.
fn run(w: &mut World, host: &mut FakeHost) -> (Call, Step) {
    let (mut call, _) = Call::start(&mut w.env(), host, false).unwrap();
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), host, size, true);
    (call, step)
}

fn sent(host: &FakeHost) -> serde_json::Value {
    serde_json::from_slice(&host.request_body).unwrap()
}

const CHAT: &str = r#"{"model":"gpt-4o","temperature":0.8,"max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn level_three_rejects_p2_and_leaves_p0_alone() {
    let mut w = world();
    alert(&mut w, "critical");
    let mut host = call("P2", CHAT);
    let (c, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Pause);
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 503);
    assert_eq!(headers["x-llm-degraded"], "3");
    assert_eq!(headers["retry-after"], "10");
    assert!(String::from_utf8(body)
        .unwrap()
        .contains("llm_filter_degraded_reject"));
    c.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_degraded_totalaction=.=reject;.;priority=.=P2;.;"),
        1
    );
    assert_eq!(
        w.metrics.gauges["llm_filter_degrade_levelmodel=.=gpt-4o;.;"],
        3
    );

    let mut host = call("P0", CHAT);
    let (mut c, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    assert_eq!(host.request_body, CHAT.as_bytes(), "P0 is never changed");
    let mut host = host.with_response(200, "application/json", ANSWER);
    c.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response("x-llm-degraded"), None);
}

#[test]
fn level_two_degrades_p1_and_sheds_p2() {
    let mut w = world();
    // Level 2 from an alert rule of the operators'.
    w.config.degrade.alerts = vec![crate::degrade::config::AlertRule {
        matchers: vec![("severity", "page".into())],
        level: 2,
    }];
    alert(&mut w, "page");
    let mut host = call("P1", CHAT);
    let (mut c, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    let body = sent(&host);
    assert_eq!(body["model"], "gpt-4o-mini");
    assert_eq!(body["max_tokens"], 64);
    // No load measured yet: T × (0.6 + 0.4 × 0.1).
    assert_eq!(body["temperature"], 0.51);
    let len = host.request_body.len().to_string();
    assert_eq!(host.header("content-length"), Some(len.as_str()));
    let mut host = host.with_response(200, "application/json", ANSWER);
    c.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(host.response("x-llm-degraded"), Some("2"));
    for action in ["fallback_model", "max_tokens", "temperature"] {
        assert_eq!(
            w.counter(&format!(
                "llm_filter_degraded_totalaction=.={action};.;priority=.=P1;.;"
            )),
            1
        );
    }

    let mut host = call("P2", CHAT);
    run(&mut w, &mut host);
    let (status, headers, _) = host.local_reply.unwrap();
    assert_eq!((status, headers["retry-after"].as_str()), (503, "5"));
}

#[test]
fn level_one_caps_p2_only() {
    let mut w = world();
    alert(&mut w, "warning");
    let mut host = call("P2", CHAT);
    run(&mut w, &mut host);
    let body = sent(&host);
    assert_eq!(
        (body["max_tokens"].as_u64(), body["model"].as_str()),
        (Some(64), Some("gpt-4o"))
    );
    assert_eq!(body["temperature"], 0.8);
    let mut host = call("P1", CHAT);
    run(&mut w, &mut host);
    assert_eq!(host.request_body, CHAT.as_bytes());
}

#[cfg(feature = "cache")]
#[test]
fn level_three_answers_p1_from_an_expired_entry() {
    let mut w = world();
    let det = r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut host = call("P1", det);
    let (mut c, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    let mut host = host.with_response(200, "application/json", ANSWER);
    c.on_response_headers(&mut w.env(), &mut host, false);
    c.on_response_body(&mut w.env(), &mut host, ANSWER.len(), true);
    c.on_log(&mut w.env());
    // Long past its expiry (60 s) and the stale window, still in its slot.
    w.now_ms += 3_600_000;
    alert(&mut w, "critical");
    let mut host = call("P1", det);
    let (c, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Pause);
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers["x-downgrade"], "cache");
    assert_eq!(headers["x-cache"], "STALE");
    assert_eq!(headers["x-llm-degraded"], "3");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"],
        "x"
    );
    c.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_degraded_totalaction=.=cache;.;priority=.=P1;.;"),
        1
    );

    // Nothing stored for this one: degraded like level 2 instead.
    let mut host = call("P1", CHAT);
    let (_, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue);
    assert_eq!(sent(&host)["model"], "gpt-4o-mini");
}

/// With two P2 calls of gpt-4o in flight a third is shed at level 2; the
/// two then end.
fn shed_with_two_in_flight(w: &mut World) {
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut host = call("P2", CHAT);
        let (c, step) = run(w, &mut host);
        assert_eq!(step, Step::Continue);
        open.push(c);
    }
    let mut host = call("P2", CHAT);
    run(w, &mut host);
    let (status, headers, _) = host.local_reply.unwrap();
    assert_eq!((status, headers["x-llm-degraded"].as_str()), (503, "2"));
    for c in open {
        c.on_log(&mut w.env());
    }
}

#[test]
fn a_threshold_on_in_flight_calls_raises_the_level() {
    let mut w =
        World::new(r#"{"degrade":{"thresholds":[{"signal":"in_flight","above":1,"level":2}]}}"#);
    shed_with_two_in_flight(&mut w);
    let mut host = call("P2", CHAT);
    let (_, step) = run(&mut w, &mut host);
    assert_eq!(step, Step::Continue, "back to level 0");
}

#[test]
fn made_up_models_never_switch_off_a_threshold() {
    let mut w = World::new(
        r#"{"degrade":{"thresholds":[{"model":"gpt-4o","signal":"in_flight","above":1,"level":2}]}}"#,
    );
    // More made-up models than the load records and the worker's labels
    // keep for names the configuration does not give, one call each.
    for i in 0..load::MAX_UNKNOWN + 6 {
        let body = CHAT.replace("gpt-4o", &format!("made-up-{i}"));
        let mut host = call("P2", &body);
        let (c, step) = run(&mut w, &mut host);
        assert_eq!(step, Step::Continue);
        c.on_log(&mut w.env());
    }
    shed_with_two_in_flight(&mut w);
    let other = load::read(&w.store, Scope::Model(load::OVERFLOW), w.now_ms);
    // The sixty beyond the ten labels this world's worker keeps: `other`.
    assert_eq!((other.rps, other.in_flight), (6.0, 0));
    // Its calls keep their own label too.
    let own: u64 = w
        .metrics
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with(names::REQUESTS) && k.contains("model=.=gpt-4o;"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(own, 2);
}
