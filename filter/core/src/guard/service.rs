//! `guardrails.service`: a guardrail service the filter asks about a prompt
//! before the call leaves, by a callout within the call's budget. The
//! prompt's texts go out, a verdict comes back (flagged or not, and for the
//! services that can, the texts masked), and the service's `action` says
//! what a flagged call becomes: `block`, `mask` or `log`, as a rule's. A
//! service that does not answer in time, or answers what cannot be read,
//! is the service's failure: the call goes on (`on_error: allow`) or is
//! refused (`refuse`), counted either way. With `mode: parallel` the call
//! goes upstream while the service is asked, and its answer is held until
//! the verdict (which cannot mask: the prompt has already left).
//!
//! Each preset speaks one service's published API:
//! - `openai_moderation`: `POST /v1/moderations`, `{"model", "input": [texts]}`;
//!   flagged when a result is;
//! - `azure_content_safety`: `POST /contentsafety/text:analyze`, the texts
//!   joined into its `text` (at most 10,000 characters, its limit); flagged
//!   when a category's severity reaches `threshold` or a blocklist matched;
//! - `bedrock_guardrail`: `ApplyGuardrail`, `POST
//!   /guardrail/{id}/version/{version}/apply` with each text a `content`
//!   item; flagged when its `action` is `GUARDRAIL_INTERVENED`, its
//!   `outputs` the masked texts (the SigV4 signature is the cluster's
//!   upstream filter's, as for Bedrock itself);
//! - `webhook`: the filter's own contract, `POST /check` with
//!   `{"api", "texts": [..]}`, answered `{"flagged": bool, "texts": [..]?}`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::side::{On, Side};
use super::{string_at, Action};
use crate::config::error::ConfigError;
use crate::config::service::{Callout, Defaults, RawService, Service};
use crate::config::setting::{Row, Setting};
use crate::json::Json;

/// `timeout_ms`: a guardrail service may slow a call by this much, never
/// more than the call's own budget.
const TIMEOUT_MS: Setting<u64> = Setting::range("timeout_ms", 500, 1, 30_000);
/// `threshold`: the least Azure severity that flags.
const THRESHOLD: Setting<u8> = Setting::range("threshold", 4, 1, 7);
/// `model`: OpenAI's moderation model.
const MODEL: Setting<&str> = Setting::any("model", "omni-moderation-latest");
/// `guardrail_version`: Bedrock's.
const VERSION: Setting<&str> = Setting::any("guardrail_version", "DRAFT");
/// The path a preset's `path` defaults to (see each preset).
const PATH: Setting<&str> = Setting::any("path", "/v1/moderations");

/// The service's settings.
pub const SETTINGS: &[&dyn Row] = &[&TIMEOUT_MS, &THRESHOLD, &MODEL, &VERSION];

/// Azure AI Content Safety reads at most this many characters a call.
const AZURE_MAX_CHARS: usize = 10_000;
/// Azure's API version the preset speaks.
const AZURE_PATH: &str = "/contentsafety/text:analyze?api-version=2024-09-01";

/// Which service's API is spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// OpenAI's moderation endpoint (or one of its shape).
    OpenAiModeration,
    /// Azure AI Content Safety, text analysis.
    AzureContentSafety,
    /// Amazon Bedrock's ApplyGuardrail.
    BedrockGuardrail,
    /// The filter's own contract.
    Webhook,
}

impl Preset {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "openai_moderation" => Self::OpenAiModeration,
            "azure_content_safety" => Self::AzureContentSafety,
            "bedrock_guardrail" => Self::BedrockGuardrail,
            "webhook" => Self::Webhook,
            _ => return None,
        })
    }

    /// It can answer with the texts masked.
    fn masks(self) -> bool {
        matches!(self, Self::BedrockGuardrail | Self::Webhook)
    }
}

/// What becomes of a call the service failed to judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// It goes on unjudged (fail-open).
    Allow,
    /// It is refused, 503 (fail-closed).
    Refuse,
}

/// `guardrails.service` as written. Read from the JSON value by hand: a
/// derived reader of its own would cost the module more than this.
#[derive(Debug, Default, Clone)]
pub struct RawGuardService {
    /// The name metrics, spans and the refusal give it, default `service`.
    pub name: Option<String>,
    /// Which API it speaks.
    pub preset: Option<String>,
    /// The Envoy cluster that reaches it.
    pub cluster: Option<String>,
    /// `:authority`, default the cluster name.
    pub authority: Option<String>,
    /// `:path`, default the preset's.
    pub path: Option<String>,
    /// Extra request headers (e.g. its credential).
    pub headers: Option<BTreeMap<String, String>>,
    /// Wait for the verdict, ms.
    pub timeout_ms: Option<u64>,
    /// `block`, `mask` or `log`.
    pub action: Option<String>,
    /// `allow` or `refuse`.
    pub on_error: Option<String>,
    /// `before` or `parallel`.
    pub mode: Option<String>,
    /// `prompt`, `answer` or `both`.
    pub on: Option<String>,
    /// OpenAI's moderation model.
    pub model: Option<String>,
    /// Azure's least severity that flags.
    pub threshold: Option<u8>,
    /// Bedrock's guardrail id.
    pub guardrail_id: Option<String>,
    /// Bedrock's guardrail version.
    pub guardrail_version: Option<String>,
}

/// The compiled `guardrails.service`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardService {
    /// Its name (a label value).
    pub name: String,
    /// Its API.
    pub preset: Preset,
    /// Where it is and how it is asked.
    pub service: Service,
    /// What a flagged call becomes.
    pub action: Action,
    /// What a call it failed to judge becomes.
    pub on_error: OnError,
    /// Asked while the call goes upstream, its answer held for the verdict
    /// (`mode: parallel`), rather than before it leaves.
    pub parallel: bool,
    /// What it is asked about: prompts, answers or both.
    pub on: On,
    model: String,
    threshold: u8,
}

/// Why the service gave no verdict (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The host refused to send the callout.
    Dispatch,
    /// No answer in time (Envoy's 504), or the connection failed.
    Timeout,
    /// An answer other than 200.
    Status,
    /// A body that is no verdict of the preset's shape (or masked texts
    /// that do not match the texts sent).
    Invalid,
    /// More text than the service reads in one call.
    TooLong,
    /// A streamed answer, which is not sent to the service.
    Stream,
    /// An answer asked about in parallel came whole, longer than the
    /// proxy holds, before the verdict.
    AnswerTooLong,
    /// Another backend's answer (a failover's, a hedge's), which is not
    /// sent to the service.
    Failover,
}

impl Failure {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch",
            Self::Timeout => "timeout",
            Self::Status => "status",
            Self::Invalid => "invalid",
            Self::TooLong => "too_long",
            Self::Stream => "stream",
            Self::AnswerTooLong => "answer_too_long",
            Self::Failover => "failover",
        }
    }
}

/// The service's verdict on the texts sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// Nothing flagged.
    Pass,
    /// Flagged; with the texts as the service masked them, one per text
    /// sent, when a masking service masked them (`None` from a masking
    /// service: it refuses the call).
    Flagged(Option<Vec<String>>),
}

impl RawGuardService {
    /// The section as written, each field of its type, no other; errors
    /// name fields relative to it (`.` the section itself).
    pub fn read(value: &Value) -> Result<Self, ConfigError> {
        let Value::Object(members) = value else {
            return Err(ConfigError::new(".", "is not an object"));
        };
        let mut r = Self::default();
        for (name, v) in members {
            let field = name.as_str();
            let text = || {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ConfigError::new(field, "is not a string"))
            };
            let whole = || {
                v.as_u64()
                    .ok_or_else(|| ConfigError::new(field, "is not a whole number"))
            };
            match field {
                "name" => r.name = Some(text()?),
                "preset" => r.preset = Some(text()?),
                "cluster" => r.cluster = Some(text()?),
                "authority" => r.authority = Some(text()?),
                "path" => r.path = Some(text()?),
                "action" => r.action = Some(text()?),
                "on_error" => r.on_error = Some(text()?),
                "mode" => r.mode = Some(text()?),
                "on" => r.on = Some(text()?),
                "model" => r.model = Some(text()?),
                "guardrail_id" => r.guardrail_id = Some(text()?),
                "guardrail_version" => r.guardrail_version = Some(text()?),
                "timeout_ms" => r.timeout_ms = Some(whole()?),
                "threshold" => r.threshold = Some(u8::try_from(whole()?).unwrap_or(u8::MAX)),
                "headers" => r.headers = Some(string_map(v)?),
                _ => return Err(ConfigError::new(field, "is no field of the service")),
            }
        }
        Ok(r)
    }
}

/// `mode`: asked in parallel with the trip upstream (true) or before it;
/// never in parallel to mask.
fn parallel(mode: Option<&str>, action: Action) -> Result<bool, ConfigError> {
    let parallel = match mode {
        None | Some("before") => false,
        Some("parallel") => true,
        Some(_) => return Err(ConfigError::new("mode", "is `before` or `parallel`")),
    };
    if parallel && action == Action::Mask {
        return Err(ConfigError::new(
            "mode",
            "`parallel` cannot `mask`: the prompt leaves before the service's masked texts \
             come; ask it `before` to mask, or `block` or `log` in parallel",
        ));
    }
    Ok(parallel)
}

/// `headers`: an object of strings.
fn string_map(v: &Value) -> Result<BTreeMap<String, String>, ConfigError> {
    let Value::Object(headers) = v else {
        return Err(ConfigError::new("headers", "is not an object of strings"));
    };
    let mut map = BTreeMap::new();
    for (k, h) in headers {
        let h = h
            .as_str()
            .ok_or_else(|| ConfigError::new(format!("headers.{k}"), "is not a string"))?;
        map.insert(k.clone(), h.to_string());
    }
    Ok(map)
}

impl GuardService {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawGuardService) -> Result<Self, ConfigError> {
        let preset = match raw.preset.as_deref() {
            None => return Err(ConfigError::new("preset", "is required")),
            Some(p) => Preset::parse(p).ok_or_else(|| {
                ConfigError::new(
                    "preset",
                    "is `openai_moderation`, `azure_content_safety`, `bedrock_guardrail` or \
                     `webhook`",
                )
            })?,
        };
        let name = raw.name.unwrap_or_else(|| "service".to_string());
        if !crate::config::check::is_label(&name, 64) {
            return Err(ConfigError::new("name", "is 1 to 64 of `A-Za-z0-9_-`"));
        }
        let action = match raw.action.as_deref() {
            None => Action::Block,
            Some(a) => Action::parse(a)
                .ok_or_else(|| ConfigError::new("action", "is `block`, `mask` or `log`"))?,
        };
        if action == Action::Mask && !preset.masks() {
            return Err(ConfigError::new(
                "action",
                "`mask` needs a service that answers the texts masked: `bedrock_guardrail` or \
                 `webhook`",
            ));
        }
        let on_error = match raw.on_error.as_deref() {
            None | Some("allow") => OnError::Allow,
            Some("refuse") => OnError::Refuse,
            Some(_) => return Err(ConfigError::new("on_error", "is `allow` or `refuse`")),
        };
        let parallel = parallel(raw.mode.as_deref(), action)?;
        let on = match raw.on.as_deref() {
            None => On::Prompt,
            Some(o) => On::parse(o)
                .ok_or_else(|| ConfigError::new("on", "is `prompt`, `answer` or `both`"))?,
        };
        let path = match (raw.path, preset) {
            (Some(p), _) => p,
            (None, Preset::OpenAiModeration) => PATH.default.to_string(),
            (None, Preset::AzureContentSafety) => AZURE_PATH.to_string(),
            (None, Preset::Webhook) => "/check".to_string(),
            (None, Preset::BedrockGuardrail) => {
                let id = raw
                    .guardrail_id
                    .filter(|i| valid_segment(i))
                    .ok_or_else(|| {
                        ConfigError::new(
                            "guardrail_id",
                            "is required for `bedrock_guardrail` (unless `path` is written): its \
                         id, of `A-Za-z0-9`",
                        )
                    })?;
                let version = VERSION.or_string(raw.guardrail_version);
                if !valid_segment(&version) {
                    return Err(ConfigError::new(
                        "guardrail_version",
                        "is `DRAFT` or a version number",
                    ));
                }
                format!("/guardrail/{id}/version/{version}/apply")
            }
        };
        let service = Service::compile(
            RawService {
                cluster: raw.cluster,
                authority: raw.authority,
                path: Some(path),
                headers: raw.headers,
                timeout_ms: raw.timeout_ms,
            },
            Defaults {
                path: PATH,
                timeout: TIMEOUT_MS,
            },
        )?;
        Ok(Self {
            name,
            preset,
            service,
            action,
            on_error,
            parallel,
            on,
            model: MODEL.or_string(raw.model),
            threshold: THRESHOLD.read(raw.threshold)?,
        })
    }

    /// The callout asking about `texts` of a call of `api`, of its prompt
    /// or its answer (`side`): its headers and body; `Err(TooLong)` when the
    /// service cannot read them in one call.
    pub fn request(&self, texts: &[&str], api: &str, side: Side) -> Result<Callout, Failure> {
        let body = match self.preset {
            Preset::OpenAiModeration => json!({"model": self.model, "input": texts}),
            Preset::AzureContentSafety => {
                let text = texts.join("\n");
                if text.chars().count() > AZURE_MAX_CHARS {
                    return Err(Failure::TooLong);
                }
                json!({"text": text, "outputType": "FourSeverityLevels"})
            }
            Preset::BedrockGuardrail => {
                let content: Vec<_> = texts.iter().map(|t| json!({"text": {"text": t}})).collect();
                let source = match side {
                    Side::Prompt => "INPUT",
                    Side::Answer => "OUTPUT",
                };
                json!({"source": source, "content": content})
            }
            Preset::Webhook => {
                let mut asked = json!({"api": api, "texts": texts});
                if let (Side::Answer, Value::Object(m)) = (side, &mut asked) {
                    m.insert("source".into(), Value::from("answer"));
                }
                asked
            }
        }
        .to_string();
        let headers = self.service.request_headers(
            "POST",
            &self.service.path,
            Some(("application/json", body.len())),
        );
        Ok((headers, body.into_bytes()))
    }

    /// The verdict in the service's answer to `sent` texts.
    pub fn read(&self, status: Option<u16>, body: &[u8], sent: usize) -> Result<Judged, Failure> {
        match status {
            None | Some(504) => return Err(Failure::Timeout),
            Some(200) => {}
            Some(_) => return Err(Failure::Status),
        }
        let answer = Json::parse(body).ok_or(Failure::Invalid)?;
        let flagged = match self.preset {
            Preset::OpenAiModeration => {
                let Some(Json::Array(results)) = answer.get("results") else {
                    return Err(Failure::Invalid);
                };
                if results.is_empty() {
                    return Err(Failure::Invalid);
                }
                results
                    .iter()
                    .any(|r| r.get("flagged") == Some(&Json::Bool(true)))
            }
            Preset::AzureContentSafety => {
                let Some(Json::Array(categories)) = answer.get("categoriesAnalysis") else {
                    return Err(Failure::Invalid);
                };
                let severe = categories.iter().any(|c| {
                    matches!(c.get("severity"), Some(Json::Number(n))
                        if n.parse::<u8>().is_ok_and(|s| s >= self.threshold))
                });
                let listed =
                    matches!(answer.get("blocklistsMatch"), Some(Json::Array(m)) if !m.is_empty());
                severe || listed
            }
            Preset::BedrockGuardrail => match answer.get("action") {
                Some(Json::String(a)) if a == "GUARDRAIL_INTERVENED" => true,
                Some(Json::String(a)) if a == "NONE" => false,
                _ => return Err(Failure::Invalid),
            },
            Preset::Webhook => match answer.get("flagged") {
                Some(Json::Bool(f)) => *f,
                _ => return Err(Failure::Invalid),
            },
        };
        if !flagged {
            return Ok(Judged::Pass);
        }
        if self.action != Action::Mask {
            return Ok(Judged::Flagged(None));
        }
        let masked = match (self.preset, &answer) {
            // A guardrail that blocked (any policy's action) answers its
            // refusal in `outputs`, no masked text.
            (Preset::BedrockGuardrail, a) if blocked(a.get("assessments")) => None,
            (Preset::BedrockGuardrail, a) => a
                .get("outputs")
                .map(|o| texts_of(o, |item| item.get("text"))),
            (_, a) => a.get("texts").map(|t| texts_of(t, Some)),
        };
        match masked {
            // Flagged with nothing masked: the service refuses the call.
            None => Ok(Judged::Flagged(None)),
            Some(Some(m)) if m.len() == sent => Ok(Judged::Flagged(Some(m))),
            // Masked texts that are not one per text sent cannot be put back.
            Some(_) => Err(Failure::Invalid),
        }
    }
}

/// The string of each item of the array `value` (as `pick` finds it in
/// the item); `None` when one has none.
fn texts_of<'a>(
    value: &'a Json,
    pick: impl Fn(&'a Json) -> Option<&'a Json>,
) -> Option<Vec<String>> {
    let Json::Array(items) = value else {
        return None;
    };
    items
        .iter()
        .map(|i| match pick(i) {
            Some(Json::String(s)) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// Whether a Bedrock assessment says a policy `BLOCKED` the content.
fn blocked(assessments: Option<&Json>) -> bool {
    assessments.is_some_and(|a| a.any_string(&mut |s| s == "BLOCKED"))
}

/// A path segment of letters and digits only (Bedrock's ids and versions).
fn valid_segment(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Keys whose strings are no text of the prompt: roles, kinds, ids, names,
/// media and where they are.
const NOT_TEXT: &[&str] = &[
    "role",
    "type",
    "id",
    "call_id",
    "tool_call_id",
    "tool_use_id",
    "name",
    "status",
    "media_type",
    "mime_type",
    "mimeType",
    "data",
    "url",
    "file_id",
    "file_uri",
    "fileUri",
    "signature",
    "detail",
    "format",
    "finish_reason",
    "finishReason",
    "stop_reason",
    "stop_sequence",
];

/// Keys whose whole value is no text of a prompt or an answer: a token's
/// log probabilities, a candidate's ratings, a text's citations.
const NOT_TEXTS: &[&str] = &[
    "logprobs",
    "safetyRatings",
    "citationMetadata",
    "annotations",
];

/// Calls `f` with each text of `value` (a string the prompt says, by the
/// key it sits under) and where it sits, in document order.
pub fn each_text<'a>(
    value: &'a Json,
    key: Option<&str>,
    path: &mut Vec<usize>,
    f: &mut dyn FnMut(&[usize], &'a str),
) {
    if key.is_some_and(|k| NOT_TEXTS.contains(&k)) {
        return;
    }
    match value {
        Json::String(s) if !key.is_some_and(|k| NOT_TEXT.contains(&k)) => f(path, s),
        Json::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i);
                each_text(v, key, path, f);
                path.pop();
            }
        }
        Json::Object(members) => {
            for (i, (k, v)) in members.iter().enumerate() {
                path.push(i);
                each_text(v, Some(k), path, f);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The texts of the `fields` of a request `tree`, in document order;
/// `None` when they are more than `max_bytes`.
pub fn texts<'a>(
    tree: &'a Json,
    fields: &[&'static str],
    max_bytes: usize,
) -> Option<Vec<&'a str>> {
    let (mut texts, mut bytes) = (Vec::new(), 0usize);
    for field in fields {
        let Some(value) = tree.get(field) else {
            continue;
        };
        each_text(value, None, &mut Vec::new(), &mut |_, t| {
            bytes = bytes.saturating_add(t.len());
            texts.push(t);
        });
    }
    (bytes <= max_bytes).then_some(texts)
}

/// Each of the `fields` of `tree` whose texts the service masked, with
/// them put back where [`texts`] found them (`masked` in its order): the
/// field's name, its bytes and its tree.
pub fn put_back(
    tree: &Json,
    fields: &[&'static str],
    masked: &[String],
) -> Vec<(&'static str, Vec<u8>, Json)> {
    let mut edits = Vec::new();
    let mut next = masked.iter();
    for field in fields {
        let Some(value) = tree.get(field) else {
            continue;
        };
        let mut changed: Vec<(Vec<usize>, &String)> = Vec::new();
        each_text(value, None, &mut Vec::new(), &mut |at, t| {
            if let Some(m) = next.next().filter(|m| m.as_str() != t) {
                changed.push((at.to_vec(), m));
            }
        });
        if changed.is_empty() {
            continue;
        }
        let mut edited = value.clone();
        for (at, m) in changed {
            if let Some(s) = string_at(&mut edited, &at) {
                s.clone_from(m);
            }
        }
        let mut bytes = Vec::new();
        edited.write(&mut bytes);
        edits.push((*field, bytes, edited));
    }
    edits
}

#[cfg(test)]
mod tests;
