//! Measures what the filter costs on the data path: wrk drives an Envoy under test
//! (one worker) that proxies to a backend Envoy answering a fixed answer of the
//! call's API itself (a chat completion, a Responses `response`, a Messages
//! `message` or its stream), so the backend is never the bottleneck. Each scenario runs on a fresh
//! Envoy and is compared with two baselines: plain Envoy, and Envoy with a
//! no-op proxy-wasm filter (the Wasm floor, `tests/noop`). Every scenario runs
//! once per round, rounds interleaved, and the table gives the median of the
//! rounds. A last part times the first byte of streamed calls through a mock
//! that streams.
// A tool of the test suite: a step that cannot run (a mock, Envoy, a client
// that does not start) ends the run, and `expect` says why. Indexing and
// `panic!` stay denied: malformed output is reported, not trapped on.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::panic, clippy::indexing_slicing))]

use std::collections::{btree_map, BTreeMap};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use llm_filter_core::metrics::{BENCH_CALLBACK_NS, BENCH_HOSTCALLS, BENCH_HOSTCALL_NS};
use llm_filter_e2e::{
    chat_body, chat_stream_body, cli, conversation_body, messages_body, noop_wasm_path, post_json,
    responses_body, sidecar_wasm_path, with_field, Envoy, EnvoyBuilder, HttpResponse, MockConfig,
    MockUpstream, SseParser, SHAPING_AB,
};
use serde_json::{json, Value};

const USAGE: &str = "usage: bench [--duration SECS] [--warmup SECS] [--rounds N] [--threads N] \
                     [--connections N] [--ttfb-calls N] [--hostcalls N] [--only NAME]...";

/// Envoy with the no-op module in the filter's place (its configuration is ignored).
fn noop_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .wasm_path(noop_wasm_path())
        .plugin_config("{}")
        .concurrency(1)
        .upstream("backend", port)
}

/// The no-op module holding each request's body and reading it once, as the
/// filter does for an LLM call.
fn noop_hold_body_envoy(port: u16) -> EnvoyBuilder {
    noop_envoy(port).plugin_config(r#"{"hold_body":true}"#)
}

fn noop_tagging_calls_envoy(port: u16) -> EnvoyBuilder {
    noop_envoy(port).plugin_config(r#"{"replay_tagging":true}"#)
}

fn plain_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .no_filter()
        .concurrency(1)
        .upstream("backend", port)
}

fn filter_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .plugin_config("{}")
        .concurrency(1)
        .upstream("backend", port)
}

/// The filter with the cache and budgets off: it classifies, tags and counts.
fn tagging_only_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .plugin_config(r#"{"cache":{"enabled":false},"budget":{"enabled":false}}"#)
        .concurrency(1)
        .upstream("backend", port)
}

/// The sidecar build of the module (`make build`) tagging only: what an app
/// pod's sidecar pays per LLM call. The build has no cache to turn off (it
/// refuses a configuration that names one).
fn sidecar_tagging_only_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .wasm_path(sidecar_wasm_path())
        .plugin_config(r#"{"budget":{"enabled":false}}"#)
        .concurrency(1)
        .upstream("backend", port)
}

/// [`tagging_only_envoy`] exporting every call's span (new roots, all
/// sampled) to the backend's cluster, in batches large and frequent enough
/// that none is dropped at the bench's rate.
fn tagging_spans_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .plugin_config(
            r#"{"cache":{"enabled":false},"budget":{"enabled":false},
              "tracing":{"otlp":{"cluster":"backend","interval_ms":100,"batch_size":2048,"max_queue":16384}}}"#,
        )
        .concurrency(1)
        .upstream("backend", port)
}

/// The filter with `{}` and the model routed over two clusters that are
/// both the backend (no probes during a run).
fn routed_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .plugin_config(
            r#"{"routing":{"models":{"gpt-4o":[{"cluster":"backend-a"},{"cluster":"backend-b"}]},
                "probe_interval_s":3600}}"#,
        )
        .concurrency(1)
        .upstream("backend", port)
        .upstream("backend-a", port)
        .upstream("backend-b", port)
        .header_route("x-llm-cluster")
}

/// [`routed_envoy`] for a Messages model whose two backends are plain
/// (`providers` false) or declared as providers (`anthropic`, `vllm`): each
/// call then weighs only backends that speak Messages, and goes on the
/// provider's path with its version header.
fn messages_routed_envoy(port: u16, providers: bool) -> EnvoyBuilder {
    let declared = if providers {
        [r#","provider":"anthropic""#, r#","provider":"vllm""#]
    } else {
        ["", ""]
    };
    EnvoyBuilder::new()
        .plugin_config(format!(
            r#"{{"routing":{{"models":{{"claude-sonnet-4-5":[{{"cluster":"backend-a"{}}},{{"cluster":"backend-b"{}}}]}},
                "probe_interval_s":3600}}}}"#,
            declared[0], declared[1]
        ))
        .concurrency(1)
        .upstream("backend", port)
        .upstream("backend-a", port)
        .upstream("backend-b", port)
        .header_route("x-llm-cluster")
}

/// The filter with `{}` plus a limit per tenant: a rule of tokens a minute
/// and cost a day on the priced model, limits far above what a run spends
/// so every call passes, each reserving before it goes and settling after.
fn limits_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .plugin_config(
            r#"{"limits":{
                "prices":{"gpt-4o":{"input":2.5,"cached_input":1.25,"output":10}},
                "rules":[{"name":"team","by":["tenant"],"models":["gpt-4o"],
                          "tokens_per_minute":1000000000000,"cost_per_day":1000000000}]}}"#,
        )
        .concurrency(1)
        .upstream("backend", port)
}

/// `{}` with the tenant from a virtual key (the digest of
/// `vk-bench-key-0123456789`).
const VIRTUAL_KEY: &str = r#"{"tenant":{"from":"virtual_key","keys":{"bench":
    "d89a9c5280394ce8e2969ad9a3e2635d0dc206c89df2f0e1efa2ad94e7dcc5a3"}}}"#;

/// The two baselines every scenario is compared with.
const PLAIN: &str = "plain";
const NOOP: &str = "noop-wasm";

/// One measured setup: how to build the Envoy under test and what each request carries.
struct Scenario {
    /// Short name, shown in the table and selected by `--only`.
    name: &'static str,
    /// The Envoy under test, given the port of the scenario's backend
    /// ([`Scenario::backend`]).
    envoy: fn(u16) -> EnvoyBuilder,
    /// The path; `/v1/responses` and `/v1/messages` are answered by a backend
    /// of their API, every other path by the chat one.
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    /// The request body; each request replaces [`UNIQUE`] in it with a
    /// number no other request of the run gets.
    body: String,
    /// The `x-cache` every measured request must get (checked on a second
    /// call after the first, which warms the cache).
    expect_cache: Option<&'static str>,
}

/// Marks where a body carries a number of its own per request.
const UNIQUE: &str = "@unique@";

/// The header that opts a Responses or Messages call into the cache whatever
/// its sampling (the current SDKs send no temperature), for an hour.
const OPT_IN: (&str, &str) = ("cache-control", "max-age=3600");

impl Scenario {
    /// The backend that answers this scenario's calls: its API's, as the call
    /// is delivered.
    fn backend(&self) -> Backend {
        match (self.path, self.streamed()) {
            ("/v1/responses", _) => Backend::Responses,
            ("/v1/messages", false) => Backend::Messages,
            ("/v1/messages", true) => Backend::MessagesStream,
            _ => Backend::Chat,
        }
    }

    /// Whether the body asks for a stream.
    fn streamed(&self) -> bool {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|body| body.get("stream")?.as_bool())
            == Some(true)
    }

    /// The body of one request, [`UNIQUE`] replaced by `n`.
    fn request_body(&self, n: &str) -> Result<Value> {
        Ok(serde_json::from_str(&self.body.replace(UNIQUE, n))?)
    }
}

fn scenarios() -> Vec<Scenario> {
    let chat = chat_body("gpt-4o", "Say hello in one short sentence.").to_string();
    // Temperature 0: deterministic, so cacheable.
    let deterministic = with_field(
        chat_body("gpt-4o", "Say hello in one short sentence."),
        "temperature",
        json!(0),
    );
    let unique_deterministic = with_field(
        chat_body(
            "gpt-4o",
            &format!("Say hello in one short sentence. {UNIQUE}"),
        ),
        "temperature",
        json!(0),
    );
    let semantic_unique_context = with_field(
        deterministic.clone(),
        "messages",
        json!([
            {"role": "system", "content": format!("You are assistant {UNIQUE}.")},
            {"role": "user", "content": "Say hello in one short sentence."},
        ]),
    );
    let streamed = with_field(deterministic.clone(), "stream", json!(true));
    // Responses and Messages calls as their current SDKs send them: no
    // temperature, cached by the caller's opt-in ([`OPT_IN`]).
    let unique_responses = responses_body(
        "gpt-4o",
        &format!("Say hello in one short sentence. {UNIQUE}"),
    );
    let claude = "claude-sonnet-4-5";
    let messages = messages_body(claude, "Say hello in one short sentence.");
    let unique_messages = messages_body(
        claude,
        &format!("Say hello in one short sentence. {UNIQUE}"),
    );
    let unique_messages_stream = with_field(unique_messages.clone(), "stream", json!(true));
    let history = conversation_body("gpt-4o", 5, "Say hello in one short sentence.").to_string();
    // The 5-turn history with a system prompt of its own per request: a
    // conversation of its own, so its affinity key too.
    let mut routed_history = conversation_body("gpt-4o", 5, "Say hello in one short sentence.");
    if let Some(system) = routed_history.pointer_mut("/messages/0/content") {
        *system = json!(format!(
            "You are the concise assistant of conversation {UNIQUE}."
        ));
    }
    // A Messages conversation of six turns under 4 KiB of instructions, a
    // conversation of its own per request: what the prompt-cache markers
    // are put on (`filter-messages-markers`) or not.
    let mut said =
        vec![json!({"role": "user", "content": format!("Conversation {UNIQUE}: hello.")})];
    for t in 0..5 {
        said.push(json!({"role": "assistant", "content": [{"type": "text", "text": format!("Answer {t}.")}]}));
        said.push(json!({"role": "user", "content": format!("Question {t}?")}));
    }
    let conversation = json!({"model": claude, "max_tokens": 64, "messages": said,
        "system": "Answer questions about the platform precisely. ".repeat(88)})
    .to_string();
    let filter = filter_envoy;
    vec![
        Scenario {
            name: PLAIN,
            envoy: plain_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // The Wasm floor: the host's own per-stream cost, nothing of ours.
            name: NOOP,
            envoy: noop_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // The floor of a filter that reads bodies: Envoy buffers the body
            // and the VM gets one copy of it.
            name: "noop-wasm-hold-body",
            envoy: noop_hold_body_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // The floor of the tagging features themselves: the host calls a
            // tagging-only call makes, made by the no-op module with no logic.
            name: "noop-wasm-tagging-calls",
            envoy: noop_tagging_calls_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // Traffic that is not an LLM call: what every other request of a
            // mesh pays for the filter being there.
            name: "filter-non-llm",
            envoy: filter,
            path: "/v1/other",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            name: "filter-tagging-only",
            envoy: tagging_only_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // The same on the sidecar build, which leaves the gateway tier's
            // features out.
            name: "filter-sidecar-tagging-only",
            envoy: sidecar_tagging_only_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // Tagging only, plus a span per call exported over OTLP/HTTP (to
            // the backend, which answers 200): what span export costs.
            name: "filter-tagging-spans",
            envoy: tagging_spans_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // The tagging-only filter on the shaping scenarios' longer body
            // (5 earlier turns): what they are compared with.
            name: "filter-tagging-only-history",
            envoy: tagging_only_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: history.clone(),
            expect_cache: None,
        },
        Scenario {
            // Tagging only, plus shaping: the body is held, parsed, trimmed
            // to 2 turns, capped, re-parsed and replaced.
            name: "filter-shaping",
            envoy: |port| {
                EnvoyBuilder::new()
                    .plugin_config(
                        r#"{"cache":{"enabled":false},"budget":{"enabled":false},
                            "shaping":{"max_tokens_cap":256,"max_history_turns":2}}"#,
                    )
                    .concurrency(1)
                    .upstream("backend", port)
            },
            path: "/v1/chat/completions",
            headers: vec![],
            body: history.clone(),
            expect_cache: None,
        },
        Scenario {
            // Tagging only, plus two A/B groups picked by `x-user-id`: no
            // body is held, the group is hashed and written upstream.
            name: "filter-ab",
            envoy: |port| {
                EnvoyBuilder::new()
                    .plugin_config(
                        r#"{"cache":{"enabled":false},"budget":{"enabled":false},
                            "ab":{"groups":[{"name":"control","percent":50},{"name":"b","percent":50}]}}"#,
                    )
                    .concurrency(1)
                    .upstream("backend", port)
            },
            path: "/v1/chat/completions",
            headers: vec![("x-user-id", "user-12345")],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // Both: A/B groups with a per-group cap, and shaping.
            name: "filter-shaping-ab",
            envoy: |port| {
                EnvoyBuilder::new()
                    .plugin_config(SHAPING_AB)
                    .concurrency(1)
                    .upstream("backend", port)
            },
            path: "/v1/chat/completions",
            headers: vec![("x-user-id", "user-12345")],
            body: history,
            expect_cache: None,
        },
        Scenario {
            name: "filter-empty-config",
            envoy: filter,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // `{}` with the tenant from a virtual key: the key is digested,
            // looked up among the tenants' digests and removed from the call.
            name: "filter-virtual-key",
            envoy: |port| {
                EnvoyBuilder::new()
                    .plugin_config(VIRTUAL_KEY)
                    .concurrency(1)
                    .upstream("backend", port)
            },
            path: "/v1/chat/completions",
            headers: vec![("authorization", "Bearer vk-bench-key-0123456789")],
            body: chat.clone(),
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // `{}` with every LLM call keyless: the client's stray key is
            // stripped before the call leaves (the mesh would put its own on).
            name: "filter-keyless",
            envoy: |port| {
                EnvoyBuilder::new()
                    .plugin_config(r#"{"credentials":{"every_call":true}}"#)
                    .concurrency(1)
                    .upstream("backend", port)
            },
            path: "/v1/chat/completions",
            headers: vec![("authorization", "Bearer sk-stray-app-key")],
            body: chat.clone(),
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // `{}` and a rule of tokens a minute and cost a day per tenant
            // (the credential's digest): each call reserves in shared data
            // before it goes and settles its usage after.
            name: "filter-limits",
            envoy: limits_envoy,
            path: "/v1/chat/completions",
            headers: vec![("authorization", "Bearer sk-bench-tenant")],
            body: chat.clone(),
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // `{}` with the model routed over two clusters (both the backend)
            // by measured health: each call weighs both, sends to one by the
            // routing header and records its health.
            name: "filter-routed",
            envoy: routed_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat,
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // `filter-routed` in the Messages dialect, over plain backends.
            name: "filter-routed-messages",
            envoy: |port| messages_routed_envoy(port, false),
            path: "/v1/messages",
            headers: vec![],
            body: unique_messages.to_string(),
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // The same over backends declared as providers: only those that
            // speak Messages weighed, the path and the version header set.
            name: "filter-routed-providers",
            envoy: |port| messages_routed_envoy(port, true),
            path: "/v1/messages",
            headers: vec![],
            body: unique_messages.to_string(),
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // Routed as `filter-routed`, on a conversation (a system prompt,
            // 5 earlier turns, the question), every request a conversation
            // of its own: its affinity key hashed from the system prompt and
            // first turn, the backend picked by rendezvous over both.
            name: "filter-routed-conversation",
            envoy: routed_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: routed_history.to_string(),
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            // Every request a new deterministic prompt: keyed, a miss, planned,
            // answered upstream and stored.
            name: "filter-miss-store",
            envoy: filter,
            path: "/v1/chat/completions",
            headers: vec![],
            body: unique_deterministic.to_string(),
            expect_cache: Some("MISS"),
        },
        Scenario {
            name: "filter-cache-hit",
            envoy: filter,
            path: "/v1/chat/completions",
            headers: vec![],
            body: deterministic.to_string(),
            expect_cache: Some("HIT"),
        },
        Scenario {
            // Every request a new system prompt, so a new context: an exact
            // miss, the embeddings callout, a lookup that finds nothing,
            // upstream, then the answer stored and its vector indexed.
            name: "filter-semantic-miss",
            envoy: semantic_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: semantic_unique_context.to_string(),
            expect_cache: Some("MISS"),
        },
        Scenario {
            // Every request a new wording of the same question in one
            // context: an exact miss, the callout, then a semantic hit.
            name: "filter-semantic-hit",
            envoy: semantic_envoy,
            path: "/v1/chat/completions",
            headers: vec![],
            body: unique_deterministic.to_string(),
            expect_cache: Some("SEMANTIC"),
        },
        Scenario {
            name: "filter-cache-hit-sse",
            envoy: filter,
            path: "/v1/chat/completions",
            headers: vec![],
            body: streamed.to_string(),
            expect_cache: Some("HIT"),
        },
        Scenario {
            // `filter-miss-store` in the Responses dialect: every request a
            // new prompt, opted in by `max-age`, a miss answered by the
            // Responses backend and stored as it sent it.
            name: "filter-responses-miss",
            envoy: filter,
            path: "/v1/responses",
            headers: vec![OPT_IN],
            body: unique_responses.to_string(),
            expect_cache: Some("MISS"),
        },
        Scenario {
            // The same in the Messages dialect.
            name: "filter-messages-miss",
            envoy: filter,
            path: "/v1/messages",
            headers: vec![OPT_IN],
            body: unique_messages.to_string(),
            expect_cache: Some("MISS"),
        },
        Scenario {
            // `filter-cache-hit` in the Messages dialect: the stored bytes
            // answered from shared data.
            name: "filter-messages-hit",
            envoy: filter,
            path: "/v1/messages",
            headers: vec![OPT_IN],
            body: messages.to_string(),
            expect_cache: Some("HIT"),
        },
        Scenario {
            // A six-turn Messages conversation, cache off, no markers.
            name: "filter-messages-conversation",
            envoy: |port| filter_envoy(port).plugin_config(r#"{"cache":{"enabled":false}}"#),
            path: "/v1/messages",
            headers: vec![],
            body: conversation.clone(),
            expect_cache: None,
        },
        Scenario {
            // The same with the prompt-cache markers put on: three.
            name: "filter-messages-markers",
            envoy: |port| {
                filter_envoy(port).plugin_config(
                    r#"{"cache":{"enabled":false},"routing":{"prompt_cache":{"claude-*":{}}}}"#,
                )
            },
            path: "/v1/messages",
            headers: vec![],
            body: conversation,
            expect_cache: None,
        },
        Scenario {
            // A streamed Messages miss: the events pass to the client as
            // they come, and their bytes are copied and stored at the end.
            name: "filter-messages-stream",
            envoy: filter,
            path: "/v1/messages",
            headers: vec![OPT_IN],
            body: unique_messages_stream.to_string(),
            expect_cache: Some("MISS"),
        },
    ]
}

/// Port of the embeddings backend, set once it runs: the semantic
/// scenarios' Envoys, built from the chat backend's port alone, read it.
static EMBEDDINGS_PORT: AtomicU16 = AtomicU16::new(0);
/// Dimensions of the embeddings backend's vector (a MiniLM-sized model: a
/// direct response holds at most 4 KiB).
const EMBEDDING_DIMENSIONS: usize = 384;

/// The filter with the semantic cache asking the embeddings backend; every
/// question embeds to the same vector, so whether a call hits depends on its
/// context alone.
fn semantic_envoy(port: u16) -> EnvoyBuilder {
    let config = json!({"cache": {"semantic": {"embeddings": {
        "cluster": "embeddings", "model": "text-embedding-3-small", "timeout_ms": 1000
    }}}});
    filter_envoy(port)
        .plugin_config(config)
        .upstream("embeddings", EMBEDDINGS_PORT.load(Ordering::SeqCst))
}

/// The fixed answer of the embeddings backend: one vector of
/// [`EMBEDDING_DIMENSIONS`].
fn embedding_answer() -> String {
    let vector: Vec<f64> = (0..EMBEDDING_DIMENSIONS)
        .map(|i| ((i as f64 * 0.37).sin() * 1e3).round() / 1e4)
        .collect();
    json!({
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": vector}],
        "model": "text-embedding-3-small",
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    })
    .to_string()
}

/// A backend Envoy answering every call with one fixed answer of an API,
/// after reading the request whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Backend {
    /// A `chat.completion` (on any path: the chat, plain and no-op scenarios).
    Chat,
    /// An OpenAI Responses `response`, `completed`.
    Responses,
    /// An Anthropic Messages `message`, ended by `end_turn`.
    Messages,
    /// The same message as Anthropic streams it, every event in one body.
    MessagesStream,
}

/// The text every backend answers.
const ANSWER_TEXT: &str = "Hello! How can I help you today?";

impl Backend {
    /// The answer's body and `content-type`.
    fn answer(self) -> (String, &'static str) {
        match self {
            Self::Chat => (chat_answer(), "application/json"),
            Self::Responses => (responses_answer(), "application/json"),
            Self::Messages => (messages_answer().to_string(), "application/json"),
            Self::MessagesStream => (messages_stream_answer(), "text/event-stream"),
        }
    }

    fn start(self) -> Result<Envoy> {
        let (body, content_type) = self.answer();
        EnvoyBuilder::new()
            .no_filter()
            .concurrency(1)
            .direct_response_typed(200, &body, content_type)
            .read_body_first()
            .start()
            .with_context(|| format!("{self:?} backend envoy"))
    }
}

/// The backends the selected scenarios need, one Envoy per kind of answer.
struct Backends(BTreeMap<Backend, Envoy>);

impl Backends {
    fn start(selected: &[Scenario]) -> Result<Self> {
        let mut backends = BTreeMap::new();
        for backend in selected.iter().map(Scenario::backend) {
            if let btree_map::Entry::Vacant(slot) = backends.entry(backend) {
                slot.insert(backend.start()?);
            }
        }
        Ok(Self(backends))
    }

    /// The port of `scenario`'s backend (0, which refuses, for one not
    /// started: never, as every selected scenario's is).
    fn port(&self, scenario: &Scenario) -> u16 {
        self.0.get(&scenario.backend()).map_or(0, Envoy::port)
    }
}

/// The fixed answer of the chat backend.
fn chat_answer() -> String {
    json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-4o",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": ANSWER_TEXT},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 14, "completion_tokens": 9, "total_tokens": 23},
    })
    .to_string()
}

/// The Responses backend's answer, every field OpenAI sends (it echoes the
/// request's parameters), as the official SDK parses it.
fn responses_answer() -> String {
    json!({
        "id": "resp_bench",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "background": false,
        "completed_at": 1_700_000_000,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "model": "gpt-4o",
        "output": [{
            "type": "message",
            "id": "msg_bench",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": ANSWER_TEXT, "annotations": [], "logprobs": []}],
        }],
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": true,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 14,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 9,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 23,
        },
        "user": null,
        "metadata": {},
    })
    .to_string()
}

/// The Messages backend's message, with `content` and `stop_reason` and the
/// usage as it ends (`messages_stream_answer` starts it empty).
fn message(content: Value, stop_reason: Value, output_tokens: u64) -> Value {
    json!({
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": {
            "input_tokens": 14,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        },
    })
}

fn messages_answer() -> Value {
    message(
        json!([{"type": "text", "text": ANSWER_TEXT}]),
        json!("end_turn"),
        9,
    )
}

/// The same message as Anthropic streams it: `message_start`, a text block
/// in three deltas after a `ping`, `message_delta` with the stop and the
/// output tokens, `message_stop`.
fn messages_stream_answer() -> String {
    let mut events = vec![
        json!({"type": "message_start", "message": message(json!([]), Value::Null, 1)}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
    ];
    for piece in ["Hello!", " How can I help", " you today?"] {
        events.push(json!({
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": piece},
        }));
    }
    events.extend([
        json!({"type": "content_block_stop", "index": 0}),
        json!({
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": 9},
        }),
        json!({"type": "message_stop"}),
    ]);
    events
        .iter()
        .map(|event| {
            let name = event
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            // `type` first, as Anthropic writes it.
            let rest: String = event
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(key, _)| *key != "type")
                .map(|(key, value)| format!(",{}:{value}", Value::from(key.as_str())))
                .collect();
            format!(
                "event: {name}\ndata: {{\"type\":{}{rest}}}\n\n",
                Value::from(name)
            )
        })
        .collect()
}

struct Options {
    duration_s: u64,
    warmup_s: u64,
    rounds: u32,
    threads: u32,
    connections: u32,
    ttfb_calls: u32,
    /// With a count: no throughput rounds; instead that many calls per
    /// scenario through a census build of the module, and the host calls
    /// each one cost (`make bench-hostcalls`).
    hostcalls: u32,
    only: Vec<String>,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        duration_s: 5,
        warmup_s: 1,
        rounds: 3,
        threads: 2,
        connections: 32,
        ttfb_calls: 300,
        hostcalls: 0,
        only: Vec::new(),
    };
    for (flag, value) in cli::flag_values(std::env::args().skip(1), USAGE)? {
        let number = || cli::parse::<u64>(&flag, &value, USAGE);
        let count = || cli::parse::<u32>(&flag, &value, USAGE);
        match flag.as_str() {
            "--duration" => options.duration_s = number()?,
            "--warmup" => options.warmup_s = number()?,
            "--rounds" => {
                options.rounds = count()?;
                if options.rounds == 0 {
                    return Err(format!("--rounds must be at least 1\n{USAGE}"));
                }
            }
            "--ttfb-calls" => options.ttfb_calls = count()?,
            "--hostcalls" => options.hostcalls = count()?,
            "--threads" => options.threads = count()?,
            "--connections" => options.connections = count()?,
            "--only" => options.only.push(value),
            _ => return Err(cli::unknown(&flag, USAGE)),
        }
    }
    Ok(options)
}

/// What wrk reported for one run.
#[derive(Debug, Clone, PartialEq)]
struct WrkResult {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests: u64,
    non_2xx: u64,
    socket_errors: u64,
}

/// A wrk duration (`812.00us`, `1.23ms`, `2.00s`, `1.00m`) in milliseconds.
fn parse_duration_ms(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match unit {
        "us" => 0.001,
        "ms" => 1.0,
        "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return None,
    };
    Some(number * factor)
}

/// Reads the numbers this bench needs out of `wrk --latency` output.
fn parse_wrk(output: &str) -> Result<WrkResult> {
    let mut requests_per_s = None;
    let mut p50_ms = None;
    let mut p99_ms = None;
    let mut requests = None;
    let mut non_2xx = 0;
    let mut socket_errors = 0;
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", value] => requests_per_s = value.parse().ok(),
            ["50%", value] => p50_ms = parse_duration_ms(value),
            ["99%", value] => p99_ms = parse_duration_ms(value),
            [count, "requests", "in", ..] => requests = count.parse().ok(),
            ["Non-2xx", "or", "3xx", "responses:", count] => non_2xx = count.parse()?,
            ["Socket", "errors:", rest @ ..] => {
                socket_errors = rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum();
            }
            _ => {}
        }
    }
    Ok(WrkResult {
        requests_per_s: requests_per_s.ok_or_else(|| anyhow!("no Requests/sec in wrk output"))?,
        p50_ms: p50_ms.ok_or_else(|| anyhow!("no 50% latency in wrk output"))?,
        p99_ms: p99_ms.ok_or_else(|| anyhow!("no 99% latency in wrk output"))?,
        requests: requests.ok_or_else(|| anyhow!("no request count in wrk output"))?,
        non_2xx,
        socket_errors,
    })
}

/// A Lua long-bracket string that cannot be closed by `text`.
fn lua_string(text: &str) -> String {
    let mut level = 0;
    while text.contains(&format!("]{}]", "=".repeat(level))) {
        level += 1;
    }
    let equals = "=".repeat(level);
    format!("[{equals}[{text}]{equals}]")
}

/// Writes the wrk script of one run of `scenario` into `dir`.
fn write_wrk_script(dir: &Path, scenario: &Scenario, run: &str) -> Result<std::path::PathBuf> {
    let path = dir.join(format!(
        "{}-{run}.lua",
        scenario
            .name
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    std::fs::write(&path, wrk_script(scenario, run))?;
    Ok(path)
}

/// The wrk script of `scenario`; `run` tells the bodies of one wrk run from
/// another's where they carry [`UNIQUE`] numbers.
fn wrk_script(scenario: &Scenario, run: &str) -> String {
    let mut script = String::from("wrk.method = \"POST\"\n");
    script.push_str(&format!("wrk.body = {}\n", lua_string(&scenario.body)));
    if let Some((head, tail)) = scenario.body.split_once(UNIQUE) {
        // Each wrk thread has its own Lua state: number the threads, then
        // the requests of each.
        script.push_str(&format!(
            "local head, tail = {}, {}\n\
             local threads, n = 0, 0\n\
             function setup(thread) threads = threads + 1; thread:set(\"tid\", threads) end\n\
             function request()\n  n = n + 1\n  \
             return wrk.format(nil, nil, nil, head .. {} .. tid .. \"-\" .. n .. tail)\nend\n",
            lua_string(head),
            lua_string(tail),
            lua_string(run),
        ));
    }
    script.push_str("wrk.headers[\"content-type\"] = \"application/json\"\n");
    for (name, value) in &scenario.headers {
        script.push_str(&format!(
            // Spaces around the key: `[[[` would open a long string.
            "wrk.headers[ {} ] = {}\n",
            lua_string(name),
            lua_string(value)
        ));
    }
    script
}

fn wrk_bin() -> String {
    std::env::var("WRK_BIN").unwrap_or_else(|_| "wrk".to_string())
}

fn run_wrk(url: &str, script: &Path, options: &Options, duration_s: u64) -> Result<WrkResult> {
    let output = Command::new(wrk_bin())
        .arg(format!("-t{}", options.threads))
        .arg(format!("-c{}", options.connections))
        .arg(format!("-d{duration_s}s"))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .with_context(|| format!("run {} (is wrk installed?)", wrk_bin()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // wrk reports a script it cannot load and then runs without it (a plain
    // GET), which would measure the wrong request.
    if stderr.contains(".lua:") {
        bail!("wrk could not load its script: {stderr}");
    }
    if !output.status.success() {
        bail!("wrk failed ({}): {}{}", output.status, stdout, stderr);
    }
    parse_wrk(&stdout).with_context(|| format!("wrk output:\n{stdout}"))
}

/// One request through the Envoy under test, so a broken setup fails loudly
/// instead of benchmarking error replies; a second one checks the cache's part
/// (the first one filled the entry the hit scenarios are served from), and
/// the answer is checked for what the scenario's API answers. A miss must
/// have stored its answer: the first request again is a hit.
async fn check(envoy: &Envoy, scenario: &Scenario) -> Result<()> {
    let first = scenario.request_body("check-1")?;
    let url = envoy.url(scenario.path);
    let response = post_json(&url, &first, &scenario.headers).await?;
    if response.status != 200 {
        bail!("check request got {}: {}", response.status, response.text());
    }
    let Some(want) = scenario.expect_cache else {
        return check_answer(scenario, &response);
    };
    // A body with its own number is new again; any other the same again.
    let again = post_json(&url, &scenario.request_body("check-2")?, &scenario.headers).await?;
    expect_cache(&again, want)?;
    check_answer(scenario, &again)?;
    if want == "MISS" && scenario.body.contains(UNIQUE) {
        let stored = post_json(&url, &first, &scenario.headers).await?;
        expect_cache(&stored, "HIT").context("the miss stored nothing")?;
        check_answer(scenario, &stored)?;
    }
    Ok(())
}

fn expect_cache(response: &HttpResponse, want: &str) -> Result<()> {
    let got = response.header("x-cache").unwrap_or("<none>");
    if response.status != 200 || got != want {
        bail!(
            "check request got {} with x-cache {got}, want 200 {want}",
            response.status
        );
    }
    Ok(())
}

/// Whether `response` is what a call of `scenario` gets: its API's answer,
/// delivered as the call asked. A Responses or Messages answer, from the
/// backend or the cache, is the backend's bytes as it sent them.
fn check_answer(scenario: &Scenario, response: &HttpResponse) -> Result<()> {
    let backend = scenario.backend();
    let streamed = scenario.streamed();
    let want_type = if streamed {
        "text/event-stream"
    } else {
        "application/json"
    };
    let content_type = response.header("content-type").unwrap_or("<none>");
    if !content_type.starts_with(want_type) {
        bail!(
            "{} answered {content_type}, want {want_type}",
            scenario.name
        );
    }
    if backend != Backend::Chat && response.body != backend.answer().0.as_bytes() {
        bail!(
            "{} answered other bytes than its backend sent: {}",
            scenario.name,
            response.text()
        );
    }
    answer_shape(backend, streamed, &response.body)
        .with_context(|| format!("{} answered {}", scenario.name, response.text()))
}

/// Whether `body` has the shape of `backend`'s API's answer: a complete
/// chat completion (a stream of its chunks ended by `[DONE]`), a completed
/// `response`, a `message` with its stop reason (its events, from
/// `message_start` to `message_stop`, each named by its `type`).
fn answer_shape(backend: Backend, streamed: bool, body: &[u8]) -> Result<()> {
    let json = || serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    let field =
        |value: &Value, name: &str| value.get(name).and_then(Value::as_str).map(str::to_string);
    let events = || SseParser::default().push(body, Instant::now());
    let ok = match (backend, streamed) {
        (Backend::Chat, false) => {
            let answer = json();
            field(&answer, "object").as_deref() == Some("chat.completion")
                && answer
                    .pointer("/choices/0/finish_reason")
                    .is_some_and(Value::is_string)
        }
        (Backend::Chat, true) => {
            let events = events();
            events.last().is_some_and(|e| e.data == "[DONE]")
                && events.len() > 1
                && events.iter().rev().skip(1).all(|e| {
                    e.json()
                        .and_then(|chunk| field(&chunk, "object"))
                        .as_deref()
                        == Some("chat.completion.chunk")
                })
        }
        (Backend::Responses, _) => {
            let answer = json();
            field(&answer, "object").as_deref() == Some("response")
                && field(&answer, "status").as_deref() == Some("completed")
        }
        (Backend::Messages, _) => {
            let answer = json();
            field(&answer, "type").as_deref() == Some("message")
                && answer.get("stop_reason").is_some_and(Value::is_string)
        }
        (Backend::MessagesStream, _) => {
            let events = events();
            let names: Vec<Option<&str>> = events.iter().map(|e| e.event.as_deref()).collect();
            names.first() == Some(&Some("message_start"))
                && names.last() == Some(&Some("message_stop"))
                && names.contains(&Some("content_block_delta"))
                && events.iter().all(|e| {
                    e.event.is_some() && e.json().and_then(|data| field(&data, "type")) == e.event
                })
        }
    };
    if !ok {
        bail!(
            "not a {backend:?} answer{}",
            if streamed { " stream" } else { "" }
        );
    }
    Ok(())
}

/// One measured run: what wrk saw and what Envoy held at the end of it.
#[derive(Debug, Clone)]
struct Run {
    wrk: WrkResult,
    /// Envoy's resident memory after the measured run.
    rss_kib: u64,
    /// CPU time the proxy spent per call of the measured run, µs (every
    /// thread of it, main and worker).
    cpu_us_per_call: f64,
}

/// CPU time every thread of process `pid` has spent so far, ns (the first
/// field of each task's `schedstat`: time on a CPU, at the scheduler's
/// resolution, not the 10 ms ticks of `stat`).
fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue; // a thread that ended meanwhile
        };
        let ns: u64 = text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no run time in {}", path.display()))?;
        total = total.saturating_add(ns);
    }
    Ok(total)
}

/// Envoy's resident set size (`VmRSS`) in KiB.
fn rss_kib(envoy: &Envoy) -> Result<u64> {
    let pid = envoy.pid().context("envoy pid")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read status of {pid}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

async fn run_scenario(
    scenario: &Scenario,
    backend_port: u16,
    options: &Options,
    dir: &Path,
) -> Result<Run> {
    let envoy = (scenario.envoy)(backend_port).start()?;
    check(&envoy, scenario).await?;
    let url = envoy.url(scenario.path);
    if options.warmup_s > 0 {
        let warmup = write_wrk_script(dir, scenario, "warmup")?;
        run_wrk(&url, &warmup, options, options.warmup_s)?;
    }
    let measured = write_wrk_script(dir, scenario, "measured")?;
    let pid = envoy.pid().context("envoy pid")?;
    let cpu_before = cpu_ns(pid)?;
    let wrk = run_wrk(&url, &measured, options, options.duration_s)?;
    let cpu = cpu_ns(pid)?.saturating_sub(cpu_before);
    Ok(Run {
        cpu_us_per_call: cpu as f64 / 1000.0 / wrk.requests.max(1) as f64,
        wrk,
        rss_kib: rss_kib(&envoy)?,
    })
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => sorted.get(n / 2).copied(),
        _ => Some((sorted.get(n / 2 - 1)? + sorted.get(n / 2)?) / 2.0),
    }
}

fn fmt_opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

/// Every round's runs of every scenario, by scenario then round.
type Rounds<'a> = Vec<(&'a str, Vec<Result<Run>>)>;

/// The runs of the scenario `name`, by round (`None` where it failed).
fn runs_of<'a>(rounds: &'a Rounds, name: &str) -> Vec<Option<&'a Run>> {
    rounds
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, runs)| runs.iter().map(|r| r.as_ref().ok()).collect())
        .unwrap_or_default()
}

/// The median over rounds of `f(run, base)` for the rounds where both ran:
/// ratios are taken within one round, so a drift between rounds cancels out.
fn median_against(
    runs: &[Option<&Run>],
    base: &[Option<&Run>],
    f: impl Fn(&Run, &Run) -> f64,
) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .zip(base)
        .filter_map(|(r, b)| Some(f((*r)?, (*b)?)))
        .collect();
    median(&values)
}

fn print_table(rounds: &Rounds, options: &Options) {
    println!(
        "\nwrk -t{} -c{} -d{}s, proxy under test with 1 worker; median of {} rounds\n",
        options.threads, options.connections, options.duration_s, options.rounds
    );
    println!(
        "| scenario | req/s | req/s by round | p50 ms | p99 ms | non-2xx | socket errors \
         | req/s × {PLAIN} | req/s × {NOOP} | p50 × {NOOP} | CPU µs per call \
         | CPU µs over {NOOP} | RSS MiB | RSS over {PLAIN} MiB |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let plain = runs_of(rounds, PLAIN);
    let noop = runs_of(rounds, NOOP);
    for (name, results) in rounds {
        let runs: Vec<Option<&Run>> = results.iter().map(|r| r.as_ref().ok()).collect();
        let ok: Vec<&Run> = runs.iter().flatten().copied().collect();
        if ok.is_empty() {
            let why = results
                .iter()
                .find_map(|r| r.as_ref().err())
                .map(|e| e.to_string().replace('\n', " "))
                .unwrap_or_default();
            println!("| {name} | failed: {why} | | | | | | | | | | | | |");
            continue;
        }
        let of = |f: fn(&Run) -> f64| median(&ok.iter().map(|r| f(r)).collect::<Vec<_>>());
        let by_round: Vec<String> = runs
            .iter()
            .map(|r| {
                r.map_or_else(
                    || "failed".to_string(),
                    |r| format!("{:.0}", r.wrk.requests_per_s),
                )
            })
            .collect();
        let non_2xx: u64 = ok.iter().map(|r| r.wrk.non_2xx).sum();
        let socket_errors: u64 = ok.iter().map(|r| r.wrk.socket_errors).sum();
        let rps = |r: &Run, b: &Run| r.wrk.requests_per_s / b.wrk.requests_per_s;
        let mib = |kib: f64| kib / 1024.0;
        println!(
            "| {name} | {} | {} | {} | {} | {non_2xx} | {socket_errors} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_opt(of(|r| r.wrk.requests_per_s), 0),
            by_round.join(" / "),
            fmt_opt(of(|r| r.wrk.p50_ms), 3),
            fmt_opt(of(|r| r.wrk.p99_ms), 3),
            fmt_opt(median_against(&runs, &plain, rps), 2),
            fmt_opt(median_against(&runs, &noop, rps), 2),
            fmt_opt(
                median_against(&runs, &noop, |r, b| r.wrk.p50_ms / b.wrk.p50_ms),
                2
            ),
            fmt_opt(of(|r| r.cpu_us_per_call), 1),
            fmt_opt(
                median_against(&runs, &noop, |r, b| r.cpu_us_per_call
                    - b.cpu_us_per_call),
                1
            ),
            fmt_opt(of(|r| r.rss_kib as f64).map(mib), 1),
            fmt_opt(
                median_against(&runs, &plain, |r, b| mib(
                    r.rss_kib as f64 - b.rss_kib as f64
                )),
                1
            ),
        );
    }
}

/// The streamed part: which Envoy, and what the filter (if any) is given.
struct TtfbSide {
    name: &'static str,
    envoy: fn(u16) -> EnvoyBuilder,
}

fn ttfb_sides() -> Vec<TtfbSide> {
    vec![
        TtfbSide {
            name: PLAIN,
            envoy: plain_envoy,
        },
        TtfbSide {
            name: NOOP,
            envoy: noop_envoy,
        },
        TtfbSide {
            // `{}` and a call without temperature: a cache `BYPASS` streamed through.
            name: "filter-streamed",
            envoy: filter_envoy,
        },
        TtfbSide {
            // The same with the guardrails reading the answer: each text is
            // held back through its window.
            name: "filter-guarded",
            envoy: guarded_envoy,
        },
    ]
}

/// The filter with guardrails on prompts and answers: keys blocked, personal
/// data masked.
fn guarded_envoy(port: u16) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .plugin_config(
            r#"{"guardrails":{"rules":[
                {"name":"keys","detect":["secrets"],"action":"block","on":"both"},
                {"name":"pii","detect":["personal"],"action":"mask","on":"both"}]}}"#,
        )
        .concurrency(1)
        .upstream("backend", port)
}

/// Time to the first byte of the body of `calls` streamed chat calls sent one
/// after the other on one kept-alive connection, and to the first token (the
/// first chunk with text), in ms, sorted.
async fn ttfb_ms(envoy: &Envoy, calls: u32) -> Result<(Vec<f64>, Vec<f64>)> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?;
    let url = envoy.url("/v1/chat/completions");
    let body = chat_stream_body("gpt-4o", "Say hello in one short sentence.", false).to_string();
    let mut times = Vec::new();
    let mut tokens = Vec::new();
    // The first calls open the connection and warm the VM: not measured.
    for i in 0..calls + 20 {
        let sent = Instant::now();
        let response = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await?;
        if response.status() != 200 {
            bail!("streamed call got {}", response.status());
        }
        let mut stream = response.bytes_stream();
        let first = stream.next().await.transpose()?;
        let at = sent.elapsed();
        let Some(first) = first else {
            bail!("streamed call without a body");
        };
        let mut seen = first.to_vec();
        let mut token = has_token(&seen).then_some(at);
        while let Some(piece) = stream.next().await.transpose()? {
            if token.is_none() {
                seen.extend_from_slice(&piece);
                token = has_token(&seen).then(|| sent.elapsed());
            }
        }
        if i >= 20 {
            times.push(at.as_secs_f64() * 1000.0);
            tokens.push(token.context("no token")?.as_secs_f64() * 1000.0);
        }
    }
    times.sort_by(f64::total_cmp);
    tokens.sort_by(f64::total_cmp);
    Ok((times, tokens))
}

/// A chat chunk with text is in `bytes`.
fn has_token(bytes: &[u8]) -> bool {
    let pat = b"\"content\":\"";
    bytes
        .windows(pat.len() + 1)
        .any(|w| w.starts_with(pat) && w.last() != Some(&b'"'))
}

/// The value at quantile `q` of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied()
}

/// p50 and p99 of each side, per round: to the first byte, then to the
/// first token.
type TtfbRounds = Vec<(&'static str, Vec<Result<(f64, f64, f64, f64)>>)>;

async fn run_ttfb(options: &Options, rounds: &mut TtfbRounds) -> Result<()> {
    // A mock that streams at once and paces its events by 1 ms: the first byte
    // comes as soon as the proxy lets it through.
    let mock = MockUpstream::try_start(MockConfig {
        chunk_delay_ms: 1,
        ..MockConfig::named("backend")
    })?;
    for (side, (name, results)) in ttfb_sides().iter().zip(rounds.iter_mut()) {
        eprintln!("bench: ttfb {name} ({} streamed calls)", options.ttfb_calls);
        let result = async {
            let envoy = (side.envoy)(mock.port()).start()?;
            let (times, tokens) = ttfb_ms(&envoy, options.ttfb_calls).await?;
            Ok((
                quantile(&times, 0.5).context("no call")?,
                quantile(&times, 0.99).context("no call")?,
                quantile(&tokens, 0.5).context("no call")?,
                quantile(&tokens, 0.99).context("no call")?,
            ))
        }
        .await;
        if let Err(e) = &result {
            eprintln!("bench: ttfb {name} failed: {e:#}");
        }
        results.push(result);
    }
    Ok(())
}

fn print_ttfb(rounds: &TtfbRounds, options: &Options) {
    println!(
        "\nstreamed calls, one at a time, {} per round: time to the first body byte, \
         median of {} rounds\n",
        options.ttfb_calls, options.rounds
    );
    println!(
        "| side | TTFB p50 ms | TTFB p99 ms | p50 over {PLAIN} ms | p99 over {PLAIN} ms \
         | first token p50 ms | first token p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    type Quad = (f64, f64, f64, f64);
    let base: Vec<Option<Quad>> = rounds
        .first()
        .map(|(_, r)| r.iter().map(|x| x.as_ref().ok().copied()).collect())
        .unwrap_or_default();
    for (name, results) in rounds {
        let ok: Vec<Quad> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        let over = |pick: fn(&Quad) -> f64| {
            let values: Vec<f64> = results
                .iter()
                .zip(&base)
                .filter_map(|(r, b)| Some(pick(r.as_ref().ok()?) - pick(b.as_ref()?)))
                .collect();
            median(&values)
        };
        let of = |pick: fn(&Quad) -> f64| median(&ok.iter().map(pick).collect::<Vec<_>>());
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            fmt_opt(of(|t| t.0), 3),
            fmt_opt(of(|t| t.1), 3),
            fmt_opt(over(|t| t.0), 3),
            fmt_opt(over(|t| t.1), 3),
            fmt_opt(of(|t| t.2), 3),
            fmt_opt(of(|t| t.3), 3),
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&options).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every selected scenario once per round; returns whether all succeeded.
async fn run(options: &Options) -> Result<bool> {
    let dir = tempfile::Builder::new()
        .prefix("llm-filter-bench-")
        .tempdir()?;
    if options.hostcalls == 0 && !noop_wasm_path().is_file() {
        bail!(
            "no-op module not found at {} (build it with `cargo build -p llm-filter-noop \
             --target wasm32-wasip1 --release`, or set LLM_FILTER_NOOP_WASM)",
            noop_wasm_path().display()
        );
    }
    let embeddings = EnvoyBuilder::new()
        .no_filter()
        .concurrency(1)
        .direct_response(200, &embedding_answer())
        .read_body_first()
        .start()
        .context("embeddings backend envoy")?;
    EMBEDDINGS_PORT.store(embeddings.port(), Ordering::SeqCst);
    let wanted = |name: &str| options.only.is_empty() || options.only.iter().any(|o| o == name);
    let selected: Vec<Scenario> = scenarios().into_iter().filter(|s| wanted(s.name)).collect();
    let ttfb = wanted("ttfb") && options.ttfb_calls > 0;
    if selected.is_empty() && !ttfb {
        bail!("no scenario matches --only {:?}", options.only);
    }
    let backends = Backends::start(&selected)?;
    if options.hostcalls > 0 {
        return run_hostcalls(&selected, &backends, options, dir.path()).await;
    }
    let mut rounds: Rounds = selected.iter().map(|s| (s.name, Vec::new())).collect();
    let mut ttfb_rounds: TtfbRounds = ttfb_sides().iter().map(|s| (s.name, Vec::new())).collect();
    for round in 1..=options.rounds {
        for (scenario, (_, results)) in selected.iter().zip(rounds.iter_mut()) {
            eprintln!(
                "bench: round {round}/{}: {} ({}s warm-up, {}s measured)",
                options.rounds, scenario.name, options.warmup_s, options.duration_s
            );
            let result = run_scenario(scenario, backends.port(scenario), options, dir.path()).await;
            if let Err(e) = &result {
                eprintln!("bench: {} failed: {e:#}", scenario.name);
            }
            results.push(result);
            // Let sockets of the finished run drain before the next one.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if ttfb {
            run_ttfb(options, &mut ttfb_rounds).await?;
        }
    }
    if !selected.is_empty() {
        print_table(&rounds, options);
    }
    if ttfb {
        print_ttfb(&ttfb_rounds, options);
    }
    let all_ok = rounds.iter().all(|(_, r)| r.iter().all(Result::is_ok))
        && ttfb_rounds.iter().all(|(_, r)| r.iter().all(Result::is_ok));
    Ok(all_ok)
}

/// A census counter of the census build by its one label's value
/// (`llm_filter_bench_hostcalls_total` by `call`, `…_callback_ns_total` by
/// `callback`), its label in the stat name as the filter writes every label
/// (`<metric><label>=.=<value>;.;`).
fn census_counters(envoy: &Envoy, metric: &str, label: &str) -> Result<BTreeMap<String, u64>> {
    let prefix = format!("{metric}{label}=.=");
    let counts = envoy
        .stats()?
        .into_iter()
        .filter_map(|(name, n)| {
            let at = name.find(&prefix)?;
            let value = name.get(at + prefix.len()..)?.strip_suffix(";.;")?;
            Some((value.to_string(), n))
        })
        .collect();
    Ok(counts)
}

/// What a counter moved by between two reads, per call.
fn per_call(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    calls: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, n)| {
            let delta = n.saturating_sub(before.get(k).copied().unwrap_or(0));
            (k.clone(), delta as f64 / calls)
        })
        .filter(|(_, per)| *per > 0.0)
        .collect()
}

/// `per` with its sum added as `total`, and the sum.
fn with_total(mut per: BTreeMap<String, f64>) -> (BTreeMap<String, f64>, f64) {
    let total = per.values().sum();
    per.insert("total".to_string(), total);
    (per, total)
}

/// Host calls per call of each scenario: `--hostcalls` requests one after
/// the other after the scenario's check, the census counters read before
/// and after. Calls made on ticks in between land in the count too (a few
/// per second on a worker: noise under 1 % at a few hundred calls). Then
/// the time inside each callback, per call, under the throughput run's load
/// (wrk for `--duration` seconds after its warm-up).
async fn run_hostcalls(
    selected: &[Scenario],
    backends: &Backends,
    options: &Options,
    dir: &Path,
) -> Result<bool> {
    let calls = options.hostcalls;
    let mut counts: Vec<(&str, BTreeMap<String, f64>)> = Vec::new();
    let mut times: Vec<(&str, BTreeMap<String, f64>)> = Vec::new();
    let mut host_times: Vec<(&str, BTreeMap<String, f64>)> = Vec::new();
    for scenario in selected.iter().filter(|s| s.name.starts_with("filter")) {
        eprintln!("bench: host calls of {} over {calls} calls", scenario.name);
        let envoy = (scenario.envoy)(backends.port(scenario)).start()?;
        check(&envoy, scenario).await?;
        // The census hands its counts over after each callback; let the
        // check's last ones (on the stream's end) land first.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = census_counters(&envoy, BENCH_HOSTCALLS, "call")?;
        if before.is_empty() {
            bail!(
                "no {BENCH_HOSTCALLS} stats: LLM_FILTER_WASM must be a build with \
                 `--features hostcall-census` (make bench-hostcalls)"
            );
        }
        let url = envoy.url(scenario.path);
        for n in 0..calls {
            let body = scenario.request_body(&format!("census-{n}"))?;
            let response = post_json(&url, &body, &scenario.headers).await?;
            if response.status != 200 {
                bail!(
                    "{} got {}: {}",
                    scenario.name,
                    response.status,
                    response.text()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = census_counters(&envoy, BENCH_HOSTCALLS, "call")?;
        counts.push((scenario.name, per_call(&before, &after, f64::from(calls))));

        eprintln!(
            "bench: time in callbacks of {} under load ({}s)",
            scenario.name, options.duration_s
        );
        // Runs of their own: a unique prompt of the warm-up must not come
        // back in the measured run as a cache hit.
        if options.warmup_s > 0 {
            let warmup = write_wrk_script(dir, scenario, "census-warmup")?;
            run_wrk(&url, &warmup, options, options.warmup_s)?;
        }
        let script = write_wrk_script(dir, scenario, "census-measured")?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = census_counters(&envoy, BENCH_CALLBACK_NS, "callback")?;
        let host_before = census_counters(&envoy, BENCH_HOSTCALL_NS, "call")?;
        let wrk = run_wrk(&url, &script, options, options.duration_s)?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = census_counters(&envoy, BENCH_CALLBACK_NS, "callback")?;
        let host_after = census_counters(&envoy, BENCH_HOSTCALL_NS, "call")?;
        // ns per call, shown in µs.
        let thousand_calls = wrk.requests.max(1) as f64 * 1000.0;
        let (per, total) = with_total(per_call(&before, &after, thousand_calls));
        times.push((scenario.name, per));
        let (mut host, in_host) = with_total(per_call(&host_before, &host_after, thousand_calls));
        host.insert("(module's own)".to_string(), total - in_host);
        host_times.push((scenario.name, host));
    }
    print_census("Host calls per call, by scenario (census build)", &counts);
    print_census(
        "µs inside the filter's callbacks per call, under load (census build)",
        &times,
    );
    print_census(
        "µs of those inside host calls, by call, and the module's own (census build)",
        &host_times,
    );
    Ok(true)
}

fn print_census(title: &str, table: &[(&str, BTreeMap<String, f64>)]) {
    let mut calls: Vec<&String> = table
        .iter()
        .flat_map(|(_, m)| m.keys())
        .filter(|k| *k != "total")
        .collect();
    calls.sort();
    calls.dedup();
    println!("\n{title}:\n");
    print!("| scenario | total |");
    for call in &calls {
        print!(" {call} |");
    }
    println!();
    print!("|---|---:|");
    for _ in &calls {
        print!("---:|");
    }
    println!();
    for (name, per_call) in table {
        let total = per_call
            .get("total")
            .copied()
            .unwrap_or_else(|| per_call.values().sum());
        print!("| `{name}` | {total:.1} |");
        for call in &calls {
            print!(" {} |", fmt_opt(per_call.get(*call).copied(), 1));
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK_OUTPUT: &str = "Running 10s test @ http://127.0.0.1:4000/v1/chat/completions
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.52ms  812.33us  20.01ms   90.12%
    Req/Sec    10.80k     1.02k   12.34k    70.00%
  Latency Distribution
     50%  812.00us
     75%    1.64ms
     90%    2.30ms
     99%    1.20s
  215000 requests in 10.00s, 95.12MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:  21498.77
Transfer/sec:      9.51MB
";

    #[test]
    fn parses_wrk_latency_output() {
        let r = parse_wrk(WRK_OUTPUT).unwrap();
        assert_eq!(r.requests_per_s, 21498.77);
        assert!((r.p50_ms - 0.812).abs() < 1e-9);
        assert_eq!(r.p99_ms, 1200.0);
        assert_eq!(r.requests, 215_000);
        assert_eq!(r.non_2xx, 7);
        assert_eq!(r.socket_errors, 5);
    }

    #[test]
    fn rejects_output_without_numbers() {
        assert!(parse_wrk("unable to connect").is_err());
        assert_eq!(parse_duration_ms("3.5x"), None);
        assert_eq!(parse_duration_ms("ms"), None);
    }

    #[test]
    fn header_keys_are_not_read_as_long_strings() {
        let scenarios = scenarios();
        let ab = scenarios.iter().find(|s| s.name == "filter-ab").unwrap();
        let script = wrk_script(ab, "measured");
        assert!(script.contains("wrk.headers[ [[x-user-id]] ] = [[user-12345]]"));
        assert!(!script.contains("[[["));
    }

    #[test]
    fn lua_strings_cannot_be_closed_early() {
        assert_eq!(lua_string("a"), "[[a]]");
        assert_eq!(lua_string("x]]y"), "[=[x]]y]=]");
        assert_eq!(lua_string("]]]=]"), "[==[]]]=]]==]");
    }

    #[test]
    fn scenario_names_are_unique() {
        let names: Vec<&str> = scenarios().iter().map(|s| s.name).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(names.len(), unique.len());
    }

    #[test]
    fn medians_and_quantiles() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&sorted, 0.5), Some(50.0));
        assert_eq!(quantile(&sorted, 0.99), Some(99.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn every_backend_answers_what_its_check_accepts() {
        for backend in [
            Backend::Chat,
            Backend::Responses,
            Backend::Messages,
            Backend::MessagesStream,
        ] {
            let (body, content_type) = backend.answer();
            let streamed = content_type == "text/event-stream";
            answer_shape(backend, streamed, body.as_bytes()).unwrap();
            // A direct response holds at most 4 KiB.
            assert!(body.len() < 4096, "{backend:?}: {} bytes", body.len());
        }
        let (chat, _) = Backend::Chat.answer();
        assert!(answer_shape(Backend::Messages, false, chat.as_bytes()).is_err());
        let (message, _) = Backend::Messages.answer();
        assert!(answer_shape(Backend::MessagesStream, true, message.as_bytes()).is_err());
    }

    #[test]
    fn an_unfinished_stream_is_not_an_answer() {
        let (stream, _) = Backend::MessagesStream.answer();
        let cut = stream.split("event: message_stop").next().unwrap();
        assert!(answer_shape(Backend::MessagesStream, true, cut.as_bytes()).is_err());
    }

    #[test]
    fn dialect_scenarios_opt_in_and_reach_their_backend() {
        let scenarios = scenarios();
        let find = |name| scenarios.iter().find(|s| s.name == name).unwrap();
        for (name, backend) in [
            ("filter-responses-miss", Backend::Responses),
            ("filter-messages-miss", Backend::Messages),
            ("filter-messages-hit", Backend::Messages),
            ("filter-messages-stream", Backend::MessagesStream),
        ] {
            let scenario = find(name);
            assert_eq!(scenario.backend(), backend, "{name}");
            assert!(scenario.headers.contains(&OPT_IN), "{name}");
            let body = scenario.request_body("1").unwrap();
            assert!(body.get("temperature").is_none(), "{name}");
        }
        assert_eq!(find("filter-miss-store").backend(), Backend::Chat);
        assert_eq!(find("filter-cache-hit-sse").backend(), Backend::Chat);
        assert!(find("filter-cache-hit-sse").streamed());
    }

    #[test]
    fn only_bodies_with_a_unique_mark_get_numbered() {
        let scenarios = scenarios();
        let find = |name| scenarios.iter().find(|s| s.name == name).unwrap();
        let unique = wrk_script(find("filter-miss-store"), "measured");
        assert!(unique.contains("function request()"));
        assert!(unique.contains("[[measured]]"));
        let fixed = wrk_script(find("filter-cache-hit"), "measured");
        assert!(!fixed.contains("function request()"));
    }
}
