//! Scenario tests of the guardrail service's step: the prompt's texts go
//! out once the rules let it through, within the call's budget; a flagged
//! call is refused, masked or counted; a verdict that does not come lets
//! the call go on or refuses it, as the operator chose.

use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

const MAIL: &str = "planted.person@example.com";

fn world(service: &str) -> World {
    World::new(&format!(
        r#"{{"guardrails":{{"rules":[{{"name":"no-secrets","detect":["secrets"]}}],
              "service":{service}}},
            "cache":{{"max_entries":8}},
            "access_log":{{"enabled":true}}}}"#
    ))
}

fn chat(content: &str) -> FakeHost {
    let body = serde_json::json!({"model": "gpt-4o", "temperature": 0,
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": content}]});
    FakeHost::post("/v1/chat/completions")
        .with_header("x-request-timeout-ms", "2000")
        .with_body(&body.to_string())
}

/// Starts a call and hands its body over: the call and its step.
fn ask(w: &mut World, host: &mut FakeHost) -> (Call, Step) {
    let (mut call, step) = Call::start(&mut w.env(), host, false).unwrap();
    assert_eq!(step, Step::Pause);
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), host, size, true);
    (call, step)
}

fn verdict(status: u16, body: serde_json::Value) -> CalloutAnswer {
    CalloutAnswer {
        status: Some(status),
        headers: vec![(":status".into(), status.to_string())],
        body: body.to_string().into_bytes(),
    }
}

fn record(host: &FakeHost) -> serde_json::Value {
    serde_json::from_slice(&host.properties["llm_filter.call"]).unwrap()
}

fn sent(host: &FakeHost) -> serde_json::Value {
    serde_json::from_slice(&host.request_body).unwrap()
}

#[test]
fn the_prompts_texts_go_to_the_service_and_a_flagged_call_is_refused() {
    let mut w = world(r#"{"preset":"openai_moderation","cluster":"moderation","timeout_ms":300}"#);
    let mut host = chat("how do I hurt someone");
    let (mut call, step) = ask(&mut w, &mut host);
    assert_eq!(step, Step::Pause, "waits for the verdict");
    assert!(call.holds_request());
    let [(cluster, headers, body, timeout_ms)] = host.callouts.as_slice() else {
        panic!("one callout: {:?}", host.callouts)
    };
    assert_eq!(cluster, "moderation");
    assert!(headers.contains(&(":path".into(), "/v1/moderations".into())));
    assert_eq!(*timeout_ms, 300);
    let asked: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(
        asked["input"],
        serde_json::json!(["be brief", "how do I hurt someone"])
    );
    w.now_ms += 12;
    let flagged = verdict(
        200,
        serde_json::json!({"results": [{"flagged": false}, {"flagged": true}]}),
    );
    let step = call.answer_callout(&mut w.env(), &mut host, flagged);
    assert_eq!(step, Step::Pause, "answered here");
    let (status, _, body) = host.local_reply.clone().expect("refused");
    assert_eq!(status, 400);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "llm_filter_guardrail_blocked");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`service`"));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter(
            "llm_filter_guardrail_fired_totalrule=.=service;.;action=.=block;.;api=.=chat;.;"
        ),
        1
    );
    assert_eq!(record(&host)["guardrails"], "service:block");
}

#[test]
fn a_passed_call_goes_on_and_the_callout_never_outlasts_the_budget() {
    let mut w = world(r#"{"preset":"webhook","cluster":"hook","timeout_ms":5000}"#);
    let mut host = chat("hello");
    let (mut call, _) = ask(&mut w, &mut host);
    let timeout_ms = host.callouts[0].3;
    assert!(
        timeout_ms <= 2000,
        "within the caller's budget: {timeout_ms}"
    );
    let step = call.answer_callout(
        &mut w.env(),
        &mut host,
        verdict(200, serde_json::json!({"flagged": false})),
    );
    assert_eq!(step, Step::Continue, "goes upstream");
    assert!(host.local_reply.is_none());
    assert_eq!(sent(&host)["messages"][1]["content"], "hello");
}

#[test]
fn a_masking_service_s_texts_are_what_leaves() {
    let mut w = world(r#"{"preset":"webhook","cluster":"hook","action":"mask"}"#);
    let mut host = chat(&format!("mail {MAIL} now"));
    let (mut call, _) = ask(&mut w, &mut host);
    let masked = verdict(
        200,
        serde_json::json!({"flagged": true,
        "texts": ["be brief", "mail <EMAIL> now"]}),
    );
    let step = call.answer_callout(&mut w.env(), &mut host, masked);
    assert_eq!(step, Step::Continue);
    assert_eq!(sent(&host)["messages"][1]["content"], "mail <EMAIL> now");
    assert!(!String::from_utf8_lossy(&host.request_body).contains(MAIL));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_guardrail_fired_totalrule=.=service;.;action=.=mask;.;api=.=chat;.;"),
        1
    );
}

#[test]
fn no_verdict_goes_on_or_is_refused_as_on_error_says() {
    for (on_error, status) in [("allow", None), ("refuse", Some(503))] {
        let mut w = world(&format!(
            r#"{{"preset":"webhook","cluster":"hook","name":"hook","on_error":"{on_error}"}}"#
        ));
        for (answer, reason) in [
            (CalloutAnswer::default(), "timeout"),
            (verdict(500, serde_json::json!({})), "status"),
            (verdict(200, serde_json::json!({"ok": true})), "invalid"),
        ] {
            let mut host = chat("hello");
            let (mut call, _) = ask(&mut w, &mut host);
            let step = call.answer_callout(&mut w.env(), &mut host, answer);
            let result = match status {
                None => {
                    assert_eq!(step, Step::Continue, "{reason}");
                    "allowed"
                }
                Some(s) => {
                    assert_eq!(step, Step::Pause, "{reason}");
                    let (got, _, body) = host.local_reply.clone().unwrap();
                    assert_eq!(got, s);
                    assert!(
                        String::from_utf8_lossy(&body).contains("llm_filter_guardrail_unavailable")
                    );
                    "refused"
                }
            };
            call.on_log(&mut w.env());
            assert_eq!(
                w.counter(&format!(
                    "llm_filter_guardrail_service_failures_totalrule=.=hook;.;reason=.={reason};.;result=.={result};.;api=.=chat;.;"
                )),
                1
            );
        }
        // A callout the host will not send.
        let mut host = chat("hello");
        host.refuse_callouts = true;
        let (_, step) = ask(&mut w, &mut host);
        assert_eq!(step == Step::Continue, status.is_none(), "{on_error}");
    }
}

#[test]
fn a_call_the_rules_block_never_reaches_the_service() {
    let mut w = world(r#"{"preset":"webhook","cluster":"hook"}"#);
    let mut host = chat("key sk-proj-PLANTEDguard0123456789");
    let (_, step) = ask(&mut w, &mut host);
    assert_eq!(step, Step::Pause);
    assert_eq!(host.local_reply.as_ref().map(|r| r.0), Some(400));
    assert!(host.callouts.is_empty(), "nothing sent to the service");
}
