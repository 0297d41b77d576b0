//! The APIs the filter speaks, each in its own dialect, and which requests
//! are LLM calls at all. Everything one API says differently belongs here,
//! one file per API; the concerns of the walk ask the dialect where things
//! are. Whether a request is an LLM call is decided from the method and path
//! alone, before any body is read, so everything else passes untouched.

pub mod answer;
pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod features;
pub mod gemini;
pub mod messages;
pub mod openai;
pub mod other;
pub mod prompt;
pub mod provider;
pub mod request;
pub mod responses;

use serde::Deserialize;

use answer::Answer;
use request::Request;

use crate::json::Json;
use crate::sse::reader::Event;
use crate::sse::{FinishReasons, Grammar, Reading, StreamState, Transcript};
use crate::usage::Usage;

use chat::stream::Chat;
use gemini::stream::Gemini;
use messages::stream::Messages;
use responses::stream::Responses;

/// The API a call speaks: its dialect. A call leaves in the dialect it came
/// in; each step reads and edits it by that dialect's field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI chat completions, `…/chat/completions`.
    Chat,
    /// OpenAI legacy text completions, `…/completions`.
    Completions,
    /// OpenAI embeddings, `…/embeddings`.
    Embeddings,
    /// OpenAI Responses, `…/responses`.
    Responses,
    /// Anthropic Messages, `…/messages`.
    Messages,
    /// Google Gemini, `…/models/{model}:generateContent` and
    /// `:streamGenerateContent`.
    Gemini,
    /// A configured path of another shape.
    Other,
}

/// Every dialect with its name in config and metrics, in one list.
const APIS: [(Dialect, &str); 7] = [
    (Dialect::Chat, "chat"),
    (Dialect::Completions, "completions"),
    (Dialect::Embeddings, "embeddings"),
    (Dialect::Responses, "responses"),
    (Dialect::Messages, "messages"),
    (Dialect::Gemini, "gemini"),
    (Dialect::Other, "other"),
];

impl Dialect {
    /// What the dialect says of a request: the one place that picks the API.
    pub fn request(self) -> &'static dyn Request {
        match self {
            Self::Chat => &chat::Chat,
            Self::Completions => &completions::Completions,
            Self::Embeddings => &embeddings::Embeddings,
            Self::Responses => &responses::Responses,
            Self::Messages => &messages::Messages,
            Self::Gemini => &gemini::Gemini,
            Self::Other => &other::Other,
        }
    }

    /// What the dialect's answers say.
    pub fn answer(self) -> &'static dyn Answer {
        match self {
            Self::Chat => &chat::Chat,
            Self::Completions => &completions::Completions,
            Self::Embeddings => &embeddings::Embeddings,
            Self::Responses => &responses::Responses,
            Self::Messages => &messages::Messages,
            Self::Gemini => &gemini::Gemini,
            Self::Other => &other::Other,
        }
    }

    /// The OpenTelemetry GenAI operation name.
    pub fn operation(self) -> &'static str {
        self.request().operation()
    }

    /// The dialect's name: the `api` of `llm_paths` entries and of metrics.
    pub fn api(self) -> &'static str {
        APIS.iter()
            .find(|(e, _)| *e == self)
            .map_or("other", |(_, name)| name)
    }

    /// The dialect named `name` in config.
    pub fn named(name: &str) -> Option<Self> {
        APIS.iter().find(|(_, n)| *n == name).map(|(e, _)| *e)
    }

    /// The dialect of a path by its last segments, as the providers name
    /// their endpoints.
    pub fn of_path(path: &str) -> Self {
        if path.ends_with("/chat/completions") {
            Self::Chat
        } else if path.ends_with("/completions") {
            Self::Completions
        } else if path.ends_with("/embeddings") {
            Self::Embeddings
        } else if path.ends_with("/responses") {
            Self::Responses
        } else if path.ends_with("/messages") {
            Self::Messages
        } else if gemini::call_of(path).is_some() || GEMINI_VERBS.iter().any(|v| path.ends_with(v))
        {
            Self::Gemini
        } else {
            Self::Other
        }
    }

    /// The end user a request body names (see [`request::Request::user`]).
    pub fn user(self, body: &Json) -> Option<&str> {
        self.request().user(body)
    }

    /// The header of the dialect's own credential, where it has one
    /// besides `authorization`: Anthropic's `x-api-key`.
    pub fn credential_header(self) -> Option<&'static str> {
        self.request().credential_header()
    }

    /// The headers the dialect's providers authenticate a call with, in the
    /// order they look (see [`request::Request::authenticates_with`]).
    pub fn authenticates_with(self) -> &'static [&'static str] {
        self.request().authenticates_with()
    }

    /// True when `name` (lowercase) is some dialect's own credential header.
    pub fn is_credential_header(name: &str) -> bool {
        APIS.iter()
            .any(|(d, _)| d.credential_header() == Some(name))
    }

    /// The dialect samples its answer (`temperature` and the output cap
    /// mean something to it).
    pub fn samples(self) -> bool {
        self.request().samples()
    }

    /// Every dialect's name, as config writes them.
    pub fn names() -> impl Iterator<Item = &'static str> {
        APIS.iter().map(|(_, name)| *name)
    }
}

/// The default LLM paths: OpenAI's chat, text completions, embeddings and
/// Responses, Anthropic's Messages, and Gemini's generation (the model in
/// the path).
pub const DEFAULT_PATHS: [&str; 7] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1beta/models/*:generateContent",
    "/v1beta/models/*:streamGenerateContent",
];

/// The path endings of Gemini's generation patterns (`…/*:generateContent`).
const GEMINI_VERBS: [&str; 2] = ["*:generateContent", "*:streamGenerateContent"];

/// One entry of `llm_paths`: a path, where a `*` segment stands for any one
/// segment (`/openai/deployments/*/chat/completions`), and may be followed
/// by a `:verb` its segment ends with (`/v1beta/models/*:generateContent`),
/// and its dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmPath {
    /// The path pattern, absolute, without query.
    pub pattern: String,
    /// The dialect of calls on it.
    pub api: Dialect,
}

impl LlmPath {
    /// A path whose dialect its ending names.
    pub fn new(pattern: &str) -> Self {
        Self {
            pattern: pattern.to_string(),
            api: Dialect::of_path(pattern),
        }
    }

    /// True when `path` (query removed) is this entry's.
    fn matches(&self, path: &str) -> bool {
        if !self.pattern.contains('*') {
            return self.pattern == path;
        }
        let mut want = self.pattern.split('/');
        let mut got = path.split('/');
        loop {
            match (want.next(), got.next()) {
                (None, None) => return true,
                (Some("*"), Some(g)) if !g.is_empty() => {}
                (Some(w), Some(g)) if star_verb(w, g) => {}
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

/// True when the pattern segment `want` is `*:verb` and `got` is a
/// non-empty name ending with that `:verb` (and no other `:`).
fn star_verb(want: &str, got: &str) -> bool {
    let Some(verb) = want.strip_prefix('*').filter(|v| v.starts_with(':')) else {
        return false;
    };
    got.strip_suffix(verb)
        .is_some_and(|name| !name.is_empty() && !name.contains(':'))
}

/// The dialect of an LLM call, or `None` for any other request. Only `POST`
/// to one of `paths` (query string ignored) is an LLM call; the first entry
/// that matches names its dialect.
pub fn classify(method: &str, path: &str, paths: &[LlmPath]) -> Option<Dialect> {
    if method != "POST" {
        return None;
    }
    let path = path.split(['?', '#']).next().unwrap_or(path);
    paths.iter().find(|p| p.matches(path)).map(|p| p.api)
}

/// The `model` of a request body, when the body is a JSON object that names one.
pub fn model(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Body {
        model: Option<String>,
    }
    serde_json::from_slice::<Body>(body).ok()?.model
}

/// The grammar of a call's dialect, held without a box: the picker over
/// the dialects' stream grammars, which live with their dialects and are
/// read by the generic reader of [`crate::sse`]. OpenAI's chat and text
/// completions stream `data:` JSON chunks only, ending with `data: [DONE]`
/// ([`chat::stream`]). The OpenAI Responses and Anthropic Messages streams
/// name each event (`event: message_delta` before its `data: {json}`) and
/// have no `[DONE]`: their grammars read the event's name, add up the usage
/// across events (Anthropic reports the input tokens in `message_start` and
/// the output tokens in `message_delta`), end at the final event
/// (`response.completed`, `message_stop`), and ask no strip (their usage
/// always comes); events they do not know pass as they came. Google Gemini
/// streams whole responses, no terminator. A dialect gives its own
/// ([`answer::Answer::grammar`]).
#[derive(Debug)]
pub enum AnyGrammar {
    /// OpenAI chat and text completions.
    Chat(Chat),
    /// OpenAI Responses.
    Responses(Responses),
    /// Anthropic Messages.
    Messages(Messages),
    /// Google Gemini.
    Gemini(Gemini),
}

impl Default for AnyGrammar {
    fn default() -> Self {
        Self::Chat(Chat::default())
    }
}

impl AnyGrammar {
    fn grammar(&mut self) -> &mut dyn Grammar {
        match self {
            Self::Chat(g) => g,
            Self::Responses(g) => g,
            Self::Messages(g) => g,
            Self::Gemini(g) => g,
        }
    }

    fn grammar_ref(&self) -> &dyn Grammar {
        match self {
            Self::Chat(g) => g,
            Self::Responses(g) => g,
            Self::Messages(g) => g,
            Self::Gemini(g) => g,
        }
    }
}

impl Grammar for AnyGrammar {
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading {
        self.grammar().read(event, parse)
    }

    fn state(&self) -> &StreamState {
        self.grammar_ref().state()
    }

    fn state_mut(&mut self) -> &mut StreamState {
        self.grammar().state_mut()
    }

    fn usage(&self) -> Option<Usage> {
        self.grammar_ref().usage()
    }

    fn ended(&self) -> bool {
        self.grammar_ref().ended()
    }

    fn finished(&self) -> bool {
        self.grammar_ref().finished()
    }

    fn finish_reasons(&self) -> &FinishReasons {
        self.grammar_ref().finish_reasons()
    }

    fn keep_text(&mut self, limit: usize) {
        self.grammar().keep_text(limit);
    }

    fn transcript(&self) -> Option<&Transcript> {
        self.grammar_ref().transcript()
    }

    fn response_id(&self) -> Option<&str> {
        self.grammar_ref().response_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(ps: &[&str]) -> Vec<LlmPath> {
        ps.iter().map(|p| LlmPath::new(p)).collect()
    }

    #[test]
    fn recognises_llm_calls_by_method_and_path() {
        let p = paths(&DEFAULT_PATHS);
        for (path, want) in [
            ("/v1/chat/completions", Dialect::Chat),
            ("/v1/completions?x=1", Dialect::Completions),
            ("/v1/embeddings", Dialect::Embeddings),
            ("/v1/responses", Dialect::Responses),
            ("/v1/messages?beta=true", Dialect::Messages),
        ] {
            assert_eq!(classify("POST", path, &p), Some(want), "{path}");
        }
        assert_eq!(classify("GET", "/v1/chat/completions", &p), None);
        assert_eq!(classify("POST", "/v1/models", &p), None);
        assert_eq!(classify("POST", "/v1/chat/completions/x", &p), None);
        assert_eq!(classify("POST", "/V1/chat/completions", &p), None);
        assert_eq!(classify("POST", "/v1/messages/count_tokens", &p), None);
        assert_eq!(classify("POST", "/v1/responses/resp_1/cancel", &p), None);
        let custom = paths(&["/openai/deployments/gpt/chat/completions", "/generate"]);
        assert_eq!(
            classify("POST", "/openai/deployments/gpt/chat/completions", &custom),
            Some(Dialect::Chat)
        );
        assert_eq!(classify("POST", "/generate", &custom), Some(Dialect::Other));
        assert_eq!(classify("POST", "/v1/chat/completions", &custom), None);
    }

    #[test]
    fn a_star_segment_matches_any_one_segment() {
        let p = vec![
            LlmPath::new("/openai/deployments/*/chat/completions"),
            LlmPath {
                pattern: "/gw/*/v1/complete".into(),
                api: Dialect::Messages,
            },
        ];
        for (path, want) in [
            (
                "/openai/deployments/gpt-4o/chat/completions",
                Some(Dialect::Chat),
            ),
            (
                "/openai/deployments/x/chat/completions?api-version=1",
                Some(Dialect::Chat),
            ),
            ("/openai/deployments//chat/completions", None),
            ("/openai/deployments/a/b/chat/completions", None),
            ("/openai/deployments/chat/completions", None),
            ("/gw/team-a/v1/complete", Some(Dialect::Messages)),
            ("/gw/team-a/v1/complete/x", None),
        ] {
            assert_eq!(classify("POST", path, &p), want, "{path}");
        }
    }

    #[test]
    fn the_user_is_read_where_the_dialect_puts_it() {
        let j = |s: &str| Json::parse(s.as_bytes()).unwrap();
        let chat = j(r#"{"user":"u1","metadata":{"user_id":"u2"}}"#);
        assert_eq!(Dialect::Chat.user(&chat), Some("u1"));
        assert_eq!(Dialect::Responses.user(&chat), Some("u1"));
        assert_eq!(Dialect::Messages.user(&chat), Some("u2"));
        for body in [
            r#"{"user":""}"#,
            r#"{"user":3}"#,
            r#"{"metadata":{"user_id":null}}"#,
            "{}",
        ] {
            for e in [Dialect::Chat, Dialect::Messages] {
                assert_eq!(e.user(&j(body)), None, "{e:?} {body}");
            }
        }
    }

    #[test]
    fn every_dialect_has_one_name() {
        for (e, name) in APIS {
            assert_eq!(e.api(), name);
            assert_eq!(Dialect::named(name), Some(e));
        }
        assert_eq!(Dialect::named("chat_completions"), None);
    }

    #[test]
    fn only_messages_and_gemini_have_a_credential_header_of_their_own() {
        assert_eq!(Dialect::Messages.credential_header(), Some("x-api-key"));
        assert_eq!(Dialect::Gemini.credential_header(), Some("x-goog-api-key"));
        let own = [Dialect::Messages, Dialect::Gemini];
        for (e, _) in APIS.iter().filter(|(e, _)| !own.contains(e)) {
            assert_eq!(e.credential_header(), None, "{e:?}");
        }
        assert!(Dialect::is_credential_header("x-api-key"));
        assert!(Dialect::is_credential_header("x-goog-api-key"));
        assert!(!Dialect::is_credential_header("authorization"));
    }

    #[test]
    fn reads_the_model() {
        assert_eq!(
            model(br#"{"model":"gpt-4o","x":[1]}"#).as_deref(),
            Some("gpt-4o")
        );
        assert_eq!(model(br#"{"messages":[]}"#), None);
        assert_eq!(model(b"not json"), None);
        assert_eq!(model(br#"{"model":3}"#), None);
        assert_eq!(model(b""), None);
    }

    #[test]
    fn gemini_is_classified_by_default_with_its_verb() {
        let p = paths(&DEFAULT_PATHS);
        for (path, want) in [
            (
                "/v1beta/models/gemini-2.5-flash:generateContent",
                Some(Dialect::Gemini),
            ),
            (
                "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
                Some(Dialect::Gemini),
            ),
            ("/v1beta/models/m:countTokens", None),
            ("/v1beta/models/:generateContent", None),
            ("/v1beta/models/a:b:generateContent", None),
            ("/v1beta/models/m/x:generateContent", None),
            ("/v1beta/models/m", None),
            ("/v1beta/models/*:generateContent/x", None),
        ] {
            assert_eq!(classify("POST", path, &p), want, "{path}");
        }
        assert_eq!(
            classify("GET", "/v1beta/models/m:generateContent", &p),
            None
        );
        // A configured pattern of the same shape is Gemini's too.
        let vertex =
            LlmPath::new("/v1/projects/*/locations/*/publishers/google/models/*:generateContent");
        assert_eq!(vertex.api, Dialect::Gemini);
        assert!(
            vertex.matches("/v1/projects/p/locations/l/publishers/google/models/m:generateContent")
        );
        assert!(!vertex.matches(
            "/v1/projects/p/locations/l/publishers/google/models/m:streamGenerateContent"
        ));
        // A `*` alone still takes a whole segment, colon and all.
        assert!(LlmPath::new("/x/*").matches("/x/a:b"));
    }
}
