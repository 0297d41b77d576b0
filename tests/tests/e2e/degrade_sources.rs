//! The degrade sources a mesh shares, through two real Envoys: the real
//! Alertmanager, which neither Envoy is known to, pulled by both; the real
//! Prometheus, scraping both, whose mesh-wide load drives both; and each
//! source down, slow or answering garbage.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use llm_filter_e2e::{
    alertmanager_bin, chat_body, post_json, prometheus_bin,
    prometheus_server::{free_port, scrape_envoys},
    running_in_ci, skip_without_envoy, unique, Alertmanager, Envoy, EnvoyBuilder, MockConfig,
    MockUpstream, PrometheusServer,
};
use serde_json::{json, Value};

use crate::degrade::rfc3339;

const PULLS: &str = "llm_filter_degrade_pulls_total";

/// Skips (outside CI) or fails (in CI) a test whose server is not installed.
fn missing(test: &str, what: &str, found: bool) -> bool {
    if skip_without_envoy(test) {
        return true;
    }
    if !found {
        assert!(
            !running_in_ci(),
            "{test}: no {what}; `make e2e` installs it"
        );
        eprintln!("SKIP {test}: no {what}; `make e2e` installs it");
        return true;
    }
    false
}

fn envoy(mock: &MockUpstream, source: (&str, u16), config: &Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .upstream(source.0, source.1)
        .start()
        .expect("envoy with the filter")
}

/// The status and `x-llm-degraded` of one call of `priority` through `envoy`.
async fn call(envoy: &Envoy, priority: &str) -> (u16, Option<String>) {
    let body = chat_body("gpt-4o", &unique("degrade sources"));
    let r = post_json(
        &envoy.url("/v1/chat/completions"),
        &body,
        &[("x-request-priority", priority)],
    )
    .await
    .expect("call");
    (r.status, r.header("x-llm-degraded").map(str::to_string))
}

/// Polls until a P2 call through every one of `envoys` gets `want`, up to
/// `within`; how long it took, `None` when it never did.
async fn until_p2(envoys: &[&Envoy], want: u16, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    loop {
        let mut all = true;
        for e in envoys {
            all &= call(e, "P2").await.0 == want;
        }
        if all {
            return Some(start.elapsed());
        }
        if start.elapsed() >= within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A source gone bad on `port`: each connection in turn is answered 200 with
/// a body that is no API's answer, or held past the pull's timeout and
/// dropped. Stops when the flag is cleared.
fn bad_source(port: u16) -> Arc<AtomicBool> {
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("the source's port is free");
    listener.set_nonblocking(true).unwrap();
    let running = Arc::new(AtomicBool::new(true));
    let flag = running.clone();
    std::thread::spawn(move || {
        let mut n = 0u32;
        while flag.load(Ordering::Relaxed) {
            let Ok((mut conn, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            n += 1;
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            if n.is_multiple_of(2) {
                std::thread::sleep(Duration::from_millis(1500));
                continue;
            }
            let body = "{\"status\":\"garbage\"";
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    running
}

fn pulls(envoys: &[&Envoy], what: &str, result: &str) -> f64 {
    envoys
        .iter()
        .map(|e| e.metric(PULLS, &[("what", what), ("result", result)]))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_alertmanager_never_heard_of_degrade_and_recover_together() {
    let test = "two_envoys_alertmanager_never_heard_of_degrade_and_recover_together";
    if missing(test, "alertmanager", alertmanager_bin().is_some()) {
        return;
    }
    // Alertmanager routes to a receiver that sends nothing: nobody pushes.
    let mut am = Alertmanager::start(
        "route: {receiver: nobody, group_wait: 1s, group_interval: 1s, repeat_interval: 1h}\n\
         receivers: [{name: nobody}]\n",
    )
    .expect("alertmanager");
    let mock = MockUpstream::start(MockConfig::named("sources"));
    let config = json!({"degrade": {
        "alert_ttl_s": 6,
        "alerts": [{"alertname": "LLMTestOverload", "level": 2}],
        "alertmanager": {"cluster": "alertmanager", "interval_s": 1, "timeout_ms": 500,
                         "filters": ["team=\"llm\""]}}});
    let a = envoy(&mock, ("alertmanager", am.port()), &config);
    let b = envoy(&mock, ("alertmanager", am.port()), &config);
    let both = [&a, &b];
    assert!(until_p2(&both, 200, Duration::from_secs(5)).await.is_some());

    // One alert of another team is not read; the team's alert degrades both.
    let other = json!({"alertname": "LLMTestOverload", "team": "search"});
    am.post_alerts(&json!([{"labels": other}])).await.unwrap();
    let labels = json!({"alertname": "LLMTestOverload", "team": "llm", "severity": "page"});
    am.post_alerts(&json!([{"labels": labels}])).await.unwrap();
    let took = until_p2(&both, 503, Duration::from_secs(10)).await;
    assert!(took.is_some(), "both shed P2\n{}", am.log_contents());
    for e in both {
        let (status, level) = call(e, "P1").await;
        assert_eq!(
            (status, level.as_deref()),
            (200, Some("2")),
            "P1 degraded, served"
        );
        assert_eq!(call(e, "P0").await, (200, None), "P0 untouched");
    }
    assert!(pulls(&both, "alertmanager", "ok") >= 2.0);

    // Resolved: both recover within an interval or so.
    let ended = json!([{"labels": labels, "endsAt": rfc3339(SystemTime::now())}]);
    am.post_alerts(&ended).await.unwrap();
    let took = until_p2(&both, 200, Duration::from_secs(5)).await;
    assert!(took.is_some(), "both recovered\n{}", am.log_contents());

    // Fired again, then Alertmanager goes down and its port answers garbage
    // or nothing: the level holds until alert_ttl_s, then falls.
    am.post_alerts(&json!([{"labels": labels}])).await.unwrap();
    assert!(until_p2(&both, 503, Duration::from_secs(10))
        .await
        .is_some());
    let port = am.port();
    am.stop();
    let down = Instant::now();
    let bad = bad_source(port);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for e in both {
        assert_eq!(call(e, "P2").await.0, 503, "the last alerts hold");
        let sent = Instant::now();
        assert_eq!(call(e, "P1").await.0, 200);
        assert!(
            sent.elapsed() < Duration::from_millis(400),
            "calls never wait on a pull"
        );
    }
    let recovered = until_p2(&both, 200, Duration::from_secs(12)).await;
    bad.store(false, Ordering::Relaxed);
    assert!(recovered.is_some(), "expired");
    let after = down.elapsed();
    assert!(
        after >= Duration::from_secs(4),
        "held until the alerts expired (6 s after the last read), fell after {after:?}"
    );
    assert!(pulls(&both, "alertmanager", "invalid") >= 1.0);
    let results: Vec<_> = a
        .metrics()
        .into_iter()
        .filter(|s| s.name == PULLS)
        .collect();
    // Envoy answers a pull it could not connect or that timed out itself
    // (503, 504): those count as `status`.
    assert!(pulls(&both, "alertmanager", "status") >= 1.0, "{results:?}");
    for e in both {
        let up = e.metric("llm_filter_degrade_source_up", &[("what", "alertmanager")]);
        assert_eq!(up, 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_fed_by_two_envoys_drives_both_to_the_same_level() {
    let test = "a_prometheus_fed_by_two_envoys_drives_both_to_the_same_level";
    if missing(test, "prometheus", prometheus_bin().is_some()) {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("mesh-load"));
    // The Envoys need Prometheus's port, and Prometheus theirs.
    let prom_port = free_port().unwrap();
    let config = json!({"degrade": {
        "thresholds": [{"signal": "rps", "above": 2, "level": 2}],
        "prometheus": {"cluster": "prometheus", "interval_s": 1, "timeout_ms": 500,
                       "stale_after_s": 3}}});
    let a = envoy(&mock, ("prometheus", prom_port), &config);
    let b = envoy(&mock, ("prometheus", prom_port), &config);
    let both = [&a, &b];
    let scrape = scrape_envoys(&[a.admin_port(), b.admin_port()]);
    let mut prom = PrometheusServer::start(prom_port, &scrape).expect("prometheus");

    // Traffic through A only, about 8 calls/s, until told to stop: A's own
    // window is over the threshold, B's is empty.
    let running = Arc::new(AtomicBool::new(true));
    let traffic = {
        let (url, running) = (a.url("/v1/chat/completions"), running.clone());
        tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                let body = chat_body("gpt-4o", &unique("load"));
                let _ = post_json(&url, &body, &[("x-request-priority", "P1")]).await;
                tokio::time::sleep(Duration::from_millis(120)).await;
            }
        })
    };
    let took = until_p2(&both, 503, Duration::from_secs(20)).await;
    let mesh = prom
        .query("sum by (model) (llm_filter_load_rps_milli) / 1000")
        .await
        .unwrap_or_default();
    assert!(
        took.is_some(),
        "both at level 2: {mesh:?}\n{}",
        b.log_tail(30)
    );
    assert_eq!(
        b.metric("llm_filter_degrade_level", &[("model", "gpt-4o")]),
        2.0,
        "B from the mesh"
    );
    assert_eq!(
        a.metric("llm_filter_degrade_level", &[("model", "gpt-4o")]),
        2.0
    );
    assert!(
        pulls(&[&b], "prometheus", "ok") >= 3.0,
        "three queries per interval"
    );

    // Prometheus goes down while A is still loaded: B's reading goes stale
    // and its own empty window counts again; A stays degraded on its own.
    prom.stop();
    let recovered = until_p2(&[&b], 200, Duration::from_secs(10)).await;
    assert!(recovered.is_some(), "B back to its local window");
    assert_eq!(
        call(&a, "P2").await.0,
        503,
        "A's own load still degrades it"
    );
    let results: Vec<_> = b
        .metrics()
        .into_iter()
        .filter(|s| s.name == PULLS)
        .collect();
    assert!(pulls(&[&b], "prometheus", "status") >= 1.0, "{results:?}");
    running.store(false, Ordering::Relaxed);
    traffic.await.unwrap();
}
