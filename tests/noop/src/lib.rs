//! The floor `make bench` measures llm-filter against: a proxy-wasm HTTP filter
//! built with the same SDK, in the same VM, that does nothing. Whatever it costs
//! over plain Envoy is the host's (context creation, one crossing per callback);
//! whatever llm-filter costs over it is ours.
//!
//! With the configuration `{"hold_body":true}` it holds each request's body
//! until its end and copies it into the VM once, as llm-filter does for an LLM
//! call: the floor of any filter that reads bodies.
//!
//! With `{"replay_tagging":true}` it makes, in each callback, the host calls a
//! tagging-only llm-filter call makes there (the census's exact counts of
//! `filter-tagging-only`: 20 a call), with constant arguments and no logic:
//! the floor of any filter that reads and writes what tagging does, so the
//! bench can tell the ABI's cost of the features from the filter's own code.
//! It must follow the census when the filter's host calls change.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

#[derive(Default)]
struct Root {
    hold_body: bool,
    /// Metric ids for the replay; empty when it is off.
    replay: Vec<u32>,
}

impl Context for Root {}

/// The stats a tagging call records: requests, duration, time to first
/// token, input and output tokens.
const REPLAY_METRICS: [(MetricType, &str); 5] = [
    (MetricType::Counter, "noop_replay_requests_total"),
    (MetricType::Histogram, "noop_replay_duration_ms"),
    (MetricType::Histogram, "noop_replay_ttft_ms"),
    (MetricType::Counter, "noop_replay_input_tokens_total"),
    (MetricType::Counter, "noop_replay_output_tokens_total"),
];

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let config = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let config = String::from_utf8_lossy(&config);
        self.hold_body = config.contains("\"hold_body\":true");
        if config.contains("\"replay_tagging\":true") {
            self.replay = REPLAY_METRICS
                .iter()
                .filter_map(|(kind, name)| hostcalls::define_metric(*kind, name).ok())
                .collect();
        }
        true
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Noop {
            hold_body: self.hold_body,
            replay: self.replay.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Every callback but the held body's keeps the SDK's default: `Action::Continue`.
struct Noop {
    hold_body: bool,
    replay: Vec<u32>,
}

impl Context for Noop {}

/// One read of the host's clock, as the filter makes on each callback.
fn clock() {
    std::hint::black_box(hostcalls::get_current_time().ok());
}

/// Copies a body's `size` bytes into the VM, as a filter reading it does.
fn read_body(buffer: BufferType, size: usize) {
    std::hint::black_box(hostcalls::get_buffer(buffer, 0, size).ok());
}

impl HttpContext for Noop {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        if !self.replay.is_empty() {
            clock();
            std::hint::black_box(hostcalls::get_map(MapType::HttpRequestHeaders).ok());
            for (name, value) in [
                ("x-request-priority", "P1"),
                ("baggage", "priority=P1"),
                (
                    "traceparent",
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                ),
            ] {
                let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(value));
            }
        }
        if self.hold_body && !end_of_stream {
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if !self.replay.is_empty() {
            clock();
            read_body(BufferType::HttpRequestBody, size);
        }
        if !self.hold_body {
            return Action::Continue;
        }
        if !end_of_stream {
            // Buffer until the end, then read the whole body once.
            return Action::Pause;
        }
        read_body(BufferType::HttpRequestBody, size);
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        if !self.replay.is_empty() {
            clock();
            std::hint::black_box(hostcalls::get_map(MapType::HttpResponseHeaders).ok());
            let trace_id = "0af7651916cd43dd8448eb211c80319c";
            let _ = hostcalls::set_map_value(
                MapType::HttpResponseHeaders,
                "x-trace-id",
                Some(trace_id),
            );
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, _: bool) -> Action {
        if !self.replay.is_empty() {
            clock();
            read_body(BufferType::HttpResponseBody, size);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.replay.is_empty() {
            return;
        }
        for _ in 0..3 {
            clock();
        }
        for (id, (kind, _)) in self.replay.iter().zip(REPLAY_METRICS) {
            let _ = match kind {
                MetricType::Histogram => hostcalls::record_metric(*id, 100),
                _ => hostcalls::increment_metric(*id, 1),
            };
        }
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}
