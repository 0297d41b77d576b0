//! W3C Trace Context through the filter: a valid `traceparent` goes on as it
//! came when the filter exports no span (with `tracing.otlp` it is continued
//! with the span the filter exports: `spans`), anything else starts a new
//! trace and drops the orphaned `tracestate`, the client learns the trace id
//! in `x-trace-id`, and `tracing.mode: off` leaves both headers exactly as
//! sent.

use std::collections::HashSet;

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, unique, Envoy, EnvoyBuilder, HttpResponse,
    MockConfig, MockUpstream, RecordedRequest,
};
use serde_json::{json, Value};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

/// The fields of a `traceparent` as this test reads it: exactly version 00, 55
/// bytes, lowercase hex, non-zero ids.
#[derive(Debug, PartialEq)]
struct Parsed {
    trace_id: String,
    span_id: String,
    flags: String,
}

fn parse_strict(value: &str) -> Option<Parsed> {
    let fields: Vec<&str> = value.split('-').collect();
    let lower_hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    match fields.as_slice() {
        ["00", trace, span, flags]
            if lower_hex(trace, 32)
                && lower_hex(span, 16)
                && lower_hex(flags, 2)
                && trace.bytes().any(|b| b != b'0')
                && span.bytes().any(|b| b != b'0') =>
        {
            Some(Parsed {
                trace_id: trace.to_string(),
                span_id: span.to_string(),
                flags: flags.to_string(),
            })
        }
        _ => None,
    }
}

fn start(mock: &MockUpstream, config: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

/// One chat call with `headers`: the client's answer and what the upstream saw.
async fn call(
    envoy: &Envoy,
    mock: &MockUpstream,
    headers: &[(&str, &str)],
) -> (HttpResponse, RecordedRequest) {
    mock.clear();
    let response = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", &unique("trace me")),
        headers,
    )
    .await
    .unwrap_or_else(|e| panic!("{headers:?}: {e:#}"));
    assert_eq!(response.status, 200, "{headers:?}: {}", response.text());
    let seen = mock.last_request().expect("upstream saw the call");
    (response, seen)
}

/// The one `traceparent` the upstream saw, parsed strictly.
fn upstream_traceparent(seen: &RecordedRequest, case: &str) -> Parsed {
    let values = seen.header_all("traceparent");
    assert_eq!(values.len(), 1, "{case}: {values:?}");
    parse_strict(values[0]).unwrap_or_else(|| panic!("{case}: invalid upstream {values:?}"))
}

/// The filter exports no span here, so it is no participant in the trace:
/// the upstream's span hangs under the caller's, whose `traceparent` and
/// `tracestate` go on as they came.
#[tokio::test]
async fn valid_traceparent_goes_on_as_it_came() {
    if skip_without_envoy("valid_traceparent_goes_on_as_it_came") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("trace"));
    let envoy = start(&mock, json!({}));

    for flags in ["01", "00"] {
        let sent = format!("00-{TRACE_ID}-{PARENT_ID}-{flags}");
        let case = format!("traceparent {sent}");
        let (response, seen) = call(
            &envoy,
            &mock,
            &[("traceparent", &sent), ("tracestate", TRACESTATE)],
        )
        .await;
        let out = upstream_traceparent(&seen, &case);
        assert_eq!(
            (
                out.trace_id.as_str(),
                out.span_id.as_str(),
                out.flags.as_str()
            ),
            (TRACE_ID, PARENT_ID, flags),
            "{case}: as it came"
        );
        assert_eq!(seen.header_all("tracestate"), [TRACESTATE], "{case}");
        assert_eq!(response.header("x-trace-id"), Some(TRACE_ID), "{case}");
    }

    // Several tracestate headers of a continued trace all go on, in order.
    let sent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let (_, seen) = call(
        &envoy,
        &mock,
        &[
            ("traceparent", &sent),
            ("tracestate", "a=1"),
            ("tracestate", "b=2"),
        ],
    )
    .await;
    let tracestate = seen.header_all("tracestate").join(",");
    assert_eq!(tracestate, "a=1,b=2");

    // A later version is read by its known fields (W3C) and goes on as 00.
    let future = format!("cc-{TRACE_ID}-{PARENT_ID}-01-what-comes-next");
    let (response, seen) = call(&envoy, &mock, &[("traceparent", &future)]).await;
    assert_eq!(
        seen.header_all("traceparent"),
        [format!("00-{TRACE_ID}-{PARENT_ID}-01")]
    );
    assert_eq!(response.header("x-trace-id"), Some(TRACE_ID));
}

#[tokio::test]
async fn invalid_or_absent_traceparent_starts_a_new_trace() {
    if skip_without_envoy("invalid_or_absent_traceparent_starts_a_new_trace") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("trace-new"));
    let envoy = start(&mock, json!({}));

    let invalid = [
        format!("ff-{TRACE_ID}-{PARENT_ID}-01"),
        format!("00-{}-{PARENT_ID}-01", "0".repeat(32)),
        format!("00-{TRACE_ID}-{}-01", "0".repeat(16)),
        format!("00-{}-{PARENT_ID}-01", TRACE_ID.to_uppercase()),
        format!("00-{TRACE_ID}-{}-01", PARENT_ID.to_uppercase()),
        format!("00-{}-{PARENT_ID}-01", &TRACE_ID[..31]),
        format!("00-{TRACE_ID}0-{PARENT_ID}-01"),
        format!("00-{TRACE_ID}-{}-01", &PARENT_ID[..15]),
        format!("00-{TRACE_ID}-{PARENT_ID}-1"),
        format!("00-{TRACE_ID}-{PARENT_ID}-01-extra"),
        format!("0-{TRACE_ID}-{PARENT_ID}-01"),
        format!("00-{TRACE_ID}-{PARENT_ID}-0g"),
        format!("00_{TRACE_ID}_{PARENT_ID}_01"),
        "garbage".to_string(),
        "00-not-a-trace-01".to_string(),
    ];
    let mut trace_ids = HashSet::new();
    for sent in &invalid {
        let case = format!("traceparent {sent:?}");
        let (response, seen) = call(
            &envoy,
            &mock,
            &[("traceparent", sent), ("tracestate", TRACESTATE)],
        )
        .await;
        let out = upstream_traceparent(&seen, &case);
        assert_ne!(out.trace_id, TRACE_ID, "{case}: not continued");
        assert_eq!(out.flags, "01", "{case}: a new trace is sampled");
        assert!(
            seen.header_all("tracestate").is_empty(),
            "{case}: orphaned tracestate forwarded: {:?}",
            seen.header_all("tracestate")
        );
        assert_eq!(
            response.header("x-trace-id"),
            Some(out.trace_id.as_str()),
            "{case}"
        );
        assert!(trace_ids.insert(out.trace_id), "{case}: trace id repeats");
    }

    // Every tracestate header of an orphaned trace goes.
    let (_, seen) = call(
        &envoy,
        &mock,
        &[
            ("traceparent", "garbage"),
            ("tracestate", "a=1"),
            ("tracestate", "b=2"),
        ],
    )
    .await;
    assert!(seen.header_all("tracestate").is_empty());

    // No traceparent at all: a new trace each call, tracestate dropped.
    for _ in 0..3 {
        let (response, seen) = call(&envoy, &mock, &[("tracestate", TRACESTATE)]).await;
        let out = upstream_traceparent(&seen, "absent");
        assert_eq!(out.flags, "01");
        assert!(seen.header_all("tracestate").is_empty());
        assert_eq!(response.header("x-trace-id"), Some(out.trace_id.as_str()));
        assert!(trace_ids.insert(out.trace_id), "absent: trace id repeats");
    }
}

#[tokio::test]
async fn tracing_off_leaves_trace_headers_as_sent() {
    if skip_without_envoy("tracing_off_leaves_trace_headers_as_sent") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("trace-off"));
    let envoy = start(&mock, json!({"tracing": {"mode": "off"}}));

    let valid = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    let invalid = format!("ff-{TRACE_ID}-{PARENT_ID}-01");
    // (traceparent sent, tracestate sent, x-trace-id expected)
    let cases = [
        (Some(valid.as_str()), Some(TRACESTATE), Some(TRACE_ID)),
        (Some(valid.as_str()), None, Some(TRACE_ID)),
        (Some(invalid.as_str()), Some(TRACESTATE), None),
        (Some("garbage"), None, None),
        (None, Some(TRACESTATE), None),
        (None, None, None),
    ];
    for (traceparent, tracestate, trace_id) in cases {
        let mut headers = vec![("x-request-priority", "p0")];
        headers.extend(traceparent.map(|v| ("traceparent", v)));
        headers.extend(tracestate.map(|v| ("tracestate", v)));
        let case = format!("{headers:?}");
        let (response, seen) = call(&envoy, &mock, &headers).await;
        let want: Vec<&str> = traceparent.into_iter().collect();
        assert_eq!(seen.header_all("traceparent"), want, "{case}");
        let want: Vec<&str> = tracestate.into_iter().collect();
        assert_eq!(seen.header_all("tracestate"), want, "{case}");
        assert_eq!(response.header("x-trace-id"), trace_id, "{case}");
        // Priority is still the filter's business.
        assert_eq!(seen.header_all("x-request-priority"), ["P0"], "{case}");
        assert_eq!(seen.header_all("baggage"), ["priority=P0"], "{case}");
    }
}
