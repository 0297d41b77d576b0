//! A mock LLM provider, so end-to-end tests can assert exactly what reached the
//! provider and script how it answers (status, latency, streaming pace, dropped
//! connections) without any real provider. It speaks the OpenAI-compatible chat,
//! completions and embeddings APIs (chat also at Bedrock's
//! [`BEDROCK_CHAT_PATH`] and at Azure OpenAI's deployment paths), the
//! OpenAI Responses API ([`responses`]),
//! the Anthropic Messages API ([`messages`]) and the Gemini API's
//! `generateContent` ([`gemini`]), each in its own JSON, SSE and error shapes;
//! every scripting header below works on all of them. It takes the
//! credential its provider takes when told to: keys ([`MockUpstream::set_keys`])
//! or the live tokens of a mock OAuth2 token endpoint ([`oauth2`]).
//!
//! It runs on its own thread and Tokio runtime, so it keeps serving while a test
//! blocks (on Envoy's admin API, say) and works from sync and async tests alike.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

mod gemini;
pub mod guardrail;
mod messages;
pub mod oauth2;
pub mod provider;
mod responses;

pub use provider::Provider;

/// Request header: reply with this status and an error body in the API's
/// shape (OpenAI's `{"error":{..}}`, Anthropic's `{"type":"error",..}` with the
/// error type Anthropic gives that status, e.g. 529 `overloaded_error`,
/// Google's `{"error":{"code","message","status"}}` with the status name
/// Google gives it, e.g. 429 `RESOURCE_EXHAUSTED`).
pub const HEADER_STATUS: &str = "x-mock-status";
/// Request header: wait this many milliseconds before the response headers.
pub const HEADER_DELAY_MS: &str = "x-mock-delay-ms";
/// Request header: wait this many milliseconds between SSE events.
pub const HEADER_CHUNK_DELAY_MS: &str = "x-mock-chunk-delay-ms";
/// Request header: `1` drops the connection without any response.
pub const HEADER_RESET: &str = "x-mock-reset";
/// Request header: fail the first N attempts sharing one `idempotency-key` with 503
/// (requests without the key share one counter).
pub const HEADER_FAIL_FIRST: &str = "x-mock-fail-first";
/// Response header naming the instance that answered.
pub const HEADER_INSTANCE: &str = "x-mock-instance";
/// Request header: send this value as `retry-after` with an error status.
pub const HEADER_RETRY_AFTER: &str = "x-mock-retry-after";
/// Request header: send this value as `x-should-retry` with an error status
/// (the providers' hint both official SDKs obey over their own retry rules).
pub const HEADER_SHOULD_RETRY: &str = "x-mock-should-retry";
/// Request header: send the first N bytes of the answer's body (JSON or SSE,
/// at its usual pace), then drop the connection mid-answer.
pub const HEADER_RESET_AFTER_BYTES: &str = "x-mock-reset-after-bytes";
/// Request header: how a streamed answer misbehaves. `invalid`: events that
/// are not JSON, not UTF-8, cut in the middle, data after `[DONE]`, and no
/// final blank line; `endless`: the usual events without the last one
/// (`[DONE]`, `response.completed`, `message_stop`, Gemini's response with
/// the `finishReason`), then silence with the
/// stream left open until the other side gives up; `unknown` (Responses and
/// Messages): the usual events with one of a type the API does not define
/// after the first, as a provider adding event types sends them.
pub const HEADER_SSE: &str = "x-mock-sse";
/// Request header: `gzip` compresses the answer's body (JSON or the whole SSE
/// stream at once) and says so in `content-encoding`, whatever the request's
/// `accept-encoding`.
pub const HEADER_CONTENT_ENCODING: &str = "x-mock-content-encoding";

/// Pause between SSE events unless configured otherwise.
pub const DEFAULT_CHUNK_DELAY_MS: u64 = 50;

/// How long a played prompt cache keeps a prompt it saw: providers keep a
/// cached prefix for 5 to 10 minutes of inactivity (OpenAI), 5 minutes by
/// default (Anthropic).
pub const PROMPT_CACHE_TTL: Duration = Duration::from_secs(300);
/// Most prompts a played prompt cache keeps.
const PROMPT_CACHE_ENTRIES: usize = 1024;

/// Length of every embedding vector the mock returns.
pub const EMBEDDING_DIMENSIONS: usize = 256;

/// A heavy latency tail for the model calls (`POST`) of a mock: each one, with
/// `probability`, waits a delay drawn uniformly from `min_ms..=max_ms` instead
/// of the default delay. The draws come from a generator seeded with `seed`,
/// so the n-th call a mock receives waits the same in every run; probes and
/// other `GET`s keep the default delay, as a stalled generation leaves a
/// server's `/v1/models` fast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TailLatency {
    /// Share of calls in the tail, in `[0, 1]`.
    pub probability: f64,
    /// Shortest delay of a call in the tail.
    pub min_ms: u64,
    /// Longest delay of a call in the tail.
    pub max_ms: u64,
    /// Seed of the draws.
    pub seed: u64,
}

impl TailLatency {
    /// The delay of the `n`-th call (from 0): `Some` when it falls in the tail.
    pub fn delay_ms(&self, n: u64) -> Option<u64> {
        // SplitMix64: the n-th output of the generator seeded with `seed`, two
        // outputs per call (whether it is in the tail, then how long it waits).
        let draw = |i: u64| {
            let mut z = self
                .seed
                .wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        // The top 53 bits as a uniform number in [0, 1).
        let unit = (draw(2 * n) >> 11) as f64 / (1u64 << 53) as f64;
        if unit >= self.probability {
            return None;
        }
        let span = self.max_ms.saturating_sub(self.min_ms).saturating_add(1);
        Some(self.min_ms + draw(2 * n + 1) % span)
    }
}

/// Why a body stops early: a reset asked for by [`HEADER_RESET_AFTER_BYTES`].
type BodyError = Box<dyn std::error::Error + Send + Sync>;

type Body = BoxBody<Bytes, BodyError>;

/// How to start a [`MockUpstream`].
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Instance name: in `x-mock-instance`, in every answer's content and ids.
    pub name: String,
    /// Address to bind; loopback unless a demo needs otherwise.
    pub host: IpAddr,
    /// Port to bind; 0 picks a free one.
    pub port: u16,
    /// Delay before the response headers of every request.
    pub default_delay_ms: u64,
    /// Pause between SSE events.
    pub chunk_delay_ms: u64,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            name: "mock".to_string(),
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            default_delay_ms: 0,
            chunk_delay_ms: DEFAULT_CHUNK_DELAY_MS,
        }
    }
}

impl MockConfig {
    /// Default configuration with the given instance name.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_string(),
            ..Self::default()
        }
    }
}

impl MockUpstream {
    /// A mock named `name` (a backend of that cluster name) answering model
    /// calls after `delay_ms`.
    pub fn backend(name: &str, delay_ms: u64) -> Self {
        Self::start(MockConfig {
            default_delay_ms: delay_ms,
            ..MockConfig::named(name)
        })
    }
}

/// Bedrock's OpenAI-compatible chat completions, answered as
/// `/v1/chat/completions` is.
pub const BEDROCK_CHAT_PATH: &str = "/openai/v1/chat/completions";

/// Whether `path` is Azure OpenAI's chat completions of a deployment,
/// `/openai/deployments/<deployment>/chat/completions`, answered as
/// `/v1/chat/completions` is.
fn azure_chat(path: &str) -> bool {
    path.strip_prefix("/openai/deployments/")
        .and_then(|p| p.strip_suffix("/chat/completions"))
        .is_some_and(|deployment| !deployment.is_empty() && !deployment.contains('/'))
}

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Query string without `?`, when present.
    pub query: Option<String>,
    /// Headers in arrival order, names lowercased, repeated names kept.
    pub headers: Vec<(String, String)>,
    /// Complete request body.
    pub body: Bytes,
    /// When the request head arrived.
    pub received_at: Instant,
}

impl RecordedRequest {
    /// First value of a header (name is case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a header, in arrival order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// A header parsed as a number (scripting headers).
    fn header_u64(&self, name: &str) -> Option<u64> {
        self.header(name).and_then(|v| v.trim().parse().ok())
    }

    /// The body parsed as JSON, when it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The request as received, for a verifier outside the test (a
    /// provider's signature check): method, path with its query, every
    /// header in arrival order, the body's exact bytes in base64.
    pub fn as_received(&self) -> Value {
        let path = match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        };
        json!({
            "method": self.method,
            "path": path,
            "headers": self.headers,
            "body_b64": base64(&self.body),
        })
    }
}

/// The digits of standard base64 (RFC 4648).
const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in standard base64, padded (RFC 4648).
fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4usize {
            let sextet = (n >> (18 - 6 * i) & 63) as usize;
            let c = match BASE64_ALPHABET.get(sextet) {
                Some(c) if i <= chunk.len() => *c,
                _ => b'=',
            };
            out.push(char::from(c));
        }
    }
    out
}

/// The bytes of standard base64 `text` (RFC 4648, padding optional);
/// `None` when it is not base64.
fn from_base64(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim_end_matches('=').bytes();
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in digits {
        let sextet = BASE64_ALPHABET.iter().position(|a| *a == c)?;
        acc = acc << 6 | sextet as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits & 0xff) as u8);
        }
    }
    Some(out)
}

/// A one-shot behaviour consumed by the next request (see [`MockUpstream::push_script`]).
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// Reply with this status (an OpenAI error body when >= 400).
    pub status: Option<u16>,
    /// Delay before the response headers.
    pub delay_ms: Option<u64>,
    /// Drop the connection without a response.
    pub reset: bool,
    /// Answer with this body instead of the dialect's own (a status below
    /// 400 only), whatever the request said.
    pub answer: Option<Canned>,
}

/// A body a script answers with as it is, byte for byte.
#[derive(Debug, Clone)]
pub enum Canned {
    /// `application/json`.
    Json(String),
    /// `text/event-stream`, one frame each, `chunk_delay_ms` apart.
    Sse(Vec<String>),
    /// Of this content type, in these pieces, each sent after its delay
    /// (ms) from the one before: an answer whose end comes late.
    Paced(&'static str, Vec<(u64, String)>),
}

struct State {
    name: String,
    requests: Mutex<Vec<RecordedRequest>>,
    scripts: Mutex<VecDeque<Script>>,
    attempts: Mutex<HashMap<String, u64>>,
    status: Mutex<Option<u16>>,
    /// The `error.code` of scripted error bodies (`mock_status` when unset).
    error_code: Mutex<Option<String>>,
    /// The quota a 429 of a mock playing Google names (`quotaId`).
    quota: Mutex<Option<String>>,
    reset: AtomicBool,
    waiting: Mutex<f64>,
    kv_usage: Mutex<f64>,
    default_delay_ms: AtomicU64,
    tail: Mutex<Option<TailLatency>>,
    tail_calls: AtomicU64,
    chunk_delay_ms: AtomicU64,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
    sequence: AtomicU64,
    /// The SSE bodies sent, whole, most recent last (bounded).
    streams: Mutex<VecDeque<Vec<u8>>>,
    /// Ids of the Responses answers stored (`store` not false), which a later
    /// `previous_response_id` may name; most recent last (bounded).
    stored_responses: Mutex<VecDeque<String>>,
    /// Words of every chat answer, when set (the echo padded or cut).
    answer_words: Mutex<Option<usize>>,
    /// The chat prompts seen in the last [`PROMPT_CACHE_TTL`], when the mock
    /// plays a prompt cache: a prompt that starts with one of them reports its
    /// tokens as cached (bounded, most recent last).
    prompt_cache: Mutex<Option<VecDeque<(Instant, String)>>>,
    /// Anthropic's prompt cache, when the mock plays it for Messages calls.
    messages_cache: Mutex<Option<messages::PromptCache>>,
    /// Prefill time of each prompt token the played cache did not hold, in
    /// microseconds, added to a chat call's delay (0: none).
    prefill_us_per_token: AtomicU64,
    /// Factor on the prompt tokens every chat answer reports, when set.
    prompt_token_scale: Mutex<Option<f64>>,
    /// The usage every chat and Messages answer reports, when set, in
    /// place of the one it counts.
    reported_usage: Mutex<Option<Value>>,
    /// The provider keys a model call must carry, checked as its provider
    /// checks them, when set: anything else is answered 401.
    keys: Mutex<Option<Vec<String>>>,
    /// The token endpoint whose live tokens a model call must carry as
    /// `authorization: Bearer`, when set: any other, or one expired, is
    /// answered 401.
    tokens: Mutex<Option<Arc<oauth2::Ledger>>>,
    /// The provider the mock plays, when set: it takes calls only in that
    /// provider's shape (see [`provider`]).
    provider: Mutex<Option<Provider>>,
}

impl State {
    /// The delay of the next model call when it falls in the tail.
    fn tail_delay_ms(&self) -> Option<u64> {
        let tail = (*lock(&self.tail))?;
        tail.delay_ms(self.tail_calls.fetch_add(1, Ordering::SeqCst))
    }
}

/// Poisoning only means another test thread panicked; the data is still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counts a request as in flight until dropped (after the last byte for streams).
struct InFlight(Arc<State>);

impl InFlight {
    fn new(state: Arc<State>) -> Self {
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running mock upstream; stops when dropped.
pub struct MockUpstream {
    state: Arc<State>,
    server: Server,
}

/// An HTTP/1 server on a thread and Tokio runtime of its own, answering
/// every request with its handler; stops when dropped. The mock provider
/// and the mock token endpoint ([`oauth2`]) each run on one.
struct Server {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `host:port` and answers each request with `handler`.
    fn start<H, F>(name: &str, host: IpAddr, port: u16, handler: H) -> std::io::Result<Self>
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: std::future::Future<Output = Result<Response<Body>, ResetConnection>> + Send + 'static,
    {
        let listener = std::net::TcpListener::bind((host, port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("mock-{name}"))
            .enable_all()
            .build()?;
        let (shutdown, stop) = oneshot::channel();
        let name = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("mock-{name}"))
            .spawn(move || {
                runtime.block_on(serve(listener, &name, handler, stop));
                // Open connections and streams end with the runtime.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(Self {
            addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl MockUpstream {
    /// Binds `config.host:config.port` and serves on a thread of its own.
    ///
    /// Panics when the port cannot be bound: this is test infrastructure.
    pub fn start(config: MockConfig) -> MockUpstream {
        Self::try_start(config).expect("mock upstream")
    }

    /// Like [`MockUpstream::start`], returning bind errors.
    pub fn try_start(config: MockConfig) -> std::io::Result<MockUpstream> {
        let state = Arc::new(State {
            name: config.name.clone(),
            requests: Mutex::new(Vec::new()),
            scripts: Mutex::new(VecDeque::new()),
            attempts: Mutex::new(HashMap::new()),
            status: Mutex::new(None),
            error_code: Mutex::new(None),
            quota: Mutex::new(None),
            reset: AtomicBool::new(false),
            waiting: Mutex::new(0.0),
            kv_usage: Mutex::new(0.0),
            default_delay_ms: AtomicU64::new(config.default_delay_ms),
            tail: Mutex::new(None),
            tail_calls: AtomicU64::new(0),
            chunk_delay_ms: AtomicU64::new(config.chunk_delay_ms),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
            sequence: AtomicU64::new(0),
            streams: Mutex::new(VecDeque::new()),
            stored_responses: Mutex::new(VecDeque::new()),
            answer_words: Mutex::new(None),
            prompt_token_scale: Mutex::new(None),
            reported_usage: Mutex::new(None),
            prompt_cache: Mutex::new(None),
            messages_cache: Mutex::new(None),
            prefill_us_per_token: AtomicU64::new(0),
            keys: Mutex::new(None),
            tokens: Mutex::new(None),
            provider: Mutex::new(None),
        });
        let serving = Arc::clone(&state);
        let server = Server::start(&config.name, config.host, config.port, move |req| {
            handle(Arc::clone(&serving), req)
        })?;
        Ok(MockUpstream { state, server })
    }

    /// Plays `provider` (`None`: every API on its own path): a call in any
    /// other shape is refused as that provider refuses it (400), and error
    /// statuses are answered in its shape.
    pub fn set_provider(&self, provider: Option<Provider>) {
        *lock(&self.state.provider) = provider;
    }

    /// Makes every model call (POST) carry one of `keys` as its provider
    /// takes it: Anthropic's `x-api-key`, Gemini's `x-goog-api-key` (or
    /// `?key=`), else OpenAI's `authorization: Bearer` or Azure's `api-key`;
    /// a call without one is answered 401 in its API's shape. `None`: any
    /// call is answered.
    pub fn set_keys(&self, keys: Option<&[&str]>) {
        *lock(&self.state.keys) = keys.map(|k| k.iter().map(|s| s.to_string()).collect());
    }

    /// Makes every model call (POST) carry a token `endpoint` issued that
    /// has not expired, in `authorization: Bearer`, as a provider taking
    /// OAuth2 tokens (Azure OpenAI with Entra ID) checks it; any other call
    /// is answered 401 in its API's shape. `None`: back to
    /// [`MockUpstream::set_keys`]'s check.
    pub fn take_tokens_of(&self, endpoint: Option<&oauth2::TokenEndpoint>) {
        *lock(&self.state.tokens) = endpoint.map(oauth2::TokenEndpoint::ledger);
    }

    /// Port the mock listens on.
    pub fn port(&self) -> u16 {
        self.server.addr.port()
    }

    /// Address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:4321`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.server.addr, path)
    }

    /// Instance name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Every request received since start (or the last [`clear`](Self::clear)).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.requests).clone()
    }

    /// Number of requests received since start (or the last clear).
    pub fn request_count(&self) -> usize {
        lock(&self.state.requests).len()
    }

    /// The SSE bodies of the streamed answers sent (the last
    /// [`MAX_STREAMS_KEPT`]), byte for byte, oldest first.
    pub fn sent_streams(&self) -> Vec<Vec<u8>> {
        lock(&self.state.streams).iter().cloned().collect()
    }

    /// The most recent request, if any.
    pub fn last_request(&self) -> Option<RecordedRequest> {
        lock(&self.state.requests).last().cloned()
    }

    /// Forgets recorded requests, `x-mock-fail-first` attempt counts and the
    /// in-flight peak. Scripts and instance settings stay.
    pub fn clear(&self) {
        lock(&self.state.requests).clear();
        lock(&self.state.attempts).clear();
        self.state.peak_in_flight.store(
            self.state.in_flight.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
    }

    /// Delay before the response headers of every later request.
    pub fn set_default_delay_ms(&self, ms: u64) {
        self.state.default_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// A heavy latency tail for every later model call (`None` removes it); the
    /// draws start over from the seed's first one.
    pub fn set_tail_latency(&self, tail: Option<TailLatency>) {
        *lock(&self.state.tail) = tail;
        self.state.tail_calls.store(0, Ordering::SeqCst);
    }

    /// Pause between SSE events of every later stream.
    pub fn set_chunk_delay_ms(&self, ms: u64) {
        self.state.chunk_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Every later chat answer has `words` words (`None`: the plain echo),
    /// which its usage counts as its completion tokens.
    pub fn set_answer_words(&self, words: Option<usize>) {
        *lock(&self.state.answer_words) = words;
    }

    /// Every later chat answer reports `scale` times the prompt tokens it
    /// counts (its prompt's words), rounded up (`None`: as counted): a
    /// provider whose tokenizer counts differently from the filter's estimate.
    pub fn set_prompt_token_scale(&self, scale: Option<f64>) {
        *lock(&self.state.prompt_token_scale) = scale;
    }

    /// Every later chat and Messages answer reports `usage` (in the API's
    /// own words: `prompt_tokens_details`, `cache_creation_input_tokens`,
    /// …) in place of the usage it counts, in a JSON answer and in a
    /// stream's usage events (a Messages stream's `message_delta` carries
    /// its `output_tokens`); `None` counts again.
    pub fn set_reported_usage(&self, usage: Option<Value>) {
        *lock(&self.state.reported_usage) = usage;
    }

    /// The mock plays a provider's prompt cache for every later chat and
    /// Gemini call: the tokens of the longest earlier prompt (of this mock)
    /// that the call's prompt starts with are reported as
    /// `prompt_tokens_details.cached_tokens` (Gemini's
    /// `usageMetadata.cachedContentTokenCount`).
    /// A prompt is remembered for [`PROMPT_CACHE_TTL`].
    pub fn set_prompt_cache(&self, on: bool) {
        *lock(&self.state.prompt_cache) = on.then(VecDeque::new);
    }

    /// The mock plays Anthropic's prompt cache for every later Messages
    /// call (`Some`: the fewest tokens, words here, a prefix must have to be
    /// cached; `None`: off): see [`messages::PromptCache`].
    pub fn set_messages_cache(&self, min_tokens: Option<u64>) {
        *lock(&self.state.messages_cache) = min_tokens.map(messages::PromptCache::new);
    }

    /// Every later chat or completions call waits `us` microseconds more for
    /// each prompt token the played prompt cache did not hold, as a model
    /// server prefills what its prefix cache misses (0: no prefill cost).
    /// Takes effect with [`MockUpstream::set_prompt_cache`].
    pub fn set_prefill_us_per_token(&self, us: u64) {
        self.state.prefill_us_per_token.store(us, Ordering::SeqCst);
    }

    /// Status for every later request (`None` restores normal answers).
    pub fn set_status(&self, status: Option<u16>) {
        *lock(&self.state.status) = status;
    }

    /// Status and OpenAI `error.code` for every later request, e.g. `400`
    /// `context_length_exceeded` (a probe gets it too: below 500 but 429 it
    /// still proves the backend up); on a mock playing a provider, the
    /// error's message in that provider's shape. `None` restores normal
    /// answers.
    pub fn set_error(&self, error: Option<(u16, &str)>) {
        *lock(&self.state.status) = error.map(|(s, _)| s);
        *lock(&self.state.error_code) = error.map(|(_, c)| c.to_string());
    }

    /// On a mock playing Vertex or the Gemini API, the quota its 429s name
    /// as Google details a quota error: a `google.rpc.QuotaFailure`
    /// violation whose `quotaId` is `quota` (e.g.
    /// `GenerateRequestsPerDayPerProjectPerModel`), a `Help` and a
    /// `RetryInfo`. `None`: a bare `RESOURCE_EXHAUSTED`. On a mock playing
    /// Bedrock, any quota makes its 400s `ServiceQuotaExceededException`
    /// (named in `x-amzn-errortype`), not `ValidationException`.
    pub fn set_quota(&self, quota: Option<&str>) {
        *lock(&self.state.quota) = quota.map(str::to_string);
    }

    /// Drops the connection of every later request without a response (after
    /// the default delay), probes included; `false` restores normal answers.
    pub fn set_reset(&self, reset: bool) {
        self.state.reset.store(reset, Ordering::SeqCst);
    }

    /// Load the `GET /metrics` endpoint reports, as a vLLM server would:
    /// `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` (0..1).
    pub fn set_load(&self, waiting: f64, kv_usage: f64) {
        *lock(&self.state.waiting) = waiting;
        *lock(&self.state.kv_usage) = kv_usage;
    }

    /// Requests received for `method` and `path` since start (or the last clear).
    pub fn count(&self, method: &str, path: &str) -> usize {
        lock(&self.state.requests)
            .iter()
            .filter(|r| r.method == method && r.path == path)
            .count()
    }

    /// Queues a one-shot behaviour; each request consumes the oldest one.
    pub fn push_script(&self, script: Script) {
        lock(&self.state.scripts).push_back(script);
    }

    /// Scripts not consumed yet.
    pub fn pending_scripts(&self) -> usize {
        lock(&self.state.scripts).len()
    }

    /// Requests whose response has not finished (streams count until their last event).
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// Highest [`in_flight`](Self::in_flight) seen since start (or the last clear).
    pub fn peak_in_flight(&self) -> usize {
        self.state.peak_in_flight.load(Ordering::SeqCst)
    }

    /// Waits (yielding to the test's other tasks) until at least `count`
    /// requests are in flight at once or `timeout` passes; returns whether
    /// they were. Waiting on this rather than sleeping a while keeps a busy
    /// machine's slow start from failing a test.
    pub async fn in_flight_reaches(&self, count: usize, timeout: Duration) -> bool {
        yield_until(timeout, || self.in_flight() >= count).await
    }

    /// Waits (yielding to the test's other tasks) until at least `count`
    /// requests were received or `timeout` passes; returns whether they were.
    pub async fn requests_reach(&self, count: usize, timeout: Duration) -> bool {
        yield_until(timeout, || self.request_count() >= count).await
    }
}

/// Checks `done` every 10 ms, sleeping without blocking the runtime, until
/// it holds (true) or `timeout` passes (false).
async fn yield_until(timeout: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

async fn serve<H, F>(
    listener: std::net::TcpListener,
    name: &str,
    handler: H,
    mut stop: oneshot::Receiver<()>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Result<Response<Body>, ResetConnection>> + Send + 'static,
{
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("mock {name}: cannot listen: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors or similar: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                tokio::spawn(async move {
                    let service = service_fn(handler);
                    // Errors here are resets we asked for or clients going away.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

/// Returned by the service to make hyper drop the connection without a response.
#[derive(Debug)]
struct ResetConnection;

impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset by script")
    }
}

impl std::error::Error for ResetConnection {}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    let in_flight = InFlight::new(Arc::clone(&state));
    let received_at = Instant::now();
    let (parts, body) = req.into_parts();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(ResetConnection),
    };
    let recorded = RecordedRequest {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers,
        body,
        received_at,
    };
    lock(&state.requests).push(recorded.clone());
    let provider = *lock(&state.provider);
    let recorded = match provider.filter(|_| parts.method == Method::POST) {
        Some(p) => match provider::accept(p, &recorded) {
            Ok(plain) => plain,
            Err(message) => {
                return Ok(provider::error(
                    &state,
                    p,
                    StatusCode::BAD_REQUEST,
                    &message,
                ))
            }
        },
        None => recorded,
    };

    let refused = parts.method == Method::POST && !carries_a_key(&state, &recorded);
    let script = lock(&state.scripts).pop_front().unwrap_or_default();
    let chunk_delay_ms = recorded
        .header_u64(HEADER_CHUNK_DELAY_MS)
        .unwrap_or_else(|| state.chunk_delay_ms.load(Ordering::SeqCst));
    let reset = script.reset
        || recorded.header(HEADER_RESET) == Some("1")
        || state.reset.load(Ordering::SeqCst);
    let mut status = recorded
        .header_u64(HEADER_STATUS)
        .and_then(|s| u16::try_from(s).ok())
        .or(script.status)
        .or(*lock(&state.status));
    if provider.is_some() && parts.method != Method::POST {
        // A provider's scripted failure is of its model calls, not of the
        // probes that read its health.
        status = None;
    }
    if refused {
        status = Some(401);
    }
    if let Some(fail_first) = recorded.header_u64(HEADER_FAIL_FIRST) {
        let key = recorded
            .header("idempotency-key")
            .unwrap_or_default()
            .to_string();
        let mut attempts = lock(&state.attempts);
        let attempt = attempts.entry(key).or_insert(0);
        *attempt += 1;
        if *attempt <= fail_first {
            status = Some(503);
        }
    }
    // Only a call the mock answers is prefilled and cached.
    let cached = match (reset, status) {
        (false, None | Some(..400)) => prompt_cache_lookup(&state, &parts.method, &recorded),
        _ => CacheLookup::default(),
    };
    let delay_ms = recorded
        .header_u64(HEADER_DELAY_MS)
        .or(script.delay_ms)
        .or_else(|| match parts.method {
            Method::POST => state.tail_delay_ms(),
            _ => None,
        })
        .unwrap_or_else(|| state.default_delay_ms.load(Ordering::SeqCst))
        .saturating_add(cached.prefill_ms(&state));

    if delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    if reset {
        return Err(ResetConnection);
    }

    let status = status.and_then(|s| StatusCode::from_u16(s).ok());
    let mut response = match status {
        Some(status) if status.as_u16() >= 400 => match provider {
            Some(p) => {
                // `set_error`'s words, else the mock's own.
                let message = lock(&state.error_code).clone().unwrap_or_else(|| {
                    format!("mock {} scripted status {}", state.name, status.as_u16())
                });
                provider::error(&state, p, status, &message)
            }
            None => scripted_error(&state, &recorded.path, status),
        },
        _ => {
            let mut response = match script.answer {
                Some(Canned::Json(body)) => {
                    with_content_type(Response::new(full(body)), "application/json")
                }
                Some(Canned::Sse(events)) => {
                    sse_response(&state, events, chunk_delay_ms, in_flight)
                }
                Some(Canned::Paced(content_type, pieces)) => {
                    with_content_type(paced(pieces, in_flight), content_type)
                }
                None => route(
                    &state,
                    &parts.method,
                    &recorded,
                    chunk_delay_ms,
                    cached.cached_tokens,
                    in_flight,
                ),
            };
            if let Some(status) = status {
                *response.status_mut() = status;
            }
            response
        }
    };
    if recorded.header(HEADER_CONTENT_ENCODING) == Some("gzip") {
        response = gzip_response(response).await?;
    }
    if let Some(limit) = recorded.header_u64(HEADER_RESET_AFTER_BYTES) {
        response = reset_after(response, limit);
    }
    if let Ok(name) = HeaderValue::from_str(&state.name) {
        response.headers_mut().insert(HEADER_INSTANCE, name);
    }
    if response.status().as_u16() >= 400 {
        for (knob, header) in [
            (HEADER_RETRY_AFTER, "retry-after"),
            (HEADER_SHOULD_RETRY, "x-should-retry"),
        ] {
            let value = recorded.header(knob);
            if let Some(value) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
                response.headers_mut().insert(header, value);
            }
        }
    }
    Ok(response)
}

/// The call carries one of the keys the mock was told to take, where and as
/// its provider reads it (or the mock takes any call).
fn carries_a_key(state: &State, r: &RecordedRequest) -> bool {
    if let Some(ledger) = lock(&state.tokens).clone() {
        let token = r
            .header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "));
        return token.is_some_and(|t| ledger.valid_at(t, Instant::now()));
    }
    let Some(keys) = lock(&state.keys).clone() else {
        return true;
    };
    let is = |v: Option<&str>| v.is_some_and(|v| keys.iter().any(|k| k == v));
    if r.path == messages::PATH {
        is(r.header("x-api-key"))
    } else if gemini::call_of(&r.path).is_some() {
        let query = r.query.as_deref().unwrap_or_default();
        is(r.header("x-goog-api-key")) || query.split('&').any(|p| is(p.strip_prefix("key=")))
    } else {
        is(r.header("authorization")
            .and_then(|v| v.strip_prefix("Bearer ")))
            || is(r.header("api-key"))
    }
}

/// The error a scripted status gets, in the shape of the API the path belongs to.
fn scripted_error(state: &State, path: &str, status: StatusCode) -> Response<Body> {
    let message = format!("mock {} scripted status {}", state.name, status.as_u16());
    match path {
        messages::PATH => messages::error_response(state, status, &message),
        _ if gemini::call_of(path).is_some() => gemini::error_response(status, &message),
        _ => {
            let code = lock(&state.error_code).clone();
            error_response(status, &message, code.as_deref().unwrap_or("mock_status"))
        }
    }
}

/// Dispatches on method and path; `in_flight` moves into streaming bodies.
fn route(
    state: &State,
    method: &Method,
    req: &RecordedRequest,
    chunk_delay_ms: u64,
    cached_tokens: u64,
    in_flight: InFlight,
) -> Response<Body> {
    let path = match req.path.as_str() {
        p if azure_chat(p) => "/v1/chat/completions",
        p => p,
    };
    match (method, path) {
        (&Method::GET, "/health") => text_response(StatusCode::OK, "ok"),
        (&Method::GET, "/v1/models") => json_response(StatusCode::OK, &models(state)),
        (&Method::GET, "/metrics") => metrics_response(state),
        (
            &Method::POST,
            "/v1/chat/completions" | BEDROCK_CHAT_PATH | "/v1/completions" | "/v1/embeddings",
        ) => {
            let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "request body is not valid JSON",
                    "invalid_json",
                );
            };
            let answer = Answer::new(state, &body, cached_tokens);
            match path {
                "/v1/embeddings" => json_response(StatusCode::OK, &answer.embeddings(&body)),
                "/v1/completions" if answer.stream => {
                    let events = answer.completion_events();
                    stream(state, req, events, chunk_delay_ms, in_flight)
                }
                "/v1/completions" => json_response(StatusCode::OK, &answer.completion()),
                _ if answer.stream => {
                    stream(state, req, answer.chat_events(), chunk_delay_ms, in_flight)
                }
                _ => json_response(StatusCode::OK, &answer.chat()),
            }
        }
        (&Method::POST, responses::PATH) => {
            responses::answer(state, req, chunk_delay_ms, in_flight)
        }
        (&Method::POST, messages::PATH) => messages::answer(state, req, chunk_delay_ms, in_flight),
        (&Method::POST, path) if gemini::call_of(path).is_some() => {
            gemini::answer(state, req, cached_tokens, chunk_delay_ms, in_flight)
        }
        (&Method::POST, path) if guardrail::serves(path) => guardrail::answer(req),
        _ => error_response(
            StatusCode::NOT_FOUND,
            &format!("unknown endpoint {} {}", req.method, req.path),
            "unknown_url",
        ),
    }
}

/// A streamed answer of `events` (one SSE event each, the last one ending the
/// stream), misbehaving as [`HEADER_SSE`] asks. `unknown` is the dialects' own
/// business (they build their events with it), so here it streams as usual.
fn stream(
    state: &State,
    req: &RecordedRequest,
    mut events: Vec<String>,
    chunk_delay_ms: u64,
    in_flight: InFlight,
) -> Response<Body> {
    match req.header(HEADER_SSE) {
        Some("invalid") => sse_frames(invalid_sse(), chunk_delay_ms, false, in_flight),
        Some("endless") => {
            events.pop();
            let frames = events.into_iter().map(Bytes::from).collect();
            sse_frames(frames, chunk_delay_ms, true, in_flight)
        }
        _ => sse_response(state, events, chunk_delay_ms, in_flight),
    }
}

/// One named SSE event of a dialect (Responses, Messages): `event: <type>` and
/// its data with `type` first, then `lead`, then the other fields of `event`,
/// the order the providers write them in.
fn named_event(event: &Value, lead: &[(&str, Value)]) -> String {
    let name = event
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut data = format!("{{\"type\":{}", Value::from(name));
    let fields = lead.iter().map(|(k, v)| (*k, v)).chain(
        event
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| *k != "type" && lead.iter().all(|(l, _)| l != k))
            .map(|(k, v)| (k.as_str(), v)),
    );
    for (key, value) in fields {
        data.push_str(&format!(",{}:{value}", Value::from(key)));
    }
    format!("event: {name}\ndata: {data}}}\n\n")
}

/// The answer's text: the last user text and the instance that answered.
fn echo(state: &State, last_user_text: &str) -> String {
    format!("echo: {last_user_text} [{}]", state.name)
}

/// The answer text cut into a few deltas, each word keeping its trailing space.
fn pieces(text: &str) -> Vec<String> {
    text.split_inclusive(' ').map(str::to_string).collect()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Rough, deterministic token count: whitespace-separated words, at least 1.
fn count_tokens(text: &str) -> u64 {
    (text.split_whitespace().count() as u64).max(1)
}

/// Text of an OpenAI message `content`: a string or an array of parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Strings of a prompt or embeddings `input`: a string or an array of strings.
fn input_texts(input: Option<&Value>) -> Vec<String> {
    match input {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        Some(other) => vec![other.to_string()],
        None => vec![String::new()],
    }
}

/// A chat or completions prompt as one text (every message's content, in
/// order), and the text of its last user turn.
fn prompt_of(body: &Value) -> (String, String) {
    match body.get("messages").and_then(Value::as_array) {
        Some(messages) => {
            let texts: Vec<String> = messages
                .iter()
                .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
                .collect();
            let last_user = messages
                .iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
                .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
                .unwrap_or_default();
            (texts.join(" "), last_user)
        }
        None => {
            let prompt = input_texts(body.get("prompt")).join(" ");
            (prompt.clone(), prompt)
        }
    }
}

/// What the played prompt cache held of one call's prompt.
#[derive(Debug, Clone, Copy, Default)]
struct CacheLookup {
    prompt_tokens: u64,
    cached_tokens: u64,
}

impl CacheLookup {
    /// The prefill of the tokens the cache did not hold.
    fn prefill_ms(&self, state: &State) -> u64 {
        let us = state.prefill_us_per_token.load(Ordering::SeqCst);
        self.prompt_tokens
            .saturating_sub(self.cached_tokens)
            .saturating_mul(us)
            / 1000
    }
}

/// Looks a chat or completions call's prompt up in the played prompt cache
/// (when on) and remembers it: the tokens of the longest prompt seen in the
/// last [`PROMPT_CACHE_TTL`] that this one starts with count as cached.
/// Done when the call arrives, so its prefill can delay the answer.
fn prompt_cache_lookup(state: &State, method: &Method, req: &RecordedRequest) -> CacheLookup {
    let chat = matches!(
        req.path.as_str(),
        "/v1/chat/completions" | "/v1/completions"
    );
    let gemini = gemini::call_of(&req.path).is_some();
    let mut cache = lock(&state.prompt_cache);
    let (Some(seen), true, true) = (cache.as_mut(), chat || gemini, method == Method::POST) else {
        return CacheLookup::default();
    };
    let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
        return CacheLookup::default();
    };
    let prompt = if gemini {
        gemini::prompt_text(&body)
    } else {
        prompt_of(&body).0
    };
    let now = Instant::now();
    seen.retain(|(at, _)| now.saturating_duration_since(*at) < PROMPT_CACHE_TTL);
    let cached_tokens = seen
        .iter()
        .filter(|(_, p)| prompt.starts_with(p.as_str()))
        .map(|(_, p)| count_tokens(p))
        .max()
        .unwrap_or(0);
    if seen.len() >= PROMPT_CACHE_ENTRIES {
        seen.pop_front();
    }
    let prompt_tokens = count_tokens(&prompt);
    seen.push_back((now, prompt));
    CacheLookup {
        prompt_tokens,
        cached_tokens,
    }
}

/// Everything a completion answer is derived from, computed once per request.
struct Answer {
    id: String,
    model: String,
    created: u64,
    stream: bool,
    include_usage: bool,
    prompt: String,
    text: String,
    /// Factor on the prompt tokens reported.
    prompt_token_scale: Option<f64>,
    /// Prompt tokens the played prompt cache held.
    cached_tokens: u64,
    /// The usage to report in place of the counted one.
    reported: Option<Value>,
}

impl Answer {
    fn new(state: &State, body: &Value, cached_tokens: u64) -> Self {
        let sequence = state.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string();
        let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
        let include_usage = body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let (prompt, last) = prompt_of(body);
        let mut text = echo(state, &last);
        if let Some(n) = *lock(&state.answer_words) {
            let words: Vec<&str> = text
                .split_whitespace()
                .chain(std::iter::repeat("word"))
                .take(n.max(1))
                .collect();
            text = words.join(" ");
        }
        Self {
            id: format!("{}-{sequence}", state.name),
            model,
            created: unix_now(),
            stream,
            include_usage,
            text,
            prompt,
            prompt_token_scale: *lock(&state.prompt_token_scale),
            cached_tokens,
            reported: lock(&state.reported_usage).clone(),
        }
    }

    fn usage(&self) -> Value {
        if let Some(usage) = &self.reported {
            return usage.clone();
        }
        let mut prompt_tokens = count_tokens(&self.prompt);
        if let Some(scale) = self.prompt_token_scale {
            prompt_tokens = (prompt_tokens as f64 * scale).ceil() as u64;
        }
        let completion_tokens = count_tokens(&self.text);
        let mut usage = json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        });
        if let (true, Some(u)) = (self.cached_tokens > 0, usage.as_object_mut()) {
            u.insert(
                "prompt_tokens_details".to_string(),
                json!({"cached_tokens": self.cached_tokens}),
            );
        }
        usage
    }

    fn chat(&self) -> Value {
        json!({
            "id": format!("chatcmpl-{}", self.id),
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": self.text},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": self.usage(),
        })
    }

    fn chat_chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        let mut chunk = json!({
            "id": format!("chatcmpl-{}", self.id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        });
        if self.include_usage {
            if let Some(c) = chunk.as_object_mut() {
                c.insert("usage".to_string(), Value::Null);
            }
        }
        chunk
    }

    fn chat_events(&self) -> Vec<String> {
        let mut events = vec![self.chat_chunk(json!({"role": "assistant", "content": ""}), None)];
        for piece in pieces(&self.text) {
            events.push(self.chat_chunk(json!({"content": piece}), None));
        }
        events.push(self.chat_chunk(json!({}), Some("stop")));
        if self.include_usage {
            events.push(json!({
                "id": format!("chatcmpl-{}", self.id),
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(),
            }));
        }
        sse_data(events)
    }

    fn completion(&self) -> Value {
        json!({
            "id": format!("cmpl-{}", self.id),
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "text": self.text,
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": self.usage(),
        })
    }

    fn completion_chunk(&self, text: &str, finish_reason: Option<&str>) -> Value {
        let mut chunk = json!({
            "id": format!("cmpl-{}", self.id),
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        });
        if self.include_usage {
            if let Some(c) = chunk.as_object_mut() {
                c.insert("usage".to_string(), Value::Null);
            }
        }
        chunk
    }

    fn completion_events(&self) -> Vec<String> {
        let mut events: Vec<Value> = pieces(&self.text)
            .iter()
            .map(|piece| self.completion_chunk(piece, None))
            .collect();
        events.push(self.completion_chunk("", Some("stop")));
        if self.include_usage {
            events.push(json!({
                "id": format!("cmpl-{}", self.id),
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(),
            }));
        }
        sse_data(events)
    }

    fn embeddings(&self, body: &Value) -> Value {
        let inputs = input_texts(body.get("input"));
        let prompt_tokens: u64 = inputs.iter().map(|i| count_tokens(i)).sum();
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(index, input)| {
                json!({
                    "object": "embedding",
                    "index": index,
                    "embedding": embedding(input),
                })
            })
            .collect();
        json!({
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        })
    }
}

/// SSE `data:` events for each JSON chunk, then the `[DONE]` sentinel.
fn sse_data(chunks: Vec<Value>) -> Vec<String> {
    chunks
        .into_iter()
        .map(|c| format!("data: {c}\n\n"))
        .chain(std::iter::once("data: [DONE]\n\n".to_string()))
        .collect()
}

/// A deterministic embedding that means something: a normalised bag of the
/// text's lowercase words, each hashed (FNV-1a) to one of
/// [`EMBEDDING_DIMENSIONS`] dimensions with a sign. The same words in any
/// order or case give the same vector (similarity 1); questions sharing no
/// word are nearly orthogonal. Text without a word is a fixed unit vector.
pub fn embedding(text: &str) -> Vec<f64> {
    let mut v = vec![0.0f64; EMBEDDING_DIMENSIONS];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in word.to_lowercase().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
        if let Some(x) = v.get_mut((hash % EMBEDDING_DIMENSIONS as u64) as usize) {
            *x += sign;
        }
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm == 0.0 {
        if let Some(x) = v.first_mut() {
            *x = 1.0;
        }
        return v;
    }
    // Rounded so the JSON stays short.
    v.iter().map(|x| (x / norm * 1e6).round() / 1e6).collect()
}

fn models(state: &State) -> Value {
    let data: Vec<Value> = ["gpt-4o", "gpt-4o-mini", "text-embedding-3-small"]
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": state.name}))
        .collect();
    json!({"object": "list", "data": data})
}

/// Prometheus text as a vLLM server exports it, with the load set by
/// [`MockUpstream::set_load`].
fn metrics_response(state: &State) -> Response<Body> {
    let waiting = *lock(&state.waiting);
    let kv_usage = *lock(&state.kv_usage);
    let name = &state.name;
    let text = format!(
        "# HELP vllm:num_requests_running Number of requests currently running.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"{name}\"}} 1.0\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"{name}\"}} {waiting:?}\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{model_name=\"{name}\"}} {kv_usage:?}\n"
    );
    let mut response = Response::new(full(text));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn with_content_type(mut response: Response<Body>, content_type: &'static str) -> Response<Body> {
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text_response(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    with_content_type(response, "text/plain")
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    with_content_type(response, "application/json")
}

/// The OpenAI error type SDKs expect for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 404 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        _ => "server_error",
    }
}

fn error_response(status: StatusCode, message: &str, code: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": error_type(status), "code": code}}),
    )
}

/// Streams `events` one frame each, `chunk_delay_ms` apart, each flushed on its own.
/// Streamed bodies [`MockUpstream::sent_streams`] keeps.
pub const MAX_STREAMS_KEPT: usize = 64;

fn sse_response(
    state: &State,
    events: Vec<String>,
    chunk_delay_ms: u64,
    in_flight: InFlight,
) -> Response<Body> {
    let mut streams = lock(&state.streams);
    if streams.len() >= MAX_STREAMS_KEPT {
        streams.pop_front();
    }
    streams.push_back(events.concat().into_bytes());
    drop(streams);
    let frames = events.into_iter().map(Bytes::from).collect();
    sse_frames(frames, chunk_delay_ms, false, in_flight)
}

/// A body in `pieces`, each sent after its delay (ms).
fn paced(pieces: Vec<(u64, String)>, in_flight: InFlight) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, BodyError>>(1);
    tokio::spawn(async move {
        let _in_flight = in_flight;
        for (delay_ms, piece) in pieces {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            if tx.send(Ok(Frame::data(Bytes::from(piece)))).await.is_err() {
                return; // client went away
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    Response::new(StreamBody::new(stream).boxed())
}

/// Streams `frames` like [`sse_response`]; when `endless`, the stream then
/// stays open without another byte until the other side goes away.
fn sse_frames(
    frames: Vec<Bytes>,
    chunk_delay_ms: u64,
    endless: bool,
    in_flight: InFlight,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, BodyError>>(1);
    tokio::spawn(async move {
        let _in_flight = in_flight;
        for (i, frame) in frames.into_iter().enumerate() {
            if i > 0 && chunk_delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(chunk_delay_ms)).await;
            }
            if tx.send(Ok(Frame::data(frame))).await.is_err() {
                return; // client went away
            }
        }
        if endless {
            tx.closed().await;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    let mut response = Response::new(StreamBody::new(stream).boxed());
    response
        .headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    with_content_type(response, "text/event-stream")
}

/// A malformed event stream: a JSON chunk cut in two, data that is not JSON,
/// an event without data, a comment, bytes that are not UTF-8, an enormous
/// line, data after `[DONE]`, and a last line that never ends.
fn invalid_sse() -> Vec<Bytes> {
    let huge = format!("data: {}\n\n", "x".repeat(64 * 1024));
    vec![
        Bytes::from_static(
            b"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,",
        ),
        Bytes::from_static(b"\"delta\":{\"content\":\"half\"}}]}\n\n"),
        Bytes::from_static(b"data: {broken json\n\n"),
        Bytes::from_static(b"event: ping\n\n"),
        Bytes::from_static(b": a comment\r\n\r\n"),
        Bytes::from_static(b"data: \xff\xfe\x00 not utf-8\n\n"),
        Bytes::from(huge),
        Bytes::from_static(b"data: {\"usage\":\"not an object\"}\n\n"),
        Bytes::from_static(b"data: [DONE]\n\n"),
        Bytes::from_static(b"data: {\"after\":\"done\"}\n\n"),
        Bytes::from_static(b"data: no end"),
    ]
}

/// The response with its whole body gzip-compressed (`content-encoding: gzip`).
async fn gzip_response(response: Response<Body>) -> Result<Response<Body>, ResetConnection> {
    let (mut parts, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|_| ResetConnection)?
        .to_bytes();
    let compressed = gzip_stored(&bytes);
    parts
        .headers
        .insert("content-encoding", HeaderValue::from_static("gzip"));
    parts.headers.insert(
        hyper::header::CONTENT_LENGTH,
        HeaderValue::from(compressed.len()),
    );
    Ok(Response::from_parts(parts, full(compressed)))
}

/// The response whose body stops with an error (hyper drops the connection)
/// once `limit` bytes went out; a JSON answer keeps declaring its whole length.
fn reset_after(response: Response<Body>, limit: u64) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    if let Some(length) = hyper::body::Body::size_hint(&body).exact() {
        parts
            .headers
            .insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    let frames = http_body_util::BodyStream::new(body);
    let stream = futures_util::stream::unfold(
        (frames, limit, false),
        |(mut frames, left, done)| async move {
            use futures_util::StreamExt;
            if done {
                return None;
            }
            let cut = || -> Result<Frame<Bytes>, BodyError> { Err("reset by script".into()) };
            if left == 0 {
                return Some((cut(), (frames, 0, true)));
            }
            match frames.next().await {
                None => Some((cut(), (frames, 0, true))),
                Some(Err(e)) => Some((Err(e), (frames, 0, true))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let n = (data.len() as u64).min(left);
                        let piece = data.slice(..n as usize);
                        Some((Ok(Frame::data(piece)), (frames, left - n, false)))
                    }
                    Err(frame) => Some((Ok(frame), (frames, left, false))),
                },
            }
        },
    );
    Response::from_parts(parts, StreamBody::new(stream).boxed())
}

/// A gzip member holding `data` in stored (uncompressed) deflate blocks: a
/// valid `content-encoding: gzip` body without a compression library.
pub fn gzip_stored(data: &[u8]) -> Vec<u8> {
    const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut out = HEADER.to_vec();
    let mut blocks = data.chunks(0xffff).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        out.push(u8::from(blocks.peek().is_none()));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// Reads back what [`gzip_stored`] wrote (`None` for anything else).
pub fn gunzip_stored(gz: &[u8]) -> Option<Vec<u8>> {
    let mut rest = gz.strip_prefix(&[0x1f, 0x8b, 8, 0][..])?.get(6..)?;
    let mut out = Vec::new();
    loop {
        let (&last, tail) = rest.split_first()?;
        let len = usize::from(u16::from_le_bytes([*tail.first()?, *tail.get(1)?]));
        out.extend_from_slice(tail.get(4..4 + len)?);
        rest = tail.get(4 + len..)?;
        if last & 1 == 1 {
            break;
        }
    }
    let crc = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
    (crc == crc32(&out)).then_some(out)
}

/// CRC-32 (IEEE), bit by bit: test bodies are small.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648() {
        // RFC 4648's test vectors, then every byte value.
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded);
            assert_eq!(from_base64(coded).as_deref(), Some(plain.as_bytes()));
        }
        let all: Vec<u8> = (0..=255).collect();
        assert!(base64(&all).starts_with("AAECAwQFBgcICQoL"));
        assert!(base64(&all).ends_with("8PHy8/T19vf4+fr7/P3+/w=="));
        assert_eq!(from_base64(&base64(&all)), Some(all));
        assert_eq!(from_base64("Zm9v!"), None);
    }

    fn cosine(a: &str, b: &str) -> f64 {
        embedding(a)
            .iter()
            .zip(embedding(b))
            .map(|(x, y)| x * y)
            .sum()
    }

    #[test]
    fn embeddings_mean_the_words() {
        let q = "What is the capital of France?";
        assert_eq!(embedding(q).len(), EMBEDDING_DIMENSIONS);
        assert!((cosine(q, q) - 1.0).abs() < 1e-5);
        assert!(cosine(q, "france: THE capital of, what is") > 0.9999);
        assert!(cosine(q, "How do I bake sourdough bread") < 0.3);
        assert!(cosine("", "") > 0.999);
    }

    #[test]
    fn gzip_round_trips_and_matches_the_known_crc() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        for len in [0, 1, 1000, 0xffff, 0x1_0001, 200_000] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            assert_eq!(gunzip_stored(&gzip_stored(&data)), Some(data), "{len}");
        }
    }

    #[test]
    fn the_tail_is_seeded_and_about_as_likely_as_asked() {
        let tail = TailLatency {
            probability: 0.1,
            min_ms: 4000,
            max_ms: 6000,
            seed: 7,
        };
        let delays: Vec<Option<u64>> = (0..10_000).map(|n| tail.delay_ms(n)).collect();
        let again: Vec<Option<u64>> = (0..10_000).map(|n| tail.delay_ms(n)).collect();
        assert_eq!(delays, again);
        let slow: Vec<u64> = delays.iter().flatten().copied().collect();
        assert!((900..1100).contains(&slow.len()), "{}", slow.len());
        assert!(slow.iter().all(|d| (4000..=6000).contains(d)));
        assert!(slow.iter().any(|d| *d < 4500) && slow.iter().any(|d| *d > 5500));
        let other = TailLatency { seed: 8, ..tail };
        assert_ne!(
            delays,
            (0..10_000).map(|n| other.delay_ms(n)).collect::<Vec<_>>()
        );
    }

    /// Asks `mock` a chat call: (milliseconds it took, cached tokens reported).
    async fn ask(mock: &MockUpstream, content: &str, headers: &[(&str, &str)]) -> (u128, u64) {
        let mut request = crate::http_client()
            .post(format!(
                "http://127.0.0.1:{}/v1/chat/completions",
                mock.port()
            ))
            .json(&crate::chat_body("m", content));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let started = Instant::now();
        let response = request.send().await.unwrap();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let cached = body
            .pointer("/usage/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        (started.elapsed().as_millis(), cached)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_warm_prefix_skips_its_prefill_and_a_failed_call_warms_nothing() {
        let (a, b) = (MockUpstream::backend("a", 0), MockUpstream::backend("b", 0));
        for m in [&a, &b] {
            m.set_prompt_cache(true);
            m.set_prefill_us_per_token(1000);
        }
        let long = vec!["word"; 300].join(" ");
        // A failed call is neither prefilled nor remembered.
        let (ms, cached) = ask(&a, &long, &[(HEADER_STATUS, "503")]).await;
        assert_eq!(cached, 0);
        assert!(ms < 250, "{ms} ms");
        let (cold_ms, cached) = ask(&a, &long, &[]).await;
        assert_eq!(cached, 0);
        assert!(cold_ms >= 300, "cold {cold_ms} ms");
        // The next turn starts with the last: its 300 tokens are cached, and
        // only the new ones prefilled.
        let (warm_ms, cached) = ask(&a, &format!("{long} and more"), &[]).await;
        assert_eq!(cached, 300);
        assert!(warm_ms < 200, "warm {warm_ms} ms");
        // Another backend never saw it.
        let (other_ms, cached) = ask(&b, &format!("{long} and more"), &[]).await;
        assert_eq!(cached, 0);
        assert!(other_ms >= 300, "other {other_ms} ms");
        // No prefill cost: as fast as before, the hit still reported.
        a.set_prefill_us_per_token(0);
        let (ms, cached) = ask(&a, &format!("{long} again"), &[]).await;
        assert_eq!(cached, 300);
        assert!(ms < 200, "{ms} ms");
    }

    #[test]
    fn a_tail_of_zero_or_one_is_never_or_always() {
        let never = TailLatency {
            probability: 0.0,
            min_ms: 1,
            max_ms: 1,
            seed: 0,
        };
        assert!((0..1000).all(|n| never.delay_ms(n).is_none()));
        let always = TailLatency {
            probability: 1.0,
            ..never
        };
        assert!((0..1000).all(|n| always.delay_ms(n) == Some(1)));
        let inverted = TailLatency {
            min_ms: 5,
            max_ms: 2,
            ..always
        };
        assert_eq!(inverted.delay_ms(0), Some(5));
    }
}
