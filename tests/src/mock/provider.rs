//! The mock as one provider of the filter's presets: it takes a call only in
//! the shape that provider takes it (its path, the model in the body or in
//! the path, its API version in a header or in the body) and refuses any
//! other as the provider would, and it answers errors in the provider's own
//! shape: Bedrock's `{"message"}` with the exception named in
//! `x-amzn-errortype` (429 `ThrottlingException`, 424
//! `ModelErrorException`), Vertex's Google error (429 `RESOURCE_EXHAUSTED`,
//! naming the quota it broke when told: [`super::MockUpstream::set_quota`]),
//! Anthropic's (529 `overloaded_error`), vLLM's
//! flat `{"object": "error"}`. A call it takes is answered as the API's own
//! path answers it.

use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::{error_response, gemini, json_response, lock, messages, Body, RecordedRequest, State};

/// A provider the mock can play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// `/v1/messages`, `anthropic-version: 2023-06-01`.
    Anthropic,
    /// bedrock-runtime's InvokeModel: `/model/{id}/invoke`, no `model` in
    /// the body, `"anthropic_version": "bedrock-2023-05-31"`, no stream.
    Bedrock,
    /// bedrock-mantle's `/anthropic/v1/messages`, `anthropic-version`.
    BedrockMantle,
    /// Claude on Vertex: `…/publishers/anthropic/models/{m}:rawPredict` (or
    /// `:streamRawPredict` for a stream), no `model`, `"anthropic_version":
    /// "vertex-2023-10-16"`; Gemini on Vertex:
    /// `…/publishers/google/models/{m}:generateContent` (or
    /// `:streamGenerateContent`).
    Vertex,
    /// The Gemini API: `/v1beta/models/{m}:generateContent` (or
    /// `:streamGenerateContent`), `/v1beta/openai/chat/completions`.
    Gemini,
    /// vLLM's OpenAI-compatible server: `/v1/chat/completions`,
    /// `/v1/completions`, `/v1/embeddings`, `/v1/responses` and
    /// `/v1/messages`, the model in the body.
    Vllm,
    /// `/v1/chat/completions`, `/v1/responses`.
    OpenAi,
    /// Azure OpenAI's v1 API: `/openai/v1/chat/completions`,
    /// `/openai/v1/responses`, the deployment in the body.
    AzureOpenAi,
}

/// An API version as Anthropic names them (`2023-06-01`; the SDK sends the
/// one it was built for).
fn dated(v: &str) -> bool {
    v.len() == 10
        && v.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            _ => b.is_ascii_digit(),
        })
}
const VERTEX_PREFIX: &str = "/v1/projects/";

/// The call as the API's own path takes it, or the provider's refusal.
pub(super) fn accept(p: Provider, r: &RecordedRequest) -> Result<RecordedRequest, String> {
    let body: Value = serde_json::from_slice(&r.body).map_err(|_| "body is not JSON")?;
    let mut plain = r.clone();
    let (path, model_in_path) = match p {
        Provider::Anthropic | Provider::BedrockMantle => {
            let want = match p {
                Provider::Anthropic => messages::PATH,
                _ => "/anthropic/v1/messages",
            };
            if r.path != want {
                return Err(format!("no route for {}", r.path));
            }
            if !r.header("anthropic-version").is_some_and(dated) {
                let got = r.header_all("anthropic-version");
                return Err(format!(
                    "anthropic-version: header is required, got {got:?}"
                ));
            }
            (messages::PATH, None)
        }
        Provider::Bedrock => {
            let id = r
                .path
                .strip_prefix("/model/")
                .and_then(|p| p.strip_suffix("/invoke"))
                .filter(|id| !id.is_empty() && !id.contains('/'))
                .ok_or_else(|| format!("UnknownOperationException: {}", r.path))?;
            versioned(&body, "bedrock-2023-05-31")?;
            if body.get("stream").is_some() {
                return Err("extraneous key [stream] is not permitted".into());
            }
            (messages::PATH, Some(decode(id)?))
        }
        Provider::Vertex => {
            let rest = r
                .path
                .strip_prefix(VERTEX_PREFIX)
                .ok_or_else(|| format!("no route for {}", r.path))?;
            let parts: Vec<&str> = rest.split('/').collect();
            let (model, stream) = match parts.as_slice() {
                [_, "locations", _, "publishers", "google", "models", m] => {
                    // Gemini's own call, on Vertex's path.
                    let path = format!("/v1beta/models/{m}");
                    if gemini::call_of(&path).is_none() {
                        return Err(format!("no method in {}", r.path));
                    }
                    plain.path = path;
                    return Ok(plain);
                }
                [_, "locations", _, "publishers", "anthropic", "models", m] => {
                    match (
                        m.strip_suffix(":rawPredict"),
                        m.strip_suffix(":streamRawPredict"),
                    ) {
                        (Some(m), _) => (m, false),
                        (_, Some(m)) => (m, true),
                        _ => return Err(format!("no method in {}", r.path)),
                    }
                }
                _ => return Err(format!("no route for {}", r.path)),
            };
            versioned(&body, "vertex-2023-10-16")?;
            if (body.get("stream") == Some(&Value::Bool(true))) != stream {
                return Err("a stream goes to :streamRawPredict, and only a stream".into());
            }
            (messages::PATH, Some(decode(model)?))
        }
        Provider::Gemini => {
            if r.path == "/v1beta/openai/chat/completions" && body.get("model").is_some() {
                ("/v1/chat/completions", None)
            } else if r.path.starts_with("/v1beta/models/") && gemini::call_of(&r.path).is_some() {
                return Ok(plain);
            } else {
                return Err(format!("no route for {}", r.path));
            }
        }
        Provider::Vllm => match r.path.as_str() {
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/responses"
            | "/v1/messages" => {
                if body.get("model").and_then(Value::as_str).is_none() {
                    return Err("model: Field required".into());
                }
                return Ok(plain);
            }
            _ => return Err(format!("Not Found: {}", r.path)),
        },
        Provider::OpenAi | Provider::AzureOpenAi => {
            let path = match p {
                Provider::AzureOpenAi => r.path.strip_prefix("/openai"),
                _ => Some(r.path.as_str()),
            };
            match path {
                Some(p @ ("/v1/chat/completions" | "/v1/responses")) => {
                    if body.get("model").and_then(Value::as_str).is_none() {
                        return Err("model: required".into());
                    }
                    (
                        if p == "/v1/responses" {
                            "/v1/responses"
                        } else {
                            "/v1/chat/completions"
                        },
                        None,
                    )
                }
                _ => return Err(format!("no route for {}", r.path)),
            }
        }
    };
    plain.path = path.to_string();
    plain.query = None;
    if let Some(model) = model_in_path {
        let mut b = body;
        if let Some(o) = b.as_object_mut() {
            o.remove("anthropic_version");
            o.insert("model".into(), Value::String(model));
        }
        plain.body = b.to_string().into();
    }
    Ok(plain)
}

/// The body names the provider's version and no `model` (it is in the path).
fn versioned(body: &Value, version: &str) -> Result<(), String> {
    if body.get("anthropic_version").and_then(Value::as_str) != Some(version) {
        return Err(format!("anthropic_version: must be {version}"));
    }
    if body.get("model").is_some() {
        return Err("extraneous key [model] is not permitted".into());
    }
    Ok(())
}

/// A percent-encoded path segment, decoded.
fn decode(segment: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(segment.len());
    let mut bytes = segment.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex: Vec<u8> = bytes.by_ref().take(2).collect();
            let hex = std::str::from_utf8(&hex).map_err(|_| "bad escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad escape")?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| "bad escape".into())
}

/// An error of `status` in the provider's shape.
pub(super) fn error(
    state: &State,
    p: Provider,
    status: StatusCode,
    message: &str,
) -> Response<Body> {
    match p {
        Provider::Anthropic | Provider::BedrockMantle => {
            messages::error_response(state, status, message)
        }
        Provider::Bedrock => {
            let kind = match status.as_u16() {
                429 => "ThrottlingException",
                400 if lock(&state.quota).is_some() => "ServiceQuotaExceededException",
                400 => "ValidationException",
                404 => "ResourceNotFoundException",
                424 => "ModelErrorException",
                503 => "ServiceUnavailableException",
                _ => "InternalServerException",
            };
            let body = match status.as_u16() {
                // With the status the model answered Bedrock with.
                424 => json!({ "message": message, "originalStatusCode": 500 }),
                _ => json!({ "message": message }),
            };
            let mut r = json_response(status, &body);
            let named = format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/");
            if let Ok(v) = HeaderValue::from_str(&named) {
                r.headers_mut().insert("x-amzn-errortype", v);
            }
            r
        }
        Provider::Vertex | Provider::Gemini => match lock(&state.quota).as_deref() {
            Some(quota) if status == StatusCode::TOO_MANY_REQUESTS => {
                gemini::quota_response(message, quota)
            }
            _ => gemini::error_response(status, message),
        },
        Provider::Vllm => json_response(
            status,
            &json!({"object": "error", "message": message, "code": status.as_u16(),
                "type": if status.is_client_error() { "BadRequestError" } else { "InternalServerError" }}),
        ),
        Provider::OpenAi | Provider::AzureOpenAi => error_response(status, message, "mock_status"),
    }
}
