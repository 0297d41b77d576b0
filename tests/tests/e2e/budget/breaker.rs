//! The tiered breaker and the retry budget through the real Envoy: a backend
//! that keeps timing out has P2 shed fast, P1 partly, then both rejected while
//! P0 is still forwarded; the breaker closes by itself once the backend heals,
//! with only low-priority traffic arriving; and a failing backend is not hit by
//! a retry storm. Every refusal is an OpenAI-shaped 503 with `retry-after`, and
//! shows in `/stats/prometheus` by priority and reason.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use llm_filter_e2e::prometheus;
use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, Envoy, EnvoyBuilder, HttpResponse, MockConfig,
    MockUpstream,
};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const SHED: &str = "llm_filter_budget_shed_total";
const REJECTED: &str = "llm_filter_budget_rejected_total";
const TIER: &str = "llm_filter_budget_breaker_tier";
const PRESSURE: &str = "llm_filter_budget_breaker_pressure_permille";
const USED: &str = "llm_filter_budget_used_permille";
const RETRIES_PLANNED: &str = "llm_filter_budget_retries_planned_total";
const RETRY_BUDGET_SPENT: &str = "llm_filter_budget_retry_budget_spent_total";

/// Breaker of calls that routing did not place on a cluster.
const BREAKER: [(&str, &str); 1] = [("llm_cluster", "default")];

/// Stats move with Envoy's log of a stream, histograms after a flush: polled
/// up to this long on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(20);

/// A backend that keeps timing out: far longer than any budget used here.
const BACKEND_DELAY_MS: u64 = 5000;

fn start(mock: &MockUpstream, config: Value, route_yaml: Option<&str>) -> Envoy {
    let mut builder = EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port());
    if let Some(yaml) = route_yaml {
        builder = builder.extra_route_yaml(yaml);
    }
    builder.start().expect("envoy with the filter")
}

/// One chat call of `priority` with a budget of `budget_ms`.
async fn call(
    envoy: &Envoy,
    priority: &str,
    budget_ms: u64,
    extra: &[(&str, &str)],
) -> HttpResponse {
    let budget = budget_ms.to_string();
    let mut headers = vec![
        ("x-request-priority", priority),
        ("x-request-timeout-ms", budget.as_str()),
    ];
    headers.extend_from_slice(extra);
    post_json(&envoy.url(CHAT), &chat_body("gpt-4o", priority), &headers)
        .await
        .unwrap_or_else(|e| panic!("{priority} call: {e:#}"))
}

/// `n` calls at once.
async fn burst(envoy: &Envoy, n: usize, priority: &str, budget_ms: u64) -> Vec<HttpResponse> {
    join_all((0..n).map(|_| call(envoy, priority, budget_ms, &[]))).await
}

fn error_code(r: &HttpResponse) -> String {
    r.json()["error"]["code"].as_str().unwrap_or("").to_string()
}

/// A refusal by the breaker: 503, OpenAI-shaped body with `code`, JSON,
/// `retry-after` in whole seconds.
fn is_refusal(r: &HttpResponse, code: &str) -> bool {
    if r.status != 503 || error_code(r) != code {
        return false;
    }
    let body = r.json();
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
            && body["error"]["type"] == "service_unavailable",
        "{body}"
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    let retry_after = r.header("retry-after").and_then(|v| v.parse::<u64>().ok());
    assert!(
        retry_after.is_some_and(|s| s >= 1),
        "retry-after {:?}",
        r.header("retry-after")
    );
    true
}

/// A call that went upstream and ran out of budget there.
fn timed_out_upstream(r: &HttpResponse) -> bool {
    r.status == 504 && error_code(r) == "llm_filter_upstream_timeout"
}

/// Polls the breaker's tier gauge until it reads `tier`; returns the last reading.
fn wait_for_tier(envoy: &Envoy, tier: f64) -> f64 {
    wait_for_tier_within(envoy, tier, DEADLINE)
}

fn wait_for_tier_within(envoy: &Envoy, tier: f64, timeout: Duration) -> f64 {
    let deadline = Instant::now() + timeout;
    loop {
        let now = envoy.metric(TIER, &BREAKER);
        if now == tier || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

#[tokio::test]
async fn a_timing_out_backend_drives_the_tiers() {
    if skip_without_envoy("a_timing_out_backend_drives_the_tiers") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        default_delay_ms: BACKEND_DELAY_MS,
        ..MockConfig::named("tiers")
    });
    // A minute's window holds the whole test; half of P1 shed in the shed
    // tier so "partly" shows clearly in a few dozen calls.
    let config = json!({"budget": {"window_s": 60, "min_calls": 10, "shed_fraction": 0.5}});
    let envoy = start(&mock, config, None);

    // Ten healthy calls, then thirty that time out: 3/4 of the budgets
    // consumed, between shed_at (0.7) and reject_at (0.9).
    for _ in 0..10 {
        let r = call(&envoy, "P0", 1000, &[("x-mock-delay-ms", "0")]).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for _ in 0..3 {
        for r in burst(&envoy, 10, "P0", 300).await {
            assert!(timed_out_upstream(&r), "{} {}", r.status, r.text());
        }
    }
    assert_eq!(
        wait_for_tier(&envoy, 1.0),
        1.0,
        "{:?}",
        envoy.stats_matching("budget")
    );

    // Shed tier, P2: answered locally and fast, never forwarded (but for the
    // odd half-open probe).
    let before = mock.request_count();
    let (mut p2_shed, mut latencies) = (0, Vec::new());
    for _ in 0..20 {
        let r = call(&envoy, "P2", 2000, &[]).await;
        if is_refusal(&r, "llm_filter_shed") {
            p2_shed += 1;
            latencies.push(r.elapsed);
        } else {
            assert!(timed_out_upstream(&r), "probe: {} {}", r.status, r.text());
        }
    }
    assert_eq!(mock.request_count() - before, 20 - p2_shed, "probes only");
    assert!(p2_shed >= 14, "P2 shed {p2_shed} of 20");
    latencies.sort();
    let (p50, max) = (percentile(&latencies, 0.5), percentile(&latencies, 1.0));
    eprintln!("P2 shed {p2_shed}/20, local reply p50 {p50:?}, max {max:?}");
    assert!(p50 < Duration::from_millis(100), "p50 {p50:?}");
    // A forwarded call would have waited its 2 s budget.
    assert!(max < Duration::from_millis(1000), "max {max:?}");

    // Shed tier, P1: partly shed (half of it, less the probes).
    let before = mock.request_count();
    let mut p1_shed = 0;
    for _ in 0..30 {
        let r = call(&envoy, "P1", 300, &[]).await;
        if is_refusal(&r, "llm_filter_shed") {
            p1_shed += 1;
        } else {
            assert!(timed_out_upstream(&r), "{} {}", r.status, r.text());
        }
    }
    eprintln!("P1 shed {p1_shed}/30 in the shed tier");
    assert!((3..=27).contains(&p1_shed), "P1 shed {p1_shed} of 30");
    assert_eq!(mock.request_count() - before, 30 - p1_shed);

    // P0 is never shed: it keeps probing the backend.
    let before = mock.request_count();
    for r in burst(&envoy, 5, "P0", 300).await {
        assert!(timed_out_upstream(&r), "{} {}", r.status, r.text());
    }
    assert_eq!(mock.request_count() - before, 5, "every P0 call forwarded");

    // More timeouts push the pressure past reject_at (0.9).
    for _ in 0..10 {
        burst(&envoy, 20, "P0", 300).await;
        if wait_for_tier_within(&envoy, 2.0, Duration::from_millis(500)) == 2.0 {
            break;
        }
    }
    assert_eq!(
        wait_for_tier(&envoy, 2.0),
        2.0,
        "{:?}",
        envoy.stats_matching("budget")
    );

    // Reject tier: P1 and P2 refused (circuit open), P0 still forwarded.
    let mut rejected = [0; 2];
    for (i, (priority, n)) in [("P1", 20), ("P2", 10)].into_iter().enumerate() {
        for _ in 0..n {
            let r = call(&envoy, priority, 300, &[]).await;
            if is_refusal(&r, "llm_filter_circuit_open") {
                rejected[i] += 1;
            } else {
                assert!(timed_out_upstream(&r), "{} {}", r.status, r.text());
            }
        }
    }
    eprintln!("rejected P1 {}/20, P2 {}/10", rejected[0], rejected[1]);
    assert!(rejected[0] >= 14 && rejected[1] >= 6, "{rejected:?}");
    let before = mock.request_count();
    for r in burst(&envoy, 5, "P0", 300).await {
        assert!(timed_out_upstream(&r), "{} {}", r.status, r.text());
    }
    assert_eq!(mock.request_count() - before, 5, "P0 still forwarded");

    // Metrics: refusals by priority and reason, the tier, the pressure, the
    // budget used by every forwarded call.
    let samples = envoy.metrics();
    let count = |name: &str, labels: &[(&str, &str)]| prometheus::sum(&samples, name, labels);
    let pressure = [("reason", "pressure")];
    let open = [("reason", "circuit_open")];
    assert_eq!(
        count(SHED, &[("priority", "P2"), pressure[0]]),
        p2_shed as f64
    );
    assert_eq!(
        count(SHED, &[("priority", "P1"), pressure[0]]),
        p1_shed as f64
    );
    assert_eq!(
        count(REJECTED, &[("priority", "P1"), open[0]]),
        rejected[0] as f64
    );
    assert_eq!(
        count(REJECTED, &[("priority", "P2"), open[0]]),
        rejected[1] as f64
    );
    assert_eq!(count(SHED, &[("priority", "P0")]), 0.0);
    assert_eq!(count(REJECTED, &[("priority", "P0")]), 0.0);
    assert_eq!(count(TIER, &BREAKER), 2.0);
    assert!(count(PRESSURE, &BREAKER) >= 900.0);
    // Every P0 call went upstream and was timed: the histogram counts them.
    let p0_calls = 10 + 30 + 5 + 5;
    let used = envoy.wait_for_metric(
        &format!("{USED}_count"),
        &[("priority", "P0")],
        p0_calls as f64,
        DEADLINE,
    );
    assert!(used >= p0_calls as f64, "{USED} count {used}");
}

#[tokio::test]
async fn the_breaker_closes_by_itself_with_only_low_priority_traffic() {
    if skip_without_envoy("the_breaker_closes_by_itself_with_only_low_priority_traffic") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        default_delay_ms: BACKEND_DELAY_MS,
        ..MockConfig::named("recovery")
    });
    // A 2 s window, and no half-open probes: the window's aging alone must
    // close the breaker.
    let config = json!({"budget": {"window_s": 2, "min_calls": 5, "probe_fraction": 0}});
    let envoy = start(&mock, config, None);

    for r in burst(&envoy, 10, "P0", 200).await {
        assert!(timed_out_upstream(&r), "{} {}", r.status, r.text());
    }
    assert_eq!(wait_for_tier(&envoy, 2.0), 2.0);
    let r = call(&envoy, "P2", 1000, &[]).await;
    assert!(is_refusal(&r, "llm_filter_circuit_open"), "{}", r.text());

    // The backend heals; only P2 traffic arrives.
    mock.set_default_delay_ms(0);
    mock.clear();
    let healed = Instant::now();
    let mut refused = 1;
    let closed_after = loop {
        let r = call(&envoy, "P2", 1000, &[]).await;
        if r.status == 200 {
            break healed.elapsed();
        }
        assert!(is_refusal(&r, "llm_filter_circuit_open"), "{}", r.text());
        refused += 1;
        assert!(healed.elapsed() < DEADLINE, "still open after {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("closed {closed_after:?} after the backend healed ({refused} P2 refused)");
    // Refused calls never reached the backend.
    assert_eq!(mock.request_count(), 1);

    // And it stays closed.
    for _ in 0..10 {
        let r = call(&envoy, "P2", 1000, &[]).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(mock.request_count(), 11);
    assert_eq!(wait_for_tier(&envoy, 0.0), 0.0);
}

#[tokio::test]
async fn the_retry_budget_prevents_a_retry_storm() {
    if skip_without_envoy("the_retry_budget_prevents_a_retry_storm") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("storm"));
    mock.set_status(Some(503));
    let route = "retry_policy:\n  retry_back_off: {base_interval: 0.025s, max_interval: 0.25s}\n";
    let config = json!({"budget": {"window_s": 60, "min_calls": 5}});
    let envoy = start(&mock, config, Some(route));

    // A failing backend and callers that keep calling: without a retry
    // budget every call would be tried 3 times (2 retries per call).
    let calls = 100;
    for _ in 0..calls {
        let r = call(&envoy, "P0", 10_000, &[]).await;
        assert_eq!(r.status, 503, "{}", r.text());
    }
    let attempts = mock.request_count();
    let retries = attempts - calls;
    let ratio = retries as f64 / calls as f64;
    eprintln!("{calls} calls, {attempts} attempts upstream: {retries} retries, ratio {ratio:.2}");
    // Retries happen while the window warms up (5 calls × 2), then only
    // while they stay below retry_ratio (0.2) of the calls.
    assert!(retries >= 10, "{retries} retries");
    assert!(ratio <= 0.35, "retry ratio {ratio:.2}");

    let planned = envoy.wait_for_metric(RETRIES_PLANNED, &BREAKER, retries as f64, DEADLINE);
    assert_eq!(planned, retries as f64, "retries planned vs made");
    let spent = envoy.metric(RETRY_BUDGET_SPENT, &BREAKER);
    assert!(spent >= 50.0, "{spent} calls planned without retries");
}
