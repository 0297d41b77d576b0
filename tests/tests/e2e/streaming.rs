//! Streamed answers pass through the filter chunk by chunk: the first SSE event
//! reaches the client while the upstream is still streaming, every event arrives
//! intact, and the streamed answer carries `x-trace-id` like any other.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llm_filter_e2e::{
    chat_stream_body, http_client, skip_without_envoy, EnvoyBuilder, MockConfig, MockUpstream,
    SseEvent, SseParser,
};
use serde_json::{json, Value};

const CHUNK_DELAY_MS: u64 = 300;

/// A streamed call read event by event, with what the upstream was doing when
/// the first event reached the client.
struct Observed {
    headers: reqwest::header::HeaderMap,
    events: Vec<SseEvent>,
    /// Streams the mock had not finished when the first event arrived.
    upstream_in_flight_at_first_event: usize,
    trailing: String,
}

async fn stream(
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
    mock: &MockUpstream,
) -> Observed {
    let mut request = http_client()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("send stream request");
    assert_eq!(response.status(), 200);
    let response_headers = response.headers().clone();
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut in_flight = None;
    let mut bytes = response.bytes_stream();
    while let Some(chunk) = bytes.next().await {
        let chunk = chunk.expect("read stream");
        events.extend(parser.push(&chunk, Instant::now()));
        if in_flight.is_none() && !events.is_empty() {
            in_flight = Some(mock.in_flight());
        }
    }
    Observed {
        headers: response_headers,
        events,
        upstream_in_flight_at_first_event: in_flight.unwrap_or(0),
        trailing: parser.remainder(),
    }
}

#[tokio::test]
async fn first_event_arrives_while_the_upstream_still_streams() {
    if skip_without_envoy("first_event_arrives_while_the_upstream_still_streams") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("stream"));
    mock.set_chunk_delay_ms(CHUNK_DELAY_MS);
    let envoy = EnvoyBuilder::new()
        .plugin_config("{}")
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter");

    let text = "one two three four five";
    let cases = [
        (
            "/v1/chat/completions",
            chat_stream_body("gpt-4o", text, true),
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-4o", "prompt": text, "stream": true}),
        ),
    ];
    for (path, body) in cases {
        let case = path;
        let observed = stream(
            &envoy.url(path),
            &body,
            &[("x-request-priority", "P0")],
            &mock,
        )
        .await;

        // Intact: every event parses, the text is whole, the stream is terminated.
        let events = &observed.events;
        assert!(events.len() >= 6, "{case}: {events:?}");
        assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| {
                e.json()
                    .unwrap_or_else(|| panic!("{case}: event is not JSON: {:?}", e.data))
            })
            .collect();
        let content: String = chunks
            .iter()
            .filter_map(|c| {
                c.pointer("/choices/0/delta/content")
                    .or_else(|| c.pointer("/choices/0/text"))
                    .and_then(Value::as_str)
            })
            .collect();
        assert_eq!(content, format!("echo: {text} [stream]"), "{case}");
        assert!(
            observed.trailing.is_empty(),
            "{case}: {:?}",
            observed.trailing
        );

        // Chunk by chunk: when the first event reached the client the upstream
        // still had several pauses of CHUNK_DELAY_MS ahead of it.
        assert_eq!(
            observed.upstream_in_flight_at_first_event, 1,
            "{case}: the first event arrived only after the upstream finished"
        );
        let nominal = Duration::from_millis(CHUNK_DELAY_MS * (events.len() as u64 - 1));
        let spread = events[events.len() - 1].at - events[0].at;
        assert!(
            spread >= nominal / 2,
            "{case}: events bunched together: {spread:?} for a stream of {nominal:?}"
        );
        let arrivals: Vec<Instant> = events.iter().map(|e| e.at).collect();
        let distinct = arrivals.windows(2).filter(|w| w[1] > w[0]).count() + 1;
        assert!(
            distinct >= events.len() / 2,
            "{case}: {distinct} reads for {} events",
            events.len()
        );

        // The streamed answer names its trace like any other.
        let seen = mock.last_request().expect("upstream saw the call");
        let traceparent = seen.header("traceparent").expect("traceparent upstream");
        let trace_id = observed
            .headers
            .get("x-trace-id")
            .and_then(|v| v.to_str().ok())
            .expect("x-trace-id on the streamed answer");
        assert_eq!(traceparent.get(3..35), Some(trace_id), "{case}");
        assert_eq!(seen.header("x-request-priority"), Some("P0"), "{case}");
        assert_eq!(
            observed
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream"),
            "{case}"
        );
    }
}
