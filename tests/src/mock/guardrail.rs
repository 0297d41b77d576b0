//! Guardrail services as their published APIs answer, for the filter's
//! `guardrails.service` presets: OpenAI's moderation endpoint, Azure AI
//! Content Safety's text analysis, Bedrock's ApplyGuardrail and the
//! filter's own webhook contract. Each refuses a call in another shape (a
//! missing field, the wrong API version, no key) as the service would. A
//! text is flagged when it says [`FLAG`]; the services that mask replace
//! each e-mail address by their placeholder.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::{error_response, json_response, Body, RecordedRequest};

/// A text saying this is flagged by every preset.
pub const FLAG: &str = "FORBIDDEN-TOPIC";
/// The moderation path.
pub const MODERATIONS: &str = "/v1/moderations";
/// Azure AI Content Safety's text analysis.
pub const AZURE: &str = "/contentsafety/text:analyze";
/// The API version the Azure mock serves.
pub const AZURE_VERSION: &str = "api-version=2024-09-01";
/// The webhook's path.
pub const WEBHOOK: &str = "/check";

/// Whether `path` is one of the services'.
pub fn serves(path: &str) -> bool {
    matches!(path, MODERATIONS | AZURE | WEBHOOK) || bedrock_guardrail(path).is_some()
}

/// Bedrock's `/guardrail/{id}/version/{version}/apply`: the id and version.
fn bedrock_guardrail(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/guardrail/")?.strip_suffix("/apply")?;
    let (id, version) = rest.split_once("/version/")?;
    let id_ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric());
    let version_ok = version == "DRAFT" || version.parse::<u32>().is_ok_and(|v| v > 0);
    (id_ok && version_ok).then_some((id, version))
}

/// Each e-mail address of `text` replaced by `placeholder`.
fn mask_emails(text: &str, placeholder: &str) -> String {
    text.split(' ')
        .map(|w| match w.split_once('@') {
            Some((user, host)) if !user.is_empty() && host.contains('.') => placeholder,
            _ => w,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn flagged(text: &str) -> bool {
    text.contains(FLAG)
}

fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v?.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The service's answer to `req`.
pub fn answer(req: &RecordedRequest) -> Response<Body> {
    let bad = |message: &str| error_response(StatusCode::BAD_REQUEST, message, "invalid_request");
    let Some(body) = req.json() else {
        return bad("the body is not JSON");
    };
    match req.path.as_str() {
        MODERATIONS => {
            let input = match body.get("input") {
                Some(Value::String(s)) => Some(vec![s.clone()]),
                other => strings(other),
            };
            let (Some(input), Some(model)) = (input, body.get("model").and_then(Value::as_str))
            else {
                return bad("`input` (a string or strings) and `model` are required");
            };
            let results: Vec<Value> = input
                .iter()
                .map(|t| {
                    let f = flagged(t);
                    json!({"flagged": f, "categories": {"violence": f},
                           "category_scores": {"violence": if f { 0.97 } else { 0.01 }}})
                })
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"id": "modr-mock", "model": model, "results": results}),
            )
        }
        AZURE => {
            if req.query.as_deref() != Some(AZURE_VERSION) {
                return error_response(
                    StatusCode::NOT_FOUND,
                    "unsupported api-version",
                    "ApiVersionUnsupported",
                );
            }
            if req.header("ocp-apim-subscription-key").is_none() {
                return error_response(StatusCode::UNAUTHORIZED, "no key", "Unauthorized");
            }
            let Some(text) = body.get("text").and_then(Value::as_str) else {
                return bad("`text` is required");
            };
            if text.chars().count() > 10_000 {
                return bad("`text` is longer than 10000 characters");
            }
            let severity = if flagged(text) { 6 } else { 0 };
            json_response(
                StatusCode::OK,
                &json!({"blocklistsMatch": [], "categoriesAnalysis": [
                    {"category": "Hate", "severity": 0},
                    {"category": "SelfHarm", "severity": 0},
                    {"category": "Sexual", "severity": 0},
                    {"category": "Violence", "severity": severity}]}),
            )
        }
        WEBHOOK => {
            let Some(texts) = strings(body.get("texts")) else {
                return bad("`texts` (strings) is required");
            };
            let masked: Vec<String> = texts
                .iter()
                .map(|t| mask_emails(t, "<EMAIL_ADDRESS>"))
                .collect();
            let any = texts.iter().any(|t| flagged(t)) || masked != texts;
            json_response(StatusCode::OK, &json!({"flagged": any, "texts": masked}))
        }
        path => {
            if bedrock_guardrail(path).is_none() {
                return bad("no such guardrail");
            }
            let source_ok = matches!(
                body.get("source").and_then(Value::as_str),
                Some("INPUT" | "OUTPUT")
            );
            let texts: Option<Vec<String>> = body
                .get("content")
                .and_then(Value::as_array)
                .and_then(|items| {
                    items
                        .iter()
                        .map(|i| {
                            i.pointer("/text/text")
                                .and_then(Value::as_str)
                                .map(str::to_string)
                        })
                        .collect()
                });
            let (true, Some(texts)) = (source_ok, texts) else {
                return bad("`source` and `content[].text.text` are required");
            };
            let blocked = texts.iter().any(|t| flagged(t));
            let masked: Vec<String> = texts.iter().map(|t| mask_emails(t, "{EMAIL}")).collect();
            let (action, outputs) = if blocked {
                (
                    "GUARDRAIL_INTERVENED",
                    vec![json!({"text": "Sorry, I cannot help."})],
                )
            } else if masked != texts {
                (
                    "GUARDRAIL_INTERVENED",
                    masked.iter().map(|t| json!({"text": t})).collect(),
                )
            } else {
                ("NONE", Vec::new())
            };
            // A blocking content filter says so in its assessment.
            let assessments = if blocked {
                json!([{"contentPolicy": {"filters": [
                    {"type": "VIOLENCE", "confidence": "HIGH", "action": "BLOCKED"}]}}])
            } else {
                json!([])
            };
            json_response(
                StatusCode::OK,
                &json!({"action": action, "outputs": outputs, "assessments": assessments,
                        "usage": {"contentPolicyUnits": texts.len()}}),
            )
        }
    }
}
