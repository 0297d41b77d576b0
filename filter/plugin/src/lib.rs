//! proxy-wasm glue of llm-filter: reads from Envoy, asks the core what to do,
//! and applies the answer. No policy lives here.

mod host;
mod http;
mod root;
mod worker;

use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    // A panic traps the VM; the hook at least says why, at the loudest level.
    std::panic::set_hook(Box::new(|info| {
        let _ = proxy_wasm::hostcalls::log(LogLevel::Critical, &format!("llm-filter panic: {info}"));
    }));
    proxy_wasm::set_root_context(|_| Box::new(root::Root::default()));
}}
