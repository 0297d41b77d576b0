//! What a call says, read once by its dialect: the request view every
//! concern reads, the prompt's texts, and the edits a step makes.
//!
//! Each API's file implements [`Request`]; the concerns (routing, the cache,
//! shaping, capture, limits) keep their policy and ask the call's dialect
//! where things are: which field caps the output, where the turns are and how
//! they split, which fields the cache's markers search, where the semantic
//! question is, what the prompt cache keys on. [`Dialect::request`] is the
//! one place that picks the API.

use super::features::{message_tokens, Features};
use super::prompt::{non_empty_string, Prompt};
use super::Dialect;

use crate::json::{Document, Json};

/// What one API says of a request, and how a step edits it. Every method has
/// the answer of an API that has no such thing; each API's file overrides
/// what it has.
pub trait Request: Sync {
    /// `gen_ai.operation.name` of the API's calls.
    fn operation(&self) -> &'static str {
        "chat"
    }

    /// The model a request names in its path, for an API that puts it
    /// there; `None`: the model is the body's `model`.
    fn model_in_path<'p>(&self, _path: &'p str) -> Option<&'p str> {
        None
    }

    /// The `:path` with the model it names replaced by `model`, for an API
    /// that puts the model in the path; `None` for one whose model is in the
    /// body (see [`Request::set_model`], which edits either).
    fn path_with_model(&self, _path: &str, _model: &str) -> Option<String> {
        None
    }

    /// Whether the call asks for a stream, for an API whose path says it
    /// (Gemini's `:streamGenerateContent`); `None`: the body's `stream`.
    fn stream_in_path(&self, _path: &str) -> Option<bool> {
        None
    }

    /// Switches a call on `path` to `model` where the API names the model:
    /// the body's top-level `model` (set when absent, every other byte
    /// kept), or the `:path` the call then goes on. `None`, and nothing
    /// changed, when it cannot take it.
    fn set_model(&self, doc: &mut Document, _path: &str, model: &str) -> Option<Switched> {
        switch_body_model(doc, model)
    }

    /// The end user a request body names; `None` when absent, empty or not a
    /// string. OpenAI's is `user`.
    fn user<'a>(&self, body: &'a Json) -> Option<&'a str> {
        non_empty_string(body.get("user")?)
    }

    /// The headers the API's providers authenticate a call with, in the
    /// order they look: OpenAI's `authorization` (a Bearer key), else Azure
    /// OpenAI's `api-key`.
    fn authenticates_with(&self) -> &'static [&'static str] {
        &["authorization", "api-key"]
    }

    /// The credential a call's `path` carries in its query in place of
    /// header `name` (Gemini's `?key=`); `None` for an API that takes none
    /// there. A credential: never logged, labelled or counted, only digested.
    fn query_credential<'p>(&self, _path: &'p str, _name: &str) -> Option<&'p str> {
        None
    }

    /// The header of the API's own credential, where it has one besides
    /// `authorization`.
    fn credential_header(&self) -> Option<&'static str> {
        None
    }

    /// `path` without the credential its query carries (Gemini's `?key=`);
    /// `None` when it carries none.
    fn without_query_credential(&self, _path: &str) -> Option<String> {
        None
    }

    /// Headers the API requires that its SDKs send beside the key, which a
    /// call the mesh puts the key on gets when the client sent none
    /// (Anthropic's `anthropic-version`).
    fn keyless_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The API samples its answer: `temperature` and the output cap mean
    /// something to it.
    fn samples(&self) -> bool {
        false
    }

    /// The object holding the request's sampling parameters
    /// (`temperature`): the body itself, or the member an API nests them in.
    fn sampling<'a>(&self, body: &'a Json) -> Option<&'a Json> {
        Some(body)
    }

    /// A request without a `temperature` samples at the providers' default
    /// of 1.0 (else it often has none to send, and only one sent counts).
    fn absent_temperature_is_default(&self) -> bool {
        false
    }

    /// The API may answer in a stream (`"stream": true`).
    fn streams(&self) -> bool {
        true
    }

    /// The field a call caps its output with, `configured` where the API
    /// lets the operator choose; `None` for an API without one at the top
    /// of its body.
    fn output_cap_field(&self, _configured: TokenField) -> Option<TokenField> {
        None
    }

    /// The API has an output cap shaping and degrade may lower.
    fn caps_output(&self) -> bool {
        self.output_cap_field(TokenField::MaxTokens).is_some()
    }

    /// The output cap a request body names, when a whole number: the first
    /// of its field's family (chat takes either of its names).
    fn output_cap(&self, body: &Json) -> Option<u64> {
        self.output_cap_field(TokenField::MaxTokens)
            .into_iter()
            .flat_map(TokenField::family)
            .find_map(|f| match body.get(f.as_str()) {
                Some(Json::Number(n)) => n.parse::<f64>().ok(),
                _ => None,
            })
            .filter(|n| *n >= 0.0 && n.fract() == 0.0)
            .map(|n| n as u64)
    }

    /// Lowers the body's output cap to at most `cap` (set when it names
    /// none), in `configured` where the API lets the operator choose; false,
    /// and nothing changed, when nothing needed to, the body cannot take it
    /// or the API has no cap.
    fn cap_output(&self, doc: &mut Document, cap: u64, configured: TokenField) -> bool {
        self.output_cap_field(configured)
            .is_some_and(|f| cap_max_tokens(doc, cap, f))
    }

    /// Sets the body's sampling temperature to `t` (where
    /// [`Request::sampling`] reads it), every other byte kept; false, and
    /// nothing changed, when the body cannot take it.
    fn set_temperature(&self, doc: &mut Document, t: f64) -> bool {
        doc.set_text("temperature", format!("{t}").as_bytes())
    }

    /// What a request body continues of the state a backend keeps.
    fn continues(&self, _body: &Json) -> Continues {
        Continues::default()
    }

    /// Shaping understands the API's body (its turns and output cap).
    fn shaped(&self) -> bool {
        false
    }

    /// The field holding the conversation's turns, and how they split (what
    /// shaping's `keep_turns` trims); `None` for an API without turns.
    fn turns_field(&self) -> Option<&'static str> {
        None
    }

    /// How the items of the conversation split into turns; `None` when the
    /// list is not understood or the API has no turns to trim.
    fn turns(&self, _items: &[Json]) -> Option<Turns> {
        None
    }

    /// Estimated tokens of one item of the conversation, as history
    /// trimming weighs it: a message's `content` and tool calls.
    fn turn_tokens(&self, item: &Json) -> u64 {
        message_tokens(item)
    }

    /// The prompt's parts, in the order they are sent; `None` for an API
    /// whose request holds no prompt to read (embeddings' input is no
    /// conversation).
    fn prompt<'a>(&self, _body: &'a Json) -> Option<Prompt<'a>> {
        None
    }

    /// The request fields holding the prompt, each searched whole (what the
    /// cache's dynamic markers are looked for in).
    fn prompt_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// The request fields the guardrails read, each whole: the prompt's,
    /// and what else of the request goes to the model as text.
    fn guarded_fields(&self) -> &'static [&'static str] {
        self.prompt_fields()
    }

    /// Where the question the semantic cache embeds is; `None`: the API
    /// takes no part in it.
    fn question(&self) -> Option<Question> {
        None
    }

    /// The API's calls continue a conversation over a prompt cache, so they
    /// have an affinity key.
    fn converses(&self) -> bool {
        false
    }

    /// The API takes a `prompt_cache_key` in the request body.
    fn takes_prompt_cache_key(&self) -> bool {
        false
    }

    /// The prefix a provider's prompt cache keys on (what routing's
    /// affinity hashes); `None` for an API without one.
    fn prefix<'a>(&self, _body: &'a Json) -> Option<Prefix<'a>> {
        None
    }

    /// Puts the provider's prompt-cache markers where they pay on a request
    /// that carries none, every other byte kept: `ask` says how long a
    /// prefix must be to be marked and how long the provider keeps it. The
    /// markers placed; 0 when the client placed its own (never moved nor
    /// added to), nothing was long enough, or the API has no such markers.
    fn mark_cache(&self, _doc: &mut Document, _ask: &MarkAsk) -> u32 {
        0
    }

    /// Asks a streamed call for its usage, every other byte kept; false when
    /// nothing changed (the API's streams always carry it, or the body
    /// cannot take the ask).
    fn ask_for_usage(&self, _doc: &mut Document) -> bool {
        false
    }
}

/// The prompt-cache markers a call is to get (see [`Request::mark_cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkAsk {
    /// Least tokens of the prefix a marker ends, in the prompt estimate's
    /// own measure (the walk takes the model's learnt ratio out).
    pub min_tokens: u64,
    /// The prefix is kept for an hour rather than five minutes.
    pub hour: bool,
}

/// The request field that limits output tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenField {
    /// `max_tokens`: understood by every OpenAI-compatible server.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: OpenAI's newer name, the only one its
    /// reasoning models take.
    MaxCompletionTokens,
    /// `max_output_tokens`: OpenAI Responses' name, never configured (a
    /// Responses call always uses it).
    MaxOutputTokens,
}

impl crate::config::read::Read for TokenField {
    /// One of the names a configuration may give.
    fn read(v: &serde_json::Value) -> Result<Self, crate::config::ConfigError> {
        let named = [Self::MaxTokens, Self::MaxCompletionTokens];
        crate::config::read::variant(v, &named, Self::as_str)
    }
}

impl TokenField {
    /// The field's name in a request body.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxTokens => "max_tokens",
            Self::MaxCompletionTokens => "max_completion_tokens",
            Self::MaxOutputTokens => "max_output_tokens",
        }
    }

    /// The fields of the same dialect a body may already cap its output
    /// with: chat takes either name.
    pub fn family(self) -> &'static [Self] {
        match self {
            Self::MaxOutputTokens => &[Self::MaxOutputTokens],
            Self::MaxTokens | Self::MaxCompletionTokens => {
                &[Self::MaxTokens, Self::MaxCompletionTokens]
            }
        }
    }
}

/// Lowers the body's output token limit to at most `cap`: `max_tokens` and
/// `max_completion_tokens` above it are lowered to it; a body that names
/// neither (or only as `null`) gets `cap` set, in the field it named as
/// `null` or else in `field`. False, and nothing changed, when nothing needed
/// to, or a limit is not a whole number, or the body is not one object naming
/// each field once.
pub fn cap_max_tokens(doc: &mut Document, cap: u64, field: TokenField) -> bool {
    let Some(Json::Object(_)) = doc.tree() else {
        return false;
    };
    let mut lower = Vec::new();
    let mut named = false;
    let mut null_field = None;
    for &f in field.family() {
        let Some(value) = doc.value_bytes(f.as_str()) else {
            if repeated(doc, f.as_str()) {
                return false;
            }
            continue;
        };
        match Json::parse(value) {
            Some(Json::Null) => null_field = null_field.or(Some(f)),
            Some(Json::Number(n)) => {
                named = true;
                match whole_number(&n) {
                    Some(v) if v > cap => lower.push(f),
                    Some(_) => {}
                    None => return false,
                }
            }
            _ => return false,
        }
    }
    let cap_text = cap.to_string();
    let number = Json::Number(cap_text.clone());
    if !named {
        let f = null_field.unwrap_or(field);
        return doc.set(f.as_str(), cap_text.as_bytes(), number);
    }
    let mut changed = false;
    for f in lower {
        changed |= doc.set(f.as_str(), cap_text.as_bytes(), number.clone());
    }
    changed
}

/// True when the object names `name` more than once.
fn repeated(doc: &Document, name: &str) -> bool {
    doc.tree()
        .is_some_and(|tree| tree.members(name).nth(1).is_some())
}

/// A canonical JSON number (see [`crate::json`]) that is a whole number ≥ 0
/// and fits a `u64`.
pub(crate) fn whole_number(canonical: &str) -> Option<u64> {
    let (digits, exp) = match canonical.split_once('e') {
        Some((d, e)) => (d, e.parse::<u32>().ok()?),
        None => (canonical, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()?
        .checked_mul(10u64.checked_pow(exp)?)
}

/// What a Responses request says about the state it continues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Continues {
    /// `previous_response_id`: the response the call continues.
    pub previous_response_id: Option<String>,
    /// The call continues or creates state a backend keeps: a previous
    /// response, a `conversation`, a `background` run. Such a call is never
    /// failed over, hedged or answered from the cache.
    pub state: bool,
    /// The provider stores the response (`store` not `false`): its id is
    /// worth remembering.
    pub stored: bool,
}

impl Continues {
    /// What a request body of `dialect` continues, as its dialect reads
    /// it; nothing but for Responses.
    pub fn of(dialect: Dialect, body: &Json) -> Self {
        dialect.request().continues(body)
    }
}

/// The caller named its own `prompt_cache_key`: the filter leaves it.
pub fn has_prompt_cache_key(body: &Json) -> bool {
    !matches!(body.get("prompt_cache_key"), None | Some(Json::Null))
}

/// What a call's request says, read once when its body is complete: what
/// every concern asks of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct View {
    /// The requested model: from the path for an API that puts it there,
    /// else the body's `model`.
    pub model: Option<String>,
    /// The client asked for a stream (`None`: the body was not read).
    pub stream: Option<bool>,
    /// The end user the body names.
    pub user: Option<String>,
    /// The request declares tools.
    pub tools: bool,
    /// The `temperature` asked for.
    pub temperature: Option<f64>,
    /// The output cap the body names.
    pub output_cap: Option<u64>,
    /// The state it continues.
    pub continues: Continues,
    /// The body names its own `prompt_cache_key`.
    pub names_cache_key: bool,
}

impl View {
    /// Reads a request of `dialect` to `path` whose body parsed to `tree`
    /// (`None`: not strict JSON) with routing's `features` (`None`: no
    /// request object), from what the one parse gave.
    pub fn read(
        dialect: Dialect,
        path: &str,
        tree: Option<&Json>,
        features: Option<&Features>,
    ) -> Self {
        let api = dialect.request();
        let model = api
            .model_in_path(path)
            .map(str::to_string)
            .or_else(|| features.and_then(|f| f.model.clone()));
        let stream = api
            .stream_in_path(path)
            .unwrap_or_else(|| features.is_some_and(|f| f.stream));
        let mut view = Self {
            model,
            stream: Some(stream),
            tools: features.is_some_and(|f| f.tools),
            ..Self::default()
        };
        if let Some(tree) = tree {
            view.user = api.user(tree).map(str::to_string);
            view.temperature = match api.sampling(tree).and_then(|s| s.get("temperature")) {
                Some(Json::Number(n)) => n.parse::<f64>().ok(),
                _ => None,
            };
            view.output_cap = api.output_cap(tree);
            view.continues = api.continues(tree);
            view.names_cache_key = has_prompt_cache_key(tree);
        }
        view
    }

    /// The output cap the body names, when a whole number.
    pub fn max_tokens(&self) -> Option<u64> {
        self.output_cap
    }
}

/// How a conversation splits into turns: where one starts, what is always
/// kept, and the item the current turn is anchored on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turns {
    /// The item starts a turn.
    pub starts: Vec<bool>,
    /// The item is always kept, wherever it stands.
    pub pinned: Vec<bool>,
    /// The item the current turn is anchored on.
    pub current: usize,
}

/// Roles that are always kept, wherever they stand.
pub(super) const PINNED_ROLES: [&str; 2] = ["system", "developer"];

/// Where the semantic cache's question is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Question {
    /// The `content` of the last message of `role` `user` in `messages`.
    LastUserMessage,
    /// The `parts` of the last content of `contents` whose role is `user`
    /// (or none), each a text (Gemini's).
    LastUserParts,
    /// The top-level member of this name.
    Member(&'static str),
}

/// The prefix a prompt cache keys on: the shared parts (tools, the system
/// prompt or instructions), each a list of values hashed as one part, and
/// the conversation's first turn (empty when there is none).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prefix<'a> {
    /// The shared parts in order; `None` past the last.
    pub shared: [Option<&'a [Json]>; 2],
    /// The first turn.
    pub turn: &'a [Json],
}

/// Where [`Request::set_model`] switched a call's model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switched {
    /// The body's top-level `model`.
    Body,
    /// This `:path`, for an API naming the model there (the body as it
    /// was).
    Path(String),
}

/// Switches the body's top-level `model` to `model`, set when absent, every
/// other byte kept (the tree too); `None` when the body is no object or
/// names it twice.
pub fn switch_body_model(doc: &mut Document, model: &str) -> Option<Switched> {
    let quoted = serde_json::to_string(model).ok()?;
    doc.set("model", quoted.as_bytes(), Json::String(model.to_string()))
        .then_some(Switched::Body)
}

/// Sets the body's top-level `model` string to `model`, every other byte
/// kept; false when the body names none as a string (or names it twice).
pub fn set_body_model(doc: &mut Document, model: &str) -> bool {
    if doc.value_bytes("model").and_then(|v| v.first()) != Some(&b'"') {
        return false;
    }
    serde_json::to_string(model).is_ok_and(|q| doc.set("model", q.as_bytes(), Json::Null))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::prompt::{items, role, Said};

    fn j(s: &str) -> Json {
        Json::parse(s.as_bytes()).unwrap()
    }

    const ALL: [Dialect; 6] = [
        Dialect::Chat,
        Dialect::Completions,
        Dialect::Embeddings,
        Dialect::Responses,
        Dialect::Messages,
        Dialect::Other,
    ];

    #[test]
    fn the_view_reads_what_each_dialect_says() {
        let body = j(
            r#"{"model":"m","stream":true,"user":"u","metadata":{"user_id":"a"},
            "temperature":0.5,"max_tokens":7,"max_output_tokens":9,"tools":[{"x":1}],
            "prompt_cache_key":"k","previous_response_id":"r1"}"#,
        );
        let view = |d| {
            let features = Features::from_json(d, &body);
            View::read(d, "/v1/x", Some(&body), features.as_ref())
        };
        let chat = view(Dialect::Chat);
        assert_eq!(chat.model.as_deref(), Some("m"));
        assert_eq!(chat.stream, Some(true));
        assert_eq!(chat.user.as_deref(), Some("u"));
        assert!(chat.tools && chat.names_cache_key);
        assert_eq!(chat.temperature, Some(0.5));
        assert_eq!(chat.output_cap, Some(7));
        assert_eq!(chat.continues, Continues::default());
        let responses = view(Dialect::Responses);
        assert_eq!(responses.output_cap, Some(9));
        assert_eq!(
            responses.continues.previous_response_id.as_deref(),
            Some("r1")
        );
        assert_eq!(view(Dialect::Messages).user.as_deref(), Some("a"));
        assert_eq!(view(Dialect::Embeddings).max_tokens(), None);
        // Nothing read of a body that is no object but the stream's absence.
        let none = View::read(Dialect::Chat, "/", None, None);
        assert_eq!(
            none,
            View {
                stream: Some(false),
                ..View::default()
            }
        );
    }

    #[test]
    fn an_output_cap_is_a_whole_number_in_the_family() {
        let cap = |d: Dialect, s: &str| d.request().output_cap(&j(s));
        assert_eq!(
            cap(Dialect::Chat, r#"{"max_completion_tokens":5}"#),
            Some(5)
        );
        assert_eq!(cap(Dialect::Chat, r#"{"max_tokens":5.5}"#), None);
        assert_eq!(cap(Dialect::Chat, r#"{"max_tokens":-1}"#), None);
        assert_eq!(cap(Dialect::Chat, r#"{"max_tokens":"5"}"#), None);
        assert_eq!(cap(Dialect::Responses, r#"{"max_tokens":5}"#), None);
        assert_eq!(cap(Dialect::Messages, r#"{"max_tokens":5}"#), Some(5));
        assert_eq!(cap(Dialect::Other, r#"{"max_tokens":5}"#), None);
    }

    #[test]
    fn only_gemini_takes_its_model_and_stream_from_the_path() {
        let path = "/v1beta/models/g:generateContent";
        for d in ALL {
            let api = d.request();
            assert_eq!(api.model_in_path(path), None);
            assert_eq!(api.path_with_model("/v1/chat/completions", "x"), None);
            assert_eq!(api.stream_in_path(path), None);
        }
        let g = Dialect::Gemini.request();
        assert_eq!(g.model_in_path(path), Some("g"));
        assert_eq!(
            g.path_with_model("/v1beta/models/g:streamGenerateContent?alt=sse", "h")
                .as_deref(),
            Some("/v1beta/models/h:streamGenerateContent?alt=sse")
        );
        assert_eq!(g.stream_in_path(path), Some(false));
    }

    #[test]
    fn a_gemini_view_reads_the_path_and_generation_config() {
        let body = j(
            r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"stream":false,
            "temperature":2,"generationConfig":{"temperature":0.25,"maxOutputTokens":64}}"#,
        );
        let features = Features::from_json(Dialect::Gemini, &body);
        let view = |path| View::read(Dialect::Gemini, path, Some(&body), features.as_ref());
        let plain = view("/v1beta/models/gemini-2.5-flash:generateContent");
        assert_eq!(plain.model.as_deref(), Some("gemini-2.5-flash"));
        assert_eq!(plain.stream, Some(false));
        assert_eq!(plain.temperature, Some(0.25), "the nested one counts");
        assert_eq!(plain.user, None);
        let streamed = view("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse");
        assert_eq!(streamed.stream, Some(true), "the path's verb, not the body");
        assert_eq!(
            Dialect::Gemini
                .request()
                .query_credential("/v1beta/models/m:generateContent?key=k1", "x-goog-api-key"),
            Some("k1")
        );
        assert_eq!(
            Dialect::Gemini
                .request()
                .query_credential("/v1beta/models/m:generateContent?key=k1", "authorization"),
            None
        );
        assert_eq!(
            Dialect::Chat
                .request()
                .query_credential("/v1/chat/completions?key=k1", "x-goog-api-key"),
            None
        );
    }

    #[test]
    fn the_model_is_set_in_the_body() {
        let mut doc = Document::parse(br#"{"model":"a","x":1}"#.to_vec());
        assert!(set_body_model(&mut doc, "b\"c"));
        assert_eq!(doc.bytes(), br#"{"model":"b\"c","x":1}"#);
        let mut none = Document::parse(br#"{"model":3}"#.to_vec());
        assert!(!set_body_model(&mut none, "b"));
    }

    #[test]
    fn each_dialect_switches_the_model_where_it_names_it() {
        let path = "/v1/chat/completions";
        for d in ALL {
            let mut doc = Document::parse(br#"{"model":"a","x":1}"#.to_vec());
            let api = d.request();
            assert_eq!(api.set_model(&mut doc, path, "b"), Some(Switched::Body));
            assert_eq!(doc.bytes(), br#"{"model":"b","x":1}"#, "{d:?}");
            assert_eq!(doc.tree().and_then(|t| t.get("model")), Some(&j(r#""b""#)));
            // Set when absent; refused where the body cannot take one.
            let mut none = Document::parse(br#"{"messages":[]}"#.to_vec());
            assert_eq!(api.set_model(&mut none, path, "m"), Some(Switched::Body));
            assert_eq!(none.bytes(), br#"{"messages":[],"model":"m"}"#);
            let mut twice = Document::parse(br#"{"model":"a","model":"b"}"#.to_vec());
            assert_eq!(api.set_model(&mut twice, path, "m"), None, "{d:?}");
            assert_eq!(twice.bytes(), br#"{"model":"a","model":"b"}"#);
        }
        // Gemini's is in the path: the body is left as it is.
        let g = Dialect::Gemini.request();
        let body = br#"{"contents":[]}"#;
        let mut doc = Document::parse(body.to_vec());
        assert_eq!(
            g.set_model(
                &mut doc,
                "/v1beta/models/g:streamGenerateContent?alt=sse",
                "h"
            ),
            Some(Switched::Path(
                "/v1beta/models/h:streamGenerateContent?alt=sse".into()
            ))
        );
        assert_eq!(doc.bytes(), body);
        assert_eq!(
            g.set_model(&mut doc, "/v1beta/models/g:generateContent", "a/b"),
            None,
            "no model name"
        );
        assert_eq!(doc.bytes(), body);
        // A configured path naming no model: the body's, where it was read.
        assert_eq!(
            g.set_model(&mut doc, "/gw/gemini", "h"),
            Some(Switched::Body)
        );
        assert_eq!(doc.bytes(), br#"{"contents":[],"model":"h"}"#);
    }

    #[test]
    fn the_prompt_is_read_in_the_order_it_is_sent() {
        let body = j(
            r#"{"system":"s","instructions":"i","prompt":"p","input":"in",
            "messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#,
        );
        let kinds = |d: Dialect| -> Vec<String> {
            d.request()
                .prompt(&body)
                .into_iter()
                .flatten()
                .map(|s| match s {
                    Said::System(v) => format!("system {v:?}"),
                    Said::Bare(v) => format!("bare {v:?}"),
                    Said::Turn(v) => format!("turn {:?}", role(v)),
                    Said::Parts { role, parts } => format!("parts {role} {}", items(parts).len()),
                })
                .collect()
        };
        let s = |v: &str| Json::String(v.into());
        assert_eq!(
            kinds(Dialect::Chat),
            ["turn Some(\"user\")", "turn Some(\"assistant\")"]
        );
        assert_eq!(
            kinds(Dialect::Messages),
            [
                format!("system {:?}", s("s")),
                "turn Some(\"user\")".into(),
                "turn Some(\"assistant\")".into()
            ]
        );
        assert_eq!(
            kinds(Dialect::Responses),
            [
                format!("system {:?}", s("i")),
                format!("bare {:?}", Some(&s("in")))
            ]
        );
        assert_eq!(
            kinds(Dialect::Completions),
            [format!("bare {:?}", Some(&s("p")))]
        );
        assert_eq!(
            kinds_of(Dialect::Completions, "{}"),
            [format!("bare {:?}", None::<&Json>)]
        );
        assert!(kinds(Dialect::Embeddings).is_empty());
        assert!(kinds(Dialect::Other).is_empty());
        let items = r#"{"input":[{"role":"user","content":"a"},{"type":"function_call"}]}"#;
        assert_eq!(kinds_of(Dialect::Responses, items).len(), 2);
    }

    fn kinds_of(d: Dialect, body: &str) -> Vec<String> {
        let body = j(body);
        d.request()
            .prompt(&body)
            .into_iter()
            .flatten()
            .map(|s| match s {
                Said::System(v) => format!("system {v:?}"),
                Said::Bare(v) => format!("bare {v:?}"),
                Said::Turn(_) => "turn".into(),
                Said::Parts { role, parts } => format!("parts {role} {}", items(parts).len()),
            })
            .collect()
    }

    #[test]
    fn a_gemini_prompt_is_its_instruction_parts_then_each_contents_parts() {
        let body = r#"{"systemInstruction":{"parts":[{"text":"be brief"}]},
            "contents":[{"parts":[{"text":"a"},{"text":"b"}]},
              {"role":"model","parts":[{"functionCall":{"name":"f","args":{}}}]},
              {"role":"user","parts":[{"functionResponse":{"name":"f","response":{}}}]},
              {"role":"user"}],
            "messages":[{"role":"user","content":"not Gemini's"}]}"#;
        let parts = j(r#"[{"text":"be brief"}]"#);
        assert_eq!(
            kinds_of(Dialect::Gemini, body),
            [
                format!("system {parts:?}"),
                "parts user 2".into(),
                "parts model 1".into(),
                "parts user 1".into(),
                "parts user 0".into(),
            ]
        );
        // No instruction: the contents alone; none: nothing.
        assert_eq!(
            kinds_of(Dialect::Gemini, r#"{"contents":[{"parts":[]}]}"#),
            ["parts user 0"]
        );
        assert!(kinds_of(Dialect::Gemini, r#"{"contents":{}}"#).is_empty());
        // Chat's turns are no contents.
        let chat = r#"{"messages":[{"role":"user","content":"a"}]}"#;
        assert_eq!(kinds_of(Dialect::Chat, chat), ["turn"]);
    }

    #[test]
    fn each_dialect_names_its_operation_provider_and_credentials() {
        let said: Vec<_> = ALL
            .iter()
            .map(|d| {
                let api = d.request();
                (
                    api.operation(),
                    d.answer().provider(),
                    api.authenticates_with(),
                    api.samples(),
                    api.streams(),
                )
            })
            .collect();
        let openai: &[&str] = &["authorization", "api-key"];
        let anthropic: &[&str] = &["x-api-key", "authorization"];
        assert_eq!(
            said,
            [
                ("chat", "openai", openai, true, true),
                ("text_completion", "openai", openai, true, true),
                ("embeddings", "openai", openai, false, false),
                ("chat", "openai", openai, true, true),
                ("chat", "anthropic", anthropic, true, true),
                ("other", "openai", openai, false, true),
            ]
        );
    }

    #[test]
    fn only_chat_and_completions_are_asked_for_usage() {
        for d in ALL {
            let mut doc = Document::parse(br#"{"stream":true}"#.to_vec());
            let asked = d.request().ask_for_usage(&mut doc);
            assert_eq!(
                asked,
                matches!(d, Dialect::Chat | Dialect::Completions),
                "{d:?}"
            );
        }
    }

    #[test]
    fn a_responses_body_says_what_it_continues() {
        let c = |e, s: &str| Continues::of(e, &Json::parse(s.as_bytes()).unwrap());
        let r = Dialect::Responses;
        assert_eq!(
            c(r, r#"{"input":"hi"}"#),
            Continues {
                stored: true,
                ..Continues::default()
            }
        );
        let prev = c(r, r#"{"previous_response_id":"resp_1","store":false}"#);
        assert_eq!(prev.previous_response_id.as_deref(), Some("resp_1"));
        assert!(prev.state && !prev.stored);
        assert!(c(r, r#"{"conversation":"conv_1"}"#).state);
        assert!(c(r, r#"{"conversation":{"id":"conv_1"}}"#).state);
        assert!(c(r, r#"{"background":true}"#).state);
        assert!(
            !c(
                r,
                r#"{"background":false,"conversation":null,"previous_response_id":""}"#
            )
            .state
        );
        assert_eq!(
            c(Dialect::Chat, r#"{"previous_response_id":"resp_1"}"#),
            Continues::default()
        );
    }
}
