//! The OpenAI Responses API (`POST /v1/responses`) as the mock answers it: a
//! `response` object, or the named SSE events OpenAI streams (`response.created`
//! … `response.output_text.delta` … `response.completed`, no `[DONE]`), in the
//! shapes the official SDK parses. A `previous_response_id` must name a response
//! this instance stored, as only the backend that produced it holds its state.

use std::sync::atomic::Ordering;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::{
    count_tokens, echo, error_response, json_response, lock, named_event, pieces, stream, unix_now,
    Body, InFlight, RecordedRequest, State, HEADER_SSE,
};

/// The path of the API.
pub(super) const PATH: &str = "/v1/responses";

/// Response ids kept for `previous_response_id`.
const MAX_STORED: usize = 4096;

/// Answers one call: the JSON `response`, its stream, or OpenAI's 400.
pub(super) fn answer(
    state: &State,
    req: &RecordedRequest,
    chunk_delay_ms: u64,
    in_flight: InFlight,
) -> Response<Body> {
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(body @ Value::Object(_)) => body,
        _ => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "We could not parse the JSON body of your request.",
                "invalid_json",
            )
        }
    };
    let reply = match Reply::new(state, &body) {
        Ok(reply) => reply,
        Err((message, code)) => return error_response(StatusCode::BAD_REQUEST, &message, code),
    };
    if reply.store {
        let mut stored = lock(&state.stored_responses);
        if stored.len() >= MAX_STORED {
            stored.pop_front();
        }
        stored.push_back(reply.id.clone());
    }
    if reply.stream {
        let unknown = req.header(HEADER_SSE) == Some("unknown");
        stream(state, req, reply.events(unknown), chunk_delay_ms, in_flight)
    } else {
        json_response(StatusCode::OK, &reply.response("completed", true))
    }
}

/// Everything the answer is derived from, computed once per call.
struct Reply {
    id: String,
    message_id: String,
    created_at: u64,
    body: Value,
    model: String,
    stream: bool,
    store: bool,
    input_tokens: u64,
    text: String,
}

impl Reply {
    /// The reply to `body`, or OpenAI's message and code for a 400.
    fn new(state: &State, body: &Value) -> Result<Self, (String, &'static str)> {
        let Some(model) = body.get("model").and_then(Value::as_str) else {
            return Err((
                "Missing required parameter: 'model'.".to_string(),
                "missing_required_parameter",
            ));
        };
        if let Some(previous) = body.get("previous_response_id").and_then(Value::as_str) {
            if !lock(&state.stored_responses)
                .iter()
                .any(|id| id == previous)
            {
                return Err((
                    format!("Previous response with id '{previous}' not found."),
                    "previous_response_not_found",
                ));
            }
        }
        let sequence = state.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        let (all, last_user) = conversation(body);
        Ok(Self {
            id: format!("resp_{}-{sequence}", state.name),
            message_id: format!("msg_{}-{sequence}", state.name),
            created_at: unix_now(),
            body: body.clone(),
            model: model.to_string(),
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            store: body.get("store").and_then(Value::as_bool) != Some(false),
            input_tokens: count_tokens(&all),
            text: echo(state, &last_user),
        })
    }

    fn usage(&self) -> Value {
        let output_tokens = count_tokens(&self.text);
        json!({
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + output_tokens,
        })
    }

    /// A request field echoed back in the `response`, `null` when absent.
    fn field(&self, name: &str) -> Value {
        self.body.get(name).cloned().unwrap_or(Value::Null)
    }

    fn output_text(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    /// The assistant message item, `completed` with its text or `in_progress` and empty.
    fn message(&self, completed: bool) -> Value {
        let (status, content) = match completed {
            true => ("completed", vec![self.output_text(&self.text)]),
            false => ("in_progress", Vec::new()),
        };
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    /// The `response` object with `status`; output and usage once `complete`.
    fn response(&self, status: &str, complete: bool) -> Value {
        let (output, usage) = match complete {
            true => (vec![self.message(true)], self.usage()),
            false => (Vec::new(), Value::Null),
        };
        let or = |name: &str, default: Value| self.body.get(name).cloned().unwrap_or(default);
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": or("background", json!(false)),
            "completed_at": if complete { json!(self.created_at) } else { Value::Null },
            "error": null,
            "incomplete_details": null,
            "instructions": self.field("instructions"),
            "max_output_tokens": self.field("max_output_tokens"),
            "max_tool_calls": null,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": or("parallel_tool_calls", json!(true)),
            "previous_response_id": self.field("previous_response_id"),
            "reasoning": {"effort": null, "summary": null},
            "service_tier": "default",
            "store": self.store,
            "temperature": or("temperature", json!(1.0)),
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": or("tool_choice", json!("auto")),
            "tools": or("tools", json!([])),
            "top_logprobs": 0,
            "top_p": or("top_p", json!(1.0)),
            "truncation": "disabled",
            "usage": usage,
            "user": self.field("user"),
            "metadata": or("metadata", json!({})),
        })
    }

    /// The stream, event by event, numbered from 0; with `unknown`, an event
    /// of a type OpenAI does not define after the first.
    fn events(&self, unknown: bool) -> Vec<String> {
        let item = |name: &str, extra: Value| {
            let mut event = json!({"type": name, "item_id": self.message_id, "output_index": 0});
            if let (Some(event), Value::Object(extra)) = (event.as_object_mut(), extra) {
                event.extend(extra);
            }
            event
        };
        let part = |text: &str| json!({"part": self.output_text(text), "content_index": 0});
        let mut events = vec![
            json!({"type": "response.created", "response": self.response("in_progress", false)}),
        ];
        if unknown {
            events.push(json!({"type": "response.mock_unknown", "note": "a type from the future"}));
        }
        events.extend([
            json!({"type": "response.in_progress", "response": self.response("in_progress", false)}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": self.message(false)}),
            item("response.content_part.added", part("")),
        ]);
        for piece in pieces(&self.text) {
            events.push(item(
                "response.output_text.delta",
                json!({"content_index": 0, "delta": piece, "logprobs": []}),
            ));
        }
        events.extend([
            item(
                "response.output_text.done",
                json!({"content_index": 0, "text": self.text, "logprobs": []}),
            ),
            item("response.content_part.done", part(&self.text)),
            json!({"type": "response.output_item.done", "output_index": 0, "item": self.message(true)}),
            json!({"type": "response.completed", "response": self.response("completed", true)}),
        ]);
        events
            .iter()
            .enumerate()
            .map(|(n, event)| named_event(event, &[("sequence_number", json!(n))]))
            .collect()
    }
}

/// The text of the whole input (instructions and every item) and of the last
/// user message: `input` is a string (one user message) or a list of items,
/// messages (`content` a string or `input_text` parts) and others (function
/// calls and their outputs, reasoning, references), whose text counts as input.
fn conversation(body: &Value) -> (String, String) {
    let mut all: Vec<String> = body
        .get("instructions")
        .and_then(Value::as_str)
        .map(str::to_string)
        .into_iter()
        .collect();
    let mut last_user = String::new();
    match body.get("input") {
        Some(Value::String(text)) => {
            all.push(text.clone());
            last_user.clone_from(text);
        }
        Some(Value::Array(items)) => {
            for item in items {
                let text = item_text(item);
                if item.get("role").and_then(Value::as_str) == Some("user") {
                    last_user.clone_from(&text);
                }
                all.push(text);
            }
        }
        _ => {}
    }
    (all.join(" "), last_user)
}

/// The text an input item carries: a message's content, a function call's
/// arguments, a tool's output.
fn item_text(item: &Value) -> String {
    let texts = |value: Option<&Value>| match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    match item.get("type").and_then(Value::as_str) {
        Some("function_call") => texts(item.get("arguments")),
        Some("function_call_output") => texts(item.get("output")),
        _ => texts(item.get("content")),
    }
}
