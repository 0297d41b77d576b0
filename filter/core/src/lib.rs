//! Pure policy of llm-filter. Every decision the filter makes about an LLM call
//! lives here, free of any proxy-wasm dependency, so it is unit-tested natively;
//! the plugin crate only reads from the host, calls in here and applies the result.
#![deny(missing_docs)]
// Nothing here needs it: the one crate that touches raw memory is the plugin.
#![forbid(unsafe_code)]
// A build without every feature leaves parts of the call's state and of the
// policy modules unused: their steps are the `*_off.rs` twins (`walk`).
#![cfg_attr(not(feature = "full"), allow(dead_code, unused_imports))]
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod ab;
pub mod admin;
pub mod baggage;
pub mod budget;
pub mod build;
pub mod cache;
pub mod config;
pub mod credentials;
pub mod degrade;
pub mod dialect;
#[cfg(test)]
mod fuzz;
pub mod guard;
pub mod host;
pub mod identity;
pub mod json;
pub mod keyspace;
pub mod limits;
pub mod load;
pub mod metrics;
pub mod observe;
pub mod pricing;
pub mod priority;
pub mod routing;
pub mod shaping;
pub mod spans;
pub mod sse;
pub mod stat_name;
pub mod summary;
pub mod tokens;
pub mod trace_context;
pub mod usage;
pub mod wait;
pub mod walk;
