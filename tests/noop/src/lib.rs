//! The floor `make bench` measures llm-filter against: a proxy-wasm HTTP filter
//! built with the same SDK, in the same VM, that does nothing. Whatever it costs
//! over plain Envoy is the host's (context creation, one crossing per callback);
//! whatever llm-filter costs over it is ours.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::LogLevel;

struct Noop;

// Every callback keeps the SDK's default: `Action::Continue`.
impl Context for Noop {}
impl HttpContext for Noop {}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(Noop) });
}}
