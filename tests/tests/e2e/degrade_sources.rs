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

/// What the scripted source answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No alert, no load.
    Quiet,
    /// As quiet, in answers just under the size cap: one alert or sample
    /// with a long annotation.
    Large,
    /// Answers just under the size cap made of small items, in turn: a
    /// list of numbers, of items the readers skip, one item of many labels.
    Hostile,
    /// The alert the rules degrade to level 2 on.
    Alert,
    /// No alert; the mesh-wide load of `gpt-4o` over the level-3 threshold.
    Loaded,
}

/// A source of both APIs: Alertmanager's alerts on `/api/v2/alerts`,
/// Prometheus's instant queries on `/api/v1/query`, answering as `phase`
/// says; counts the hostile answers it sent each API.
struct Scripted {
    port: u16,
    phase: Arc<std::sync::Mutex<Phase>>,
    hostile: Arc<[std::sync::atomic::AtomicU32; 2]>,
    running: Arc<AtomicBool>,
}

/// Just under the size cap of a pulled answer.
const NEAR_CAP: usize = llm_filter_core::degrade::sources::MAX_ANSWER_BYTES - 64;

/// `head`, `item(i)` for i = 0.. comma-separated as many as fit in
/// [`NEAR_CAP`] bytes, and `tail`.
fn near_cap(head: &str, item: impl Fn(usize) -> String, tail: &str) -> Vec<u8> {
    let mut body = head.to_string();
    for i in 0.. {
        let next = item(i);
        if body.len() + next.len() + 1 + tail.len() > NEAR_CAP {
            break;
        }
        if i > 0 {
            body.push(',');
        }
        body.push_str(&next);
    }
    body.push_str(tail);
    body.into_bytes()
}

fn hostile_alerts(n: u32) -> Vec<u8> {
    match n % 3 {
        0 => near_cap("[", |_| "0".into(), "]"),
        1 => near_cap("[", |_| r#"{"status":{}}"#.into(), "]"),
        _ => near_cap(
            r#"[{"status":{"state":"active"},"fingerprint":"h","labels":{"#,
            |i| format!(r#""k{i}":"""#),
            "}}]",
        ),
    }
}

fn hostile_vector(n: u32) -> Vec<u8> {
    let head = r#"{"status":"success","data":{"resultType":"vector","result":["#;
    match n % 3 {
        0 => near_cap(head, |_| "0".into(), "]}}"),
        1 => near_cap(head, |_| r#"{"value":[0,"1"]}"#.into(), "]}}"),
        _ => near_cap(
            &format!(r#"{head}{{"value":[0,"1"],"metric":{{"#),
            |i| format!(r#""k{i}":"""#),
            "}}]}}",
        ),
    }
}

/// A quiet answer just under the size cap: its one item carries a long
/// string no reader reads.
fn large(alerts: bool) -> Vec<u8> {
    let pad = "a".repeat(NEAR_CAP - 200);
    let body = if alerts {
        format!(
            r#"[{{"status":{{"state":"active"}},"fingerprint":"l","annotations":{{"d":"{pad}"}}}}]"#
        )
    } else {
        format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"value":[0,"1"],"d":"{pad}"}}]}}}}"#
        )
    };
    body.into_bytes()
}

fn vector(samples: &str) -> Vec<u8> {
    format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{samples}]}}}}"#)
        .into_bytes()
}

impl Scripted {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let source = Self {
            port,
            phase: Arc::new(std::sync::Mutex::new(Phase::Quiet)),
            hostile: Arc::new(Default::default()),
            running: Arc::new(AtomicBool::new(true)),
        };
        let (phase, hostile, running) = (
            source.phase.clone(),
            source.hostile.clone(),
            source.running.clone(),
        );
        std::thread::spawn(move || {
            while running.load(Ordering::Relaxed) {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let (phase, hostile) = (phase.clone(), hostile.clone());
                std::thread::spawn(move || Self::serve(conn, &phase, &hostile));
            }
        });
        source
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().unwrap() = phase;
    }

    /// Hostile answers sent: Alertmanager's, Prometheus's.
    fn hostile(&self) -> (u32, u32) {
        let h = &self.hostile;
        (h[0].load(Ordering::Relaxed), h[1].load(Ordering::Relaxed))
    }

    fn serve(
        mut conn: std::net::TcpStream,
        phase: &std::sync::Mutex<Phase>,
        hostile: &[std::sync::atomic::AtomicU32; 2],
    ) {
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let head = String::from_utf8_lossy(&head);
        let path = head.split(' ').nth(1).unwrap_or_default();
        let alerts = path.starts_with("/api/v2/alerts");
        let phase = *phase.lock().unwrap();
        let body = match (phase, alerts) {
            (Phase::Hostile, true) => hostile_alerts(hostile[0].fetch_add(1, Ordering::Relaxed)),
            (Phase::Hostile, false) => hostile_vector(hostile[1].fetch_add(1, Ordering::Relaxed)),
            (Phase::Alert, true) => {
                br#"[{"fingerprint":"e2e1","labels":{"alertname":"LLMTestOverload"},
                "status":{"state":"active","silencedBy":[],"inhibitedBy":[]}}]"#
                    .to_vec()
            }
            (Phase::Large, alerts) => large(alerts),
            (Phase::Loaded, false) => vector(r#"{"metric":{"model":"gpt-4o"},"value":[1,"5000"]}"#),
            (_, true) => b"[]".to_vec(),
            (_, false) => vector(""),
        };
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = conn.write_all(&body);
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
    }
}

/// Polls until a P1 call through `envoy` is degraded to `level`, up to
/// `within`.
async fn until_p1_degraded(envoy: &Envoy, level: &str, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if call(envoy, "P1").await.1.as_deref() == Some(level) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Most the proxy's resident memory may grow while it reads answers of
/// small items, once answers of the same size were read: a worker's VM that
/// had not pulled yet copies one in (4 MiB each, a few times over as its
/// memory fragments). Made trees, they took 370 MB.
const MAX_GROWTH_KB: u64 = 24 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_small_items_at_the_size_cap_cost_the_proxy_little() {
    let test = "answers_of_small_items_at_the_size_cap_cost_the_proxy_little";
    if skip_without_envoy(test) {
        return;
    }
    let source = Scripted::start();
    let mock = MockUpstream::start(MockConfig::named("small-items"));
    let config = json!({"degrade": {
        "alert_ttl_s": 60,
        "alerts": [{"alertname": "LLMTestOverload", "level": 2}],
        "thresholds": [{"signal": "rps", "above": 100, "level": 3}],
        "alertmanager": {"cluster": "alertmanager", "interval_s": 1, "timeout_ms": 900},
        "prometheus": {"cluster": "prometheus", "interval_s": 1, "timeout_ms": 900, "stale_after_s": 60,
                       "queries": {"tokens_per_s": "", "in_flight": ""}}}});
    let e = EnvoyBuilder::new()
        .concurrency(2)
        .plugin_config(&config)
        .upstream("mock", mock.port())
        .upstream("alertmanager", source.port)
        .upstream("prometheus", source.port)
        .start()
        .expect("envoy with the filter");
    let ok = |what| e.metric(PULLS, &[("what", what), ("result", "ok")]);
    let invalid = |what| e.metric(PULLS, &[("what", what), ("result", "invalid")]);

    // Quiet answers read, calls served on both workers: the proxy warm.
    let start = Instant::now();
    while (ok("alertmanager") < 3.0 || ok("prometheus") < 3.0)
        && start.elapsed() < Duration::from_secs(10)
    {
        assert_eq!(call(&e, "P2").await, (200, None));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        ok("alertmanager") >= 3.0 && ok("prometheus") >= 3.0,
        "{}",
        e.log_tail(30)
    );
    // What an answer at the size cap costs whatever it holds (Envoy buffers
    // it, each worker that pulls copies it into its VM): paid before the
    // measure, by quiet answers of the same size.
    let quiet = e.rss_kb().unwrap();
    source.set(Phase::Large);
    let read_before = ok("alertmanager") + ok("prometheus");
    let start = Instant::now();
    while ok("alertmanager") + ok("prometheus") < read_before + 12.0
        && start.elapsed() < Duration::from_secs(20)
    {
        assert_eq!(call(&e, "P2").await, (200, None));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    source.set(Phase::Quiet);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = e.rss_kb().unwrap();
    println!(
        "answers at the size cap: resident memory {quiet} kB → {before} kB (+{} kB)",
        before.saturating_sub(quiet)
    );

    // Nine answers of each API, each some 4 MiB of 2·10⁵ to 2·10⁶ items.
    source.set(Phase::Hostile);
    let (start, mut slowest) = (Instant::now(), Duration::ZERO);
    while source.hostile().0.min(source.hostile().1) < 9
        && start.elapsed() < Duration::from_secs(30)
    {
        let sent = Instant::now();
        assert_eq!(call(&e, "P2").await, (200, None), "calls go on");
        slowest = slowest.max(sent.elapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    source.set(Phase::Quiet);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = e.rss_kb().unwrap();
    let (am, prom) = source.hostile();
    println!(
        "{am} + {prom} hostile answers: resident memory {before} kB → {after} kB (+{} kB); \
         invalid: alertmanager {}, prometheus {}; slowest call {slowest:?}",
        after.saturating_sub(before),
        invalid("alertmanager"),
        invalid("prometheus"),
    );
    assert!(am >= 9 && prom >= 9, "hostile answers sent: {am}, {prom}");
    assert!(
        after.saturating_sub(before) < MAX_GROWTH_KB,
        "resident memory grew from {before} kB to {after} kB"
    );
    // Each counted: two of every three are refused (a list of numbers; more
    // items than the bound), the third read (one item of many labels).
    let refused = |sent: u32| f64::from(sent - sent / 3);
    assert_eq!(invalid("alertmanager"), refused(am));
    assert_eq!(invalid("prometheus"), refused(prom));
    assert!(
        slowest < Duration::from_millis(1500),
        "a call waited {slowest:?}"
    );

    // Real answers still read: the alert degrades, then the mesh's load.
    source.set(Phase::Alert);
    assert!(
        until_p1_degraded(&e, "2", Duration::from_secs(10)).await,
        "the alert read\n{}",
        e.log_tail(30)
    );
    assert_eq!(call(&e, "P2").await.0, 503);
    source.set(Phase::Loaded);
    assert!(
        until_p1_degraded(&e, "3", Duration::from_secs(10)).await,
        "the load read\n{}",
        e.log_tail(30)
    );
    for what in ["alertmanager", "prometheus"] {
        assert_eq!(
            e.metric("llm_filter_degrade_source_up", &[("what", what)]),
            1.0,
            "{what}"
        );
    }
}
