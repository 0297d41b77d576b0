//! The Gemini API's `generateContent` and `streamGenerateContent` as the mock
//! answers them, in the shapes the official Google Gen AI SDK parses: the model
//! is in the path (`POST /v1beta/models/{model}:generateContent`), the answer a
//! `GenerateContentResponse` (`candidates`, `usageMetadata`, `modelVersion`,
//! `responseId`), the stream (`:streamGenerateContent?alt=sse`) one such
//! response per `data:` event, each event ended by `\r\n\r\n` as Google's
//! servers end them, with the usage so far in every event and no `[DONE]`:
//! the stream ends with the candidate's `finishReason`. Errors come in
//! Google's shape, `{"error":{"code","message","status"}}`, with the
//! `google.rpc` status name of the HTTP status.

use std::sync::atomic::Ordering;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::{
    count_tokens, echo, json_response, pieces, stream, Body, InFlight, RecordedRequest, State,
};

/// What ends each event of Google's streams.
const EVENT_END: &str = "\r\n\r\n";

/// The methods of the API the mock answers, as the path's last segment
/// names them after the model (`models/{model}:{method}`).
const GENERATE: &str = "generateContent";
const STREAM: &str = "streamGenerateContent";

/// The model and whether it streams, when `path` is one of the API's
/// generation calls (`/{version}/models/{model}:generateContent` or
/// `:streamGenerateContent`, the model in one segment).
pub(super) fn call_of(path: &str) -> Option<(&str, bool)> {
    let (head, method) = path.rsplit_once(':')?;
    let stream = match method {
        GENERATE => false,
        STREAM => true,
        _ => return None,
    };
    let (models, model) = head.rsplit_once('/')?;
    let version_ok = models
        .strip_suffix("/models")
        .and_then(|v| v.strip_prefix('/'))
        .is_some_and(|v| !v.is_empty() && !v.contains('/'));
    (version_ok && !model.is_empty()).then_some((model, stream))
}

/// The `google.rpc` status Google's APIs answer an HTTP status with.
pub(super) fn status_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ if status.is_client_error() => "FAILED_PRECONDITION",
        _ => "INTERNAL",
    }
}

/// Google's 429 for the quota `quota_id` (`…PerMinute…`, `…PerDay…`), with
/// the details the Gemini API and Vertex send: a `google.rpc.QuotaFailure`
/// naming the quota, a `Help` and a `RetryInfo`.
pub(super) fn quota_response(message: &str, quota_id: &str) -> Response<Body> {
    let status = StatusCode::TOO_MANY_REQUESTS;
    let mut body = error_body(status, message);
    if let Some(error) = body.get_mut("error").and_then(Value::as_object_mut) {
        let details = json!([
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global"},
                "quotaValue": "60"}]},
            {"@type": "type.googleapis.com/google.rpc.Help", "links": [{
                "description": "Learn more about Gemini API quotas",
                "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"}
        ]);
        error.insert("details".into(), details);
    }
    json_response(status, &body)
}

/// An error in Google's shape.
pub(super) fn error_response(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &error_body(status, message))
}

/// Google's error object: `{"error": {"code", "message", "status"}}`.
fn error_body(status: StatusCode, message: &str) -> Value {
    json!({"error": {
        "code": status.as_u16(),
        "message": message,
        "status": status_name(status),
    }})
}

/// Answers one call on a generation path: the JSON response, its SSE
/// stream (`alt=sse`), or the JSON array Google streams without it; or
/// Google's 400.
pub(super) fn answer(
    state: &State,
    req: &RecordedRequest,
    cached_tokens: u64,
    chunk_delay_ms: u64,
    in_flight: InFlight,
) -> Response<Body> {
    let Some((model, streamed)) = call_of(&req.path) else {
        return error_response(StatusCode::NOT_FOUND, "Not Found");
    };
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(body @ Value::Object(_)) => body,
        _ => {
            let message = "Invalid JSON payload received.";
            return error_response(StatusCode::BAD_REQUEST, message);
        }
    };
    let reply = match Reply::new(state, model, &body, cached_tokens) {
        Ok(reply) => reply,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    let sse = req
        .query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|p| p == "alt=sse"));
    match (streamed, sse) {
        (false, _) => json_response(StatusCode::OK, &reply.response()),
        (true, true) => stream(state, req, reply.events(), chunk_delay_ms, in_flight),
        (true, false) => json_response(StatusCode::OK, &Value::Array(reply.chunks())),
    }
}

/// The prompt's texts of a request as one text: the system instruction's
/// and every turn's parts (their `text`, a `functionCall`'s arguments, a
/// `functionResponse`'s response), in order.
pub(super) fn prompt_text(body: &Value) -> String {
    let turns = body.get("contents").and_then(Value::as_array);
    std::iter::once(body.get("systemInstruction"))
        .chain(turns.into_iter().flatten().map(Some))
        .map(|content| parts_text(content))
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text of a `Content`'s parts.
fn parts_text(content: Option<&Value>) -> String {
    let parts = content
        .and_then(|c| c.get("parts"))
        .and_then(Value::as_array);
    parts
        .into_iter()
        .flatten()
        .filter_map(|part| {
            if let Some(text) = part.get("text").and_then(Value::as_str) {
                Some(text.to_string())
            } else if let Some(call) = part.get("functionCall") {
                call.get("args").map(Value::to_string)
            } else {
                part.get("functionResponse")
                    .and_then(|r| r.get("response"))
                    .map(Value::to_string)
            }
        })
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Everything the answer is derived from, computed once per call.
struct Reply {
    id: String,
    model: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    /// The answer's words, cut to `maxOutputTokens`.
    text: String,
    /// `STOP`, or `MAX_TOKENS` when the cap cut the answer.
    finish: &'static str,
}

impl Reply {
    /// The reply to `body`, or the message of Google's 400.
    fn new(state: &State, model: &str, body: &Value, cached_tokens: u64) -> Result<Self, String> {
        let turns = body.get("contents").and_then(Value::as_array);
        let turns = turns.filter(|t| !t.is_empty()).ok_or_else(|| {
            "* GenerateContentRequest.contents: contents is not specified".to_string()
        })?;
        let cap = body.pointer("/generationConfig/maxOutputTokens");
        let cap = match cap {
            None => None,
            Some(v) => match v.as_u64() {
                Some(n @ 1..) => Some(n),
                _ => {
                    return Err(
                        "* GenerateContentRequest.generation_config.max_output_tokens: \
                         must be a positive integer"
                            .to_string(),
                    )
                }
            },
        };
        let last_user = turns
            .iter()
            .rev()
            .find(|t| t.get("role").and_then(Value::as_str).unwrap_or("user") == "user")
            .map(|t| parts_text(Some(t)))
            .unwrap_or_default();
        let full = echo(state, &last_user);
        let words: Vec<&str> = full.split_whitespace().collect();
        let (text, finish) = match cap.and_then(|c| usize::try_from(c).ok()) {
            Some(c) if c < words.len() => (
                words.iter().take(c).copied().collect::<Vec<_>>().join(" "),
                "MAX_TOKENS",
            ),
            _ => (full.clone(), "STOP"),
        };
        let sequence = state.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Self {
            id: format!("gem-{}-{sequence}", state.name),
            model: model.to_string(),
            prompt_tokens: count_tokens(&prompt_text(body)),
            cached_tokens,
            text,
            finish,
        })
    }

    /// `usageMetadata` with `candidates` output tokens so far.
    fn usage(&self, candidates: u64) -> Value {
        let mut usage = json!({
            "promptTokenCount": self.prompt_tokens,
            "candidatesTokenCount": candidates,
            "totalTokenCount": self.prompt_tokens + candidates,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": self.prompt_tokens}],
        });
        if let (true, Some(u)) = (self.cached_tokens > 0, usage.as_object_mut()) {
            u.insert(
                "cachedContentTokenCount".to_string(),
                json!(self.cached_tokens),
            );
        }
        usage
    }

    /// One response: a candidate with `text`, finished with `finish`.
    fn with(&self, text: &str, finish: Option<&str>, candidates: u64) -> Value {
        let mut candidate = json!({
            "content": {"parts": [{"text": text}], "role": "model"},
            "index": 0,
        });
        if let (Some(f), Some(c)) = (finish, candidate.as_object_mut()) {
            c.insert("finishReason".to_string(), json!(f));
        }
        json!({
            "candidates": [candidate],
            "usageMetadata": self.usage(candidates),
            "modelVersion": self.model,
            "responseId": self.id,
        })
    }

    fn response(&self) -> Value {
        self.with(&self.text, Some(self.finish), count_tokens(&self.text))
    }

    /// The stream's responses: a piece of the text each, the usage so far
    /// in each, the last with the finish reason.
    fn chunks(&self) -> Vec<Value> {
        let pieces = pieces(&self.text);
        let last = pieces.len().saturating_sub(1);
        let mut so_far = String::new();
        pieces
            .iter()
            .enumerate()
            .map(|(i, piece)| {
                so_far.push_str(piece);
                let finish = (i == last).then_some(self.finish);
                self.with(piece, finish, count_tokens(&so_far))
            })
            .collect()
    }

    fn events(&self) -> Vec<String> {
        self.chunks()
            .iter()
            .map(|c| format!("data: {c}{EVENT_END}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_the_generation_paths() {
        for (path, want) in [
            (
                "/v1beta/models/gemini-2.5-flash:generateContent",
                Some(("gemini-2.5-flash", false)),
            ),
            ("/v1/models/g:streamGenerateContent", Some(("g", true))),
            ("/v1beta/models/:generateContent", None),
            ("/v1beta/models/g:countTokens", None),
            ("/models/g:generateContent", None),
            ("/a/b/models/g:generateContent", None),
            ("/v1/chat/completions", None),
        ] {
            assert_eq!(call_of(path), want, "{path}");
        }
    }

    #[test]
    fn the_prompt_is_every_part_in_order() {
        let body = json!({
            "systemInstruction": {"parts": [{"text": "be brief"}]},
            "contents": [
                {"role": "user", "parts": [{"text": "a"}, {"text": "b"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"x": 1}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"y": 2}}}]},
            ],
        });
        assert_eq!(prompt_text(&body), r#"be brief a b {"x":1} {"y":2}"#);
    }
}
