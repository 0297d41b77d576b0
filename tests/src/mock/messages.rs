//! The Anthropic Messages API (`POST /v1/messages`) as the mock answers it: a
//! `message`, or the named SSE events Anthropic streams (`message_start`,
//! `content_block_start`, `ping`, `content_block_delta`…, `content_block_stop`,
//! `message_delta`, `message_stop`) with the usage split between the first and
//! the last but one, and errors in Anthropic's shape with the type its SDK maps
//! to the right exception. `max_tokens` is required, as Anthropic requires it.

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
        Ok(Self {
            id: format!("msg_{}-{sequence}", state.name),
            model: model.to_string(),
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            input_tokens: count_tokens(&all.join(" ")),
            text: echo(state, &last_user),
            reported: super::lock(&state.reported_usage).clone(),
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
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
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
