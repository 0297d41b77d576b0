//! What an answer says, read by its dialect: usage, the stream's grammar,
//! the stored entry, the local-reply and error shapes and the error classes.
//! Each API's file says it in its own words ([`Answer`]); the concerns
//! (limits, the cache, the budget's replies, fallback, capture) keep their
//! policy and ask the call's dialect here, through the one `match` of
//! [`Dialect::answer`].

pub(crate) mod google;
pub mod head;

use serde::Serialize;
use serde_json::{Map, Value};

use super::AnyGrammar;
use crate::json::Json;
use crate::usage::{Head, Usage};

/// What one API's answers say, and where. The error shape, the limits'
/// headers, the refusal reading and the provider's name default to
/// OpenAI's, which its chat, completions, embeddings and Responses APIs
/// share with the servers that copy them; a dialect of another family says
/// its own. OpenAI's chat, completions and embeddings have one impl, their
/// family's ([`super::openai::Family`]).
pub trait Answer: Sync {
    /// The tokens a usage object reports (the `usage` member of an answer
    /// or of a stream's event, Gemini's `usageMetadata`), read by the
    /// dialect's names alone; `None` when it is no usage object, or a count
    /// of its names is of a type the dialect does not write (the streams
    /// read their events' usage here too).
    fn usage(&self, usage: &Value) -> Option<Usage>;

    /// What a whole JSON answer says of itself (its usage, id, model and
    /// why it ended), read by the dialect's names in one pass over `body`
    /// ([`head`]); empty when it is no JSON object, or when a member the
    /// dialect reads is of a type it does not write.
    fn head(&self, body: &[u8]) -> Head;

    /// The grammar its streams are read with, one per stream.
    fn grammar(&self) -> AnyGrammar;

    /// How the cache keeps its answers; `None`: they are never cached.
    fn stored(&self) -> Option<Stored>;

    /// A JSON answer (an object without an `error`) is complete: all of
    /// it came, and it ended as an answer should (worth keeping).
    fn complete(&self, answer: &Map<String, Value>) -> bool;

    /// A reply the filter makes in place of the upstream's (`kind`, in
    /// `message`'s words), in the dialect's error shape: the status its
    /// SDKs map to the matching error, and the body they parse (OpenAI's
    /// `{"error":{"message","type","code"}}`, Anthropic's
    /// `{"type":"error","error":{"type","message"}}`).
    fn local_error(&self, kind: ReplyKind, message: &str) -> (u32, Vec<u8>) {
        openai_local_error(kind, message)
    }

    /// The headers its callers read what is left of their limits from
    /// (OpenAI's `x-ratelimit-*`, Anthropic's `anthropic-ratelimit-*`); a
    /// provider that sends none (Google) is told in OpenAI's, the filter's
    /// own.
    fn rate_headers(&self) -> &'static RateHeaders {
        &OPENAI_RATE_HEADERS
    }

    /// Why an upstream refused a call of `status`, as its error `body`
    /// (JSON) says; `None` for any other error. Today's dialects share one
    /// reading ([`refusal_of`]): their error shapes keep `type` and
    /// `message` in an `error` object, and servers of one dialect often
    /// front another's models and pass its words on.
    fn refusal(&self, status: u16, body: &Value) -> Option<Refusal> {
        refusal_of(status, body)
    }

    /// `gen_ai.provider.name` as the dialect names its provider (the
    /// backend behind an OpenAI-compatible API may be another).
    fn provider(&self) -> &'static str {
        "openai"
    }

    /// Tells `out` what a JSON answer said, turn by turn, as the dialect
    /// lays it out; false when its answers say no text (embeddings, a path
    /// of another shape).
    fn said(&self, answer: &Json, out: &mut dyn Hear) -> bool;

    /// The members of a JSON answer that hold what it said (the guardrails
    /// read every string in them): OpenAI's `choices`.
    fn said_fields(&self) -> &'static [&'static str] {
        &["choices"]
    }

    /// Calls `f` with each piece of text a stream's event adds to a text of
    /// the answer, keyed by that text (one per choice, content block or
    /// output part): OpenAI's chunks, a choice's `delta.content`, its tool
    /// calls' `arguments` and a completion's `text`.
    fn deltas(&self, event: &mut Json, f: &mut dyn FnMut(u32, &mut String)) {
        for (i, choice) in items_mut(event.get_mut("choices")).iter_mut().enumerate() {
            let key = (i as u32) << 6;
            if let Some(Json::String(s)) = choice.get_mut("text") {
                f(key, s);
            }
            let delta = choice.get_mut("delta");
            let Some(delta) = delta else { continue };
            if let Some(Json::String(s)) = delta.get_mut("content") {
                f(key, s);
            }
            for (j, call) in items_mut(delta.get_mut("tool_calls"))
                .iter_mut()
                .enumerate()
            {
                let args = call
                    .get_mut("function")
                    .and_then(|c| c.get_mut("arguments"));
                if let Some(Json::String(s)) = args {
                    f(key | (j as u32 + 1).min(63), s);
                }
            }
        }
    }

    /// The `event:` name of an error event of its streams, when they name
    /// their events (the data is [`Answer::local_error`]'s body).
    fn error_event(&self) -> Option<&'static str> {
        None
    }
}

/// An array's items, to change; none of anything else.
pub(super) fn items_mut(j: Option<&mut Json>) -> &mut [Json] {
    match j {
        Some(Json::Array(items)) => items,
        _ => &mut [],
    }
}

/// Takes what an answer said as its dialect reads it out (the capture of
/// the completion). The assistant's turns come one by one: a whole chat
/// message, a choice's text, or parts gathered until the turn ends.
pub trait Hear {
    /// Past its bound: what is left of the answer is left out.
    fn full(&mut self) -> bool;
    /// A turn that is one chat `message` (`role`, `content`, `tool_calls`),
    /// ended for `reason`.
    fn message(&mut self, message: &Json, reason: Option<&str>);
    /// A turn that is one text, ended for `reason`.
    fn text(&mut self, text: &str, reason: Option<&str>);
    /// A `content` of the turn under way: a string, or typed parts (text,
    /// tool uses and results, function calls).
    fn content(&mut self, content: Option<&Json>);
    /// An item of the turn under way that is its own part (a Responses
    /// `function_call`).
    fn item(&mut self, item: &Json);
    /// The turn under way ends, for `reason`.
    fn end_turn(&mut self, reason: Option<&str>);
}

/// A string's value.
pub(super) fn string(j: &Json) -> Option<&str> {
    match j {
        Json::String(s) => Some(s),
        _ => None,
    }
}

/// An array's items; none of anything else.
pub(super) fn list(j: Option<&Json>) -> &[Json] {
    match j {
        Some(Json::Array(items)) => items,
        _ => &[],
    }
}

/// Why an upstream refused a call, in one set of words for every dialect;
/// routing maps them to what it does (fall back to another model, or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The prompt (with the output cap) is longer than the model's context.
    ContextLength,
    /// The account's quota or credit is spent (not a rate limit: that ends).
    Quota,
    /// The backend does not serve the model (or no longer does).
    UnknownModel,
    /// The backend is overloaded for now.
    Overloaded,
}

/// The refusals a fallback chain moves a call on to the next model for,
/// as its `on` spells them (an overload is failover's, not one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorClass {
    /// The prompt (with the output cap) is longer than the model's context.
    ContextLength,
    /// The account's quota or credit is spent (not a rate limit: that ends).
    Quota,
    /// The backend does not serve the model (or no longer does).
    ModelNotFound,
}

impl ErrorClass {
    /// Every class, the default of `on`.
    pub const ALL: [Self; 3] = [Self::ContextLength, Self::Quota, Self::ModelNotFound];

    /// The label value and the config's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ContextLength => "context_length",
            Self::Quota => "quota",
            Self::ModelNotFound => "model_not_found",
        }
    }
}

/// The refusal an error body says, as Google writes it (read first: see
/// [`google::google_refusal`]), as OpenAI and OpenAI-compatible
/// servers write it (`{"error": {"code", "type", "message"}}`), Anthropic
/// (`{"type": "error", "error": {"type", "message"}}`) and vLLM (flat,
/// `{"object": "error", "type", "message"}`).
pub fn refusal_of(status: u16, body: &Value) -> Option<Refusal> {
    if let Some(said) = google::google_refusal(status, body) {
        return said;
    }
    let error = body.get("error").filter(|e| e.is_object()).unwrap_or(body);
    let field = |name: &str| {
        error
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let (code, kind, message) = (field("code"), field("type"), field("message"));
    let named = |words: &[&str]| words.iter().any(|w| *w == code || *w == kind);
    let says = |words: &[&str]| words.iter().any(|w| message.contains(w));
    if named(&["context_length_exceeded", "string_above_max_length"])
        || says(&[
            "maximum context length",
            "context length",
            "context window",
            "prompt is too long",
            "input is too long",
            "too many tokens",
        ])
    {
        return Some(Refusal::ContextLength);
    }
    if named(&[
        "insufficient_quota",
        "billing_hard_limit_reached",
        "billing_error",
    ]) || says(&["credit balance is too low", "exceeded your current quota"])
    {
        return Some(Refusal::Quota);
    }
    let no_model = named(&["model_not_found", "deploymentnotfound"])
        || ((status == 404 || named(&["not_found_error", "notfounderror"]))
            && message.contains("model"));
    if no_model {
        return Some(Refusal::UnknownModel);
    }
    (status == 529 || named(&["overloaded_error"])).then_some(Refusal::Overloaded)
}

/// Why the filter answers a call locally, which every dialect renders in
/// its error shape ([`Answer::local_error`]); the kind's own status, type,
/// code and message are the OpenAI-shaped defaults the dialects start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// Shed by the breaker's shed tier (503).
    Shed,
    /// Rejected by the breaker's reject tier (503).
    Reject,
    /// The budget was spent before the call could be forwarded (504).
    BudgetExhausted,
    /// Envoy ended the call at the budget (504), its reply rewritten.
    UpstreamTimeout,
    /// Envoy refused a request body larger than its buffer limit (413), its
    /// reply rewritten.
    TooLarge,
    /// Shed by the load-driven degrade (503).
    DegradeShed,
    /// Rejected by the load-driven degrade (503).
    DegradeReject,
    /// Over a limit of `limits` (429).
    OverLimit,
    /// Envoy had no mesh credential to put on the call (its secret is
    /// missing or unreadable), or the provider refused the one it put on
    /// (an expired token), the 401 rewritten (503): the gateway's fault,
    /// never the caller's key.
    NoCredential,
    /// No virtual key or verified identity, or an unknown key (401).
    Unauthenticated,
    /// A guardrail rule that blocks found something in the prompt (400).
    Blocked,
    /// The prompt could not be read whole for the guardrails that block
    /// or mask, and `guardrails.unchecked` refuses such calls (400).
    Unchecked,
    /// The guardrail service gave no verdict and its `on_error` refuses
    /// such calls (503).
    GuardrailUnavailable,
    /// A guardrail rule that blocks found something in the answer, or the
    /// answer could not be read whole and `unchecked` refuses it (502: the
    /// upstream's answer was refused; not to be retried).
    AnswerBlocked,
}

impl ReplyKind {
    /// HTTP status.
    pub fn status(self) -> u32 {
        match self {
            Self::Shed
            | Self::Reject
            | Self::DegradeShed
            | Self::DegradeReject
            | Self::NoCredential
            | Self::GuardrailUnavailable => 503,
            Self::BudgetExhausted | Self::UpstreamTimeout => 504,
            Self::TooLarge => 413,
            Self::OverLimit => 429,
            Self::Unauthenticated => 401,
            Self::Blocked | Self::Unchecked => 400,
            Self::AnswerBlocked => 502,
        }
    }

    /// The error `type`.
    pub fn error_type(self) -> &'static str {
        match self {
            Self::Shed
            | Self::Reject
            | Self::DegradeShed
            | Self::DegradeReject
            | Self::NoCredential
            | Self::GuardrailUnavailable => "service_unavailable",
            Self::BudgetExhausted | Self::UpstreamTimeout => "timeout",
            Self::TooLarge | Self::Unauthenticated | Self::Blocked | Self::Unchecked => {
                "invalid_request_error"
            }
            Self::OverLimit => "rate_limit_exceeded",
            Self::AnswerBlocked => "guardrail_error",
        }
    }

    /// The error `code`, stable for clients and alerts to match on.
    pub fn code(self) -> &'static str {
        match self {
            Self::Shed => "llm_filter_shed",
            Self::Reject => "llm_filter_circuit_open",
            Self::BudgetExhausted => "llm_filter_budget_exhausted",
            Self::UpstreamTimeout => "llm_filter_upstream_timeout",
            Self::TooLarge => "llm_filter_request_too_large",
            Self::DegradeShed => "llm_filter_degraded_shed",
            Self::DegradeReject => "llm_filter_degraded_reject",
            Self::OverLimit => "llm_filter_limit_exceeded",
            Self::NoCredential => "llm_filter_credential_unavailable",
            // OpenAI's own code, which its SDKs and apps already match on.
            Self::Unauthenticated => "invalid_api_key",
            Self::Blocked => "llm_filter_guardrail_blocked",
            Self::Unchecked => "llm_filter_guardrail_unchecked",
            Self::GuardrailUnavailable => "llm_filter_guardrail_unavailable",
            Self::AnswerBlocked => "llm_filter_guardrail_answer_blocked",
        }
    }

    /// A retry cannot help, only add load (the caller's whole budget is
    /// gone, or the answer would be refused again), so the reply tells SDKs
    /// not to make one.
    pub fn spends_the_budget(self) -> bool {
        matches!(
            self,
            Self::BudgetExhausted | Self::UpstreamTimeout | Self::AnswerBlocked
        )
    }

    /// The default human-readable message.
    pub fn message(self) -> &'static str {
        match self {
            Self::Shed => {
                "The backend is under pressure and lower-priority requests are being shed; \
                 retry later."
            }
            Self::Reject => {
                "The backend is failing and the circuit is open for this priority; retry later."
            }
            Self::BudgetExhausted => {
                "The request's timeout budget was spent before it could be sent upstream."
            }
            Self::UpstreamTimeout => {
                "The upstream did not answer within the request's timeout budget."
            }
            Self::TooLarge => "The request body is larger than the proxy accepts.",
            Self::DegradeShed => {
                "The model is degraded under load and lower-priority requests are being shed; \
                 retry later."
            }
            Self::DegradeReject => {
                "The model is degraded under load and rejects this priority for now; retry later."
            }
            Self::OverLimit => "A usage limit of this caller is reached; retry later.",
            Self::Unauthenticated => "Incorrect API key provided.",
            Self::Blocked => "The request was blocked by a guardrail rule.",
            Self::Unchecked => "The request could not be checked by the guardrails.",
            Self::GuardrailUnavailable => {
                "The guardrail service could not check the request; retry later."
            }
            Self::AnswerBlocked => "The answer was blocked by a guardrail rule.",
            Self::NoCredential => {
                "The gateway's credential for this provider is unavailable or was refused; \
                 this is not a fault of the caller's key."
            }
        }
    }
}

/// The names a dialect's providers give what is left of a caller's
/// limits, on every answer and on their own 429s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateHeaders {
    /// The limit, the remaining and the reset of the requests.
    pub requests: [&'static str; 3],
    /// The limit, the remaining and the reset of the tokens.
    pub tokens: [&'static str; 3],
    /// How the reset is written.
    pub reset: Reset,
}

/// How a dialect writes when a limit resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// The seconds until it does, `12s` (OpenAI's).
    Seconds,
    /// The instant it does, RFC 3339 (Anthropic's).
    Instant,
}

/// How the cache keeps a dialect's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// In one canonical form, the provider's non-streamed JSON, which
    /// answers a call either way: with `Some`, a stream is rebuilt into it
    /// and replayed from it in these choices' shape; with `None` the
    /// dialect never streams, and a hit is always JSON.
    Canonical(Option<Choices>),
    /// As the upstream sent it, the JSON or every byte of the stream: it
    /// answers only calls that ask for the same delivery.
    AsSent,
}

/// The shape of an answer of OpenAI's `choices`, which the cache rebuilds
/// from a stream of chunks and replays as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choices {
    /// The `object` of the whole answer (`chat.completion`).
    pub object: &'static str,
    /// The `object` of each chunk of its stream (`chat.completion.chunk`).
    pub chunk: &'static str,
    /// Each choice is a `message`, streamed as `delta`s; else a `text`,
    /// streamed in pieces of text.
    pub message: bool,
}

/// A local reply in OpenAI's shape, with the reply module's status.
fn openai_local_error(kind: ReplyKind, message: &str) -> (u32, Vec<u8>) {
    (
        kind.status(),
        error_body(message, kind.error_type(), kind.code()),
    )
}

/// OpenAI's names of what is left of a caller's limits; the reset is
/// in seconds from now.
pub(crate) const OPENAI_RATE_HEADERS: RateHeaders = RateHeaders {
    requests: [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ],
    tokens: [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ],
    reset: Reset::Seconds,
};

#[derive(Serialize)]
struct Body<'a> {
    error: Error<'a>,
}

/// The error object of OpenAI's shape, and of Anthropic's beside its
/// `type` (the filter's stable `code` among its fields).
#[derive(Serialize)]
pub(crate) struct Error<'a> {
    pub(crate) message: &'a str,
    #[serde(rename = "type")]
    pub(crate) kind: &'a str,
    pub(crate) code: &'a str,
}

/// `{"error":{"message":…,"type":…,"code":…}}`: OpenAI's error shape,
/// which its chat, completions, embeddings and Responses share, every
/// string JSON-escaped.
pub fn error_body(message: &str, error_type: &str, code: &str) -> Vec<u8> {
    let body = Body {
        error: Error {
            message,
            kind: error_type,
            code,
        },
    };
    // Serialising borrowed strings cannot fail; the fallback keeps the
    // data path free of `unwrap` all the same.
    serde_json::to_vec(&body).unwrap_or_else(|_| {
        br#"{"error":{"message":"request refused","type":"service_unavailable","code":null}}"#
            .to_vec()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::reply::with_message;
    use crate::dialect::Dialect;
    use crate::sse::{Grammar, Stream};

    fn every() -> Vec<Dialect> {
        Dialect::names().filter_map(Dialect::named).collect()
    }

    #[test]
    fn each_dialect_says_how_its_answers_are_kept() {
        for d in every() {
            let (stored, streams) = (d.answer().stored(), d.request().streams());
            match d {
                Dialect::Chat | Dialect::Completions => {
                    let Some(Stored::Canonical(Some(c))) = stored else {
                        panic!("{d:?}: {stored:?}");
                    };
                    assert_eq!(c.message, d == Dialect::Chat, "{d:?}");
                    assert!(streams);
                }
                Dialect::Embeddings => {
                    assert_eq!(stored, Some(Stored::Canonical(None)));
                    assert!(!streams);
                }
                Dialect::Responses | Dialect::Messages | Dialect::Gemini => {
                    assert_eq!(stored, Some(Stored::AsSent), "{d:?}");
                    assert!(streams);
                }
                Dialect::Other => assert_eq!(stored, None),
            }
        }
    }

    #[test]
    fn each_dialect_reads_its_stream_with_its_grammar() {
        for d in every() {
            let g = d.answer().grammar();
            let want = match d {
                Dialect::Responses => matches!(g, AnyGrammar::Responses(_)),
                Dialect::Messages => matches!(g, AnyGrammar::Messages(_)),
                Dialect::Gemini => matches!(g, AnyGrammar::Gemini(_)),
                _ => matches!(g, AnyGrammar::Chat(_)),
            };
            assert!(want, "{d:?}: {g:?}");
        }
        // The chat grammar reads a chunk's usage by its dialect's names.
        let chunk =
            b"data: {\"choices\":[],\"usage\":{\"input_tokens\":3,\"prompt_tokens\":2}}\n\n";
        let prompt = |d: Dialect| {
            let mut s = Stream::with_grammar(d.answer().grammar());
            s.feed(chunk, true, None);
            s.grammar().usage().map(|u| u.prompt_tokens)
        };
        assert_eq!(prompt(Dialect::Chat), Some(2));
        assert_eq!(prompt(Dialect::Completions), Some(2));
        assert_eq!(prompt(Dialect::Other), Some(5));
    }

    #[test]
    fn each_dialect_writes_errors_and_names_limits_in_its_words() {
        for d in every() {
            let a = d.answer();
            let (status, body) = a.local_error(ReplyKind::Shed, "busy");
            let v: Value = serde_json::from_slice(&body).unwrap();
            let headers = a.rate_headers();
            if d == Dialect::Gemini {
                assert_eq!(status, 503);
                assert_eq!(v["error"]["code"], 503);
                assert_eq!(v["error"]["status"], "UNAVAILABLE");
                assert_eq!(v["error"]["message"], "busy");
                assert_eq!(a.provider(), "gcp.gemini");
                continue;
            }
            if d == Dialect::Messages {
                assert_eq!(status, 529);
                assert_eq!(v["type"], "error");
                assert_eq!(v["error"]["type"], "overloaded_error");
                assert_eq!(headers.requests[0], "anthropic-ratelimit-requests-limit");
                assert_eq!(headers.reset, Reset::Instant);
                assert_eq!(a.provider(), "anthropic");
            } else {
                assert_eq!(status, 503);
                let written = with_message(ReplyKind::Shed, "busy", None);
                assert_eq!(body, written.body, "{d:?}: as the reply module writes it");
                assert_eq!(v["error"]["type"], "service_unavailable");
                assert_eq!(headers.tokens[1], "x-ratelimit-remaining-tokens");
                assert_eq!(headers.reset, Reset::Seconds);
                assert_eq!(a.provider(), "openai");
            }
            assert_eq!(v["error"]["message"], "busy", "{d:?}");
            assert_eq!(v["error"]["code"], ReplyKind::Shed.code(), "{d:?}");
        }
    }

    /// What a dialect read out, as one line per call.
    #[derive(Default)]
    struct Heard(Vec<String>);

    impl Hear for Heard {
        fn full(&mut self) -> bool {
            false
        }
        fn message(&mut self, m: &Json, reason: Option<&str>) {
            let content = m.get("content").and_then(string).unwrap_or_default();
            self.0.push(format!("message {content} {reason:?}"));
        }
        fn text(&mut self, text: &str, reason: Option<&str>) {
            self.0.push(format!("text {text} {reason:?}"));
        }
        fn content(&mut self, c: Option<&Json>) {
            self.0.push(format!("content {}", list(c).len()));
        }
        fn item(&mut self, item: &Json) {
            let name = item.get("name").and_then(string).unwrap_or_default();
            self.0.push(format!("item {name}"));
        }
        fn end_turn(&mut self, reason: Option<&str>) {
            self.0.push(format!("end {reason:?}"));
        }
    }

    #[test]
    fn each_dialect_reads_out_where_its_answer_said_it() {
        let said = |d: Dialect, body: &str| {
            let mut h = Heard::default();
            let any = d
                .answer()
                .said(&Json::parse(body.as_bytes()).unwrap(), &mut h);
            any.then_some(h.0)
        };
        let chat = r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"},{"text":"t","finish_reason":"length"},{}]}"#;
        assert_eq!(
            said(Dialect::Chat, chat).unwrap(),
            ["message hi Some(\"stop\")", "text t Some(\"length\")"]
        );
        assert_eq!(said(Dialect::Completions, chat), said(Dialect::Chat, chat));
        let responses = r#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"reasoning"},{"type":"message","content":[{"type":"output_text","text":"a"}]},{"type":"function_call","name":"f"}]}"#;
        assert_eq!(
            said(Dialect::Responses, responses).unwrap(),
            ["content 1", "item f", "end Some(\"max_output_tokens\")"]
        );
        let messages = r#"{"type":"message","content":[{"type":"text","text":"a"},{"type":"tool_use"}],"stop_reason":"tool_use"}"#;
        assert_eq!(
            said(Dialect::Messages, messages).unwrap(),
            ["content 2", "end Some(\"tool_use\")"]
        );
        assert_eq!(said(Dialect::Embeddings, chat), None);
        assert_eq!(said(Dialect::Other, chat), None);
    }

    #[test]
    fn refusals_are_read_from_every_shape() {
        let r = |status, body: &str| refusal_of(status, &serde_json::from_str(body).unwrap());
        assert_eq!(
            r(400, r#"{"error":{"code":"context_length_exceeded"}}"#),
            Some(Refusal::ContextLength)
        );
        assert_eq!(
            r(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 9 tokens"}}"#
            ),
            Some(Refusal::ContextLength)
        );
        assert_eq!(
            r(
                404,
                r#"{"object":"error","type":"NotFoundError","message":"The model `x` does not exist."}"#
            ),
            Some(Refusal::UnknownModel)
        );
        assert_eq!(
            r(429, r#"{"error":{"code":"insufficient_quota"}}"#),
            Some(Refusal::Quota)
        );
        assert_eq!(
            r(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            Some(Refusal::Overloaded)
        );
        assert_eq!(r(400, r#"{"error":{"message":"bad"}}"#), None);
    }
}
