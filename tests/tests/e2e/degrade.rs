//! The Alertmanager loop and load-driven degrade through the real Envoy: the
//! filter answers its own endpoints locally (token, 401, 400, 404, never
//! forwarded), and the real Alertmanager, configured like
//! `examples/prometheus/alertmanager.yaml`, raises and clears the levels.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use llm_filter_e2e::{
    alertmanager_bin, chat_body, get, post_json, post_raw, running_in_ci, skip_without_envoy,
    workspace_root, Alertmanager, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

use crate::support::alerts;

const TOKEN: &str = "e2e-admin-token-0123456789";

fn envoy(mock: &MockUpstream, config: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// The webhook of one alert, as Alertmanager sends it.
fn webhook(status: &str, labels: Value) -> String {
    alerts::webhook(status, labels, "e2e0000000000001")
}

/// `GET /llm-filter/state`, parsed.
async fn state(envoy: &Envoy) -> Value {
    let r = get(
        &envoy.url("/llm-filter/state"),
        &[("authorization", &bearer())],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Polls the state until `level_of` says `want`, up to `within`.
async fn wait_for_level(envoy: &Envoy, model: &str, want: u64, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let s = state(envoy).await;
        if s["levels"][model] == want || Instant::now() >= deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn admin_endpoints_are_answered_locally_and_need_the_token() {
    if skip_without_envoy("admin_endpoints_are_answered_locally_and_need_the_token") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("admin"));
    let envoy = envoy(&mock, json!({"admin": {"token": TOKEN}}));
    let url = envoy.url("/llm-filter/alerts");
    let firing = webhook(
        "firing",
        json!({"alertname": "LLMDown", "severity": "critical"}),
    );

    for auth in [None, Some("Bearer not-the-token-at-all"), Some(TOKEN)] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
        let r = post_raw(&url, &firing, &headers).await.unwrap();
        assert_eq!(r.status, 401, "{auth:?}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "unauthorized");
    }
    let oversized = format!(
        r#"{{"version":"4","alerts":[],"pad":"{}"}}"#,
        "x".repeat(300_000)
    );
    for body in ["{", r#"{"version":"3","alerts":[]}"#, oversized.as_str()] {
        let r = post_raw(&url, body, &[("authorization", &bearer())])
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    }
    assert_eq!(state(&envoy).await["levels"]["*"], 0, "nothing changed");

    let r = post_raw(&url, &firing, &[("authorization", &bearer())])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["firing"], 1);
    let s = state(&envoy).await;
    assert_eq!(s["levels"]["*"], 3, "{s}");
    assert_eq!(s["alerts"][0]["alertname"], "LLMDown");

    let resolved = webhook(
        "resolved",
        json!({"alertname": "LLMDown", "severity": "critical"}),
    );
    let r = post_raw(&url, &resolved, &[("authorization", &bearer())])
        .await
        .unwrap();
    assert_eq!(r.json()["resolved"], 1);
    assert_eq!(state(&envoy).await["levels"]["*"], 0);

    let r = get(
        &envoy.url("/llm-filter/other"),
        &[("authorization", &bearer())],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(mock.request_count(), 0, "nothing went upstream");
}

/// A webhook of `alerts`, each `(status, labels, fingerprint)`.
fn webhook_of(alerts: &[(&str, Value, Option<String>)]) -> String {
    let alerts: Vec<Value> = alerts
        .iter()
        .map(|(status, labels, fingerprint)| {
            let mut a = json!({"status": status, "labels": labels, "annotations": {},
                               "startsAt": "2026-01-01T00:00:00Z"});
            if let Some(f) = fingerprint {
                a["fingerprint"] = json!(f);
            }
            a
        })
        .collect();
    json!({"version": "4", "status": "firing", "receiver": "llm-filter", "alerts": alerts})
        .to_string()
}

/// The bounds docs/degrade.md states of a webhook, through the real Envoy:
/// 1,024 alerts and no more; labels the rules read of at most 256 bytes; at
/// most 128 labels read, past which an alert needs its own fingerprint.
#[tokio::test]
async fn the_webhooks_stated_bounds_hold() {
    if skip_without_envoy("the_webhooks_stated_bounds_hold") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("admin-bounds"));
    let envoy = envoy(&mock, json!({"admin": {"token": TOKEN}}));
    let url = envoy.url("/llm-filter/alerts");
    let post = |body: String| {
        let url = url.clone();
        async move {
            post_raw(&url, &body, &[("authorization", &bearer())])
                .await
                .unwrap()
        }
    };
    let resolved = |i: usize| {
        (
            "resolved",
            json!({"i": i.to_string()}),
            Some(format!("r{i}")),
        )
    };
    let at_bound: Vec<_> = (0..1024).map(resolved).collect();
    let r = post(webhook_of(&at_bound)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let past: Vec<_> = (0..1025).map(resolved).collect();
    let r = post(webhook_of(&past)).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("more than 1024 alerts"), "{message}");

    // A label the rules read over 256 bytes: dropped, nothing degrades.
    let long = json!({"severity": "critical", "model": "m".repeat(257)});
    let r = post(webhook_of(&[("firing", long, Some("l".into()))])).await;
    assert_eq!(r.json()["dropped"], 1, "{}", r.text());
    assert_eq!(state(&envoy).await["levels"]["*"], 0);

    // 200 labels: read up to 128, then only the ruled ones; with its own
    // fingerprint the alert is kept, without one it cannot be told apart.
    let mut many = serde_json::Map::new();
    for i in 0..200 {
        many.insert(format!("l{i:03}"), json!("v"));
    }
    many.insert("severity".into(), json!("critical"));
    let many = Value::Object(many);
    let r = post(webhook_of(&[("firing", many.clone(), None)])).await;
    assert_eq!(
        (r.json()["firing"].clone(), r.json()["dropped"].clone()),
        (json!(0), json!(1)),
        "{}",
        r.text()
    );
    assert_eq!(state(&envoy).await["levels"]["*"], 0);
    let r = post(webhook_of(&[("firing", many, Some("m1".into()))])).await;
    assert_eq!(r.json()["firing"], 1, "{}", r.text());
    assert_eq!(state(&envoy).await["levels"]["*"], 3);
    assert_eq!(mock.request_count(), 0, "nothing went upstream");
}

#[tokio::test]
async fn without_a_token_the_admin_paths_do_not_exist() {
    if skip_without_envoy("without_a_token_the_admin_paths_do_not_exist") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("admin"));
    let envoy = envoy(&mock, json!({}));
    let firing = webhook("firing", json!({"severity": "critical"}));
    let r = post_raw(
        &envoy.url("/llm-filter/alerts"),
        &firing,
        &[("authorization", &bearer())],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 404);
    let r = get(&envoy.url("/llm-filter/state"), &[]).await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(
        mock.request_count(),
        0,
        "answered by the filter, not forwarded"
    );
}

/// `SystemTime` as RFC 3339 in UTC, for Alertmanager's `endsAt`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The example's Alertmanager config, pointed at this Envoy and this mock,
/// with short group timings.
fn alertmanager_config(envoy: &Envoy, mock: &MockUpstream, token_file: &str) -> String {
    let example =
        std::fs::read_to_string(workspace_root().join("examples/prometheus/alertmanager.yaml"))
            .unwrap();
    let mut config = example.clone();
    for (from, to) in [
        ("http://llm-gateway:10000", envoy.url("")),
        ("http://127.0.0.1:5001", mock.url("")),
        ("/etc/alertmanager/llm-filter-token", token_file.to_string()),
        ("group_wait: 10s", "group_wait: 1s".to_string()),
        ("group_interval: 1m", "group_interval: 1s".to_string()),
    ] {
        assert!(config.contains(from), "the example has no {from:?}");
        config = config.replace(from, &to);
    }
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_alertmanager_raises_and_clears_the_level() {
    let test = "the_real_alertmanager_raises_and_clears_the_level";
    if skip_without_envoy(test) {
        return;
    }
    if alertmanager_bin().is_none() {
        assert!(
            !running_in_ci(),
            "{test}: no alertmanager; `make e2e` installs it"
        );
        eprintln!("SKIP {test}: no alertmanager; `make e2e` installs it");
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("am"));
    let envoy = envoy(&mock, json!({"admin": {"token": TOKEN}}));
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let config = alertmanager_config(&envoy, &mock, token_file.to_str().unwrap());
    let am = Alertmanager::start(&config).expect("alertmanager");

    let labels = json!({"alertname": "LLMTestOverload", "severity": "critical"});
    am.post_alerts(&json!([{"labels": labels}])).await.unwrap();
    let s = wait_for_level(&envoy, "*", 3, Duration::from_secs(20)).await;
    assert_eq!(s["levels"]["*"], 3, "{s}\n{}", am.log_contents());
    assert_eq!(s["alerts"][0]["alertname"], "LLMTestOverload");
    let url = envoy.url("/v1/chat/completions");
    let p2 = [("x-request-priority", "P2")];
    let r = post_json(&url, &chat_body("gpt-4o", "p2 under alert"), &p2)
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("x-llm-degraded"), Some("3"));

    am.post_alerts(&json!([{"labels": labels, "endsAt": rfc3339(SystemTime::now())}]))
        .await
        .unwrap();
    let s = wait_for_level(&envoy, "*", 0, Duration::from_secs(20)).await;
    assert_eq!(s["levels"]["*"], 0, "{s}\n{}", am.log_contents());
    assert_eq!(s["alerts"], json!([]));
    let r = post_json(&url, &chat_body("gpt-4o", "p2 recovered"), &p2)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-degraded"), None);
}

fn send_alert(
    envoy: &Envoy,
    status: &str,
    severity: &str,
) -> impl std::future::Future<Output = Value> {
    let url = envoy.url("/llm-filter/alerts");
    let body = webhook(
        status,
        json!({"alertname": "LLMLoad", "severity": severity}),
    );
    async move {
        let r = post_raw(&url, &body, &[("authorization", &bearer())])
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }
}

#[tokio::test]
async fn alert_levels_degrade_each_priority_as_configured() {
    if skip_without_envoy("alert_levels_degrade_each_priority_as_configured") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("degrade"));
    let envoy = envoy(
        &mock,
        json!({
            "admin": {"token": TOKEN},
            "cache": {"ttl_s": 1},
            "degrade": {"fallback_model": {"gpt-4o": "gpt-4o-mini"}, "max_tokens_cap": 32}
        }),
    );
    let url = envoy.url("/v1/chat/completions");
    let deterministic = json!({"model": "gpt-4o", "temperature": 0,
        "messages": [{"role": "user", "content": "a question worth keeping"}]});
    let first = post_json(&url, &deterministic, &[]).await.unwrap();
    assert_eq!(first.header("x-cache"), Some("MISS"));
    // Let the entry expire: level 3 still answers from it while it is in its slot.
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    send_alert(&envoy, "firing", "critical").await;
    let before = mock.request_count();
    let r = post_json(
        &url,
        &chat_body("gpt-4o", "p2"),
        &[("x-request-priority", "P2")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("10"));
    assert_eq!(r.header("x-llm-degraded"), Some("3"));
    assert_eq!(r.json()["error"]["code"], "llm_filter_degraded_reject");

    let r = post_json(&url, &deterministic, &[("x-request-priority", "P1")])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-downgrade"), Some("cache"));
    assert_eq!(r.header("x-cache"), Some("STALE"));
    assert_eq!(r.json(), first.json(), "the stored answer");
    assert_eq!(mock.request_count(), before, "neither went upstream");

    let mut creative = chat_body("gpt-4o", "something new");
    creative["temperature"] = json!(0.9);
    creative["max_tokens"] = json!(1000);
    let r = post_json(&url, &creative, &[("x-request-priority", "P1")])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-degraded"), Some("3"));
    let sent = mock.last_request().unwrap().json().unwrap();
    assert_eq!(sent["model"], "gpt-4o-mini");
    assert_eq!(sent["max_tokens"], 32);
    let t = sent["temperature"].as_f64().unwrap();
    assert!(t < 0.9 && t > 0.0, "temperature {t}");

    let r = post_json(&url, &creative, &[("x-request-priority", "P0")])
        .await
        .unwrap();
    assert_eq!(r.header("x-llm-degraded"), None);
    assert_eq!(
        mock.last_request().unwrap().json().unwrap(),
        creative,
        "P0 never changed"
    );

    let level = envoy.wait_for_metric(
        "llm_filter_degrade_level",
        &[("model", "gpt-4o")],
        3.0,
        Duration::from_secs(5),
    );
    assert_eq!(level, 3.0);
    for (action, priority) in [
        ("reject", "P2"),
        ("cache", "P1"),
        ("fallback_model", "P1"),
        ("max_tokens", "P1"),
        ("temperature", "P1"),
    ] {
        let n = envoy.wait_for_metric(
            "llm_filter_degraded_total",
            &[("action", action), ("priority", priority)],
            1.0,
            Duration::from_secs(5),
        );
        assert_eq!(n, 1.0, "{action} {priority}");
    }

    // A warning: level 1 only caps P2.
    send_alert(&envoy, "resolved", "critical").await;
    send_alert(&envoy, "firing", "warning").await;
    let r = post_json(&url, &creative, &[("x-request-priority", "P2")])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-llm-degraded"), Some("1"));
    let sent = mock.last_request().unwrap().json().unwrap();
    assert_eq!(
        (sent["model"].as_str(), sent["max_tokens"].as_u64()),
        (Some("gpt-4o"), Some(32))
    );
    let r = post_json(&url, &creative, &[("x-request-priority", "P1")])
        .await
        .unwrap();
    assert_eq!(r.header("x-llm-degraded"), None);
    assert_eq!(mock.last_request().unwrap().json().unwrap(), creative);
}

#[tokio::test]
async fn a_threshold_on_the_load_raises_the_level() {
    if skip_without_envoy("a_threshold_on_the_load_raises_the_level") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("threshold"));
    let envoy = envoy(
        &mock,
        json!({"degrade": {"thresholds": [{"model": "busy", "signal": "rps", "above": 0.25, "level": 2}]}}),
    );
    let url = envoy.url("/v1/chat/completions");
    let p2 = [("x-request-priority", "P2")];
    // Three calls in the 10 s window: 0.3 calls per second.
    for i in 0..3 {
        let r = post_json(&url, &chat_body("busy", &format!("q{i}")), &p2)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "call {i}: {}", r.text());
        assert_eq!(r.header("x-llm-degraded"), None);
    }
    let r = post_json(&url, &chat_body("busy", "one more"), &p2)
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("x-llm-degraded"), Some("2"));
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(r.json()["error"]["code"], "llm_filter_degraded_shed");
    // Another model is not busy.
    let r = post_json(&url, &chat_body("quiet", "hi"), &p2)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let level = envoy.wait_for_metric(
        "llm_filter_degrade_level",
        &[("model", "busy")],
        2.0,
        Duration::from_secs(5),
    );
    assert_eq!(level, 2.0);
}

/// A user the A/B rule (FNV-1a 32-bit of the user, modulo 100, against the
/// cumulative percents) puts in the first half when `first`, else the second.
fn user_in_half(first: bool) -> String {
    (0..)
        .map(|i| format!("user-{i}"))
        .find(|u| {
            let hash = u.bytes().fold(0x811c_9dc5u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            (hash % 100 < 50) == first
        })
        .unwrap()
}

#[tokio::test]
async fn a_group_overrides_what_the_level_does_to_its_calls() {
    if skip_without_envoy("a_group_overrides_what_the_level_does_to_its_calls") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("abdegrade"));
    let envoy = envoy(
        &mock,
        json!({
            "admin": {"token": TOKEN},
            "degrade": {"alerts": [{"severity": "page", "level": 2}], "max_tokens_cap": 64},
            "ab": {"groups": [
                {"name": "control", "percent": 50},
                {"name": "gentle", "percent": 50, "overrides": {"degrade": {
                    "levels": {"2": {"P2": ["max_tokens"]}}, "max_tokens_cap": 16}}}
            ]}
        }),
    );
    let url = envoy.url("/v1/chat/completions");
    let (control, gentle) = (user_in_half(true), user_in_half(false));
    let mut body = chat_body("gpt-4o", "under load");
    body["max_tokens"] = json!(1000);
    // Level 2 for every model; both groups see the same level.
    send_alert(&envoy, "firing", "page").await;
    let s = wait_for_level(&envoy, "*", 2, Duration::from_secs(5)).await;
    assert_eq!(s["levels"]["*"], 2, "{s}");

    let before = mock.request_count();
    let r = post_json(
        &url,
        &body,
        &[("x-request-priority", "P2"), ("x-user-id", &control)],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("x-user-group"), Some("control"));
    assert_eq!(r.header("x-llm-degraded"), Some("2"));
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(r.json()["error"]["code"], "llm_filter_degraded_shed");
    assert_eq!(mock.request_count(), before, "control's call was shed");

    let r = post_json(
        &url,
        &body,
        &[("x-request-priority", "P2"), ("x-user-id", &gentle)],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-user-group"), Some("gentle"));
    assert_eq!(r.header("x-llm-degraded"), Some("2"));
    assert_eq!(mock.request_count(), before + 1);
    let got = mock.last_request().unwrap();
    assert_eq!(got.header("x-user-group"), Some("gentle"));
    let sent = got.json().unwrap();
    assert_eq!(
        (sent["model"].as_str(), sent["max_tokens"].as_u64()),
        (Some("gpt-4o"), Some(16)),
        "the group's cap, not the top-level 64"
    );
    assert_eq!(sent["messages"], body["messages"]);
    for action in ["shed", "max_tokens"] {
        let n = envoy.wait_for_metric(
            "llm_filter_degraded_total",
            &[("action", action), ("priority", "P2")],
            1.0,
            Duration::from_secs(5),
        );
        assert_eq!(n, 1.0, "{action}");
    }
}

#[test]
fn rfc3339_spells_utc() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_772_323_199);
    assert_eq!(rfc3339(t), "2026-02-28T23:59:59Z");
}
