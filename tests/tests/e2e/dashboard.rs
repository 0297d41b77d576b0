//! The Grafana dashboard (examples/grafana/llm-filter.json) against what an
//! operator's Prometheus holds: mixed traffic through the real Envoy and
//! filter (a cache miss then its hit, calls over three backends with a
//! failover and a hedge, A/B groups, a degrade level, streams, a backend
//! whose timeouts drive its breaker, every call under a limit rule), the real Prometheus scraping
//! `/stats/prometheus` with the repo's `stats_tags` and evaluating the repo's
//! recording rules, then every query of every panel, its variables set as
//! Grafana sets them for "All", must return data.
//!
//! With `LLM_FILTER_DASHBOARD_DATA=<file>` (`make dashboard-picture`) it plays
//! `LLM_FILTER_DASHBOARD_ROUNDS` rounds and writes every query's range over
//! the run to that file, from which scripts/dashboard_picture.py draws the
//! picture in docs/.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use llm_filter_e2e::prometheus_server::{free_port, scrape_envoys, with_rules};
use llm_filter_e2e::{
    chat_body, chat_stream_body, post_json, prometheus_bin, running_in_ci, skip_without_envoy,
    stream_sse, unique, workspace_root, Envoy, EnvoyBuilder, MockUpstream, PrometheusServer,
    TailLatency,
};
use serde_json::{json, Value};

use crate::support::{alerts, otlp::Receiver};

const TOKEN: &str = "e2e-dashboard-token-0123456789";
const CHAT: &str = "/v1/chat/completions";

/// The metrics of panels that no healthy run can give, each with its reason.
/// A query naming one of them may return nothing; every other must return
/// data.
const NOT_IN_A_HEALTHY_RUN: &[(&str, &str)] = &[(
    "llm_filter_internal_errors_total",
    "the filter's own trouble: a host call that Envoy answers with a status the SDK would \
     trap on, a shared-data write refused; a healthy Envoy gives none, and the unit tests \
     of the core count each reason",
)];

/// `$__rate_interval` in the instant queries: the whole run.
const RATE_INTERVAL: &str = "2m";

/// The dashboard's panels that hold queries, as Grafana reads the file.
fn panels(dashboard: &Value) -> Vec<Value> {
    dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] != "row")
        .cloned()
        .collect()
}

/// `expr` as Grafana sends it with every variable at "All" (its `allValue`)
/// and the interval macros given values.
fn substituted(dashboard: &Value, expr: &str, rate_interval: &str, interval: &str) -> String {
    let mut vars: Vec<(String, String)> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["includeAll"] == true)
        .map(|v| {
            let name = v["name"].as_str().unwrap().to_string();
            (name, v["allValue"].as_str().unwrap().to_string())
        })
        .collect();
    // Longest first, so no name is taken for a prefix of another.
    vars.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut out = expr
        .replace("$__rate_interval", rate_interval)
        .replace("${__rate_interval}", rate_interval)
        .replace("$__interval", interval)
        .replace("${__interval}", interval);
    for (name, all) in vars {
        out = out
            .replace(&format!("${{{name}}}"), &all)
            .replace(&format!("${name}"), &all);
    }
    assert!(!out.contains('$'), "a variable left in {out}");
    out
}

/// Whether `samples` (an instant query's result) hold a number.
fn has_data(samples: &[Value]) -> bool {
    samples.iter().any(|s| {
        s["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    })
}

struct Rig {
    envoy: Envoy,
    _default: MockUpstream,
    a: MockUpstream,
    b: MockUpstream,
    c: MockUpstream,
    slow: MockUpstream,
    receiver: Receiver,
}

/// The filter's configuration: `gpt-4o` over `a` (fast), `b` (answers 503:
/// fails over, ejected after three) and `c` (slow: P0 calls hedged);
/// `gpt-slow` on `slow`, whose calls time out; two A/B groups; the
/// Prometheus the test runs as a degrade source; spans to the receiver.
fn config() -> Value {
    json!({
        "admin": {"token": TOKEN},
        "routing": {
            "models": {
                "gpt-4o": [{"cluster": "a"}, {"cluster": "b"}, {"cluster": "c"}],
                "gpt-slow": [{"cluster": "slow"}]
            },
            "eject_after_failures": 3,
            "probe_interval_s": 60,
            "hedge": {"priorities": ["P0"], "min_delay_ms": 200, "max_ratio": 1.0}
        },
        "budget": {"window_s": 60, "min_calls": 10, "probe_fraction": 0},
        "ab": {"groups": [{"name": "control", "percent": 50}, {"name": "b", "percent": 50}]},
        "degrade": {"prometheus": {"cluster": "prometheus", "interval_s": 1, "timeout_ms": 500}},
        "tracing": {"otlp": {"cluster": "otel", "interval_ms": 200}},
        // Every call counted and charged, none refused.
        "limits": {
            "prices": {"*": {"input": 2.5, "cached_input": 1.25, "output": 10}},
            "rules": [{"name": "spend", "by": ["tenant"], "priorities": ["P0", "P1", "P2"],
                       "tokens_per_minute": 100_000_000, "cost_per_day": 1_000}]
        }
    })
}

fn rig(prom_port: u16) -> Rig {
    let default = MockUpstream::backend("default", 0);
    let a = MockUpstream::backend("a", 20);
    let b = MockUpstream::backend("b", 10);
    // c answers in 300 ms, but three calls in ten take 1.5-1.8 s: those
    // outlast its hedge delay (twice its median, 600 ms), so a P0 call that
    // routing sends there is hedged, whatever the machine's load.
    let c = MockUpstream::backend("c", 300);
    c.set_tail_latency(Some(TailLatency {
        probability: 0.3,
        min_ms: 1_500,
        max_ms: 1_800,
        seed: 7,
    }));
    let slow = MockUpstream::backend("slow", 2_000);
    b.set_status(Some(503));
    for m in [&a, &c] {
        m.set_prompt_cache(true);
    }
    let receiver = Receiver::start(&[]);
    let mut builder = EnvoyBuilder::new().plugin_config(config());
    for m in [&default, &a, &b, &c, &slow] {
        builder = builder.upstream(m.name(), m.port());
    }
    let envoy = builder
        .upstream("prometheus", prom_port)
        .upstream("otel", receiver.port)
        .header_route("x-llm-cluster")
        .route_timeout_ms(30_000)
        .start()
        .expect("envoy with the filter");
    Rig {
        envoy,
        _default: default,
        a,
        b,
        c,
        slow,
        receiver,
    }
}

/// One round of the mixed traffic; what each call answered is asserted.
async fn round(rig: &Rig, n: usize) {
    let url = rig.envoy.url(CHAT);
    // A miss, then the same deterministic call from the cache (a model
    // routing leaves to the default upstream).
    let cached = json!({"model": "gpt-4o-mini", "temperature": 0,
        "messages": [{"role": "user", "content": format!("what does the dashboard show, round {n}")}]});
    let miss = post_json(&url, &cached, &[]).await.unwrap();
    assert_eq!(
        (miss.status, miss.header("x-cache")),
        (200, Some("MISS")),
        "{}",
        miss.text()
    );
    let hit = post_json(&url, &cached, &[]).await.unwrap();
    assert_eq!(hit.header("x-cache"), Some("HIT"));
    assert_eq!(hit.json()["choices"], miss.json()["choices"]);
    // A forged shard header: counted, never used.
    let forged = post_json(&url, &cached, &[("x-llm-cache-key", "0123abcd")])
        .await
        .unwrap();
    assert_eq!(forged.header("x-cache"), Some("HIT"));

    // Routed calls of two groups and three priorities, concurrently: b's
    // 503s fail over, c's slow P0 calls are hedged, P2 is degraded.
    let calls = (0..12).map(|i| {
        let url = url.clone();
        let priority = ["P0", "P1", "P2"][i % 3];
        let user = format!("user-{n}-{i}");
        async move {
            let mut body = chat_body("gpt-4o", &unique(&format!("routed {i}")));
            body["max_tokens"] = json!(1000);
            let headers = [("x-request-priority", priority), ("x-user-id", &user)];
            (priority, post_json(&url, &body, &headers).await.unwrap())
        }
    });
    for (priority, r) in futures_util::future::join_all(calls).await {
        assert_eq!(r.status, 200, "{priority}: {}", r.text());
        let served = r.header("x-llm-cluster").unwrap_or_default().to_string();
        assert!(["a", "c"].contains(&served.as_str()), "{served}");
        assert!(r.header("x-user-group").is_some());
        let degraded = r.header("x-llm-degraded");
        assert_eq!(
            degraded.is_some(),
            priority == "P2",
            "{priority} {degraded:?}"
        );
    }

    // P0 calls until one lands in c's tail and is hedged: routing, which
    // learns that c is slow, sends it few calls (about one in twenty), so
    // calls go on for up to a minute rather than a fixed number of tries.
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0.. {
        if rig.envoy.metric("llm_filter_routing_hedges_total", &[]) >= 1.0
            || Instant::now() > deadline
        {
            break;
        }
        let body = chat_body("gpt-4o", &unique(&format!("hedged {i}")));
        let r = post_json(&url, &body, &[("x-request-priority", "P0")])
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(
        rig.envoy.metric("llm_filter_routing_hedges_total", &[]) >= 1.0,
        "no P0 call was hedged"
    );

    // Two turns of a conversation: the second's prompt starts with the
    // first's, which its backend's prompt cache holds.
    let first = json!([{"role": "system", "content": "You answer about dashboards."},
                      {"role": "user", "content": format!("conversation {n}: what is a panel?")}]);
    let r = post_json(&url, &json!({"model": "gpt-4o", "messages": first}), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": "A box with one query."}));
    second.push(json!({"role": "user", "content": "and a row?"}));
    let r = post_json(&url, &json!({"model": "gpt-4o", "messages": second}), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .is_some_and(|t| t > 0),
        "{}",
        r.text()
    );

    // Streams.
    for i in 0..2 {
        let body = chat_stream_body("gpt-4o", &unique(&format!("a stream {i} of words")), true);
        let sse = stream_sse(&url, &body, &[]).await.unwrap();
        assert_eq!(sse.status, 200);
        assert!(sse.done(), "the whole stream");
    }

    // gpt-slow times out: its breaker sheds P2, then rejects P1.
    let timeouts = (0..8).map(|_| {
        let url = url.clone();
        async move {
            let body = chat_body("gpt-slow", &unique("too slow"));
            let headers = [
                ("x-request-priority", "P0"),
                ("x-request-timeout-ms", "300"),
            ];
            post_json(&url, &body, &headers).await.unwrap()
        }
    });
    for r in futures_util::future::join_all(timeouts).await {
        assert_eq!(r.status, 504, "{}", r.text());
    }
    for priority in ["P2", "P1"] {
        let body = chat_body("gpt-slow", &unique("refused"));
        let headers = [
            ("x-request-priority", priority),
            ("x-request-timeout-ms", "300"),
        ];
        let r = post_json(&url, &body, &headers).await.unwrap();
        let refused = r.status == 503
            && ["llm_filter_shed", "llm_filter_circuit_open"]
                .contains(&r.json()["error"]["code"].as_str().unwrap_or_default());
        // P2 is shed from the shed tier on; P1 only in part until the
        // reject tier, and a P1 that went timed out too.
        assert!(
            refused || (priority == "P1" && r.status == 504),
            "{priority}: {} {}",
            r.status,
            r.text()
        );
    }
}

/// The metric names a query reads.
fn metrics_of(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            w.starts_with("llm_filter_") || w.starts_with("gen_ai_") || w.starts_with("llm:")
        })
        .collect()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_panel_of_the_dashboard_shows_data_after_mixed_traffic() {
    let test = "every_panel_of_the_dashboard_shows_data_after_mixed_traffic";
    if skip_without_envoy(test) {
        return;
    }
    if prometheus_bin().is_none() {
        assert!(
            !running_in_ci(),
            "{test}: no prometheus; `make e2e` installs it"
        );
        eprintln!("SKIP {test}: no prometheus");
        return;
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("examples/grafana/llm-filter.json"))
            .unwrap(),
    )
    .unwrap();
    let picture = std::env::var_os("LLM_FILTER_DASHBOARD_DATA");
    let rounds: usize = match &picture {
        Some(_) => std::env::var("LLM_FILTER_DASHBOARD_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(30),
        // Two: rates need a change between scrapes, and the second round's
        // timeouts take gpt-slow's breaker from shedding to rejecting.
        None => 2,
    };

    let prom_port = free_port().unwrap();
    let rig = rig(prom_port);
    let rules = workspace_root().join("examples/prometheus/llm-filter.rules.yaml");
    let scrape = with_rules(&scrape_envoys(&[rig.envoy.admin_port()]), &rules);
    let prom = PrometheusServer::start(prom_port, &scrape).expect("prometheus");
    // Traffic from the first scrape on, so that every counter's rise is seen.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !has_data(&prom.query("up == 1").await.unwrap_or_default()) {
        assert!(
            Instant::now() < deadline,
            "no scrape: {}",
            prom.log_contents()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A warning for every model: level 1, which caps P2's max_tokens.
    alerts::fire(
        &rig.envoy,
        TOKEN,
        json!({"alertname": "LLMLoad", "severity": "warning"}),
    )
    .await;

    let started = unix_now();
    for n in 0..rounds {
        round(&rig, n).await;
        if picture.is_some() {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    // What the upstreams saw: every backend chosen, b's calls failed over,
    // c's hedged, slow's timed out; the spans reached the collector.
    let count = |m: &MockUpstream| m.count("POST", CHAT);
    assert!(count(&rig.b) >= 1, "b was never chosen");
    assert!(count(&rig.c) >= 1 && count(&rig.a) >= 1);
    assert!(count(&rig.slow) >= 8);
    assert!(!rig.receiver.spans().is_empty(), "no span exported yet");

    // Until every query answers (the gauges of shared data are set every
    // 10 s, the degrade source's every second) or 40 s passed.
    let deadline = Instant::now() + Duration::from_secs(40);
    let missing = loop {
        let missing = targets_without_data(&prom, &dashboard).await;
        if missing.is_empty() || Instant::now() >= deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert!(
        missing.is_empty(),
        "panels with no data:\n{}\n{}",
        missing.join("\n"),
        prom.log_contents()
    );
    // The exempt queries are the ones the list names, no more.
    for (name, reason) in NOT_IN_A_HEALTHY_RUN {
        assert!(!reason.is_empty());
        let used = targets(&dashboard)
            .iter()
            .any(|(_, expr)| metrics_of(expr).contains(name));
        assert!(used, "{name} is exempt but no panel reads it");
    }
    if let Some(path) = picture {
        write_ranges(&prom, &dashboard, started, &path).await;
    }
}

/// `(panel title, expr)` of every target of every panel.
fn targets(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The queries that returned no number now, each with what it returned;
/// those of [`NOT_IN_A_HEALTHY_RUN`] are not asked.
async fn targets_without_data(prom: &PrometheusServer, dashboard: &Value) -> Vec<String> {
    let exempt = |expr: &str| {
        metrics_of(expr).iter().any(|m| {
            NOT_IN_A_HEALTHY_RUN
                .iter()
                .any(|(name, _)| m.starts_with(name))
        })
    };
    let mut missing = Vec::new();
    for (title, expr) in targets(dashboard) {
        if exempt(&expr) {
            continue;
        }
        let q = substituted(dashboard, &expr, RATE_INTERVAL, "5s");
        let samples = prom.query(&q).await.unwrap_or_else(|e| panic!("{e}"));
        if !has_data(&samples) {
            missing.push(format!("{title}: {q} → {samples:?}"));
        }
    }
    missing
}

/// Writes the dashboard to `path` with each target's range since `started`
/// (`series`) and the run's `range`, for scripts/dashboard_picture.py.
async fn write_ranges(
    prom: &PrometheusServer,
    dashboard: &Value,
    started: f64,
    path: &std::ffi::OsStr,
) {
    let end = unix_now();
    let step = ((end - started) / 120.0).max(2.0);
    let mut out = dashboard.clone();
    for p in out["panels"].as_array_mut().unwrap() {
        for t in p["targets"].as_array_mut().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap().to_string();
            let q = substituted(dashboard, &expr, "20s", "5s");
            let series = prom.query_range(&q, started, end, step).await.unwrap();
            t["series"] = Value::Array(series);
        }
    }
    out["range"] = json!({"start": started, "end": end, "step": step});
    std::fs::write(path, serde_json::to_string(&out).unwrap()).unwrap();
    eprintln!("dashboard data written to {}", path.to_string_lossy());
}
