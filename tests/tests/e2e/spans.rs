//! A span per LLM call over OTLP/HTTP, through the real Envoy, decoded by the
//! official opentelemetry-proto definitions (tests/otlp/receiver.py): its ids
//! are the ones written upstream, under the caller's span, its attributes the
//! GenAI conventions'; a collector that is down or slow costs no call, and
//! what waits for it stays bounded.

use std::time::{Duration, Instant};

use llm_filter_e2e::daemon::free_port;
use llm_filter_e2e::{
    chat_body, chat_stream_body, messages_body, post_json, responses_body, skip_without_envoy,
    stream_sse, with_field, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

use crate::support::otlp::Receiver;
use crate::support::sdk::{run, GENAI};

mod redaction;

fn envoy(mock: &MockUpstream, otel_port: u16, otlp: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(json!({"tracing": {"otlp": otlp}}))
        .upstream("mock", mock.port())
        .upstream("otel", otel_port)
        .start()
        .expect("envoy with the filter")
}

/// The trace id and span id of a `traceparent`.
fn traceparent(v: &str) -> Option<(String, String)> {
    let mut parts = v.split('-').skip(1);
    Some((parts.next()?.to_string(), parts.next()?.to_string()))
}

const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn each_llm_call_exports_the_span_its_upstream_hangs_under() {
    if skip_without_envoy("each_llm_call_exports_the_span_its_upstream_hangs_under") {
        return;
    }
    let receiver = Receiver::start(&[]);
    let mock = MockUpstream::start(MockConfig::named("spans"));
    let e = envoy(
        &mock,
        receiver.port,
        json!({"cluster": "otel", "interval_ms": 200}),
    );
    let url = e.url("/v1/chat/completions");

    // A caller's sampled trace: continued, and this hop's span exported.
    let body = json!({"model": "gpt-4o", "temperature": 0.3, "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hello spans"}]});
    let r = post_json(&url, &body, &[("traceparent", CALLER)])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let upstream = mock.requests().pop().unwrap();
    let sent = traceparent(upstream.header("traceparent").unwrap()).unwrap();
    assert_eq!(sent.0, "4bf92f3577b34da6a3ce929d0e0e4736");
    let span = receiver
        .span_of(&sent.0, Duration::from_secs(5))
        .await
        .expect("the span of the call");
    assert_eq!(span["span_id"], sent.1, "the span written upstream: {span}");
    assert_eq!(
        span["parent_span_id"], "00f067aa0ba902b7",
        "under the caller's span"
    );
    assert_eq!(span["name"], "chat gpt-4o");
    assert_eq!(span["kind"], 3, "SPAN_KIND_CLIENT");
    assert_eq!(span["resource"]["service.name"], "llm-filter");
    let a = &span["attributes"];
    let usage = r.json()["usage"].clone();
    for (key, want) in [
        ("gen_ai.operation.name", json!("chat")),
        ("gen_ai.provider.name", json!("openai")),
        ("gen_ai.request.model", json!("gpt-4o")),
        ("gen_ai.response.model", json!("gpt-4o")),
        ("gen_ai.request.max_tokens", json!(64)),
        ("gen_ai.request.temperature", json!(0.3)),
        ("gen_ai.usage.input_tokens", usage["prompt_tokens"].clone()),
        (
            "gen_ai.usage.output_tokens",
            usage["completion_tokens"].clone(),
        ),
        ("http.response.status_code", json!(200)),
        ("gen_ai.response.finish_reasons", json!(["stop"])),
        ("llm_filter.priority", json!("P1")),
        ("llm_filter.cache", json!("BYPASS")),
    ] {
        assert_eq!(a[key], want, "{key} of {span}");
    }
    assert!(a.get("error.type").is_none());
    // Capture is off by default: no prompt, no completion leaves.
    for key in [
        "gen_ai.input.messages",
        "gen_ai.system_instructions",
        "gen_ai.output.messages",
    ] {
        assert!(a.get(key).is_none(), "{key} captured by default: {span}");
    }
    let (start, end) = (
        span["start"].as_u64().unwrap(),
        span["end"].as_u64().unwrap(),
    );
    assert!(
        end >= start && start > 1_700_000_000_000_000_000,
        "{start} {end}"
    );

    // A new trace, and a stream: a root span, the stream's usage on it.
    let r = stream_sse(&url, &chat_stream_body("gpt-4o", "a stream", true), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let upstream = mock.requests().pop().unwrap();
    let sent = traceparent(upstream.header("traceparent").unwrap()).unwrap();
    let span = receiver
        .span_of(&sent.0, Duration::from_secs(5))
        .await
        .expect("root span");
    assert_eq!(
        (span["span_id"].clone(), span["parent_span_id"].clone()),
        (json!(sent.1), json!(""))
    );
    let usage = r.usage().unwrap();
    assert_eq!(
        span["attributes"]["gen_ai.usage.output_tokens"],
        usage["completion_tokens"]
    );
    // Why it ended, from its final chunk.
    assert_eq!(
        span["attributes"]["gen_ai.response.finish_reasons"],
        json!(["stop"])
    );

    // An unsampled caller: its trace goes on upstream, no span is exported.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let r = post_json(
        &url,
        &chat_body("gpt-4o", "unsampled"),
        &[("traceparent", unsampled)],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    let sent_flags = mock.requests().pop().unwrap();
    assert!(sent_flags.header("traceparent").unwrap().ends_with("-00"));
    assert!(receiver
        .span_of(
            "0af7651916cd43dd8448eb211c80319c",
            Duration::from_millis(800)
        )
        .await
        .is_none());
    // Every export decoded with the official definitions.
    for export in receiver.exports() {
        assert!(export.get("error").is_none(), "{export}");
        assert_eq!(export["content_type"], "application/x-protobuf");
        assert_eq!(export["path"], "/v1/traces");
    }
    let exported = e.metric("llm_filter_spans_total", &[("result", "exported")]);
    assert!(exported >= 2.0, "{exported}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_down_or_slow_costs_no_call_and_what_waits_stays_bounded() {
    if skip_without_envoy("a_collector_down_or_slow_costs_no_call_and_what_waits_stays_bounded") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("spans-down"));
    let slow = Receiver::start(&["--delay-s", "3"]);
    let otlp = |timeout_ms: u64| {
        json!({"cluster": "otel", "interval_ms": 100, "batch_size": 4, "max_queue": 8,
               "timeout_ms": timeout_ms})
    };
    let down = envoy(&mock, free_port().unwrap(), otlp(500));
    let slowed = envoy(&mock, slow.port, otlp(300));
    for e in [&down, &slowed] {
        let url = e.url("/v1/chat/completions");
        let mut slowest = Duration::ZERO;
        for i in 0..40 {
            let sent = Instant::now();
            let r = post_json(&url, &chat_body("gpt-4o", &format!("call {i}")), &[])
                .await
                .unwrap();
            slowest = slowest.max(sent.elapsed());
            assert_eq!(r.status, 200, "{}", r.text());
        }
        assert!(
            slowest < Duration::from_millis(1000),
            "a call waited: {slowest:?}"
        );
        let failed = e.wait_for_metric(
            "llm_filter_spans_total",
            &[("result", "failed")],
            1.0,
            Duration::from_secs(5),
        );
        assert!(failed >= 1.0, "{}", e.log_tail(20));
        // At most max_queue waiting per worker (two workers).
        let queued = e.metric("llm_filter_spans_queued", &[]);
        assert!(queued <= 16.0, "{queued}");
        let dropped = e.metric("llm_filter_spans_total", &[("result", "dropped")]);
        let queued_total = e.metric("llm_filter_spans_total", &[("result", "queued")]);
        assert_eq!(queued_total + dropped, 40.0, "every span queued or dropped");
    }
}

#[tokio::test]
async fn envoys_access_log_prints_each_calls_record() {
    if skip_without_envoy("envoys_access_log_prints_each_calls_record") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("access-log"));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let e = EnvoyBuilder::new()
        .plugin_config(json!({"access_log": {"enabled": true}}))
        .upstream("mock", mock.port())
        .access_log(
            &log,
            "%RESPONSE_CODE% %FILTER_STATE(wasm.llm_filter.call:PLAIN)%",
        )
        .start()
        .expect("envoy with the filter");
    let url = e.url("/v1/chat/completions");
    let body = json!({"model": "gpt-4o", "temperature": 0,
                      "messages": [{"role": "user", "content": "log me"}]});
    // A miss answered by the upstream, the same call from the cache, a stream.
    let miss = post_json(&url, &body, &[]).await.unwrap();
    let hit = post_json(&url, &body, &[]).await.unwrap();
    assert_eq!(hit.header("x-cache"), Some("HIT"));
    let stream = stream_sse(
        &url,
        &chat_stream_body("gpt-4o", "logged stream", true),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(stream.status, 200);
    // Streams of the other dialects: the final response's status, the
    // message's stop reason.
    let responses = stream_sse(
        &e.url("/v1/responses"),
        &with_field(
            responses_body("gpt-4o", "a Responses stream"),
            "stream",
            json!(true),
        ),
        &[],
    )
    .await
    .unwrap();
    let messages = stream_sse(
        &e.url("/v1/messages"),
        &with_field(
            messages_body("claude-sonnet-4", "a Messages stream"),
            "stream",
            json!(true),
        ),
        &[],
    )
    .await
    .unwrap();
    assert_eq!((responses.status, messages.status), (200, 200));
    // A call that is not an LLM call has no record.
    let _ = llm_filter_e2e::get(&e.url("/v1/models"), &[])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= 6 || Instant::now() >= deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lines.len(), 6, "{lines:?}\n{}", e.log_tail(40));
    let record = |line: &str| -> Value {
        let (_, json) = line.split_once(' ').unwrap();
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let (m, h, s) = (record(&lines[0]), record(&lines[1]), record(&lines[2]));
    let usage = miss.json()["usage"].clone();
    assert_eq!(
        (m["status"].clone(), m["cache"].clone()),
        (json!(200), json!("MISS"))
    );
    assert_eq!(m["input_tokens"], usage["prompt_tokens"]);
    assert_eq!(m["output_tokens"], usage["completion_tokens"]);
    assert_eq!(m["trace_id"], miss.header("x-trace-id").unwrap());
    assert_eq!(m["finish_reasons"], json!(["stop"]));
    assert_eq!(
        (m["model"].clone(), m["api"].clone(), m["priority"].clone()),
        (json!("gpt-4o"), json!("chat"), json!("P1"))
    );
    assert_eq!(
        (h["status"].clone(), h["cache"].clone()),
        (json!(200), json!("HIT"))
    );
    assert_eq!(
        s["output_tokens"],
        stream.usage().unwrap()["completion_tokens"]
    );
    assert!(s["ttfb_ms"].is_u64());
    assert_eq!(s["finish_reasons"], json!(["stop"]), "the final chunk's");
    let (r, m) = (record(&lines[3]), record(&lines[4]));
    assert_eq!(
        (r["api"].clone(), r["finish_reasons"].clone()),
        (json!("responses"), json!(["completed"]))
    );
    assert_eq!(
        (m["api"].clone(), m["finish_reasons"].clone()),
        (json!("messages"), json!(["end_turn"]))
    );
    assert!(
        lines[5].ends_with(" -"),
        "no record for a call that is not an LLM call: {}",
        lines[5]
    );
}

/// The HTTP connection manager's tracing of envoy/tracing-off.yaml: Envoy's
/// own OpenTelemetry tracer, exporting to `collector` (a cluster on
/// `127.0.0.1:port`), its span tagged with the call's record.
fn envoy_tracing(port: u16) -> String {
    let shipped =
        std::fs::read_to_string(llm_filter_e2e::workspace_root().join("envoy/tracing-off.yaml"))
            .unwrap();
    let block = shipped
        .split("# --- tracing ---\n")
        .nth(1)
        .and_then(|rest| rest.split("# --- end tracing ---\n").next())
        .expect("the tracing block of envoy/tracing-off.yaml");
    // The block sits in the connection manager at column 10.
    block
        .lines()
        .map(|l| l.get(10..).unwrap_or_default().to_string() + "\n")
        .collect::<String>()
        .replace("otel-collector:4318", &format!("127.0.0.1:{port}"))
        .replace("cluster: otel-collector", "cluster: otel")
}

#[tokio::test]
async fn with_tracing_off_envoys_own_span_carries_the_calls_record() {
    if skip_without_envoy("with_tracing_off_envoys_own_span_carries_the_calls_record") {
        return;
    }
    let receiver = Receiver::start(&[]);
    let mock = MockUpstream::start(MockConfig::named("envoy-span"));
    let e = EnvoyBuilder::new()
        .plugin_config(json!({"tracing": {"mode": "off"}, "access_log": {"enabled": true}}))
        .upstream("mock", mock.port())
        .upstream("otel", receiver.port)
        .hcm_yaml(&envoy_tracing(receiver.port))
        .start()
        .expect("envoy with its tracer and the filter");
    let url = e.url("/v1/chat/completions");
    let body = json!({"model": "gpt-4o", "max_tokens": 64,
                      "messages": [{"role": "user", "content": "tag Envoy's span"}]});
    let r = post_json(&url, &body, &[("traceparent", CALLER)])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let stream = stream_sse(&url, &chat_stream_body("gpt-4o", "a stream", true), &[])
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    // Envoy's tracer wrote the traceparent upstream, under the caller's span.
    let sent = traceparent(mock.requests()[0].header("traceparent").unwrap()).unwrap();
    assert_eq!(sent.0, "4bf92f3577b34da6a3ce929d0e0e4736");
    // Envoy flushes its spans every 5 s.
    let span = receiver
        .span_of(&sent.0, Duration::from_secs(12))
        .await
        .unwrap_or_else(|| panic!("Envoy's span: {:?}\n{}", receiver.exports(), e.log_tail(30)));
    assert_eq!(span["resource"]["service.name"], "llm-gateway", "{span}");
    assert_eq!(span["parent_span_id"], "00f067aa0ba902b7");
    let tag = span["attributes"]["llm_filter.call"]
        .as_str()
        .unwrap_or_else(|| panic!("no record on {span}"));
    let record: Value = serde_json::from_str(tag).unwrap();
    let usage = r.json()["usage"].clone();
    assert_eq!(record["model"], "gpt-4o");
    assert_eq!(record["input_tokens"], usage["prompt_tokens"]);
    assert_eq!(record["output_tokens"], usage["completion_tokens"]);
    assert_eq!(record["finish_reasons"], json!(["stop"]));
    assert_eq!(record["max_tokens"], 64);
    assert!(record.get("span_id").is_none(), "the filter made no span");
    // The stream's span too, with its finish reason; the filter exported
    // nothing itself.
    let deadline = Instant::now() + Duration::from_secs(12);
    let stream_record = loop {
        let found = receiver.spans().into_iter().find_map(|s| {
            let tag = s["attributes"]["llm_filter.call"].as_str()?.to_string();
            let record: Value = serde_json::from_str(&tag).ok()?;
            (s["trace_id"] != sent.0).then_some(record)
        });
        if found.is_some() || Instant::now() >= deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let stream_record = stream_record.expect("the stream's span");
    assert_eq!(stream_record["finish_reasons"], json!(["stop"]));
    assert_eq!(
        stream_record["output_tokens"],
        stream.usage().unwrap()["completion_tokens"]
    );
    assert!(receiver
        .spans()
        .iter()
        .all(|s| s["resource"]["service.name"] == "llm-gateway"));
}

/// A collector, a mock named `name` and Envoy exporting spans to the one and
/// printing each call's record to `log`, with `capture` as `tracing.capture`.
struct Capturing {
    receiver: Receiver,
    mock: MockUpstream,
    /// Holds `log`.
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
    envoy: Envoy,
}

impl Capturing {
    fn start(name: &str, capture: Value) -> Self {
        let receiver = Receiver::start(&[]);
        let mock = MockUpstream::start(MockConfig::named(name));
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("access.log");
        let envoy = EnvoyBuilder::new()
            .plugin_config(json!({
                "tracing": {"otlp": {"cluster": "otel", "interval_ms": 200}, "capture": capture},
                "access_log": {"enabled": true}
            }))
            .upstream("mock", mock.port())
            .upstream("otel", receiver.port)
            .access_log(&log, "%FILTER_STATE(wasm.llm_filter.call:PLAIN)%")
            .start()
            .expect("envoy with the filter");
        Self {
            receiver,
            mock,
            _dir: dir,
            log,
            envoy,
        }
    }
}

/// A captured attribute of a span, parsed.
fn captured(span: &Value, key: &str) -> Value {
    let text = span["attributes"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} on {span}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}: {text}"))
}

/// The texts of every part of captured messages.
fn texts(messages: &Value) -> Vec<String> {
    messages
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["content"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn each_dialects_prompt_and_completion_are_captured_when_asked() {
    if skip_without_envoy("each_dialects_prompt_and_completion_are_captured_when_asked") {
        return;
    }
    let Capturing {
        receiver,
        mock: _mock,
        _dir,
        log,
        envoy: e,
    } = Capturing::start("capture", json!({"prompt": true, "completion": true}));
    let chat = json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "capture a chat"}
    ]});
    let responses =
        json!({"model": "gpt-4o", "instructions": "answer kindly", "input": "capture a response"});
    let messages = with_field(
        messages_body("claude-sonnet-4", "capture a message"),
        "system",
        json!("you are terse"),
    );
    // (path, body, system instructions, the user's text)
    let cases = [
        ("/v1/chat/completions", chat, None, "capture a chat"),
        (
            "/v1/responses",
            responses,
            Some("answer kindly"),
            "capture a response",
        ),
        (
            "/v1/messages",
            messages,
            Some("you are terse"),
            "capture a message",
        ),
    ];
    for (path, body, system, user) in cases {
        for stream in [false, true] {
            let body = if stream {
                let b = with_field(body.clone(), "stream", json!(true));
                if path == "/v1/chat/completions" {
                    with_field(b, "stream_options", json!({"include_usage": true}))
                } else {
                    b
                }
            } else {
                body.clone()
            };
            let (trace, answer) = if stream {
                let r = stream_sse(&e.url(path), &body, &[]).await.unwrap();
                assert_eq!(r.status, 200, "{path}");
                (r.header("x-trace-id").unwrap().to_string(), r.content())
            } else {
                let r = post_json(&e.url(path), &body, &[]).await.unwrap();
                assert_eq!(r.status, 200, "{path}: {}", r.text());
                let j = r.json();
                let text = match path {
                    "/v1/chat/completions" => j["choices"][0]["message"]["content"].clone(),
                    "/v1/responses" => j["output"][0]["content"][0]["text"].clone(),
                    _ => j["content"][0]["text"].clone(),
                };
                (
                    r.header("x-trace-id").unwrap().to_string(),
                    text.as_str().unwrap().to_string(),
                )
            };
            assert!(
                answer.contains(user),
                "{path} {stream}: the mock echoes: {answer}"
            );
            let span = receiver
                .span_of(&trace, Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("{path} {stream}: no span"));
            let input = captured(&span, "gen_ai.input.messages");
            assert!(texts(&input).iter().any(|t| t == user), "{path}: {input}");
            match system {
                Some(sys) => assert_eq!(
                    captured(&span, "gen_ai.system_instructions"),
                    json!([{"type": "text", "content": sys}]),
                    "{path}"
                ),
                None => assert!(span["attributes"]
                    .get("gen_ai.system_instructions")
                    .is_none()),
            }
            let output = captured(&span, "gen_ai.output.messages");
            assert_eq!(output[0]["role"], "assistant", "{path} {stream}: {output}");
            assert_eq!(
                texts(&output),
                std::slice::from_ref(&answer),
                "{path} {stream}: {output}"
            );
            assert!(
                output[0]["finish_reason"].is_string(),
                "{path} {stream}: {output}"
            );
            assert!(span["attributes"]
                .get("llm_filter.capture.truncated")
                .is_none());
        }
    }
    // The record holds the same captures.
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= 6 || Instant::now() >= deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lines.len(), 6, "{lines:?}");
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        texts(&first["input_messages"]),
        ["be brief", "capture a chat"]
    );
    assert!(texts(&first["output_messages"])[0].contains("capture a chat"));
}

#[tokio::test]
async fn a_gemini_prompt_is_captured_from_its_parts() {
    if skip_without_envoy("a_gemini_prompt_is_captured_from_its_parts") {
        return;
    }
    let Capturing {
        receiver,
        mock: _mock,
        _dir,
        log: _log,
        envoy: e,
    } = Capturing::start("capgem", json!({"prompt": true, "completion": true}));
    let out = run(
        GENAI,
        "generate",
        &e.url(""),
        &[
            "--system",
            "be brief",
            "--turn",
            "user:an earlier question",
            "--turn",
            "model:an earlier answer",
            "--prompt",
            "capture a gemini call",
        ],
    )
    .await;
    assert_eq!(out["text"], "echo: capture a gemini call [capgem]", "{out}");
    let trace = out["headers"]["x-trace-id"].as_str().expect("a trace id");
    let span = receiver
        .span_of(trace, Duration::from_secs(5))
        .await
        .expect("the call's span");
    assert_eq!(
        captured(&span, "gen_ai.system_instructions"),
        json!([{"type": "text", "content": "be brief"}])
    );
    let input = captured(&span, "gen_ai.input.messages");
    assert_eq!(
        texts(&input),
        [
            "an earlier question",
            "an earlier answer",
            "capture a gemini call"
        ],
        "{input}"
    );
    let roles: Vec<&str> = input
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "model", "user"]);
    let output = captured(&span, "gen_ai.output.messages");
    assert_eq!(texts(&output), ["echo: capture a gemini call [capgem]"]);
}

#[tokio::test]
async fn captures_are_cut_at_their_bound_and_redacted_while_the_call_is_untouched() {
    if skip_without_envoy(
        "captures_are_cut_at_their_bound_and_redacted_while_the_call_is_untouched",
    ) {
        return;
    }
    let Capturing {
        receiver,
        mock,
        _dir,
        log: _,
        envoy: e,
    } = Capturing::start(
        "capture-cut",
        json!({"prompt": true, "completion": true, "max_bytes": 512, "redact": ["tok_*"]}),
    );
    let url = e.url("/v1/chat/completions");
    let secrets = "mail alice@example.com key sk-live1234567890abcdef and tok_planted";
    let planted = [
        "alice@example.com",
        "sk-live1234567890abcdef",
        "tok_planted",
    ];
    // Short: whole, redacted, in the prompt and in the echo the answer holds.
    let body = chat_body("gpt-4o", secrets);
    let r = post_json(
        &url,
        &body,
        &[("authorization", "Bearer sk-header-secret-123")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    let answer = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        planted.iter().all(|p| answer.contains(p)),
        "the client's answer unchanged: {answer}"
    );
    let upstream = mock.requests().pop().unwrap();
    assert_eq!(
        upstream.body.as_ref(),
        serde_json::to_vec(&body).unwrap().as_slice(),
        "the upstream got the body as sent"
    );
    assert_eq!(
        upstream.header("authorization"),
        Some("Bearer sk-header-secret-123")
    );
    let span = receiver
        .span_of(r.header("x-trace-id").unwrap(), Duration::from_secs(5))
        .await
        .expect("the span");
    let input = captured(&span, "gen_ai.input.messages");
    let output = captured(&span, "gen_ai.output.messages");
    assert_eq!(
        texts(&input),
        ["mail [REDACTED] key [REDACTED] and [REDACTED]"]
    );
    assert!(
        texts(&output)[0].contains("mail [REDACTED] key [REDACTED] and [REDACTED]"),
        "{output}"
    );
    let exported = serde_json::to_string(&span).unwrap();
    for p in planted.iter().chain(&["sk-header-secret-123"]) {
        assert!(
            !exported.contains(p),
            "{p} reached the collector: {exported}"
        );
    }
    // Long: cut at 512 bytes of JSON, at a word's end, said so.
    let long = format!("{secrets} {}", "many words of a long prompt ".repeat(200));
    let body = chat_body("gpt-4o", &long);
    let r = post_json(&url, &body, &[]).await.unwrap();
    assert_eq!(r.status, 200);
    let upstream = mock.requests().pop().unwrap();
    assert_eq!(upstream.json().unwrap(), body, "the upstream got all of it");
    let span = receiver
        .span_of(r.header("x-trace-id").unwrap(), Duration::from_secs(5))
        .await
        .expect("the span");
    let raw = span["attributes"]["gen_ai.input.messages"]
        .as_str()
        .unwrap();
    assert!(raw.len() <= 512, "{} bytes", raw.len());
    let input = captured(&span, "gen_ai.input.messages");
    let text = &texts(&input)[0];
    assert!(text.starts_with("mail [REDACTED] key [REDACTED]"), "{text}");
    assert!(text.ends_with("…[truncated]"), "{text}");
    let kept = text.trim_end_matches("…[truncated]");
    assert!(
        long.contains(kept.trim_start_matches("mail [REDACTED] key [REDACTED] and [REDACTED] "))
    );
    assert!(
        ["many", "words", "of", "a", "long", "prompt"]
            .iter()
            .any(|w| kept.trim_end().ends_with(w)),
        "cut at a word's end: {kept:?}"
    );
    let cut = span["attributes"]["llm_filter.capture.truncated"].clone();
    assert!(
        cut.as_array()
            .unwrap()
            .contains(&json!("gen_ai.input.messages")),
        "{cut}"
    );
    let out = span["attributes"]["gen_ai.output.messages"]
        .as_str()
        .unwrap();
    assert!(out.len() <= 512, "{} bytes", out.len());
    let answer = r.json()["choices"][0]["message"]["content"].clone();
    assert!(
        answer.as_str().unwrap().len() > 512,
        "the client's answer is whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_down_holds_captured_spans_within_the_queues_bytes() {
    if skip_without_envoy("a_collector_down_holds_captured_spans_within_the_queues_bytes") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("capture-down"));
    // Spans of some 30 KB (a 14 KB prompt, its echo) wait for a batch due
    // in a minute, to a collector that is down: 128 KiB a worker holds four
    // each, where the count alone (2048) would let 60 MB wait.
    let e = EnvoyBuilder::new()
        .plugin_config(json!({"tracing": {
            "otlp": {"cluster": "otel", "interval_ms": 60000, "batch_size": 2048,
                     "max_queue": 2048, "max_queue_bytes": 131072},
            "capture": {"prompt": true, "completion": true, "max_bytes": 16384}
        }}))
        .upstream("mock", mock.port())
        .upstream("otel", free_port().unwrap())
        .start()
        .expect("envoy with the filter");
    let url = e.url("/v1/chat/completions");
    let prompt = "words to hold in a span ".repeat(600);
    let mut slowest = Duration::ZERO;
    let call = |i: usize| {
        let url = url.clone();
        let body = chat_body("gpt-4o", &format!("{i} {prompt}"));
        async move {
            let sent = Instant::now();
            let r = post_json(&url, &body, &[]).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            sent.elapsed()
        }
    };
    for i in 0..50 {
        slowest = slowest.max(call(i).await);
    }
    let before = e.rss_kb().unwrap();
    for i in 50..450 {
        slowest = slowest.max(call(i).await);
    }
    let after = e.rss_kb().unwrap();
    assert!(
        slowest < Duration::from_millis(1000),
        "a call waited: {slowest:?}"
    );
    let queued = e.metric("llm_filter_spans_queued", &[]);
    assert!(
        queued <= 10.0,
        "{queued} spans wait: more than 128 KiB a worker holds"
    );
    let dropped = e.metric("llm_filter_spans_total", &[("result", "dropped")]);
    assert!(
        dropped >= 100.0,
        "{dropped}: the byte bound drops what does not fit"
    );
    // 400 spans of 30 KB would be 12 MB had they all waited.
    assert!(
        after.saturating_sub(before) < 6 * 1024,
        "resident memory grew from {before} kB to {after} kB"
    );
}
