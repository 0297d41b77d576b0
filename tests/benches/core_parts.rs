//! Times the pure parts of the filter's walk natively, in µs per call, on the
//! exact requests of `make bench` (`tests/src/bin/bench.rs`): where a call's
//! own cost goes before the Wasm host's. Plain `Instant` loops: each part runs
//! for a fixed time after a warm-up, the best of a few runs is kept.
//! Native code runs faster than the same code in V8, so read the numbers as
//! shares of a budget, not as the filter's absolute cost.
// A tool of the test suite: a step that cannot run (a mock, Envoy, a client
// that does not start) ends the run, and `expect` says why. Indexing and
// `panic!` stay denied: malformed output is reported, not trapped on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use llm_filter_core::budget::breaker::{self, Sample};
use llm_filter_core::cache::key::Key;
use llm_filter_core::cache::semantic::config::SemanticConfig;
use llm_filter_core::cache::semantic::{self, store, vector};
use llm_filter_core::cache::{self, CacheRequest, Decision, Stamp, StreamAssembler};
use llm_filter_core::config::Config;
use llm_filter_core::dialect::chat::stream::Chat;
use llm_filter_core::dialect::features::Features;
use llm_filter_core::dialect::{classify, Dialect};
use llm_filter_core::guard::policy::Verdict;
use llm_filter_core::guard::Vault;
use llm_filter_core::host::{MemoryStore, Metrics, SharedStore};
use llm_filter_core::json::{Document, Json};
use llm_filter_core::observe;
use llm_filter_core::priority::Priority;
use llm_filter_core::routing::health::{self, CallResult, CallSample};
use llm_filter_core::shaping;
use llm_filter_core::sse;
use llm_filter_core::summary::{CallSummary, End, Try};
use llm_filter_core::usage::Usage;
use llm_filter_core::{degrade, load};
use llm_filter_e2e::{chat_body, conversation_body, with_field, SHAPING_AB};
use serde_json::json;
use sha2::{Digest, Sha256};

/// How long each part is measured, per run.
const RUN: Duration = Duration::from_millis(300);
/// Runs per part; the fastest is reported (the others met a busier machine).
const RUNS: usize = 3;
/// The cluster (and breaker) name of the bench's route.
const CLUSTER: &str = "backend";
const PATH: &str = "/v1/chat/completions";

/// A [`Metrics`] that only touches the names, so the time is the name
/// building, not a stat store's.
#[derive(Default)]
struct Sink(usize);

impl Metrics for Sink {
    fn counter(&mut self, name: &str, delta: u64) {
        self.0 += name.len() + delta as usize;
    }
    fn gauge(&mut self, name: &str, _: i64) {
        self.0 += name.len();
    }
    fn gauge_add(&mut self, name: &str, _: i64) {
        self.0 += name.len();
    }
    fn histogram(&mut self, name: &str, value: u64) {
        self.0 += name.len() + value as usize;
    }
}

/// µs per call of `f`: the best of [`RUNS`] runs of [`RUN`] each.
fn time(mut f: impl FnMut()) -> f64 {
    let warm = Instant::now();
    while warm.elapsed() < RUN / 4 {
        f();
    }
    let mut best = f64::INFINITY;
    for _ in 0..RUNS {
        let start = Instant::now();
        let mut calls = 0u64;
        // Check the clock every 64 calls, so reading it is not what is timed.
        while start.elapsed() < RUN {
            for _ in 0..64 {
                f();
            }
            calls += 64;
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    best
}

/// When the bench's rebuilt entries were stored and expire.
const STAMP: Stamp = Stamp {
    stored_at_ms: 1,
    expires_at_ms: 2,
};

/// A streamed answer with the usage-only chunk the filter asked for.
const STREAM: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":14,\"completion_tokens\":9}}\n\n\
data: [DONE]\n\n";

fn main() {
    let config = Config::parse(b"{}").expect("config");
    // The bench's LLM call (`filter-empty-config`: no temperature, a cache
    // BYPASS) and its deterministic twin (`filter-cache-hit`: keyed).
    let plain = chat_body("gpt-4o", "Say hello in one short sentence.").to_string();
    let deterministic = with_field(
        chat_body("gpt-4o", "Say hello in one short sentence."),
        "temperature",
        json!(0),
    )
    .to_string();
    let parsed = Json::parse(plain.as_bytes()).expect("parse");
    let parsed_det = Json::parse(deterministic.as_bytes()).expect("parse");
    let request = |body| CacheRequest {
        dialect: Dialect::Chat,
        path: PATH,
        body: Some(body),
        cache_control: None,
        credentials: &[None],
    };
    assert!(
        matches!(
            cache::decide(&config.cache, &request(&parsed_det)),
            Decision::Cacheable(_)
        ),
        "the deterministic request must be cacheable"
    );
    let mut canonical = Vec::new();
    parsed_det.write_without(&["stream", "stream_options", "user"], &mut canonical);

    let store = MemoryStore::new();
    let outcome = CallSample {
        result: CallResult::Status(200),
        latency_ms: 4,
        ttft_ms: Some(3),
        streamed: false,
        output_tokens: Some(8),
    };
    health::record_start(&store, CLUSTER, 1_000).expect("a store write");
    health::record_outcome(&store, &config.routing, CLUSTER, &outcome, 1_004)
        .expect("a store write");
    breaker::record(
        &store,
        CLUSTER,
        1_004,
        Sample::new(4, 60_000, false, 0),
        &config.budget,
    )
    .expect("a store write");
    let summary = CallSummary {
        api: Dialect::Chat,
        priority: Priority::P1,
        model: "gpt-4o",
        group: None,
        served: Try {
            end: End::Answered(200),
            started_ms: 1_000,
            response_headers_ms: Some(1_003),
            first_byte_ms: Some(1_003),
            ended_ms: 1_004,
            usage: Some(Usage {
                prompt_tokens: 14,
                completion_tokens: 9,
                ..Usage::default()
            }),
            streamed: false,
            cluster: Some(CLUSTER),
            breaker: Some(CLUSTER),
            budget_ms: 60_000,
            planned_retries: 1,
            attempts: Some(1),
            failovers: 0,
        },
    };
    // The shaping bench's request: 5 earlier turns, 2 kept, the cap set.
    let shaping = Config::parse(SHAPING_AB.as_bytes()).expect("config");
    let conversation =
        conversation_body("gpt-4o", 5, "Say hello in one short sentence.").to_string();
    let conversation_doc = Document::parse(conversation.clone().into_bytes());
    let limits = shaping.shaping.limits(Priority::P1);
    let mut shaped = conversation_doc.clone();
    let changes = shaping::shape(&mut shaped, Dialect::Chat, &limits, shaping.shaping.field);
    assert!(!changes.is_empty(), "the conversation must be shaped");
    let shaped = shaped.into_bytes();

    let mut now = 2_000u64;
    let mut sink = Sink::default();
    let parts: Vec<(&str, f64)> =
        vec![
        (
            "classify the path",
            time(|| {
                black_box(classify("POST", black_box(PATH), &config.llm_paths));
            }),
        ),
        (
            "parse the body (`json::Json::parse`)",
            time(|| {
                black_box(Json::parse(black_box(plain.as_bytes())));
            }),
        ),
        (
            "cache decision, no temperature (`cache::decide`, BYPASS)",
            time(|| {
                black_box(cache::decide(&config.cache, &request(black_box(&parsed))));
            }),
        ),
        (
            "cache decision and key, temperature 0 (`cache::decide`)",
            time(|| {
                black_box(cache::decide(
                    &config.cache,
                    &request(black_box(&parsed_det)),
                ));
            }),
        ),
        (
            "… of which canonical form (`write_without`)",
            time(|| {
                let mut out = Vec::new();
                parsed_det.write_without(&["stream", "stream_options", "user"], &mut out);
                black_box(out);
            }),
        ),
        (
            "… of which SHA-256 of the key parts",
            time(|| {
                black_box(Sha256::digest(black_box(&canonical)));
            }),
        ),
        (
            "routing features (`dialect::features::Features::from_json`)",
            time(|| {
                black_box(Features::from_json(Dialect::Chat, black_box(&parsed)));
            }),
        ),
        (
            "breaker load (`budget::breaker::load`)",
            time(|| {
                black_box(breaker::load(&store, CLUSTER, &config.budget).ok());
            }),
        ),
        (
            "breaker record (`budget::breaker::record`, CAS)",
            time(|| {
                now += 1;
                let sample = Sample::new(4, 60_000, false, 0);
                black_box(breaker::record(&store, CLUSTER, now, sample, &config.budget).ok());
            }),
        ),
        (
            "health read (`routing::health::read`)",
            time(|| {
                black_box(health::read(&store, black_box(CLUSTER)));
            }),
        ),
        (
            "load signals of a call: in flight, then out (`load::started` + `load::ended`, 2 CAS)",
            time(|| {
                now += 1;
                let names = &config.names;
                let started = load::started(&store, &mut sink, names, "gpt-4o", now);
                load::ended(&store, &mut sink, names, black_box(&summary), started.as_deref());
            }),
        ),
        (
            "degrade level of a model (`degrade::level_with`: load record and alerts read)",
            time(|| {
                black_box(degrade::level_with(&store, &config, black_box("gpt-4o"), now));
            }),
        ),
        (
            "usage-only chunk out of a 3-event stream, usage read (`sse::Stream` stripping)",
            time(|| {
                let mut stream = sse::Stream::<Chat>::new();
                stream.strip_usage();
                black_box(stream.feed(black_box(STREAM.as_bytes()), true, None));
            }),
        ),
        (
            "… and the cache's entry rebuilt in the same pass (`cache::StreamAssembler` collecting)",
            time(|| {
                let mut stream = sse::Stream::<Chat>::new();
                stream.strip_usage();
                let mut asm = StreamAssembler::new(Dialect::Chat, 262_144)
                    .expect("an assembler for chat");
                black_box(stream.feed(black_box(STREAM.as_bytes()), true, Some(&mut asm)));
                black_box(asm.finish(STAMP).ok());
            }),
        ),
        (
            "shape: trim history and cap max_tokens (`shaping::shape` on a copy of the parsed body, 12 messages)",
            time(|| {
                let mut doc = black_box(&conversation_doc).clone();
                black_box(shaping::shape(&mut doc, Dialect::Chat, &limits, shaping.shaping.field));
            }),
        ),
        (
            "… the copy alone (`json::Document::clone`)",
            time(|| {
                black_box(black_box(&conversation_doc).clone());
            }),
        ),
        (
            "A/B group of a user (`ab::AbConfig::assign`, FNV-1a)",
            time(|| {
                black_box(shaping.ab.assign(Some(black_box("user-12345"))));
            }),
        ),
        (
            "request metrics (`observe::record`, names built)",
            time(|| {
                observe::record(&mut sink, black_box(&summary));
            }),
        ),
    ];
    black_box(sink.0);
    let semantic = semantic_parts(&parsed_det);
    let guard = guard_parts();

    println!(
        "\npure core parts, native (release), on the requests of `make bench` \
         ({} B body; {} B keyed body; {} B conversation, {} B shaped)\n",
        plain.len(),
        deterministic.len(),
        conversation.len(),
        shaped.len()
    );
    println!("| part | µs per call |");
    println!("|---|---:|");
    let parts = parts.into_iter().map(|(p, us)| (p.to_string(), us));
    for (part, us) in parts.chain(semantic).chain(guard) {
        println!("| {part} | {us:.3} |");
    }
}

/// The guardrails' rules of `make bench`'s `filter-guarded`: every
/// built-in detector, `secrets` blocked and `personal` masked, on prompts
/// and answers.
const GUARDED: &str = r#"{"guardrails":{"rules":[
  {"name":"no-secrets","detect":["secrets"],"action":"block","on":"both"},
  {"name":"pii","detect":["personal"],"action":"mask","on":"both"}]}}"#;

/// Clean text of `bytes` bytes (at a character's boundary): the corpus of
/// clean prompts the detectors' false positives are measured on (code and
/// prose in several scripts) without its agreed findings, over and over.
fn clean_text(bytes: usize) -> String {
    const PARTS: [&str; 4] = [
        include_str!("../../filter/core/tests/corpus/code_rust.txt"),
        include_str!("../../filter/core/tests/corpus/prose_asia_mideast.txt"),
        include_str!("../../filter/core/tests/corpus/code_python.txt"),
        include_str!("../../filter/core/tests/corpus/prose_de_fr_es.txt"),
    ];
    let mut text = String::new();
    for part in PARTS.iter().cycle() {
        for c in part.chars() {
            if text.len() + c.len_utf8() > bytes {
                return text;
            }
            text.push(c);
        }
    }
    text
}

/// The guardrails' check of a chat call's prompt and of its JSON answer,
/// 2 KB and 32 KB of text each.
fn guard_parts() -> Vec<(String, f64)> {
    let config = Config::parse(GUARDED.as_bytes()).expect("config");
    let rules = &config.guardrails;
    let fields = Dialect::Chat.request().guarded_fields();
    let said = Dialect::Chat.answer().said_fields();
    let mut out = Vec::new();
    for kb in [2usize, 32] {
        let text = clean_text(kb * 1024);
        let prompt = Json::parse(chat_body("gpt-4o", &text).to_string().as_bytes()).expect("parse");
        let mut vault = Vault::new();
        let v = rules.check(&prompt, fields, &mut vault);
        assert!(
            v.fired.is_empty() && !v.truncated,
            "the clean prompt raised no finding"
        );
        out.push((
            format!("guardrails: check a clean {kb} KB chat prompt (`Guardrails::check`, every built-in)"),
            time(|| {
                let mut vault = Vault::new();
                black_box(rules.check(black_box(&prompt), fields, &mut vault));
            }),
        ));
        let answer = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 14, "completion_tokens": 512}
        })
        .to_string();
        out.push((
            format!(
                "guardrails: check a clean {kb} KB JSON answer (parse, `Guardrails::check_answer`)"
            ),
            time(|| {
                let mut tree = Json::parse(black_box(answer.as_bytes())).expect("parse");
                let (mut vault, mut verdict) = (Vault::new(), Verdict::default());
                if let Json::Object(members) = &mut tree {
                    for (name, value) in members.iter_mut() {
                        if said.contains(&name.as_str()) {
                            black_box(rules.check_answer(value, &mut vault, &mut verdict, true));
                        }
                    }
                }
                black_box(verdict);
            }),
        ));
    }
    // A prompt with personal data: found, masked, the field written again.
    let mut text = clean_text(2 * 1024 - 80);
    text.push_str(" Card 4111 1111 1111 1111, mail ana.silva@example.com, call +44 20 7946 0958.");
    let prompt = Json::parse(chat_body("gpt-4o", &text).to_string().as_bytes()).expect("parse");
    let v = rules.check(&prompt, fields, &mut Vault::new());
    assert_eq!(v.edits.len(), 1, "the prompt is masked");
    out.push((
        "guardrails: check a 2 KB chat prompt, a card, an e-mail address and a phone number masked"
            .to_string(),
        time(|| {
            let mut vault = Vault::new();
            black_box(rules.check(black_box(&prompt), fields, &mut vault));
        }),
    ));
    out
}

/// Unit vectors, deterministic, of `d` dimensions.
fn unit_vectors(n: usize, d: usize) -> Vec<Vec<f32>> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            let v: Vec<f32> = (0..d)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
                })
                .collect();
            vector::normalise(&v).expect("a zero vector")
        })
        .collect()
}

/// The bytes of a group slot holding a record of `context` for each of
/// `vectors`, written through the index as the filter writes them: what a
/// full group costs to scan.
fn stored_group(cfg: &SemanticConfig, context: &Key, vectors: &[Vec<f32>]) -> Vec<u8> {
    let shared = MemoryStore::new();
    let index = semantic::Index::new(&shared, cfg);
    for (i, v) in vectors.iter().enumerate() {
        let n = (i as u64).to_le_bytes();
        let exact: Key = std::array::from_fn(|b| n.get(b).copied().unwrap_or(0));
        index
            .insert(context, &exact, v, 0, u64::MAX)
            .expect("a store write");
    }
    let slot = store::group_key(index.slot(context));
    shared
        .get(&slot)
        .ok()
        .and_then(|v| v.value)
        .expect("the group")
}

/// The semantic cache's own parts: the context key, reading the
/// embeddings answer, and the scan of a group, per 1,000 stored vectors.
fn semantic_parts(parsed: &Json) -> Vec<(String, f64)> {
    let config = Config::parse(
        br#"{"cache":{"semantic":{"embeddings":{"cluster":"e","model":"m"},"max_dimensions":3072}}}"#,
    )
    .expect("config");
    let sem = config.cache.semantic.as_ref().expect("semantic config");
    let req = CacheRequest {
        dialect: Dialect::Chat,
        path: PATH,
        body: Some(parsed),
        cache_control: None,
        credentials: &[None],
    };
    let mut out = vec![(
        "semantic context key and question (`cache::semantic::query`)".to_string(),
        time(|| {
            black_box(semantic::query(&config.cache, sem, &req, black_box(parsed)));
        }),
    )];
    for d in [384usize, 1536] {
        let v = unit_vectors(1, d).remove(0);
        let answer =
            json!({"object":"list","data":[{"object":"embedding","index":0,"embedding":v}]})
                .to_string();
        out.push((
            format!("read a {d}-dimension embeddings answer (`read_embedding`)"),
            time(|| {
                black_box(
                    semantic::read_embedding(Some(200), black_box(answer.as_bytes()), 3072).ok(),
                );
            }),
        ));
    }
    const STORED: usize = 1_000;
    let context = [7u8; 32];
    let full = Config::parse(
        br#"{"cache":{"semantic":{"embeddings":{"cluster":"e","model":"m"},"max_dimensions":3072,"max_per_context":1000}}}"#,
    )
    .expect("config");
    let full = full.cache.semantic.as_ref().expect("semantic config");
    for d in [384usize, 1536, 3072] {
        let mut vectors = unit_vectors(STORED + 1, d);
        let query = vectors.pop().expect("the query");
        let group = stored_group(full, &context, &vectors);
        let scanned = store::scan(&group, &context, &query, 0.95, 1).scanned;
        assert_eq!(scanned as usize, STORED, "the group holds every vector");
        out.push((
            format!("semantic scan of 1,000 stored {d}-dimension vectors (`store::scan`)"),
            time(|| {
                black_box(store::scan(black_box(&group), &context, &query, 0.95, 1));
            }),
        ));
    }
    out
}
