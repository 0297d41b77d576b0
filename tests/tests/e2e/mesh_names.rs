//! Cluster and model names as a mesh spells them: Istio names a cluster
//! `outbound|80||api.openai.com` (pipes and dots) and models carry dots
//! (`gpt-4.1`). Routing sends calls to such clusters, learns their health in
//! shared data, and every metric carries the whole name as its `llm_cluster`
//! or `model` label through the stats tags of `envoy/envoy.yaml`.

use std::time::Duration;

use llm_filter_e2e::{chat_body, post_json, skip_without_envoy, EnvoyBuilder, MockUpstream};
use serde_json::json;

const PROVIDER: &str = "outbound|80||api.openai.com";
const IN_MESH: &str = "outbound|8000|v1|vllm.inference.svc.cluster.local";
const MODEL: &str = "gpt-4.1";
const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn istio_cluster_names_route_learn_and_label() {
    if skip_without_envoy("istio_cluster_names_route_learn_and_label") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (provider, in_mesh) = (
        MockUpstream::backend("provider", 0),
        MockUpstream::backend("in-mesh", 0),
    );
    let config = json!({
        "routing": {"models": {MODEL: [{"cluster": PROVIDER}, {"cluster": IN_MESH}]}},
        "budget": {"enabled": true}
    });
    let envoy = EnvoyBuilder::new()
        .plugin_config(&config)
        .upstream(default.name(), default.port())
        .upstream(PROVIDER, provider.port())
        .upstream(IN_MESH, in_mesh.port())
        .header_route("x-llm-cluster")
        .start()
        .expect("envoy with Istio-named clusters");
    let url = envoy.url("/v1/chat/completions");
    // A conversation per call: affinity spreads conversations, not calls.
    let body = |n: usize| chat_body(MODEL, &format!("hi {n}"));

    // Routing: both clusters serve, each answer names its cluster whole.
    let mut served = [0usize; 2];
    for n in 0..30 {
        let r = post_json(&url, &body(n), &[]).await.expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        match r.header("x-llm-cluster") {
            Some(PROVIDER) => served[0] += 1,
            Some(IN_MESH) => served[1] += 1,
            other => panic!("served by {other:?}"),
        }
    }
    assert_eq!(
        [provider.request_count(), in_mesh.request_count()],
        served,
        "x-llm-cluster names the backend that got the call"
    );
    assert!(served.iter().all(|&n| n > 0), "{served:?}");
    assert_eq!(default.request_count(), 0);

    // Metrics: the whole names come out as labels.
    for (cluster, n) in [(PROVIDER, served[0]), (IN_MESH, served[1])] {
        let labels = [("llm_cluster", cluster), ("outcome", "success")];
        let calls = envoy.wait_for_metric(
            "llm_filter_routing_calls_total",
            &labels,
            n as f64,
            DEADLINE,
        );
        assert_eq!(calls, n as f64, "{cluster}: {}", flat(&envoy));
        assert!(
            envoy
                .metrics()
                .iter()
                .any(|s| s.name == "llm_filter_budget_breaker_tier"
                    && s.has_labels(&[("llm_cluster", cluster)])),
            "breaker tier of {cluster}: {}",
            flat(&envoy)
        );
    }
    let requests = envoy.wait_for_metric(
        "llm_filter_requests_total",
        &[("model", MODEL), ("outcome", "success")],
        30.0,
        DEADLINE,
    );
    assert_eq!(requests, 30.0, "{}", flat(&envoy));
    let text = envoy.prometheus().expect("prometheus");
    assert!(
        text.contains(&format!("llm_cluster=\"{PROVIDER}\"")),
        "{}",
        flat(&envoy)
    );
    // No label was left in a metric name.
    let leaked: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(['{', ' ']).next().unwrap_or(l))
        .filter(|name| name.contains("llm_cluster") || name.contains("outbound"))
        .collect();
    assert!(leaked.is_empty(), "flat names: {leaked:?}");

    // Health: a failing Istio-named backend is ejected by its own name and
    // the calls go to the other one.
    in_mesh.set_status(Some(503));
    for n in 100..140 {
        post_json(&url, &body(n), &[]).await.expect("call");
    }
    let ejections = envoy.wait_for_metric(
        "llm_filter_routing_ejections_total",
        &[("llm_cluster", IN_MESH)],
        1.0,
        DEADLINE,
    );
    assert!(ejections >= 1.0, "{}", flat(&envoy));
    // However late the ejection came on a loaded machine, every call after
    // it goes to the other backend.
    let mut after = Vec::new();
    for n in 200..220 {
        let r = post_json(&url, &body(n), &[]).await.expect("call");
        after.push(r.header("x-llm-cluster").map(str::to_string));
    }
    assert!(
        after.iter().all(|c| c.as_deref() == Some(PROVIDER)),
        "after the ejection every call goes to {PROVIDER}: {after:?}"
    );
    assert_eq!(
        envoy.metric(
            "llm_filter_routing_weight_milli",
            &[("model", MODEL), ("llm_cluster", IN_MESH)]
        ),
        0.0,
        "{}",
        flat(&envoy)
    );
}

/// The filter's series, for messages.
fn flat(envoy: &llm_filter_e2e::Envoy) -> String {
    envoy
        .prometheus()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("llm_filter") && !l.contains("_bucket"))
        .collect::<Vec<_>>()
        .join("\n")
}
