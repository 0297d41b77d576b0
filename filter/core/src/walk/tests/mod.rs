//! Scenario tests of the walk: the whole walk against a fake host and in-memory
//! shared state; the general ones here, one file per step beside them.

use crate::budget::breaker;
use crate::build;
use crate::routing::health;
use crate::walk::fake::{with_section, Callout, FakeHost, World};
use crate::walk::*;
use crate::{budget, load};

// A step's tests are built with its feature (filter/core/Cargo.toml): the
// sidecar build runs the others.
#[cfg(feature = "routing")]
mod affinity;
#[cfg(feature = "cache")]
mod cache;
#[cfg(feature = "credentials")]
mod credentials;
mod degrade;
mod dialects;
mod estimate;
#[cfg(feature = "routing")]
mod failover;
#[cfg(feature = "ab")]
mod group;
#[cfg(feature = "guardrails")]
mod guard;
#[cfg(feature = "guardrails")]
mod guard_service;
mod identity;
#[cfg(feature = "full")]
mod keys;
#[cfg(feature = "limits")]
mod limits;
mod phases;
mod profile;
#[cfg(feature = "routing")]
mod prompt_cache;
#[cfg(feature = "routing")]
mod routing;
#[cfg(feature = "cache")]
mod semantic;
mod shape;
#[cfg(feature = "routing")]
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

/// A configuration without the cache: the full build has it unless told
/// not to, the sidecar build has none (and refuses the section).
const NO_CACHE: &str = if cfg!(feature = "cache") {
    r#"{"cache":{"enabled":false}}"#
} else {
    "{}"
};

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

/// What concerns the filter is told from the request's headers alone: an
/// LLM call, the filter's own endpoints (in a build with them), or any
/// request with a header only the filter may set, which the walk strips.
#[test]
fn a_request_concerns_the_filter_by_its_path_or_a_header_only_it_sets() {
    let config = Config::parse(b"{}").unwrap();
    let cases = [
        ("POST", "/v1/chat/completions", None, true),
        ("POST", "/v1/messages?beta=true", None, true),
        ("GET", "/v1/models", None, false),
        ("GET", "/v1/chat/completions", None, false),
        ("POST", "/v1/other", None, false),
        ("GET", "/llm-filter/state", None, build::ADMIN),
        ("GET", "/llm-filterx", None, false),
        ("GET", "/v1/models", Some("x-llm-cluster"), true),
        ("DELETE", "/v1/files/f", Some("x-llm-cache-key"), true),
        ("GET", "/v1/models", Some("x-other"), false),
    ];
    for (method, path, header, concerns) in cases {
        let mut host = FakeHost::new()
            .with_header(":method", method)
            .with_header(":path", path);
        if let Some(name) = header {
            host = host.with_header(name, "forged");
        }
        assert_eq!(
            Call::concerns(&config, &host),
            concerns,
            "{method} {path} {header:?}"
        );
    }
}

/// A hop that exports no span passes a valid `traceparent` on as it came
/// (its `tracestate` too): the upstream's span hangs under the caller's.
/// The client still learns the trace id, and the record names the span the
/// upstream was given. An invalid one still starts a new trace.
#[test]
fn without_spans_a_valid_trace_goes_on_as_it_came() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut w = World::new(r#"{"access_log":{"enabled":true}}"#);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("traceparent", TP)
        .with_header("tracestate", "v=1")
        .with_body(CHAT);
    let (mut call, _) = w.request(&mut host).unwrap();
    assert_eq!(host.header("traceparent"), Some(TP));
    assert_eq!(host.header("tracestate"), Some("v=1"));
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    assert_eq!(
        host.response("x-trace-id"),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    let record: serde_json::Value =
        serde_json::from_slice(&host.properties["llm_filter.call"]).unwrap();
    assert_eq!(
        (&record["trace_id"], &record["span_id"]),
        (
            &serde_json::json!("4bf92f3577b34da6a3ce929d0e0e4736"),
            &serde_json::json!("00f067aa0ba902b7")
        )
    );

    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header(
            "traceparent",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        )
        .with_header("tracestate", "v=1")
        .with_body(CHAT);
    w.request(&mut host).unwrap();
    let tp = host.header("traceparent").unwrap();
    assert!(trace_context::TraceParent::parse(tp).is_some() && !tp.contains("-00f067aa0ba902b7-"));
    assert_eq!(host.header("tracestate"), None, "orphaned");
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

fn unique_chat() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    CHAT.replace("hi", &format!("hi {}", N.fetch_add(1, Ordering::Relaxed)))
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

/// `config` with gpt-4o routed to cluster `a`, in a build with routing.
fn routed(config: &str) -> String {
    with_section(
        build::ROUTING,
        r#""routing": {"models": {"gpt-4o": [{"cluster": "a"}]}}"#,
        config,
    )
}

#[test]
fn a_large_body_is_not_held() {
    let mut w = World::new(&routed(r#"{"max_body_bytes": 10}"#));
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (_, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Continue);
    assert_eq!(host.header("x-llm-cluster"), None);
}

#[test]
fn a_budget_spent_before_forwarding_is_answered_504() {
    let mut w = World::new(&routed("{}"));
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
    let mut w = World::new(if build::ROUTING { ROUTED } else { "{}" });
    let mut host = FakeHost::post("/v1/chat/completions").with_body("{not json");
    let (_, step) = w.request(&mut host).unwrap();
    assert_eq!(step, Step::Continue);
    assert_eq!(host.request_body, b"{not json");
    assert_eq!(host.header("x-llm-cluster"), None);
}

#[test]
fn a_client_cluster_header_never_picks_the_cluster() {
    // With routing: the filter's choice or none, never the client's.
    #[cfg(feature = "routing")]
    {
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
    }
    // Without routing, and on requests that are no LLM call at all, the
    // client's header is removed all the same: no client steers a request.
    let routed = [
        (ROUTED, "GET", "/v1/models"),
        (ROUTED, "DELETE", "/anything"),
    ];
    let routed = if build::ROUTING { &routed[..] } else { &[] };
    let plain = [
        ("{}", "POST", "/v1/chat/completions"),
        ("{}", "GET", "/v1/models"),
    ];
    for &(config, method, path) in plain.iter().chain(routed) {
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
    let mut w = World::new(NO_CACHE);
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

fn refusal(code: &str) -> String {
    format!(r#"{{"error":{{"message":"no","type":"invalid_request_error","code":"{code}"}}}}"#)
}
