//! Google's Gemini API (`generateContent`, `streamGenerateContent`), in its
//! own words. It is the one dialect whose model is in the path
//! (`/v1beta/models/{model}:generateContent`), whose stream is asked for by
//! the path too (`:streamGenerateContent?alt=sse`), whose usage is
//! `usageMetadata` in every answer and every streamed event (so nothing is
//! asked on a client's behalf, nothing stripped), whose stream has no
//! terminator (each event is a whole `GenerateContentResponse`, the last
//! one carries the candidates' `finishReason`), and whose errors are
//! Google's `{"error":{"code","message","status"}}`. Everything here is pure
//! and bounded; the walk reaches it through the dialect's traits.

pub mod stream;

use serde_json::Value;

use crate::dialect::request::whole_number;
use crate::json::{Document, Json};
use crate::sse::reader::DATA_FIELD;

use crate::usage::Usage;

/// The method of a whole answer, after the model in the path.
pub const GENERATE: &str = "generateContent";
/// The method of a streamed answer.
pub const STREAM_GENERATE: &str = "streamGenerateContent";
/// The query parameter that makes a stream server-sent events (without it
/// Google streams one JSON array).
pub const ALT_SSE: &str = "alt=sse";
/// The header the API takes its key in (the SDK's `api_key`).
pub const KEY_HEADER: &str = "x-goog-api-key";
/// Longest path read; a longer one is no Gemini call the filter knows.
pub const MAX_PATH: usize = 2048;
/// Longest model name taken from a path or written into one.
pub const MAX_MODEL: usize = 256;
/// What ends each event of Google's streams, and of a replay in its shape.
pub const EVENT_END: &[u8] = b"\r\n\r\n";
/// Candidates whose end the stream grammar tracks (`candidateCount` is at
/// most 8 today); a candidate of a higher index is not waited for.
pub(crate) const MAX_CANDIDATES: u64 = 64;

/// A generation call as its path says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    /// The API version, the path's first segment (`v1beta`, `v1`).
    pub version: &'a str,
    /// The model, the segment before the method.
    pub model: &'a str,
    /// `streamGenerateContent`.
    pub stream: bool,
    /// The query asks for server-sent events (`alt=sse`).
    pub sse: bool,
}

/// The call `path` (query included) makes, when it is a Gemini generation:
/// `/{version}/…/models/{model}:{generateContent|streamGenerateContent}`,
/// the model one segment of name characters (Vertex AI's
/// `/v1/projects/p/locations/l/publishers/google/models/m:…` is one too).
pub fn call_of(path: &str) -> Option<Call<'_>> {
    if path.len() > MAX_PATH {
        return None;
    }
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    let path = path.split('#').next().unwrap_or(path);
    let (head, method) = path.rsplit_once(':')?;
    let stream = match method {
        GENERATE => false,
        STREAM_GENERATE => true,
        _ => return None,
    };
    let (collection, model) = head.rsplit_once('/')?;
    if !collection.ends_with("/models") || !model_ok(model) {
        return None;
    }
    let version = collection.strip_prefix('/')?.split('/').next()?;
    if version.is_empty() || version == "models" {
        return None;
    }
    let sse = query
        .map(|q| q.split('#').next().unwrap_or(q))
        .is_some_and(|q| q.split('&').any(|p| p == ALT_SSE));
    Some(Call {
        version,
        model,
        stream,
        sse,
    })
}

/// The model a path names, when it is a Gemini generation call.
pub fn model(path: &str) -> Option<&str> {
    call_of(path).map(|c| c.model)
}

/// A model name the filter reads from or writes into a path: letters,
/// digits and `-._@`, at most [`MAX_MODEL`] bytes (nothing that would
/// change what the path means).
pub fn model_ok(model: &str) -> bool {
    !model.is_empty()
        && model.len() <= MAX_MODEL
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'@'))
}

/// `path` with its model replaced by `model`, every other byte (prefix,
/// method, query) kept; `None` when `path` is no Gemini generation call or
/// `model` is no model name.
pub fn with_model(path: &str, model: &str) -> Option<String> {
    let call = call_of(path)?;
    if !model_ok(model) {
        return None;
    }
    // The model ends at the method's `:`, the last one before the query.
    let end = path.find(['?', '#']).unwrap_or(path.len());
    let colon = path.get(..end)?.rfind(':')?;
    let start = colon.checked_sub(call.model.len())?;
    if path.get(start..colon) != Some(call.model) {
        return None;
    }
    let (before, _) = path.split_at_checked(start)?;
    let (_, after) = path.split_at_checked(colon)?;
    let mut out = String::with_capacity(before.len() + model.len() + after.len());
    out.push_str(before);
    out.push_str(model);
    out.push_str(after);
    Some(out)
}

/// The API key a call carries in its query (`?key=…`, which the API takes
/// besides [`KEY_HEADER`]): a credential, never to be logged, labelled or
/// forwarded to a backend that authenticates otherwise. The first non-empty
/// `key` parameter, as written (percent-encoding left alone).
pub fn query_key(path: &str) -> Option<&str> {
    if path.len() > MAX_PATH {
        return None;
    }
    let (_, query) = path.split_once('?')?;
    let query = query.split('#').next().unwrap_or(query);
    query
        .split('&')
        .filter_map(|p| p.strip_prefix("key="))
        .find(|k| !k.is_empty())
}

/// `path` without its `key` query parameters (every other byte kept, the
/// `?` dropped with the last parameter); `None` when it has none.
pub fn without_query_key(path: &str) -> Option<String> {
    query_key(path)?;
    let (head, query) = path.split_once('?')?;
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| *p != "key" && !p.starts_with("key="))
        .collect();
    let mut out = String::with_capacity(path.len());
    out.push_str(head);
    if kept.iter().any(|p| !p.is_empty()) {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Some(out)
}

/// Where one piece of the prompt's text comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Text<'a> {
    /// A part of `systemInstruction`.
    System(&'a str),
    /// A text part of a turn of `contents`, with the turn's role (`user`
    /// when it names none, as the API reads it; `model` for the answers).
    Turn {
        /// The turn's role.
        role: &'a str,
        /// The part's text.
        text: &'a str,
    },
    /// A `functionCall` part: the model asked for a tool.
    ToolCall {
        /// The function's name.
        name: &'a str,
        /// Its arguments, as the call wrote them.
        args: Option<&'a Json>,
    },
    /// A `functionResponse` part: the tool's answer.
    ToolResult {
        /// The function's name.
        name: &'a str,
        /// Its response, as the call wrote it.
        response: Option<&'a Json>,
    },
}

/// The prompt's texts in order: the system instruction's parts, then each
/// turn's text, function call and function response parts. Other parts
/// (inline data, files) carry no text. Reads the tree the body was parsed
/// into once, allocating nothing.
pub fn texts(body: &Json) -> impl Iterator<Item = Text<'_>> {
    let system = parts(body.get("systemInstruction"))
        .filter_map(|p| string(p.get("text")))
        .map(Text::System);
    let turns = items(body.get("contents")).flat_map(|turn| {
        let role = string(turn.get("role")).unwrap_or("user");
        parts(Some(turn)).filter_map(move |p| part_text(role, p))
    });
    system.chain(turns)
}

/// The text one part of a turn carries.
fn part_text<'a>(role: &'a str, part: &'a Json) -> Option<Text<'a>> {
    if let Some(text) = string(part.get("text")) {
        return Some(Text::Turn { role, text });
    }
    if let Some(call) = part.get("functionCall") {
        return Some(Text::ToolCall {
            name: string(call.get("name")).unwrap_or_default(),
            args: call.get("args"),
        });
    }
    let result = part.get("functionResponse")?;
    Some(Text::ToolResult {
        name: string(result.get("name")).unwrap_or_default(),
        response: result.get("response"),
    })
}

/// The items of an array member (none for anything else).
fn items(value: Option<&Json>) -> impl Iterator<Item = &Json> {
    match value {
        Some(Json::Array(items)) => items.iter(),
        _ => [].iter(),
    }
}

/// The parts of a `Content`.
fn parts(content: Option<&Json>) -> impl Iterator<Item = &Json> {
    items(content.and_then(|c| c.get("parts")))
}

fn string(value: Option<&Json>) -> Option<&str> {
    match value {
        Some(Json::String(s)) => Some(s),
        _ => None,
    }
}

/// How `contents` splits into turns, for trimming a long history: where
/// each turn starts, and the turn the call asks about (kept always).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turns {
    /// One per content: a turn starts there.
    pub starts: Vec<bool>,
    /// The content the current turn starts at.
    pub current: usize,
}

/// The turns of `contents`: a `user` content (the role a content that names
/// none has) starts a turn unless it answers the model's function call
/// (its parts are `functionResponse`s), which continues the call's turn, so
/// a call and its answer are kept or left out together; a `model` content
/// belongs to the turn it follows. `None` when a content is not an object
/// naming its role at most once as a string, or no user content starts a
/// turn.
pub fn turns(contents: &[Json]) -> Option<Turns> {
    let mut starts = Vec::with_capacity(contents.len());
    for content in contents {
        if !matches!(content, Json::Object(_)) || content.members("role").nth(1).is_some() {
            return None;
        }
        let role = match content.get("role") {
            None => "user",
            Some(Json::String(r)) => r,
            Some(_) => return None,
        };
        let answers_a_call = parts(Some(content)).any(|p| p.get("functionResponse").is_some());
        starts.push(role == "user" && !answers_a_call);
    }
    let current = starts.iter().rposition(|s| *s)?;
    Some(Turns { starts, current })
}

/// The call's output cap, `generationConfig.maxOutputTokens`, when it is a
/// whole number.
pub fn output_cap(body: &Json) -> Option<u64> {
    match body.get("generationConfig")?.get("maxOutputTokens")? {
        Json::Number(n) => whole_number(n),
        _ => None,
    }
}

/// The call's sampling temperature, `generationConfig.temperature`.
pub fn temperature(body: &Json) -> Option<f64> {
    match body.get("generationConfig")?.get("temperature")? {
        Json::Number(n) => n.parse::<f64>().ok().filter(|t| t.is_finite()),
        _ => None,
    }
}

/// Lowers `generationConfig.maxOutputTokens` to at most `cap`: set when the
/// call names none, lowered when it names more, every other byte of the
/// body kept. False, and nothing changed, when nothing needs to, or the
/// body is not one object naming `generationConfig` (and the cap in it)
/// once with a whole number or `null`.
pub fn cap_output(doc: &mut Document, cap: u64) -> bool {
    let Some(tree) = doc.tree() else {
        return false;
    };
    if !matches!(tree, Json::Object(_)) {
        return false;
    }
    match tree
        .get("generationConfig")
        .map(|c| c.get("maxOutputTokens"))
    {
        Some(Some(Json::Number(n))) => match whole_number(n) {
            Some(v) if v > cap => {}
            _ => return false,
        },
        Some(Some(Json::Null) | None) | None => {}
        Some(Some(_)) => return false,
    }
    set_in_config(doc, "maxOutputTokens", cap.to_string().as_bytes())
}

/// Sets `generationConfig.temperature` to `t` (finite, ≥ 0), every other
/// byte kept. False, and nothing changed, where [`cap_output`] would refuse.
pub fn set_temperature(doc: &mut Document, t: f64) -> bool {
    if !t.is_finite() || t < 0.0 {
        return false;
    }
    set_in_config(doc, "temperature", format!("{t}").as_bytes())
}

/// Sets member `name` of `generationConfig` to the JSON text `value`: the
/// config's other members byte for byte, the config added when absent.
fn set_in_config(doc: &mut Document, name: &str, value: &[u8]) -> bool {
    const CONFIG: &str = "generationConfig";
    let config = match doc.value_bytes(CONFIG) {
        Some(bytes) => {
            let mut config = Document::parse(bytes.to_vec());
            let once = config
                .tree()
                .is_some_and(|t| t.members(name).nth(1).is_none());
            if !once || !config.set_text(name, value) {
                return false;
            }
            config
        }
        // Absent (or named twice, which `set` then refuses).
        None => {
            let mut text = Vec::with_capacity(name.len() + value.len() + 5);
            text.extend_from_slice(b"{\"");
            text.extend_from_slice(name.as_bytes());
            text.extend_from_slice(b"\":");
            text.extend_from_slice(value);
            text.push(b'}');
            Document::parse(text)
        }
    };
    let Some(tree) = config.tree().cloned() else {
        return false;
    };
    doc.set(CONFIG, config.bytes(), tree)
}

/// `usageMetadata` as Gemini writes it. `promptTokenCount` counts the
/// cached content too (`cachedContentTokenCount` is a part of it);
/// `toolUsePromptTokenCount` (what a tool such as search added to the
/// prompt) and `thoughtsTokenCount` (the thinking, billed as output) are
/// counted apart from `promptTokenCount` and `candidatesTokenCount`.
/// The usage of a `usageMetadata` object; `None` when it is not one, or a
/// count in it is not a whole number.
pub fn usage(metadata: &Value) -> Option<Usage> {
    let m = metadata.as_object()?;
    let n = |field: &str| match m.get(field) {
        None | Some(Value::Null) => Some(0),
        Some(v) => v.as_u64(),
    };
    Some(Usage {
        prompt_tokens: n("promptTokenCount")?.saturating_add(n("toolUsePromptTokenCount")?),
        completion_tokens: n("candidatesTokenCount")?.saturating_add(n("thoughtsTokenCount")?),
        cached_tokens: n("cachedContentTokenCount")?,
        reasoning_tokens: n("thoughtsTokenCount")?,
        ..Usage::default()
    })
}

/// What the filter reads of a `GenerateContentResponse`, a whole answer or
/// one event of a stream, read from its tree (no reader of its own in the
/// module).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head<'a>(&'a Value);

impl<'a> Head<'a> {
    /// The response `tree` is, when it is an object.
    pub(crate) fn of(tree: &'a Value) -> Option<Self> {
        tree.is_object().then_some(Self(tree))
    }

    fn field(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// An error in place of a response (a stream's last event).
    pub(crate) fn error(&self) -> bool {
        self.field("error").is_some()
    }

    pub(crate) fn usage(&self) -> Option<Usage> {
        self.field("usageMetadata").and_then(usage)
    }

    /// Each candidate: its `index`, and whether it gave its `finishReason`.
    pub(crate) fn candidates(&self) -> impl Iterator<Item = (Option<u64>, bool)> + 'a {
        self.field("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| {
                let index = c.get("index").and_then(Value::as_u64);
                let finished = c.get("finishReason").is_some_and(|r| !r.is_null());
                (index, finished)
            })
    }

    fn block_reason(&self) -> Option<&'a Value> {
        self.field("promptFeedback")?
            .get("blockReason")
            .filter(|r| !r.is_null())
    }

    /// Why the answer (or this event) ended: each finished candidate's
    /// `finishReason`, or the prompt's `blockReason`.
    pub(crate) fn reasons(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.field("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("finishReason")?.as_str())
            .chain(self.block_reason().and_then(Value::as_str))
            .filter(|r| !r.is_empty())
    }

    /// The prompt was blocked: no candidate comes.
    pub(crate) fn blocked(&self) -> bool {
        self.block_reason().is_some()
    }
}

/// Writes one response as an event of Google's streams (the cache's replay).
pub fn write_event(out: &mut Vec<u8>, response: &Value) {
    out.extend_from_slice(DATA_FIELD);
    out.extend_from_slice(b": ");
    // Writing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, response);
    out.extend_from_slice(EVENT_END);
}

/// The `google.rpc` status name Google's APIs give an HTTP status.
pub fn status_name(status: u16) -> &'static str {
    match status {
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
        _ if (400..500).contains(&status) => "FAILED_PRECONDITION",
        _ => "INTERNAL",
    }
}

/// An error body in Google's shape, which the SDK raises as `ClientError`
/// (4xx) or `ServerError` (5xx) with `code`, `status` and `message`.
pub fn error_body(status: u16, message: &str) -> Vec<u8> {
    let body = serde_json::json!({"error": {
        "code": status,
        "message": message,
        "status": status_name(status),
    }});
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Google's Gemini API: the dialect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gemini;

// The request: the model and the stream in the path, the prompt in
// `systemInstruction` and `contents`, the sampling in `generationConfig`
// (the [`super::request`] side).

mod asks {
    use super::{
        call_of, cap_output, model, output_cap, query_key, set_temperature, turns, with_model,
        Gemini, KEY_HEADER,
    };
    use crate::dialect::features::text_tokens;
    use crate::dialect::prompt::Prompt;
    use crate::dialect::request::TokenField;
    use crate::dialect::request::{switch_body_model, Question, Request, Switched, Turns};
    use crate::json::{Document, Json};

    impl Request for Gemini {
        fn model_in_path<'p>(&self, path: &'p str) -> Option<&'p str> {
            model(path)
        }

        fn path_with_model(&self, path: &str, model: &str) -> Option<String> {
            with_model(path, model)
        }

        /// In the path, where the call names it; the body's only on a
        /// configured path that names none (where the view read it too).
        fn set_model(&self, doc: &mut Document, path: &str, model: &str) -> Option<Switched> {
            if call_of(path).is_none() {
                return switch_body_model(doc, model);
            }
            with_model(path, model).map(Switched::Path)
        }

        fn stream_in_path(&self, path: &str) -> Option<bool> {
            call_of(path).map(|c| c.stream)
        }

        /// Gemini's requests name no end user.
        fn user<'a>(&self, _body: &'a Json) -> Option<&'a str> {
            None
        }

        /// Google's `x-goog-api-key` (the key may come in the query too,
        /// `?key=`, which the path carries into the cache's key).
        fn authenticates_with(&self) -> &'static [&'static str] {
            &[KEY_HEADER]
        }

        fn credential_header(&self) -> Option<&'static str> {
            Some(KEY_HEADER)
        }

        fn query_credential<'p>(&self, path: &'p str, name: &str) -> Option<&'p str> {
            (name == KEY_HEADER).then(|| query_key(path)).flatten()
        }

        fn without_query_credential(&self, path: &str) -> Option<String> {
            super::without_query_key(path)
        }

        fn samples(&self) -> bool {
            true
        }

        /// `generationConfig` holds the sampling (`temperature`).
        fn sampling<'a>(&self, body: &'a Json) -> Option<&'a Json> {
            body.get("generationConfig")
        }

        fn turns_field(&self) -> Option<&'static str> {
            Some("contents")
        }

        fn turns(&self, contents: &[Json]) -> Option<Turns> {
            let t = turns(contents)?;
            Some(Turns {
                pinned: vec![false; t.starts.len()],
                starts: t.starts,
                current: t.current,
            })
        }

        /// The system instruction's parts, then each content's role and
        /// parts.
        fn prompt<'a>(&self, body: &'a Json) -> Option<Prompt<'a>> {
            Some(Prompt::of_contents(
                body.get("systemInstruction").and_then(|s| s.get("parts")),
                body.get("contents"),
            ))
        }

        /// The last user content's text parts.
        fn question(&self) -> Option<Question> {
            Some(Question::LastUserParts)
        }

        /// A content weighs its parts' text.
        fn turn_tokens(&self, content: &Json) -> u64 {
            content.get("parts").map_or(0, text_tokens)
        }

        fn prompt_fields(&self) -> &'static [&'static str] {
            &["systemInstruction", "contents"]
        }

        /// Gemini's cap is nested (`generationConfig.maxOutputTokens`):
        /// no top-level field of the family, its own edits below.
        fn output_cap_field(&self, _configured: TokenField) -> Option<TokenField> {
            None
        }

        fn caps_output(&self) -> bool {
            true
        }

        fn output_cap(&self, body: &Json) -> Option<u64> {
            output_cap(body)
        }

        fn cap_output(&self, doc: &mut Document, cap: u64, _configured: TokenField) -> bool {
            cap_output(doc, cap)
        }

        fn set_temperature(&self, doc: &mut Document, t: f64) -> bool {
            set_temperature(doc, t)
        }

        fn shaped(&self) -> bool {
            true
        }
    }
}

// The answer: `usageMetadata`, the stream's grammar, the stored entry,
// Google's error shape and classes (the [`super::answer`] side).

mod answers {
    use serde_json::{Map, Value};

    use serde::Deserialize;

    use super::{error_body, usage, Gemini};
    use crate::dialect::answer::head::{self, Members};
    use crate::dialect::answer::items_mut;
    use crate::dialect::answer::ReplyKind;
    use crate::dialect::answer::{Answer, Hear, Stored};
    use crate::dialect::gemini::stream;
    use crate::dialect::AnyGrammar;
    use crate::json::Json;
    use crate::usage::{Head, Usage};

    impl Answer for Gemini {
        /// A `usageMetadata` object.
        fn usage(&self, metadata: &Value) -> Option<Usage> {
            usage(metadata)
        }

        /// Its `usageMetadata` (one it cannot read is no usage, the rest
        /// of the head kept) and each candidate's `finishReason`; Gemini
        /// names no `id` or `model` there (its `responseId` and
        /// `modelVersion` are not read).
        fn head(&self, body: &[u8]) -> Head {
            head::read(body, &["usageMetadata", "candidates"], |m| {
                let metadata = m.get::<Value>("usageMetadata")?;
                let mut head = Head::new(metadata.as_ref().and_then(usage), None, None);
                candidate_reasons(m, &mut head)?;
                Some(head)
            })
        }

        fn grammar(&self) -> AnyGrammar {
            AnyGrammar::Gemini(stream::Gemini::default())
        }

        /// As sent: the JSON, or every event of the stream (a replay is
        /// Google's own framing, byte for byte).
        fn stored(&self) -> Option<Stored> {
            Some(Stored::AsSent)
        }

        /// Candidates, each with its `finishReason`.
        fn complete(&self, answer: &Map<String, Value>) -> bool {
            answer
                .get("candidates")
                .and_then(Value::as_array)
                .is_some_and(|c| {
                    !c.is_empty()
                        && c.iter()
                            .all(|c| c.get("finishReason").is_some_and(Value::is_string))
                })
        }

        /// Google's shape, with the status its SDK raises as the matching
        /// error (503 `UNAVAILABLE` for a shed or refused call, a
        /// `ServerError` it may retry).
        fn local_error(&self, kind: ReplyKind, message: &str) -> (u32, Vec<u8>) {
            let status: u16 = match kind {
                ReplyKind::Shed
                | ReplyKind::Reject
                | ReplyKind::DegradeShed
                | ReplyKind::DegradeReject
                | ReplyKind::NoCredential
                | ReplyKind::GuardrailUnavailable => 503,
                ReplyKind::BudgetExhausted | ReplyKind::UpstreamTimeout => 504,
                ReplyKind::TooLarge => 413,
                ReplyKind::OverLimit => 429,
                ReplyKind::Unauthenticated => 401,
                ReplyKind::Blocked | ReplyKind::Unchecked => 400,
                ReplyKind::AnswerBlocked => 502,
            };
            (u32::from(status), error_body(status, message))
        }

        fn provider(&self) -> &'static str {
            "gcp.gemini"
        }

        /// Each candidate a turn: its parts' text (thoughts left out),
        /// ended for its `finishReason`.
        fn said_fields(&self) -> &'static [&'static str] {
            &["candidates"]
        }

        /// Each candidate's parts' text, keyed by candidate and part.
        fn deltas(&self, event: &mut Json, f: &mut dyn FnMut(u32, &mut String)) {
            let candidates = items_mut(event.get_mut("candidates"));
            for (i, c) in candidates.iter_mut().enumerate() {
                let parts = items_mut(c.get_mut("content").and_then(|c| c.get_mut("parts")));
                for (j, p) in parts.iter_mut().enumerate() {
                    if let Some(Json::String(t)) = p.get_mut("text") {
                        f(((i as u32) << 6) | (j as u32).min(63), t);
                    }
                }
            }
        }

        fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool {
            let Some(Json::Array(candidates)) = answer.get("candidates") else {
                return true;
            };
            for c in candidates {
                if out.full() {
                    break;
                }
                let mut text = String::new();
                if let Some(Json::Array(parts)) = c.get("content").and_then(|c| c.get("parts")) {
                    for p in parts {
                        if matches!(p.get("thought"), Some(Json::Bool(true))) {
                            continue;
                        }
                        if let Some(Json::String(t)) = p.get("text") {
                            text.push_str(t);
                        }
                    }
                }
                let reason = match c.get("finishReason") {
                    Some(Json::String(r)) => Some(r.as_str()),
                    _ => None,
                };
                out.text(&text, reason);
            }
            true
        }
    }

    /// What the head reads of a candidate.
    #[derive(Deserialize)]
    struct Candidate {
        #[serde(default, rename = "finishReason")]
        finish_reason: Option<String>,
    }

    /// Each candidate's `finishReason`, in order; `None` when `candidates`
    /// is not a list of candidates.
    pub(crate) fn candidate_reasons(m: &Members<'_>, head: &mut Head) -> Option<()> {
        for candidate in m.get::<Vec<Candidate>>("candidates")?.unwrap_or_default() {
            if let Some(reason) = candidate.finish_reason {
                head.ended_for(&reason);
            }
        }
        Some(())
    }
}

pub(crate) use answers::candidate_reasons;

#[cfg(test)]
mod tests;
