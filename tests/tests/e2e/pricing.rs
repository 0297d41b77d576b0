//! Prices through the real Envoy: the shipped catalog (examples/prices.json),
//! put into the configuration by scripts/prices.py, prices the official
//! SDKs' calls at their provider's rates. The mock reports the usage a
//! provider's prompt cache leaves: Anthropic's reads and 5-minute and 1-hour
//! writes (a JSON answer and a stream), a long context past its threshold,
//! OpenAI's cached input and reasoning. The token and saving counters, each
//! call's span and a cost limit's count are the arithmetic of the list
//! prices, to the millionth; the cost limit refuses the call its real cost
//! leaves no room for, and not the one before.

use std::process::{Command, Stdio};
use std::time::Duration;

use llm_filter_e2e::{
    skip_without_envoy, workspace_root, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

use crate::support::otlp::Receiver;
use crate::support::sdk::{python, run, ANTHROPIC, OPENAI};

/// The configuration with the shipped catalog in its `limits`, as the
/// operator's script writes it.
pub(crate) fn with_catalog(config: &Value) -> Value {
    let mut child = Command::new(python())
        .arg(workspace_root().join("scripts/prices.py"))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("scripts/prices.py");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(config.to_string().as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "scripts/prices.py failed");
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["limits"]["catalog_as_of"], "2026-12-03", "{config}");
    config
}

/// The mock provider `name`, the span receiver, and Envoy with the catalog
/// and one cost rule on `model`.
fn start(name: &str, model: &str, cost_per_day: f64) -> (MockUpstream, Receiver, Envoy) {
    let mock = MockUpstream::start(MockConfig::named(name));
    let receiver = Receiver::start(&[]);
    let config = with_catalog(&json!({
        "tracing": {"otlp": {"cluster": "otel", "interval_ms": 200}},
        "limits": {"rules": [{"name": "spend", "by": ["tenant"], "models": [model],
                              "cost_per_day": cost_per_day}]},
    }));
    let envoy = EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .upstream("otel", receiver.port)
        .start()
        .expect("envoy with the filter and the catalog");
    (mock, receiver, envoy)
}

/// The cost rule counted `micros` millionths of the unit, exactly.
fn assert_rule_counted(e: &Envoy, micros: f64) {
    let rule = [("rule", "spend")];
    let cost = "llm_filter_limits_cost_micros_total";
    e.wait_for_metric(cost, &rule, micros, Duration::from_secs(5));
    assert_eq!(e.metric(cost, &rule), micros);
}

/// The attributes of the span of the mock's `n`-th call (from 0).
async fn span_of_call(mock: &MockUpstream, receiver: &Receiver, n: usize) -> Value {
    let seen = &mock.requests()[n];
    let trace = seen.header("traceparent").expect("a traceparent upstream");
    let trace_id = trace.split('-').nth(1).unwrap();
    let span = receiver
        .span_of(trace_id, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no span of call {n}"));
    span["attributes"].clone()
}

fn assert_near(got: &Value, want: f64, what: &str) {
    let got = got.as_f64().unwrap_or_else(|| panic!("{what}: {got}"));
    assert!((got - want).abs() < 1e-9, "{what}: {got}, want {want}");
}

/// One model's counter, by the labels the bootstrap's `stats_tags` give.
fn counter(e: &Envoy, name: &str, labels: &[(&str, &str)]) -> f64 {
    e.metric(name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_cache_reads_and_writes_cost_their_rates_and_a_cost_limit_counts_them() {
    if skip_without_envoy(
        "anthropic_cache_reads_and_writes_cost_their_rates_and_a_cost_limit_counts_them",
    ) {
        return;
    }
    // Claude Sonnet 4.5 at the catalog's list prices ($3 input, $3.75 and $6
    // per million written for five minutes and an hour, $0.30 read, $15
    // output). Each call below costs 50 × 3 + 100,000 × 0.3 + 20,000 × 3.75
    // + 10,000 × 6 + 200 × 15 = 168,150 millionths of a dollar; its
    // reservation (a few prompt tokens and 16 of output) a few hundred.
    // $0.40 a day lets a third call go (0.3363 spent) and none after it
    // (0.50445). Priced with writes at the input rate (123,150 each) a
    // fourth would go; with every token at the input rate (393,150) not a
    // second.
    let (mock, receiver, e) = start("anthropic", "claude-sonnet-4-5", 0.40);
    mock.set_reported_usage(Some(json!({
        "input_tokens": 50,
        "cache_read_input_tokens": 100_000,
        "cache_creation_input_tokens": 30_000,
        "cache_creation": {"ephemeral_5m_input_tokens": 20_000, "ephemeral_1h_input_tokens": 10_000},
        "output_tokens": 200,
    })));
    let url = e.url("");
    let args = ["--model", "claude-sonnet-4-5", "--max-tokens", "16"];
    let first = run(ANTHROPIC, "messages", &url, &args).await;
    assert_eq!(
        first["usage"],
        json!({"input": 50, "output": 200, "cache_read": 100_000, "cache_creation": 30_000}),
        "the provider's usage reaches the SDK as it was: {first}"
    );
    let streamed = run(ANTHROPIC, "messages_stream", &url, &args).await;
    assert_eq!(streamed["usage"]["cache_read"], 100_000, "{streamed}");
    assert_eq!(streamed["usage"]["output"], 200, "{streamed}");
    let third = run(ANTHROPIC, "messages", &url, &args).await;
    assert_eq!(third["usage"]["cache_creation"], 30_000, "{third}");
    let fourth = run(ANTHROPIC, "messages_error", &url, &args).await;
    assert_eq!(
        (fourth["error_class"].as_str(), fourth["status"].as_u64()),
        (Some("RateLimitError"), Some(429)),
        "{fourth}"
    );
    assert_eq!(mock.request_count(), 3, "the fourth never left");

    // A call of another tenant past the 200,000-token threshold: all of it
    // at the long-context rates ($6, $0.60 read, $22.50): 150,000 × 6 +
    // 100,000 × 0.6 + 200 × 22.5 = 964,500.
    mock.set_reported_usage(Some(json!({
        "input_tokens": 150_000,
        "cache_read_input_tokens": 100_000,
        "output_tokens": 200,
    })));
    let long = [&args[..], &["--api-key", "sk-ant-e2e-long-context"]].concat();
    run(ANTHROPIC, "messages", &url, &long).await;

    let model = [("model", "claude-sonnet-4-5")];
    let tokens = |kind: &str| {
        counter(
            &e,
            "gen_ai_client_token_usage_total",
            &[("model", "claude-sonnet-4-5"), ("token_type", kind)],
        )
    };
    assert_rule_counted(&e, 3.0 * 168_150.0 + 964_500.0);
    assert_eq!(
        (tokens("cached_input"), tokens("cache_creation_input")),
        (400_000.0, 90_000.0)
    );
    // Saved: 300,000 read at $2.70 below the input, 100,000 at $5.40 below
    // the long context's; the writes' premium: 60,000 at $0.75 and 30,000 at
    // $3 above the input.
    assert_eq!(
        counter(&e, "llm_filter_prompt_cache_saved_micros_total", &model),
        810_000.0 + 540_000.0
    );
    assert_eq!(
        counter(
            &e,
            "llm_filter_prompt_cache_write_premium_micros_total",
            &model
        ),
        135_000.0
    );

    // Each call's span: its tokens under the GenAI names, its cost and the
    // cache's net saving (270,000 − 45,000 millionths).
    for n in [0, 1, 2] {
        let a = span_of_call(&mock, &receiver, n).await;
        assert_eq!(a["gen_ai.usage.cache_read.input_tokens"], 100_000, "{a}");
        assert_eq!(a["gen_ai.usage.cache_creation.input_tokens"], 30_000, "{a}");
        assert_eq!(a["gen_ai.usage.input_tokens"], 130_050, "{a}");
        assert_near(&a["llm_filter.cost"], 0.168_15, "cost");
        assert_near(&a["llm_filter.prompt_cache.saved"], 0.225, "saved");
    }
    let a = span_of_call(&mock, &receiver, 3).await;
    assert_near(&a["llm_filter.cost"], 0.9645, "long-context cost");

    // The keys the SDK sent are in no metric and no span.
    let stats = e.prometheus().unwrap();
    let spans = serde_json::to_string(&receiver.spans()).unwrap();
    for key in ["sk-ant-e2e-sdk", "sk-ant-e2e-long-context"] {
        assert!(!stats.contains(key) && !spans.contains(key), "{key} leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_cached_input_and_reasoning_cost_their_rates() {
    if skip_without_envoy("openai_cached_input_and_reasoning_cost_their_rates") {
        return;
    }
    // o3 at the catalog's list prices ($2 input, $0.50 cached input, $8
    // output, reasoning billed as output): 500 × 2 + 1,500 × 0.5 + 100 × 8
    // = 2,550 millionths of a dollar a call, 2,250 of it saved by the cache.
    let (mock, receiver, e) = start("openai", "o3", 100.0);
    mock.set_reported_usage(Some(json!({
        "prompt_tokens": 2_000,
        "completion_tokens": 100,
        "total_tokens": 2_100,
        "prompt_tokens_details": {"cached_tokens": 1_500},
        "completion_tokens_details": {"reasoning_tokens": 40},
    })));
    let url = e.url("/v1");
    let out = run(OPENAI, "chat", &url, &["--model", "o3"]).await;
    assert_eq!(
        (
            out["usage"]["cached"].as_u64(),
            out["usage"]["reasoning"].as_u64()
        ),
        (Some(1_500), Some(40)),
        "{out}"
    );
    let streamed = run(OPENAI, "stream", &url, &["--model", "o3"]).await;
    let last = streamed["chunks"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["usage"]["cached"], 1_500, "{streamed}");

    assert_rule_counted(&e, 2.0 * 2_550.0);
    let model = [("model", "o3")];
    assert_eq!(
        counter(&e, "llm_filter_prompt_cache_saved_micros_total", &model),
        2.0 * 2_250.0
    );
    assert_eq!(
        counter(
            &e,
            "llm_filter_prompt_cache_write_premium_micros_total",
            &model
        ),
        0.0,
        "OpenAI's writes cost the input rate"
    );
    assert_eq!(
        counter(
            &e,
            "gen_ai_client_token_usage_total",
            &[("model", "o3"), ("token_type", "cached_input")]
        ),
        3_000.0
    );
    for n in [0, 1] {
        let a = span_of_call(&mock, &receiver, n).await;
        assert_eq!(a["gen_ai.usage.cache_read.input_tokens"], 1_500, "{a}");
        assert_eq!(a["gen_ai.usage.reasoning.output_tokens"], 40, "{a}");
        assert!(
            a.get("gen_ai.usage.cache_creation.input_tokens").is_none(),
            "{a}"
        );
        assert_near(&a["llm_filter.cost"], 0.002_55, "cost");
        assert_near(&a["llm_filter.prompt_cache.saved"], 0.002_25, "saved");
    }
}
