//! Guardrails through the real Envoy, with the official SDKs as clients: a
//! prompt carrying a secret is refused in each API's shape and nothing
//! reaches the provider; personal data reaches it masked, one placeholder
//! per value, and the cache keys the masked text; a log rule lets the call
//! through and names itself; a body the rules cannot read is refused; and
//! no planted value shows up in Envoy's log, its stats, the access log or
//! the spans.

use std::time::{Duration, Instant};

use llm_filter_e2e::{
    post_json, skip_without_envoy, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

use crate::support::sdk::{run, ANTHROPIC, OPENAI};
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
