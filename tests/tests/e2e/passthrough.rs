//! What the filter must leave alone: requests that are not LLM calls pass with
//! no header added (and none of the headers only it may set) and are not
//! counted, and the bodies of LLM calls (invalid
//! JSON, larger than what the filter reads) reach the upstream byte for byte.

use std::time::Duration;

use llm_filter_e2e::{
    chat_body, http_client, prometheus, send_bytes, skip_without_envoy, unique, Envoy,
    EnvoyBuilder, MockConfig, MockUpstream,
};
use reqwest::Method;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const METRIC_DEADLINE: Duration = Duration::from_secs(10);

fn start(mock: &MockUpstream) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config("{}")
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

fn requests_total(envoy: &Envoy) -> f64 {
    prometheus::sum(&envoy.metrics(), "llm_filter_requests_total", &[])
}

#[tokio::test]
async fn non_llm_requests_pass_untouched_and_uncounted() {
    if skip_without_envoy("non_llm_requests_pass_untouched_and_uncounted") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("plain"));
    let envoy = start(&mock);
    let client = http_client();
    let json = chat_body("gpt-4o", "not an llm call")
        .to_string()
        .into_bytes();

    let requests: [(Method, &str, Option<&[u8]>); 5] = [
        (Method::GET, "/v1/models", None),
        (Method::POST, "/v1/other", Some(&json)),
        (Method::GET, "/v1/chat/completions", None),
        (Method::POST, "/v1/chat/completions/extra", Some(&json)),
        (Method::PUT, "/v1/embeddings", Some(&json)),
    ];
    // Every request once bare and once with every header the filter would touch.
    let tagged: &[(&str, &str)] = &[
        ("x-request-priority", "p0"),
        ("baggage", "team=search,priority=P2"),
        ("traceparent", TRACEPARENT),
        ("tracestate", "vendor=opaque"),
    ];
    // Headers only the filter may set, each alone: a client's reach no
    // upstream, on any request.
    let route: &[(&str, &str)] = &[("x-llm-cluster", "mock")];
    let shard: &[(&str, &str)] = &[("x-llm-cache-key", "forged")];
    for (method, path, body) in &requests {
        for sent in [&[][..], tagged, route, shard] {
            let case = format!("{method} {path} with {sent:?}");
            mock.clear();
            let response = send_bytes(
                &client,
                method.clone(),
                &envoy.url(path),
                body.map(<[u8]>::to_vec),
                sent,
            )
            .await
            .unwrap_or_else(|e| panic!("{case}: {e:#}"));
            assert_eq!(
                response.header("x-mock-instance"),
                Some("plain"),
                "{case}: the upstream answered"
            );
            assert_eq!(response.header("x-trace-id"), None, "{case}");

            let seen = mock.last_request().expect("upstream saw the request");
            assert_eq!(seen.path, *path, "{case}");
            for name in ["x-request-priority", "baggage", "traceparent", "tracestate"] {
                let want: Vec<&str> = sent
                    .iter()
                    .filter(|(n, _)| *n == name)
                    .map(|(_, v)| *v)
                    .collect();
                assert_eq!(seen.header_all(name), want, "{case}: header {name}");
            }
            for name in ["x-llm-cluster", "x-llm-cache-key"] {
                assert_eq!(seen.header_all(name), Vec::<&str>::new(), "{case}: {name}");
            }
            assert_eq!(seen.body.as_ref(), body.unwrap_or_default(), "{case}");
        }
    }

    // A real LLM call afterwards is counted: the counter works and saw nothing else.
    let llm = send_bytes(
        &client,
        Method::POST,
        &envoy.url("/v1/chat/completions"),
        Some(json.clone()),
        &[("content-type", "application/json")],
    )
    .await
    .unwrap();
    assert_eq!(llm.status, 200, "{}", llm.text());
    assert!(llm.header("x-trace-id").is_some());
    let total = envoy.wait_for_metric("llm_filter_requests_total", &[], 1.0, METRIC_DEADLINE);
    assert_eq!(
        total,
        1.0,
        "only the LLM call is counted: {:?}",
        prometheus::family(&envoy.metrics(), "llm_filter_requests_total")
    );
    assert_eq!(requests_total(&envoy), 1.0);
}

#[tokio::test]
async fn invalid_json_reaches_the_upstream_byte_for_byte() {
    if skip_without_envoy("invalid_json_reaches_the_upstream_byte_for_byte") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("raw"));
    let envoy = start(&mock);
    let client = http_client();

    let bodies: [&[u8]; 4] = [
        b"{not json",
        b"{\"model\": \"gpt-4o\", \"messages\": [",
        b"\x00\xff\xfe binary \xc3\x28 not utf-8\r\n\r\n",
        b"",
    ];
    for body in bodies {
        let case = format!("body {:?}", String::from_utf8_lossy(body));
        let response = send_bytes(
            &client,
            Method::POST,
            &envoy.url("/v1/chat/completions"),
            Some(body.to_vec()),
            &[("content-type", "application/json")],
        )
        .await
        .unwrap_or_else(|e| panic!("{case}: {e:#}"));
        // The mock's own answer to a body it cannot read, relayed as is.
        assert_eq!(response.status, 400, "{case}: {}", response.text());
        assert_eq!(response.header("x-mock-instance"), Some("raw"), "{case}");
        assert_eq!(
            response.json()["error"]["code"],
            "invalid_json",
            "{case}: {}",
            response.text()
        );
        let seen = mock.last_request().expect("upstream saw the request");
        assert_eq!(seen.body.as_ref(), body, "{case}");
        // Still an LLM call: tagged like any other.
        assert_eq!(seen.header("x-request-priority"), Some("P1"), "{case}");
        assert!(response.header("x-trace-id").is_some(), "{case}");
    }
    let counted = envoy.wait_for_metric(
        "llm_filter_requests_total",
        &[("model", "unknown"), ("outcome", "client_error")],
        bodies.len() as f64,
        METRIC_DEADLINE,
    );
    assert_eq!(counted, bodies.len() as f64);
}

/// A chat body of exactly `size` bytes whose text starts with `tag`.
fn chat_body_of_size(size: usize, tag: &str) -> Vec<u8> {
    let overhead = chat_body("gpt-4o", "").to_string().len();
    let filler: String = tag
        .chars()
        .chain("lorem ipsum ".chars().cycle())
        .take(size - overhead)
        .collect();
    let body = chat_body("gpt-4o", &filler).to_string().into_bytes();
    assert_eq!(body.len(), size);
    body
}

#[tokio::test]
async fn large_bodies_pass_untouched() {
    if skip_without_envoy("large_bodies_pass_untouched") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("large"));
    let envoy = start(&mock);
    let client = http_client();

    // Around what the filter reads aside (1 MiB by default) and well past it.
    const MIB: usize = 1024 * 1024;
    for size in [MIB - 1024, MIB - 1, MIB, MIB + 1, 2 * MIB] {
        let case = format!("{size} bytes");
        let body = chat_body_of_size(size, &unique("sized"));
        mock.clear();
        let response = send_bytes(
            &client,
            Method::POST,
            &envoy.url("/v1/chat/completions"),
            Some(body.clone()),
            &[("content-type", "application/json")],
        )
        .await
        .unwrap_or_else(|e| panic!("{case}: {e:#}"));
        assert_eq!(response.status, 200, "{case}: {}", response.text());
        assert_eq!(response.header("x-mock-instance"), Some("large"), "{case}");
        assert!(response.header("x-trace-id").is_some(), "{case}");

        let seen = mock.last_request().expect("upstream saw the request");
        assert_eq!(seen.body.len(), body.len(), "{case}");
        assert!(
            seen.body.as_ref() == body.as_slice(),
            "{case}: body changed"
        );
        let length = body.len().to_string();
        assert_eq!(
            seen.header_all("content-length"),
            [length.as_str()],
            "{case}"
        );
        assert_eq!(seen.header("transfer-encoding"), None, "{case}");
        assert_eq!(seen.header("x-request-priority"), Some("P1"), "{case}");
    }

    // 2 MiB without content-length (chunked, in 64 KiB pieces).
    let body = chat_body_of_size(2 * MIB, &unique("chunked"));
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    mock.clear();
    let response = client
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces,
        )))
        .send()
        .await
        .expect("chunked call");
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-trace-id").is_some());
    let seen = mock.last_request().expect("upstream saw the request");
    assert!(
        seen.body.as_ref() == body.as_slice(),
        "chunked body changed"
    );
    assert_eq!(seen.header("x-request-priority"), Some("P1"));
}
