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
    let p = prompt(&cfg(4096), Dialect::Chat, &chat).unwrap();
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
    let p = prompt(&cfg(4096), Dialect::Responses, &responses).unwrap();
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
    let p = prompt(&cfg(4096), Dialect::Responses, &plain).unwrap();
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
    let p = prompt(&cfg(4096), Dialect::Messages, &messages).unwrap();
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
    let p = prompt(&cfg(4096), Dialect::Completions, &completions).unwrap();
    assert_eq!(
        parsed(p.messages.as_ref().unwrap())[0]["parts"][1]["content"],
        "b"
    );
    assert_eq!(prompt(&cfg(4096), Dialect::Embeddings, &plain), None);
    let off = CaptureConfig::default();
    assert_eq!(prompt(&off, Dialect::Chat, &chat), None);
}

#[test]
fn a_gemini_prompt_is_read_from_its_parts() {
    let gemini = request(json!({
        "systemInstruction": {"role": "user", "parts": [{"text": "be brief"}]},
        "contents": [
            {"parts": [{"text": "weather?"}, {"inlineData": {"mimeType": "image/png", "data": "AA"}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "w", "args": {"city": "Oslo"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "w", "response": {"t": 3}}}]}
        ]
    }));
    let p = prompt(&cfg(4096), Dialect::Gemini, &gemini).unwrap();
    assert_eq!(
        parsed(p.system.as_ref().unwrap()),
        json!([{"type": "text", "content": "be brief"}])
    );
    let m = parsed(p.messages.as_ref().unwrap());
    assert_eq!(m[0]["role"], "user");
    assert_eq!(
        m[0]["parts"][0],
        json!({"type": "text", "content": "weather?"})
    );
    assert_eq!(m[0]["parts"].as_array().unwrap().len(), 2, "{m}");
    assert_eq!(m[1]["role"], "model");
    assert_eq!(m[1]["parts"][0]["type"], "tool_call", "{m}");
    assert_eq!(m[1]["parts"][0]["name"], "w", "{m}");
    assert_eq!(m[1]["parts"][0]["arguments"], "{\"city\":\"Oslo\"}", "{m}");
    assert_eq!(m[2]["parts"][0]["type"], "tool_call_response", "{m}");
    assert_eq!(m[2]["parts"][0]["id"], "w", "{m}");
    assert_eq!(m[2]["parts"][0]["response"], "{\"t\":3}", "{m}");
    assert_eq!(m.as_array().unwrap().len(), 3);
}

#[test]
fn each_dialects_answer_is_read_where_it_keeps_it() {
    let c = cfg(4096);
    let chat = json!({"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "no"}, "finish_reason": "length"}
    ]});
    assert_eq!(
        parsed(&completion(&c, Dialect::Chat, &request(chat.clone())).unwrap()),
        json!([
            {"role": "assistant", "parts": [{"type": "text", "content": "yes"}], "finish_reason": "stop"},
            {"role": "assistant", "parts": [{"type": "text", "content": "no"}], "finish_reason": "length"}
        ])
    );
    let text = json!({"choices": [{"text": "done", "finish_reason": "stop"}]});
    assert_eq!(
        parsed(&completion(&c, Dialect::Completions, &request(text.clone())).unwrap())[0]["parts"]
            [0]["content"],
        "done"
    );
    let responses = json!({"object": "response", "status": "completed", "output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]}
    ]});
    assert_eq!(
        parsed(&completion(&c, Dialect::Responses, &request(responses.clone())).unwrap()),
        json!([{"role": "assistant", "parts": [{"type": "text", "content": "answer"}], "finish_reason": "completed"}])
    );
    let messages = json!({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"});
    assert_eq!(
        parsed(&completion(&c, Dialect::Messages, &request(messages.clone())).unwrap()),
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
    let p = prompt(&cfg(64), Dialect::Chat, &body).unwrap();
    assert_eq!(
        p.messages.as_ref().map(|m| (m.json.as_str(), m.cut)),
        Some(("[]", true))
    );
    for max in [100, 300, 1000] {
        let p = prompt(&cfg(max), Dialect::Chat, &body).unwrap();
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
    let m = prompt(&cfg(200), Dialect::Chat, &body)
        .unwrap()
        .messages
        .unwrap();
    assert!(m.json.len() <= 200 && m.cut);
    serde_json::from_str::<Value>(&m.json).unwrap();
    // What fits is whole and not cut.
    let small = request(json!({"messages": [{"role": "user", "content": "hi"}]}));
    let m = prompt(&cfg(64), Dialect::Chat, &small)
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
    let m = prompt(&c, Dialect::Chat, &body).unwrap().messages.unwrap();
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
    let m = prompt(&c, Dialect::Chat, &body).unwrap().messages.unwrap();
    assert_eq!(
        parsed(&m)[0]["parts"][0]["content"],
        "mail alice@example.com key sk-live1234567890 and [REDACTED]"
    );
    // An address across the bound is left out whole, never half kept.
    let c = cfg(90);
    let body = request(
        json!({"messages": [{"role": "user", "content": format!("{} bob@example.com", "x ".repeat(20))}]}),
    );
    let m = prompt(&c, Dialect::Chat, &body).unwrap().messages.unwrap();
    assert!(
        !m.json.contains("bob@") && !m.json.contains("example"),
        "{}",
        m.json
    );
}

#[test]
fn a_long_text_is_redacted_only_as_far_as_the_capture_can_keep() {
    // A secret in what is kept, then a megabyte: the capture is the same
    // as of the short text, and a secret near the bound is still whole when
    // redacted, however much follows.
    let c = cfg(4096);
    let head = format!("{} key sk-live1234567890abcdef", "word ".repeat(800));
    let long = format!("{head} {}", "tail ".repeat(200_000));
    let body = |t: &str| request(json!({"messages": [{"role": "user", "content": t}]}));
    let short = prompt(&c, Dialect::Chat, &body(&head))
        .unwrap()
        .messages
        .unwrap();
    let m = prompt(&c, Dialect::Chat, &body(&long))
        .unwrap()
        .messages
        .unwrap();
    assert!(m.cut && !m.json.contains("sk-live"), "{}", m.json);
    assert!(m.json.contains("[REDACTED]"), "{}", m.json);
    let kept = parsed(&m)[0]["parts"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let whole = parsed(&short)[0]["parts"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(kept.starts_with(&whole), "{kept}");
    // A PEM block that starts in the kept part and runs past the window
    // is redacted to where the window ends.
    let pem = format!(
        "{} -----BEGIN PRIVATE KEY-----\n{}",
        "word ".repeat(800),
        "QUJD".repeat(40_000)
    );
    let m = prompt(&c, Dialect::Chat, &body(&pem))
        .unwrap()
        .messages
        .unwrap();
    assert!(!m.json.contains("QUJD"), "{}", m.json);
}

/// A capture's JSON, all of its attributes.
fn all(p: &Option<Prompt>, c: &Option<Captured>) -> String {
    let p = p.clone().unwrap_or_default();
    [p.system, p.messages, c.clone()]
        .into_iter()
        .flatten()
        .map(|c| c.json)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_secret_in_tool_arguments_after_an_escape_is_redacted_in_each_dialect() {
    let c = cfg(4096);
    // JSON inside a string: the key follows `\n`, `\t`, `\"`, `\\`, and a
    // name joined by `:` or `=`.
    let args = json!({"q": "line\nsk-proj-abcdefgh12\ttail", "r": "\"ghp_abcdefgh12\" \\AKIAIOSFODNN7EXAMPLE",
                      "s": "api_key:opaque12345 token=eyJa.eyJb.c"})
    .to_string();
    let planted = ["abcdefgh12", "IOSFODNN7EXAMPLE", "opaque12345", "eyJa.eyJb"];
    let chat = request(json!({"messages": [
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c", "content": args}
    ]}));
    let responses = request(json!({"input": [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": args},
        {"type": "function_call_output", "call_id": "c", "output": args}
    ]}));
    let tree: Value = serde_json::from_str(&args).unwrap();
    let messages = request(json!({"messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": tree}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": args}]}
    ]}));
    for (api, body) in [
        (Dialect::Chat, &chat),
        (Dialect::Responses, &responses),
        (Dialect::Messages, &messages),
    ] {
        let out = all(&prompt(&c, api, body), &None);
        for p in planted {
            assert!(!out.contains(p), "{api:?}: {p} in {out}");
        }
        // The escapes around what was redacted are kept.
        assert!(out.contains(r"line\\n[REDACTED]\\ttail"), "{api:?}: {out}");
    }
    let answers = [
        (
            Dialect::Chat,
            json!({"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}]}}]}),
        ),
        (
            Dialect::Responses,
            json!({"output": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": args}]}),
        ),
        (
            Dialect::Messages,
            json!({"content": [{"type": "tool_use", "id": "t", "name": "f", "input": tree}]}),
        ),
    ];
    for (api, answer) in answers {
        let out = all(&None, &completion(&c, api, &request(answer)));
        assert!(out.contains("[REDACTED]"), "{api:?}: {out}");
        for p in planted {
            assert!(!out.contains(p), "{api:?} answer: {p} in {out}");
        }
    }
}

#[test]
fn every_string_captured_is_redacted() {
    let c = cfg(4096);
    let key = "sk-abcdefgh1234";
    let body = request(json!({"messages": [
        {"role": key, "content": [{"type": key}]},
        {"role": "assistant", "tool_calls": [{"id": key, "function": {"name": key, "arguments": "{}"}}]}
    ]}));
    let out = all(&prompt(&c, Dialect::Chat, &body), &None);
    assert!(!out.contains(key), "{out}");
    let answer = request(json!({"choices": [{"message": {"content": "x"}, "finish_reason": key}]}));
    let out = all(&None, &completion(&c, Dialect::Chat, &answer));
    assert!(!out.contains(key) && out.contains("[REDACTED]"), "{out}");
}

#[test]
fn a_secret_across_the_bound_is_never_half_kept() {
    // The bound falls inside the value: redacted whole before the cut.
    let text = format!(
        "{} api_key: \"correct horse battery staple\"",
        "w ".repeat(30)
    );
    let body = request(json!({"messages": [{"role": "user", "content": text}]}));
    for max in 64..160 {
        let m = prompt(&cfg(max), Dialect::Chat, &body)
            .unwrap()
            .messages
            .unwrap();
        for w in ["correct", "horse", "battery", "staple"] {
            assert!(!m.json.contains(w), "{max}: {}", m.json);
        }
    }
    // A stream whose kept text ends inside a key: its head is left out.
    let c = cfg(160);
    let mut kept = Transcript::new(transcript_bytes(&c));
    kept.push(0, &"w ".repeat(76));
    kept.push(0, "sk-abc");
    kept.push(0, "defgh12345");
    let s = streamed(&c, &kept, &[]).unwrap();
    assert!(
        s.cut && !s.json.contains("sk-") && !s.json.contains("abc"),
        "{}",
        s.json
    );
    assert!(
        parsed(&s)[0]["parts"][0]["content"]
            .as_str()
            .unwrap()
            .ends_with(CUT_MARK),
        "{}",
        s.json
    );
    // Two choices: the one cut short loses its last word, the other is
    // kept whole.
    let c = cfg(1024);
    let mut kept = Transcript::new(transcript_bytes(&c));
    kept.push(0, "keep: ");
    kept.push(1, &"words ".repeat(100));
    kept.push(
        0,
        &format!("the token is eyJhbGciOi.eyJ{}", "x".repeat(600)),
    );
    let s = streamed(&c, &kept, &["stop", "stop"]).unwrap();
    let v = parsed(&s);
    assert_eq!(
        v[0]["parts"][0]["content"],
        format!("keep: the token is{CUT_MARK}")
    );
    assert_eq!(v[1]["parts"][0]["content"], "words ".repeat(100));
    assert!(s.cut);
    // A key sent in pieces and kept whole is redacted whole.
    let c = cfg(4096);
    let mut kept = Transcript::new(transcript_bytes(&c));
    for piece in ["key: sk", "-abc", "defgh", "12345 ok"] {
        kept.push(0, piece);
    }
    let s = streamed(&c, &kept, &[]).unwrap();
    assert_eq!(parsed(&s)[0]["parts"][0]["content"], "key: [REDACTED] ok");
}

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;
    use crate::spans::redact::tests::{after, before, escaped, filler, secret, Secret};
    use crate::sse::{Grammar, Stream};

    /// The request of `api` with `text` at place `at` (each dialect's text,
    /// tool arguments as JSON in a string or as a tree, tool results).
    fn request_with(api: Dialect, at: usize, text: &str, depth: usize) -> Json {
        let args = escaped(text, depth.max(1));
        let tree: Value = serde_json::from_str(&args).unwrap();
        let call = json!({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}]});
        let v = match (api, at % 5) {
            (Dialect::Chat, 0) => json!({"messages": [{"role": "system", "content": text}]}),
            (Dialect::Chat, 1) => {
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]})
            }
            (Dialect::Chat, 2) => json!({"messages": [call]}),
            (Dialect::Chat, _) => {
                json!({"messages": [{"role": "tool", "tool_call_id": "c", "content": args}]})
            }
            (Dialect::Responses, 0) => json!({"instructions": text, "input": text}),
            (Dialect::Responses, 1) => {
                json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}]})
            }
            (Dialect::Responses, 2) => {
                json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": args}]})
            }
            (Dialect::Responses, _) => {
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": args}]})
            }
            (Dialect::Messages, 0) => {
                json!({"system": [{"type": "text", "text": text}], "messages": [{"role": "user", "content": text}]})
            }
            (Dialect::Messages, 1 | 2) => {
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": tree}]}]})
            }
            (Dialect::Messages, _) => {
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": args}]}]}]})
            }
            (_, _) => json!({"prompt": [text]}),
        };
        request(v)
    }

    /// The JSON answer of `api` with `text` at place `at`.
    fn answer_with(api: Dialect, at: usize, text: &str, depth: usize) -> Json {
        let args = escaped(text, depth.max(1));
        let tree: Value = serde_json::from_str(&args).unwrap();
        let v = match (api, at % 2) {
            (Dialect::Chat, 0) => json!({"choices": [{"message": {"content": text}}]}),
            (Dialect::Chat, _) => {
                json!({"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}]}}]})
            }
            (Dialect::Responses, 0) => {
                json!({"output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]})
            }
            (Dialect::Responses, _) => {
                json!({"output": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": args}]})
            }
            (Dialect::Messages, 0) => json!({"content": [{"type": "text", "text": text}]}),
            (Dialect::Messages, _) => {
                json!({"content": [{"type": "tool_use", "id": "t", "name": "f", "input": tree}]})
            }
            (_, _) => json!({"choices": [{"text": text}]}),
        };
        request(v)
    }

    /// A stream of `api` whose text deltas are `pieces` (and `other`, the
    /// text of another choice, where the dialect has choices).
    fn stream_of(api: Dialect, pieces: &[String], other: &str) -> String {
        let whole: String = pieces.concat();
        let data = |v: Value| format!("data: {v}\n\n");
        let mut out = String::new();
        match api {
            Dialect::Messages => {
                for p in pieces {
                    out.push_str(&format!("event: content_block_delta\n{}", data(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}))));
                }
                out.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
            }
            Dialect::Responses => {
                for p in pieces {
                    out.push_str(&data(
                        json!({"type": "response.output_text.delta", "delta": p}),
                    ));
                }
                out.push_str(&data(json!({"type": "response.completed", "response": {"status": "completed",
                    "output": [{"type": "message", "content": [{"type": "output_text", "text": whole}]}]}})));
            }
            _ => {
                // Choice 1 speaks after choice 0's first piece: its text
                // comes after choice 0's, which goes on past the bound.
                for (i, p) in pieces.iter().enumerate() {
                    out.push_str(&data(
                        json!({"choices": [{"index": 0, "delta": {"content": p}}]}),
                    ));
                    if i == 0 {
                        out.push_str(&data(
                            json!({"choices": [{"index": 1, "delta": {"content": other}}]}),
                        ));
                    }
                }
                out.push_str("data: [DONE]\n\n");
            }
        }
        out
    }

    fn api() -> impl Strategy<Value = Dialect> {
        prop::sample::select(
            &[
                Dialect::Chat,
                Dialect::Responses,
                Dialect::Messages,
                Dialect::Completions,
            ][..],
        )
    }

    /// `text` cut at the byte offsets `cuts` (moved to character
    /// boundaries).
    fn cut(text: &str, cuts: &[usize]) -> Vec<String> {
        let mut at: Vec<usize> = cuts
            .iter()
            .map(|c| {
                let mut c = c % (text.len() + 1);
                while !text.is_char_boundary(c) {
                    c -= 1;
                }
                c
            })
            .collect();
        at.sort_unstable();
        at.push(text.len());
        let mut from = 0;
        at.into_iter()
            .map(|to| {
                let p = text[from..to.max(from)].to_string();
                from = to.max(from);
                p
            })
            .collect()
    }

    fn planted(s: &Secret, head: &str, before: &str, after: &str, tail: &str) -> String {
        format!("{head}{before}{}{after}{tail}", s.text)
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Any secret, after any separator or escape, in any place of any
        /// dialect's request or JSON answer, with any bound: no piece of
        /// it reaches the capture; with room, what it was is said.
        #[test]
        fn no_planted_secret_reaches_a_capture(
            s in secret(), head in filler(), before in before(), after in after(), tail in filler(),
            api in api(), at in 0usize..5, depth in 1usize..3, max in prop::sample::select(&[64usize, 100, 200, 400, 65536][..]),
        ) {
            let text = planted(&s, &head, before, after, &tail);
            let c = cfg(max);
            let p = prompt(&c, api, &request_with(api, at, &text, depth));
            let a = completion(&c, api, &answer_with(api, at, &text, depth));
            let out = all(&p, &a);
            prop_assert!(s.leak(&out).is_none(), "{:?} in {out}", s.leak(&out));
            if max == 65536 {
                prop_assert!(!out.contains(&s.text) && out.contains("[REDACTED]"), "{out}");
            }
        }

        /// Any secret in a stream's text, sent in any pieces, the stream
        /// read in any chunks, with any bound: no piece of it reaches the
        /// capture.
        #[test]
        fn no_secret_sent_in_pieces_reaches_a_capture(
            s in secret(), head in filler(), before in before(), after in after(), tail in filler(),
            api in api(), pieces in prop::collection::vec(any::<usize>(), 0..6),
            chunks in prop::collection::vec(any::<usize>(), 0..6), max in 64usize..400,
            other in "[a-z ]{0,200}",
        ) {
            let text = planted(&s, &head, before, after, &tail);
            let sse = stream_of(api, &cut(&text, &pieces), &other);
            let c = cfg(max);
            let mut stream = Stream::with_grammar(api.answer().grammar());
            stream.keep_text(transcript_bytes(&c));
            let parts = cut(&sse, &chunks);
            for (i, part) in parts.iter().enumerate() {
                stream.feed(part.as_bytes(), i + 1 == parts.len(), None);
            }
            let g = stream.grammar();
            let kept = g.transcript().expect("kept");
            let out = streamed(&c, kept, &g.finish_reasons().as_strs()).unwrap();
            prop_assert!(s.leak(&out.json).is_none(), "{:?} in {}", s.leak(&out.json), out.json);
            prop_assert!(out.json.len() <= max);
        }
    }
}
