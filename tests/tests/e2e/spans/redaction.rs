//! Secrets of every kind the built-in redaction knows, planted where each
//! dialect keeps text (messages, system instructions, tool-call arguments
//! that are JSON inside a string, a tool-use input object, tool results), in
//! the request and in the answer, JSON and streamed (split across events),
//! after JSON escapes and joined to their names by `:` or `=`: none reaches
//! the OTLP collector or the access-log record, while the upstream gets the
//! exact bytes the client sent and the client the exact answer.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use llm_filter_e2e::{post_raw, skip_without_envoy, stream_sse, Canned, Script};
use serde_json::{json, Value};

use super::{captured, texts, Capturing};

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const DIGITS: &[u8] = b"0123456789";

/// SplitMix64: random runs no other text of the test holds.
struct Rng(u64);

/// A seed from the clock: each run plants other secrets.
fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn run(&mut self, alphabet: &[u8], n: usize) -> String {
        (0..n)
            .map(|_| alphabet[(self.next() % alphabet.len() as u64) as usize] as char)
            .collect()
    }
}

/// The secrets planted, and their random runs: no 8-byte piece of a run may
/// reach a sink.
struct Planted {
    secrets: Vec<String>,
    runs: Vec<String>,
}

impl Planted {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let mut runs = Vec::new();
        let mut r = |alphabet: &[u8], n: usize| {
            let run = rng.run(alphabet, n);
            runs.push(run.clone());
            run
        };
        let secrets = vec![
            format!("sk-proj-{}", r(ALNUM, 40)),
            format!("sk-ant-api03-{}", r(ALNUM, 40)),
            format!("eyJhbGciOiJIUzI1NiJ9.eyJ{}.{}", r(ALNUM, 24), r(ALNUM, 32)),
            // A JWT with an empty signature (`alg: none`).
            format!("eyJhbGciOiJub25lIn0.eyJ{}.", r(ALNUM, 24)),
            format!(
                "-----BEGIN RSA PRIVATE KEY-----\nMIIE{}\n{}\n-----END RSA PRIVATE KEY-----",
                r(ALNUM, 60),
                r(ALNUM, 64)
            ),
            format!("AKIA{}", r(UPPER, 16)),
            format!("ASIA{}", r(UPPER, 16)),
            format!("ghp_{}", r(ALNUM, 36)),
            format!("github_pat_{}_{}", r(ALNUM, 22), r(ALNUM, 40)),
            format!("xoxb-{}-{}", r(DIGITS, 12), r(ALNUM, 24)),
            format!("AIza{}", r(ALNUM, 35)),
            format!("ya29.{}", r(ALNUM, 40)),
            format!("glpat-{}", r(ALNUM, 20)),
            format!("hf_{}", r(ALNUM, 34)),
            format!("Bearer {}", r(ALNUM, 32)),
            format!("Basic {}==", r(ALNUM, 22)),
            // Joined to their names: opaque values no shape knows.
            format!("api_key:{}", r(ALNUM, 24)),
            format!("x-api-key:sk-ant-{}", r(ALNUM, 30)),
            format!("token={}", r(ALNUM, 28)),
            format!("password=\"{}\"", r(ALNUM, 20)),
            format!("\"client_secret\": \"{}\"", r(ALNUM, 24)),
        ];
        Self { secrets, runs }
    }

    /// Every secret, each after and before another escape or separator
    /// (turned into JSON escapes wherever the text is a JSON string).
    fn text(&self, turn: usize) -> String {
        const BEFORE: [&str; 7] = ["\n", "\t", "\"", "\\", " ", "\r\n", "("];
        const AFTER: [&str; 6] = ["\n", "\"", "\\", ",", "\t", ")"];
        let mut text = String::from("keep this line");
        for (i, s) in self.secrets.iter().enumerate() {
            let before = BEFORE[(i + turn) % BEFORE.len()];
            let after = AFTER[(i + turn) % AFTER.len()];
            text.push_str(&format!("{before}{s}{after}word{i}"));
        }
        text
    }

    /// A tool's arguments: a JSON document whose strings hold the secrets
    /// after escapes, and the secrets as the values of credential names.
    fn arguments(&self) -> Value {
        let mut args = serde_json::Map::new();
        args.insert("note".into(), Value::from(self.text(1)));
        args.insert(
            "each".into(),
            self.secrets
                .iter()
                .enumerate()
                .map(|(i, s)| Value::from(format!("line {i}\n{s}\t\"{s}\"\\{s}")))
                .collect(),
        );
        args.insert("api_key".into(), Value::from(self.secrets[0].clone()));
        args.insert("token".into(), Value::from(self.secrets[2].clone()));
        args.insert("keep".into(), Value::from("keep this argument"));
        Value::Object(args)
    }

    /// The planted runs' 8-byte pieces found in `text`.
    fn leaks(&self, text: &str) -> Vec<String> {
        let mut found = Vec::new();
        for run in &self.runs {
            for w in run.as_bytes().windows(8) {
                let piece = std::str::from_utf8(w).unwrap();
                if text.contains(piece) {
                    found.push(format!("{piece} of {run}"));
                    break;
                }
            }
        }
        found
    }
}

/// What the model said: a text that quotes the arguments as JSON (escapes
/// inside), and a tool call with them.
fn model_text(p: &Planted) -> String {
    format!(
        "keep this answer {}\n```json\n{}\n```",
        p.text(2),
        p.arguments()
    )
}

/// The request of `path` with the secrets in each place it keeps text.
fn request(path: &str, p: &Planted, stream: bool) -> Value {
    let (text, args) = (p.text(0), p.arguments());
    let mut body = match path {
        "/v1/chat/completions" => json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": text},
            {"role": "user", "content": text},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "lookup", "arguments": args.to_string()}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": args.to_string()}
        ]}),
        "/v1/responses" => json!({"model": "gpt-4o", "instructions": text, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": text}]},
            {"type": "function_call", "call_id": "c1", "name": "lookup",
             "arguments": args.to_string()},
            {"type": "function_call_output", "call_id": "c1", "output": args.to_string()}
        ]}),
        _ => json!({"model": "claude-sonnet-4", "max_tokens": 1024, "system": text, "messages": [
            {"role": "user", "content": text},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": args}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": args.to_string()}]}
        ]}),
    };
    if stream {
        body["stream"] = json!(true);
        if path == "/v1/chat/completions" {
            body["stream_options"] = json!({"include_usage": true});
        }
    }
    body
}

/// `text` in pieces of 7 bytes (on character boundaries): every secret
/// split across events.
fn pieces(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut piece = String::new();
    for c in text.chars() {
        piece.push(c);
        if piece.len() >= 7 {
            out.push(std::mem::take(&mut piece));
        }
    }
    out.push(piece);
    out
}

/// The answer of `path`, JSON or streamed, with the text and the tool call.
fn answer(path: &str, p: &Planted, stream: bool) -> Canned {
    let (text, args) = (model_text(p), p.arguments());
    let usage = json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30});
    let data = |v: Value| format!("data: {v}\n\n");
    let named = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
    match (path, stream) {
        ("/v1/chat/completions", false) => Canned::Json(
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
                   "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                       "role": "assistant", "content": text, "tool_calls": [
                           {"id": "call_2", "type": "function",
                            "function": {"name": "lookup", "arguments": args.to_string()}}]}}],
                   "usage": usage})
            .to_string(),
        ),
        ("/v1/chat/completions", true) => {
            let chunk = |delta: Value, finish: Value| {
                data(json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                            "model": "gpt-4o", "usage": null,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
            };
            let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
            events.extend(
                pieces(&text)
                    .iter()
                    .map(|t| chunk(json!({"content": t}), Value::Null)),
            );
            events.push(chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_2", "type": "function",
                                       "function": {"name": "lookup", "arguments": ""}}]}),
                Value::Null,
            ));
            events.extend(pieces(&args.to_string()).iter().map(|a| {
                chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}),
                    Value::Null,
                )
            }));
            events.push(chunk(json!({}), json!("tool_calls")));
            events.push(data(json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                    "created": 1, "model": "gpt-4o", "choices": [], "usage": usage})));
            events.push("data: [DONE]\n\n".to_string());
            Canned::Sse(events)
        }
        ("/v1/responses", stream) => {
            let response = json!({"id": "resp_1", "object": "response", "status": "completed",
                "model": "gpt-4o", "output": [
                    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                     "content": [{"type": "output_text", "text": text, "annotations": []}]},
                    {"type": "function_call", "id": "fc_1", "call_id": "c2", "name": "lookup",
                     "arguments": args.to_string(), "status": "completed"}],
                "usage": {"input_tokens": 10, "output_tokens": 20, "total_tokens": 30}});
            if !stream {
                return Canned::Json(response.to_string());
            }
            let mut events = vec![named(
                "response.created",
                json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            )];
            events.extend(pieces(&text).iter().map(|t| {
                named(
                    "response.output_text.delta",
                    json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": t}),
                )
            }));
            events.extend(pieces(&args.to_string()).iter().map(|a| {
                named(
                    "response.function_call_arguments.delta",
                    json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": a}),
                )
            }));
            events.push(named(
                "response.completed",
                json!({"type": "response.completed", "response": response}),
            ));
            Canned::Sse(events)
        }
        (_, false) => Canned::Json(
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4",
                   "content": [{"type": "text", "text": text},
                               {"type": "tool_use", "id": "t2", "name": "lookup", "input": args}],
                   "stop_reason": "tool_use", "stop_sequence": null,
                   "usage": {"input_tokens": 10, "output_tokens": 20}})
            .to_string(),
        ),
        (_, true) => {
            let mut events = vec![
                named(
                    "message_start",
                    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                        "role": "assistant", "model": "claude-sonnet-4", "content": [],
                        "stop_reason": null, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
                ),
                named(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
            ];
            events.extend(pieces(&text).iter().map(|t| {
                named(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
                )
            }));
            events.push(named(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ));
            events.push(named(
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block":
                    {"type": "tool_use", "id": "t2", "name": "lookup", "input": {}}}),
            ));
            events.extend(pieces(&args.to_string()).iter().map(|a| {
                named(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": a}}),
                )
            }));
            events.push(named(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ));
            events.push(named(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
            ));
            events.push(named("message_stop", json!({"type": "message_stop"})));
            Canned::Sse(events)
        }
    }
}

/// Each dialect, JSON and streamed, in the order the test calls them.
fn cases() -> Vec<(&'static str, bool)> {
    ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
        .into_iter()
        .flat_map(|path| [(path, false), (path, true)])
        .collect()
}

#[tokio::test]
async fn planted_secrets_of_every_kind_reach_neither_the_collector_nor_the_record() {
    if skip_without_envoy(
        "planted_secrets_of_every_kind_reach_neither_the_collector_nor_the_record",
    ) {
        return;
    }
    let Capturing {
        receiver,
        mock,
        _dir,
        log,
        envoy: e,
    } = Capturing::start(
        "capture-secrets",
        json!({"prompt": true, "completion": true, "max_bytes": 65536}),
    );
    // Hundreds of events a stream: no pause between them.
    mock.set_chunk_delay_ms(0);
    let p = Planted::new(clock_seed());
    let mut calls = 0;
    // Every call's leaks, each line from the collector and the record.
    let mut leaked = Vec::new();
    for (path, stream) in cases() {
        let body = request(path, &p, stream);
        let sent = body.to_string();
        let canned = answer(path, &p, stream);
        mock.push_script(Script {
            answer: Some(canned.clone()),
            ..Script::default()
        });
        let trace = if stream {
            let r = stream_sse(&e.url(path), &body, &[]).await.unwrap();
            assert_eq!(r.status, 200, "{path}");
            let Canned::Sse(events) = &canned else {
                unreachable!()
            };
            assert_eq!(
                String::from_utf8_lossy(&r.raw),
                events.concat(),
                "{path}: the client got the stream as sent"
            );
            r.header("x-trace-id").unwrap().to_string()
        } else {
            let r = post_raw(&e.url(path), &sent, &[]).await.unwrap();
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            let Canned::Json(json) = &canned else {
                unreachable!()
            };
            assert_eq!(&r.text(), json, "{path}: the client got the answer as sent");
            r.header("x-trace-id").unwrap().to_string()
        };
        calls += 1;
        let upstream = mock.requests().pop().unwrap();
        assert_eq!(
            upstream.body.as_ref(),
            sent.as_bytes(),
            "{path} {stream}: the upstream got the exact bytes"
        );
        let span = receiver
            .span_of(&trace, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("{path} {stream}: no span"));
        let exported = serde_json::to_string(&span).unwrap();
        let leaks = p.leaks(&exported);
        if !leaks.is_empty() {
            leaked.push(format!("{path} stream {stream}: collector: {leaks:?}"));
        }
        // The capture is there, whole, and kept what is no secret.
        assert!(span["attributes"]
            .get("llm_filter.capture.truncated")
            .is_none());
        let input = captured(&span, "gen_ai.input.messages");
        let output = captured(&span, "gen_ai.output.messages");
        let input_text = input.to_string();
        assert!(
            input_text.contains("keep this line")
                && input_text.contains("keep this argument")
                && input_text.contains("[REDACTED]"),
            "{path} {stream}: {input}"
        );
        let said = texts(&output).concat();
        assert!(
            said.contains("keep this answer") && said.contains("[REDACTED]"),
            "{path} {stream}: {output}"
        );
        if !stream {
            assert!(
                output.to_string().contains("keep this argument"),
                "{path}: the answer's tool call: {output}"
            );
        }
    }
    // The access-log record holds the same captures, none of the secrets.
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= calls || Instant::now() >= deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(text.lines().count(), calls, "{text}");
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert!(
            record["input_messages"].is_array() && record["output_messages"].is_array(),
            "{line}"
        );
    }
    for (line, (path, stream)) in text.lines().zip(cases()) {
        let leaks = p.leaks(line);
        if !leaks.is_empty() {
            leaked.push(format!("{path} stream {stream}: record: {leaks:?}"));
        }
    }
    assert!(leaked.is_empty(), "{}", leaked.join("\n"));
    // Everything the collector received, decoded or not.
    let all = serde_json::to_string(&receiver.exports()).unwrap();
    assert!(p.leaks(&all).is_empty());
}

/// A chat stream of two choices: choice 0 says a little, choice 1 a lot,
/// then choice 0 sends a JSON web token that the capture's bound cuts
/// through (its header and payload kept, its signature past the bound).
fn two_choices(header: &str, payload: &str, signature: &str) -> Vec<String> {
    let chunk = |index: u64, content: &str| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                   "choices": [{"index": index, "delta": {"content": content}, "finish_reason": null}]})
        )
    };
    let jwt = format!("eyJ{header}.eyJ{payload}.{signature}");
    let mut events = vec![chunk(0, "keep: "), chunk(1, &"words ".repeat(100))];
    events.push(chunk(0, "and the token is "));
    events.extend(pieces(&jwt).iter().map(|p| chunk(0, p)));
    events.push(chunk(0, " done"));
    for index in [0, 1] {
        events.push(format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                   "choices": [{"index": index, "delta": {}, "finish_reason": "stop"}]})
        ));
    }
    events.push("data: [DONE]\n\n".to_string());
    events
}

#[tokio::test]
async fn a_secret_the_bound_cuts_through_in_a_stream_is_left_out_whole() {
    if skip_without_envoy("a_secret_the_bound_cuts_through_in_a_stream_is_left_out_whole") {
        return;
    }
    let Capturing {
        receiver,
        mock,
        _dir,
        log,
        envoy: e,
    } = Capturing::start(
        "capture-stream-cut",
        json!({"completion": true, "max_bytes": 1024}),
    );
    mock.set_chunk_delay_ms(0);
    let mut rng = Rng(clock_seed());
    // The bound (1025 bytes of text kept) falls inside the payload.
    let (header, payload, signature) =
        (rng.run(ALNUM, 40), rng.run(ALNUM, 600), rng.run(ALNUM, 43));
    let events = two_choices(&header, &payload, &signature);
    mock.push_script(Script {
        answer: Some(Canned::Sse(events.clone())),
        ..Script::default()
    });
    let body = json!({"model": "gpt-4o", "n": 2, "stream": true,
                      "messages": [{"role": "user", "content": "two answers"}]});
    let r = stream_sse(&e.url("/v1/chat/completions"), &body, &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        String::from_utf8_lossy(&r.raw),
        events.concat(),
        "the client got the whole stream"
    );
    let span = receiver
        .span_of(r.header("x-trace-id").unwrap(), Duration::from_secs(5))
        .await
        .expect("the span");
    let output = captured(&span, "gen_ai.output.messages");
    let said = texts(&output);
    assert_eq!(said.len(), 2, "{output}");
    assert!(said[0].starts_with("keep: "), "{output}");
    assert!(said[1].starts_with("words words"), "{output}");
    let cut = span["attributes"]["llm_filter.capture.truncated"].clone();
    assert!(
        cut.as_array()
            .unwrap()
            .contains(&json!("gen_ai.output.messages")),
        "{cut}"
    );
    let p = Planted {
        secrets: Vec::new(),
        runs: vec![header, payload, signature],
    };
    let exported = serde_json::to_string(&span).unwrap();
    assert!(
        p.leaks(&exported).is_empty(),
        "{:?}: {output}",
        p.leaks(&exported)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let record = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if !text.is_empty() || Instant::now() >= deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(record.contains("output_messages"), "{record}");
    assert!(p.leaks(&record).is_empty(), "{:?}", p.leaks(&record));
}
