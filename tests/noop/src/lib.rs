//! The floor `make bench` measures llm-filter against: a proxy-wasm HTTP filter
//! built with the same SDK, in the same VM, that does nothing. Whatever it costs
//! over plain Envoy is the host's (context creation, one crossing per callback);
//! whatever llm-filter costs over it is ours.
//!
//! With the configuration `{"hold_body":true}` it holds each request's body
//! until its end and copies it into the VM once, as llm-filter does for an LLM
//! call: the floor of any filter that reads bodies.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel};

#[derive(Default)]
struct Root {
    hold_body: bool,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let config = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        self.hold_body = String::from_utf8_lossy(&config).contains("\"hold_body\":true");
        true
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Noop {
            hold_body: self.hold_body,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Every callback but the held body's keeps the SDK's default: `Action::Continue`.
struct Noop {
    hold_body: bool,
}

impl Context for Noop {}

impl HttpContext for Noop {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        if self.hold_body && !end_of_stream {
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if !self.hold_body {
            return Action::Continue;
        }
        if !end_of_stream {
            // Buffer until the end, then read the whole body once.
            return Action::Pause;
        }
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size);
        std::hint::black_box(body.ok());
        Action::Continue
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}
