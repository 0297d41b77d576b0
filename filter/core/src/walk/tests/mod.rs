//! Scenario tests of the walk: the whole walk against a fake host and in-memory
//! shared state; the general ones here, one file per step beside them.

use crate::budget::breaker;
use crate::routing::health;
use crate::walk::fake::{Callout, FakeHost, World};
use crate::walk::*;
use crate::{budget, load};

mod affinity;
mod cache;
mod credentials;
mod degrade;
mod dialects;
mod estimate;
mod failover;
mod group;
mod guard;
mod guard_service;
mod identity;
mod keys;
mod limits;
mod phases;
mod profile;
mod prompt_cache;
mod semantic;
mod shape;
mod waits;

impl World {
    /// Runs a request through to the upstream; returns the call, what the
    /// upstream would see, and the step of the last request callback.
    fn request(&mut self, host: &mut FakeHost) -> Option<(Call, Step)> {
        let has_body = !host.request_body.is_empty();
        let (mut call, step) = Call::start(&mut self.env(), host, !has_body)?;
        if !has_body {
            return Some((call, step));
        }
        let size = host.request_body.len();
        let step = call.on_request_body(&mut self.env(), host, size, true);
        Some((call, step))
    }

    fn respond(&mut self, call: &mut Call, host: &mut FakeHost) {
        call.on_response_headers(&mut self.env(), host, false);
        let size = host.response_body.len();
        call.on_response_body(&mut self.env(), host, size, true);
    }
}

const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;

#[test]
fn non_llm_requests_pass_untouched() {
    let mut w = World::new("{}");
    for (method, path) in [
        ("GET", "/v1/models"),
        ("POST", "/v1/other"),
        ("GET", "/v1/chat/completions"),
    ] {
        let mut host = FakeHost::new()
            .with_header(":method", method)
            .with_header(":path", path);
        let before = host.request_headers.clone();
        assert!(w.request(&mut host).is_none());
        assert_eq!(host.request_headers, before);
    }
}

#[test]
fn a_plain_call_is_tagged_planned_and_counted() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-priority", "p0")
        .with_header("baggage", "a=1")
        .with_body(CHAT);
    let (mut call, step) = w.request(&mut host).unwrap();
    assert_eq!(step, Step::Continue);
    assert_eq!(host.header("x-request-priority"), Some("P0"));
    assert_eq!(host.header("baggage"), Some("a=1,priority=P0"));
    let tp = host.header("traceparent").unwrap().to_string();
    assert!(trace_context::TraceParent::parse(&tp).is_some());
    assert_eq!(host.header("x-envoy-upstream-rq-timeout-ms"), Some("60000"));
    assert_eq!(host.header("idempotency-key").map(str::len), Some(32));

    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    assert_eq!(host.response("x-trace-id"), Some(&tp[3..35]));
    w.now_ms += 250;
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P0;.;model=.=gpt-4o;.;outcome=.=success;.;api=.=chat;.;"
        ),
        1
    );
    assert_eq!(
        w.counter(
            "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=input;.;api=.=chat;.;"
        ),
        3
    );
    assert_eq!(
        w.metrics.histograms["gen_ai_client_operation_duration_msmodel=.=gpt-4o;.;api=.=chat;.;"],
        [250]
    );
}

#[test]
fn a_client_idempotency_key_is_kept() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("idempotency-key", "mine")
        .with_body(CHAT);
    w.request(&mut host).unwrap();
    assert_eq!(host.header("idempotency-key"), Some("mine"));
}

#[test]
fn a_client_cannot_outgrow_the_plan_with_router_headers() {
    let mut w = World::new(r#"{"budget": {"retry_ratio": 0}}"#);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-timeout-ms", "3000")
        .with_header("x-envoy-upstream-rq-timeout-ms", "600000")
        .with_header("x-envoy-upstream-rq-per-try-timeout-ms", "100")
        .with_header("x-envoy-max-retries", "10")
        .with_header("x-envoy-retry-on", "5xx")
        .with_body(CHAT);
    w.request(&mut host).unwrap();
    assert_eq!(host.header("x-envoy-upstream-rq-timeout-ms"), Some("3000"));
    assert_eq!(host.header("x-envoy-upstream-rq-per-try-timeout-ms"), None);
    assert_eq!(host.header("x-envoy-max-retries"), Some("0"));
    assert_eq!(host.header("x-envoy-retry-on"), None);
}

const ROUTED: &str = r#"{
  "routing": {
    "models": {
      "gpt-4o": [{"cluster": "azure", "model": "gpt-4o-2024-08-06"}],
      "small": [{"cluster": "vllm"}]
    },
    "rules": [{"when": {"model": "auto"}, "model": "small"}]
  }
}"#;

#[test]
fn a_routed_model_gets_its_cluster_and_name() {
    let mut w = World::new(ROUTED);
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Pause, "the body is held to route on it");
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), &mut host, size, true);
    assert_eq!(step, Step::Continue);
    assert_eq!(host.header("x-llm-cluster"), Some("azure"));
    assert_eq!(host.route_cache_cleared, 1);
    let body = String::from_utf8(host.request_body.clone()).unwrap();
    assert_eq!(body, CHAT.replace("gpt-4o", "gpt-4o-2024-08-06"));
    assert_eq!(
        host.header("content-length"),
        Some(body.len().to_string().as_str())
    );

    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    assert_eq!(host.response("x-llm-cluster"), Some("azure"));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=azure;.;outcome=.=success;.;"),
        1
    );
    assert!(health::read(&w.store, "azure").is_some());
}

#[test]
fn admission_takes_what_routing_read_of_the_chosen_cluster() {
    let mut w =
        World::new(r#"{"routing":{"models":{"gpt-4o":[{"cluster":"a"},{"cluster":"b"}]}}}"#);
    // Both clusters have a history: a typical latency for the plan to read.
    let done = health::CallSample {
        result: health::CallResult::Status(200),
        latency_ms: 800,
        ttft_ms: Some(100),
        streamed: false,
        output_tokens: None,
    };
    for cluster in ["a", "b"] {
        health::record_outcome(&w.store, &w.config.routing, cluster, &done, w.now_ms).unwrap();
    }
    let health_reads = |w: &World, c: &str| w.store.reads(&health::key(c));
    let before = [health_reads(&w, "a"), health_reads(&w, "b")];
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    w.request(&mut host).unwrap();
    let chosen = host.header("x-llm-cluster").unwrap().to_string();
    let before = before[usize::from(chosen == "b")];
    // The window once (routing's weighing; admission takes it over), the
    // health twice (the weighing, then the in-flight count's write).
    assert_eq!(w.store.reads(&breaker::key(&chosen)), 1);
    assert_eq!(health_reads(&w, &chosen) - before, 2);
    // The plan still saw the cluster's typical latency.
    assert!(host.header("x-envoy-upstream-rq-timeout-ms").is_some());
}

#[test]
fn rules_pick_the_model_and_unknown_models_pass() {
    let mut w = World::new(ROUTED);
    let mut host =
        FakeHost::post("/v1/chat/completions").with_body(&CHAT.replace("gpt-4o", "auto"));
    w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), Some("vllm"));
    assert!(String::from_utf8_lossy(&host.request_body).contains(r#""model":"small""#));

    let mut host =
        FakeHost::post("/v1/chat/completions").with_body(&CHAT.replace("gpt-4o", "other"));
    w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), None);
    assert_eq!(host.route_cache_cleared, 0);
    assert_eq!(
        host.request_body,
        CHAT.replace("gpt-4o", "other").as_bytes()
    );
}

#[test]
fn a_large_body_is_not_held() {
    let mut w = World::new(
        r#"{"max_body_bytes": 10, "routing": {"models": {"gpt-4o": [{"cluster": "a"}]}}}"#,
    );
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (_, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Continue);
    assert_eq!(host.header("x-llm-cluster"), None);
}

/// Drives the default breaker into the reject tier with timed-out calls.
fn overload(w: &mut World) {
    for _ in 0..40 {
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("x-request-priority", "P0")
            .with_body(CHAT);
        let (mut call, _) = w.request(&mut host).unwrap();
        let mut host = host.with_response(504, "text/plain", "upstream request timeout");
        // What Envoy 1.40's router says of its own global timeout.
        host.code_details = Some("response_timeout".into());
        w.respond(&mut call, &mut host);
        assert!(String::from_utf8_lossy(&host.response_body).contains("\"error\""));
        assert_eq!(host.response("content-type"), Some("application/json"));
        assert_eq!(host.response("content-length"), None);
        call.on_log(&mut w.env());
        w.now_ms += 10;
    }
}

#[test]
fn an_overloaded_backend_refuses_low_priority_but_not_p0() {
    let mut w = World::new(r#"{"budget": {"probe_fraction": 0}}"#);
    overload(&mut w);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-priority", "P2")
        .with_body(CHAT);
    let (call, step) = w.request(&mut host).unwrap();
    assert_eq!(step, Step::Pause);
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 503);
    assert!(headers.contains_key("retry-after"));
    assert!(headers.contains_key("x-trace-id"));
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(body["error"]["code"].is_string());
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P2;.;model=.=gpt-4o;.;outcome=.=refused;.;api=.=chat;.;"
        ),
        1
    );

    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-priority", "P0")
        .with_body(CHAT);
    let (_, step) = w.request(&mut host).unwrap();
    assert_eq!(step, Step::Continue);
    assert!(host.local_reply.is_none());
}

#[test]
fn failed_calls_without_an_attempt_count_spend_the_retry_budget() {
    // The route does not report `x-envoy-attempt-count`: a failed call is
    // taken to have used the retries it was planned, so a failing backend
    // stops being retried once the window's retries pass `retry_ratio`.
    let mut w = World::new(r#"{"budget": {"min_calls": 5}}"#);
    let mut planned = Vec::new();
    for _ in 0..12 {
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("x-request-priority", "P0")
            .with_body(CHAT);
        let (mut call, _) = w.request(&mut host).unwrap();
        planned.push(host.header("x-envoy-max-retries").unwrap_or("").to_string());
        let mut host = host.with_response(503, "application/json", "{}");
        w.respond(&mut call, &mut host);
        call.on_log(&mut w.env());
        w.now_ms += 10;
    }
    // Five calls warm the window up with two retries each; ten retries over
    // five to twelve calls is far above 0.2 of them.
    assert_eq!(planned[..5], ["2"; 5], "{planned:?}");
    assert_eq!(planned[5..], ["0"; 7], "{planned:?}");
    assert_eq!(
        w.counter("llm_filter_budget_retry_budget_spent_totalllm_cluster=.=default;.;"),
        7
    );
}

#[test]
fn a_budget_spent_before_forwarding_is_answered_504() {
    let mut w = World::new(r#"{"routing": {"models": {"gpt-4o": [{"cluster": "a"}]}}}"#);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-timeout-ms", "100")
        .with_body(CHAT);
    let (mut call, _) = Call::start(&mut w.env(), &mut host, false).unwrap();
    w.now_ms += 150;
    let size = host.request_body.len();
    assert_eq!(
        call.on_request_body(&mut w.env(), &mut host, size, true),
        Step::Pause
    );
    assert_eq!(host.local_reply.as_ref().unwrap().0, 504);
}

#[test]
fn a_broken_body_passes_through() {
    let mut w = World::new(ROUTED);
    let mut host = FakeHost::post("/v1/chat/completions").with_body("{not json");
    let (_, step) = w.request(&mut host).unwrap();
    assert_eq!(step, Step::Continue);
    assert_eq!(host.request_body, b"{not json");
    assert_eq!(host.header("x-llm-cluster"), None);
}

#[test]
fn a_body_never_delivered_is_let_go_by_the_watchdog() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Pause);
    assert!(call.is_parked());
    w.now_ms += BODY_WATCHDOG_MS / 2;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Wait);
    w.now_ms += BODY_WATCHDOG_MS;
    assert_eq!(host.header("x-envoy-upstream-rq-timeout-ms"), None);
    assert!(!call.body_not_delivered());
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Resume);
    assert!(!call.is_parked());
    assert!(call.body_not_delivered(), "the worker holds no more bodies");
    // It goes on as a call without its body: with Envoy's timeout from the
    // budget, as the worker's next calls.
    assert!(
        host.header("x-envoy-upstream-rq-timeout-ms").is_some(),
        "{:?}",
        host.request_headers
    );
    assert_eq!(
        w.counter("llm_filter_internal_errors_totalreason=.=body_not_delivered;.;"),
        1
    );
    // The body then streams through untouched.
    let size = host.request_body.len();
    assert_eq!(
        call.on_request_body(&mut w.env(), &mut host, size, true),
        Step::Continue
    );
}

#[test]
fn a_streamed_body_is_read_only_while_its_copy_is_kept() {
    let mut w = World::new("{}");
    // No content-length: the body streams through, copied up to its bound.
    let mut host = FakeHost::post("/v1/chat/completions");
    let (mut call, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Continue);
    let chunk = 256 * 1024;
    host.request_body = vec![b' '; chunk];
    for _ in 0..16 {
        let step = call.on_request_body(&mut w.env(), &mut host, chunk, false);
        assert_eq!(step, Step::Continue);
    }
    // 1 MiB kept in 4 chunks, the 5th overflows it: 4 MiB left unread.
    assert_eq!(host.body_reads.get(), 5);
}

#[test]
fn a_delivered_body_unparks() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, _) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(
        call.on_request_body(&mut w.env(), &mut host, 5, false),
        Step::Pause
    );
    assert!(!call.is_parked());
}

#[test]
fn a_client_cluster_header_never_picks_the_cluster() {
    // Unrouted model: the call goes to the default route.
    let mut w = World::new(ROUTED);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-llm-cluster", "internal-admin")
        .with_body(&CHAT.replace("gpt-4o", "other"));
    w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), None);
    assert_eq!(host.route_cache_cleared, 1);
    // Routed model: the filter's choice replaces the client's.
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-llm-cluster", "internal-admin")
        .with_body(CHAT);
    w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), Some("azure"));
    // Without routing, and on requests that are no LLM call at all, the
    // client's header is removed all the same: no client steers a request.
    for (config, method, path) in [
        ("{}", "POST", "/v1/chat/completions"),
        ("{}", "GET", "/v1/models"),
        (ROUTED, "GET", "/v1/models"),
        (ROUTED, "DELETE", "/anything"),
    ] {
        let mut w = World::new(config);
        let mut host = FakeHost::new()
            .with_header(":method", method)
            .with_header(":path", path)
            .with_header("x-llm-cluster", "mine")
            .with_body(CHAT);
        let _ = Call::start(&mut w.env(), &mut host, false);
        assert_eq!(
            host.header("x-llm-cluster"),
            None,
            "{config} {method} {path}"
        );
        assert_eq!(host.route_cache_cleared, 1, "{config} {method} {path}");
    }
    // No header, nothing to clear.
    let mut w = World::new("{}");
    let mut host = FakeHost::new()
        .with_header(":method", "GET")
        .with_header(":path", "/v1/models");
    assert!(Call::start(&mut w.env(), &mut host, true).is_none());
    assert_eq!(host.route_cache_cleared, 0);
}

#[test]
fn a_client_that_leaves_teaches_routing_nothing() {
    let mut w = World::new(ROUTED);
    for _ in 0..5 {
        let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
        let (call, _) = w.request(&mut host).unwrap();
        assert_eq!(
            w.metrics
                .gauges
                .get("llm_filter_routing_in_flightllm_cluster=.=azure;.;"),
            Some(&1)
        );
        // No response at all: the client went away.
        call.on_log(&mut w.env());
    }
    let h = health::read(&w.store, "azure").unwrap();
    assert!(!h.is_ejected(w.now_ms));
    assert_eq!(
        (h.in_flight, h.consecutive_failures, h.errors),
        (0, 0, None)
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=azure;.;outcome=.=cancelled;.;"),
        5
    );
    assert_eq!(
        w.metrics
            .gauges
            .get("llm_filter_routing_in_flightllm_cluster=.=azure;.;"),
        Some(&0)
    );
}

#[test]
fn a_routed_call_answered_locally_leaves_the_in_flight_count() {
    let mut w = World::new(r#"{"routing": {"models": {"gpt-4o": [{"cluster": "a"}]}}}"#);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-timeout-ms", "100")
        .with_body(CHAT);
    let (mut call, _) = Call::start(&mut w.env(), &mut host, false).unwrap();
    w.now_ms += 150;
    let size = host.request_body.len();
    call.on_request_body(&mut w.env(), &mut host, size, true);
    assert_eq!(host.local_reply.as_ref().unwrap().0, 504);
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 1);
    call.on_log(&mut w.env());
    let h = health::read(&w.store, "a").unwrap();
    assert_eq!((h.in_flight, h.errors), (0, None));
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=server_error;.;"),
        0
    );
}

#[test]
fn envoys_reply_to_a_reset_upstream_counts_as_reset() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, _) = w.request(&mut host).unwrap();
    let mut host = host.with_response(503, "text/plain", "upstream connect error");
    host.code_details =
        Some("upstream_reset_before_response_started{connection_termination}".into());
    w.respond(&mut call, &mut host);
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=reset;.;api=.=chat;.;"),
        1
    );
}

#[test]
fn a_client_leaving_adds_no_breaker_pressure() {
    let mut w = World::new(r#"{"budget": {"min_calls": 1, "probe_fraction": 0}}"#);
    for _ in 0..20 {
        let mut host = FakeHost::post("/v1/chat/completions").with_body(&unique_chat());
        let (call, _) = w.request(&mut host).unwrap();
        // No response headers: the client went away.
        call.on_log(&mut w.env());
    }
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-priority", "P2")
        .with_body(&unique_chat());
    let (_, step) = w.request(&mut host).unwrap();
    assert_eq!(step, Step::Continue);
    assert!(host.local_reply.is_none());
}

fn unique_chat() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    CHAT.replace("hi", &format!("hi {}", N.fetch_add(1, Ordering::Relaxed)))
}

#[test]
fn routing_steers_around_a_backend_whose_breaker_is_open() {
    let mut w = World::new(
        r#"{"routing": {"models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]}},
            "budget": {"min_calls": 1, "probe_fraction": 0}}"#,
    );
    for _ in 0..20 {
        let sample = budget::Sample::new(60_000, 60_000, true, 0);
        breaker::record(&w.store, "a", w.now_ms, sample, &w.config.budget).unwrap();
    }
    for _ in 0..50 {
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("x-request-priority", "P2")
            .with_body(&unique_chat());
        let (_, step) = w.request(&mut host).unwrap();
        assert_eq!(step, Step::Continue);
        assert_eq!(host.header("x-llm-cluster"), Some("b"));
        assert!(host.local_reply.is_none());
    }
}

const TWO_BACKENDS: &str = r#"{
  "routing": {
    "models": {"gpt-4o": [
      {"cluster": "a", "model": "gpt-4o-a", "authority": "a.example"},
      {"cluster": "b", "model": "gpt-4o-b", "authority": "b.example"}
    ]},
    "eject_after_failures": 100
  }
}"#;

/// Runs calls until one is routed to `cluster`; returns it with its host.
fn routed_to(w: &mut World, cluster: &str) -> (Call, FakeHost) {
    for n in 0..100 {
        // A session per call: each is placed on its own.
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header(":authority", "llm.local")
            .with_header("authorization", "Bearer k")
            .with_header("x-session-id", &format!("s{n}"))
            .with_body(CHAT);
        let (call, _) = w.request(&mut host).unwrap();
        if host.header("x-llm-cluster") == Some(cluster) {
            return (call, host);
        }
        call.on_log(&mut w.env());
    }
    panic!("never routed to {cluster}");
}

/// A call routed to b whose 503 is held back and sent to a: the call, its
/// host, the callout to a and the idempotency key b was sent.
fn failed_over_from_b(w: &mut World) -> (Call, FakeHost, Callout, String) {
    let (mut call, host) = routed_to(w, "b");
    let key = host.header("idempotency-key").unwrap().to_string();
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Pause
    );
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, 12, true),
        Step::Pause,
        "the failure is held back"
    );
    let callout = host.callouts.pop().unwrap();
    (call, host, callout, key)
}

#[test]
fn a_failed_call_is_sent_to_the_other_backend_as_it_would_have_left() {
    let mut w = World::new(TWO_BACKENDS);
    let (_call, _host, (cluster, headers, body, timeout), key) = failed_over_from_b(&mut w);
    assert_eq!(cluster, "a");
    let header = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header(":authority"), Some("a.example"));
    assert_eq!(header("idempotency-key"), Some(key.as_str()));
    assert_eq!(header("authorization"), Some("Bearer k"));
    assert_eq!(header("x-llm-cluster"), None);
    assert_eq!(
        String::from_utf8(body.clone()).unwrap(),
        CHAT.replace("gpt-4o", "gpt-4o-a")
    );
    assert_eq!(
        header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert!(timeout > 0 && timeout <= 60_000, "{timeout}");
    // b learnt its failure already.
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=b;.;outcome=.=server_error;.;"),
        1
    );
}

#[test]
fn a_mesh_credentialed_backend_asked_in_place_of_another_that_answers_401_is_the_gateways_503() {
    let config = TWO_BACKENDS.replacen(
        "\"eject_after_failures\": 100\n  }",
        "\"eject_after_failures\": 100\n  },\n  \"credentials\": {\"every_call\": true}",
        1,
    );
    for (mesh, want) in [(true, 503), (false, 401)] {
        let config = if mesh {
            config.clone()
        } else {
            TWO_BACKENDS.to_string()
        };
        let mut w = World::new(&config);
        let (mut call, mut host, _, _) = failed_over_from_b(&mut w);
        let body = br#"{"error":{"message":"Invalid API key","type":"invalid_request_error"}}"#;
        let answer = CalloutAnswer {
            status: Some(401),
            headers: vec![
                (":status".into(), "401".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: body.to_vec(),
        };
        assert_eq!(
            call.answer_callout(&mut w.env(), &mut host, answer),
            Step::Pause
        );
        let (status, _, sent) = host.local_reply.clone().unwrap();
        assert_eq!(status, want, "mesh {mesh}");
        let unavailable = w.counter("llm_filter_credential_unavailable_totalllm_cluster=.=a;.;");
        if mesh {
            let sent: serde_json::Value = serde_json::from_slice(&sent).unwrap();
            assert_eq!(sent["error"]["code"], "llm_filter_credential_unavailable");
            assert_eq!(unavailable, 1);
        } else {
            assert_eq!(
                sent,
                body.to_vec(),
                "the provider's word on the client's key"
            );
            assert_eq!(unavailable, 0);
        }
    }
}

#[test]
fn the_other_backends_answer_reaches_the_client_and_is_learnt() {
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, mut host, _, _) = failed_over_from_b(&mut w);
    w.now_ms += 40;
    let answer = CalloutAnswer {
        status: Some(200),
        headers: vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/json".into()),
            ("content-length".into(), ANSWER.len().to_string()),
        ],
        body: ANSWER.as_bytes().to_vec(),
    };
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, answer),
        Step::Pause
    );
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers.get("x-llm-cluster").map(String::as_str), Some("a"));
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert!(!headers.contains_key("content-length"));
    assert_eq!(body, ANSWER.as_bytes());
    call.on_log(&mut w.env());
    for (counter, n) in [
        ("llm_filter_routing_failovers_totalresult=.=answered;.;", 1),
        (
            "llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=success;.;",
            1,
        ),
        (
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=success;.;api=.=chat;.;",
            1,
        ),
        (
            "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=input;.;api=.=chat;.;",
            3,
        ),
    ] {
        assert_eq!(w.counter(counter), n, "{counter}");
    }
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
    assert_eq!(health::read(&w.store, "b").unwrap().in_flight, 0);
}

#[test]
fn no_answer_from_the_other_backend_lets_the_failure_through() {
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(502, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Pause
    );
    let step = call.answer_callout(&mut w.env(), &mut host, CalloutAnswer::default());
    assert_eq!(step, Step::Continue, "the held failure goes on");
    assert!(host.local_reply.is_none());
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, 12, true),
        Step::Continue
    );
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_failovers_totalresult=.=no_answer;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=timeout;.;"),
        1
    );
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=server_error;.;api=.=chat;.;"
        ),
        1
    );
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
    assert_eq!(health::read(&w.store, "b").unwrap().in_flight, 0);
}

#[test]
fn failover_needs_a_retriable_failure_budget_and_another_backend() {
    // A client error is not retried elsewhere.
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(400, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());
    call.on_log(&mut w.env());

    // No room left in the budget for another try.
    let (mut call, host) = routed_to(&mut w, "b");
    w.now_ms += 59_900;
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());
    call.on_log(&mut w.env());

    // Off by configuration.
    let mut w = World::new(&TWO_BACKENDS.replace(
        r#""eject_after_failures""#,
        r#""failover": false, "eject_after_failures""#,
    ));
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());

    // A model with one backend has nowhere to go.
    let mut w = World::new(ROUTED);
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, _) = w.request(&mut host).unwrap();
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());
}

fn hedged(max_ratio: f64) -> String {
    TWO_BACKENDS.replace(
        r#""eject_after_failures": 100"#,
        &format!(
            r#""eject_after_failures": 100,
            "hedge": {{"priorities": ["P1"], "min_delay_ms": 100, "max_ratio": {max_ratio}}}"#
        ),
    )
}

fn answer_200() -> CalloutAnswer {
    CalloutAnswer {
        status: Some(200),
        headers: vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/json".into()),
        ],
        body: ANSWER.as_bytes().to_vec(),
    }
}

#[test]
fn a_slow_call_is_hedged_and_the_first_answer_wins() {
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    assert!(call.is_parked(), "the hedge timer runs");
    w.now_ms += 50;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Wait);
    assert!(host.callouts.is_empty());
    w.now_ms += 60;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert!(!call.is_parked());
    let (cluster, _, body, _) = host.callouts.pop().unwrap();
    assert_eq!(cluster, "a");
    assert_eq!(
        String::from_utf8(body).unwrap(),
        CHAT.replace("gpt-4o", "gpt-4o-a")
    );

    w.now_ms += 30;
    let step = call.answer_callout(&mut w.env(), &mut host, answer_200());
    assert_eq!(step, Step::Pause);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers.get("x-llm-cluster").map(String::as_str), Some("a"));
    // Envoy's reset of the first request, then its own reply passing by.
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=won;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=success;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=b;.;outcome=.=outlasted;.;"),
        1
    );
    // b learnt it took at least the 140 ms until a answered.
    let b = health::read(&w.store, "b").unwrap();
    assert_eq!(b.calls.and_then(|c| c.mean()), Some(140.0));
    assert_eq!(b.consecutive_failures, 0);
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
    assert_eq!(health::read(&w.store, "b").unwrap().in_flight, 0);
}

#[test]
fn a_backend_answering_before_its_hedge_wins() {
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert_eq!(host.callouts.len(), 1);
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    let step = call.answer_callout(&mut w.env(), &mut host, answer_200());
    assert_eq!(step, Step::Pause, "nothing to resume");
    assert!(host.local_reply.is_none());
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=lost;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=b;.;outcome=.=success;.;"),
        1
    );
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);

    // A hedge still out when the call ends lost too, and leaves in flight.
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    call.on_tick(&mut w.env(), &mut host);
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=lost;.;"),
        2
    );
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
}

/// The routing token counts of `cluster`, by model label and token type.
fn routing_tokens(w: &World, cluster: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = w
        .metrics
        .counters
        .iter()
        .filter(|(k, _)| {
            k.starts_with("llm_filter_routing_tokens_total")
                && k.contains(&format!("llm_cluster=.={cluster};.;"))
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    out.sort();
    out
}

/// The routing token counter of a call of gpt-4o on `cluster`.
fn tokens_of(cluster: &str, kind: &str, n: u64) -> (String, u64) {
    (
        format!("llm_filter_routing_tokens_totalmodel=.=gpt-4o;.;llm_cluster=.={cluster};.;token_type=.={kind};.;"),
        n,
    )
}

#[test]
fn a_try_counts_its_own_tokens_under_the_calls_model() {
    // The backend answers first (3 in, 1 out); the hedge loses with its
    // own answer (20 in, 9 out): each cluster counts its own tokens.
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert_eq!(host.callouts.len(), 1);
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    let hedge = CalloutAnswer {
        body: ANSWER
            .replace(
                r#""prompt_tokens":3,"completion_tokens":1"#,
                r#""prompt_tokens":20,"completion_tokens":9"#,
            )
            .into_bytes(),
        ..answer_200()
    };
    call.answer_callout(&mut w.env(), &mut host, hedge);
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=lost;.;"),
        1
    );
    assert_eq!(
        routing_tokens(&w, "a"),
        [tokens_of("a", "input", 20), tokens_of("a", "output", 9)]
    );
    assert_eq!(
        routing_tokens(&w, "b"),
        [tokens_of("b", "input", 3), tokens_of("b", "output", 1)]
    );

    // The hedge wins: the backend it beat reported nothing.
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    call.answer_callout(&mut w.env(), &mut host, answer_200());
    assert!(host.local_reply.is_some());
    call.on_response_headers(&mut w.env(), &mut host, false);
    call.on_log(&mut w.env());
    assert_eq!(
        routing_tokens(&w, "a"),
        [tokens_of("a", "input", 3), tokens_of("a", "output", 1)]
    );
    assert_eq!(routing_tokens(&w, "b"), []);
}

#[test]
fn hedges_respect_their_cap_and_the_answer_in_time() {
    // No share of calls may be hedged: hedging is off, nothing is armed and
    // the tick is any call's.
    let mut w = World::new(&hedged(0.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Resume);
    assert!(host.callouts.is_empty());

    // An answer in time disarms the hedge.
    let mut w = World::new(&hedged(1.0));
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert!(host.callouts.is_empty());

    // Streams are not hedged.
    let (call, _) = {
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_body(&CHAT.replace(r#""model""#, r#""stream":true,"model""#));
        w.request(&mut host).unwrap()
    };
    assert!(!call.is_parked());
}

#[test]
fn envoys_413_to_a_held_body_is_put_in_openai_shape() {
    let mut w = World::new("{}");
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Pause, "the body is held");
    assert!(call.is_parked());
    let mut host = host.with_response(413, "text/plain", "Payload Too Large");
    host.code_details = Some(crate::summary::TOO_LARGE_DETAILS.into());
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert!(!call.is_parked(), "no body will come to wait for");
    assert_eq!(host.response("content-type"), Some("application/json"));
    let size = host.response_body.len();
    call.on_response_body(&mut w.env(), &mut host, size, true);
    let body: serde_json::Value = serde_json::from_slice(&host.response_body).unwrap();
    assert_eq!(body["error"]["code"], "llm_filter_request_too_large");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P1;.;model=.=unknown;.;outcome=.=client_error;.;api=.=chat;.;"
        ),
        1
    );
}

const STREAM_ANSWER: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"yo\"},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n\
data: [DONE]\n\n";

#[test]
fn a_stream_asks_for_usage_and_the_client_never_sees_it() {
    let mut w = World::new(r#"{"cache":{"enabled":false}}"#);
    let body = CHAT.replace(r#""model""#, r#""stream":true,"model""#);
    let mut host = FakeHost::post("/v1/chat/completions").with_body(&body);
    let (mut call, _) = w.request(&mut host).unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let len = host.request_body.len().to_string();
    assert_eq!(host.header("content-length"), Some(len.as_str()));
    assert_eq!(
        load::read(&w.store, load::Scope::Model("gpt-4o"), w.now_ms).in_flight,
        1
    );
    let mut host = host
        .with_response(200, "text/event-stream", STREAM_ANSWER)
        .with_response_header("content-length", "999");
    w.respond(&mut call, &mut host);
    let usage_chunk = STREAM_ANSWER.split_inclusive("\n\n").nth(1).unwrap();
    assert_eq!(
        String::from_utf8(host.response_body.clone()).unwrap(),
        STREAM_ANSWER.replace(usage_chunk, "")
    );
    assert_eq!(host.response("content-length"), None);
    call.on_log(&mut w.env());
    let s = load::read(&w.store, load::Scope::Model("gpt-4o"), w.now_ms);
    assert_eq!(s.in_flight, 0);
    assert_eq!(s.tokens_per_s, 4.0 / load::WINDOW_S);
    assert_eq!(
        w.counter(
            "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=output;.;api=.=chat;.;"
        ),
        4
    );

    // A client that asked for usage gets its stream untouched.
    let body = CHAT.replace(
        r#""model""#,
        r#""stream":true,"stream_options":{"include_usage":true},"model""#,
    );
    let mut host = FakeHost::post("/v1/chat/completions").with_body(&body);
    let (mut call, _) = w.request(&mut host).unwrap();
    assert_eq!(host.request_body, body.as_bytes());
    let mut host = host.with_response(200, "text/event-stream", STREAM_ANSWER);
    w.respond(&mut call, &mut host);
    assert_eq!(host.response_body, STREAM_ANSWER.as_bytes());
    call.on_log(&mut w.env());
}

const CHAINED: &str = r#"{
  "routing": {
    "models": {
      "gpt-4o": [{"cluster": "a"}],
      "gpt-4.1": [{"cluster": "b"}],
      "gpt-4o-mini": [{"cluster": "c"}]
    },
    "fallbacks": {"gpt-4o": {"on": ["context_length", "quota"], "to": ["gpt-4.1", "gpt-4o-mini"]}}
  },
  "cache": {"enabled": false}
}"#;

fn refusal(code: &str) -> String {
    format!(r#"{{"error":{{"message":"no","type":"invalid_request_error","code":"{code}"}}}}"#)
}

/// The error body as Envoy delivers it: the headers, then the whole body.
fn answer_with(call: &mut Call, w: &mut World, host: &mut FakeHost) -> (Step, Step) {
    let size = host.response_body.len();
    let headers = call.on_response_headers(&mut w.env(), host, false);
    let body = call.on_response_body(&mut w.env(), host, size, true);
    (headers, body)
}

#[test]
fn a_refusal_of_a_named_class_moves_along_the_chain() {
    let mut w = World::new(CHAINED);
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    assert_eq!(
        answer_with(&mut call, &mut w, &mut host),
        (Step::Pause, Step::Pause)
    );
    // The held request goes to the chain's first model, named in its body.
    let (cluster, _, body, _) = host.callouts.last().cloned().unwrap();
    assert_eq!(cluster, "b");
    let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent["model"], "gpt-4.1");
    // gpt-4.1 refuses for its quota: the chain goes on to gpt-4o-mini.
    let quota = CalloutAnswer {
        status: Some(429),
        headers: vec![(":status".into(), "429".into())],
        body: refusal("insufficient_quota").into_bytes(),
    };
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, quota),
        Step::Pause
    );
    let (cluster, _, body, _) = host.callouts.last().cloned().unwrap();
    assert_eq!(cluster, "c");
    assert!(String::from_utf8_lossy(&body).contains(r#""model":"gpt-4o-mini""#));
    // gpt-4o-mini answers: the client gets it, with the model named.
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, answer_200()),
        Step::Pause
    );
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("x-llm-model").map(String::as_str),
        Some("gpt-4o-mini")
    );
    assert_eq!(headers.get("x-llm-cluster").map(String::as_str), Some("c"));
    call.on_log(&mut w.env());
    let counted = |reason: &str, result: &str| {
        w.counter(&format!(
            "llm_filter_routing_model_fallbacks_totalmodel=.=gpt-4o;.;reason=.={reason};.;result=.={result};.;"
        ))
    };
    assert_eq!(counted("context_length", "failed"), 1);
    assert_eq!(counted("quota", "answered"), 1);
    assert_eq!(
        w.counter("llm_filter_routing_failovers_totalresult=.=answered;.;"),
        0
    );
    for c in ["a", "b", "c"] {
        assert_eq!(health::read(&w.store, c).unwrap().in_flight, 0, "{c}");
    }
}

/// [`CHAINED`] with a limit on `gpt-4.1` (`degrade`: its rule's degrade).
fn chained_with_a_limit(degrade: &str) -> World {
    let limits = format!(
        r#""limits": {{"rules": [{{"name": "big", "by": ["tenant"], "models": ["gpt-4.1"],
            "requests_per_minute": 1{degrade}}}]}},"#
    );
    World::new(&CHAINED.replacen('{', &format!("{{{limits}"), 1))
}

#[test]
fn a_fallback_is_held_to_the_limits_of_the_model_it_would_reach() {
    let mut w = chained_with_a_limit("");
    // The first fallback of the key takes gpt-4.1's one call a minute.
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    answer_with(&mut call, &mut w, &mut host);
    let (cluster, _, _, _) = host.callouts.last().cloned().unwrap();
    assert_eq!(cluster, "b");
    call.answer_callout(&mut w.env(), &mut host, answer_200());
    call.on_log(&mut w.env());
    let rule = |w: &World, result: &str| {
        w.counter(&format!(
            "llm_filter_limits_calls_totalrule=.=big;.;result=.={result};.;"
        ))
    };
    assert_eq!(rule(&w, "pass"), 1);
    // The next one may not reach gpt-4.1: refused with the limit's 429 in
    // its API's shape, nothing sent.
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    assert_eq!(
        answer_with(&mut call, &mut w, &mut host),
        (Step::Pause, Step::Pause)
    );
    assert!(host.callouts.is_empty(), "nothing sent to gpt-4.1");
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "llm_filter_limit_exceeded");
    assert!(v["error"]["message"].as_str().unwrap().contains("big"));
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    call.on_log(&mut w.env());
    assert_eq!(rule(&w, "rejected"), 1);
    assert_eq!(
        w.counter("llm_filter_routing_model_fallbacks_totalmodel=.=gpt-4o;.;reason=.=context_length;.;result=.=limited;.;"),
        1
    );
    // The call to gpt-4o alone is no call of gpt-4.1: the rule never held it.
    assert_eq!(rule(&w, "pass"), 1);
}

#[test]
fn over_a_degrading_limit_a_fallback_stays_on_the_cheaper_model() {
    let mut w = chained_with_a_limit(r#", "degrade": {"model": "gpt-4o-mini"}"#);
    for expected in [Some("b"), None] {
        let (mut call, host) = routed_to(&mut w, "a");
        let mut host =
            host.with_response(400, "application/json", &refusal("context_length_exceeded"));
        let (_, body) = answer_with(&mut call, &mut w, &mut host);
        let sent = host.callouts.last().map(|c| c.0.as_str());
        assert_eq!(sent, expected);
        if expected.is_none() {
            // gpt-4o's own refusal goes on to the client.
            assert_eq!(body, Step::Continue);
            assert!(host.local_reply.is_none());
        } else {
            call.answer_callout(&mut w.env(), &mut host, answer_200());
        }
        call.on_log(&mut w.env());
    }
}

#[test]
fn other_refusals_reach_the_client_untouched() {
    let mut w = World::new(CHAINED);
    // A class the chain does not name, a bad request, a body that is no error.
    for (status, body) in [
        (404, refusal("model_not_found")),
        (400, refusal("invalid_value")),
        (400, "not json".to_string()),
    ] {
        let (mut call, host) = routed_to(&mut w, "a");
        let mut host = host.with_response(status, "application/json", &body);
        assert_eq!(
            answer_with(&mut call, &mut w, &mut host),
            (Step::Pause, Step::Continue)
        );
        assert!(host.callouts.is_empty(), "{status} {body}");
        assert!(host.local_reply.is_none());
        call.on_log(&mut w.env());
    }
    // The chain's last model refuses too: its refusal is the answer.
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    answer_with(&mut call, &mut w, &mut host);
    let too_long = || CalloutAnswer {
        status: Some(400),
        headers: vec![(":status".into(), "400".into())],
        body: refusal("context_length_exceeded").into_bytes(),
    };
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, too_long()),
        Step::Pause
    );
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, too_long()),
        Step::Pause
    );
    assert_eq!(host.callouts.len(), 2);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 400);
    assert_eq!(
        headers.get("x-llm-model").map(String::as_str),
        Some("gpt-4o-mini")
    );
    call.on_log(&mut w.env());
    // A model without a chain holds nothing back.
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    assert_eq!(
        answer_with(&mut call, &mut w, &mut host),
        (Step::Continue, Step::Continue)
    );
}
