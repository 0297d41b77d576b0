//! Guardrails through the real Envoy, with the official SDKs as clients: a
//! prompt carrying a secret is refused in each API's shape and nothing
//! reaches the provider; personal data reaches it masked, one placeholder
//! per value, and the cache keys the masked text; a log rule lets the call
//! through and names itself; a body the rules cannot read is refused; and
//! no planted value shows up in Envoy's log, its stats, the access log or
//! the spans.

use std::time::{Duration, Instant};

use llm_filter_e2e::{
    post_json, skip_without_envoy, Canned, Envoy, EnvoyBuilder, MockConfig, MockUpstream, Script,
};
use serde_json::{json, Value};

use crate::support::sdk::{run, ANTHROPIC, GENAI, OPENAI};
use crate::support::secrets::Outputs;

const KEY: &str = "sk-proj-PLANTEDguardrail7f3e9a1c5b";
const MAIL: &str = "planted.customer@example.com";
const CARD: &str = "4111 1111 1111 1111";

fn rules() -> Value {
    json!({"rules": [
        {"name": "no-secrets", "detect": ["secrets"], "action": "block"},
        {"name": "pii", "detect": ["email", "credit_card"], "action": "mask"},
        {"name": "codename", "words": ["project falcon"], "action": "log"}
    ]})
}

fn fired(e: &Envoy, rule: &str, action: &str, api: &str) -> f64 {
    e.metric(
        "llm_filter_guardrail_fired_total",
        &[("rule", rule), ("action", action), ("api", api)],
    )
}

/// What the mock received, every request as one line.
fn received(mock: &MockUpstream) -> String {
    mock.requests()
        .iter()
        .map(|r| {
            format!(
                "{} {:?} {}\n",
                r.path,
                r.headers,
                String::from_utf8_lossy(&r.body)
            )
        })
        .collect()
}

#[tokio::test]
async fn guardrails_block_mask_and_log_for_the_sdks_and_leak_nothing() {
    if skip_without_envoy("guardrails_block_mask_and_log_for_the_sdks_and_leak_nothing") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("guarded"));
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    // The mock first: Envoy's default route goes to the first upstream.
    let envoy = outputs
        .envoy(EnvoyBuilder::new().upstream("mock", mock.port()))
        .plugin_config(outputs.config(json!({"guardrails": rules()})))
        .component_log_level("wasm:debug")
        .start()
        .expect("envoy with guardrails");
    let openai = envoy.url("/v1");
    let anthropic = envoy.url("");

    // A key in the prompt: the OpenAI SDK raises BadRequestError, the
    // Anthropic SDK its own; nothing reached the provider.
    let out = run(
        OPENAI,
        "chat_error",
        &openai,
        &["--prompt", &format!("deploy with {KEY}")],
    )
    .await;
    assert_eq!(out["error_class"], "BadRequestError", "{out}");
    assert_eq!(out["status"], 400, "{out}");
    assert_eq!(out["code"], "llm_filter_guardrail_blocked", "{out}");
    assert!(
        out["message"].as_str().unwrap().contains("`no-secrets`"),
        "{out}"
    );
    let out = run(
        ANTHROPIC,
        "messages_error",
        &anthropic,
        &["--system", &format!("the key is {KEY}")],
    )
    .await;
    assert_eq!(out["error_class"], "BadRequestError", "{out}");
    assert_eq!(out["type"], "invalid_request_error", "{out}");
    assert_eq!(mock.request_count(), 0, "{}", received(&mock));
    assert_eq!(fired(&envoy, "no-secrets", "block", "chat"), 1.0);
    assert_eq!(fired(&envoy, "no-secrets", "block", "messages"), 1.0);

    // Personal data: masked before it leaves, the same value by the same
    // placeholder; the SDK gets its answer.
    let prompt = format!("write to {MAIL} (again: {MAIL}) about card {CARD}");
    let out = run(OPENAI, "chat", &openai, &["--prompt", &prompt]).await;
    assert!(out["content"].is_string(), "{out}");
    let sent = mock.requests().pop().unwrap().json().unwrap();
    assert_eq!(
        sent["messages"][0]["content"],
        "write to [EMAIL_1] (again: [EMAIL_1]) about card [CREDIT_CARD_2]",
        "{sent}"
    );
    let out = run(ANTHROPIC, "messages", &anthropic, &["--prompt", &prompt]).await;
    assert!(out.get("error_class").is_none_or(Value::is_null), "{out}");
    let sent = mock.requests().pop().unwrap().json().unwrap();
    assert_eq!(
        sent["messages"][0]["content"],
        "write to [EMAIL_1] (again: [EMAIL_1]) about card [CREDIT_CARD_2]",
        "{sent}"
    );
    assert_eq!(fired(&envoy, "pii", "mask", "chat"), 1.0);

    // A log rule: the call goes as sent, the rule named in the record.
    let out = run(
        OPENAI,
        "chat",
        &openai,
        &["--prompt", "status of Project Falcon"],
    )
    .await;
    assert!(out["content"].is_string(), "{out}");
    let sent = mock.requests().pop().unwrap().json().unwrap();
    assert_eq!(sent["messages"][0]["content"], "status of Project Falcon");
    assert_eq!(fired(&envoy, "codename", "log", "chat"), 1.0);

    // A body sent without a length streams through unread: refused.
    let before = mock.request_count();
    let r = raw_chunked(&envoy, &format!("key {KEY}")).await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    assert!(r.contains("llm_filter_guardrail_unchecked"), "{r}");
    assert_eq!(mock.request_count(), before, "nothing went on");
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_unchecked_total",
            &[
                ("reason", "not_held"),
                ("result", "refused"),
                ("api", "chat")
            ]
        ),
        1.0
    );

    // The record and the span name the rules, never what they found.
    let deadline = Instant::now() + Duration::from_secs(5);
    let records = loop {
        let text = outputs.records();
        if text.lines().count() >= 6 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        records.contains(r#""guardrails":"no-secrets:block""#),
        "{records}"
    );
    assert!(records.contains(r#""guardrails":"pii:mask""#), "{records}");
    assert!(
        records.contains(r#""guardrails":"codename:log""#),
        "{records}"
    );
    let span_deadline = Instant::now() + Duration::from_secs(5);
    while !outputs
        .spans()
        .iter()
        .any(|s| s["attributes"]["llm_filter.guardrails"] == "pii:mask")
    {
        assert!(
            Instant::now() < span_deadline,
            "no span names the mask rule"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let upstream = received(&mock);
    let planted = ["PLANTEDguardrail", "planted.customer", "4111 1111"];
    for p in planted {
        assert!(!upstream.contains(p), "{p} upstream");
    }
    outputs.assert_none_of(&envoy, &planted).await;
}

/// The Responses API (the openai SDK) and Gemini's (the google-genai SDK)
/// under the same rules: a secret in the prompt is each API's 400, the
/// SDK's typed error, and nothing reaches the provider; an e-mail reaches
/// it masked in Gemini's `contents`; no planted value shows anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_gemini_prompts_are_guarded_in_their_shapes() {
    if skip_without_envoy("responses_and_gemini_prompts_are_guarded_in_their_shapes") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("guarded"));
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let envoy = outputs
        .envoy(EnvoyBuilder::new().upstream("mock", mock.port()))
        .plugin_config(outputs.config(json!({"guardrails": rules()})))
        .start()
        .expect("envoy with guardrails");
    let secret = format!("deploy with {KEY}");
    let out = run(
        OPENAI,
        "responses_shed",
        &envoy.url("/v1"),
        &["--prompt", &secret, "--priority", "P1"],
    )
    .await;
    assert_eq!(out["error_class"], "BadRequestError", "{out}");
    assert_eq!(out["status"], 400, "{out}");
    assert_eq!(out["code"], "llm_filter_guardrail_blocked", "{out}");
    assert_eq!(out["attempts"].as_array().map(Vec::len), Some(1), "{out}");
    let base = envoy.url("");
    let base = base.trim_end_matches('/');
    let out = run(GENAI, "generate_error", base, &["--prompt", &secret]).await;
    assert_eq!(out["error_class"], "ClientError", "{out}");
    assert_eq!(out["code"], 400, "{out}");
    assert_eq!(out["status_name"], "INVALID_ARGUMENT", "{out}");
    assert!(
        out["message"]
            .as_str()
            .unwrap_or_default()
            .contains("`no-secrets`"),
        "{out}"
    );
    assert_eq!(mock.request_count(), 0, "{}", received(&mock));
    assert_eq!(fired(&envoy, "no-secrets", "block", "responses"), 1.0);
    assert_eq!(fired(&envoy, "no-secrets", "block", "gemini"), 1.0);

    // An e-mail in a Gemini prompt reaches the provider masked.
    let out = run(
        GENAI,
        "generate",
        base,
        &["--prompt", &format!("write to {MAIL}")],
    )
    .await;
    assert!(out["text"].is_string(), "{out}");
    let sent = received(&mock);
    assert!(!sent.contains(MAIL), "{sent}");
    let got = mock.requests().pop().expect("the Gemini call");
    assert!(got.path.ends_with(":generateContent"), "{}", got.path);
    let body = got.json().unwrap_or_default();
    let text = body["contents"][0]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with("write to ") && text.len() > "write to ".len(),
        "{sent}"
    );
    assert_eq!(fired(&envoy, "pii", "mask", "gemini"), 1.0);
    outputs.assert_none_of(&envoy, &[KEY, MAIL]).await;
}

/// A chat call sent with `transfer-encoding: chunked` (no length), the
/// answer's status line and body as text.
async fn raw_chunked(envoy: &Envoy, content: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body =
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": content}]}).to_string();
    let url = envoy.url("/v1/chat/completions");
    let authority = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut s = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

/// A body over `max_scan_bytes` with a rule that masks is refused unless
/// the operator allows it; allowed, it goes on unchecked and counted.
#[tokio::test]
async fn a_prompt_longer_than_the_rules_read_is_refused_or_let_through_by_the_operator() {
    if skip_without_envoy(
        "a_prompt_longer_than_the_rules_read_is_refused_or_let_through_by_the_operator",
    ) {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("long"));
    let long = format!("{} {MAIL}", "lorem ipsum ".repeat(200));
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": long}]});
    for (unchecked, status) in [("refuse", 400), ("allow", 200)] {
        let envoy = EnvoyBuilder::new()
            .plugin_config(json!({"guardrails": {
                "rules": [{"name": "pii", "detect": ["email"], "action": "mask"}],
                "max_scan_bytes": 1024, "unchecked": unchecked}}))
            .upstream("mock", mock.port())
            .start()
            .expect("envoy with guardrails");
        let r = post_json(&envoy.url("/v1/chat/completions"), &body, &[])
            .await
            .unwrap();
        assert_eq!(r.status, status, "{unchecked}: {}", r.text());
        let result = if status == 400 { "refused" } else { "allowed" };
        assert_eq!(
            envoy.metric(
                "llm_filter_guardrail_unchecked_total",
                &[("reason", "too_long"), ("result", result), ("api", "chat")]
            ),
            1.0,
            "{unchecked}"
        );
    }
    assert_eq!(mock.request_count(), 1, "only the allowed call went on");
}

/// Rules on the answer: keys blocked both ways, cards masked in answers,
/// addresses masked in prompts and put back in the answer.
fn answer_rules() -> Value {
    json!({"rules": [
        {"name": "no-secrets", "detect": ["secrets"], "action": "block", "on": "both"},
        {"name": "cards", "detect": ["credit_card"], "action": "mask", "on": "answer"},
        {"name": "pii", "detect": ["email"], "action": "mask", "restore": true}
    ]})
}

fn answer_fired(e: &Envoy, rule: &str, action: &str, api: &str) -> f64 {
    e.metric(
        "llm_filter_guardrail_answer_fired_total",
        &[("rule", rule), ("action", action), ("api", api)],
    )
}

/// The next answer of `mock` is `canned`.
pub(crate) fn answers(mock: &MockUpstream, canned: Canned) {
    mock.push_script(Script {
        answer: Some(canned),
        ..Script::default()
    });
}

pub(crate) fn chat_json(text: &str) -> Canned {
    Canned::Json(
        json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})
        .to_string(),
    )
}

pub(crate) fn messages_json(text: &str) -> Canned {
    Canned::Json(
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4",
               "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
               "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 3}})
        .to_string(),
    )
}

/// A chat stream whose text comes in `pieces`, one event each.
fn chat_sse(pieces: &[&str]) -> Canned {
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                       "model": "gpt-4o",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    events.extend(
        pieces
            .iter()
            .map(|p| chunk(json!({"content": p}), Value::Null)),
    );
    events.push(chunk(json!({}), json!("stop")));
    events.push("data: [DONE]\n\n".to_string());
    Canned::Sse(events)
}

/// A Messages stream whose text comes in `pieces`, one event each.
fn messages_sse(pieces: &[&str]) -> Canned {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                   "role": "assistant", "model": "claude-sonnet-4", "content": [],
                   "stop_reason": null, "stop_sequence": null,
                   "usage": {"input_tokens": 3, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    events.extend(pieces.iter().map(|p| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": p}}),
        )
    }));
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
               "usage": {"output_tokens": 3}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    Canned::Sse(events)
}

/// A Responses stream whose text comes in `pieces`, its final response
/// saying `text`.
fn responses_sse(pieces: &[&str], text: &str) -> Canned {
    let event = |data: Value| {
        format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap()
        )
    };
    let response = json!({"id": "resp_1", "object": "response", "status": "completed",
        "model": "gpt-4o", "output": [
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": 3, "output_tokens": 3, "total_tokens": 6}});
    let mut events = vec![event(
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
    )];
    events.extend(pieces.iter().map(|p| {
        event(
            json!({"type": "response.output_text.delta", "item_id": "msg_1",
                     "output_index": 0, "content_index": 0, "delta": p}),
        )
    }));
    events.push(event(
        json!({"type": "response.completed", "response": response}),
    ));
    Canned::Sse(events)
}

const OTHER: &str = "another.caller@example.org";

#[tokio::test]
async fn guardrails_check_answers_json_and_streamed_restore_masked_values_and_leak_nothing() {
    if skip_without_envoy(
        "guardrails_check_answers_json_and_streamed_restore_masked_values_and_leak_nothing",
    ) {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("answers"));
    mock.set_chunk_delay_ms(20);
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let envoy = outputs
        .envoy(EnvoyBuilder::new().upstream("mock", mock.port()))
        .plugin_config(
            outputs.config(json!({"guardrails": answer_rules(), "cache": {"enabled": true}})),
        )
        .component_log_level("wasm:debug")
        .start()
        .expect("envoy with guardrails on answers");
    let openai = envoy.url("/v1");
    let anthropic = envoy.url("");
    let (key_head, key_tail) = KEY.split_at(15);

    // A key in a JSON answer: a 502 the OpenAI SDK raises as its
    // InternalServerError, not retried; the key never reaches the client.
    answers(&mock, chat_json(&format!("the key is {KEY}")));
    let out = run(
        OPENAI,
        "chat_error",
        &openai,
        &["--prompt", "what is the key?", "--max-retries", "2"],
    )
    .await;
    assert_eq!(out["status"], 502, "{out}");
    assert_eq!(out["error_class"], "InternalServerError", "{out}");
    assert_eq!(out["code"], "llm_filter_guardrail_answer_blocked", "{out}");
    assert!(
        out["message"].as_str().unwrap().contains("`no-secrets`"),
        "{out}"
    );
    assert!(!out.to_string().contains("PLANTED"), "{out}");
    assert_eq!(mock.request_count(), 1, "the SDK did not retry");
    assert_eq!(answer_fired(&envoy, "no-secrets", "block", "chat"), 1.0);

    // A card in a JSON Messages answer: masked.
    answers(&mock, messages_json(&format!("card {CARD} noted")));
    let out = run(ANTHROPIC, "messages", &anthropic, &["--prompt", "card?"]).await;
    assert_eq!(out["text"], "card [CREDIT_CARD_1] noted", "{out}");

    // A key cut across a chat stream's events: the stream ends with the
    // error chunk the OpenAI SDK raises as APIError; none of the key came.
    answers(&mock, chat_sse(&["the key is ", key_head, key_tail, " ok"]));
    let out = run(
        OPENAI,
        "stream_error",
        &openai,
        &["--prompt", "stream the key"],
    )
    .await;
    assert_eq!(out["error_class"], "APIError", "{out}");
    assert!(
        out["message"].as_str().unwrap().contains("`no-secrets`"),
        "{out}"
    );
    assert_eq!(out["content"], "the key is ", "{out}");
    assert!(!out.to_string().contains("PLANTED"), "{out}");
    // And a Messages stream ends with `event: error`, the SDK's APIStatusError.
    answers(&mock, messages_sse(&["key: ", key_head, key_tail]));
    let out = run(
        ANTHROPIC,
        "messages_stream_error",
        &anthropic,
        &["--prompt", "key?"],
    )
    .await;
    assert_eq!(out["error_class"], "APIStatusError", "{out}");
    assert!(!out.to_string().contains("PLANTED"), "{out}");
    assert_eq!(answer_fired(&envoy, "no-secrets", "block", "messages"), 1.0);

    // A card cut across a Messages stream's events: masked whole.
    answers(
        &mock,
        messages_sse(&["pay with 4111 1111 ", "1111 1111", " today"]),
    );
    let out = run(
        ANTHROPIC,
        "messages_stream",
        &anthropic,
        &["--prompt", "pay?"],
    )
    .await;
    assert_eq!(out["text"], "pay with [CREDIT_CARD_1] today", "{out}");
    assert_eq!(out["final_text"], "pay with [CREDIT_CARD_1] today", "{out}");
    assert_eq!(answer_fired(&envoy, "cards", "mask", "messages"), 2.0);

    // A Responses stream: the deltas and the final response alike.
    let card_text = format!("pay with {CARD} today");
    answers(
        &mock,
        responses_sse(&["pay with 4111 ", "1111 1111", " 1111 today"], &card_text),
    );
    let out = run(OPENAI, "responses_stream", &openai, &["--prompt", "pay?"]).await;
    assert_eq!(out["text"], "pay with [CREDIT_CARD_1] today", "{out}");
    assert_eq!(
        out["output_text"], "pay with [CREDIT_CARD_1] today",
        "{out}"
    );

    // Restore: the upstream sees the placeholder and echoes it; the client
    // reads its own address. JSON (the mock's echo), then a stream with the
    // placeholder cut across events.
    let out = run(
        OPENAI,
        "chat",
        &openai,
        &["--prompt", &format!("write to {MAIL}")],
    )
    .await;
    assert_eq!(
        out["content"],
        format!("echo: write to {MAIL} [answers]"),
        "{out}"
    );
    answers(&mock, chat_sse(&["sent to [EMA", "IL_1", "] ok"]));
    let out = run(
        OPENAI,
        "stream_error",
        &openai,
        &["--prompt", &format!("mail {MAIL}")],
    )
    .await;
    assert_eq!(out["error_class"], Value::Null, "{out}");
    assert_eq!(out["content"], format!("sent to {MAIL} ok"), "{out}");

    // A cache hit restores with the caller's own values: the same masked
    // prompt, another address.
    let ask = |mail: &str| format!("remember {mail} for later");
    let max_age = "cache-control:max-age=60";
    let first = run(
        OPENAI,
        "chat",
        &openai,
        &["--prompt", &ask(MAIL), "--header", max_age],
    )
    .await;
    assert_eq!(
        first["content"],
        format!("echo: {} [answers]", ask(MAIL)),
        "{first}"
    );
    let before = mock.request_count();
    let hit = run(
        OPENAI,
        "chat",
        &openai,
        &["--prompt", &ask(OTHER), "--header", max_age],
    )
    .await;
    assert_eq!(mock.request_count(), before, "served from the cache");
    assert_eq!(
        hit["content"],
        format!("echo: {} [answers]", ask(OTHER)),
        "{hit}"
    );

    // The upstream never saw an address; nothing planted shows anywhere.
    let upstream = received(&mock);
    for p in [MAIL, OTHER] {
        assert!(!upstream.contains(p), "{p} upstream");
    }
    let records = outputs.records();
    assert!(records.contains("no-secrets:block:answer"), "{records}");
    outputs
        .assert_none_of(&envoy, &["PLANTEDguardrail", "4111 1111", MAIL, OTHER])
        .await;
}

const PHONE: &str = "+14155550123";
const ANSWER_PHONE: &str = "+442071838750";

/// Capture on (prompt and completion, in the span and the record): what a
/// rule that masks or blocks withholds is in neither, though capture's own
/// rules let phone numbers and words be — a phone number masked in the
/// prompt and put back for the client, one masked in an answer (JSON and
/// streamed), an answer refused for a codename.
#[tokio::test]
async fn capture_keeps_nothing_the_guardrails_withhold() {
    if skip_without_envoy("capture_keeps_nothing_the_guardrails_withhold") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("captured"));
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let mut config = outputs.config(json!({"guardrails": {"rules": [
        {"name": "phones", "detect": ["phone"], "action": "mask", "on": "both", "restore": true},
        {"name": "codename", "words": ["project falcon"], "action": "block", "on": "answer"}
    ]}}));
    config["tracing"]["capture"] = json!({"prompt": true, "completion": true});
    let envoy = outputs
        .envoy(EnvoyBuilder::new().upstream("mock", mock.port()))
        .plugin_config(config)
        .component_log_level("wasm:debug")
        .start()
        .expect("envoy with guardrails and capture");
    let openai = envoy.url("/v1");

    // JSON: the client reads its own number back and the answer's masked.
    answers(
        &mock,
        chat_json(&format!("I will call [PHONE_1] or {ANSWER_PHONE}.")),
    );
    let prompt = format!("call me at {PHONE}");
    let out = run(OPENAI, "chat", &openai, &["--prompt", &prompt]).await;
    assert_eq!(
        out["content"],
        format!("I will call {PHONE} or [PHONE_2]."),
        "{out}"
    );
    // Streamed, the number cut across events.
    answers(
        &mock,
        chat_sse(&["ring [PHONE_1] or +4420", "71838750", " today"]),
    );
    let out = run(OPENAI, "stream_error", &openai, &["--prompt", &prompt]).await;
    assert_eq!(
        out["content"],
        format!("ring {PHONE} or [PHONE_2] today"),
        "{out}"
    );
    // Refused for what it says: a 502, and not captured either.
    answers(&mock, chat_json("Project Falcon ships Monday."));
    let out = run(OPENAI, "chat_error", &openai, &["--prompt", "plans?"]).await;
    assert_eq!(out["status"], 502, "{out}");

    // The captures are there, placeholders and all.
    let deadline = Instant::now() + Duration::from_secs(5);
    let records = loop {
        let text = outputs.records();
        if text.lines().count() >= 3 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(records.contains("output_messages"), "{records}");
    assert!(records.contains("call me at [PHONE_1]"), "{records}");
    assert!(
        records.contains("I will call [PHONE_1] or [REDACTED]"),
        "{records}"
    );
    let span_deadline = Instant::now() + Duration::from_secs(5);
    while !outputs.spans().iter().any(|s| {
        s["attributes"]["gen_ai.output.messages"]
            .as_str()
            .is_some_and(|m| m.contains("ring [PHONE_1]"))
    }) {
        assert!(
            Instant::now() < span_deadline,
            "no span captured the stream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let upstream = received(&mock);
    assert!(!upstream.contains(PHONE), "the provider saw the number");
    outputs
        .assert_none_of(
            &envoy,
            &[
                PHONE,
                ANSWER_PHONE,
                "4155550123",
                "2071838750",
                "Project Falcon",
                "Falcon ships",
            ],
        )
        .await;
}
