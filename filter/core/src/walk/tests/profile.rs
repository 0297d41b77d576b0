//! A tagging-only call looped through the walk, for a native profile of the
//! module's own share of the per-pod path (docs/bench.md, "Where the time
//! goes"). Its stats resolve by label set as the plugin's do, so nothing is
//! built for them per call; the fake host's own allocations (a header value
//! read is a `String`, a shared-data read a `Vec`) are about the plugin's.

use crate::host::Metrics;
use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

/// Stats resolved by label set, as the plugin's are: nothing built per call.
#[derive(Default)]
struct Resolved;

impl Metrics for Resolved {
    fn counter(&mut self, _: &str, _: u64) {}
    fn gauge(&mut self, _: &str, _: i64) {}
    fn gauge_add(&mut self, _: &str, _: i64) {}
    fn histogram(&mut self, _: &str, _: u64) {}
    fn counter_with(&mut self, _: &'static str, _: &[(&'static str, &str)], _: u64) {}
    fn gauge_with(&mut self, _: &'static str, _: &[(&'static str, &str)], _: i64) {}
    fn histogram_with(&mut self, _: &'static str, _: &[(&'static str, &str)], _: u64) {}
}

/// Tagging only: no budget, and no cache in a build that has one (the
/// sidecar build refuses the section).
const TAGGING_ONLY: &str = if cfg!(feature = "cache") {
    r#"{"cache":{"enabled":false},"budget":{"enabled":false}}"#
} else {
    r#"{"budget":{"enabled":false}}"#
};
const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;

/// The bench's request: wrk's headers and a one-line chat body.
fn bench_request() -> FakeHost {
    FakeHost::post("/v1/chat/completions")
        .with_header(":authority", "localhost")
        .with_header(":scheme", "http")
        .with_header("content-type", "application/json")
        .with_header("x-forwarded-proto", "http")
        .with_header("x-request-id", "5b3f6c9e-6f0e-4b8a-9b8e-1d2c3b4a5f60")
        .with_body(CHAT)
}

/// One tagging-only call through the walk, as the bench sends it.
fn tagging_call(w: &mut World, metrics: &mut Resolved) {
    let mut host = bench_request();
    let mut env = w.env();
    env.metrics = metrics;
    let (mut call, _) = Call::start(&mut env, &mut host, false).unwrap();
    let size = host.request_body.len();
    call.on_request_body(&mut env, &mut host, size, true);
    let mut host = host.with_response(200, "application/json", ANSWER);
    call.on_response_headers(&mut env, &mut host, false);
    let size = host.response_body.len();
    call.on_response_body(&mut env, &mut host, size, true);
    call.on_log(&mut env);
}

/// Loops tagging-only calls through the walk (`TAGGING_CALLS`, 200,000 by
/// default), for a native profiler or an allocation census:
/// `cargo test -p llm-filter-core --lib -- --ignored tagging_calls_loop`
/// under `perf record` or `valgrind --tool=dhat`.
#[test]
#[ignore]
fn tagging_calls_loop() {
    let calls: u32 = std::env::var("TAGGING_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000);
    let mut w = World::new(TAGGING_ONLY);
    let mut metrics = Resolved;
    let started = std::time::Instant::now();
    for i in 0..calls {
        tagging_call(&mut w, &mut metrics);
        w.now_ms += 1;
        // The worker's timer, every 25 ms at the bench's 1,000 calls a second.
        if i % 25 == 0 {
            let World {
                store,
                load,
                config,
                now_ms,
                ..
            } = &mut w;
            crate::load::flush(store, &mut metrics, &config.names, load, *now_ms);
        }
    }
    eprintln!("{:?} per call", started.elapsed() / calls.max(1));
}
