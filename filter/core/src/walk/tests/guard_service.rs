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

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;

fn parallel(extra: &str) -> World {
    world(&format!(
        r#"{{"preset":"webhook","cluster":"hook","mode":"parallel","timeout_ms":300{extra}}}"#
    ))
}

/// The upstream's answer comes while the verdict is awaited: its headers
/// and body are held (the step of each callback).
fn answer_comes(w: &mut World, call: &mut Call, host: &mut FakeHost) -> (Step, Step) {
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "application/json".into()),
    ];
    host.response_body = ANSWER.as_bytes().to_vec();
    let headers = call.on_response_headers(&mut w.env(), host, false);
    let body = call.on_response_body(&mut w.env(), host, ANSWER.len(), true);
    (headers, body)
}

#[test]
fn in_parallel_the_call_leaves_at_once_and_its_answer_waits_for_the_verdict() {
    let mut w = parallel("");
    let mut host = chat("hello");
    let (mut call, step) = ask(&mut w, &mut host);
    assert_eq!(step, Step::Continue, "upstream while the service is asked");
    assert!(!call.holds_request());
    assert_eq!(host.callouts.len(), 1, "the service is asked");
    assert_eq!(
        answer_comes(&mut w, &mut call, &mut host),
        (Step::Pause, Step::Pause),
        "held for the verdict"
    );
    assert!(host.response("x-cache").is_none(), "not read yet");
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    let step = call.answer_callout(&mut w.env(), &mut host, pass);
    assert_eq!(step, Step::Continue, "the held answer goes on");
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(host.response_body, ANSWER.as_bytes());
    call.on_log(&mut w.env());
    // Stored as any answer: the same call again is a hit, held for its
    // own verdict, then sent.
    let mut again = chat("hello");
    let (mut call, step) = ask(&mut w, &mut again);
    assert_eq!(step, Step::Pause, "the entry's answer waits");
    assert!(again.local_reply.is_none());
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut again, pass),
        Step::Pause
    );
    let (status, headers, body) = again.local_reply.clone().expect("the hit");
    assert_eq!(status, 200);
    assert_eq!(headers.get("x-cache").map(String::as_str), Some("HIT"));
    assert!(String::from_utf8_lossy(&body).contains("yo"));
}

#[test]
fn in_parallel_a_flagged_call_gets_the_refusal_and_nothing_is_stored() {
    // Flagged after the answer came, and before.
    for answer_first in [true, false] {
        let mut w = parallel("");
        let mut host = chat("hello");
        let (mut call, _) = ask(&mut w, &mut host);
        if answer_first {
            answer_comes(&mut w, &mut call, &mut host);
        }
        let flagged = verdict(200, serde_json::json!({"flagged": true}));
        let step = call.answer_callout(&mut w.env(), &mut host, flagged);
        assert_eq!(step, Step::Pause, "{answer_first}");
        let (status, _, body) = host.local_reply.clone().expect("refused");
        assert_eq!(status, 400);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "llm_filter_guardrail_blocked");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("answer was withheld"), "{message}");
        if !answer_first {
            // The upstream's answer, when it comes, is the refused call's.
            answer_comes(&mut w, &mut call, &mut host);
        }
        call.on_log(&mut w.env());
        assert_eq!(record(&host)["guardrails"], "service:block");
        let mut again = chat("hello");
        let (mut call, step) = ask(&mut w, &mut again);
        assert_eq!(step, Step::Continue, "no entry: a miss goes upstream");
        call.answer_callout(
            &mut w.env(),
            &mut again,
            verdict(200, serde_json::json!({"flagged": false})),
        );
        assert!(again.local_reply.is_none(), "{answer_first}");
    }
}

#[test]
fn in_parallel_no_verdict_releases_or_refuses_the_answer_as_on_error_says() {
    for (on_error, want) in [("allow", Step::Continue), ("refuse", Step::Pause)] {
        let mut w = parallel(&format!(r#","on_error":"{on_error}""#));
        let mut host = chat("hello");
        let (mut call, _) = ask(&mut w, &mut host);
        answer_comes(&mut w, &mut call, &mut host);
        let step = call.answer_callout(&mut w.env(), &mut host, CalloutAnswer::default());
        assert_eq!(step, want, "{on_error}");
        let refused = host.local_reply.as_ref().map(|r| r.0);
        assert_eq!(refused, (on_error == "refuse").then_some(503), "{on_error}");
    }
}

#[test]
fn in_parallel_a_held_stream_is_read_whole_when_released() {
    let mut w = parallel("");
    let mut host = FakeHost::post("/v1/chat/completions").with_body(
        r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let (mut call, _) = ask(&mut w, &mut host);
    let events = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"yo\"}}]}\n\n\
                  data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "text/event-stream".into()),
    ];
    host.response_body = events.as_bytes().to_vec();
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Pause
    );
    // Two chunks buffered so far, the stream not ended.
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, events.len(), false),
        Step::Pause
    );
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, pass),
        Step::Continue
    );
    // The usage the filter asked for is read and taken out again.
    let passed = String::from_utf8_lossy(&host.response_body).to_string();
    assert!(
        passed.contains("\"yo\"") && !passed.contains("usage"),
        "{passed}"
    );
    // The rest streams as usual.
    host.response_body = b"data: [DONE]\n\n".to_vec();
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, 14, true),
        Step::Continue
    );
}

/// A parallel service and a proxy that holds 1 KiB of an answer.
fn parallel_held(extra: &str) -> World {
    World::new(&format!(
        r#"{{"guardrails":{{"service":{{"preset":"webhook","cluster":"hook","mode":"parallel",
              "timeout_ms":300{extra}}}}},
            "max_body_bytes":1024,
            "cache":{{"max_entries":8}},
            "access_log":{{"enabled":true}}}}"#
    ))
}

/// A JSON answer longer than the proxy holds, in two pieces.
fn long_answer() -> (String, String) {
    let text = "word ".repeat(500);
    let answer = format!(
        r#"{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":500}}}}"#
    );
    let (head, tail) = answer.split_at(1500);
    (head.to_string(), tail.to_string())
}

/// The long answer's head comes while the verdict is awaited: past what
/// is held, its headers and the head go on (the step of the head).
fn long_head_comes(w: &mut World, call: &mut Call, host: &mut FakeHost, head: &str) -> Step {
    host.response_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), "application/json".into()),
    ];
    assert_eq!(
        call.on_response_headers(&mut w.env(), host, false),
        Step::Pause
    );
    host.response_body = head.as_bytes()[..600].to_vec();
    assert_eq!(
        call.on_response_body(&mut w.env(), host, 600, false),
        Step::Pause,
        "within what is held"
    );
    host.response_body = head.as_bytes().to_vec();
    call.on_response_body(&mut w.env(), host, head.len(), false)
}

#[test]
fn in_parallel_an_answer_longer_than_is_held_goes_on_but_for_its_end_until_the_verdict() {
    let mut w = parallel_held("");
    let mut host = chat("hello");
    let (mut call, _) = ask(&mut w, &mut host);
    let (head, tail) = long_answer();
    let step = long_head_comes(&mut w, &mut call, &mut host, &head);
    assert_eq!(step, Step::Continue, "released: the head goes on");
    assert_eq!(host.response("x-cache"), Some("MISS"), "read as it goes");
    // But for its last byte, kept back for the verdict.
    let (sent, kept) = head.split_at(head.len() - 1);
    assert_eq!(host.response_body, sent.as_bytes());
    host.response_body = tail.as_bytes().to_vec();
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, tail.len(), true),
        Step::Pause,
        "its end waits for the verdict"
    );
    assert!(
        !host.properties.contains_key("llm_filter.call"),
        "not ended"
    );
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    let step = call.answer_callout(&mut w.env(), &mut host, pass);
    assert_eq!(step, Step::Continue, "the end goes on");
    assert!(!host.reset);
    assert_eq!(
        host.response_body,
        format!("{kept}{tail}").as_bytes(),
        "as it came, after what was kept back"
    );
    assert_eq!(record(&host)["status"], 200);
    assert!(record(&host)["error"].is_null());
    call.on_log(&mut w.env());
    // Stored as any answer passed.
    let mut again = chat("hello");
    let (mut call, _) = ask(&mut w, &mut again);
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    call.answer_callout(&mut w.env(), &mut again, pass);
    let (status, headers, _) = again.local_reply.clone().expect("the hit");
    assert_eq!(
        (status, headers.get("x-cache").map(String::as_str)),
        (200, Some("HIT"))
    );
}

/// Refused after the answer was released (flagged, or no verdict with
/// `on_error: refuse`; its end come or not): the stream is reset, so the
/// client never takes the head for the answer; counted, named, not stored.
#[test]
fn in_parallel_a_released_answer_refused_by_its_verdict_is_cut() {
    for (on_error, answer) in [
        ("allow", verdict(200, serde_json::json!({"flagged": true}))),
        ("refuse", CalloutAnswer::default()),
    ] {
        for end_came in [true, false] {
            let case = format!("{on_error} {end_came}");
            let mut w = parallel_held(&format!(r#","on_error":"{on_error}""#));
            let mut host = chat("hello");
            let (mut call, _) = ask(&mut w, &mut host);
            let (head, tail) = long_answer();
            long_head_comes(&mut w, &mut call, &mut host, &head);
            if end_came {
                host.response_body = tail.as_bytes().to_vec();
                call.on_response_body(&mut w.env(), &mut host, tail.len(), true);
            }
            let step = call.answer_callout(&mut w.env(), &mut host, answer.clone());
            assert_eq!(step, Step::Pause, "{case}");
            assert!(host.reset, "{case}");
            assert_eq!(host.replies, 0, "no second answer: {case}");
            let cut =
                w.counter("llm_filter_guardrail_answer_cut_totalrule=.=service;.;api=.=chat;.;");
            assert_eq!(cut, 1, "{case}");
            let rec = record(&host);
            let named = rec["guardrails"].as_str().unwrap_or_default();
            assert!(named.ends_with("service:cut"), "{case}: {named}");
            assert_eq!(rec["error"], "incomplete", "{case}");
            call.on_log(&mut w.env());
            let mut again = chat("hello");
            let (mut call, step) = ask(&mut w, &mut again);
            assert_eq!(step, Step::Continue, "not stored: {case}");
            call.answer_callout(
                &mut w.env(),
                &mut again,
                verdict(200, serde_json::json!({"flagged": false})),
            );
            assert!(again.local_reply.is_none(), "{case}");
        }
    }
}

/// A verdict that lets a released answer go before its end came: the end
/// passes as it comes.
#[test]
fn in_parallel_a_released_answer_passed_before_its_end_ends_as_it_comes() {
    let mut w = parallel_held("");
    let mut host = chat("hello");
    let (mut call, _) = ask(&mut w, &mut host);
    let (head, tail) = long_answer();
    long_head_comes(&mut w, &mut call, &mut host, &head);
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, pass),
        Step::Pause,
        "nothing held to resume"
    );
    host.response_body = tail.as_bytes().to_vec();
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, tail.len(), true),
        Step::Continue
    );
    assert_eq!(record(&host)["status"], 200);
    assert!(record(&host)["error"].is_null());
    assert!(!host.reset);
}

/// An answer that comes whole and longer than is held before the verdict
/// cannot wait for it: it has no verdict, and `on_error` says.
#[test]
fn in_parallel_an_answer_come_whole_past_what_is_held_falls_under_on_error() {
    for on_error in ["allow", "refuse"] {
        let mut w = parallel_held(&format!(r#","on_error":"{on_error}""#));
        let mut host = chat("hello");
        let (mut call, _) = ask(&mut w, &mut host);
        let (head, tail) = long_answer();
        let whole = format!("{head}{tail}");
        host.response_headers = vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/json".into()),
        ];
        call.on_response_headers(&mut w.env(), &mut host, false);
        host.response_body = whole.as_bytes().to_vec();
        let step = call.on_response_body(&mut w.env(), &mut host, whole.len(), true);
        let failures = w.counter(&format!(
            "llm_filter_guardrail_service_failures_totalrule=.=service;.;reason=.=answer_too_long;.;result=.={};.;api=.=chat;.;",
            if on_error == "allow" { "allowed" } else { "refused" }
        ));
        assert_eq!(failures, 1, "{on_error}");
        match on_error {
            "allow" => {
                assert_eq!(step, Step::Continue);
                assert!(host.local_reply.is_none());
                assert_eq!(host.response_body, whole.as_bytes());
            }
            _ => {
                assert_eq!(step, Step::Pause);
                assert_eq!(host.local_reply.as_ref().map(|r| r.0), Some(503));
            }
        }
        // The verdict, when it comes, adds nothing.
        let flagged = verdict(200, serde_json::json!({"flagged": true}));
        assert_eq!(
            call.answer_callout(&mut w.env(), &mut host, flagged),
            Step::Pause
        );
        assert!(!host.reset, "{on_error}");
        assert_eq!(host.replies, u32::from(on_error == "refuse"), "{on_error}");
    }
}

/// A service asked about answers (`on`), with a rule that masks phone
/// numbers in prompts and puts them back.
fn on_answers(service: &str) -> World {
    World::new(&format!(
        r#"{{"guardrails":{{"rules":[
              {{"name":"phones","detect":["phone"],"action":"mask","restore":true}}],
              "service":{service}}},
            "cache":{{"max_entries":8}},
            "access_log":{{"enabled":true}}}}"#
    ))
}

const PHONE: &str = "+14155550123";

fn chat_answer(text: &str) -> String {
    serde_json::json!({"id": "x", "object": "chat.completion", "created": 7, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop", "logprobs": null}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    .to_string()
}

/// The call goes upstream (its prompt asked about by nobody) and its JSON
/// answer `answer` comes whole: the steps of its headers and body.
fn answered(w: &mut World, call: &mut Call, host: &mut FakeHost, answer: &str) -> (Step, Step) {
    let mut answered = host
        .clone()
        .with_response(200, "application/json", answer)
        .with_response_header("content-length", &answer.len().to_string());
    let headers = call.on_response_headers(&mut w.env(), &mut answered, false);
    answered.response_body = answer.as_bytes().to_vec();
    let body = call.on_response_body(&mut w.env(), &mut answered, answer.len(), true);
    *host = answered;
    (headers, body)
}

fn start(w: &mut World, host: &mut FakeHost) -> Call {
    let (mut call, step) = Call::start(&mut w.env(), host, false).unwrap();
    assert_eq!(step, Step::Pause);
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), host, size, true);
    assert_eq!(step, Step::Continue, "not asked about the prompt");
    call
}

#[test]
fn an_answers_texts_go_to_the_service_without_the_prompts_values_and_a_flagged_one_is_refused() {
    let mut w = on_answers(
        r#"{"name":"moderation","preset":"webhook","cluster":"hook","on":"answer","timeout_ms":300}"#,
    );
    let mut host = chat(&format!("call me at {PHONE}"));
    let mut call = start(&mut w, &mut host);
    assert!(host.callouts.is_empty(), "the prompt is not asked about");
    let said = chat_answer("I will call [PHONE_1] about FORBIDDEN");
    let (headers, body) = answered(&mut w, &mut call, &mut host, &said);
    assert_eq!(
        (headers, body),
        (Step::Pause, Step::Pause),
        "held for the verdict"
    );
    let [(cluster, _, asked, timeout_ms)] = host.callouts.as_slice() else {
        panic!("one callout: {:?}", host.callouts)
    };
    assert_eq!(cluster, "hook");
    assert!(*timeout_ms <= 300);
    let asked: serde_json::Value = serde_json::from_slice(asked).unwrap();
    // The placeholder, never the caller's number; no role, no reason.
    assert_eq!(
        asked,
        serde_json::json!({"api": "chat", "source": "answer",
                           "texts": ["I will call [PHONE_1] about FORBIDDEN"]})
    );
    w.now_ms += 9;
    let step = call.answer_callout(
        &mut w.env(),
        &mut host,
        verdict(200, serde_json::json!({"flagged": true})),
    );
    assert_eq!(
        step,
        Step::Continue,
        "the refusal goes on in the answer's place"
    );
    assert_eq!(host.response(":status"), Some("502"));
    let body: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(body["error"]["code"], "llm_filter_guardrail_answer_blocked");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("guardrail service `moderation`"));
    assert!(!body.to_string().contains("FORBIDDEN"));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter(
            "llm_filter_guardrail_answer_fired_totalrule=.=moderation;.;action=.=block;.;api=.=chat;.;"
        ),
        1
    );
    assert_eq!(
        record(&host)["guardrails"],
        "phones:mask,moderation:block:answer"
    );
    // Not stored: the same call goes upstream again, and passes.
    let mut again = chat(&format!("call me at {PHONE}"));
    let mut call = start(&mut w, &mut again);
    answered(&mut w, &mut call, &mut again, &chat_answer("fine"));
    let step = call.answer_callout(
        &mut w.env(),
        &mut again,
        verdict(200, serde_json::json!({"flagged": false})),
    );
    assert_eq!(step, Step::Continue);
    assert_eq!(
        again.response(":status"),
        Some("200"),
        "the upstream's status stays"
    );
    assert!(String::from_utf8_lossy(&again.response_body).contains("fine"));
}

/// An answer asked about is read and checked once, at its end: what the
/// service passed is what the client gets (the prompt's values put back),
/// not the held bytes read and checked again.
#[test]
fn an_answer_asked_about_is_read_once_and_what_the_service_passed_goes_on() {
    let mut w = on_answers(r#"{"preset":"webhook","cluster":"hook","on":"answer"}"#);
    let mut host = chat(&format!("call me at {PHONE}"));
    let mut call = start(&mut w, &mut host);
    let said = chat_answer("I will call [PHONE_1] at noon");
    assert_eq!(
        answered(&mut w, &mut call, &mut host, &said).1,
        Step::Pause,
        "asked"
    );
    // Whatever the held bytes say now, they are not read again.
    host.response_body = b"not json".to_vec();
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    let step = call.answer_callout(&mut w.env(), &mut host, pass);
    assert_eq!(step, Step::Continue);
    let got: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(
        got["choices"][0]["message"]["content"],
        format!("I will call {PHONE} at noon")
    );
    assert_eq!(host.response(":status"), Some("200"));
    call.on_log(&mut w.env());
    assert_eq!(record(&host)["guardrails"], "phones:mask");
    let unchecked = w.metrics.counters.keys().any(|k| k.contains("unchecked"));
    assert!(!unchecked, "read whole once");
}

#[test]
fn a_masking_service_s_texts_are_the_answer_with_the_callers_values_put_back() {
    let mut w = on_answers(r#"{"preset":"webhook","cluster":"hook","on":"both","action":"mask"}"#);
    let mut host = chat(&format!("call me at {PHONE}"));
    let (mut call, step) = ask(&mut w, &mut host);
    assert_eq!(step, Step::Pause, "the prompt is asked about first");
    let step = call.answer_callout(
        &mut w.env(),
        &mut host,
        verdict(200, serde_json::json!({"flagged": false})),
    );
    assert_eq!(step, Step::Continue);
    let said = chat_answer("call [PHONE_1], or mail them at someone@example.com");
    answered(&mut w, &mut call, &mut host, &said);
    let masked = serde_json::json!({"flagged": true,
        "texts": ["call [PHONE_1], or mail them at <EMAIL_ADDRESS>"]});
    let step = call.answer_callout(&mut w.env(), &mut host, verdict(200, masked));
    assert_eq!(step, Step::Continue);
    let got: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(
        got["choices"][0]["message"]["content"],
        format!("call {PHONE}, or mail them at <EMAIL_ADDRESS>")
    );
    assert_eq!(got["choices"][0]["finish_reason"], "stop");
    call.on_log(&mut w.env());
    assert_eq!(
        record(&host)["guardrails"],
        "phones:mask,service:mask:answer"
    );
}

#[test]
fn no_verdict_on_an_answer_passes_it_or_refuses_it_as_on_error_says() {
    for (on_error, status) in [("allow", "200"), ("refuse", "502")] {
        let mut w = on_answers(&format!(
            r#"{{"preset":"webhook","cluster":"hook","on":"answer","on_error":"{on_error}"}}"#
        ));
        let mut host = chat("hello");
        let mut call = start(&mut w, &mut host);
        answered(&mut w, &mut call, &mut host, &chat_answer("hi there"));
        let timeout = CalloutAnswer {
            status: Some(504),
            ..CalloutAnswer::default()
        };
        assert_eq!(
            call.answer_callout(&mut w.env(), &mut host, timeout),
            Step::Continue
        );
        assert_eq!(host.response(":status"), Some(status), "{on_error}");
        let result = if status == "502" {
            "refused"
        } else {
            "allowed"
        };
        assert_eq!(
            w.counter(&format!(
                "llm_filter_guardrail_service_failures_totalrule=.=service;.;reason=.=timeout;.;result=.={result};.;api=.=chat;.;"
            )),
            1,
            "{on_error}"
        );
    }
}

#[test]
fn a_streamed_answer_is_not_asked_and_falls_under_on_error() {
    let sse = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n";
    for (on_error, status) in [("allow", "200"), ("refuse", "502")] {
        let mut w = on_answers(&format!(
            r#"{{"preset":"webhook","cluster":"hook","on":"answer","on_error":"{on_error}"}}"#
        ));
        let mut host = chat("hello");
        let mut call = start(&mut w, &mut host);
        let mut answered = host.clone().with_response(200, "text/event-stream", sse);
        call.on_response_headers(&mut w.env(), &mut answered, false);
        answered.response_body = sse.as_bytes().to_vec();
        call.on_response_body(&mut w.env(), &mut answered, sse.len(), true);
        assert!(answered.callouts.is_empty(), "{on_error}");
        assert_eq!(answered.response(":status"), Some(status), "{on_error}");
        let body = String::from_utf8_lossy(&answered.response_body).to_string();
        match status {
            "200" => assert_eq!(body, sse),
            _ => assert!(
                body.contains("llm_filter_guardrail_answer_blocked"),
                "{body}"
            ),
        }
    }
}

/// A call asked about in parallel whose model has two backends, hedged:
/// its hedge waits for the verdict, and goes once it passed.
#[test]
fn in_parallel_a_hedge_waits_for_the_verdict() {
    let mut config: serde_json::Value = serde_json::from_str(&super::hedged(1.0)).unwrap();
    config["guardrails"] = serde_json::json!({"service": {"preset": "webhook",
        "cluster": "hook", "mode": "parallel", "timeout_ms": 1000}});
    let mut w = World::new(&config.to_string());
    let (mut call, mut host) = super::routed_to(&mut w, "b");
    assert_eq!(host.callouts.len(), 1, "the service is asked");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Wait);
    assert_eq!(
        host.callouts.len(),
        1,
        "no hedge while the verdict is awaited"
    );
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, pass),
        Step::Pause,
        "nothing came back yet"
    );
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    let (cluster, _, _, _) = host.callouts.last().unwrap();
    assert_eq!(cluster, "a", "the hedge went once the verdict was in");
}

/// A call refused here (a limit) while its verdict is awaited: nothing
/// left and no answer is given, so the refusal goes at once, its record
/// saying the verdict was pending; the verdict, when it comes, is read by
/// nothing and sends no second answer.
#[test]
fn in_parallel_a_local_refusal_goes_at_once_and_the_verdict_adds_no_answer() {
    for flagged in [false, true] {
        let mut w = World::new(
            r#"{"guardrails":{"service":{"preset":"webhook","cluster":"hook","mode":"parallel"}},
                "limits":{"rules":[{"name":"t","by":["tenant"],"requests_per_minute":1}]},
                "access_log":{"enabled":true}}"#,
        );
        let mut first = chat("hello").with_header("authorization", "Bearer a");
        let (_first, step) = ask(&mut w, &mut first);
        assert_eq!(step, Step::Continue);
        let mut host = chat("hello").with_header("authorization", "Bearer a");
        let (mut call, step) = ask(&mut w, &mut host);
        assert_eq!(step, Step::Pause);
        assert_eq!(host.local_reply.as_ref().map(|r| r.0), Some(429));
        assert_eq!(
            host.request_headers
                .iter()
                .filter(|(k, _)| k == "x-llm-cluster")
                .count(),
            0
        );
        let v = verdict(200, serde_json::json!({"flagged": flagged}));
        assert_eq!(call.answer_callout(&mut w.env(), &mut host, v), Step::Pause);
        assert_eq!(host.replies, 1, "flagged: {flagged}");
        assert_eq!(host.local_reply.as_ref().map(|r| r.0), Some(429));
        assert_eq!(record(&host)["guardrails"], "service:pending");
        call.on_log(&mut w.env());
        let fired = w.counter(
            "llm_filter_guardrail_fired_totalrule=.=service;.;action=.=block;.;api=.=chat;.;",
        );
        assert_eq!(fired, 0, "flagged: {flagged}");
    }
}

/// Two OpenAI backends of `gpt-4o` and a service asked about answers.
fn two_backends(on_error: &str) -> World {
    World::new(&format!(
        r#"{{"routing":{{"eject_after_failures":100,"models":{{"gpt-4o":[
              {{"cluster":"a","provider":"openai","weight":1000000}},
              {{"cluster":"b","provider":"openai","weight":1}}]}}}},
            "guardrails":{{"service":{{"preset":"webhook","cluster":"hook","on":"answer",
              "on_error":"{on_error}"}}}},
            "access_log":{{"enabled":true}}}}"#
    ))
}

/// Another backend's answer after a failover is not sent to the service
/// (the reply would wait for a callout of its own): it is an answer
/// without a verdict, counted, and refused with `on_error: refuse`.
#[test]
fn another_backends_answer_falls_under_on_error() {
    for (on_error, status) in [("allow", 200), ("refuse", 502)] {
        let mut w = two_backends(on_error);
        let mut host = chat("hello");
        let mut call = start(&mut w, &mut host);
        assert_eq!(host.header("x-llm-cluster"), Some("a"));
        let mut host = host.with_response(
            503,
            "application/json",
            r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
        );
        assert_eq!(
            call.on_response_headers(&mut w.env(), &mut host, false),
            Step::Pause
        );
        assert_eq!(host.callouts.last().map(|c| c.0.as_str()), Some("b"));
        let ok = CalloutAnswer {
            status: Some(200),
            headers: vec![
                (":status".into(), "200".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: chat_answer("hi there").into_bytes(),
        };
        assert_eq!(
            call.answer_callout(&mut w.env(), &mut host, ok),
            Step::Pause
        );
        let (sent, _, body) = host.local_reply.clone().expect("answered");
        assert_eq!(sent, status, "{on_error}");
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        match on_error {
            "allow" => assert_eq!(body["choices"][0]["message"]["content"], "hi there"),
            _ => assert_eq!(body["error"]["code"], "llm_filter_guardrail_answer_blocked"),
        }
        let result = if on_error == "allow" {
            "allowed"
        } else {
            "refused"
        };
        let failures = w.counter(&format!(
            "llm_filter_guardrail_service_failures_totalrule=.=service;.;reason=.=failover;.;result=.={result};.;api=.=chat;.;"
        ));
        assert_eq!(failures, 1, "{on_error}");
        assert_eq!(host.callouts.len(), 1, "no callout to the service");
    }
}

/// The service comes before the cache: a prompt an entry answers is asked
/// about first, and a flagged one never gets the entry's answer.
#[test]
fn a_cache_hits_prompt_is_asked_about_before_the_entry_is_read() {
    let mut w = world(r#"{"preset":"webhook","cluster":"hook","timeout_ms":300}"#);
    let mut host = chat("hello");
    let (mut call, step) = ask(&mut w, &mut host);
    assert_eq!(step, Step::Pause);
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, pass),
        Step::Continue
    );
    answer_comes(&mut w, &mut call, &mut host);
    call.on_log(&mut w.env());
    // The same prompt: asked before anything reads the cache.
    let mut again = chat("hello");
    let (mut call, step) = ask(&mut w, &mut again);
    assert_eq!(step, Step::Pause, "waits for the verdict");
    assert!(again.local_reply.is_none(), "the entry is not read yet");
    assert_eq!(again.callouts.len(), 1);
    let flagged = verdict(200, serde_json::json!({"flagged": true}));
    call.answer_callout(&mut w.env(), &mut again, flagged);
    let (status, headers, _) = again.local_reply.clone().expect("refused");
    assert_eq!(status, 400);
    assert_ne!(headers.get("x-cache").map(String::as_str), Some("HIT"));
    // Passed, the entry answers.
    let mut third = chat("hello");
    let (mut call, _) = ask(&mut w, &mut third);
    let pass = verdict(200, serde_json::json!({"flagged": false}));
    call.answer_callout(&mut w.env(), &mut third, pass);
    let (status, headers, _) = third.local_reply.clone().expect("the hit");
    assert_eq!(
        (status, headers.get("x-cache").map(String::as_str)),
        (200, Some("HIT"))
    );
}

/// A released stream refused once its end came: the end's place takes the
/// dialect's error event, so the stream ends in its API's shape; one
/// refused before its end is reset.
#[test]
fn in_parallel_a_released_stream_refused_ends_with_the_error_event() {
    for end_came in [true, false] {
        let mut w = parallel_held("");
        let mut host = FakeHost::post("/v1/chat/completions").with_body(
            r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        );
        let (mut call, _) = ask(&mut w, &mut host);
        host.response_headers = vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "text/event-stream".into()),
        ];
        assert_eq!(
            call.on_response_headers(&mut w.env(), &mut host, false),
            Step::Pause
        );
        let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"}}]}\n\n";
        let events = event.repeat(40);
        host.response_body = events.as_bytes().to_vec();
        assert_eq!(
            call.on_response_body(&mut w.env(), &mut host, events.len(), false),
            Step::Continue,
            "released"
        );
        if end_came {
            host.response_body = b"data: [DONE]\n\n".to_vec();
            assert_eq!(
                call.on_response_body(&mut w.env(), &mut host, 14, true),
                Step::Pause
            );
        }
        let flagged = verdict(200, serde_json::json!({"flagged": true}));
        let step = call.answer_callout(&mut w.env(), &mut host, flagged);
        assert_eq!(host.reset, !end_came, "{end_came}");
        let cut = w.counter("llm_filter_guardrail_answer_cut_totalrule=.=service;.;api=.=chat;.;");
        assert_eq!(cut, 1, "{end_came}");
        if end_came {
            assert_eq!(step, Step::Continue, "the error event goes on");
            let sent = String::from_utf8_lossy(&host.response_body).to_string();
            assert!(sent.starts_with("data: {\"error\""), "{sent}");
            assert!(
                sent.contains("llm_filter_guardrail_answer_blocked"),
                "{sent}"
            );
            assert!(sent.contains("guardrail service `service`"), "{sent}");
            assert!(!sent.contains("[DONE]"), "{sent}");
        }
    }
}

/// A released stream whose final event comes before its end (an upstream
/// that ends the stream with an empty last frame): the final event is kept
/// back with the end, so a refusal cuts the stream before the client has
/// `[DONE]`, and a pass lets it go with the end, each byte once and in
/// order.
#[test]
fn in_parallel_a_released_streams_final_event_waits_for_the_verdict() {
    let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"}}]}\n\n";
    let events = event.repeat(40);
    for flagged in [true, false] {
        let mut w = parallel_held("");
        let mut host = FakeHost::post("/v1/chat/completions").with_body(
            r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        );
        let (mut call, _) = ask(&mut w, &mut host);
        host.response_headers = vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "text/event-stream".into()),
        ];
        call.on_response_headers(&mut w.env(), &mut host, false);
        let mut client = Vec::new();
        host.response_body = events.as_bytes().to_vec();
        let step = call.on_response_body(&mut w.env(), &mut host, events.len(), false);
        assert_eq!(step, Step::Continue, "released");
        client.extend_from_slice(&host.response_body);
        assert_eq!(
            client,
            event.repeat(39).as_bytes(),
            "the last event kept back"
        );
        // The final event, then the end in a frame of its own.
        host.response_body = b"data: [DONE]\n\n".to_vec();
        call.on_response_body(&mut w.env(), &mut host, 14, false);
        client.extend_from_slice(&host.response_body);
        assert!(
            !String::from_utf8_lossy(&client).contains("[DONE]"),
            "the final event waits"
        );
        host.response_body.clear();
        assert_eq!(
            call.on_response_body(&mut w.env(), &mut host, 0, true),
            Step::Pause
        );
        let answer = verdict(200, serde_json::json!({ "flagged": flagged }));
        call.answer_callout(&mut w.env(), &mut host, answer);
        client.extend_from_slice(&host.response_body);
        let client = String::from_utf8_lossy(&client).to_string();
        if flagged {
            assert!(!client.contains("[DONE]"), "{client}");
            assert!(client.ends_with("\n\n"), "{client}");
            assert!(
                client.contains("llm_filter_guardrail_answer_blocked"),
                "{client}"
            );
        } else {
            assert_eq!(client, format!("{events}data: [DONE]\n\n"));
            assert!(!host.reset);
        }
    }
}

#[test]
fn the_last_event_of_a_stream_starts_after_the_blank_line_before_it() {
    use super::super::guard_service::last_event_start as at;
    assert_eq!(at(b""), 0);
    assert_eq!(at(b"data: a"), 0);
    assert_eq!(at(b"data: a\n\n"), 0);
    assert_eq!(at(b"data: a\n\ndata: b\n\n"), 9);
    assert_eq!(at(b"data: a\n\ndata: b\n\ndata: c"), 9);
    assert_eq!(at(b"data: a\r\n\r\ndata: b\r\n\r\n"), 11);
}
