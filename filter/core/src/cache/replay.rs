//! Serves a cached answer to a streamed request as a real SSE stream (role,
//! content in several pieces, tool calls, finish, optional usage, `[DONE]`), so
//! a hit looks to the client like the provider's own stream, not one flat event.

use serde_json::{json, Map, Value};

use super::answer::{HEAD_FIELDS, REPLACE_KEYS};
use crate::dialect::answer::Choices;
use crate::dialect::chat::stream as chat;

/// Content pieces end at the first whitespace after this many bytes…
const PIECE_TARGET: usize = 16;
/// …or are cut here (at a char boundary) when no whitespace comes.
const PIECE_MAX: usize = 32;

/// The SSE body replaying `body`, a complete answer of `shape`'s choices
/// (a `chat.completion`, a `text_completion`); `None` when it is not one.
pub(crate) fn sse(shape: Choices, body: &str, include_usage: bool) -> Option<Vec<u8>> {
    // Read as bytes, as every other JSON the filter parses: one reader
    // compiled into the module instead of two.
    let answer: Value = serde_json::from_slice(body.as_bytes()).ok()?;
    let obj = answer.as_object()?;
    let choices = obj.get("choices")?.as_array()?;
    let mut head = Map::new();
    for field in HEAD_FIELDS {
        if let Some(v) = obj.get(field) {
            head.insert(field.to_string(), v.clone());
        }
    }
    head.insert("object".to_string(), Value::from(shape.chunk));
    let mut out = Vec::with_capacity(body.len().saturating_mul(4));
    let mut w = Writer {
        head,
        out: &mut out,
    };
    for (pos, choice) in choices.iter().enumerate() {
        let index = choice
            .get("index")
            .cloned()
            .unwrap_or_else(|| Value::from(pos));
        if shape.message {
            chat_choice(&mut w, index, choice)?;
        } else {
            text_choice(&mut w, index, choice)?;
        }
    }
    if include_usage {
        if let Some(usage) = obj.get("usage").filter(|u| !u.is_null()) {
            w.chunk(Vec::new(), Some(usage.clone()));
        }
    }
    chat::write_done(&mut out);
    Some(out)
}

struct Writer<'a> {
    head: Map<String, Value>,
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn chunk(&mut self, choices: Vec<Value>, usage: Option<Value>) {
        let mut chunk = self.head.clone();
        chunk.insert("choices".to_string(), Value::Array(choices));
        if let Some(u) = usage {
            chunk.insert("usage".to_string(), u);
        }
        chat::write_chunk(self.out, &Value::Object(chunk));
    }

    fn delta(&mut self, index: &Value, delta: Map<String, Value>, logprobs: Value, finish: Value) {
        self.chunk(
            vec![json!({
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            })],
            None,
        );
    }
}

fn chat_choice(w: &mut Writer<'_>, index: Value, choice: &Value) -> Option<()> {
    let message = choice.get("message")?.as_object()?;
    let mut logprobs = choice.get("logprobs").cloned().filter(|l| !l.is_null());
    let finish = choice.get("finish_reason").cloned().unwrap_or(Value::Null);

    // The first chunk carries the role and every field that is not streamed
    // piece by piece; the assembler's merge rules rebuild the same message.
    let mut first = Map::new();
    first.insert(
        "role".to_string(),
        message
            .get("role")
            .cloned()
            .unwrap_or_else(|| Value::from("assistant")),
    );
    let mut streamed: Vec<(&str, &str)> = Vec::new();
    let mut content: Option<&str> = None;
    for (k, v) in message {
        match (k.as_str(), v) {
            ("role", _) => {}
            // Streamed after the content; an empty list goes whole below.
            ("tool_calls", Value::Array(calls)) if !calls.is_empty() => {}
            ("content", Value::String(s)) => {
                first.insert(k.clone(), Value::from(""));
                content = Some(s);
            }
            (key, Value::String(s)) if !s.is_empty() && !REPLACE_KEYS.contains(&key) => {
                streamed.push((key, s));
            }
            _ => {
                first.insert(k.clone(), v.clone());
            }
        }
    }
    w.delta(&index, first, Value::Null, Value::Null);

    // Reasoning and refusals come before the content, as providers send them.
    for (key, text) in streamed {
        for piece in pieces(text) {
            w.delta(&index, one(key, piece), Value::Null, Value::Null);
        }
    }
    if let Some(text) = content.filter(|t| !t.is_empty()) {
        // Token log-probabilities cannot be split faithfully, so a choice that
        // has them gets its content in one piece, carrying all of them.
        let parts = if logprobs.is_some() {
            vec![text]
        } else {
            pieces(text)
        };
        for piece in parts {
            let lp = logprobs.take().unwrap_or(Value::Null);
            w.delta(&index, one("content", piece), lp, Value::Null);
        }
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for (pos, call) in calls.iter().enumerate() {
            tool_call(w, &index, pos, call);
        }
    }
    w.delta(&index, Map::new(), logprobs.unwrap_or(Value::Null), finish);
    Some(())
}

fn tool_call(w: &mut Writer<'_>, index: &Value, pos: usize, call: &Value) {
    let mut header = match call {
        Value::Object(o) => o.clone(),
        other => {
            // Not a tool call object: pass it through whole.
            w.delta(
                index,
                one_value("tool_calls", json!([other])),
                Value::Null,
                Value::Null,
            );
            return;
        }
    };
    let call_index = header
        .get("index")
        .cloned()
        .unwrap_or_else(|| Value::from(pos));
    header.insert("index".to_string(), call_index.clone());
    let mut arguments: Option<String> = None;
    if let Some(Value::Object(f)) = header.get_mut("function") {
        if let Some(Value::String(a)) = f.get_mut("arguments") {
            arguments = Some(std::mem::take(a));
        }
    }
    w.delta(
        index,
        one_value("tool_calls", json!([header])),
        Value::Null,
        Value::Null,
    );
    if let Some(args) = arguments {
        for piece in pieces(&args) {
            w.delta(
                index,
                one_value(
                    "tool_calls",
                    json!([{"index": call_index, "function": {"arguments": piece}}]),
                ),
                Value::Null,
                Value::Null,
            );
        }
    }
}

fn text_choice(w: &mut Writer<'_>, index: Value, choice: &Value) -> Option<()> {
    let text = choice.get("text")?.as_str()?;
    let mut logprobs = choice.get("logprobs").cloned().filter(|l| !l.is_null());
    let finish = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
    let parts = if logprobs.is_some() {
        vec![text]
    } else {
        pieces(text)
    };
    for piece in parts.into_iter().filter(|p| !p.is_empty()) {
        let lp = logprobs.take().unwrap_or(Value::Null);
        w.chunk(
            vec![json!({"text": piece, "index": index, "logprobs": lp, "finish_reason": null})],
            None,
        );
    }
    w.chunk(
        vec![json!({
            "text": "",
            "index": index,
            "logprobs": logprobs.unwrap_or(Value::Null),
            "finish_reason": finish,
        })],
        None,
    );
    Some(())
}

fn one(key: &str, text: &str) -> Map<String, Value> {
    one_value(key, Value::from(text))
}

fn one_value(key: &str, value: Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(key.to_string(), value);
    m
}

/// Splits text into stream-sized pieces, preferring word boundaries, always at
/// char boundaries. Concatenated, the pieces give back the text.
fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::with_capacity(text.len() / PIECE_TARGET + 1);
    let mut start = 0;
    for (i, c) in text.char_indices() {
        let len = i.saturating_sub(start);
        if len >= PIECE_MAX {
            out.extend(text.get(start..i));
            start = i;
        } else if len + 1 >= PIECE_TARGET && c.is_whitespace() {
            let end = i + c.len_utf8();
            out.extend(text.get(start..end));
            start = end;
        }
    }
    if start < text.len() {
        out.extend(text.get(start..));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::answer::Stored;
    use crate::dialect::Dialect;

    fn chat_shape() -> Choices {
        let Some(Stored::Canonical(Some(shape))) = Dialect::Chat.answer().stored() else {
            panic!("chat answers are kept from choices");
        };
        shape
    }

    #[test]
    fn pieces_rebuild_the_text() {
        for text in [
            "",
            "hi",
            "The quick brown fox jumps over the lazy dog, again and again and again.",
            &"x".repeat(100),
            &"é😀".repeat(40),
            "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        ] {
            let p = pieces(text);
            assert_eq!(p.concat(), text);
            assert!(
                p.iter().all(|s| !s.is_empty() && s.len() <= PIECE_MAX + 4),
                "{p:?}"
            );
            if text.len() > 40 {
                assert!(p.len() > 1, "{text}");
            }
        }
        let words = pieces("The quick brown fox jumps over the lazy dog");
        assert_eq!(words[0], "The quick brown ");
    }

    #[test]
    fn each_event_is_a_data_line() {
        let body = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, this is a longer answer that spans pieces."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#;
        let plain = String::from_utf8(sse(chat_shape(), body, false).unwrap()).unwrap();
        let events: Vec<&str> = plain.split_terminator("\n\n").collect();
        assert!(events
            .iter()
            .all(|e| e.starts_with("data: ") && !e.contains('\n')));
        assert_eq!(events.last(), Some(&"data: [DONE]"));
        assert!(events.len() >= 6, "{plain}");
        assert!(!plain.contains("usage"));
        let first: Value = serde_json::from_str(&events[0][6..]).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let last: Value = serde_json::from_str(&events[events.len() - 2][6..]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let with_usage = String::from_utf8(sse(chat_shape(), body, true).unwrap()).unwrap();
        let all: Vec<&str> = with_usage.split_terminator("\n\n").collect();
        let usage_event = all[all.len() - 2];
        let usage: Value = serde_json::from_str(&usage_event[6..]).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 3);
        assert!(sse(chat_shape(), "{}", false).is_none());
        assert!(sse(chat_shape(), "nope", false).is_none());
    }
}
