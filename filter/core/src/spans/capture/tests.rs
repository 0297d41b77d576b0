use serde_json::{json, Value};

use super::*;
use crate::sse::Transcript;

fn cfg(max_bytes: usize) -> CaptureConfig {
    CaptureConfig {
        prompt: true,
        completion: true,
        max_bytes,
        ..CaptureConfig::default()
    }
}

fn parsed(c: &Captured) -> Value {
    serde_json::from_str(&c.json).unwrap()
}

fn request(v: Value) -> Json {
    Json::parse(v.to_string().as_bytes()).unwrap()
}

#[test]
fn each_dialects_prompt_is_read_where_it_keeps_it() {
    let chat = request(json!({"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}
    ]}));
    let p = prompt(&cfg(4096), Endpoint::Chat, &chat).unwrap();
    assert_eq!(p.system, None);
    let m = parsed(p.messages.as_ref().unwrap());
    assert_eq!(
        m,
        json!([
            {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
            {"role": "user", "parts": [{"type": "text", "content": "hi"}, {"type": "image_url"}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "f", "arguments": "{\"a\":1}"}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "42"}]}
        ])
    );
    let responses = request(json!({"instructions": "rules", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "function_call_output", "call_id": "c", "output": "out"}
    ]}));
    let p = prompt(&cfg(4096), Endpoint::Responses, &responses).unwrap();
    assert_eq!(
        parsed(p.system.as_ref().unwrap()),
        json!([{"type": "text", "content": "rules"}])
    );
    assert_eq!(
        parsed(p.messages.as_ref().unwrap()),
        json!([
            {"role": "user", "parts": [{"type": "text", "content": "q"}]},
            {"role": "user", "parts": [{"type": "tool_call_response", "id": "c", "response": "out"}]}
        ])
    );
    let plain = request(json!({"input": "just text"}));
    let p = prompt(&cfg(4096), Endpoint::Responses, &plain).unwrap();
    assert_eq!(
        parsed(p.messages.as_ref().unwrap())[0]["parts"][0]["content"],
        "just text"
    );
    let messages = request(
        json!({"system": [{"type": "text", "text": "sys"}], "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "g", "input": {"x": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]}]}
        ]}),
    );
    let p = prompt(&cfg(4096), Endpoint::Messages, &messages).unwrap();
    assert_eq!(
        parsed(p.system.as_ref().unwrap()),
        json!([{"type": "text", "content": "sys"}])
    );
    let m = parsed(p.messages.as_ref().unwrap());
    assert_eq!(m[1]["parts"][0]["arguments"], "{\"x\":1}");
    assert_eq!(
        m[2]["parts"][0],
        json!({"type": "tool_call_response", "id": "t", "response": "r"})
    );
    let completions = request(json!({"prompt": ["a", "b"]}));
    let p = prompt(&cfg(4096), Endpoint::Completions, &completions).unwrap();
    assert_eq!(
        parsed(p.messages.as_ref().unwrap())[0]["parts"][1]["content"],
        "b"
    );
    assert_eq!(prompt(&cfg(4096), Endpoint::Embeddings, &plain), None);
    let off = CaptureConfig::default();
    assert_eq!(prompt(&off, Endpoint::Chat, &chat), None);
}

#[test]
fn each_dialects_answer_is_read_where_it_keeps_it() {
    let c = cfg(4096);
    let chat = json!({"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "no"}, "finish_reason": "length"}
    ]});
    assert_eq!(
        parsed(&completion(&c, Endpoint::Chat, &request(chat.clone())).unwrap()),
        json!([
            {"role": "assistant", "parts": [{"type": "text", "content": "yes"}], "finish_reason": "stop"},
            {"role": "assistant", "parts": [{"type": "text", "content": "no"}], "finish_reason": "length"}
        ])
    );
    let text = json!({"choices": [{"text": "done", "finish_reason": "stop"}]});
    assert_eq!(
        parsed(&completion(&c, Endpoint::Completions, &request(text.clone())).unwrap())[0]["parts"]
            [0]["content"],
        "done"
    );
    let responses = json!({"object": "response", "status": "completed", "output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]}
    ]});
    assert_eq!(
        parsed(&completion(&c, Endpoint::Responses, &request(responses.clone())).unwrap()),
        json!([{"role": "assistant", "parts": [{"type": "text", "content": "answer"}], "finish_reason": "completed"}])
    );
    let messages = json!({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"});
    assert_eq!(
        parsed(&completion(&c, Endpoint::Messages, &request(messages.clone())).unwrap()),
        json!([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}], "finish_reason": "end_turn"}])
    );
    let mut kept = Transcript::new(transcript_bytes(&c));
    kept.push(0, "str");
    kept.push(0, "eamed");
    let s = streamed(&c, &kept, &["stop"]).unwrap();
    assert_eq!(
        parsed(&s),
        json!([{"role": "assistant", "parts": [{"type": "text", "content": "streamed"}], "finish_reason": "stop"}])
    );
    assert!(!s.cut);
}

#[test]
fn a_capture_is_cut_to_its_bound_at_a_words_end_and_says_so() {
    let words = "lorem ipsum dolor ".repeat(100);
    let body = request(json!({"messages": [
        {"role": "user", "content": words},
        {"role": "user", "content": "never reached"}
    ]}));
    // Too small for even one cut message: an empty list, said to be cut.
    let p = prompt(&cfg(64), Endpoint::Chat, &body).unwrap();
    assert_eq!(
        p.messages.as_ref().map(|m| (m.json.as_str(), m.cut)),
        Some(("[]", true))
    );
    for max in [100, 300, 1000] {
        let p = prompt(&cfg(max), Endpoint::Chat, &body).unwrap();
        let m = p.messages.unwrap();
        assert!(m.json.len() <= max, "{max}: {}", m.json.len());
        assert!(m.cut, "{max}");
        let v: Value = serde_json::from_str(&m.json).unwrap();
        let content = v[0]["parts"][0]["content"].as_str().expect(&m.json);
        assert!(content.ends_with(CUT_MARK), "{max}: {content}");
        let kept = content.strip_suffix(CUT_MARK).unwrap();
        assert!(
            kept.is_empty()
                || kept.ends_with("lorem")
                || kept.ends_with("ipsum")
                || kept.ends_with("dolor")
                || kept.ends_with(' '),
            "{max}: {kept:?}"
        );
        assert!(!m.json.contains("never reached"));
    }
    // Multi-byte text, with escapes: still within the bound, on a boundary.
    let body = request(json!({"messages": [{"role": "user", "content": "é\"\n ".repeat(500)}]}));
    let m = prompt(&cfg(200), Endpoint::Chat, &body)
        .unwrap()
        .messages
        .unwrap();
    assert!(m.json.len() <= 200 && m.cut);
    serde_json::from_str::<Value>(&m.json).unwrap();
    // What fits is whole and not cut.
    let small = request(json!({"messages": [{"role": "user", "content": "hi"}]}));
    let m = prompt(&cfg(64), Endpoint::Chat, &small)
        .unwrap()
        .messages
        .unwrap();
    assert!(!m.cut);
    // A long stream's kept text is cut as well.
    let c = cfg(64);
    let mut kept = Transcript::new(transcript_bytes(&c));
    for _ in 0..100 {
        kept.push(0, "word ");
    }
    let s = streamed(&c, &kept, &[]).unwrap();
    assert!(s.cut && s.json.len() <= 64, "{}", s.json);
}

#[test]
fn captured_text_is_redacted_before_it_is_cut() {
    let c = CaptureConfig {
        redact: vec!["tok-*".to_string()],
        ..cfg(4096)
    };
    let body = request(json!({"messages": [
        {"role": "user", "content": "mail alice@example.com key sk-live1234567890 and tok-9"}
    ]}));
    let m = prompt(&c, Endpoint::Chat, &body).unwrap().messages.unwrap();
    let v = parsed(&m);
    assert_eq!(
        v[0]["parts"][0]["content"],
        "mail [REDACTED] key [REDACTED] and [REDACTED]"
    );
    // Without the built-ins, only the patterns.
    let c = CaptureConfig {
        redact_builtins: false,
        ..c
    };
    let m = prompt(&c, Endpoint::Chat, &body).unwrap().messages.unwrap();
    assert_eq!(
        parsed(&m)[0]["parts"][0]["content"],
        "mail alice@example.com key sk-live1234567890 and [REDACTED]"
    );
    // An address across the bound is left out whole, never half kept.
    let c = cfg(90);
    let body = request(
        json!({"messages": [{"role": "user", "content": format!("{} bob@example.com", "x ".repeat(20))}]}),
    );
    let m = prompt(&c, Endpoint::Chat, &body).unwrap().messages.unwrap();
    assert!(
        !m.json.contains("bob@") && !m.json.contains("example"),
        "{}",
        m.json
    );
}
