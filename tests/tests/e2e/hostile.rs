//! Hostile input and faults through the real Envoy: broken and huge bodies,
//! truncated requests, clients and upstreams that go away, invalid, endless
//! and compressed answers, oversized and repeated headers. For each case the
//! client gets a clear answer (the upstream's, or Envoy's own), the filter
//! makes no 5xx, the VM never traps, nothing partial is cached, and the
//! counters say what happened; each case prints its row of the corpus table.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llm_filter_e2e::mock::{
    gunzip_stored, HEADER_CONTENT_ENCODING, HEADER_INSTANCE, HEADER_RESET_AFTER_BYTES, HEADER_SSE,
};
use llm_filter_e2e::{
    chat_body, http_client, http_client_without_reuse, send_bytes, skip_without_envoy, unique,
    Envoy, EnvoyBuilder, HttpResponse, MockConfig, MockUpstream,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::cache::{cacheable, cacheable_stream, eventually, message, x_cache, CHAT};

/// What Envoy's log says when the VM trapped or a callback failed.
const TRAP_MARKERS: [&str; 4] = [
    "panicked",
    "wasm trap",
    "Function: proxy_on_",
    "Plugin configured to fail closed",
];
/// Route idle timeout: bounds a stream that never ends or a request that
/// never completes.
const IDLE_TIMEOUT_MS: u64 = 1500;
/// Largest request body the filter holds in these scenarios.
const MAX_BODY_BYTES: usize = 256 * 1024;
/// Prefix Envoy puts on the filter's stats.
const FILTER_STATS: &str = "wasmcustom.";
const REQUESTS: &str = "llm_filter_requests_total";
const INTERNAL_ERRORS: &str = "llm_filter_internal_errors_total";
const STORES: &str = "llm_filter_cache_stores_total";

/// An Envoy (route idle timeout set) with the filter in front of one mock.
struct Rig {
    mock: MockUpstream,
    envoy: Envoy,
}

impl Rig {
    fn start(test: &str, config: Value) -> Option<Self> {
        if skip_without_envoy(test) {
            return None;
        }
        let mock = MockUpstream::start(MockConfig::named("up"));
        let envoy = EnvoyBuilder::new()
            .plugin_config(config)
            .upstream("mock", mock.port())
            .extra_route_yaml(&format!("idle_timeout: {}s", IDLE_TIMEOUT_MS as f64 / 1e3))
            .start()
            .unwrap_or_else(|e| panic!("envoy: {e:#}"));
        Some(Self { mock, envoy })
    }

    fn url(&self, path: &str) -> String {
        self.envoy.url(path)
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.envoy.port())
    }

    /// The filter's counters and gauges, prefix removed.
    fn filter_stats(&self) -> HashMap<String, u64> {
        self.envoy
            .stats()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(FILTER_STATS)?.to_string(), v)))
            .collect()
    }

    /// Waits until the filter logged `calls` more calls than in `before`, so
    /// every counter of a case has moved, and returns what moved.
    fn moved_since(&self, before: &HashMap<String, u64>, calls: u64) -> Moved {
        let mut after = self.filter_stats();
        eventually(Duration::from_secs(5), || {
            after = self.filter_stats();
            family(&after, REQUESTS) >= family(before, REQUESTS) + calls
        });
        Moved::between(before, &after)
    }

    async fn chat(&self, body: &Value, headers: &[(&str, &str)]) -> HttpResponse {
        llm_filter_e2e::post_json(&self.url(CHAT), body, headers)
            .await
            .unwrap_or_else(|e| panic!("call: {e:#}"))
    }

    /// The VM is alive: no trap in the log, a plain call answered upstream.
    async fn assert_alive(&self, case: &str) {
        let log = self.envoy.log_contents();
        for marker in TRAP_MARKERS {
            let line = log.lines().find(|l| l.contains(marker));
            assert!(line.is_none(), "{case}: Envoy logged {line:?}");
        }
        let r = self
            .chat(&chat_body("gpt-4o", &unique("still alive?")), &[])
            .await;
        assert_eq!(r.status, 200, "{case}: a plain call after it: {}", r.text());
        assert_eq!(r.header(HEADER_INSTANCE), Some("up"), "{case}");
    }
}

/// Counters that moved during a case, by encoded name.
struct Moved(Vec<(String, i64)>);

impl Moved {
    fn between(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> Self {
        let mut moved: Vec<(String, i64)> = after
            .iter()
            .filter(|(k, _)| !k.contains("_ms") && !k.contains("weight") && !k.contains("tier"))
            .filter_map(|(k, v)| {
                let d = *v as i64 - before.get(k).copied().unwrap_or(0) as i64;
                (d != 0).then(|| (k.clone(), d))
            })
            .collect();
        moved.sort();
        Self(moved)
    }

    /// Sum of the moves of every stat of `metric` whose name contains each of `parts`.
    fn of(&self, metric: &str, parts: &[&str]) -> i64 {
        self.0
            .iter()
            .filter(|(k, _)| k.starts_with(metric) && parts.iter().all(|p| k.contains(p)))
            .map(|(_, d)| d)
            .sum()
    }

    fn internal_errors(&self) -> i64 {
        self.of(INTERNAL_ERRORS, &[])
    }

    fn stored(&self) -> i64 {
        self.of(STORES, &["result=.=stored;.;"])
    }
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .filter(|(k, _)| !k.starts_with("llm_filter_routing") && !k.starts_with("gen_ai"))
            .map(|(k, d)| format!("{k} {d:+}"))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

fn family(stats: &HashMap<String, u64>, metric: &str) -> u64 {
    stats
        .iter()
        .filter(|(k, _)| k.starts_with(metric))
        .map(|(_, v)| v)
        .sum()
}

/// One row of the corpus table, printed for the report.
fn row(case: &str, client: &str, moved: &Moved) {
    eprintln!("CORPUS | {case} | {client} | {moved}");
}

/// What a raw TCP exchange gave back.
#[derive(Debug)]
struct Raw {
    /// Status of the answer, when one came.
    status: Option<u16>,
    text: String,
    elapsed: Duration,
}

/// Writes `head` and `body` on a new connection; when `close` the client
/// goes away at once, else it reads the answer (at most 10 s).
async fn raw_exchange(addr: &str, head: &str, body: &[u8], close: bool) -> Raw {
    let started = Instant::now();
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket.write_all(head.as_bytes()).await.expect("write head");
    socket.write_all(body).await.expect("write body");
    socket.flush().await.expect("flush");
    if close {
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(socket);
        return Raw {
            status: None,
            text: String::new(),
            elapsed: started.elapsed(),
        };
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                // Headers are in; the bodies in these cases are short.
                tokio::time::sleep(Duration::from_millis(50)).await;
                if let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(200), socket.read(&mut buf)).await
                {
                    answer.extend_from_slice(&buf[..n]);
                }
                break;
            }
        }
    });
    let _ = read.await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|s| s.parse().ok());
    Raw {
        status,
        text,
        elapsed: started.elapsed(),
    }
}

/// Sends a streamed call on a new connection and closes it as soon as the
/// first event arrived; returns what was read.
async fn leave_after_first_event(addr: &str, head: &str, body: &[u8]) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket.write_all(head.as_bytes()).await.expect("write head");
    socket.write_all(body).await.expect("write body");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(1), socket.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
        if answer.windows(6).any(|w| w == b"data: ") {
            break;
        }
    }
    drop(socket);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A request to the hostile requests table.
struct RequestCase {
    name: &'static str,
    body: Option<Vec<u8>>,
    headers: Vec<(String, String)>,
    /// Status the client must get.
    status: u16,
    /// Whether the answer is the upstream's (else Envoy's own).
    upstream: bool,
    /// Calls the filter sees (0: Envoy refused it first).
    calls: u64,
}

impl RequestCase {
    fn new(name: &'static str, body: impl Into<Vec<u8>>, status: u16) -> Self {
        Self {
            name,
            body: Some(body.into()),
            headers: vec![("content-type".into(), "application/json".into())],
            status,
            upstream: true,
            calls: 1,
        }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

/// A valid chat body padded to about `size` bytes with a long user message.
fn padded_chat(size: usize) -> Vec<u8> {
    cacheable(&"lorem ipsum ".repeat(size / 12))
        .to_string()
        .into_bytes()
}

#[tokio::test]
async fn hostile_requests_get_clear_answers() {
    let Some(rig) = Rig::start(
        "hostile_requests_get_clear_answers",
        json!({"max_body_bytes": MAX_BODY_BYTES}),
    ) else {
        return;
    };
    let valid = || chat_body("gpt-4o", &unique("fine"));
    let traceparent = |len: usize| format!("00-{}", "a".repeat(len.saturating_sub(3)));
    let cases = vec![
        RequestCase::new("broken JSON", r#"{"model":"gpt-4o","messages":["#, 400),
        RequestCase::new("binary body", vec![0xff, 0x00, 0xfe, b'{', 0x80], 400),
        RequestCase::new("empty body", Vec::new(), 400),
        RequestCase::new(
            "JSON of the wrong types",
            r#"{"model":5,"messages":"x","stream":"yes","temperature":"hot","max_tokens":-1,"user":[]}"#,
            200,
        ),
        RequestCase::new("JSON nested 100k deep", "[".repeat(100_000), 400),
        RequestCase::new(
            "numbers beyond f64 and u64",
            r#"{"model":"gpt-4o","temperature":1e400,"max_tokens":184467440737095516160,"messages":[{"role":"user","content":"n"}]}"#,
            400,
        ),
        RequestCase::new(
            "body above max_body_bytes",
            padded_chat(2 * MAX_BODY_BYTES),
            200,
        ),
        RequestCase::new("body above Envoy's buffer limit", padded_chat(3 << 20), 200),
        RequestCase::new("body far above both", padded_chat(8 << 20), 200),
        RequestCase::new("50 baggage headers", valid().to_string(), 200).header_each(
            "baggage",
            (0..50).map(|i| format!("k{i}=v{i},{}={}", "m".repeat(40 + i), "v".repeat(100))),
        ),
        RequestCase::new("50 KB traceparent", valid().to_string(), 200)
            .header("traceparent", traceparent(50 * 1024)),
        RequestCase::new("60 KB traceparent", valid().to_string(), 431)
            .header("traceparent", traceparent(60 * 1024))
            .refused_by_envoy(),
        RequestCase::new("two valid traceparents", valid().to_string(), 200)
            .header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .header(
                "traceparent",
                "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01",
            ),
        RequestCase::new("30 priorities and a 20 KB budget", valid().to_string(), 200)
            .header_each(
                "x-request-priority",
                (0..30).map(|i| ["P0", "p9", "P-1", "p0 ; x", "P2"][i % 5].to_string()),
            )
            .header("x-request-timeout-ms", "9".repeat(20 * 1024))
            .header("grpc-timeout", "99999999999999999999H"),
        RequestCase::new("budget of 0 ms and negative", valid().to_string(), 200)
            .header("x-request-timeout-ms", "0")
            .header("x-request-timeout-ms", "-5"),
        RequestCase::new("30 KB credential", cacheable("cred").to_string(), 200)
            .header("authorization", format!("Bearer {}", "k".repeat(30 * 1024))),
        RequestCase::new("cache-control soup", cacheable("cc").to_string(), 200).header(
            "cache-control",
            "no-cache=\"x\", max-age=-1, no-store, , ,;;, private=\"".repeat(100),
        ),
    ];
    let client = http_client_without_reuse();
    for case in cases {
        let before = rig.filter_stats();
        let headers: Vec<(&str, &str)> = case
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let seen = rig.mock.request_count();
        let r = send_bytes(
            &client,
            reqwest::Method::POST,
            &rig.url(CHAT),
            case.body.clone(),
            &headers,
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e:#}", case.name));
        let moved = rig.moved_since(&before, case.calls);
        let from_upstream = r.header(HEADER_INSTANCE).is_some();
        row(
            case.name,
            &format!(
                "{} from {}, x-cache {}",
                r.status,
                if from_upstream { "upstream" } else { "Envoy" },
                x_cache(&r)
            ),
            &moved,
        );
        assert_eq!(r.status, case.status, "{}: {}", case.name, r.text());
        assert_eq!(from_upstream, case.upstream, "{}: {}", case.name, r.text());
        if r.status >= 400 && from_upstream {
            assert!(
                r.json()["error"]["message"].is_string(),
                "{}: not an OpenAI error: {}",
                case.name,
                r.text()
            );
        }
        assert_eq!(moved.internal_errors(), 0, "{}: {moved}", case.name);
        if case.upstream {
            // What went upstream is what the client sent (the body) and within
            // W3C limits (the headers the filter writes).
            let got = rig.mock.requests().pop().expect("upstream saw the call");
            assert_eq!(rig.mock.request_count(), seen + 1, "{}", case.name);
            assert_eq!(
                got.body.len(),
                case.body.as_ref().map_or(0, Vec::len),
                "{}",
                case.name
            );
            let baggage = got.header_all("baggage").join(",");
            assert!(baggage.len() <= 8192, "{}: {}", case.name, baggage.len());
            assert!(baggage.contains("priority=P"), "{}: {baggage}", case.name);
            let traceparents = got.header_all("traceparent");
            assert_eq!(traceparents.len(), 1, "{}", case.name);
            assert_eq!(traceparents[0].len(), 55, "{}", case.name);
        }
    }
    rig.assert_alive("hostile requests").await;
}

impl RequestCase {
    fn header_each(mut self, name: &str, values: impl Iterator<Item = String>) -> Self {
        for value in values {
            self.headers.push((name.to_string(), value));
        }
        self
    }

    fn refused_by_envoy(mut self) -> Self {
        self.upstream = false;
        self.calls = 0;
        self
    }
}

#[tokio::test]
async fn clients_that_leave_leave_nothing_behind() {
    let Some(rig) = Rig::start("clients_that_leave_leave_nothing_behind", json!({})) else {
        return;
    };
    let addr = rig.addr();
    let head = |length: Option<usize>| {
        let length = match length {
            Some(n) => format!("content-length: {n}\r\n"),
            None => "transfer-encoding: chunked\r\n".to_string(),
        };
        format!(
            "POST {CHAT} HTTP/1.1\r\nhost: llm\r\ncontent-type: application/json\r\n{length}\r\n"
        )
    };
    let body = cacheable(&unique("truncated")).to_string();
    let part = &body.as_bytes()[..body.len() / 2];

    // Truncated requests: a declared length larger than what is sent.
    let before = rig.filter_stats();
    raw_exchange(&addr, &head(Some(body.len() + 1000)), part, true).await;
    let moved = rig.moved_since(&before, 1);
    row(
        "content-length larger than sent, client closes",
        "nothing (it left)",
        &moved,
    );
    assert_eq!(moved.internal_errors(), 0, "{moved}");
    assert_eq!(
        rig.mock.request_count(),
        0,
        "a truncated body went upstream"
    );

    let before = rig.filter_stats();
    let raw = raw_exchange(&addr, &head(Some(body.len() + 1000)), part, false).await;
    let moved = rig.moved_since(&before, 1);
    row(
        "content-length larger than sent, client waits",
        &format!(
            "{:?} from Envoy after {:?}",
            raw.status,
            raw.elapsed.as_millis()
        ),
        &moved,
    );
    assert_eq!(raw.status, Some(408), "{}", raw.text);
    assert!(raw.elapsed < Duration::from_secs(5), "{:?}", raw.elapsed);
    assert_eq!(moved.internal_errors(), 0, "{moved}");

    let before = rig.filter_stats();
    let chunk = format!("{:x}\r\n", part.len());
    let mut partial = chunk.into_bytes();
    partial.extend_from_slice(part);
    partial.extend_from_slice(b"\r\n");
    raw_exchange(&addr, &head(None), &partial, true).await;
    let moved = rig.moved_since(&before, 1);
    row("chunked body, client closes mid-body", "nothing", &moved);
    assert_eq!(moved.internal_errors(), 0, "{moved}");

    // Mid-answer, during a cache fill: the stream is cut after its first event.
    rig.mock.set_chunk_delay_ms(150);
    let question = unique("leave mid-stream");
    let before = rig.filter_stats();
    let body = cacheable_stream(&question, true).to_string();
    let first = leave_after_first_event(&addr, &head(Some(body.len())), body.as_bytes()).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let moved = rig.moved_since(&before, 1);
    row("client leaves mid-stream (cache fill)", "1 event", &moved);
    assert!(
        eventually(Duration::from_secs(3), || rig.mock.in_flight() == 0),
        "the upstream stream was not cancelled"
    );
    assert_eq!(moved.stored(), 0, "a partial stream was stored: {moved}");
    assert_eq!(moved.internal_errors(), 0, "{moved}");
    assert_full_miss_then_hit(&rig, &question, "mid-stream").await;
    rig.mock.set_chunk_delay_ms(0);

    // Before the answer: the client's own timeout fires while upstream waits.
    let question = unique("leave before the answer");
    let before = rig.filter_stats();
    let body = cacheable(&question).to_string();
    let slow_head = head(Some(body.len())).replace("\r\n\r\n", "\r\nx-mock-delay-ms: 600\r\n\r\n");
    raw_exchange(&addr, &slow_head, body.as_bytes(), true).await;
    let moved = rig.moved_since(&before, 1);
    row(
        "client leaves before the answer",
        "nothing (it left)",
        &moved,
    );
    assert_eq!(moved.stored(), 0, "{moved}");
    assert_eq!(moved.internal_errors(), 0, "{moved}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_full_miss_then_hit(&rig, &question, "before the answer").await;

    rig.assert_alive("clients that leave").await;
}

/// The next identical call is a MISS with a whole answer, stored, and the
/// one after it a HIT with the same answer.
async fn assert_full_miss_then_hit(rig: &Rig, question: &str, case: &str) {
    let before = rig.filter_stats();
    let miss = rig.chat(&cacheable(question), &[]).await;
    assert_eq!((miss.status, x_cache(&miss)), (200, "MISS"), "{case}");
    assert_eq!(
        message(&miss),
        format!("echo: {question} [up]"),
        "{case}: not a whole answer"
    );
    let moved = rig.moved_since(&before, 1);
    assert!(
        eventually(Duration::from_secs(3), || {
            Moved::between(&before, &rig.filter_stats()).stored() == 1
        }),
        "{case}: the whole answer was not stored: {moved}"
    );
    let hit = rig.chat(&cacheable(question), &[]).await;
    assert_eq!((hit.status, x_cache(&hit)), (200, "HIT"), "{case}");
    assert_eq!(hit.json(), miss.json(), "{case}");
}

/// What the client of a faulty upstream reads: the status and the bytes
/// before the connection ended, or why it ended.
struct Partial {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
    error: Option<String>,
    elapsed: Duration,
}

async fn read_partial(rig: &Rig, body: &Value, headers: &[(&str, &str)]) -> Partial {
    let started = Instant::now();
    let mut request = http_client()
        .post(rig.url(CHAT))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.expect("response headers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut stream = response.bytes_stream();
    let mut bytes = Vec::new();
    let mut error = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(e) => {
                error = Some(format!("{e}"));
                break;
            }
        }
    }
    Partial {
        status,
        headers,
        body: bytes,
        error,
        elapsed: started.elapsed(),
    }
}

/// A fault of the upstream, scripted by request headers.
struct UpstreamCase {
    name: &'static str,
    stream: bool,
    headers: Vec<(&'static str, &'static str)>,
    /// Status the client gets: the upstream's 200, or Envoy's 503 when
    /// the upstream reset before the filter let the headers go.
    status: u16,
    /// Whether the client reads the whole answer (else a cut one).
    whole: bool,
    /// The `result` of the store counter that moves, when one does.
    store: Option<&'static str>,
}

#[tokio::test]
async fn hostile_upstreams_never_poison_the_cache() {
    let Some(rig) = Rig::start("hostile_upstreams_never_poison_the_cache", json!({})) else {
        return;
    };
    rig.mock.set_chunk_delay_ms(5);
    let cases = [
        UpstreamCase {
            name: "reset mid-JSON answer",
            stream: false,
            headers: vec![(HEADER_RESET_AFTER_BYTES, "60")],
            status: 503,
            whole: true,
            store: None,
        },
        UpstreamCase {
            name: "reset mid-stream",
            stream: true,
            status: 200,
            headers: vec![(HEADER_RESET_AFTER_BYTES, "400")],
            whole: false,
            store: Some("incomplete"),
        },
        UpstreamCase {
            name: "invalid SSE",
            stream: true,
            status: 200,
            headers: vec![(HEADER_SSE, "invalid")],
            whole: true,
            store: Some("incomplete"),
        },
        UpstreamCase {
            name: "stream that never ends (route idle timeout)",
            stream: true,
            status: 200,
            headers: vec![(HEADER_SSE, "endless")],
            whole: false,
            store: Some("incomplete"),
        },
        UpstreamCase {
            name: "gzip JSON answer",
            stream: false,
            status: 200,
            headers: vec![(HEADER_CONTENT_ENCODING, "gzip")],
            whole: true,
            store: Some("encoded"),
        },
        UpstreamCase {
            name: "gzip SSE answer",
            stream: true,
            status: 200,
            headers: vec![(HEADER_CONTENT_ENCODING, "gzip")],
            whole: true,
            store: Some("encoded"),
        },
    ];
    for case in cases {
        let question = unique(case.name);
        let body = if case.stream {
            cacheable_stream(&question, true)
        } else {
            cacheable(&question)
        };
        let before = rig.filter_stats();
        let got = read_partial(&rig, &body, &case.headers).await;
        let moved = rig.moved_since(&before, 1);
        let encoding = got
            .headers
            .get("content-encoding")
            .and_then(|v| v.to_str().ok());
        let plain = match encoding {
            Some("gzip") => gunzip_stored(&got.body).expect("a gzip body"),
            _ => got.body.clone(),
        };
        row(
            case.name,
            &format!(
                "{}, {} bytes{}{}, after {} ms",
                got.status,
                got.body.len(),
                encoding.map_or(String::new(), |e| format!(" ({e})")),
                got.error
                    .as_ref()
                    .map_or(String::new(), |e| format!(", then error: {e}")),
                got.elapsed.as_millis()
            ),
            &moved,
        );
        assert_eq!(got.status, case.status, "{}", case.name);
        assert_eq!(got.error.is_none(), case.whole, "{}", case.name);
        assert!(
            got.elapsed < Duration::from_secs(8),
            "{}: {:?}",
            case.name,
            got.elapsed
        );
        assert_eq!(moved.internal_errors(), 0, "{}: {moved}", case.name);
        assert_eq!(moved.stored(), 0, "{}: {moved}", case.name);
        if let Some(result) = case.store {
            assert!(
                eventually(Duration::from_secs(3), || {
                    Moved::between(&before, &rig.filter_stats())
                        .of(STORES, &[&format!("result=.={result};.;")])
                        == 1
                }),
                "{}: {moved}",
                case.name
            );
        }
        if !case.whole {
            // A cut answer is not a success.
            assert!(
                eventually(Duration::from_secs(3), || {
                    Moved::between(&before, &rig.filter_stats())
                        .of(REQUESTS, &["outcome=.=incomplete;.;"])
                        == 1
                }),
                "{}: {moved}",
                case.name
            );
        }
        if case.whole && !case.stream && case.status == 200 {
            // The client can read what the upstream sent.
            let answer: Value = serde_json::from_slice(&plain).expect("JSON answer");
            assert_eq!(
                answer["choices"][0]["message"]["content"],
                format!("echo: {question} [up]")
            );
        }
        if case.name == "invalid SSE" {
            // The bytes pass as the upstream sent them.
            assert!(plain.windows(4).any(|w| w == [0xff, 0xfe, 0, b' ']));
            assert!(plain.ends_with(b"data: no end"), "{}", case.name);
        }
        assert!(
            eventually(Duration::from_secs(3), || rig.mock.in_flight() == 0),
            "{}: the upstream is still streaming",
            case.name
        );
        assert_full_miss_then_hit(&rig, &question, case.name).await;
    }

    // Reset before any answer: Envoy's own 503, never the filter's.
    let before = rig.filter_stats();
    let r = rig
        .chat(&cacheable(&unique("reset")), &[("x-mock-reset", "1")])
        .await;
    let moved = rig.moved_since(&before, 1);
    row(
        "reset before any answer",
        &format!("{} from Envoy, x-cache {}", r.status, x_cache(&r)),
        &moved,
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header(HEADER_INSTANCE).is_none());
    assert!(
        r.text().contains("upstream connect error") || r.text().contains("reset"),
        "{}",
        r.text()
    );
    assert_eq!(moved.internal_errors(), 0, "{moved}");
    assert_eq!(moved.stored(), 0, "{moved}");

    rig.assert_alive("hostile upstreams").await;
}

#[tokio::test]
async fn a_held_body_beyond_envoys_buffer_limit() {
    // The operator let the filter hold 4 MiB, Envoy buffers 1 MiB: Envoy
    // refuses the call itself (413, which the filter puts in OpenAI's
    // shape), the VM stays up.
    let Some(rig) = Rig::start(
        "a_held_body_beyond_envoys_buffer_limit",
        json!({"max_body_bytes": 4 << 20}),
    ) else {
        return;
    };
    let before = rig.filter_stats();
    let r = send_bytes(
        &http_client_without_reuse(),
        reqwest::Method::POST,
        &rig.url(CHAT),
        Some(padded_chat(2 << 20)),
        &[("content-type", "application/json")],
    )
    .await
    .expect("an answer");
    let moved = rig.moved_since(&before, 1);
    row(
        "held body above Envoy's buffer limit (max_body_bytes 4 MiB)",
        &format!(
            "{} from {}: {}",
            r.status,
            if r.header(HEADER_INSTANCE).is_some() {
                "upstream"
            } else {
                "Envoy"
            },
            r.text().chars().take(60).collect::<String>()
        ),
        &moved,
    );
    // Envoy's own 413, put in the shape SDKs read.
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "llm_filter_request_too_large");
    assert_eq!(moved.internal_errors(), 0, "{moved}");
    rig.assert_alive("held body beyond the buffer limit").await;
}
