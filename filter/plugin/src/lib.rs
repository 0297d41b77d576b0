//! proxy-wasm glue of llm-filter: reads from Envoy, asks the core what to do,
//! and applies the answer. No policy lives here.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod adapter;
mod callout;
mod hostcall;
mod http;
mod logger;
mod root;
mod stream;
mod turn;
mod worker;

use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    // Our own logger: the SDK's unwraps the host's answer to every line.
    logger::init(log::LevelFilter::Info);
    // A panic traps the VM; the hook at least says why, at the loudest level.
    std::panic::set_hook(Box::new(|info| {
        let _ = hostcall::log(LogLevel::Critical, &format!("llm-filter panic: {info}"));
    }));
    proxy_wasm::set_root_context(|_| Box::new(root::Root::default()));
}}
