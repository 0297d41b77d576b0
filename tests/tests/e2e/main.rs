//! The end-to-end scenarios of llm-filter: the real Envoy with the built filter in
//! front of mock upstreams. One test binary, so tokio, hyper and reqwest are
//! linked once; one module per area of the request walk, which names each test
//! (`cache::coalesce::concurrent_twins_share_one_upstream_call`); what
//! they share, and the proof of the harness itself, is under `support`.
// Tests assert by panicking, as the unit tests beside the code do.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod ab;
mod baggage;
mod bedrock;
mod budget;
mod cache;
mod concurrency;
mod config;
mod credentials;
mod dashboard;
mod degrade;
mod degrade_sources;
mod deploy_configs;
mod dialects;
mod gemini;
mod guardrail_service;
mod guardrails;
mod hostile;
mod identity;
mod istio;
mod istiod;
mod limits;
mod load;
mod mesh_names;
mod metrics;
mod oauth2;
mod passthrough;
mod pricing;
mod priority;
mod prompt_cache;
mod provider_tls;
mod providers;
mod reload;
mod routing;
mod sdk;
mod sdk_dialects;
mod shaping;
mod shared_data;
mod spans;
mod streaming;
mod support;
mod trace_context;
