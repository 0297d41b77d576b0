//! The Anthropic Messages API (`POST /v1/messages`) as the mock answers it: a
//! `message`, or the named SSE events Anthropic streams (`message_start`,
//! `content_block_start`, `ping`, `content_block_delta`…, `content_block_stop`,
//! `message_delta`, `message_stop`) with the usage split between the first and
//! the last but one, and errors in Anthropic's shape with the type its SDK maps
//! to the right exception. `max_tokens` is required, as Anthropic requires it.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;

use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::{
    count_tokens, echo, json_response, named_event, pieces, stream, Body, InFlight,
    RecordedRequest, State, HEADER_SSE,
};

/// The path of the API.
pub(super) const PATH: &str = "/v1/messages";

/// Answers one call: the JSON message, its stream, or Anthropic's 400.
pub(super) fn answer(
    state: &State,
    req: &RecordedRequest,
    chunk_delay_ms: u64,
    in_flight: InFlight,
) -> Response<Body> {
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(body @ Value::Object(_)) => body,
        _ => {
            let message = "There was an issue with your request body: not valid JSON.";
            return error_response(state, StatusCode::BAD_REQUEST, message);
        }
    };
    let reply = match Reply::new(state, &body) {
        Ok(reply) => reply,
        Err(message) => return error_response(state, StatusCode::BAD_REQUEST, &message),
    };
    let mut response = if reply.stream {
        let unknown = req.header(HEADER_SSE) == Some("unknown");
        stream(state, req, reply.events(unknown), chunk_delay_ms, in_flight)
    } else {
        json_response(StatusCode::OK, &reply.message())
    };
    request_id(state, &mut response);
    response
}

/// The Anthropic error type of a status, as the API documents them.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ if status.is_client_error() => "invalid_request_error",
        _ => "api_error",
    }
}

/// An error in Anthropic's shape, with its `request-id` as the API sends it.
pub(super) fn error_response(state: &State, status: StatusCode, message: &str) -> Response<Body> {
    let id = next_request_id(state);
    let body = json!({
        "type": "error",
        "error": {"type": error_type(status), "message": message},
        "request_id": id,
    });
    let mut response = json_response(status, &body);
    if let Ok(id) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("request-id", id);
    }
    response
}

fn next_request_id(state: &State) -> String {
    let n = state.sequence.fetch_add(1, Ordering::SeqCst) + 1;
    format!("req_{}-{n}", state.name)
}

fn request_id(state: &State, response: &mut Response<Body>) {
    if let Ok(id) = HeaderValue::from_str(&next_request_id(state)) {
        response.headers_mut().insert("request-id", id);
    }
}

/// Everything the answer is derived from, computed once per call.
struct Reply {
    id: String,
    model: String,
    stream: bool,
    input_tokens: u64,
    text: String,
    /// The usage to report in place of the counted one.
    reported: Option<Value>,
    /// Input tokens read from and written to the played prompt cache.
    cache_read: u64,
    cache_write: u64,
}

impl Reply {
    /// The reply to `body`, or the message of Anthropic's 400 naming the
    /// missing field.
    fn new(state: &State, body: &Value) -> Result<Self, String> {
        for field in ["model", "max_tokens", "messages"] {
            if body.get(field).is_none() {
                return Err(format!("{field}: Field required"));
            }
        }
        let invalid = |field: &str, what: &str| format!("{field}: Input should be {what}");
        let model = body.get("model").and_then(Value::as_str);
        let model = model.ok_or_else(|| invalid("model", "a valid string"))?;
        if !matches!(body.get("max_tokens").and_then(Value::as_u64), Some(1..)) {
            return Err(invalid(
                "max_tokens",
                "a valid integer greater than or equal to 1",
            ));
        }
        let messages = body.get("messages").and_then(Value::as_array);
        let messages = messages.ok_or_else(|| invalid("messages", "a valid list"))?;
        let sequence = state.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        let mut all = vec![blocks_text(body.get("system"))];
        let mut last_user = String::new();
        for message in messages {
            let text = blocks_text(message.get("content"));
            if message.get("role").and_then(Value::as_str) == Some("user") {
                last_user.clone_from(&text);
            }
            all.push(text);
        }
        let mut input_tokens = count_tokens(&all.join(" "));
        let (mut cache_read, mut cache_write) = (0, 0);
        if let Some(cache) = super::lock(&state.messages_cache).as_mut() {
            let (read, write, total) = cache.look_up(body)?;
            (cache_read, cache_write) = (read, write);
            input_tokens = total.saturating_sub(read).saturating_sub(write);
        }
        Ok(Self {
            id: format!("msg_{}-{sequence}", state.name),
            model: model.to_string(),
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            input_tokens,
            text: echo(state, &last_user),
            reported: super::lock(&state.reported_usage).clone(),
            cache_read,
            cache_write,
        })
    }

    fn output_tokens(&self) -> u64 {
        match &self.reported {
            Some(usage) => usage
                .get("output_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            None => count_tokens(&self.text),
        }
    }

    /// The usage of the message (of a stream's `message_start`, whose
    /// output so far is `output_tokens`).
    fn usage(&self, output_tokens: u64) -> Value {
        let mut usage = self.reported.clone().unwrap_or_else(|| {
            json!({
                "input_tokens": self.input_tokens,
                "cache_creation_input_tokens": self.cache_write,
                "cache_read_input_tokens": self.cache_read,
            })
        });
        if let Some(u) = usage.as_object_mut() {
            u.insert("output_tokens".to_string(), json!(output_tokens));
        }
        usage
    }

    /// The message with `content`, its stop and `output_tokens`.
    fn with(&self, content: Value, stop_reason: Value, output_tokens: u64) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": self.usage(output_tokens),
        })
    }

    fn message(&self) -> Value {
        let content = json!([{"type": "text", "text": self.text}]);
        self.with(content, json!("end_turn"), self.output_tokens())
    }

    /// The stream, event by event; with `unknown`, an event of a type
    /// Anthropic does not define after the first.
    fn events(&self, unknown: bool) -> Vec<String> {
        let mut events = vec![json!({
            "type": "message_start",
            "message": self.with(json!([]), Value::Null, 1),
        })];
        if unknown {
            events.push(json!({"type": "mock_unknown", "note": "a type from the future"}));
        }
        events.extend([
            json!({
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }),
            json!({"type": "ping"}),
        ]);
        for piece in pieces(&self.text) {
            events.push(json!({
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            }));
        }
        events.extend([
            json!({"type": "content_block_stop", "index": 0}),
            json!({
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": self.output_tokens()},
            }),
            json!({"type": "message_stop"}),
        ]);
        events.iter().map(|event| named_event(event, &[])).collect()
    }
}

/// The text of `system` or of a message's `content`: a string, or blocks
/// whose text counts (`text` blocks, a `tool_use`'s input, a `tool_result`'s
/// content, itself a string or blocks).
fn blocks_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|block| match block.get("type").and_then(Value::as_str) {
                Some("tool_use") => block.get("input").map(Value::to_string).unwrap_or_default(),
                Some("tool_result") => blocks_text(block.get("content")),
                _ => block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            })
            .filter(|text| !text.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Anthropic's prompt cache as the mock plays it: the prompt is read as a
/// list of blocks (each tool, each system block, each message's content
/// blocks, a string being one), and a block with `cache_control` is a
/// breakpoint; more than four are refused with Anthropic's 400. The prefix
/// a breakpoint ends is cached when it has at least `min_tokens` (words,
/// the mock's tokens); a later call reads the longest cached prefix found at
/// a breakpoint or up to 20 blocks before one, and writes the rest up to
/// its last breakpoint. Tokens are the words of each block's text (a
/// tool's, its JSON).
pub struct PromptCache {
    min_tokens: u64,
    /// Hash of a prefix → its tokens.
    entries: HashMap<u64, u64>,
}

/// Blocks looked back from a breakpoint for an earlier entry.
const LOOKBACK: usize = 20;

impl PromptCache {
    pub(super) fn new(min_tokens: u64) -> Self {
        Self {
            min_tokens,
            entries: HashMap::new(),
        }
    }

    /// The tokens read and written, and the prompt's in all; `Err`:
    /// Anthropic's message refusing too many breakpoints.
    fn look_up(&mut self, body: &Value) -> Result<(u64, u64, u64), String> {
        let mut blocks: Vec<(String, u64, bool)> = Vec::new();
        let mut push = |role: &str, block: &Value| {
            let marked = block.get("cache_control").is_some();
            let mut bare = block.clone();
            if let Some(b) = bare.as_object_mut() {
                b.remove("cache_control");
            }
            let text = match role {
                "tool" => bare.to_string(),
                _ => blocks_text(Some(&Value::Array(vec![bare.clone()]))),
            };
            blocks.push((format!("{role}:{bare}"), count_tokens(&text), marked));
        };
        let list = |v: Option<&Value>| match v {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        for tool in list(body.get("tools")) {
            push("tool", &tool);
        }
        for block in list(body.get("system")) {
            push("system", &block);
        }
        for message in body
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let role = message
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or("user");
            for block in list(message.get("content")) {
                push(role, &block);
            }
        }
        let marks = blocks.iter().filter(|b| b.2).count();
        if marks > 4 {
            return Err(format!(
                "A maximum of 4 blocks with cache_control may be provided. Found {marks}."
            ));
        }
        // Each prefix's hash and tokens, and whether a breakpoint ends it.
        let mut prefixes = Vec::with_capacity(blocks.len());
        let (mut h, mut tokens) = (0u64, 0u64);
        for (text, n, marked) in &blocks {
            let mut hasher = DefaultHasher::new();
            (h, text).hash(&mut hasher);
            h = hasher.finish();
            tokens += n;
            prefixes.push((h, tokens, *marked));
        }
        let cacheable: Vec<(usize, u64, u64)> = prefixes
            .iter()
            .enumerate()
            .filter(|(_, (_, n, marked))| *marked && *n >= self.min_tokens)
            .map(|(i, (h, n, _))| (i, *h, *n))
            .collect();
        let mut read = 0;
        for &(b, _, _) in &cacheable {
            let back = prefixes
                .iter()
                .take(b + 1)
                .skip((b + 1).saturating_sub(LOOKBACK));
            if let Some(n) = back.rev().find_map(|(h, _, _)| self.entries.get(h)) {
                read = read.max(*n);
            }
        }
        let end = cacheable.last().map_or(0, |(_, _, n)| *n);
        for (_, h, n) in cacheable {
            self.entries.insert(h, n);
        }
        Ok((read, end.saturating_sub(read), tokens))
    }
}
