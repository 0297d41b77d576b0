//! End-to-end harness of llm-filter: a mock LLM provider (OpenAI-compatible, OpenAI
//! Responses, Anthropic Messages, Gemini), a launcher
//! for the real Envoy with the built filter, and small client helpers for JSON and
//! SSE calls that record when each event arrived.
// Test infrastructure: a mock, a launcher or a client that cannot start fails
// the test that asked for it, so `expect` says why and ends it. Indexing and
// `panic!` stay denied: a harness that reads a malformed answer reports it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::panic, clippy::indexing_slicing))]

pub mod alertmanager;
pub mod cli;
pub mod daemon;
pub mod envoy;
pub mod istio;
pub mod istiod;
pub mod mock;
pub mod pilot_agent;
pub mod prometheus;
pub mod prometheus_server;
pub mod registry;
pub mod tls;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

pub use alertmanager::{alertmanager_bin, Alertmanager};
pub use envoy::{
    envoy_available, envoy_bin, noop_wasm_path, provider_bootstrap, provider_bootstrap_from,
    sidecar_wasm_path, stats_config_yaml, stats_tag_rules, temp_dir, top_level_block,
    validate_config, validate_config_file, wasm_available, wasm_path, workspace_root, Envoy,
    EnvoyBuilder,
};
pub use mock::oauth2::TokenEndpoint;
pub use mock::{Canned, MockConfig, MockUpstream, Provider, RecordedRequest, Script, TailLatency};
pub use prometheus_server::{prometheus_bin, PrometheusServer};

/// Whether a test that runs the real Envoy skips; every such test starts with it.
///
/// Under CI (see [`running_in_ci`]) nothing skips: a missing Envoy binary or filter
/// module fails the test, naming what is missing, so a broken install can never
/// pass as a green run. Elsewhere a missing Envoy skips the test with the reason
/// printed; a missing filter module fails where Envoy is started with it.
pub fn skip_without_envoy(test: &str) -> bool {
    let mut missing = Vec::new();
    if !envoy_available() {
        missing.push(format!(
            "envoy binary at {} (set ENVOY_BIN)",
            envoy_bin().display()
        ));
    }
    if running_in_ci() {
        if !wasm_available() {
            missing.push(format!(
                "filter module at {} (set LLM_FILTER_WASM)",
                wasm_path().display()
            ));
        }
        assert!(
            missing.is_empty(),
            "{test}: missing {} under CI; `make build envoy` or `make test` installs it",
            missing.join(" and ")
        );
        return false;
    }
    match missing.first() {
        None => false,
        Some(reason) => {
            eprintln!("SKIP {test}: no {reason}; `make build envoy` installs it");
            true
        }
    }
}

/// Whether the tests run under CI: `CI` is set to anything but empty, `false` or `0`.
pub fn running_in_ci() -> bool {
    ci_flag(std::env::var("CI").ok().as_deref())
}

/// Reads the value of `CI` as CI systems set it (`true`, `1`, a system's name).
fn ci_flag(value: Option<&str>) -> bool {
    match value.map(str::trim) {
        None | Some("" | "0") => false,
        Some(value) => !value.eq_ignore_ascii_case("false"),
    }
}

/// An HTTP client for tests: no proxy from the environment, 30 s timeout.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// `text` with a number no other call of this process gets, so identical-looking
/// calls stay distinct requests (never answered from a cache).
pub fn unique(text: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{text} #{n}")
}

/// A non-streaming chat completion request with one user message.
pub fn chat_body(model: &str, content: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
    })
}

/// An OpenAI Responses call whose `input` is one user message's text.
pub fn responses_body(model: &str, input: &str) -> Value {
    json!({"model": model, "input": input})
}

/// An Anthropic Messages call with one user message and the `max_tokens`
/// the API requires.
pub fn messages_body(model: &str, content: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": content}],
    })
}

/// A chat call with a history of `turns` earlier exchanges before its
/// question (the shaping bench's request): what `max_history_turns` trims.
pub fn conversation_body(model: &str, turns: usize, question: &str) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a concise assistant."})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("Earlier question number {t}, about the weather.")}));
        messages.push(json!({"role": "assistant", "content": format!("Earlier answer number {t}: it was sunny.")}));
    }
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": model, "max_tokens": 2048, "messages": messages})
}

/// The plugin configuration of the bench's shaping and A/B scenario: the
/// tagging-only one, with history trimmed to 2 turns, P1 and P2 capped at 256
/// output tokens, and two A/B groups, the second with its own cap.
pub const SHAPING_AB: &str = r#"{"cache":{"enabled":false},"budget":{"enabled":false},
  "shaping":{"max_tokens_cap":256,"max_history_turns":2},
  "ab":{"groups":[{"name":"control","percent":50},
    {"name":"b","percent":50,"overrides":{"shaping":{"max_tokens_cap":128}}}]}}"#;

/// `body` with `key` set to `value` (a body that is not an object is left as it is).
pub fn with_field(mut body: Value, key: &str, value: Value) -> Value {
    if let Some(b) = body.as_object_mut() {
        b.insert(key.to_string(), value);
    }
    body
}

/// A streaming chat completion request, asking for the usage chunk when `include_usage`.
pub fn chat_stream_body(model: &str, content: &str, include_usage: bool) -> Value {
    let body = with_field(chat_body(model, content), "stream", json!(true));
    if include_usage {
        with_field(body, "stream_options", json!({"include_usage": true}))
    } else {
        body
    }
}

/// A complete (non-streamed) response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// Response body.
    pub body: Bytes,
    /// Time from sending to the complete body.
    pub elapsed: Duration,
}

impl HttpResponse {
    /// First value of a header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body parsed as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends a request with optional JSON body and extra headers, reads the whole answer.
pub async fn send(
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    let mut request = http_client().request(method, url);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    execute(request, url, headers).await
}

/// POSTs a JSON body with extra headers and reads the whole answer.
pub async fn post_json(url: &str, body: &Value, headers: &[(&str, &str)]) -> Result<HttpResponse> {
    send(reqwest::Method::POST, url, Some(body), headers).await
}

/// POSTs raw bytes (e.g. invalid JSON) with a JSON content type.
pub async fn post_raw(url: &str, body: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
    let request = http_client()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    execute(request, url, headers).await
}

/// Sends any bytes (or none) with exactly the given headers, repeated names kept
/// in order, on `client` (e.g. one that never reuses a connection).
pub async fn send_bytes(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.body(body);
    }
    execute(request, url, headers).await
}

/// An HTTP client like [`http_client`] that opens a new connection for every call.
pub fn http_client_without_reuse() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// Adds `headers` (appended: a repeated name is sent twice), sends, reads the answer.
async fn execute(
    mut request: reqwest::RequestBuilder,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    let started = Instant::now();
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("send {url}"))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.context("read body")?;
    Ok(HttpResponse {
        status,
        headers,
        body,
        elapsed: started.elapsed(),
    })
}

/// GETs a URL with extra headers and reads the whole answer.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
    send(reqwest::Method::GET, url, None, headers).await
}

/// One server-sent event and when its last byte arrived.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub data: String,
    /// Arrival of the read that completed the event.
    pub at: Instant,
}

impl SseEvent {
    /// The data parsed as JSON (`None` for `[DONE]` and non-JSON data).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.data).ok()
    }
}

/// A streamed response split into events with their arrival times.
#[derive(Debug, Clone)]
pub struct SseResponse {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// When the request was sent.
    pub sent_at: Instant,
    /// When the response headers arrived.
    pub headers_at: Instant,
    /// Events in arrival order.
    pub events: Vec<SseEvent>,
    /// Bytes after the last complete event (should be empty).
    pub trailing: String,
    /// The whole body as received.
    pub raw: Bytes,
}

impl SseResponse {
    /// First value of a header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// JSON payloads of all events except `[DONE]`.
    pub fn chunks(&self) -> Vec<Value> {
        self.events.iter().filter_map(SseEvent::json).collect()
    }

    /// The `event:` names in order (empty for an event without one, as
    /// chat's chunks and `[DONE]`).
    pub fn event_names(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e.event.as_deref().unwrap_or_default())
            .collect()
    }

    /// Whether the last event is `data: [DONE]`.
    pub fn done(&self) -> bool {
        self.events.last().map(|e| e.data.as_str()) == Some("[DONE]")
    }

    /// The text the deltas carry: `choices[0].delta.content` (chat),
    /// `choices[0].text` (completions), `delta` of `response.output_text.delta`
    /// (Responses), `delta.text` of `content_block_delta` (Messages).
    pub fn content(&self) -> String {
        self.chunks()
            .iter()
            .filter_map(|c| {
                let delta = match c.get("type").and_then(Value::as_str) {
                    Some("response.output_text.delta") => c.get("delta"),
                    Some("content_block_delta") => c.pointer("/delta/text"),
                    Some(_) => None,
                    None => c
                        .pointer("/choices/0/delta/content")
                        .or_else(|| c.pointer("/choices/0/text")),
                };
                delta.and_then(Value::as_str).map(str::to_string)
            })
            .collect()
    }

    /// The stream's final usage: chat's last non-null `usage`; the Responses
    /// API's `response.usage` of the last event carrying one
    /// (`response.completed`); for Messages the `message_start` usage with the
    /// counts of `message_delta` laid over it.
    pub fn usage(&self) -> Option<Value> {
        let mut usage: Option<Value> = None;
        for chunk in self.chunks() {
            let found = match chunk.get("type").and_then(Value::as_str) {
                Some("message_start") => chunk.pointer("/message/usage").cloned(),
                Some("message_delta") => match (usage.take(), chunk.get("usage")) {
                    (Some(Value::Object(mut base)), Some(Value::Object(delta))) => {
                        base.extend(delta.clone());
                        Some(Value::Object(base))
                    }
                    (base, delta) => delta.cloned().or(base),
                },
                Some(_) => chunk.pointer("/response/usage").cloned(),
                None => chunk.get("usage").cloned(),
            };
            if let Some(found) = found.filter(|u| !u.is_null()) {
                usage = Some(found);
            }
        }
        usage
    }

    /// Time from sending to the first event (time to first token).
    pub fn time_to_first_event(&self) -> Option<Duration> {
        self.events.first().map(|e| e.at - self.sent_at)
    }

    /// Gaps between consecutive events.
    pub fn gaps(&self) -> Vec<Duration> {
        let at = self.events.iter().map(|e| e.at);
        at.clone().skip(1).zip(at).map(|(b, a)| b - a).collect()
    }
}

/// POSTs a JSON body and reads the answer as a stream of SSE events.
pub async fn stream_sse(url: &str, body: &Value, headers: &[(&str, &str)]) -> Result<SseResponse> {
    let sent_at = Instant::now();
    let mut request = http_client()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("send {url}"))?;
    read_sse(response, sent_at).await
}

/// Reads an already started response as SSE, timing each event.
pub async fn read_sse(response: reqwest::Response, sent_at: Instant) -> Result<SseResponse> {
    let headers_at = Instant::now();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut parser = SseParser::default();
    let mut raw = Vec::new();
    let mut events = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("read stream")?;
        let at = Instant::now();
        raw.extend_from_slice(&chunk);
        events.extend(parser.push(&chunk, at));
    }
    Ok(SseResponse {
        status,
        headers,
        sent_at,
        headers_at,
        events,
        trailing: parser.remainder(),
        raw: Bytes::from(raw),
    })
}

/// Incremental SSE parser: events end at a blank line (`\n\n` or `\r\n\r\n`).
/// Buffers bytes, so a UTF-8 character or a line ending split across reads is fine.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the events they completed, stamped with `at`.
    pub fn push(&mut self, bytes: &[u8], at: Instant) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some((end, separator)) = block_end(&self.buffer) {
            let block: Vec<u8> = self.buffer.drain(..end + separator).collect();
            let block = String::from_utf8_lossy(&block);
            let mut event = None;
            let mut data: Vec<&str> = Vec::new();
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("data:") {
                    data.push(value.strip_prefix(' ').unwrap_or(value));
                } else if let Some(value) = line.strip_prefix("event:") {
                    event = Some(value.trim().to_string());
                }
            }
            if !data.is_empty() || event.is_some() {
                events.push(SseEvent {
                    event,
                    data: data.join("\n"),
                    at,
                });
            }
        }
        events
    }

    /// Bytes not yet part of a complete event.
    pub fn remainder(&self) -> String {
        String::from_utf8_lossy(&self.buffer).into_owned()
    }
}

/// Position and length of the first blank-line separator in `buffer`.
fn block_end(buffer: &[u8]) -> Option<(usize, usize)> {
    (0..buffer.len()).find_map(|i| {
        let rest = buffer.get(i..)?;
        if rest.starts_with(b"\n\n") {
            Some((i, 2))
        } else if rest.starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_handles_split_reads_and_crlf() {
        let mut parser = SseParser::default();
        let at = Instant::now();
        assert!(parser.push(b"data: {\"a\":", at).is_empty());
        let events = parser.push(b"1}\n\nevent: x\r\ndata: [DONE]\r\n\r\ndata: par", at);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].json(), Some(json!({"a": 1})));
        assert_eq!(events[1].event.as_deref(), Some("x"));
        assert_eq!(events[1].data, "[DONE]");
        assert_eq!(parser.remainder(), "data: par");
    }

    #[test]
    fn sse_parser_keeps_utf8_split_across_reads() {
        let mut parser = SseParser::default();
        let at = Instant::now();
        let text = "data: é\n\n".as_bytes();
        assert!(parser.push(&text[..7], at).is_empty());
        let events = parser.push(&text[7..], at);
        assert_eq!(events[0].data, "é");
    }

    #[test]
    fn ci_is_any_value_but_empty_false_or_zero() {
        for (value, ci) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("False"), false),
            (Some("true"), true),
            (Some("1"), true),
            (Some("woodpecker"), true),
        ] {
            assert_eq!(ci_flag(value), ci, "{value:?}");
        }
    }

    #[test]
    fn stream_bodies_ask_for_usage_only_when_told() {
        assert_eq!(
            chat_stream_body("m", "c", false).get("stream_options"),
            None
        );
        assert_eq!(
            chat_stream_body("m", "c", true)["stream_options"]["include_usage"],
            true
        );
    }
}
