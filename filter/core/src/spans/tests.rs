use super::*;
use crate::config::ConfigError;
use crate::host::MemoryMetrics;
use crate::summary::Try;
use crate::trace_context::TraceParent;
use crate::usage::Usage;
use crate::walk::fake::{FakeHost, World};
use crate::walk::Call;

fn otlp(json: &str) -> OtlpConfig {
    OtlpConfig::compile(ConfigError::from_json(json.as_bytes()).unwrap()).unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn ids(parent: Option<[u8; 8]>) -> SpanIds {
    SpanIds {
        trace_id: [7; 16],
        span_id: [9; 8],
        parent_id: parent,
        flags: 1,
    }
}

#[test]
fn a_span_carries_the_genai_attributes_and_the_filters_decisions() {
    let call = CallSummary {
        group: Some("b"),
        served: Try {
            usage: Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 5,
                cached_tokens: 4,
                ..Usage::default()
            }),
            cluster: Some("openai"),
            attempts: Some(2),
            budget_ms: 30_000,
            started_ms: 1_000,
            ended_ms: 1_250,
            ..Try::ended(End::Answered(200))
        },
        ..CallSummary::ended(End::Answered(200))
    };
    let details = Details {
        requested_model: Some("gpt-4o"),
        response_model: Some("gpt-4o-2024-08-06"),
        max_tokens: Some(100),
        temperature: Some(0.0),
        cache: Some("MISS"),
        hedge: Some("won"),
        finish_reasons: &["stop"],
        ..Details::default()
    };
    let span = encode(&ids(Some([3; 8])), &call, &details);
    for key in [
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "gen_ai.response.finish_reasons",
        "gen_ai.request.max_tokens",
        "gen_ai.request.temperature",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "server.address",
        "llm_filter.priority",
        "llm_filter.cache",
        "llm_filter.retries",
        "llm_filter.hedge",
        "llm_filter.ab.group",
        "llm_filter.budget_ms",
    ] {
        assert!(contains(&span, key.as_bytes()), "{key}");
    }
    assert!(
        contains(&span, b"chat gpt-4o"),
        "named by operation and model"
    );
    assert!(!contains(&span, b"error.type"));
    // The parent's id follows the span's own.
    assert!(contains(&span, &[0x22, 8, 3, 3, 3, 3, 3, 3, 3, 3]));
    // A failure says what failed, and a long model name is cut.
    let long = "m".repeat(MAX_STRING_BYTES * 2);
    let failed = CallSummary {
        api: Dialect::Messages,
        ..CallSummary::ended(End::TimedOut(504))
    };
    let span = encode(
        &ids(None),
        &failed,
        &Details {
            requested_model: Some(&long),
            ..Details::default()
        },
    );
    assert!(contains(&span, b"error.type") && contains(&span, b"timeout"));
    assert!(contains(&span, b"anthropic"));
    assert!(span.len() < 3 * MAX_STRING_BYTES + 512, "{}", span.len());
}

#[test]
fn a_priced_call_says_its_cost_and_the_caches_saving() {
    let raw = serde_json::from_str(
        r#"{"m": {"input": 3, "cached_input": 0.3, "cache_write": 3.75, "cache_write_1h": 6, "output": 15}}"#,
    )
    .unwrap();
    let prices = crate::pricing::config::compile(raw, Default::default(), None).unwrap();
    // Anthropic's usage: 1,000 plain, 10,000 read, 2,000 written for five
    // minutes and 1,000 for an hour; 100 output, 40 of them thinking.
    let call = CallSummary {
        api: Dialect::Messages,
        served: Try {
            usage: Some(Usage {
                prompt_tokens: 14_000,
                cached_tokens: 10_000,
                cache_write_tokens: 3_000,
                cache_write_1h_tokens: 1_000,
                completion_tokens: 100,
                reasoning_tokens: 40,
            }),
            ..Try::ended(End::Answered(200))
        },
        ..CallSummary::ended(End::Answered(200))
    };
    let details = Details {
        price: prices.get(Some("m")),
        ..Details::default()
    };
    let span = encode(&ids(None), &call, &details);
    for key in [
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_creation.input_tokens",
        "gen_ai.usage.reasoning.output_tokens",
        "llm_filter.cost",
        "llm_filter.prompt_cache.saved",
    ] {
        assert!(contains(&span, key.as_bytes()), "{key}");
    }
    let r: serde_json::Value =
        serde_json::from_slice(&record::record(None, &call, &details)).unwrap();
    // 1,000 × 3 + 10,000 × 0.3 + 2,000 × 3.75 + 1,000 × 6 + 100 × 15 per million.
    let cost = r["cost"].as_f64().unwrap();
    assert!((cost - 0.021).abs() < 1e-9, "{cost}");
    // 10,000 × 2.70 saved, less 2,000 × 0.75 and 1,000 × 3 of premium.
    let saved = r["prompt_cache_saved"].as_f64().unwrap();
    assert!((saved - 0.0225).abs() < 1e-9, "{saved}");
    assert_eq!(
        (
            r["cache_creation_tokens"].clone(),
            r["reasoning_tokens"].clone()
        ),
        (3_000.into(), 40.into())
    );
    // Unpriced: no cost is said.
    let unpriced = record::record(None, &call, &Details::default());
    assert!(!contains(&unpriced, b"\"cost\""));
    assert!(!contains(
        &encode(&ids(None), &call, &Details::default()),
        b"llm_filter.cost"
    ));
}

#[test]
fn the_queue_is_bounded_and_sends_one_batch_at_a_time() {
    let cfg = otlp(r#"{"cluster":"otel","batch_size":2,"max_queue":3,"interval_ms":1000}"#);
    let (mut q, mut m) = (Queue::default(), MemoryMetrics::default());
    assert!(q.due(&cfg, &mut m, 0).is_none());
    q.push(&cfg, &mut m, vec![1]);
    assert!(q.due(&cfg, &mut m, 500).is_none(), "neither full nor old");
    let e = q.due(&cfg, &mut m, 1_000).expect("old enough");
    assert_eq!((e.spans, e.cluster.as_str()), (1, "otel"));
    assert!(e
        .headers
        .contains(&("content-type".into(), "application/x-protobuf".into())));
    assert!(e.headers.contains(&(":path".into(), "/v1/traces".into())));
    for i in 0..5 {
        q.push(&cfg, &mut m, vec![i]);
    }
    assert_eq!(q.len(), 3, "two dropped");
    assert!(q.due(&cfg, &mut m, 1_001).is_none(), "one batch in flight");
    q.finished(&mut m, Some(200));
    let e = q
        .due(&cfg, &mut m, 1_002)
        .expect("a full batch goes at once");
    assert_eq!(e.spans, 2);
    q.finished(&mut m, None);
    let count = |m: &MemoryMetrics, r: &str| {
        m.counters
            .get(&names::name(names::SPANS, &[("result", r)]))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        (
            count(&m, "queued"),
            count(&m, "dropped"),
            count(&m, "exported"),
            count(&m, "failed")
        ),
        (4, 2, 1, 2)
    );
    assert_eq!(m.gauges[names::SPANS_QUEUED], 1);
}

const CHAT: &str = r#"{"model":"gpt-4o","temperature":0.2,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"id":"x","model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;

/// A chat call through the walk up to its trip upstream.
fn requested(w: &mut World, body: &str, traceparent: Option<&str>) -> (Call, FakeHost) {
    let mut host = FakeHost::post("/v1/chat/completions").with_body(body);
    if let Some(tp) = traceparent {
        host = host.with_header("traceparent", tp);
    }
    let (mut call, _) = Call::start(&mut w.env(), &mut host, false).unwrap();
    let size = host.request_body.len();
    call.on_request_body(&mut w.env(), &mut host, size, true);
    (call, host)
}

/// The upstream's JSON `answer` to the call, headers and body.
fn answered(w: &mut World, call: &mut Call, host: FakeHost, answer: &str) -> FakeHost {
    let mut host = host.with_response(200, "application/json", answer);
    call.on_response_headers(&mut w.env(), &mut host, false);
    let size = host.response_body.len();
    call.on_response_body(&mut w.env(), &mut host, size, true);
    host
}

/// One call through the walk; its traceparent upstream and the spans queued.
fn one_call(w: &mut World, traceparent: Option<&str>) -> (TraceParent, usize) {
    let (mut call, host) = requested(w, CHAT, traceparent);
    let sent = TraceParent::parse(host.header("traceparent").unwrap()).unwrap();
    answered(w, &mut call, host, ANSWER);
    call.on_log(&mut w.env());
    (sent, w.spans.len())
}

/// A chat answer the cache stores.
const STORED: &str = r#"{"id":"x","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;

#[test]
fn the_record_is_set_before_envoy_logs_each_kind_of_answer() {
    let mut w = World::new(r#"{"access_log":{"enabled":true}}"#);
    let record = |host: &FakeHost| -> serde_json::Value {
        serde_json::from_slice(&host.properties[record::PROPERTY]).unwrap()
    };
    // Answered by the upstream: set at the answer's end.
    let body = r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
    let (mut call, host) = requested(&mut w, body, None);
    let mut host = host.with_response(200, "application/json", STORED);
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert!(host.properties.is_empty(), "not before the answer ends");
    let size = host.response_body.len();
    call.on_response_body(&mut w.env(), &mut host, size, true);
    let r = record(&host);
    // A build without the cache says nothing of it.
    let miss = crate::build::CACHE.then_some("MISS");
    assert_eq!(
        (r["status"].clone(), r["cache"].clone()),
        (200.into(), miss.into())
    );
    assert_eq!(
        (r["input_tokens"].clone(), r["output_tokens"].clone()),
        (3.into(), 1.into())
    );
    assert_eq!(r["requested_model"], "gpt-4o");
    assert_eq!(r["trace_id"].as_str().map(str::len), Some(32));
    call.on_log(&mut w.env());
    // Answered by the filter (a cache hit): set before the reply goes.
    #[cfg(feature = "cache")]
    {
        let (call, host) = requested(&mut w, body, None);
        assert!(host.local_reply.is_some());
        let r = record(&host);
        assert_eq!(
            (r["status"].clone(), r["cache"].clone()),
            (200.into(), "HIT".into())
        );
        call.on_log(&mut w.env());
    }
    // Off by default: nothing set.
    let mut w = World::new("{}");
    let (mut call, host) = requested(&mut w, body, None);
    let host = answered(&mut w, &mut call, host, STORED);
    assert!(host.properties.is_empty());
}

#[test]
fn the_queue_is_bounded_in_bytes_too() {
    let cfg = otlp(r#"{"cluster":"otel","batch_size":2,"max_queue":100,"max_queue_bytes":65536}"#);
    let (mut q, mut m) = (Queue::default(), MemoryMetrics::default());
    for _ in 0..3 {
        q.push(&cfg, &mut m, vec![0; 30_000]);
    }
    assert_eq!(
        (q.len(), q.bytes()),
        (2, 60_000),
        "the third passes the bound"
    );
    let e = q.due(&cfg, &mut m, 0).expect("a full batch");
    assert_eq!((e.spans, q.bytes()), (2, 0));
    q.finished(&mut m, Some(200));
    q.push(&cfg, &mut m, vec![0; 70_000]);
    assert!(q.is_empty(), "a span larger than the bound is dropped");
}

/// The record a call left, parsed.
fn record_of(host: &FakeHost) -> serde_json::Value {
    serde_json::from_slice(&host.properties[record::PROPERTY]).unwrap()
}

const CAPTURING: &str = r#"{"access_log":{"enabled":true},"tracing":{"otlp":{"cluster":"otel"},"capture":{"prompt":true,"completion":true,"redact":["tok-*"]}}}"#;

/// The spans exported over OTLP and what they capture (the `spans`
/// feature).
#[cfg(feature = "spans")]
mod exported {
    use super::*;

    #[test]
    fn a_cache_hits_span_captures_the_prompt_only() {
        let mut w = World::new(CAPTURING);
        let body =
            r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
        let (mut call, host) = requested(&mut w, body, None);
        answered(&mut w, &mut call, host, STORED);
        call.on_log(&mut w.env());
        let (call, host) = requested(&mut w, body, None);
        assert!(host.local_reply.is_some());
        let r = record_of(&host);
        assert_eq!(r["cache"], "HIT");
        assert!(r.get("input_messages").is_some() && r.get("output_messages").is_none());
        call.on_log(&mut w.env());
    }

    #[test]
    fn a_streamed_completion_is_captured_from_the_one_reading() {
        let mut w = World::new(CAPTURING);
        let body =
            r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let (mut call, host) = requested(&mut w, body, None);
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\\"you\\\"\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        );
        let mut host = host.with_response(200, "text/event-stream", stream);
        call.on_response_headers(&mut w.env(), &mut host, false);
        let size = host.response_body.len();
        call.on_response_body(&mut w.env(), &mut host, size, true);
        let r = record_of(&host);
        assert_eq!(
            r["output_messages"],
            serde_json::json!([{"role":"assistant","parts":[{"type":"text","content":"Hello \"you\""}],"finish_reason":"stop"}])
        );
        assert_eq!(r["output_tokens"], 2, "the usage is read as before");
    }

    #[test]
    fn captures_are_off_by_default() {
        let mut w =
            World::new(r#"{"access_log":{"enabled":true},"tracing":{"otlp":{"cluster":"otel"}}}"#);
        let (mut call, host) = requested(&mut w, CHAT, None);
        let host = answered(&mut w, &mut call, host, STORED);
        call.on_log(&mut w.env());
        let r = record_of(&host);
        assert!(r.get("input_messages").is_none() && r.get("output_messages").is_none());
        let cfg = w.config.otlp.clone().unwrap();
        let batch = w.spans.due(&cfg, &mut w.metrics, u64::MAX).unwrap().body;
        assert!(!contains(&batch, b"gen_ai.input.messages"));
        assert!(!contains(&batch, b"gen_ai.output.messages"));
    }

    #[test]
    fn the_prompt_and_completion_are_captured_redacted_on_the_span_and_the_record() {
        let mut w = World::new(CAPTURING);
        let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi from bob@example.com with tok-123"}]}"#;
        let (mut call, host) = requested(&mut w, body, None);
        let host = answered(&mut w, &mut call, host, STORED);
        call.on_log(&mut w.env());
        let r = record_of(&host);
        assert_eq!(
            r["input_messages"],
            serde_json::json!([{"role":"user","parts":[{"type":"text","content":"hi from [REDACTED] with [REDACTED]"}]}])
        );
        assert_eq!(
            r["output_messages"],
            serde_json::json!([{"role":"assistant","parts":[{"type":"text","content":"yo"}],"finish_reason":"stop"}])
        );
        assert!(r.get("capture_truncated").is_none());
        let cfg = w.config.otlp.clone().unwrap();
        let batch = w.spans.due(&cfg, &mut w.metrics, u64::MAX).unwrap().body;
        assert!(contains(&batch, b"gen_ai.input.messages"));
        assert!(contains(&batch, b"gen_ai.output.messages"));
        assert!(contains(&batch, b"hi from [REDACTED] with [REDACTED]"));
        assert!(!contains(&batch, b"bob@example.com"));
    }

    #[test]
    fn the_span_queued_is_the_one_written_upstream_and_sampling_follows_the_parent() {
        let mut w = World::new(r#"{"tracing":{"otlp":{"cluster":"otel"}}}"#);
        let caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let (sent, queued) = one_call(&mut w, Some(caller));
        assert_eq!(queued, 1);
        let cfg = w.config.otlp.clone().unwrap();
        let batch = w.spans.due(&cfg, &mut w.metrics, u64::MAX).unwrap().body;
        assert!(contains(&batch, &sent.trace_id), "the caller's trace");
        assert!(
            contains(&batch, &sent.parent_id),
            "the span written upstream"
        );
        assert!(
            contains(&batch, &[0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]),
            "its parent"
        );
        assert!(contains(&batch, b"gpt-4o-2024-08-06"));
        w.spans.finished(&mut w.metrics, Some(200));
        // The caller did not sample its trace: no span.
        let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        assert_eq!(one_call(&mut w, Some(unsampled)).1, 0);
        // New traces at a ratio of 0: none sampled, flags 00 upstream.
        let mut w = World::new(r#"{"tracing":{"otlp":{"cluster":"otel","sample_ratio":0}}}"#);
        let (sent, queued) = one_call(&mut w, None);
        assert_eq!((queued, sent.flags), (0, 0));
        // Without otlp nothing is queued and new traces stay sampled.
        let mut w = World::new("{}");
        let (sent, queued) = one_call(&mut w, None);
        assert_eq!((queued, sent.flags), (0, 1));
    }
}
