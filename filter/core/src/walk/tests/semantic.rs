//! Scenario tests of the semantic cache's steps: a reworded repeat answered
//! from the original's entry, and every way a call does not match.

use std::collections::BTreeMap;

use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

const CONFIG: &str = r#"{"cache":{"ttl_jitter":0,"semantic":{"embeddings":{"cluster":"emb","model":"e5","headers":{"authorization":"Bearer e"},"timeout_ms":40},"threshold":0.9}}}"#;
const PATH: &str = "/v1/chat/completions";
const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;

fn body(question: &str, temperature: &str) -> String {
    format!(
        r#"{{"model":"gpt-4o","temperature":{temperature},"messages":[{{"role":"system","content":"be brief"}},{{"role":"user","content":"{question}"}}]}}"#
    )
}

fn chat(question: &str) -> FakeHost {
    FakeHost::post(PATH)
        .with_header("authorization", "Bearer t1")
        .with_body(&body(question, "0"))
}

fn embedding(v: &[f32]) -> CalloutAnswer {
    let body = serde_json::json!({"object":"list","data":[{"object":"embedding","index":0,"embedding":v}],"model":"e5"});
    CalloutAnswer {
        status: Some(200),
        headers: vec![(":status".into(), "200".into())],
        body: body.to_string().into_bytes(),
    }
}

const V: [f32; 4] = [1.0, 0.2, 0.0, 0.0];
const NEAR: [f32; 4] = [1.0, 0.25, 0.05, 0.0];
const FAR: [f32; 4] = [0.0, 0.1, 1.0, 0.3];

impl World {
    fn counted(&self, name: &str, label: &str, value: &str) -> u64 {
        self.counter(&crate::metrics::name(name, &[(label, value)]))
    }

    /// Headers and whole body of `host`'s request: the call and its step,
    /// with the embeddings callout it sent, if any.
    fn ask(&mut self, host: &mut FakeHost) -> (Call, Step) {
        let (mut call, step) = Call::start(&mut self.env(), host, false).unwrap();
        assert_eq!(step, Step::Pause);
        let size = host.request_body.len();
        let step = call.on_request_body(&mut self.env(), host, size, true);
        (call, step)
    }

    /// A call whose question embeds to `v`, answered upstream with ANSWER.
    fn miss(&mut self, question: &str, v: &[f32]) -> FakeHost {
        let mut host = chat(question);
        let (mut call, step) = self.ask(&mut host);
        assert_eq!(step, Step::Pause, "waits for the embedding");
        assert!(call.holds_request());
        assert_eq!(host.callouts.len(), 1);
        self.now_ms += 7;
        let step = call.answer_callout(&mut self.env(), &mut host, embedding(v));
        assert_eq!(step, Step::Continue, "goes upstream");
        assert!(host.local_reply.is_none());
        let mut host = host.with_response(200, "application/json", ANSWER);
        assert_eq!(
            call.on_response_headers(&mut self.env(), &mut host, false),
            Step::Continue
        );
        host.response_body = ANSWER.as_bytes().to_vec();
        call.on_response_body(&mut self.env(), &mut host, ANSWER.len(), true);
        call.on_log(&mut self.env());
        host
    }
}

fn reply(host: &FakeHost) -> (u32, BTreeMap<String, String>, Vec<u8>) {
    host.local_reply.clone().expect("a local reply")
}

#[test]
fn a_reworded_repeat_is_answered_from_the_originals_entry() {
    let mut w = World::new(CONFIG);
    let host = w.miss("What is the capital of France?", &V);
    let (cluster, headers, sent, timeout) = host.callouts[0].clone();
    assert_eq!((cluster.as_str(), timeout), ("emb", 40));
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(header(":path").as_deref(), Some("/v1/embeddings"));
    assert_eq!(header("authorization").as_deref(), Some("Bearer e"));
    let sent: serde_json::Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(sent["input"], "What is the capital of France?");
    assert_eq!(sent["model"], "e5");
    assert_eq!(host.response("x-cache"), Some("MISS"));
    assert_eq!(
        w.counted("llm_filter_cache_semantic_stores_total", "result", "stored"),
        1
    );
    assert_eq!(w.metrics.gauges["llm_filter_cache_semantic_vectors"], 1);
    assert_eq!(
        w.metrics.histograms["llm_filter_cache_embedding_duration_ms"],
        [7]
    );
    // No vector of the context yet: no similarity sample.
    assert!(!w
        .metrics
        .histograms
        .contains_key("llm_filter_cache_semantic_similarity_permille"));

    w.now_ms += 3_000;
    let mut host = chat("france: capital city?");
    let (mut call, step) = w.ask(&mut host);
    assert_eq!(step, Step::Pause);
    let step = call.answer_callout(&mut w.env(), &mut host, embedding(&NEAR));
    assert_eq!(step, Step::Pause, "answered here");
    let (status, headers, body) = reply(&host);
    assert_eq!(status, 200);
    assert_eq!(body, ANSWER.as_bytes());
    assert_eq!(headers["x-cache"], "SEMANTIC");
    assert_eq!(headers["age"], "3");
    let similarity: f64 = headers["x-cache-similarity"].parse().unwrap();
    assert!(similarity > 0.99 && similarity <= 1.0, "{similarity}");
    assert_eq!(headers["x-cache-similarity"].len(), 5, "three decimals");
    assert_eq!(
        host.header("x-envoy-upstream-rq-timeout-ms"),
        None,
        "never planned"
    );
    call.on_log(&mut w.env());
    assert_eq!(
        w.counted("llm_filter_cache_lookups_total", "result", "semantic"),
        1
    );
    let sims = &w.metrics.histograms["llm_filter_cache_semantic_similarity_permille"];
    assert_eq!(sims.len(), 1);
    assert!(sims[0] > 990);
}

#[test]
fn a_different_question_or_context_never_matches() {
    let mut w = World::new(CONFIG);
    w.miss("What is the capital of France?", &V);
    // Same context, far vector: a miss, and the similarity is recorded.
    let host = w.miss("How do I bake bread?", &FAR);
    assert_eq!(host.response("x-cache"), Some("MISS"));
    let sims = &w.metrics.histograms["llm_filter_cache_semantic_similarity_permille"];
    assert!(sims[0] < 300, "{sims:?}");
    // The same vector in another context: another tenant, model, system
    // prompt or temperature.
    let question = body("capital of France?", "0");
    let others = [
        ("Bearer other", question.clone()),
        ("Bearer t1", question.replace("gpt-4o", "gpt-4o-mini")),
        ("Bearer t1", question.replace("be brief", "be kind")),
        ("Bearer t1", body("capital of France?", "0.5")),
        (
            "Bearer t1",
            question.replace(r#""temperature":0"#, r#""temperature":0,"max_tokens":9"#),
        ),
    ];
    let config = CONFIG.replace(r#""ttl_jitter":0"#, r#""ttl_jitter":0,"max_temperature":1"#);
    let mut w = World::new(&config);
    w.miss("What is the capital of France?", &V);
    for (auth, other) in others {
        let mut host = FakeHost::post(PATH)
            .with_header("authorization", auth)
            .with_body(&other);
        let (mut call, step) = w.ask(&mut host);
        assert_eq!(step, Step::Pause);
        let step = call.answer_callout(&mut w.env(), &mut host, embedding(&V));
        assert_eq!(step, Step::Continue, "{auth} {other}");
        assert!(host.local_reply.is_none());
        call.on_log(&mut w.env());
    }
    assert_eq!(
        w.counted("llm_filter_cache_lookups_total", "result", "semantic"),
        0
    );
    assert!(!w
        .metrics
        .histograms
        .contains_key("llm_filter_cache_semantic_similarity_permille"));
}

#[test]
fn a_failed_or_late_embedding_is_a_plain_miss() {
    let mut w = World::new(CONFIG);
    w.miss("What is the capital of France?", &V);
    for (answer, reason) in [
        (CalloutAnswer::default(), "timeout"),
        (
            CalloutAnswer {
                status: Some(503),
                ..embedding(&NEAR)
            },
            "status",
        ),
        (
            CalloutAnswer {
                body: b"{}".to_vec(),
                ..embedding(&NEAR)
            },
            "invalid",
        ),
    ] {
        let mut host = chat("france: capital city?");
        let (mut call, _) = w.ask(&mut host);
        let step = call.answer_callout(&mut w.env(), &mut host, answer);
        assert_eq!(step, Step::Continue, "{reason}");
        assert!(host.local_reply.is_none());
        assert_eq!(
            w.counted(
                "llm_filter_cache_embedding_failures_total",
                "reason",
                reason
            ),
            1
        );
        call.on_log(&mut w.env());
    }
    assert_eq!(
        w.counted("llm_filter_cache_lookups_total", "result", "miss"),
        4
    );
}

#[test]
fn a_streamed_repeat_is_replayed_as_sse() {
    let mut w = World::new(CONFIG);
    w.miss("What is the capital of France?", &V);
    let mut host = FakeHost::post(PATH)
        .with_header("authorization", "Bearer t1")
        .with_body(
            &body("capital of france", "0")
                .replace(r#""temperature":0"#, r#""temperature":0,"stream":true"#),
        );
    let (mut call, _) = w.ask(&mut host);
    call.answer_callout(&mut w.env(), &mut host, embedding(&NEAR));
    let (_, headers, body) = reply(&host);
    assert_eq!(headers["x-cache"], "SEMANTIC");
    assert_eq!(headers["content-type"], "text/event-stream");
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("Paris.") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
}

#[test]
fn calls_that_do_not_take_part_send_no_callout() {
    let mut w = World::new(CONFIG);
    for mut host in [
        chat("What is the capital of France?").with_header("cache-control", "no-cache"),
        chat("What is the capital of France?").with_header("cache-control", "no-store"),
        FakeHost::post("/v1/embeddings")
            .with_header("authorization", "Bearer t1")
            .with_body(r#"{"model":"e5","input":"hello"}"#),
        FakeHost::post(PATH)
            .with_header("authorization", "Bearer t1")
            .with_body(&body("x", "0.7")),
    ] {
        let (call, step) = w.ask(&mut host);
        assert_eq!(step, Step::Continue);
        assert!(host.callouts.is_empty());
        call.on_log(&mut w.env());
    }
    // Off unless configured.
    let mut w = World::new(r#"{"cache":{}}"#);
    let mut host = chat("What is the capital of France?");
    let (_, step) = w.ask(&mut host);
    assert_eq!(step, Step::Continue);
    assert!(host.callouts.is_empty());
}

#[test]
fn an_answer_that_left_the_exact_cache_is_not_served() {
    let mut w = World::new(CONFIG);
    w.miss("What is the capital of France?", &V);
    // Empty every exact slot: the vector still points at its key.
    for i in 0..w.config.cache.max_entries {
        let key = crate::cache::store::slot_key(i);
        if w.store.get(&key).unwrap().value.is_some() {
            crate::host::SharedStore::set(&w.store, &key, b"", None).unwrap();
        }
    }
    let mut host = chat("france: capital city?");
    let (mut call, _) = w.ask(&mut host);
    let step = call.answer_callout(&mut w.env(), &mut host, embedding(&NEAR));
    assert_eq!(step, Step::Continue);
    assert!(host.local_reply.is_none());
}

#[test]
fn a_refused_callout_goes_on_at_once() {
    let mut w = World::new(CONFIG);
    let mut host = chat("What is the capital of France?");
    host.refuse_callouts = true;
    let (call, step) = w.ask(&mut host);
    assert_eq!(step, Step::Continue);
    assert!(!call.holds_request());
    assert_eq!(
        w.counted(
            "llm_filter_cache_embedding_failures_total",
            "reason",
            "dispatch"
        ),
        1
    );
}

#[test]
fn after_a_miss_an_identical_call_in_flight_is_waited_for() {
    let mut w = World::new(CONFIG);
    let mut first = chat("What is the capital of France?");
    let (mut lead, _) = w.ask(&mut first);
    assert_eq!(
        lead.answer_callout(&mut w.env(), &mut first, embedding(&V)),
        Step::Continue,
        "leads the key upstream"
    );
    let mut twin = chat("What is the capital of France?");
    let (mut call, step) = w.ask(&mut twin);
    assert_eq!(step, Step::Pause);
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut twin, embedding(&V)),
        Step::Pause
    );
    assert!(call.is_parked(), "waits for the leader's entry");
    assert!(!call.holds_request());
    assert!(twin.local_reply.is_none());
}
