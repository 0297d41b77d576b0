//! Scenario tests of the guard step: a prompt a rule blocks is refused in
//! its API's shape before anything is spent or sent; a masked prompt goes
//! on masked, and the cache keys the masked text; a body the rules cannot
//! read is refused unless the operator lets it through; nothing found ever
//! reaches the reply, a label or the record.

use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","created":7,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
const KEY: &str = "sk-proj-PLANTEDguard0123456789";
const MAIL: &str = "planted.person@example.com";

fn world(extra: &str) -> World {
    World::new(&format!(
        r#"{{"guardrails":{{"rules":[
              {{"name":"no-secrets","detect":["secrets"],"action":"block"}},
              {{"name":"pii","detect":["email","credit_card"],"action":"mask"}},
              {{"name":"codename","words":["project falcon"],"action":"log"}}]{extra}}},
            "cache":{{"max_entries":8}},
            "access_log":{{"enabled":true}}}}"#
    ))
}

/// Runs a call to its end; the step its request took.
fn run(w: &mut World, host: &mut FakeHost) -> Step {
    let (mut call, step) = Call::start(&mut w.env(), host, false).unwrap();
    if step == Step::Pause && host.local_reply.is_some() {
        call.on_log(&mut w.env());
        return step;
    }
    let step = if step == Step::Pause {
        let size = host.request_body.len();
        call.on_request_body(&mut w.env(), host, size, true)
    } else {
        step
    };
    if step == Step::Continue {
        let mut answered = host.clone().with_response(200, "application/json", ANSWER);
        call.on_response_headers(&mut w.env(), &mut answered, false);
        answered.response_body = ANSWER.as_bytes().to_vec();
        call.on_response_body(&mut w.env(), &mut answered, ANSWER.len(), true);
        *host = answered;
    }
    call.on_log(&mut w.env());
    step
}

fn chat(content: &str) -> FakeHost {
    let body = serde_json::json!({"model": "gpt-4o", "temperature": 0,
        "messages": [{"role": "user", "content": content}]});
    FakeHost::post("/v1/chat/completions").with_body(&body.to_string())
}

fn record(host: &FakeHost) -> serde_json::Value {
    serde_json::from_slice(&host.properties["llm_filter.call"]).unwrap()
}

fn fired(w: &World, rule: &str, action: &str) -> u64 {
    w.counter(&format!(
        "llm_filter_guardrail_fired_totalrule=.={rule};.;action=.={action};.;api=.=chat;.;"
    ))
}

#[test]
fn a_secret_in_the_prompt_is_refused_in_the_callers_shape() {
    let mut w = world("");
    let mut host = chat(&format!("deploy with {KEY}"));
    assert_eq!(run(&mut w, &mut host), Step::Pause);
    let (status, _, body) = host.local_reply.clone().expect("refused");
    assert_eq!(status, 400);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "llm_filter_guardrail_blocked");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`no-secrets`"));
    assert!(!body.to_string().contains("PLANTED"), "{body}");
    assert_eq!(fired(&w, "no-secrets", "block"), 1);
    assert_eq!(record(&host)["guardrails"], "no-secrets:block");
    assert!(!String::from_utf8_lossy(&host.properties["llm_filter.call"]).contains("PLANTED"));
}

#[test]
fn a_messages_call_is_refused_in_anthropics_shape() {
    let mut w = world("");
    let body = serde_json::json!({"model": "claude", "max_tokens": 8,
        "system": format!("key {KEY}"), "messages": [{"role": "user", "content": "hi"}]});
    let mut host = FakeHost::post("/v1/messages").with_body(&body.to_string());
    assert_eq!(run(&mut w, &mut host), Step::Pause);
    let (status, _, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 400);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

#[test]
fn personal_data_is_masked_before_the_call_leaves_and_the_cache_keys_the_masked_text() {
    let mut w = world("");
    let mut host = chat(&format!(
        "mail {MAIL} twice: {MAIL}, card 4111 1111 1111 1111"
    ));
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    let sent = String::from_utf8(host.request_body.clone()).unwrap();
    assert!(
        sent.contains("mail [EMAIL_1] twice: [EMAIL_1], card [CREDIT_CARD_2]"),
        "{sent}"
    );
    assert!(
        !sent.contains("example.com") && !sent.contains("4111"),
        "{sent}"
    );
    assert_eq!(fired(&w, "pii", "mask"), 1);
    assert_eq!(record(&host)["guardrails"], "pii:mask");
    // Another address masks to the same text: the same cache entry.
    let mut again =
        chat("mail other@example.org twice: other@example.org, card 4111 1111 1111 1111");
    assert_eq!(run(&mut w, &mut again), Step::Pause);
    let (_, headers, _) = again.local_reply.clone().expect("served from the cache");
    assert_eq!(headers["x-cache"], "HIT");
}

#[test]
fn a_log_rule_only_counts() {
    let mut w = world("");
    let mut host = chat("about Project Falcon");
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    assert!(String::from_utf8_lossy(&host.request_body).contains("Project Falcon"));
    assert_eq!(fired(&w, "codename", "log"), 1);
    assert_eq!(record(&host)["guardrails"], "codename:log");
}

#[test]
fn a_body_the_rules_cannot_read_is_refused_unless_allowed() {
    let unchecked = |w: &World, reason: &str, result: &str| {
        w.counter(&format!(
            "llm_filter_guardrail_unchecked_totalreason=.={reason};.;result=.={result};.;api=.=chat;.;"
        ))
    };
    // No content-length: the body streams through, unread.
    let mut w = world("");
    let mut host = chat(&format!("key {KEY}"));
    host.request_headers.retain(|(k, _)| k != "content-length");
    assert_eq!(run(&mut w, &mut host), Step::Pause);
    let (status, _, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("llm_filter_guardrail_unchecked"));
    assert_eq!(unchecked(&w, "not_held", "refused"), 1);
    // Not JSON.
    let mut host = FakeHost::post("/v1/chat/completions").with_body("not json");
    assert_eq!(run(&mut w, &mut host), Step::Pause);
    assert_eq!(unchecked(&w, "not_json", "refused"), 1);
    // Allowed through when the operator says so, and counted.
    let mut w = world(r#","unchecked":"allow""#);
    let mut host = chat("hello");
    host.request_headers.retain(|(k, _)| k != "content-length");
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    assert_eq!(host.local_reply, None);
    assert_eq!(unchecked(&w, "not_held", "allowed"), 1);
}

#[test]
fn without_rules_nothing_is_read() {
    let mut w = World::new("{}");
    let mut host = chat(&format!("deploy with {KEY}"));
    host.request_headers.retain(|(k, _)| k != "content-length");
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    assert_eq!(host.local_reply, None);
}

#[test]
fn every_dialects_prompt_is_read_where_it_keeps_it() {
    let mut w = world("");
    // Gemini: the contents' parts and the system instruction.
    let body = serde_json::json!({
        "systemInstruction": {"parts": [{"text": format!("reply to {MAIL}")}]},
        "contents": [{"role": "user", "parts": [{"text": format!("and cc {MAIL}")}]}]});
    let mut host = FakeHost::post("/v1beta/models/gemini-2.5-flash:generateContent")
        .with_body(&body.to_string());
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(
        sent["systemInstruction"]["parts"][0]["text"],
        "reply to [EMAIL_1]"
    );
    assert_eq!(sent["contents"][0]["parts"][0]["text"], "and cc [EMAIL_1]");
    // Embeddings: the input.
    let body = serde_json::json!({"model": "e", "input": ["x", format!("key {KEY}")]});
    let mut host = FakeHost::post("/v1/embeddings").with_body(&body.to_string());
    assert_eq!(run(&mut w, &mut host), Step::Pause);
    assert_eq!(host.local_reply.as_ref().unwrap().0, 400);
    // Responses: instructions and input items.
    let body = serde_json::json!({"model": "gpt-4o", "instructions": format!("sign as {MAIL}"),
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]});
    let mut host = FakeHost::post("/v1/responses").with_body(&body.to_string());
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["instructions"], "sign as [EMAIL_1]");
}

/// Runs a call to its end, the upstream answering `answer` (JSON); the
/// step the response's headers took.
fn run_answering(w: &mut World, host: &mut FakeHost, answer: &str) -> Option<Step> {
    let (mut call, step) = Call::start(&mut w.env(), host, false).unwrap();
    let step = match step {
        Step::Pause if host.local_reply.is_none() => {
            let size = host.request_body.len();
            call.on_request_body(&mut w.env(), host, size, true)
        }
        step => step,
    };
    let mut headers_step = None;
    if step == Step::Continue && host.local_reply.is_none() {
        let mut answered = host
            .clone()
            .with_response(200, "application/json", answer)
            .with_response_header("content-length", &answer.len().to_string());
        headers_step = Some(call.on_response_headers(&mut w.env(), &mut answered, false));
        answered.response_body = answer.as_bytes().to_vec();
        call.on_response_body(&mut w.env(), &mut answered, answer.len(), true);
        *host = answered;
    }
    call.on_log(&mut w.env());
    headers_step
}

fn answer_saying(text: &str) -> String {
    serde_json::json!({"id": "x", "object": "chat.completion", "created": 7, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    .to_string()
}

#[test]
fn an_answer_a_rule_blocks_is_a_502_in_the_callers_shape_and_never_stored() {
    let mut w = World::new(
        r#"{"guardrails":{"rules":[{"name":"no-keys","detect":["secrets"],"on":"answer"}]},
            "cache":{"max_entries":8},"access_log":{"enabled":true}}"#,
    );
    let leak = answer_saying(&format!("the key is {KEY}"));
    let mut host = chat("what is the key?").with_header("accept-encoding", "gzip");
    assert_eq!(
        run_answering(&mut w, &mut host, &leak),
        Some(Step::Pause),
        "held"
    );
    assert_eq!(
        host.header("accept-encoding"),
        None,
        "the answer comes uncompressed"
    );
    assert_eq!(host.response(":status"), Some("502"));
    assert_eq!(host.response("content-length"), None);
    assert_eq!(host.response("x-should-retry"), Some("false"));
    let body: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(body["error"]["code"], "llm_filter_guardrail_answer_blocked");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`no-keys`"));
    assert!(!String::from_utf8_lossy(&host.response_body).contains("PLANTED"));
    assert_eq!(record(&host)["guardrails"], "no-keys:block:answer");
    assert_eq!(
        w.counter("llm_filter_guardrail_answer_fired_totalrule=.=no-keys;.;action=.=block;.;api=.=chat;.;"),
        1
    );
    // Not stored: the same call goes upstream again.
    let mut again = chat("what is the key?");
    assert!(run_answering(&mut w, &mut again, &answer_saying("fine")).is_some());
    assert_eq!(again.response("x-cache"), Some("MISS"));
    assert!(String::from_utf8_lossy(&again.response_body).contains("fine"));
}

#[test]
fn a_masked_prompts_values_are_put_back_in_the_answer_and_a_hit_restores_the_callers_own() {
    let mut w = World::new(
        r#"{"guardrails":{"rules":[{"name":"pii","detect":["email"],"action":"mask","restore":true}]},
            "cache":{"max_entries":8},"access_log":{"enabled":true}}"#,
    );
    let mut host = chat(&format!("write to {MAIL}"));
    // The upstream saw the placeholder and echoes it.
    run_answering(&mut w, &mut host, &answer_saying("I wrote to [EMAIL_1]."));
    let sent = String::from_utf8(host.request_body.clone()).unwrap();
    assert!(
        sent.contains("write to [EMAIL_1]") && !sent.contains(MAIL),
        "{sent}"
    );
    let got: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(
        got["choices"][0]["message"]["content"],
        format!("I wrote to {MAIL}.")
    );
    assert_eq!(host.response("content-length"), None);
    // Another caller's address masks to the same prompt: a hit, restored
    // with that caller's own value.
    let mut other = chat("write to other.person@example.org");
    run_answering(&mut w, &mut other, "{}");
    let (_, headers, body) = other.local_reply.clone().expect("a hit");
    assert_eq!(headers["x-cache"], "HIT");
    let body = String::from_utf8(body).unwrap();
    assert!(
        body.contains("I wrote to other.person@example.org."),
        "{body}"
    );
    assert!(!body.contains(MAIL), "{body}");
}

/// The guard step makes no host call of its own on a clean prompt: it reads
/// the body the walk already holds and parsed, writes nothing back, reads
/// no header and counts nothing; a rule on answers adds only the removal
/// of the request's `accept-encoding` (an answer must come uncompressed to
/// be read), which the cache removes too.
#[test]
fn a_clean_prompt_costs_no_host_call_of_its_own() {
    let text = "Summarise the release notes of 3.15.2 (2024-06-10) in three lines. ".repeat(30);
    let plain = r#"{"cache":{"max_entries":8},"access_log":{"enabled":true}}"#;
    let rules = |on: &str| {
        format!(
            r#"{{"guardrails":{{"rules":[
              {{"name":"no-secrets","detect":["secrets"],"action":"block","on":"{on}"}},
              {{"name":"pii","detect":["personal"],"action":"mask","on":"{on}"}}]}},
            "cache":{{"max_entries":8}},"access_log":{{"enabled":true}}}}"#
        )
    };
    let mut seen = Vec::new();
    for config in [plain.to_string(), rules("prompt"), rules("both")] {
        let mut w = World::new(&config);
        let mut host = chat(&text).with_header("accept-encoding", "gzip");
        assert_eq!(run(&mut w, &mut host), Step::Continue);
        let mut metrics: Vec<String> = w.metrics.counters.keys().cloned().collect();
        metrics.sort();
        seen.push((
            host.body_reads.get(),
            host.body_writes,
            host.header_reads.borrow().clone(),
            host.request_headers.clone(),
            metrics,
        ));
    }
    let (unguarded, prompt, both) = (&seen[0], &seen[1], &seen[2]);
    assert_eq!(unguarded, prompt);
    assert_eq!(prompt.1, 0, "nothing written back");
    // On answers too (the cache removes `accept-encoding` as well).
    assert_eq!(both, prompt);
    assert!(!both.3.iter().any(|(n, _)| n == "accept-encoding"));
}

/// Capture never keeps what a rule that blocks or masks withholds: a value
/// masked in the answer (a phone number, which capture's own rules let
/// be), an answer refused for a codename, a prompt's value the client gets
/// restored. Both the record's prompt and its completion are checked.
#[test]
fn capture_keeps_nothing_a_rule_withholds_from_the_provider_or_the_client() {
    const PHONE: &str = "+14155550123";
    const OTHER_PHONE: &str = "+442071838750";
    let mut w = World::new(
        r#"{"guardrails":{"rules":[
              {"name":"phones","detect":["phone"],"action":"mask","on":"both","restore":true},
              {"name":"codename","words":["project falcon"],"action":"block","on":"answer"},
              {"name":"noted","words":["bluebird"],"action":"log","on":"both"}]},
            "tracing":{"capture":{"prompt":true,"completion":true}},
            "access_log":{"enabled":true}}"#,
    );
    let captured = |host: &FakeHost| {
        let r = record(host);
        format!("{} {}", r["input_messages"], r["output_messages"])
    };
    // Masked in the prompt, restored for the client, masked in the answer.
    let mut host = chat(&format!("call me at {PHONE} about bluebird"));
    let said = format!("I will call [PHONE_1] or {OTHER_PHONE} about bluebird.");
    run_answering(&mut w, &mut host, &answer_saying(&said));
    let got: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(
        got["choices"][0]["message"]["content"],
        format!("I will call {PHONE} or [PHONE_2] about bluebird.")
    );
    let kept = captured(&host);
    assert!(kept.contains("[PHONE_1]"), "{kept}");
    assert!(
        kept.contains("bluebird"),
        "a log rule withholds nothing: {kept}"
    );
    for planted in [PHONE, OTHER_PHONE, "4155550123", "2071838750"] {
        assert!(!kept.contains(planted), "{planted} captured: {kept}");
    }
    // An answer refused for what it said: not captured either.
    let mut host = chat("what is the plan?");
    run_answering(
        &mut w,
        &mut host,
        &answer_saying("Project Falcon ships Monday."),
    );
    assert_eq!(host.response(":status"), Some("502"));
    let kept = captured(&host);
    assert!(!kept.to_lowercase().contains("falcon"), "{kept}");
}

/// A rule scoped to priorities and models applies to those calls only:
/// the priority the call was given, the model it asks for.
#[test]
fn a_scoped_rule_applies_to_its_priorities_and_models_only() {
    let mut w = World::new(
        r#"{"guardrails":{"rules":[
              {"name":"batch-secrets","detect":["secrets"],"priorities":["P2"]},
              {"name":"mini-pii","detect":["email"],"action":"mask","models":["gpt-4o-mini*"]}]},
            "access_log":{"enabled":true}}"#,
    );
    let prompt = format!("deploy with {KEY}, mail {MAIL}");
    let call = |model: &str, priority: &str| {
        let body = serde_json::json!({"model": model,
            "messages": [{"role": "user", "content": prompt}]});
        FakeHost::post("/v1/chat/completions")
            .with_header("x-request-priority", priority)
            .with_body(&body.to_string())
    };
    let mut host = call("gpt-4o", "P2");
    assert_eq!(run(&mut w, &mut host), Step::Pause);
    assert_eq!(host.local_reply.as_ref().map(|r| r.0), Some(400));
    let mut host = call("gpt-4o", "P1");
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    let sent = String::from_utf8(host.request_body.clone()).unwrap();
    assert!(sent.contains(KEY) && sent.contains(MAIL), "{sent}");
    let mut host = call("gpt-4o-mini-2024-07-18", "P1");
    assert_eq!(run(&mut w, &mut host), Step::Continue);
    let sent = String::from_utf8(host.request_body.clone()).unwrap();
    assert!(sent.contains("[EMAIL_1]") && !sent.contains(MAIL), "{sent}");
    assert_eq!(record(&host)["guardrails"], "mini-pii:mask");
}
