//! Health-weighted model routing through the real Envoy with several mock
//! backends: the filter picks a model's cluster by weight and health, names it
//! in `x-llm-cluster` for Envoy's `cluster_header` route, rewrites the model
//! for the backend, probes every cluster from one worker per interval, and
//! moves traffic off failing, slow and loaded backends.

mod affinity;
mod failover;
mod fallback;
mod hedge;
mod paced;
mod tail;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llm_filter_e2e::{
    chat_body, chat_stream_body, http_client, post_json, send_bytes, skip_without_envoy,
    stream_sse, Envoy, EnvoyBuilder, MockUpstream,
};
use serde_json::{json, Value};

const CLUSTER_HEADER: &str = "x-llm-cluster";
const CALLS: &str = "llm_filter_routing_calls_total";
const WEIGHT: &str = "llm_filter_routing_weight_milli";
const EJECTIONS: &str = "llm_filter_routing_ejections_total";
const PROBES: &str = "llm_filter_routing_probes_total";
const DEADLINE: Duration = Duration::from_secs(20);

/// Envoy with the filter configured by `config`, the `default` mock as the
/// catch-all route and every backend as a cluster of its own name, reached
/// through a route on `x-llm-cluster` as a routing deployment has it.
fn envoy(config: &Value, default: &MockUpstream, backends: &[&MockUpstream]) -> Envoy {
    envoy_with(config, default, backends, 2)
}

fn envoy_with(
    config: &Value,
    default: &MockUpstream,
    backends: &[&MockUpstream],
    concurrency: u32,
) -> Envoy {
    let mut builder = EnvoyBuilder::new()
        .plugin_config(config)
        .concurrency(concurrency)
        .upstream(default.name(), default.port())
        .header_route(CLUSTER_HEADER)
        .route_timeout_ms(30_000);
    for b in backends {
        builder = builder.upstream(b.name(), b.port());
    }
    builder.start().expect("envoy with the filter and routing")
}

/// One call as the client saw it.
#[derive(Debug, Clone)]
struct Reply {
    /// Since the load started, when the call was sent.
    sent: Duration,
    /// 0 when the call failed without a response.
    status: u16,
    /// `x-llm-cluster` of the answer.
    cluster: Option<String>,
    /// The start of the body of an answer that is not a 200 (or the error).
    detail: String,
}

/// `body` with a call number appended to its first message, so no two calls
/// are alike (a response cache or coalescing never answers in the backend's place).
fn numbered(body: &Value, n: usize) -> Vec<u8> {
    let mut body = body.clone();
    if let Some(Value::String(content)) = body.pointer_mut("/messages/0/content") {
        content.push_str(&format!(" #{n}"));
    }
    body.to_string().into_bytes()
}

/// When the client loops of [`drive`] stop.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// Once this long has passed since the start.
    After(Duration),
    /// Once this many calls were sent in all.
    Calls(usize),
}

/// Sends `body` (numbered) from `clients` concurrent loops until `stop`;
/// replies in the order they were sent.
async fn drive(url: &str, body: &Value, clients: usize, stop: Stop) -> Vec<Reply> {
    let start = Instant::now();
    let client = http_client();
    let body = Arc::new(body.clone());
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, body, url, next) = (
            client.clone(),
            Arc::clone(&body),
            url.to_string(),
            Arc::clone(&next),
        );
        tasks.push(tokio::spawn(async move {
            let mut replies = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let sent = start.elapsed();
                match stop {
                    Stop::After(d) if sent >= d => break,
                    Stop::Calls(max) if n >= max => break,
                    _ => {}
                }
                let r = send_bytes(
                    &client,
                    reqwest::Method::POST,
                    &url,
                    Some(numbered(&body, n)),
                    &[("content-type", "application/json")],
                )
                .await;
                let reply = match r {
                    Ok(r) => Reply {
                        sent,
                        status: r.status,
                        cluster: r.header(CLUSTER_HEADER).map(str::to_string),
                        detail: if r.status == 200 {
                            String::new()
                        } else {
                            r.text().chars().take(200).collect()
                        },
                    },
                    Err(e) => Reply {
                        sent,
                        status: 0,
                        cluster: None,
                        detail: format!("{e:#}"),
                    },
                };
                replies.push(reply);
            }
            replies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client loop"));
    }
    all.sort_by_key(|r| r.sent);
    all
}

/// Steady load: `clients` loops for `duration`.
async fn load(url: &str, body: &Value, clients: usize, duration: Duration) -> Vec<Reply> {
    drive(url, body, clients, Stop::After(duration)).await
}

/// `n` calls, `clients` at a time.
async fn calls(url: &str, body: &Value, clients: usize, n: usize) -> Vec<Reply> {
    drive(url, body, clients, Stop::Calls(n)).await
}

/// Calls per `x-llm-cluster` value (`-` for none).
fn by_cluster(replies: &[Reply]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for r in replies {
        *out.entry(r.cluster.clone().unwrap_or_else(|| "-".into()))
            .or_insert(0) += 1;
    }
    out
}

/// Share of `replies` served by `cluster`.
fn share(replies: &[Reply], cluster: &str) -> f64 {
    if replies.is_empty() {
        return 0.0;
    }
    let n = replies
        .iter()
        .filter(|r| r.cluster.as_deref() == Some(cluster))
        .count();
    n as f64 / replies.len() as f64
}

/// The calls that did not get a 200, described for messages.
fn failures(replies: &[Reply]) -> Vec<String> {
    replies
        .iter()
        .filter(|r| r.status != 200)
        .map(|r| {
            format!(
                "sent at {:?}: {} from {:?}: {}",
                r.sent, r.status, r.cluster, r.detail
            )
        })
        .collect()
}

fn window(replies: &[Reply], from: Duration, to: Duration) -> Vec<Reply> {
    replies
        .iter()
        .filter(|r| r.sent >= from && r.sent < to)
        .cloned()
        .collect()
}

fn routing_metrics(envoy: &Envoy) -> String {
    envoy
        .prometheus()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("llm_filter_routing"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn splits_calls_by_weight() {
    if skip_without_envoy("splits_calls_by_weight") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 30),
        MockUpstream::backend("b", 30),
    );
    let config = json!({"routing": {
        "models": {"gpt-4o": [
            {"cluster": "a", "weight": 3},
            {"cluster": "b", "weight": 1}
        ]}
    }});
    let envoy = envoy(&config, &default, &[&a, &b]);
    let replies = calls(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "hello"),
        8,
        400,
    )
    .await;
    let counts = by_cluster(&replies);
    eprintln!(
        "split: {counts:?}; weight of b {}",
        envoy.metric(WEIGHT, &[("llm_cluster", "b")])
    );
    assert!(failures(&replies).is_empty(), "{:?}", failures(&replies));
    let share_a = share(&replies, "a");
    // 3:1 is a share of 0.75; 400 draws have a standard deviation of 0.022,
    // and latency noise between equal backends moves the weights a little.
    assert!(
        (0.62..=0.88).contains(&share_a),
        "share of a {share_a}: {counts:?}"
    );
    assert_eq!(
        counts.get("a").copied().unwrap_or(0),
        a.count("POST", "/v1/chat/completions")
    );
    assert_eq!(
        counts.get("b").copied().unwrap_or(0),
        b.count("POST", "/v1/chat/completions")
    );
    assert_eq!(default.count("POST", "/v1/chat/completions"), 0);
    let served = envoy.wait_for_metric(CALLS, &[("outcome", "success")], 400.0, DEADLINE);
    assert_eq!(served, 400.0, "{}", routing_metrics(&envoy));
    for (cluster, n) in &counts {
        assert_eq!(
            envoy.metric(CALLS, &[("llm_cluster", cluster), ("outcome", "success")]),
            *n as f64,
            "{}",
            routing_metrics(&envoy)
        );
        // Latency by cluster: histograms show after a stats flush.
        let timed = envoy.wait_for_metric(
            "llm_filter_routing_call_duration_ms_count",
            &[("llm_cluster", cluster)],
            *n as f64,
            DEADLINE,
        );
        assert_eq!(timed, *n as f64, "{}", routing_metrics(&envoy));
    }
}

#[tokio::test]
async fn rewrites_the_model_for_the_backend() {
    if skip_without_envoy("rewrites_the_model_for_the_backend") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let azure = MockUpstream::backend("azure", 0);
    let config = json!({"routing": {
        "models": {"gpt-4o": [{"cluster": "azure", "model": "gpt-4o-2024-08-06-deployment"}]}
    }});
    let envoy = envoy(&config, &default, &[&azure]);
    let mut body = chat_body("gpt-4o", "héllo, \"world\"");
    body["temperature"] = json!(0.25);
    body["user"] = json!("u-1");
    let r = post_json(&envoy.url("/v1/chat/completions"), &body, &[])
        .await
        .expect("routed call");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header(CLUSTER_HEADER), Some("azure"));
    assert_eq!(r.header("x-mock-instance"), Some("azure"));
    assert_eq!(default.request_count(), 0);
    let got = azure
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .expect("azure got the call");
    let sent: Value = got.json().expect("JSON body");
    let mut want = body.clone();
    want["model"] = json!("gpt-4o-2024-08-06-deployment");
    assert_eq!(sent, want);
    assert_eq!(
        got.header("content-length"),
        Some(got.body.len().to_string().as_str()),
        "content-length follows the rewritten body"
    );
    assert_eq!(got.header(CLUSTER_HEADER), Some("azure"));
    // The answer names the model the backend knows.
    assert_eq!(r.json()["model"], "gpt-4o-2024-08-06-deployment");

    // A stream is routed and rewritten the same way, and streams through.
    let sse = stream_sse(
        &envoy.url("/v1/chat/completions"),
        &chat_stream_body("gpt-4o", "stream me", true),
        &[],
    )
    .await
    .expect("routed stream");
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header(CLUSTER_HEADER), Some("azure"));
    assert!(sse.done(), "{:?}", sse.events);
    assert_eq!(sse.content(), "echo: stream me [azure]");
    assert!(sse
        .chunks()
        .iter()
        .all(|c| c["model"] == "gpt-4o-2024-08-06-deployment"));
    let served = envoy.wait_for_metric(
        CALLS,
        &[("llm_cluster", "azure"), ("outcome", "success")],
        2.0,
        DEADLINE,
    );
    assert_eq!(served, 2.0, "{}", routing_metrics(&envoy));
}

#[tokio::test]
async fn unknown_model_passes_untouched() {
    if skip_without_envoy("unknown_model_passes_untouched") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let a = MockUpstream::backend("a", 0);
    let config = json!({"routing": {"models": {"gpt-4o": [{"cluster": "a", "model": "x"}]}}});
    let envoy = envoy(&config, &default, &[&a]);
    let raw = r#"{"model": "llama-3",  "messages": [{"role": "user", "content": "hi"}]}"#;
    let r = llm_filter_e2e::post_raw(&envoy.url("/v1/chat/completions"), raw, &[])
        .await
        .expect("unrouted call");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header(CLUSTER_HEADER), None);
    assert_eq!(r.header("x-mock-instance"), Some("default"));
    assert_eq!(a.count("POST", "/v1/chat/completions"), 0);
    let got = default.last_request().expect("default got the call");
    assert_eq!(got.body.as_ref(), raw.as_bytes(), "body byte for byte");
    assert_eq!(got.header(CLUSTER_HEADER), None);
}

/// How a backend fails.
#[derive(Debug, Clone, Copy)]
enum Failure {
    Status503,
    Reset,
}

/// Healthy traffic on two equal backends, then `b` fails: the filter ejects it
/// within a few calls and the clients see almost no error after that.
async fn failing_backend_is_avoided(failure: Failure) {
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 20),
        MockUpstream::backend("b", 20),
    );
    let config = json!({"routing": {
        "models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]},
        "probe_interval_s": 1,
        "probe_timeout_ms": 500
    }});
    let envoy = envoy(&config, &default, &[&a, &b]);
    let url = envoy.url("/v1/chat/completions");
    let body = chat_body("gpt-4o", "hello");
    let healthy = load(&url, &body, 8, Duration::from_secs(2)).await;
    let share_b = share(&healthy, "b");
    assert!(failures(&healthy).is_empty(), "{:?}", failures(&healthy));
    assert!(
        (0.3..=0.7).contains(&share_b),
        "healthy share of b {share_b}"
    );

    match failure {
        Failure::Status503 => b.set_status(Some(503)),
        Failure::Reset => b.set_reset(true),
    }
    let failing = load(&url, &body, 8, Duration::from_secs(6)).await;
    let errors: Vec<&Reply> = failing.iter().filter(|r| r.status != 200).collect();
    let last_error = errors.last().map(|r| r.sent);
    let last_b = failing
        .iter()
        .filter(|r| r.cluster.as_deref() == Some("b"))
        .map(|r| r.sent)
        .max();
    let after = window(&failing, Duration::from_secs(1), Duration::from_secs(6));
    let errors_after = after.iter().filter(|r| r.status != 200).count();
    eprintln!(
        "{failure:?}: {} calls, {} errors, last error sent at {last_error:?}, \
         last call to b sent at {last_b:?}, {errors_after} errors among {} calls after 1 s",
        failing.len(),
        errors.len(),
        after.len()
    );
    // The first failures eject b (3 in a row by default), so only the calls
    // already under way or routed in the same instant fail.
    assert!(errors.len() <= 20, "{} errors", errors.len());
    assert!(
        last_error.is_none_or(|t| t < Duration::from_secs(1)),
        "errors go on after the ejection: last at {last_error:?}"
    );
    assert!(
        after.len() >= 100,
        "too few calls to judge: {}",
        after.len()
    );
    assert_eq!(errors_after, 0, "errors after the ejection");
    assert!(
        after.iter().all(|r| r.cluster.as_deref() == Some("a")),
        "{:?}",
        by_cluster(&after)
    );
    let ejections = envoy.wait_for_metric(EJECTIONS, &[("llm_cluster", "b")], 1.0, DEADLINE);
    assert!(ejections >= 1.0, "{}", routing_metrics(&envoy));
    // Probes keep failing while b is down.
    let probes = envoy.wait_for_metric(
        PROBES,
        &[("llm_cluster", "b"), ("result", "fail")],
        1.0,
        DEADLINE,
    );
    assert!(probes >= 1.0, "{}", routing_metrics(&envoy));
    let outcome = match failure {
        Failure::Status503 => "server_error",
        // Envoy answers a reset itself with a 503, which the filter tells apart.
        Failure::Reset => "reset",
    };
    assert!(
        envoy.metric(CALLS, &[("llm_cluster", "b"), ("outcome", outcome)]) >= 1.0,
        "{}",
        routing_metrics(&envoy)
    );
    assert_eq!(
        envoy.metric(WEIGHT, &[("model", "gpt-4o"), ("llm_cluster", "b")]),
        0.0,
        "{}",
        routing_metrics(&envoy)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backend_answering_503_is_avoided() {
    if skip_without_envoy("backend_answering_503_is_avoided") {
        return;
    }
    failing_backend_is_avoided(Failure::Status503).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backend_resetting_connections_is_avoided() {
    if skip_without_envoy("backend_resetting_connections_is_avoided") {
        return;
    }
    failing_backend_is_avoided(Failure::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_backend_gets_a_smaller_share() {
    if skip_without_envoy("slow_backend_gets_a_smaller_share") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (fast, slow) = (
        MockUpstream::backend("fast", 100),
        MockUpstream::backend("slow", 800),
    );
    let config = json!({"routing": {
        "models": {"gpt-4o": [{"cluster": "fast"}, {"cluster": "slow"}]}
    }});
    let envoy = envoy(&config, &default, &[&fast, &slow]);
    let replies = load(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "hello"),
        8,
        Duration::from_secs(8),
    )
    .await;
    assert!(failures(&replies).is_empty(), "{:?}", failures(&replies));
    let settled = window(&replies, Duration::from_secs(3), Duration::from_secs(8));
    let share_slow = share(&settled, "slow");
    eprintln!(
        "slow vs fast: all {:?}, after 3 s {:?} (share of slow {share_slow:.3})",
        by_cluster(&replies),
        by_cluster(&settled)
    );
    // Equal weights would give half; 100 ms against 800 ms gives slow a
    // weight of 1/8, about 11% of the calls.
    assert!(settled.len() >= 100, "{}", settled.len());
    assert!(share_slow < 0.25, "share of slow {share_slow}");
    assert!(share_slow > 0.0, "slow keeps a trickle to stay measured");
    let w = envoy.metric(WEIGHT, &[("model", "gpt-4o"), ("llm_cluster", "slow")]);
    assert!((1.0..400.0).contains(&w), "weight of slow {w}");
    // Fast sets the bar for latency; only the calls it holds beyond its share
    // (the in-flight factor) may take a little off it.
    let fast_w = envoy.metric(WEIGHT, &[("model", "gpt-4o"), ("llm_cluster", "fast")]);
    assert!(
        fast_w >= 500.0 && fast_w > 2.0 * w,
        "weight of fast {fast_w}, slow {w}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healed_backend_returns_with_a_ramp() {
    if skip_without_envoy("healed_backend_returns_with_a_ramp") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (
        MockUpstream::backend("a", 20),
        MockUpstream::backend("b", 20),
    );
    // Routing alone: the budget breaker keeps b's failures in its own window
    // and may shed a call routed to b early in the ramp.
    let config = json!({
        "routing": {
            "models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]},
            "probe_interval_s": 1,
            "probe_timeout_ms": 500,
            "eject_s": 2,
            "ramp_s": 8
        },
        "budget": {"enabled": false}
    });
    let envoy = envoy(&config, &default, &[&a, &b]);
    let url = envoy.url("/v1/chat/completions");
    let body = chat_body("gpt-4o", "hello");
    b.set_status(Some(503));
    let down = load(&url, &body, 8, Duration::from_secs(3)).await;
    let late = window(&down, Duration::from_secs(1), Duration::from_secs(3));
    assert_eq!(share(&late, "b"), 0.0, "{:?}", by_cluster(&late));

    b.set_status(None);
    let up = load(&url, &body, 8, Duration::from_secs(14)).await;
    assert!(failures(&up).is_empty(), "{:?}", failures(&up));
    let back = up
        .iter()
        .find(|r| r.cluster.as_deref() == Some("b"))
        .map(|r| r.sent)
        .expect("b serves again");
    // Shares per second since b's return: a 10% start rising to half over 8 s.
    let mut shares = Vec::new();
    let mut t = back;
    while t + Duration::from_secs(1) <= Duration::from_secs(14) {
        let w = window(&up, t, t + Duration::from_secs(1));
        shares.push((share(&w, "b") * 100.0).round() / 100.0);
        t += Duration::from_secs(1);
    }
    eprintln!("b back {back:?} after healing; share of b per second since: {shares:?}");
    // Ejected for 2 s after the last failed probe, probes every second.
    assert!(back <= Duration::from_secs(5), "b back after {back:?}");
    let early = window(&up, back, back + Duration::from_secs(2));
    let settled = window(
        &up,
        back + Duration::from_secs(9),
        back + Duration::from_secs(14),
    );
    let (early_b, settled_b) = (share(&early, "b"), share(&settled, "b"));
    eprintln!(
        "share of b: first 2 s {early_b:.3} of {}, after the ramp {settled_b:.3} of {}",
        early.len(),
        settled.len()
    );
    // Weight 0.1 → 0.325 over the first 2 s: about 17% of the calls; full
    // weight after the ramp: half.
    assert!(early.len() >= 100 && settled.len() >= 100);
    assert!(early_b < 0.3, "b came back at once: {early_b}");
    assert!(settled_b > 0.38, "b did not come back: {settled_b}");
}

#[tokio::test]
async fn rules_choose_the_model() {
    if skip_without_envoy("rules_choose_the_model") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (big, small, tools) = (
        MockUpstream::backend("big", 0),
        MockUpstream::backend("small", 0),
        MockUpstream::backend("tools", 0),
    );
    let config = json!({"routing": {
        "models": {
            "llama-70b": [{"cluster": "big"}],
            "llama-8b": [{"cluster": "small", "model": "meta-llama/Llama-3.1-8B-Instruct"}],
            "tool-model": [{"cluster": "tools"}]
        },
        "rules": [
            {"when": {"model": "auto", "tools": true}, "model": "tool-model"},
            {"when": {"model": ["auto", "smart"], "min_prompt_tokens": 1000}, "model": "llama-70b"},
            {"when": {"model": "auto"}, "model": "llama-8b"}
        ]
    }});
    let envoy = envoy(&config, &default, &[&big, &small, &tools]);
    let long = "lorem ipsum ".repeat(500); // 6000 characters: about 1500 tokens
    let with_tools = {
        let mut b = chat_body("auto", "weather?");
        b["tools"] = json!([{"type": "function", "function": {"name": "weather"}}]);
        b
    };
    let cases: [(&str, Value, Option<&str>, &str); 6] = [
        (
            "long auto",
            chat_body("auto", &long),
            Some("big"),
            "llama-70b",
        ),
        (
            "long alias",
            chat_body("smart", &long),
            Some("big"),
            "llama-70b",
        ),
        (
            "short auto",
            chat_body("auto", "hi"),
            Some("small"),
            "meta-llama/Llama-3.1-8B-Instruct",
        ),
        ("tools", with_tools, Some("tools"), "tool-model"),
        (
            "a routed model by name",
            chat_body("llama-70b", "hi"),
            Some("big"),
            "llama-70b",
        ),
        // No rule for a short `smart`, and `smart` is no routed model.
        ("short alias", chat_body("smart", "hi"), None, "smart"),
    ];
    for (case, body, cluster, model) in cases {
        let r = post_json(&envoy.url("/v1/chat/completions"), &body, &[])
            .await
            .expect("call");
        assert_eq!(r.status, 200, "{case}: {}", r.text());
        assert_eq!(r.header(CLUSTER_HEADER), cluster, "{case}");
        let instance = cluster.unwrap_or("default");
        assert_eq!(r.header("x-mock-instance"), Some(instance), "{case}");
        let got = [&default, &big, &small, &tools]
            .into_iter()
            .find(|m| m.name() == instance)
            .and_then(|m| m.last_request())
            .expect("the backend got the call");
        let mut want = body.clone();
        want["model"] = json!(model);
        assert_eq!(got.json(), Some(want), "{case}");
        assert_eq!(
            got.header("content-length"),
            Some(got.body.len().to_string().as_str()),
            "{case}"
        );
    }
}

#[tokio::test]
async fn one_worker_probes_per_interval() {
    if skip_without_envoy("one_worker_probes_per_interval") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (MockUpstream::backend("a", 0), MockUpstream::backend("b", 0));
    let config = json!({"routing": {
        "models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]},
        "probe_interval_s": 1
    }});
    let envoy = envoy_with(&config, &default, &[&a, &b], 4);
    // The first interval only creates the lease; then probes flow.
    for m in [&a, &b] {
        let probed = envoy.wait_for_metric(PROBES, &[("llm_cluster", m.name())], 1.0, DEADLINE);
        assert!(probed >= 1.0, "{}", routing_metrics(&envoy));
    }
    let (a0, b0) = (a.count("GET", "/v1/models"), b.count("GET", "/v1/models"));
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(6));
    let (a1, b1) = (a.count("GET", "/v1/models"), b.count("GET", "/v1/models"));
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "probes in {elapsed:.2} s with 4 workers: a {}, b {}",
        a1 - a0,
        b1 - b0
    );
    // One per second and cluster, give or take the edges of the window and a
    // late tick; four workers probing each would send about 24.
    for n in [a1 - a0, b1 - b0] {
        assert!((3..=9).contains(&n), "{n} probes in {elapsed:.2} s");
    }
    let ok = envoy.metric(PROBES, &[("llm_cluster", "a"), ("result", "ok")]);
    assert!(ok >= (a1 - a0) as f64, "{}", routing_metrics(&envoy));
    assert_eq!(default.count("GET", "/v1/models"), 0);
    let probe = a
        .requests()
        .into_iter()
        .find(|r| r.method == "GET")
        .expect("a probe");
    assert_eq!(probe.path, "/v1/models");
    assert_eq!(probe.header("host"), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loaded_model_server_gets_less() {
    if skip_without_envoy("loaded_model_server_gets_less") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (idle, busy) = (
        MockUpstream::backend("idle", 20),
        MockUpstream::backend("busy", 20),
    );
    busy.set_load(40.0, 0.95);
    let config = json!({"routing": {
        "models": {"llama": [
            {"cluster": "idle", "metrics_path": "/metrics"},
            {"cluster": "busy", "metrics_path": "/metrics"}
        ]},
        "probe_interval_s": 1
    }});
    let envoy = envoy(&config, &default, &[&idle, &busy]);
    let url = envoy.url("/v1/chat/completions");
    let body = chat_body("llama", "hello");
    // Once the first probes read the load, the weight gauge shows it.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let _ = calls(&url, &body, 1, 5).await;
        let w = envoy.metric(WEIGHT, &[("model", "llama"), ("llm_cluster", "busy")]);
        if (1.0..200.0).contains(&w) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", routing_metrics(&envoy));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(busy.count("GET", "/metrics") >= 1);
    let loaded = calls(&url, &body, 8, 300).await;
    let share_busy = share(&loaded, "busy");
    eprintln!(
        "busy server: {:?} (share {share_busy:.3})",
        by_cluster(&loaded)
    );
    // 40 waiting and 95% KV cache floor the load factor at 0.05: about 5%.
    assert!(share_busy < 0.15, "share of busy {share_busy}");

    // Relieved: the next reading lifts the load factor back to 1. The weight
    // then only carries the latency factor, which CPU noise between two equal
    // mocks keeps near but not always at 1; loaded, it was at most 50.
    busy.set_load(0.0, 0.1);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let _ = calls(&url, &body, 1, 5).await;
        let w = envoy.metric(WEIGHT, &[("model", "llama"), ("llm_cluster", "busy")]);
        if w >= 400.0 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", routing_metrics(&envoy));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let relieved = calls(&url, &body, 8, 300).await;
    let share_busy = share(&relieved, "busy");
    eprintln!(
        "relieved server: {:?} (share {share_busy:.3})",
        by_cluster(&relieved)
    );
    assert!(share_busy > 0.2, "share once relieved {share_busy}");
}

/// A client's routing header never steers a request and never reaches an
/// upstream: whatever the path and method, LLM call or not, with routing on
/// or off (Envoy's route on the header is there in every case).
#[tokio::test]
async fn client_cluster_header_never_picks_the_cluster() {
    if skip_without_envoy("client_cluster_header_never_picks_the_cluster") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, internal) = (
        MockUpstream::backend("a", 0),
        MockUpstream::backend("internal", 0),
    );
    let routed = json!({"routing": {"models": {"gpt-4o": [{"cluster": "a"}]}}});
    let client = http_client();
    for config in [json!({}), routed] {
        let routing = config.get("routing").is_some();
        let envoy = envoy(&config, &default, &[&a, &internal]);
        let chat = |model: &str| Some(chat_body(model, "hi").to_string().into_bytes());
        let cases = [
            ("GET", "/v1/models", None, "default"),
            ("DELETE", "/v1/files/file-1", None, "default"),
            ("POST", "/v1/chat/completions", chat("llama-3"), "default"),
            (
                "POST",
                "/v1/chat/completions",
                chat("gpt-4o"),
                if routing { "a" } else { "default" },
            ),
        ];
        for (method, path, body, instance) in cases {
            let what = format!("routing {routing}, {method} {path}");
            default.clear();
            a.clear();
            let mut headers = vec![(CLUSTER_HEADER, "internal"), (CLUSTER_HEADER, "internal")];
            if body.is_some() {
                headers.push(("content-type", "application/json"));
            }
            let r = send_bytes(
                &client,
                method.parse().expect("method"),
                &envoy.url(path),
                body,
                &headers,
            )
            .await
            .expect("call");
            assert_eq!(
                r.header("x-mock-instance"),
                Some(instance),
                "{what}: {}",
                r.text()
            );
            let served = if instance == "a" { &a } else { &default };
            // (Probes reach `a` too; the call is the last one on its path.)
            let seen = served
                .requests()
                .into_iter()
                .rev()
                .find(|q| q.path == path)
                .expect("the upstream got the call");
            // Only the filter's own choice travels upstream, never the client's.
            let expected: Vec<&str> = if instance == "a" { vec!["a"] } else { vec![] };
            assert_eq!(seen.header_all(CLUSTER_HEADER), expected, "{what}");
        }
        assert_eq!(internal.request_count(), 0, "routing {routing}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_giving_up_do_not_eject_a_backend() {
    if skip_without_envoy("clients_giving_up_do_not_eject_a_backend") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (MockUpstream::backend("a", 0), MockUpstream::backend("b", 0));
    // Routing alone: the budget breaker has its own view of abandoned calls.
    let config = json!({
        "routing": {"models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]}},
        "budget": {"enabled": false}
    });
    let envoy = envoy(&config, &default, &[&a, &b]);
    let url = envoy.url("/v1/chat/completions");
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let body = chat_body("gpt-4o", "hi");
    let slow = [
        ("content-type", "application/json"),
        ("x-mock-delay-ms", "3000"),
    ];
    for i in 0..10 {
        let r = send_bytes(
            &impatient,
            reqwest::Method::POST,
            &url,
            Some(numbered(&body, i)),
            &slow,
        )
        .await;
        assert!(r.is_err(), "the client gave up");
    }
    let cancelled = envoy.wait_for_metric(CALLS, &[("outcome", "cancelled")], 10.0, DEADLINE);
    assert_eq!(cancelled, 10.0, "{}", routing_metrics(&envoy));
    assert_eq!(
        envoy.metric(EJECTIONS, &[]),
        0.0,
        "{}",
        routing_metrics(&envoy)
    );
    for cluster in ["a", "b"] {
        assert_eq!(
            envoy.metric("llm_filter_routing_in_flight", &[("llm_cluster", cluster)]),
            0.0,
            "{}",
            routing_metrics(&envoy)
        );
    }
    // Both still take calls (in shares their measured latencies set).
    let replies = calls(&url, &chat_body("gpt-4o", "hi"), 4, 100).await;
    let counts = by_cluster(&replies);
    assert!(failures(&replies).is_empty(), "{:?}", failures(&replies));
    assert!((0.05..=0.95).contains(&share(&replies, "a")), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_unknown_to_envoy_is_ejected() {
    if skip_without_envoy("cluster_unknown_to_envoy_is_ejected") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let a = MockUpstream::backend("a", 20);
    let config = json!({"routing": {
        "models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "ghost"}]},
        "probe_interval_s": 1
    }});
    let envoy = envoy(&config, &default, &[&a]);
    // The first probe of `ghost` fails to dispatch, which ejects it at once.
    let failed = envoy.wait_for_metric(
        PROBES,
        &[("llm_cluster", "ghost"), ("result", "fail")],
        1.0,
        DEADLINE,
    );
    assert!(failed >= 1.0, "{}", routing_metrics(&envoy));
    let replies = calls(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "hi"),
        4,
        100,
    )
    .await;
    assert!(
        replies
            .iter()
            .all(|r| r.status == 200 && r.cluster.as_deref() == Some("a")),
        "{:?}",
        by_cluster(&replies)
    );
    assert!(envoy.metric(EJECTIONS, &[("llm_cluster", "ghost")]) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_backend_out_falls_back_to_base_weights() {
    if skip_without_envoy("every_backend_out_falls_back_to_base_weights") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (a, b) = (MockUpstream::backend("a", 0), MockUpstream::backend("b", 0));
    a.set_status(Some(503));
    b.set_status(Some(503));
    // Routing alone: the budget breaker would answer for failing backends.
    let config = json!({
        "routing": {"models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]}},
        "budget": {"enabled": false}
    });
    let envoy = envoy(&config, &default, &[&a, &b]);
    let url = envoy.url("/v1/chat/completions");
    let body = chat_body("gpt-4o", "hi");
    let down = calls(&url, &body, 1, 40).await;
    for m in [&a, &b] {
        let ejected = envoy.wait_for_metric(EJECTIONS, &[("llm_cluster", m.name())], 1.0, DEADLINE);
        assert!(ejected >= 1.0, "{}", routing_metrics(&envoy));
    }
    // Both out: calls still reach both backends rather than fail locally.
    assert!(down.iter().all(|r| r.status == 503));
    let fallback = envoy.metric("llm_filter_routing_fallbacks_total", &[("model", "gpt-4o")]);
    assert!(fallback >= 1.0, "{}", routing_metrics(&envoy));
    let after = calls(&url, &body, 2, 40).await;
    assert!(
        after.iter().all(|r| r.cluster.is_some()),
        "{:?}",
        by_cluster(&after)
    );
    assert!(
        share(&after, "a") > 0.0 && share(&after, "b") > 0.0,
        "{:?}",
        by_cluster(&after)
    );
    // Healed, they serve again; the fallback ends with the ejections.
    a.set_status(None);
    b.set_status(None);
    let r = post_json(&url, &body, &[]).await.expect("call");
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A provider that counts twice the tokens the filter estimates moves the
/// model's ratio (its gauge), and the prompt-length rule then weighs the
/// same prompt as twice as long.
#[tokio::test]
async fn prompt_length_rules_weigh_the_calibrated_estimate() {
    if skip_without_envoy("prompt_length_rules_weigh_the_calibrated_estimate") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (big, small) = (
        MockUpstream::backend("big", 0),
        MockUpstream::backend("small", 0),
    );
    for m in [&big, &small] {
        m.set_prompt_token_scale(Some(2.0));
    }
    let config = json!({"routing": {
        "models": {"llama-70b": [{"cluster": "big"}], "llama-8b": [{"cluster": "small"}]},
        "rules": [
            {"when": {"model": "auto", "min_prompt_tokens": 300}, "model": "llama-70b"},
            {"when": {"model": "auto"}, "model": "llama-8b"}
        ]
    }});
    let envoy = envoy(&config, &default, &[&big, &small]);
    // 200 words of three letters: 200 estimated tokens (letters and spaces a
    // quarter each), which the mock counts as 200 words and reports as 400.
    let body = chat_body("auto", &vec!["abc"; 200].join(" "));
    let url = envoy.url("/v1/chat/completions");
    let r = post_json(&url, &body, &[]).await.expect("call");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header(CLUSTER_HEADER), Some("small"), "200 < 300");
    let got = small.last_request().unwrap().json().unwrap();
    assert_eq!(got["model"], "llama-8b");
    let stat = "wasmcustom.llm_filter_token_estimate_ratio_millimodel=.=auto;.;";
    let ratio = envoy.wait_for_stat(stat, 2000, Duration::from_secs(5));
    assert_eq!(ratio, 2000, "the ratio learnt from reported / estimated");
    assert_eq!(
        envoy.metric(
            "llm_filter_token_estimate_ratio_milli",
            &[("model", "auto")]
        ),
        2000.0
    );
    // The same prompt is 400 of the model's tokens now: the big model.
    let r = post_json(&url, &body, &[]).await.expect("call");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header(CLUSTER_HEADER), Some("big"));
    let got = big.last_request().unwrap().json().unwrap();
    assert_eq!(got["model"], "llama-70b");
    assert_eq!(got["messages"], body["messages"]);
    assert_eq!(small.request_count(), 1);
}
