//! The filter's metrics as Prometheus sees them at Envoy's admin
//! `/stats/prometheus`, with real labels from the `stats_tags` rules: calls by
//! priority, model and outcome, token usage from JSON and streamed answers,
//! duration and time-to-first-token histograms, sanitised model labels.

use std::time::Duration;

use llm_filter_e2e::prometheus::{self, Sample};
use llm_filter_e2e::{
    chat_body, chat_stream_body, post_json, skip_without_envoy, stream_sse, Envoy, EnvoyBuilder,
    MockConfig, MockUpstream,
};
use serde_json::{json, Value};

const REQUESTS: &str = "llm_filter_requests_total";
const TOKENS: &str = "gen_ai_client_token_usage_total";
const DURATION: &str = "gen_ai_client_operation_duration_ms";
const TTFT: &str = "gen_ai_server_time_to_first_token_ms";

/// Counters move when Envoy logs the stream, histograms after a stats flush
/// (1 s in the harness): generous on a loaded machine, and polled, not slept.
const DEADLINE: Duration = Duration::from_secs(20);

fn start(mock: &MockUpstream) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config("{}")
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

fn family(envoy: &Envoy, name: &str) -> Vec<Sample> {
    prometheus::family(&envoy.metrics(), name)
        .into_iter()
        .cloned()
        .collect()
}

fn usage_of(value: &Value) -> (u64, u64) {
    let tokens = |key: &str| value[key].as_u64().unwrap_or(0);
    (tokens("prompt_tokens"), tokens("completion_tokens"))
}

/// Waits for the token counters of `model` to reach `(input, output)` and checks
/// they stop exactly there (a missing counter reads as 0).
fn assert_tokens(envoy: &Envoy, model: &str, input: u64, output: u64) {
    for (token_type, want) in [("input", input), ("output", output)] {
        let labels = [("model", model), ("token_type", token_type)];
        let got = envoy.wait_for_metric(TOKENS, &labels, want as f64, DEADLINE);
        assert_eq!(
            got,
            want as f64,
            "{model} {token_type} tokens: {:?}",
            family(envoy, TOKENS)
        );
    }
}

/// One call answered by the upstream, and the labels it must be counted under.
struct OutcomeCase {
    /// `x-request-priority` sent, if any.
    sent: Option<&'static str>,
    /// The request's model, one per case so each count stands alone.
    model: &'static str,
    /// Status the mock answers with (`x-mock-status`), as the client sees it.
    status: &'static str,
    priority: &'static str,
    outcome: &'static str,
}

const OUTCOME_CASES: [OutcomeCase; 6] = [
    OutcomeCase {
        sent: Some("P0"),
        model: "m-success",
        status: "200",
        priority: "P0",
        outcome: "success",
    },
    OutcomeCase {
        sent: None,
        model: "m-default",
        status: "201",
        priority: "P1",
        outcome: "success",
    },
    OutcomeCase {
        sent: Some("p2"),
        model: "m-unavailable",
        status: "503",
        priority: "P2",
        outcome: "server_error",
    },
    OutcomeCase {
        sent: Some("P1"),
        model: "m-limited",
        status: "429",
        priority: "P1",
        outcome: "rate_limited",
    },
    OutcomeCase {
        sent: Some("P2"),
        model: "m-bad-request",
        status: "400",
        priority: "P2",
        outcome: "client_error",
    },
    OutcomeCase {
        sent: Some("P0"),
        model: "m-not-found",
        status: "404",
        priority: "P0",
        outcome: "client_error",
    },
];

#[tokio::test]
async fn requests_are_counted_by_priority_model_and_outcome() {
    if skip_without_envoy("requests_are_counted_by_priority_model_and_outcome") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("metrics"));
    let envoy = start(&mock);

    for case in &OUTCOME_CASES {
        let mut headers = vec![("x-mock-status", case.status)];
        headers.extend(case.sent.map(|p| ("x-request-priority", p)));
        let response = post_json(
            &envoy.url("/v1/chat/completions"),
            &chat_body(case.model, "count me"),
            &headers,
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e:#}", case.model));
        assert_eq!(
            response.status.to_string(),
            case.status,
            "{}: {}",
            case.model,
            response.text()
        );
    }
    for case in &OUTCOME_CASES {
        let labels = [
            ("priority", case.priority),
            ("model", case.model),
            ("outcome", case.outcome),
        ];
        let got = envoy.wait_for_metric(REQUESTS, &labels, 1.0, DEADLINE);
        let samples = family(&envoy, REQUESTS);
        assert_eq!(got, 1.0, "{labels:?} in {samples:?}");
        // Counted once, under that outcome only.
        assert_eq!(
            prometheus::sum(&samples, REQUESTS, &[("model", case.model)]),
            1.0,
            "{}: {samples:?}",
            case.model
        );
    }
}

#[tokio::test]
async fn upstream_reset_is_counted_as_reset() {
    if skip_without_envoy("upstream_reset_is_counted_as_reset") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("metrics-reset"));
    let envoy = start(&mock);

    // The upstream drops the connection without answering: Envoy answers the
    // client 503 itself, but the call got no response, which is `reset`, not
    // the `server_error` of an upstream that answered 5xx.
    let response = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("m-reset", "drop me"),
        &[("x-mock-reset", "1"), ("x-request-priority", "P0")],
    )
    .await
    .unwrap();
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(response.header("x-mock-instance"), None, "Envoy answered");
    // (Envoy may have retried it: each attempt was dropped the same way.)
    assert!(mock.request_count() >= 1, "the upstream got the call");

    let labels = [
        ("priority", "P0"),
        ("model", "m-reset"),
        ("outcome", "reset"),
    ];
    let got = envoy.wait_for_metric(REQUESTS, &labels, 1.0, DEADLINE);
    let samples = family(&envoy, REQUESTS);
    assert_eq!(got, 1.0, "{labels:?} in {samples:?}");
    assert_eq!(
        prometheus::sum(&samples, REQUESTS, &[("model", "m-reset")]),
        1.0,
        "{samples:?}"
    );
}

#[tokio::test]
async fn token_usage_is_read_from_json_and_streamed_answers() {
    if skip_without_envoy("token_usage_is_read_from_json_and_streamed_answers") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("tokens"));
    mock.set_chunk_delay_ms(5);
    let envoy = start(&mock);

    // JSON answers: two calls of one model add up.
    let mut want = (0, 0);
    for content in ["a short question", "a slightly longer question than that"] {
        let response = post_json(
            &envoy.url("/v1/chat/completions"),
            &chat_body("tok-json", content),
            &[],
        )
        .await
        .unwrap();
        assert_eq!(response.status, 200, "{}", response.text());
        let (input, output) = usage_of(&response.json()["usage"]);
        assert!(input > 0 && output > 0, "{}", response.text());
        want = (want.0 + input, want.1 + output);
    }
    assert_tokens(&envoy, "tok-json", want.0, want.1);

    // Embeddings report input tokens only.
    let response = post_json(
        &envoy.url("/v1/embeddings"),
        &json!({"model": "tok-embed", "input": ["one two three", "four"]}),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    let (input, output) = usage_of(&response.json()["usage"]);
    assert_eq!(output, 0);
    assert_tokens(&envoy, "tok-embed", input, 0);

    // A stream with `include_usage`: the final chunk's usage.
    let sse = stream_sse(
        &envoy.url("/v1/chat/completions"),
        &chat_stream_body("tok-stream", "stream these words", true),
        &[],
    )
    .await
    .unwrap();
    assert!(sse.done(), "{:?}", sse.events);
    let usage = sse.usage().expect("the mock sent a usage chunk");
    let (input, output) = usage_of(&usage);
    assert!(input > 0 && output > 0, "{usage}");
    assert_tokens(&envoy, "tok-stream", input, output);

    // A stream without it: the filter asked the provider for usage, counts
    // its tokens, and the client still sees no usage.
    let sse = stream_sse(
        &envoy.url("/v1/chat/completions"),
        &chat_stream_body("tok-none", "no usage please", false),
        &[],
    )
    .await
    .unwrap();
    assert!(sse.done());
    assert!(sse.usage().is_none(), "{:?}", sse.events);
    let counted = envoy.wait_for_metric(REQUESTS, &[("model", "tok-none")], 1.0, DEADLINE);
    assert_eq!(counted, 1.0);
    let output = envoy.wait_for_metric(
        TOKENS,
        &[("model", "tok-none"), ("token_type", "output")],
        1.0,
        DEADLINE,
    );
    assert!(output >= 1.0, "{:?}", family(&envoy, TOKENS));
}

#[tokio::test]
async fn duration_and_time_to_first_token_histograms_get_samples() {
    if skip_without_envoy("duration_and_time_to_first_token_histograms_get_samples") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("hist"));
    let envoy = start(&mock);

    let response = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("hist-json", "time me"),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(response.status, 200);
    // A stream whose end comes long after its first event.
    let sse = stream_sse(
        &envoy.url("/v1/chat/completions"),
        &chat_stream_body("hist-stream", "time this stream", false),
        &[("x-mock-chunk-delay-ms", "100")],
    )
    .await
    .unwrap();
    assert!(sse.done());

    for model in ["hist-json", "hist-stream"] {
        for histogram in [DURATION, TTFT] {
            let count = format!("{histogram}_count");
            let got = envoy.wait_for_metric(&count, &[("model", model)], 1.0, DEADLINE);
            assert_eq!(
                got,
                1.0,
                "{count}{{model={model:?}}}: {:?}",
                family(&envoy, histogram)
            );
            let samples = envoy.metrics();
            let buckets = samples
                .iter()
                .filter(|s| {
                    s.name == format!("{histogram}_bucket") && s.has_labels(&[("model", model)])
                })
                .count();
            assert!(buckets > 1, "{histogram} {model}: no buckets");
        }
    }
    // The first token came at the first event; the whole call took every pause
    // after it too (the mock's pauses are minimums, so this holds under load;
    // half of them leaves room for the histograms' approximate sums).
    let samples = envoy.metrics();
    let sum = |name: &str| {
        prometheus::sum(
            &samples,
            &format!("{name}_sum"),
            &[("model", "hist-stream")],
        )
    };
    let pauses_ms = 100.0 * (sse.events.len() as f64 - 1.0);
    assert!(
        sum(DURATION) - sum(TTFT) >= pauses_ms / 2.0,
        "duration {} ms, time to first token {} ms, stream paused {pauses_ms} ms",
        sum(DURATION),
        sum(TTFT)
    );
}

#[tokio::test]
async fn model_labels_are_sanitised() {
    if skip_without_envoy("model_labels_are_sanitised") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("labels"));
    let envoy = start(&mock);

    // Dots, slashes and colons stay (the tag rules end a value at its `;`);
    // a space, and the `;` and `=` of the encoding itself, become `_`.
    let cases = [
        (
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct",
        ),
        ("org.team/model v2:latest", "org.team/model_v2:latest"),
        ("gpt-4.1;.outcome=refused", "gpt-4.1_.outcome_refused"),
    ];
    for (model, _) in cases {
        let response = post_json(
            &envoy.url("/v1/chat/completions"),
            &chat_body(model, "label me"),
            &[("x-request-priority", "P2")],
        )
        .await
        .unwrap();
        assert_eq!(response.status, 200, "{}", response.text());
    }
    for (model, label) in cases {
        let labels = [("priority", "P2"), ("model", label), ("outcome", "success")];
        let got = envoy.wait_for_metric(REQUESTS, &labels, 1.0, DEADLINE);
        assert_eq!(got, 1.0, "{model}: {:?}", family(&envoy, REQUESTS));
        let tokens = envoy.wait_for_metric(
            TOKENS,
            &[("model", label), ("token_type", "input")],
            1.0,
            DEADLINE,
        );
        assert!(tokens >= 1.0, "{model}: {:?}", family(&envoy, TOKENS));
        let durations = envoy.wait_for_metric(
            &format!("{DURATION}_count"),
            &[("model", label)],
            1.0,
            DEADLINE,
        );
        assert_eq!(durations, 1.0, "{model}: {:?}", family(&envoy, DURATION));
    }
    // No label value anywhere keeps a character outside the kept set, and a
    // value never spoofs another label.
    for sample in envoy.metrics() {
        if let Some(model) = sample.labels.get("model") {
            assert!(
                model
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-|/:@+".contains(&b)),
                "{sample:?}"
            );
        }
        if sample.name == REQUESTS {
            assert_eq!(
                sample.labels.get("outcome").map(String::as_str),
                Some("success")
            );
        }
    }
}
