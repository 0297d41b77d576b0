//! What the failover and hedging scenarios share: Envoy with the filter
//! routing `gpt-4o` over two mock backends, `a` and `b`, at equal weights.

use llm_filter_e2e::{Envoy, EnvoyBuilder, MockUpstream};
use serde_json::{json, Value};

/// Envoy with `default` as the catch-all route and `a` and `b` as the model's
/// backends; `routing` holds the other settings of the `routing` section.
pub fn envoy(default: &MockUpstream, a: &MockUpstream, b: &MockUpstream, routing: Value) -> Envoy {
    let mut section = json!({"models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]}});
    if let (Some(s), Some(extra)) = (section.as_object_mut(), routing.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    EnvoyBuilder::new()
        .plugin_config(json!({ "routing": section }))
        .upstream(default.name(), default.port())
        .upstream(a.name(), a.port())
        .upstream(b.name(), b.port())
        .header_route("x-llm-cluster")
        .route_timeout_ms(30_000)
        .start()
        .expect("envoy with the filter and two backends")
}
