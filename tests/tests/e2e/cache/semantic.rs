//! The semantic cache through the real Envoy: a reworded repeat of a cached
//! question is answered from the original's entry (`x-cache: SEMANTIC`) with
//! the embedding from a second mock by callout; another tenant, model,
//! system prompt or temperature never is; an embeddings service that is down
//! or slow costs the hit rate only; the index stays bounded under churn.

use std::time::{Duration, Instant};

use llm_filter_e2e::{
    post_json, skip_without_envoy, stream_sse, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

use crate::support::cache::{cacheable, message, x_cache, CHAT, FILTER_STATS};

const QUESTION: &str = "What is the capital of France?";
/// The same words, reordered and re-cased: the mock embeds it identically.
const REWORDED: &str = "france: THE capital of, what is";
const OTHER: &str = "How do I bake sourdough bread at home?";
const TENANT: (&str, &str) = ("authorization", "Bearer sk-tenant-a");
const DEADLINE: Duration = Duration::from_secs(10);

/// The chat mock (default route), the embeddings mock (cluster `emb`) and
/// Envoy with the semantic cache asking `emb`.
struct Rig {
    chat: MockUpstream,
    emb: MockUpstream,
    envoy: Envoy,
}

impl Rig {
    fn start(test: &str, semantic: Value, cache: Value) -> Option<Self> {
        if skip_without_envoy(test) {
            return None;
        }
        let chat = MockUpstream::start(MockConfig::named("up"));
        let emb = MockUpstream::start(MockConfig::named("emb"));
        let mut cache = cache;
        cache["semantic"] = semantic;
        let envoy = EnvoyBuilder::new()
            .plugin_config(json!({ "cache": cache }))
            .upstream("mock", chat.port())
            .upstream("emb", emb.port())
            .start()
            .unwrap_or_else(|e| panic!("envoy: {e:#}"));
        Some(Self { chat, emb, envoy })
    }

    async fn ask(&self, body: &Value, headers: &[(&str, &str)]) -> llm_filter_e2e::HttpResponse {
        let r = post_json(&self.envoy.url(CHAT), body, headers)
            .await
            .unwrap_or_else(|e| panic!("call: {e:#}"));
        assert_eq!(r.status, 200, "{}", r.text());
        r
    }

    fn chat_calls(&self) -> usize {
        self.chat.count("POST", CHAT)
    }

    fn wait_stat(&self, name: &str, at_least: u64) -> u64 {
        self.envoy
            .wait_for_stat(&format!("{FILTER_STATS}{name}"), at_least, DEADLINE)
    }

    /// Asks `question` as the tenant and waits until its answer and vector are stored.
    async fn seed(&self, question: &str, stored_before: u64) {
        let r = self.ask(&cacheable(question), &[TENANT]).await;
        assert_eq!(x_cache(&r), "MISS");
        let stored = self.wait_stat(
            "llm_filter_cache_semantic_stores_totalresult=.=stored;.;",
            stored_before + 1,
        );
        assert_eq!(stored, stored_before + 1, "the vector was indexed");
    }
}

fn semantic(timeout_ms: u64) -> Value {
    json!({
        "embeddings": {
            "cluster": "emb",
            "model": "text-embedding-3-small",
            "headers": {"authorization": "Bearer emb-key"},
            "timeout_ms": timeout_ms
        }
    })
}

#[tokio::test]
async fn a_reworded_question_is_answered_from_the_cache() {
    let Some(rig) = Rig::start(
        "a_reworded_question_is_answered_from_the_cache",
        semantic(2_000),
        json!({}),
    ) else {
        return;
    };
    rig.seed(QUESTION, 0).await;
    assert_eq!(rig.chat_calls(), 1);
    let asked = rig.emb.last_request().expect("the embeddings callout");
    assert_eq!(asked.path, "/v1/embeddings");
    assert_eq!(asked.header("authorization"), Some("Bearer emb-key"));
    assert_eq!(
        asked.json().unwrap(),
        json!({"model": "text-embedding-3-small", "input": QUESTION})
    );

    let r = rig.ask(&cacheable(REWORDED), &[TENANT]).await;
    assert_eq!(x_cache(&r), "SEMANTIC");
    let similarity: f64 = r.header("x-cache-similarity").unwrap().parse().unwrap();
    assert!((0.99..=1.0).contains(&similarity), "{similarity}");
    assert_eq!(
        message(&r),
        format!("echo: {QUESTION} [up]"),
        "the original's answer"
    );
    assert!(r.header("age").is_some());
    assert_eq!(rig.chat_calls(), 1, "the upstream was not called again");
    assert_eq!(rig.emb.count("POST", "/v1/embeddings"), 2);

    // Streamed, it is replayed as SSE.
    let mut body = cacheable(&REWORDED.to_uppercase());
    body["stream"] = json!(true);
    let sse = stream_sse(&rig.envoy.url(CHAT), &body, &[TENANT])
        .await
        .expect("stream");
    assert_eq!(sse.header("x-cache"), Some("SEMANTIC"));
    assert!(sse.done());
    assert_eq!(sse.content(), format!("echo: {QUESTION} [up]"));

    // A different question is a miss, and `no-cache` is honoured without
    // asking for an embedding.
    let r = rig.ask(&cacheable(OTHER), &[TENANT]).await;
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(message(&r), format!("echo: {OTHER} [up]"));
    let emb_before = rig.emb.count("POST", "/v1/embeddings");
    let r = rig
        .ask(
            &cacheable(REWORDED),
            &[TENANT, ("cache-control", "no-cache")],
        )
        .await;
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(rig.emb.count("POST", "/v1/embeddings"), emb_before);
    assert_eq!(rig.chat_calls(), 3);
    // Embeddings calls of the clients themselves never take the semantic path.
    let r = post_json(
        &rig.envoy.url("/v1/embeddings"),
        &json!({"model": "text-embedding-3-small", "input": QUESTION}),
        &[TENANT],
    )
    .await
    .expect("embeddings");
    assert_eq!(r.status, 200);
    assert_eq!(rig.emb.count("POST", "/v1/embeddings"), emb_before);

    assert_eq!(
        rig.wait_stat("llm_filter_cache_lookups_totalresult=.=semantic;.;", 2),
        2
    );
    let sims = rig.envoy.wait_for_metric(
        "llm_filter_cache_semantic_similarity_permille_count",
        &[],
        3.0,
        Duration::from_secs(20),
    );
    assert!(sims >= 3.0, "{sims}");
    let durations = rig.envoy.wait_for_metric(
        "llm_filter_cache_embedding_duration_ms_count",
        &[],
        4.0,
        Duration::from_secs(20),
    );
    assert!(durations >= 4.0, "{durations}");
}

#[tokio::test]
async fn another_tenant_model_system_prompt_or_temperature_never_matches() {
    let Some(rig) = Rig::start(
        "another_tenant_model_system_prompt_or_temperature_never_matches",
        semantic(2_000),
        json!({"max_temperature": 1}),
    ) else {
        return;
    };
    rig.seed(QUESTION, 0).await;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut b = cacheable(REWORDED);
        f(&mut b);
        b
    };
    let cases: Vec<(&str, Value, (&str, &str))> = vec![
        (
            "tenant",
            cacheable(REWORDED),
            ("authorization", "Bearer sk-tenant-b"),
        ),
        (
            "model",
            with(&|b| b["model"] = json!("gpt-4o-mini")),
            TENANT,
        ),
        (
            "system prompt",
            with(&|b| {
                b["messages"] = json!([
                    {"role": "system", "content": "answer in French"},
                    {"role": "user", "content": REWORDED}
                ])
            }),
            TENANT,
        ),
        (
            "temperature",
            with(&|b| b["temperature"] = json!(0.5)),
            TENANT,
        ),
    ];
    for (n, (what, body, header)) in cases.iter().enumerate() {
        let r = rig.ask(body, &[*header]).await;
        assert_eq!(x_cache(&r), "MISS", "{what}");
        assert_eq!(message(&r), format!("echo: {REWORDED} [up]"), "{what}");
        assert_eq!(rig.chat_calls(), n + 2, "{what}");
    }
    // The original context still matches.
    let r = rig.ask(&cacheable(REWORDED), &[TENANT]).await;
    assert_eq!(x_cache(&r), "SEMANTIC");
}

#[tokio::test]
async fn an_embeddings_service_down_or_slow_only_lowers_the_hit_rate() {
    let timeout_ms = 150;
    let Some(rig) = Rig::start(
        "an_embeddings_service_down_or_slow_only_lowers_the_hit_rate",
        semantic(timeout_ms),
        json!({}),
    ) else {
        return;
    };
    // Seeded while the service is up (retried: a loaded machine may be
    // slower than the timeout).
    let mut stored = 0;
    for attempt in 0..5 {
        // The same words each time, a new exact key each time.
        let q = match attempt {
            0 => QUESTION.to_string(),
            n => format!("{}{}", QUESTION.to_lowercase(), "?".repeat(n)),
        };
        let r = rig.ask(&cacheable(&q), &[TENANT]).await;
        assert_eq!(x_cache(&r), "MISS");
        std::thread::sleep(Duration::from_millis(200));
        stored = rig.envoy.stat(&format!(
            "{FILTER_STATS}llm_filter_cache_semantic_stores_totalresult=.=stored;.;"
        ));
        if stored > 0 {
            break;
        }
    }
    assert!(stored > 0, "never indexed a vector");

    // Down: answers 503. Calls go upstream and succeed.
    rig.emb.set_status(Some(503));
    for n in 0..3 {
        let r = rig
            .ask(&cacheable(&format!("{REWORDED} {n}")), &[TENANT])
            .await;
        assert_eq!(x_cache(&r), "MISS");
    }
    assert_eq!(
        rig.wait_stat(
            "llm_filter_cache_embedding_failures_totalreason=.=status;.;",
            3
        ),
        3
    );
    // Slow: the call waits for the timeout at most, then goes upstream.
    rig.emb.set_status(None);
    rig.emb.set_default_delay_ms(3_000);
    let chat_before = rig.chat_calls();
    let started = Instant::now();
    let r = rig.ask(&cacheable(REWORDED), &[TENANT]).await;
    let elapsed = started.elapsed();
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(message(&r), format!("echo: {REWORDED} [up]"));
    assert_eq!(rig.chat_calls(), chat_before + 1);
    assert!(
        elapsed >= Duration::from_millis(timeout_ms) && elapsed < Duration::from_millis(2_000),
        "{elapsed:?}"
    );
    assert_eq!(
        rig.wait_stat(
            "llm_filter_cache_embedding_failures_totalreason=.=timeout;.;",
            1
        ),
        1
    );
    // Back: hits again (with wordings the exact cache never saw).
    rig.emb.set_default_delay_ms(0);
    let mut hit = false;
    for n in 0..5 {
        let q = format!("capital France the of is what{}", "!".repeat(n));
        let r = rig.ask(&cacheable(&q), &[TENANT]).await;
        if x_cache(&r) == "SEMANTIC" {
            hit = true;
            break;
        }
    }
    assert!(hit, "no semantic hit once the service came back");
}

#[tokio::test]
async fn an_unknown_embeddings_cluster_changes_nothing_but_a_counter() {
    if skip_without_envoy("an_unknown_embeddings_cluster_changes_nothing_but_a_counter") {
        return;
    }
    let chat = MockUpstream::start(MockConfig::named("up"));
    let mut sem = semantic(50);
    sem["embeddings"]["cluster"] = json!("no-such-cluster");
    let envoy = EnvoyBuilder::new()
        .plugin_config(json!({"cache": {"semantic": sem}}))
        .upstream("mock", chat.port())
        .start()
        .expect("envoy");
    for q in [QUESTION, REWORDED] {
        let r = post_json(&envoy.url(CHAT), &cacheable(q), &[TENANT])
            .await
            .expect("call");
        assert_eq!((r.status, x_cache(&r)), (200, "MISS"));
    }
    let n = envoy.wait_for_stat(
        &format!("{FILTER_STATS}llm_filter_cache_embedding_failures_totalreason=.=dispatch;.;"),
        2,
        DEADLINE,
    );
    assert_eq!(n, 2);
    assert_eq!(chat.count("POST", CHAT), 2);
}

#[tokio::test]
async fn the_index_stays_bounded_under_churn() {
    const CONTEXTS: u64 = 2;
    const PER_CONTEXT: u64 = 4;
    let Some(rig) = Rig::start(
        "the_index_stays_bounded_under_churn",
        json!({
            "embeddings": {"cluster": "emb", "model": "e", "timeout_ms": 2_000},
            "max_contexts": CONTEXTS,
            "max_per_context": PER_CONTEXT,
            "max_dimensions": 256
        }),
        json!({"max_entries": 8, "max_entry_bytes": 4096}),
    ) else {
        return;
    };
    // Worst case of this configuration (see the key families of docs/design.md).
    let group_bytes = 8 + PER_CONTEXT * (256 + 86);
    let max_keys = 2 * 8 + 4 + CONTEXTS + 1;
    let max_bytes = 8 * 4096 + 8 * 52 + 64 + CONTEXTS * group_bytes + 16 + 400;
    let gauge = |name: &str| rig.envoy.stat(&format!("{FILTER_STATS}{name}"));
    let mut seen_vectors = 0;
    for n in 0..60u64 {
        // A new tenant every few calls: many contexts over two slots.
        let tenant = format!("Bearer sk-churn-{}", n / 3);
        let r = rig
            .ask(
                &cacheable(&format!("churn question number {n} about topic {}", n * 7)),
                &[("authorization", tenant.as_str())],
            )
            .await;
        assert_eq!(x_cache(&r), "MISS");
        let vectors = gauge("llm_filter_cache_semantic_vectors");
        assert!(vectors <= CONTEXTS * PER_CONTEXT, "{vectors} vectors");
        seen_vectors = seen_vectors.max(vectors);
        let (keys, bytes) = (
            gauge("llm_filter_shared_data_keys"),
            gauge("llm_filter_shared_data_bytes"),
        );
        assert!(keys <= max_keys, "{keys} keys, bound {max_keys}");
        assert!(bytes <= max_bytes, "{bytes} bytes, bound {max_bytes}");
    }
    let stored = rig.wait_stat(
        "llm_filter_cache_semantic_stores_totalresult=.=evicted;.;",
        1,
    );
    assert!(stored >= 1, "full groups evicted");
    assert!(seen_vectors >= PER_CONTEXT, "{seen_vectors}");
    // The census, counted after the churn, stays in its bound: the slots
    // and group slots, the cache's and the index's totals and the layout
    // (empty keys read as absent).
    let least = 8 + CONTEXTS + 3;
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        let keys = gauge("llm_filter_shared_data_keys");
        if keys >= least || Instant::now() > deadline {
            assert!(keys <= max_keys && keys >= least, "{keys}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let bytes = gauge("llm_filter_shared_data_bytes");
    assert!(bytes <= max_bytes && bytes > 0, "{bytes}");
    println!("churn: {seen_vectors} vectors at most, {bytes} bytes of shared data");
}
