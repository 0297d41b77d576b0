//! What the cache scenarios share: an Envoy with the filter in front of a mock,
//! deterministic (cacheable) request bodies, and reads of the cache's stats.

use std::time::{Duration, Instant};

use llm_filter_e2e::{
    post_json, skip_without_envoy, Envoy, EnvoyBuilder, HttpResponse, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

pub const CHAT: &str = "/v1/chat/completions";

/// Prefix Envoy puts on the stats a Wasm filter defines.
pub const FILTER_STATS: &str = "wasmcustom.";

/// A mock upstream and an Envoy (two workers) with the filter configured by `config`.
pub struct Rig {
    pub mock: MockUpstream,
    pub envoy: Envoy,
}

impl Rig {
    /// `None` (the test is skipped) when the Envoy binary is missing.
    pub fn start(test: &str, config: Value) -> Option<Self> {
        if skip_without_envoy(test) {
            return None;
        }
        let mock = MockUpstream::start(MockConfig::named("up"));
        let envoy = EnvoyBuilder::new()
            .plugin_config(config)
            .upstream("mock", mock.port())
            .start()
            .unwrap_or_else(|e| panic!("envoy: {e:#}"));
        Some(Self { mock, envoy })
    }

    pub fn url(&self, path: &str) -> String {
        self.envoy.url(path)
    }

    /// POSTs a chat body (new connection), panicking on transport errors.
    pub async fn chat(&self, body: &Value, headers: &[(&str, &str)]) -> HttpResponse {
        post_json(&self.url(CHAT), body, headers)
            .await
            .unwrap_or_else(|e| panic!("call: {e:#}"))
    }

    /// One of the filter's counters or gauges by its encoded name (`result`
    /// label and all); 0 while it does not exist.
    pub fn stat(&self, name: &str) -> u64 {
        self.envoy.stat(&format!("{FILTER_STATS}{name}"))
    }

    /// Polls a filter stat until it reaches `at_least` (counters move when
    /// Envoy logs a stream, just after its last byte); returns the last value.
    pub fn wait_stat(&self, name: &str, at_least: u64) -> u64 {
        self.envoy.wait_for_stat(
            &format!("{FILTER_STATS}{name}"),
            at_least,
            Duration::from_secs(5),
        )
    }

    /// Lookups counted with `result`, once the calls so far were logged.
    pub fn lookups(&self, result: &str, at_least: u64) -> u64 {
        self.wait_stat(
            &format!("llm_filter_cache_lookups_totalresult=.={result};.;"),
            at_least,
        )
    }
}

/// A deterministic chat call (temperature 0) asking `content`.
pub fn cacheable(content: &str) -> Value {
    json!({
        "model": "gpt-4o",
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
}

/// The same call asking for a stream.
pub fn cacheable_stream(content: &str, include_usage: bool) -> Value {
    let mut body = cacheable(content);
    body["stream"] = json!(true);
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// The `x-cache` header of an answer.
pub fn x_cache(r: &HttpResponse) -> &str {
    r.header("x-cache").unwrap_or("<none>")
}

/// The assistant's message of a JSON chat answer.
pub fn message(r: &HttpResponse) -> String {
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Polls `check` until it holds or `timeout` passes; returns whether it held.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
