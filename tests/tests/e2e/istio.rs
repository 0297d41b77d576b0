//! The Istio manifests of `examples/istio/` in the config a proxy really
//! runs: every EnvoyFilter patch applied to Istio's layout of the outbound
//! listener, routes and clusters (sidecar: `0.0.0.0_80`, route configuration `80`;
//! egress gateway: `0.0.0.0_8080`, `http.8080`;
//! virtual host `api.openai.com:80`, `outbound|80||api.openai.com`) with the
//! bootstrap override merged in, validated by Envoy as istiod sends it and as
//! Envoy runs it; then run, in a sidecar's layout and in the egress gateway's,
//! with the provider's cluster and a second one standing in as mocks, so a
//! call the filter routes by an Istio cluster name reaches that cluster
//! through the route the example adds.

use std::time::Duration;

use llm_filter_e2e::istio::{
    cluster_name, example_manifests, mesh_stats_tags, Discovery, Proxy, Role, Service, Upstream,
};
use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, stats_tag_rules, temp_dir, validate_config,
    wasm_path, workspace_root, EnvoyBuilder, MockConfig, MockUpstream, RecordedRequest,
};
use serde_json::{json, Value};

const PROVIDER: &str = "api.openai.com";
/// A second external service of the mesh, where the test's routing sends a model.
const SECOND: &str = "llm.example.com";

/// The chat calls a mock received (the filter's health probes left out).
fn chats(mock: &MockUpstream) -> Vec<RecordedRequest> {
    mock.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/chat/completions")
        .collect()
}

/// The proxy of `role` with every manifest of examples/istio applied.
fn proxy(role: Role, services: &[Service], discovery: Discovery) -> Proxy {
    let mut proxy = Proxy::new(role, services, discovery);
    // envoyfilter-ecds.yaml and routes.yaml reach every sidecar of their
    // namespace: a namespace of shard sidecars (mesh-cache.yaml) runs
    // without them (docs/deploy/istio.md). egress-keyless.yaml is the
    // gateway's other form, in place of egress-gateway.yaml; its mTLS server
    // and cluster patch are not laid out here: the real istiod and Istio's
    // agent run it (e2e `istiod::keyless`). egress-sidecars.yaml is the
    // sidecar's form in front of it, in place of envoyfilter-ecds.yaml (the
    // sidecar build; e2e `istiod::topology`).
    let left_out: &[&str] = match role {
        Role::ShardSidecar => &["envoyfilter-ecds.yaml", "routes.yaml"],
        Role::EgressGateway => &["egress-keyless.yaml"],
        Role::Sidecar => &["egress-sidecars.yaml"],
    };
    for (file, doc) in example_manifests()
        .expect("read examples/istio")
        .into_iter()
        .filter(|(file, _)| !left_out.contains(&file.as_str()))
    {
        proxy
            .apply_manifest(&doc)
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
    }
    proxy
}

/// The config istiod would send a proxy of `role` calling the provider
/// (`discovery`: by ECDS, or with the filter inlined as Envoy runs it), the
/// module fetched as Istio's agent does; one EXTENSION_CONFIG must apply.
fn patched_layout(role: Role, discovery: Discovery) -> String {
    let mut proxy = proxy(
        role,
        &[Service::new(PROVIDER, Upstream::Tls { port: 443 })],
        discovery,
    );
    assert_eq!(
        proxy.extension_configs.len(),
        1,
        "{role:?}: one EXTENSION_CONFIG of examples/istio applies"
    );
    proxy
        .fetch_remote_code(&wasm_path())
        .expect("the agent's fetch");
    if discovery == Discovery::Inline {
        proxy.inline_extension_configs().expect("inline");
    }
    proxy.to_yaml()
}

#[test]
fn every_patch_validates_in_istios_layouts() {
    if skip_without_envoy("every_patch_validates_in_istios_layouts") {
        return;
    }
    let cases = [Role::Sidecar, Role::EgressGateway]
        .into_iter()
        .flat_map(|role| [(role, Discovery::Ads), (role, Discovery::Inline)]);
    for (role, discovery) in cases {
        let yaml = patched_layout(role, discovery);
        for want in [
            "\"cluster_header\": \"x-llm-cluster\"",
            "\"allow_on_headers_stop_iteration\": true",
            "\"include_attempt_count_in_response\": true",
            "\"tag_name\": \"priority\"",
        ] {
            let present = yaml.contains(want);
            // The filter's own config is only in the listener once inlined.
            let expected = discovery == Discovery::Inline || !want.contains("allow_on");
            assert_eq!(
                present, expected,
                "{role:?} {discovery:?}: {want} in\n{yaml}"
            );
        }
        validate_config(&yaml).unwrap_or_else(|e| panic!("{role:?} {discovery:?}: {e:#}\n{yaml}"));
    }
}

#[test]
fn the_shard_sidecar_validates_in_istios_layout() {
    if skip_without_envoy("the_shard_sidecar_validates_in_istios_layout") {
        return;
    }
    for discovery in [Discovery::Ads, Discovery::Inline] {
        // One EXTENSION_CONFIG (mesh-cache.yaml) for a `llm-filter: shard` sidecar.
        let yaml = patched_layout(Role::ShardSidecar, discovery);
        assert!(!yaml.contains("cluster_header"), "no routing in a shard");
        assert_eq!(
            yaml.contains(r#"\"mode\": \"shard\""#),
            discovery == Discovery::Inline,
            "{yaml}"
        );
        validate_config(&yaml).unwrap_or_else(|e| panic!("{discovery:?}: {e:#}\n{yaml}"));
    }
}

/// The mesh-scale cache as the examples deploy it: a `llm-filter: shard`
/// sidecar (mesh-cache.yaml) whose provider calls go to the egress gateway
/// (egress-gateway.yaml, the filter in `local` mode), which sends them to the
/// provider. The key the sidecar writes is the one the gateway computes; the
/// gateway's `x-cache` reaches the application; the provider never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_sidecar_keys_calls_for_the_egress_gateways_cache() {
    if skip_without_envoy("a_shard_sidecar_keys_calls_for_the_egress_gateways_cache") {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let gateway = run(
        Role::EgressGateway,
        Upstream::Loopback {
            port: provider.port(),
        },
    );
    let sidecar = run(
        Role::ShardSidecar,
        Upstream::Loopback {
            port: gateway.port(),
        },
    );
    let body = json!({
        "model": "gpt-4o-mini", "temperature": 0,
        "messages": [{"role": "user", "content": "cached for the mesh"}]
    });
    let headers = [
        ("host", PROVIDER),
        ("authorization", "Bearer app-1"),
        ("x-llm-cache-key", "forged"),
    ];
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = post_json(&sidecar.url("/v1/chat/completions"), &body, &headers)
            .await
            .expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        seen.push(r.header("x-cache").unwrap_or("<none>").to_string());
    }
    assert_eq!(seen, ["MISS", "HIT", "HIT"]);
    let calls = chats(&provider);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].header("x-llm-cache-key"), None);
    let shard = |envoy: &llm_filter_e2e::Envoy, result: &str, n: u64| {
        envoy.wait_for_stat(
            &format!("wasmcustom.llm_filter_cache_shard_keys_totalresult=.={result};.;"),
            n,
            Duration::from_secs(5),
        )
    };
    assert_eq!(shard(&sidecar, "written", 3), 3);
    assert_eq!(shard(&gateway, "matched", 3), 3);
    assert_eq!(shard(&gateway, "mismatched", 0), 0);
}

/// An Envoy in `role`'s Istio layout with the examples applied as they are,
/// the provider's cluster sent to `upstream`.
fn run(role: Role, upstream: Upstream) -> llm_filter_e2e::Envoy {
    let mut config = proxy(role, &[Service::new(PROVIDER, upstream)], Discovery::Ads);
    config
        .fetch_remote_code(&wasm_path())
        .expect("the agent's fetch");
    let dir = temp_dir().expect("temp dir");
    config.discover_from_files(dir.path()).expect("ECDS files");
    config
        .config
        .as_object_mut()
        .map(|c| c.remove("dynamic_resources"));
    EnvoyBuilder::new()
        .start_config_in(dir, &config.to_yaml())
        .unwrap_or_else(|e| panic!("{role:?}: {e:#}"))
}

#[test]
fn the_mesh_configs_extra_stat_tags_give_the_demo_rules() {
    let demo = stats_tag_rules(
        &std::fs::read_to_string(workspace_root().join("envoy/envoy.yaml")).expect("envoy.yaml"),
    );
    let meshes: Vec<Value> = example_manifests()
        .expect("read examples/istio")
        .into_iter()
        .filter(|(_, doc)| doc["kind"] == "IstioOperator")
        .map(|(_, doc)| doc)
        .collect();
    assert_eq!(meshes.len(), 1, "one mesh config overlay");
    assert_eq!(
        mesh_stats_tags(&meshes[0]).expect("its extraStatTags"),
        demo,
        "the rules Istio writes for examples/istio/stats-tags.yaml differ from envoy/envoy.yaml's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_call_reaches_the_istio_cluster_it_names_in_a_sidecar() {
    if skip_without_envoy("a_routed_call_reaches_the_istio_cluster_it_names_in_a_sidecar") {
        return;
    }
    routed_call_through(Role::Sidecar).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_call_reaches_the_istio_cluster_it_names_in_the_egress_gateway() {
    if skip_without_envoy("a_routed_call_reaches_the_istio_cluster_it_names_in_the_egress_gateway")
    {
        return;
    }
    routed_call_through(Role::EgressGateway).await;
}

/// The examples' patches for `role`, run: a call the filter routes to the
/// second service by its Istio cluster name goes there through the example's
/// route; a call it does not route takes Istio's own route to the provider.
async fn routed_call_through(role: Role) {
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let second = MockUpstream::start(MockConfig::named("second"));
    let mut envoy_config = proxy(
        role,
        &[
            Service::new(
                PROVIDER,
                Upstream::Loopback {
                    port: provider.port(),
                },
            ),
            Service::new(
                SECOND,
                Upstream::Loopback {
                    port: second.port(),
                },
            ),
        ],
        Discovery::Ads,
    );
    envoy_config
        .fetch_remote_code(&wasm_path())
        .expect("the agent's fetch");
    // The example's config, but `gpt-4o` served by the second service, which
    // Istio's own route for api.openai.com never reaches.
    envoy_config.set_plugin_config(&json!({
        "tracing": {"mode": "off"},
        "cache": {"max_entries": 256, "max_entry_bytes": 65536},
        "routing": {"models": {"gpt-4o": [{"cluster": cluster_name(SECOND), "weight": 1}]}}
    }));
    let dir = temp_dir().expect("temp dir");
    envoy_config
        .discover_from_files(dir.path())
        .expect("ECDS files");
    envoy_config
        .config
        .as_object_mut()
        .map(|c| c.remove("dynamic_resources"));
    let envoy = EnvoyBuilder::new()
        .start_config_in(dir, &envoy_config.to_yaml())
        .expect("Envoy with the Istio-shaped config");
    let host = [("host", PROVIDER)];

    // Routed: the filter names `outbound|80||llm.example.com`, the example's
    // route sends the call there.
    let routed = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "routed in the mesh"),
        &host,
    )
    .await
    .expect("routed call");
    assert_eq!(routed.status, 200, "{}", routed.text());
    assert_eq!(
        routed.header("x-llm-cluster"),
        Some(cluster_name(SECOND).as_str())
    );
    assert_eq!(routed.json()["model"], "gpt-4o", "{}", routed.text());
    // (The filter's health probes reach both services too: count the calls.)
    let calls = chats(&second);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let got = &calls[0];
    assert_eq!(
        got.header("x-llm-cluster"),
        Some(cluster_name(SECOND).as_str())
    );
    assert_eq!(got.header("x-request-priority"), Some("P1"));
    assert_eq!(
        got.json().expect("JSON body")["messages"][0]["content"],
        "routed in the mesh"
    );
    // Retries by the example's route: the attempt count comes back.
    assert_eq!(routed.header("x-envoy-attempt-count"), Some("1"));
    assert!(
        chats(&provider).is_empty(),
        "the provider got the routed call"
    );

    // Not routed (a model routing does not know): Istio's own route, to the provider.
    let plain = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o-mini", "istio's route"),
        &host,
    )
    .await
    .expect("plain call");
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(plain.header("x-llm-cluster"), None);
    let calls = chats(&provider);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let got = &calls[0];
    assert_eq!(got.header("x-llm-cluster"), None);
    assert_eq!(got.header("x-request-priority"), Some("P1"));
    assert_eq!(chats(&second).len(), 1);

    // The filter's metrics reach Istio's Prometheus output with their labels.
    let calls = envoy.wait_for_metric(
        "llm_filter_requests_total",
        &[("model", "gpt-4o"), ("outcome", "success")],
        1.0,
        Duration::from_secs(10),
    );
    assert_eq!(
        calls,
        1.0,
        "{:?}",
        envoy.stats_matching("llm_filter_requests")
    );
}
