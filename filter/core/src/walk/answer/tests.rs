use proptest::prelude::*;

use super::*;
use crate::config::error::ConfigError;
use crate::dialect::Dialect;

fn rules(json: &str) -> Guardrails {
    let raw = ConfigError::from_json(format!(r#"{{"rules":{json}}}"#).as_bytes()).unwrap();
    Guardrails::compile(raw).unwrap()
}

const KEY: &str = "sk-proj-PLANTED0123456789abcdef";

/// A chat stream whose text is `deltas`, one chunk each.
fn chat_stream(deltas: &[&str]) -> String {
    let mut s = String::from(
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    );
    for d in deltas {
        let chunk =
            serde_json::json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": d}}]});
        s.push_str(&format!("data: {chunk}\n\n"));
    }
    s.push_str("data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    s.push_str("data: [DONE]\n\n");
    s
}

/// An Anthropic stream whose text is `deltas`.
fn messages_stream(deltas: &[&str]) -> String {
    let mut s = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
    for d in deltas {
        let e = serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}});
        s.push_str(&format!("event: content_block_delta\ndata: {e}\n\n"));
    }
    s.push_str(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s
}

/// The stream `body` cut at `cuts` through one check: what the client got.
fn check(
    g: &Guardrails,
    d: Dialect,
    vault: &mut Vault,
    body: &str,
    cuts: &[usize],
) -> (String, bool) {
    let mut guard = AnswerGuard::new(true);
    let mut out = Vec::new();
    let mut at = 0;
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    ends.sort_unstable();
    ends.push(body.len());
    for (i, end) in ends.iter().enumerate() {
        let piece = &body.as_bytes()[at..*end.max(&at)];
        at = *end.max(&at);
        let last = i + 1 == ends.len();
        match guard.check_stream(g, d.answer(), vault, piece, last) {
            Some(b) => out.extend_from_slice(&b),
            None => out.extend_from_slice(piece),
        }
    }
    (String::from_utf8(out).unwrap(), guard.blocked)
}

/// The text a client reads out of a chat or Messages stream.
fn text_of(stream: &str) -> String {
    let mut text = String::new();
    for line in stream.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(t) = v["delta"]["text"].as_str() {
            text.push_str(t);
        }
    }
    text
}

#[test]
fn a_chat_stream_has_a_secret_cut_across_chunks_masked() {
    let g = rules(r#"[{"name":"s","detect":["secrets"],"action":"mask","on":"answer"}]"#);
    let body = chat_stream(&["the key is sk-proj-PLAN", "TED0123456789abcdef", " ok"]);
    let (out, blocked) = check(&g, Dialect::Chat, &mut Vault::new(), &body, &[]);
    assert!(!blocked);
    assert!(!out.contains("PLANT"), "{out}");
    assert_eq!(text_of(&out), "the key is [OPENAI_KEY_1] ok");
    assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
}

#[test]
fn a_blocked_stream_ends_with_the_dialects_error_event() {
    let g = rules(r#"[{"name":"no-keys","detect":["secrets"],"on":"answer"}]"#);
    let body = chat_stream(&["here: sk-proj-PLAN", "TED0123456789abcdef", " ok"]);
    let (out, blocked) = check(&g, Dialect::Chat, &mut Vault::new(), &body, &[]);
    assert!(blocked);
    assert!(!out.contains("PLANT"), "{out}");
    let last = out.trim_end().lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "llm_filter_guardrail_answer_blocked");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`no-keys`"));
    assert!(!out.contains("[DONE]"));

    let body = messages_stream(&["here: sk-proj-PLAN", "TED0123456789abcdef"]);
    let (out, blocked) = check(&g, Dialect::Messages, &mut Vault::new(), &body, &[]);
    assert!(blocked && !out.contains("PLANT"), "{out}");
    assert!(
        out.contains("event: error\ndata: {\"type\":\"error\",\"error\":{"),
        "{out}"
    );
    assert!(!out.contains("message_stop"));
}

#[test]
fn a_stream_has_the_callers_values_put_back() {
    let g = rules(r#"[{"name":"pii","detect":["email"],"action":"mask","restore":true}]"#);
    let mut vault = Vault::new();
    let tree = Json::parse(br#"{"input":"mail ann@example.com"}"#).unwrap();
    g.check(&tree, &["input"], &mut vault);
    let body = messages_stream(&["I wrote to [EM", "AIL_", "1] today"]);
    let (out, _) = check(&g, Dialect::Messages, &mut vault, &body, &[7, 300, 301]);
    assert_eq!(text_of(&out), "I wrote to ann@example.com today");
    assert!(out.contains("content_block_stop"));
}

#[test]
fn a_json_answer_is_masked_restored_or_blocked() {
    let g = rules(
        r#"[{"name":"pii","detect":["email"],"action":"mask","restore":true},
            {"name":"cards","detect":["credit_card"],"action":"mask","on":"answer"},
            {"name":"keys","detect":["secrets"],"on":"answer"}]"#,
    );
    let mut vault = Vault::new();
    let tree = Json::parse(br#"{"input":"mail ann@example.com"}"#).unwrap();
    g.check(&tree, &["input"], &mut vault);
    let answer = br#"{"id":"x","choices":[{"message":{"role":"assistant","content":"to [EMAIL_1], card 4111 1111 1111 1111"}}]}"#;
    let mut guard = AnswerGuard::new(false);
    let Ok(Checked::Body(b)) = guard.check_json(&g, Dialect::Chat.answer(), &mut vault, answer)
    else {
        panic!("rewritten");
    };
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "to ann@example.com, card [CREDIT_CARD_2]"
    );
    assert_eq!(v["id"], "x");
    let leak = format!(r#"{{"content":[{{"type":"text","text":"use {KEY}"}}]}}"#);
    let mut guard = AnswerGuard::new(false);
    let got = guard.check_json(&g, Dialect::Messages.answer(), &mut vault, leak.as_bytes());
    assert!(matches!(got, Ok(Checked::Blocked(Some(2)))), "{got:?}");
    let mut guard = AnswerGuard::new(false);
    assert!(matches!(
        guard.check_json(&g, Dialect::Chat.answer(), &mut vault, b"not json"),
        Err(Unread::NotJson)
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Wherever a planted key or card sits in an answer, however its text
    /// is cut into deltas and its bytes into pieces, under `block` or
    /// `mask` the client never gets it.
    #[test]
    fn a_planted_value_never_reaches_the_client(
        card in any::<bool>(),
        block in any::<bool>(),
        messages in any::<bool>(),
        before in "[a-z ]{0,30}",
        after in "[a-z ]{0,30}",
        text_cuts in proptest::collection::vec(0usize..200, 0..6),
        byte_cuts in proptest::collection::vec(0usize..2000, 0..12),
    ) {
        let action = if block { "block" } else { "mask" };
        let g = rules(&format!(
            r#"[{{"name":"r","detect":["secrets","credit_card"],"action":"{action}","on":"answer"}}]"#
        ));
        let value = if card { "4111 1111 1111 1111" } else { KEY };
        let text = format!("{before} {value} {after}");
        let mut cuts: Vec<usize> = text_cuts.iter().map(|c| c % (text.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut deltas = Vec::new();
        let mut at = 0;
        for c in cuts.into_iter().chain([text.len()]) {
            deltas.push(&text[at..c]);
            at = c;
        }
        let (d, body) = match messages {
            true => (Dialect::Messages, messages_stream(&deltas)),
            false => (Dialect::Chat, chat_stream(&deltas)),
        };
        let (out, blocked) = check(&g, d, &mut Vault::new(), &body, &byte_cuts);
        let digits: String = text_of(&out).chars().filter(char::is_ascii_digit).collect();
        prop_assert!(!out.contains("PLANTED") && !out.contains("4111"), "{}", out);
        prop_assert!(!digits.contains("41111111"), "{}", out);
        prop_assert_eq!(blocked, block);
    }
}

#[test]
fn a_responses_stream_is_masked_in_its_deltas_and_its_final_response_alike() {
    let g = rules(r#"[{"name":"c","detect":["credit_card"],"action":"mask","on":"answer"}]"#);
    let event =
        |v: serde_json::Value| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap());
    let delta = |d: &str| {
        event(
            serde_json::json!({"type": "response.output_text.delta", "output_index": 0,
                                 "content_index": 0, "delta": d}),
        )
    };
    let full = "card 4111 1111 1111 1111 ok";
    let body = [
        delta("card 4111 11"),
        delta("11 1111 1111"),
        delta(" ok"),
        event(serde_json::json!({"type": "response.output_text.done", "text": full})),
        event(
            serde_json::json!({"type": "response.completed", "response": {"output": [
            {"type": "message", "content": [{"type": "output_text", "text": full}]}]}}),
        ),
    ]
    .concat();
    let (out, blocked) = check(&g, Dialect::Responses, &mut Vault::new(), &body, &[30, 200]);
    assert!(!blocked);
    assert!(!out.contains("4111"), "{out}");
    let mut text = String::new();
    for line in out.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["type"] == "response.output_text.delta" {
            text.push_str(v["delta"].as_str().unwrap());
        }
        if v["type"] == "response.completed" {
            assert_eq!(
                v["response"]["output"][0]["content"][0]["text"],
                "card [CREDIT_CARD_1] ok"
            );
        }
    }
    assert_eq!(text, "card [CREDIT_CARD_1] ok");
}

#[test]
fn a_gemini_stream_is_read_by_its_parts() {
    let g = rules(r#"[{"name":"k","detect":["secrets"],"on":"answer"}]"#);
    let (head, tail) = KEY.split_at(12);
    let chunk = |t: &str| {
        let v = serde_json::json!({"candidates": [{"content": {"role": "model", "parts": [{"text": t}]}}]});
        format!("data: {v}\n\n")
    };
    let body = [chunk("key "), chunk(head), chunk(tail)].concat();
    let (out, blocked) = check(&g, Dialect::Gemini, &mut Vault::new(), &body, &[]);
    assert!(blocked && !out.contains("PLANT"), "{out}");
    assert!(
        out.ends_with("\n\n") && out.contains("\"code\":502"),
        "{out}"
    );
}

#[test]
fn each_dialect_says_where_its_answer_says_it() {
    let fields = |d: Dialect| d.answer().said_fields();
    assert_eq!(fields(Dialect::Chat), ["choices"]);
    assert_eq!(fields(Dialect::Messages), ["content"]);
    assert_eq!(fields(Dialect::Responses), ["output"]);
    assert_eq!(fields(Dialect::Gemini), ["candidates"]);
    // Vectors: never held for the rules.
    assert!(fields(Dialect::Embeddings).is_empty());
}
