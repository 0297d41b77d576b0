//! The end-to-end scenarios of llm-filter: the real Envoy with the built filter in
//! front of mock upstreams. One test binary, so tokio, hyper and reqwest are
//! linked once; one module per area of the request walk, which names each test
//! (`cache_coalesce::concurrent_twins_share_one_upstream_call`).

mod ab;
mod baggage;
mod budget;
mod budget_breaker;
mod cache;
mod cache_bounds;
mod cache_coalesce;
mod cache_semantic;
mod cache_shard;
mod cache_support;
mod concurrency;
mod config;
mod degrade;
mod deploy_configs;
mod failover;
mod harness;
mod hedge;
mod hostile;
mod istio;
mod load;
mod mesh_names;
mod metrics;
mod passthrough;
mod priority;
mod provider_tls;
mod reload;
mod routing;
mod routing_tail;
mod sdk;
mod shaping;
mod shared_data;
mod streaming;
mod trace_context;
mod two_backends;
