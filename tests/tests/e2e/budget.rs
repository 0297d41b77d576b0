//! Timeout budgets through the real Envoy: the caller's budget becomes the
//! router's timeout and retry headers (seen upstream as Envoy's
//! `x-envoy-expected-rq-timeout-ms`), a call ends at its budget with an
//! OpenAI-shaped error, Envoy's retries of one call carry one
//! `idempotency-key`, and a stream is held to the budget until its headers only.

mod breaker;

use std::time::Duration;

use llm_filter_e2e::{
    chat_body, chat_stream_body, post_json, skip_without_envoy, stream_sse, Envoy, EnvoyBuilder,
    HttpResponse, MockConfig, MockUpstream, RecordedRequest,
};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

/// The route retry settings that pair with the plan (docs/budget.md, "Envoy
/// configuration"), with short back-offs so the tests stay quick.
const ROUTE_RETRY: &str = "retry_policy:
  retry_back_off: {base_interval: 0.025s, max_interval: 0.25s}
  rate_limited_retry_back_off:
    reset_headers:
    - {name: retry-after, format: SECONDS}
    max_interval: 2s
";

/// Router headers the filter writes and Envoy consumes: none may reach the upstream.
const ROUTER_HEADERS: [&str; 5] = [
    "x-envoy-upstream-rq-timeout-ms",
    "x-envoy-upstream-rq-per-try-timeout-ms",
    "x-envoy-max-retries",
    "x-envoy-retry-on",
    "x-envoy-retriable-status-codes",
];

fn start(mock: &MockUpstream, config: Value, route_yaml: Option<&str>) -> Envoy {
    let mut builder = EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port());
    if let Some(yaml) = route_yaml {
        builder = builder.extra_route_yaml(yaml);
    }
    builder.start().expect("envoy with the filter")
}

async fn call(envoy: &Envoy, content: &str, headers: &[(&str, &str)]) -> HttpResponse {
    post_json(&envoy.url(CHAT), &chat_body("gpt-4o", content), headers)
        .await
        .unwrap_or_else(|e| panic!("{content}: {e:#}"))
}

/// The timeout Envoy told the upstream about, in ms.
fn expected_timeout(seen: &RecordedRequest) -> u64 {
    seen.header("x-envoy-expected-rq-timeout-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no x-envoy-expected-rq-timeout-ms in {:?}", seen.headers))
}

fn is_key(key: &str) -> bool {
    key.len() == 32 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Asserts an OpenAI-shaped error reply: status, JSON content type, and
/// `{"error":{"message","type","code"}}` with this `code`.
fn assert_openai_error(r: &HttpResponse, status: u16, code: &str, case: &str) {
    assert_eq!(r.status, status, "{case}: {}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "{case}: {:?}",
        r.headers
    );
    let body = r.json();
    let error = body["error"].as_object().unwrap_or_else(|| {
        panic!("{case}: not an OpenAI error body: {}", r.text());
    });
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{case}: {body}");
    assert_eq!(error["code"], code, "{case}: {body}");
    assert!(error["type"].is_string(), "{case}: {body}");
    // A spent budget: OpenAI's SDKs must not retry it (they obey this header).
    let spent = status == 504;
    assert_eq!(
        r.header("x-should-retry"),
        spent.then_some("false"),
        "{case}: {:?}",
        r.headers
    );
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{case}: {body}"
    );
}

#[tokio::test]
async fn caller_budget_becomes_the_timeout_the_upstream_sees() {
    if skip_without_envoy("caller_budget_becomes_the_timeout_the_upstream_sees") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("budget-headers"));
    let config = json!({"budget": {
        "default_ms": {"P0": 9000, "P1": 7000, "P2": 5000},
        "max_ms": 20000
    }});
    let envoy = start(&mock, config, None);

    // Headers sent, budget expected. Invalid values fall back to the default
    // of the call's priority and never fail the call.
    let rows: [(&[(&str, &str)], u64); 17] = [
        (&[("x-request-timeout-ms", "4000")], 4000),
        (&[("grpc-timeout", "3S")], 3000),
        (&[("grpc-timeout", "2500m")], 2500),
        (
            &[("x-request-timeout-ms", "4000"), ("grpc-timeout", "2S")],
            4000,
        ),
        (
            &[("x-request-timeout-ms", "soon"), ("grpc-timeout", "2S")],
            2000,
        ),
        (&[], 7000),
        (&[("x-request-priority", "P0")], 9000),
        (
            &[
                ("x-request-priority", "P2"),
                ("x-request-timeout-ms", "abc"),
            ],
            5000,
        ),
        (&[("x-request-timeout-ms", "0")], 7000),
        (&[("x-request-timeout-ms", "-5")], 7000),
        (&[("x-request-timeout-ms", "1.5")], 7000),
        (&[("x-request-timeout-ms", "")], 7000),
        (&[("grpc-timeout", "5x")], 7000),
        (&[("grpc-timeout", "123456789S")], 7000),
        // Longer than anything: held to `max_ms`.
        (&[("x-request-timeout-ms", "99999999999999999999")], 20000),
        // A client's own router headers do not outgrow or cut the plan.
        (
            &[
                ("x-request-timeout-ms", "3000"),
                ("x-envoy-upstream-rq-timeout-ms", "60000"),
            ],
            3000,
        ),
        (
            &[
                ("x-request-timeout-ms", "3000"),
                ("x-envoy-upstream-rq-per-try-timeout-ms", "100"),
            ],
            3000,
        ),
    ];
    let mut keys = Vec::new();
    for (headers, want) in rows {
        let case = format!("{headers:?}");
        mock.clear();
        let r = call(&envoy, "budget headers", headers).await;
        assert_eq!(r.status, 200, "{case}: {}", r.text());
        let seen = mock.last_request().expect("upstream saw the call");
        let got = expected_timeout(&seen);
        // The budget runs from the request headers; the router reads it a
        // moment later. Generous for a loaded machine, tight enough to tell
        // the rows apart.
        assert!(
            got <= want && got + 400 >= want,
            "{case}: upstream was told {got} ms, budget {want} ms"
        );
        for header in ROUTER_HEADERS {
            assert_eq!(
                seen.header(header),
                None,
                "{case}: {header} reached the upstream"
            );
        }
        let key = seen
            .header("idempotency-key")
            .unwrap_or_default()
            .to_string();
        assert!(is_key(&key), "{case}: idempotency-key {key:?}");
        keys.push(key);
    }
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), rows.len(), "one key per call");
}

#[tokio::test]
async fn budget_shorter_than_the_backend_ends_at_the_budget() {
    if skip_without_envoy("budget_shorter_than_the_backend_ends_at_the_budget") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        default_delay_ms: 5000,
        ..MockConfig::named("budget-slow")
    });
    let envoy = start(&mock, json!({}), Some(ROUTE_RETRY));
    for (header, value, budget_ms) in [
        ("x-request-timeout-ms", "500", 500u64),
        ("grpc-timeout", "700m", 700),
    ] {
        let case = format!("{header}: {value}");
        mock.clear();
        let r = call(&envoy, "slow backend", &[(header, value)]).await;
        let elapsed = r.elapsed.as_millis() as u64;
        eprintln!("{case}: answered 504 after {elapsed} ms");
        assert_openai_error(&r, 504, "llm_filter_upstream_timeout", &case);
        assert_eq!(r.json()["error"]["type"], "timeout", "{case}");
        assert!(r.header("x-trace-id").is_some(), "{case}: {:?}", r.headers);
        // At the budget, not before and not at the backend's 5 s.
        assert!(
            elapsed + 50 >= budget_ms && elapsed < budget_ms + 1500,
            "{case}: answered after {elapsed} ms"
        );
        // No retry fits in a budget below `min_per_try_ms`.
        assert_eq!(mock.request_count(), 1, "{case}");
    }
}

#[tokio::test]
async fn stream_is_held_to_the_budget_until_its_headers_only() {
    if skip_without_envoy("stream_is_held_to_the_budget_until_its_headers_only") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        chunk_delay_ms: 250,
        ..MockConfig::named("budget-stream")
    });
    let envoy = start(&mock, json!({}), Some(ROUTE_RETRY));
    let url = envoy.url(CHAT);

    // A healthy stream outlives its 1 s budget: it started in time.
    let body = chat_stream_body("gpt-4o", "tell me a long story please", false);
    let s = stream_sse(&url, &body, &[("x-request-timeout-ms", "1000")])
        .await
        .expect("stream");
    assert_eq!(s.status, 200);
    assert!(s.done(), "the stream ran to [DONE]: {:?}", s.trailing);
    let took = s
        .events
        .last()
        .map(|e| e.at - s.sent_at)
        .unwrap_or_default();
    assert!(took > Duration::from_millis(1500), "stream took {took:?}");
    // The budget bounded the wait for the response headers (per try).
    let seen = mock.last_request().expect("upstream saw the stream");
    let told = expected_timeout(&seen);
    assert!((600..=1000).contains(&told), "upstream was told {told} ms");

    // A stream whose headers do not come within the budget ends at it.
    mock.clear();
    let r = post_json(
        &url,
        &chat_stream_body("gpt-4o", "never starts", false),
        &[("x-request-timeout-ms", "800"), ("x-mock-delay-ms", "5000")],
    )
    .await
    .expect("call");
    let elapsed = r.elapsed.as_millis() as u64;
    eprintln!("stream without headers: answered 504 after {elapsed} ms");
    assert_openai_error(&r, 504, "llm_filter_upstream_timeout", "stream");
    assert!(elapsed + 50 >= 800 && elapsed < 800 + 1500, "{elapsed} ms");
}

#[tokio::test]
async fn a_retried_call_carries_one_idempotency_key() {
    if skip_without_envoy("a_retried_call_carries_one_idempotency_key") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("budget-retry"));
    let envoy = start(&mock, json!({}), Some(ROUTE_RETRY));

    // (client key, attempts the mock fails, attempts expected, client status)
    for (client_key, fail_first, attempts, status) in [
        (None, "1", 2, 200),
        (Some("client-key-7"), "1", 2, 200),
        // More failures than the plan's retries (2): the mock's 503 goes back.
        (None, "5", 3, 503),
    ] {
        let case = format!("key {client_key:?}, failing {fail_first}");
        mock.clear();
        let mut headers = vec![
            ("x-mock-fail-first", fail_first),
            ("x-request-timeout-ms", "10000"),
        ];
        if let Some(key) = client_key {
            headers.push(("idempotency-key", key));
        }
        let r = call(&envoy, &case, &headers).await;
        assert_eq!(r.status, status, "{case}: {}", r.text());
        let seen = mock.requests();
        assert_eq!(seen.len(), attempts, "{case}");
        let keys: Vec<&str> = seen
            .iter()
            .map(|s| s.header("idempotency-key").unwrap_or_default())
            .collect();
        assert!(keys.iter().all(|k| *k == keys[0]), "{case}: {keys:?}");
        match client_key {
            Some(key) => assert_eq!(keys[0], key, "{case}: the client's key is kept"),
            None => assert!(is_key(keys[0]), "{case}: {keys:?}"),
        }
        // Each retry is told what is left of the one budget.
        let told: Vec<u64> = seen.iter().map(expected_timeout).collect();
        assert!(told.windows(2).all(|w| w[1] <= w[0]), "{case}: {told:?}");
        assert!(told.iter().all(|t| *t <= 10_000), "{case}: {told:?}");
    }
}

#[tokio::test]
async fn a_stuck_try_is_cut_by_observed_latency_and_retried_within_the_budget() {
    if skip_without_envoy("a_stuck_try_is_cut_by_observed_latency_and_retried_within_the_budget") {
        return;
    }
    let mock = MockUpstream::start(MockConfig {
        default_delay_ms: 100,
        ..MockConfig::named("budget-latency")
    });
    // A routed model: the cluster's measured latency feeds the per-try timeout.
    // Probes are pushed past the test so none takes the scripted stall.
    let config = json!({
        "routing": {"models": {"gpt-4o": [{"cluster": "mock"}]}, "probe_interval_s": 3600},
        "budget": {"min_per_try_ms": 200}
    });
    let envoy = start(&mock, config, Some(ROUTE_RETRY));
    for _ in 0..5 {
        let r = call(&envoy, "warm up", &[("x-request-timeout-ms", "5000")]).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // Each try gets 3 × the observed ~100 ms; the 5 s budget fits retries.
    mock.clear();
    mock.push_script(llm_filter_e2e::Script {
        delay_ms: Some(5000),
        ..Default::default()
    });
    let r = call(&envoy, "one stuck try", &[("x-request-timeout-ms", "5000")]).await;
    let elapsed = r.elapsed.as_millis() as u64;
    eprintln!("stuck first try: answered 200 after {elapsed} ms");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(elapsed < 2000, "the stuck try was cut short: {elapsed} ms");
    let seen = mock.requests();
    assert_eq!(seen.len(), 2, "the stuck try and its retry");
    let told: Vec<u64> = seen.iter().map(expected_timeout).collect();
    assert!(
        told.iter().all(|t| (250..=1000).contains(t)),
        "per-try timeouts told upstream: {told:?}"
    );
    assert_eq!(
        seen[0].header("idempotency-key"),
        seen[1].header("idempotency-key")
    );
}

#[tokio::test]
async fn a_budget_spent_before_forwarding_is_answered_locally() {
    if skip_without_envoy("a_budget_spent_before_forwarding_is_answered_locally") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("budget-spent"));
    let envoy = start(&mock, json!({}), None);
    // The body comes after the whole 200 ms budget: nothing left to forward with.
    let (raw, sent) = slow_upload(envoy.port(), "slow upload", 200, 400).await;
    let answered_in = sent.elapsed();
    eprintln!("budget spent: answered {answered_in:?} after the body");
    assert!(raw.starts_with("HTTP/1.1 504"), "{raw}");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_default();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("x-should-retry: false"),
        "{head}"
    );
    let body: Value = serde_json::from_str(body).unwrap_or_default();
    assert_eq!(
        body["error"]["code"], "llm_filter_budget_exhausted",
        "{raw}"
    );
    assert_eq!(mock.request_count(), 0, "never forwarded");
    assert!(answered_in < Duration::from_millis(500), "{answered_in:?}");
    let rejected = envoy.wait_for_metric(
        "llm_filter_budget_rejected_total",
        &[("priority", "P1"), ("reason", "budget_exhausted")],
        1.0,
        Duration::from_secs(20),
    );
    assert_eq!(rejected, 1.0);
}

/// Two Envoys with the filter in a row, as an app's sidecar and the
/// gateway tier behind it: the first rewrites `x-request-timeout-ms` to what
/// is left of the caller's budget when the call leaves it (a slow upload
/// spent 800 ms of 3000 there), so the second plans within that, not within
/// the caller's whole budget; the provider sees the second's plan.
#[tokio::test]
async fn the_next_hop_plans_within_what_this_one_left() {
    if skip_without_envoy("the_next_hop_plans_within_what_this_one_left") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("behind-the-gateway"));
    let gateway = start(&mock, json!({}), None);
    let sidecar = EnvoyBuilder::new()
        .plugin_config(json!({}))
        .upstream("gateway", gateway.port())
        .start()
        .expect("the first hop");
    let (raw, _) = slow_upload(sidecar.port(), "a slow upload through two hops", 3000, 800).await;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let seen = mock.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let told = |name: &str| -> u64 {
        seen[0]
            .header(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {:?}", seen[0].headers))
    };
    // The gateway's own plan (Envoy's timeout, told upstream) and the
    // budget it passes on: within the 2200 ms the first hop had left, not
    // the caller's 3000.
    for name in ["x-envoy-expected-rq-timeout-ms", "x-request-timeout-ms"] {
        let ms = told(name);
        assert!((1000..=2250).contains(&ms), "{name}: {ms} ms");
    }
}

/// A chat call to `port` whose body follows its headers (budget
/// `budget_ms`) after `delay_ms`: the whole answer, as text, and when the
/// body went.
async fn slow_upload(
    port: u16,
    content: &str,
    budget_ms: u64,
    delay_ms: u64,
) -> (String, std::time::Instant) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let body = chat_body("gpt-4o", content).to_string();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: llm\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-request-timeout-ms: {budget_ms}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("head");
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    let sent = std::time::Instant::now();
    stream.write_all(body.as_bytes()).await.expect("body");
    // Read up to the end of the answer's body (Envoy may close the
    // connection a while later).
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !complete(&raw) {
        let n = stream.read(&mut buf).await.expect("answer");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    (String::from_utf8_lossy(&raw).into_owned(), sent)
}

/// A whole HTTP/1.1 answer with a `content-length` body is in `raw`.
fn complete(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .is_some_and(|len| body.len() >= len)
}

/// The virtual-host settings docs/budget.md pairs with the plan, as in
/// `envoy/envoy.yaml`.
const VHOST: &str = "include_attempt_count_in_response: true
retry_policy:
  retry_back_off: {base_interval: 0.1s, max_interval: 1s}
  rate_limited_retry_back_off:
    reset_headers:
    - {name: retry-after, format: SECONDS}
    max_interval: 10s
";

#[tokio::test]
async fn the_documented_route_settings_pair_with_the_plan() {
    if skip_without_envoy("the_documented_route_settings_pair_with_the_plan") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("budget-vhost"));
    let envoy = EnvoyBuilder::new()
        .plugin_config(json!({}))
        .upstream("mock", mock.port())
        .virtual_host_yaml(VHOST)
        .start()
        .expect("envoy with the filter");
    let attempts = |r: &HttpResponse| r.header("x-envoy-attempt-count").map(str::to_string);

    // A retried call reports its attempts (the retry budget counts them).
    let r = call(&envoy, "retried", &[("x-mock-fail-first", "1")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(attempts(&r).as_deref(), Some("2"));

    // A rate-limited or unavailable answer is retried (429 and 503 are
    // planned retriable statuses) after the `retry-after` it asked for, not
    // after the 0.1 s back-off.
    for status in ["429", "503"] {
        mock.clear();
        let r = call(
            &envoy,
            "rate limited",
            &[
                ("x-mock-status", status),
                ("x-mock-retry-after", "1"),
                ("x-request-timeout-ms", "10000"),
            ],
        )
        .await;
        assert_eq!(r.status.to_string(), status, "{}", r.text());
        assert_eq!(attempts(&r).as_deref(), Some("3"), "{status}");
        let seen = mock.requests();
        assert_eq!(seen.len(), 3, "{status}");
        let gaps: Vec<Duration> = seen
            .windows(2)
            .map(|w| w[1].received_at - w[0].received_at)
            .collect();
        eprintln!("{status} with retry-after: 1: retried after {gaps:?}");
        assert!(
            gaps.iter().all(|g| *g >= Duration::from_millis(900)),
            "{status}: {gaps:?}"
        );
    }

    // A `retry-after` longer than what is left of the budget: the call still
    // ends at the budget, with the OpenAI-shaped timeout.
    mock.clear();
    let r = call(
        &envoy,
        "rate limited for long",
        &[
            ("x-mock-status", "429"),
            ("x-mock-retry-after", "5"),
            ("x-request-timeout-ms", "2500"),
        ],
    )
    .await;
    let elapsed = r.elapsed.as_millis() as u64;
    eprintln!(
        "retry-after past the budget: answered {} after {elapsed} ms",
        r.status
    );
    assert_openai_error(&r, 504, "llm_filter_upstream_timeout", "retry-after 5 s");
    assert!(
        elapsed + 50 >= 2500 && elapsed < 2500 + 1500,
        "{elapsed} ms"
    );
    assert_eq!(mock.request_count(), 1);
}
