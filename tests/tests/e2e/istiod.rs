//! The manifests of `examples/istio/` through a real istiod (built from
//! Istio's source by `make tools-istiod`, run in file mode without
//! Kubernetes): the config it generates for a sidecar of `my-app` and for the
//! egress gateway, read back from Envoy's config dump and istiod's
//! `/debug/syncz`, then run with real calls. The placeholders are filled as a
//! user would, with two differences a test without Istio's agent needs: the
//! module is served over plain HTTP from the test and Envoy's own remote data
//! source fetches it (checking the `sha256`), where the agent would pull the
//! `oci://` image and hand Envoy a local file; and the provider is the mock on
//! loopback (its ServiceEntry `STATIC` at 127.0.0.1, no TLS origination: that
//! needs the agent's SDS for the CA bundle). Each node's `stats_config` is
//! the one Istio's agent would write for it from the same mesh config, with
//! stats-tags.yaml's `extraStatTags` (Istio's own bootstrap code,
//! tests/istio-bootstrap): no bootstrap override.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use llm_filter_core::metrics::{self, CACHE_LOOKUPS, REQUESTS, ROUTING_CALLS};
use llm_filter_e2e::istio::{example_manifests, extra_stat_tags, read_manifests, EXAMPLES};
use llm_filter_e2e::istiod::{
    agent_bootstrap, skip_without_istiod, synced, FileServer, Istiod, Node, PortLock,
};
use llm_filter_e2e::mock::HEADER_DELAY_MS;
use llm_filter_e2e::{
    chat_body, chat_stream_body, post_json, sidecar_wasm_path, stats_tag_rules, stream_sse,
    temp_dir, wasm_path, with_field, workspace_root, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
    RecordedRequest,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

mod agent;
mod keyless;
mod topology;

const PROVIDER: &str = "api.openai.com";
const PROVIDER_CLUSTER: &str = "outbound|80||api.openai.com";
/// The egress gateway's service account, as Istio's gateway chart names it.
const GATEWAY_SERVICE_ACCOUNT: &str = "istio-egressgateway-service-account";
/// Where the test serves the module from, as a ServiceEntry of the mesh.
const MODULES: &str = "modules.example.com";
const MODULES_CLUSTER: &str = "outbound|80||modules.example.com";

/// The names and positions istiod gave the examples' patches, as the README
/// and docs/deploy/istio.md state them.
struct Layout {
    /// The node's outbound HTTP listener for the provider.
    listener: &'static str,
    listener_port: u16,
    route_config: &'static str,
    vhost: &'static str,
    /// The filter's ECDS resource (and HTTP filter) name.
    filter: &'static str,
}

impl Layout {
    /// The chat endpoint at the node's outbound listener, as the test calls it.
    fn chat_url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/v1/chat/completions",
            self.listener_port
        )
    }
}

const SIDECAR: Layout = Layout {
    listener: "127.0.0.1_80",
    listener_port: 80,
    route_config: "80",
    vhost: "api.openai.com:80",
    filter: "my-app.llm-filter",
};

const GATEWAY: Layout = Layout {
    listener: "0.0.0.0_8080",
    listener_port: 8080,
    route_config: "http.8080",
    vhost: "api.openai.com:80",
    filter: "istio-system.llm-filter",
};

/// A sidecar as Kubernetes runs it (iptables): the outbound listener of port
/// 80 is not bound, the traffic reaches it through `virtualOutbound`.
const SIDECAR_IPTABLES: Layout = Layout {
    listener: "0.0.0.0_80",
    ..SIDECAR
};

/// wasmplugin.yaml's filter on the sidecar: Istio's name for a translated
/// WasmPlugin's ECDS resource.
const WASMPLUGIN_SIDECAR: Layout = Layout {
    filter: "extensions.istio.io/trafficextension/my-app.llm-filter~istio-translated-wasmplugin",
    ..SIDECAR
};

/// The shard sidecar of mesh-cache.yaml in front of the gateway.
const SHARD_SIDECAR: Layout = Layout {
    listener: "127.0.0.1_80",
    listener_port: 80,
    route_config: "80",
    vhost: "api.openai.com:80",
    filter: "my-app.llm-filter-shard",
};

/// The module, served to Envoy, and its sha256 as the manifests carry it.
struct Module {
    server: FileServer,
    sha256: String,
}

fn module() -> Module {
    module_at(&wasm_path())
}

/// The sidecar build, served as [`module`] serves the full one.
fn sidecar_module() -> Module {
    module_at(&sidecar_wasm_path())
}

fn module_at(path: &std::path::Path) -> Module {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("{} (make build): {e}", path.display()));
    let sha256 = hex(&Sha256::digest(&bytes));
    Module {
        server: FileServer::start(bytes).expect("module server"),
        sha256,
    }
}

/// The module a WasmPlugin's `url` names: the sidecar build for a
/// `-sidecar` image, else the full one; with its sha256.
fn module_of_url(url: &str, module: &Module) -> (PathBuf, String) {
    if !url.ends_with("-sidecar") {
        return (wasm_path(), module.sha256.clone());
    }
    let path = sidecar_wasm_path();
    let bytes = std::fs::read(&path).expect("the sidecar module (make build)");
    (path, hex(&Sha256::digest(&bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A shipped manifest with its placeholders filled: the filter's remote
/// code from the test's module server, its sha256; the provider at the mock.
fn filled(file: &str, module: &Module, provider_port: u16) -> String {
    let path = workspace_root().join(EXAMPLES).join(file);
    let docs: Vec<Value> = read_manifests(&path)
        .unwrap_or_else(|e| panic!("{file}: {e:#}"))
        .into_iter()
        .map(|mut doc| {
            fill_remote_code(&mut doc, module);
            if file == "provider.yaml" {
                provider_at_loopback(&mut doc, provider_port);
            }
            if doc["kind"] == "WasmPlugin" {
                // istiod hands Envoy a local file for `file://` (an `oci://`
                // image is the agent's to pull).
                let url = doc["spec"]["url"].as_str().unwrap_or_default();
                let (path, sha256) = module_of_url(url, module);
                doc["spec"]["url"] = json!(format!("file://{}", path.display()));
                doc["spec"]["sha256"] = json!(sha256);
            }
            doc
        })
        .collect();
    yaml_docs(&docs)
}

/// The documents for istiod's file store, each as JSON (which is YAML):
/// YAML written back by serde_yaml leaves `off` unquoted, which istiod's
/// YAML 1.1 reader takes for `false`.
fn yaml_docs(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| format!("{d:#}\n"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// `oci://REGISTRY/...` and `IMAGE_SHA256` of every EXTENSION_CONFIG: the
/// module over HTTP from [`MODULES`] (Envoy's remote data source names the
/// cluster to fetch it through), the module's own sha256.
fn fill_remote_code(doc: &mut Value, module: &Module) {
    let Some(patches) = doc
        .pointer_mut("/spec/configPatches")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for patch in patches {
        if let Some(remote) =
            patch.pointer_mut("/patch/value/typed_config/config/vm_config/code/remote")
        {
            assert_eq!(remote["sha256"], "IMAGE_SHA256", "{remote}");
            assert!(remote["http_uri"]["uri"]
                .as_str()
                .is_some_and(|u| u.starts_with("oci://REGISTRY/")));
            remote["sha256"] = json!(module.sha256);
            remote["http_uri"]["uri"] = json!(format!("http://{MODULES}/llm-filter.wasm"));
            remote["http_uri"]["cluster"] = json!(MODULES_CLUSTER);
            // The first fetch may precede the cluster's endpoints: retry
            // soon rather than at Envoy's default back-off.
            remote["retry_policy"] = json!({"retry_back_off": {"base_interval": "0.2s", "max_interval": "0.5s"}, "num_retries": 20});
        }
    }
}

/// provider.yaml's ServiceEntry resolved to the mock on 127.0.0.1 and its
/// DestinationRule without the TLS origination (the rest as shipped).
fn provider_at_loopback(doc: &mut Value, port: u16) {
    match doc["kind"].as_str() {
        Some("ServiceEntry") => {
            doc["spec"]["resolution"] = json!("STATIC");
            doc["spec"]["endpoints"] = json!([{"address": "127.0.0.1", "ports": {"http": port}}]);
        }
        Some("DestinationRule") => {
            if let Some(p) = doc["spec"]["trafficPolicy"].as_object_mut() {
                p.remove("portLevelSettings");
            }
        }
        _ => {}
    }
}

/// istiod in file mode on the shipped `files`, filled by [`filled`], with
/// the test mesh's [`overlay`] (the gateway's service and workload when
/// `gateway`).
fn istiod_with(
    bin: &std::path::Path,
    files: &[&str],
    module: &Module,
    provider: &MockUpstream,
    gateway: bool,
) -> Istiod {
    let mut config: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.to_string(), filled(f, module, provider.port())))
        .collect();
    config.push((
        "test-mesh.yaml".into(),
        overlay(module.server.port(), gateway),
    ));
    Istiod::start(bin, &config, &mesh()).expect("istiod")
}

/// What a test mesh adds to the examples: the module server as an external
/// service, mTLS off (no certificates without the agent), and for the
/// gateway the service that selects it (port 80 to 8080, 443 to 8443, as
/// Istio's istio-egressgateway Service) and its workload, of the gateway's
/// service account [`GATEWAY_SERVICE_ACCOUNT`].
fn overlay(modules_port: u16, gateway: bool) -> String {
    let mut docs = vec![
        json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "modules", "namespace": "istio-system"},
            "spec": {"hosts": [MODULES], "location": "MESH_EXTERNAL", "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "endpoints": [{"address": "127.0.0.1", "ports": {"http": modules_port}}]}}),
        json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
            "metadata": {"name": "default", "namespace": "istio-system"},
            "spec": {"mtls": {"mode": "DISABLE"}}}),
    ];
    if gateway {
        let node = Node::egress_gateway();
        docs.push(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "istio-egressgateway", "namespace": "istio-system"},
            "spec": {"hosts": ["istio-egressgateway.istio-system.svc.cluster.local"],
                "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http2", "protocol": "HTTP2", "targetPort": 8080},
                    {"number": 443, "name": "https", "protocol": "HTTPS", "targetPort": 8443}],
                "workloadSelector": {"labels": {"istio": "egressgateway"}}}}),
        );
        docs.push(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": "istio-egressgateway-0", "namespace": "istio-system"},
            "spec": {"address": node.ip, "labels": node.labels,
                "serviceAccount": GATEWAY_SERVICE_ACCOUNT}}),
        );
    }
    yaml_docs(&docs)
}

/// The mesh config: no tracing or Istio-only telemetry filters (upstream
/// Envoy has none), the access-log provider access-log.yaml names; [`mesh`]
/// adds stats-tags.yaml's `defaultConfig`.
const MESH: &str = r#"rootNamespace: istio-system
enableTracing: false
enablePrometheusMerge: false
defaultProviders: {}
extensionProviders:
- name: llm-calls
  envoyFileAccessLog:
    path: /dev/stdout
    logFormat:
      labels:
        path: "%REQ(:PATH)%"
        response_code: "%RESPONSE_CODE%"
        llm: "%FILTER_STATE(wasm.llm_filter.call:PLAIN)%"
"#;

/// stats-tags.yaml's `extraStatTags`, the mesh-wide labels.
fn stat_tags() -> Vec<String> {
    example_manifests()
        .expect("examples")
        .into_iter()
        .find(|(_, d)| d["kind"] == "IstioOperator")
        .map(|(_, d)| extra_stat_tags(&d).expect("extraStatTags"))
        .expect("stats-tags.yaml's IstioOperator")
}

/// The test's mesh config with stats-tags.yaml's `defaultConfig` in it, as
/// `istioctl install -f stats-tags.yaml` merges it.
fn mesh() -> String {
    format!(
        "{MESH}defaultConfig:\n  extraStatTags: [{}]\n",
        stat_tags().join(", ")
    )
}

/// The `stats_config` Istio's agent writes for `node` from [`mesh`].
fn agent_stats_config(node: &Node) -> Value {
    let bootstrap = agent_bootstrap(&mesh(), node).expect("the agent's bootstrap");
    bootstrap["stats_config"].clone()
}

fn start_node(node: &Node, istiod: &Istiod) -> Envoy {
    start_node_with(node, istiod, &json!({}))
}

/// [`start_node`] with `extra` merged into the bootstrap (what a
/// `sidecar.istio.io/bootstrapOverride` ConfigMap adds).
fn start_node_with(node: &Node, istiod: &Istiod, extra: &Value) -> Envoy {
    let bootstrap = node
        .bootstrap(istiod.grpc_port(), Some(&agent_stats_config(node)))
        .expect("bootstrap");
    let mut bootstrap: Value = serde_json::from_str(&bootstrap).expect("bootstrap JSON");
    llm_filter_e2e::istio::merge(&mut bootstrap, extra);
    let bootstrap = bootstrap.to_string();
    EnvoyBuilder::new()
        .start_config_in(temp_dir().expect("temp dir"), &bootstrap)
        .unwrap_or_else(|e| panic!("{}: {e:#}\n{}", node.id, istiod.log_tail(30)))
}

/// Envoy's config dump, EDS left out.
fn config_dump(envoy: &Envoy) -> Value {
    let (status, body) = envoy.admin_get("/config_dump").expect("config_dump");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("config_dump JSON")
}

fn section<'a>(dump: &'a Value, type_suffix: &str) -> &'a Value {
    dump["configs"]
        .as_array()
        .and_then(|c| {
            c.iter().find(|s| {
                s["@type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with(&format!(".{type_suffix}")))
            })
        })
        .unwrap_or_else(|| panic!("no {type_suffix} in the config dump"))
}

/// Waits until istiod shows `node` synced (every type ACKed) and Envoy has
/// the filter's ECDS resource with its module loaded; then returns the dump.
fn wait_synced(envoy: &Envoy, node: &Node, istiod: &Istiod, layout: &Layout) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sync = istiod
            .debug("/debug/syncz")
            .and_then(|s| synced(&s, node.proxy_id()));
        let dump = config_dump(envoy);
        let ecds_ok = dump["configs"].as_array().is_some_and(|c| {
            c.iter().any(|s| {
                s["ecds_filters"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|e| e["ecds_filter"]["name"] == layout.filter))
            })
        });
        let loaded = envoy
            .stat_opt("wasm.envoy.wasm.runtime.v8.active")
            .is_some_and(|n| n > 0);
        if sync.is_ok() && ecds_ok && loaded {
            return dump;
        }
        assert!(
            Instant::now() < deadline,
            "{}: not synced in 30 s: {sync:?}, ECDS {ecds_ok}, module loaded {loaded}\n{}\n--- istiod ---\n{}",
            node.id,
            envoy.log_tail(30),
            istiod.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// What istiod generated for `layout`, as Envoy holds it: nothing rejected;
/// the filter by discovery right before the router of the listener; its ECDS
/// resource with the remote code's sha256, fail-open and the body held; the
/// route patch first in the provider's virtual host. Returns the listener names.
fn assert_generated(dump: &Value, layout: &Layout, module: &Module, routes: bool) -> Vec<String> {
    let listeners = section(dump, "ListenersConfigDump")["dynamic_listeners"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for l in &listeners {
        assert!(l.get("error_state").is_none(), "rejected listener: {l}");
    }
    let names: Vec<String> = listeners
        .iter()
        .filter_map(|l| l["name"].as_str().map(str::to_string))
        .collect();
    let listener = listeners
        .iter()
        .find(|l| l["name"] == layout.listener)
        .unwrap_or_else(|| panic!("no listener {} in {names:?}", layout.listener));
    let active = &listener["active_state"]["listener"];
    assert_eq!(
        active["address"]["socket_address"]["port_value"],
        layout.listener_port
    );
    let chains = active["filter_chains"].as_array().expect("filter chains");
    let hcms: Vec<&Value> = chains
        .iter()
        .flat_map(|c| c["filters"].as_array().into_iter().flatten())
        .filter(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        .map(|f| &f["typed_config"])
        .collect();
    assert!(!hcms.is_empty(), "no HTTP connection manager in {active}");
    for hcm in hcms {
        let filters: Vec<&str> = hcm["http_filters"]
            .as_array()
            .expect("http filters")
            .iter()
            .filter_map(|f| f["name"].as_str())
            .collect();
        let at = filters
            .iter()
            .position(|f| *f == layout.filter)
            .unwrap_or_else(|| panic!("{}: no {} in {filters:?}", layout.listener, layout.filter));
        assert_eq!(
            filters.get(at + 1),
            Some(&"envoy.filters.http.router"),
            "{}: the filter right before the router: {filters:?}",
            layout.listener
        );
        assert_eq!(
            hcm["rds"]["route_config_name"], layout.route_config,
            "{hcm}"
        );
        let discovery = &hcm["http_filters"][at]["config_discovery"];
        assert!(discovery["config_source"]["ads"].is_object(), "{discovery}");
    }

    let ecds = section(dump, "EcdsConfigDump")["ecds_filters"]
        .as_array()
        .expect("ECDS filters")
        .iter()
        .map(|e| &e["ecds_filter"])
        .find(|e| e["name"] == layout.filter)
        .expect("the filter's ECDS resource")
        .clone();
    let config = &ecds["typed_config"]["config"];
    assert_eq!(config["allow_on_headers_stop_iteration"], true, "{config}");
    assert_eq!(config["fail_open"], true, "{config}");
    let remote = &config["vm_config"]["code"]["remote"];
    assert_eq!(remote["sha256"], module.sha256.as_str(), "{remote}");
    assert_eq!(remote["http_uri"]["cluster"], MODULES_CLUSTER, "{remote}");

    if routes {
        let routes_dump = section(dump, "RoutesConfigDump");
        let route_config = routes_dump["dynamic_route_configs"]
            .as_array()
            .unwrap_or_else(|| panic!("no dynamic route configs: {routes_dump}"))
            .iter()
            .map(|r| &r["route_config"])
            .find(|r| r["name"] == layout.route_config)
            .unwrap_or_else(|| panic!("no route configuration {}", layout.route_config))
            .clone();
        let vhost = route_config["virtual_hosts"]
            .as_array()
            .expect("virtual hosts")
            .iter()
            .find(|v| v["name"] == layout.vhost)
            .unwrap_or_else(|| panic!("no virtual host {} in {route_config}", layout.vhost))
            .clone();
        assert_eq!(vhost["include_attempt_count_in_response"], true, "{vhost}");
        let first = &vhost["routes"][0];
        assert_eq!(first["name"], "llm-filter-routed", "{vhost}");
        assert_eq!(first["route"]["cluster_header"], "x-llm-cluster", "{first}");
        assert_eq!(first["route"]["timeout"], "300s", "{first}");
        let retry = &first["route"]["retry_policy"];
        assert_eq!(
            retry["retry_back_off"]["base_interval"], "0.100s",
            "{retry}"
        );
        assert_eq!(retry["retry_back_off"]["max_interval"], "1s", "{retry}");
        assert_eq!(
            retry["rate_limited_retry_back_off"]["reset_headers"][0]["name"], "retry-after",
            "{retry}"
        );
        // Istio's own route stays, after it.
        let istio_route = &vhost["routes"][1];
        assert_eq!(istio_route["route"]["cluster"], PROVIDER_CLUSTER, "{vhost}");
    }
    names
}

/// The chat calls a mock received (the filter's health probes left out).
fn chats(mock: &MockUpstream) -> Vec<RecordedRequest> {
    mock.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/chat/completions")
        .collect()
}

fn cacheable(model: &str, content: &str) -> Value {
    with_field(chat_body(model, content), "temperature", json!(0))
}

/// Real calls through `url` (the provider's host): a cached HIT, a routed
/// call, an SSE stream; `routed` says whether the filter there routes.
async fn calls_through(url: &str, provider: &MockUpstream, tag: &str, routed: bool) {
    let host = [("host", PROVIDER)];
    let before = chats(provider).len();
    let body = cacheable("gpt-4o-mini", &format!("cached through the {tag}"));
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = post_json(url, &body, &host).await.expect("call");
        assert_eq!(r.status, 200, "{tag}: {}", r.text());
        seen.push(r.header("x-cache").unwrap_or("<none>").to_string());
    }
    assert_eq!(seen, ["MISS", "HIT"], "{tag}");
    assert_eq!(
        chats(provider).len(),
        before + 1,
        "{tag}: one provider call"
    );

    if routed {
        let r = post_json(
            url,
            &chat_body("gpt-4o", &format!("routed through the {tag}")),
            &host,
        )
        .await
        .expect("routed call");
        assert_eq!(r.status, 200, "{tag}: {}", r.text());
        assert_eq!(r.header("x-llm-cluster"), Some(PROVIDER_CLUSTER), "{tag}");
        // The virtual host's MERGE: the attempt count comes back.
        assert_eq!(r.header("x-envoy-attempt-count"), Some("1"), "{tag}");
        let got = chats(provider).pop().expect("the routed call");
        assert_eq!(got.header("x-llm-cluster"), Some(PROVIDER_CLUSTER));
        assert_eq!(
            got.json().expect("JSON")["messages"][0]["content"],
            format!("routed through the {tag}")
        );
    }

    let stream = chat_stream_body("gpt-4o-mini", &format!("streamed through the {tag}"), true);
    let sse = stream_sse(url, &with_field(stream, "temperature", json!(0)), &host)
        .await
        .expect("stream");
    assert_eq!(sse.status, 200, "{tag}");
    assert_eq!(
        sse.header("content-type"),
        Some("text/event-stream"),
        "{tag}"
    );
    assert_eq!(sse.header("x-cache"), Some("MISS"), "{tag}");
    assert!(sse.done(), "{tag}: ends with [DONE]: {:?}", sse.events);
    assert!(
        sse.content()
            .contains(&format!("streamed through the {tag}")),
        "{tag}: {}",
        sse.content()
    );
}

/// `envoy`'s metrics labelled by the `stats_config` Istio's agent wrote for
/// `node` from stats-tags.yaml's `extraStatTags` alone: its rules for the
/// filter's labels are envoy/envoy.yaml's, its stats inclusion list is
/// Istio's default, and /stats/prometheus shows the filter's metrics by their
/// names, with their labels, after the calls of [`calls_through`].
fn assert_labelled_the_istio_way(envoy: &Envoy, node: &Node) {
    let stats = agent_stats_config(node);
    let written: Vec<(String, String)> = stats["stats_tags"]
        .as_array()
        .expect("stats_tags")
        .iter()
        .filter_map(|t| Some((t["tag_name"].as_str()?.into(), t["regex"].as_str()?.into())))
        .collect();
    let demo = stats_tag_rules(
        &std::fs::read_to_string(workspace_root().join("envoy/envoy.yaml")).expect("envoy.yaml"),
    );
    for rule in &demo {
        assert!(
            written.contains(rule),
            "{rule:?} not in the agent's {written:?}"
        );
    }
    let matcher = stats["stats_matcher"].to_string();
    assert!(
        !matcher.contains("wasmcustom") && matcher.contains(r#"{"prefix":"wasm"}"#),
        "Istio's default inclusion list: {matcher}"
    );

    let model = [
        ("model", "gpt-4o-mini"),
        ("outcome", "success"),
        ("api", "chat"),
    ];
    let calls = envoy.wait_for_metric(REQUESTS, &model, 3.0, Duration::from_secs(5));
    assert!(calls >= 3.0, "{REQUESTS}{model:?}: {calls}");
    let hits = envoy.metric(CACHE_LOOKUPS, &[("result", "hit")]);
    assert!(hits >= 1.0, "{CACHE_LOOKUPS} hit: {hits}");
    let routed = envoy.metric(
        ROUTING_CALLS,
        &[("llm_cluster", PROVIDER_CLUSTER), ("outcome", "success")],
    );
    assert!(routed >= 1.0, "{ROUTING_CALLS}: {routed}");
    // Every sample of the filter's is one of its metrics by name: no label
    // left in a name.
    let samples = envoy.metrics();
    let mut names: Vec<&str> = samples
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| n.starts_with("llm_filter_") || n.starts_with("gen_ai_"))
        .collect();
    names.dedup();
    assert!(names.len() > 5, "{names:?}");
    for name in names {
        let metric = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|m| metrics::ALL.contains(m)))
            .unwrap_or(name);
        assert!(
            metrics::ALL.contains(&metric),
            "{name}: not a metric of the filter's"
        );
    }
    // Istio's default rules that are not anchored take nothing from a value
    // (the call of model `team.cache.v2`, a cluster's host name).
    for sample in samples.iter().filter(|s| s.name.starts_with("llm_filter_")) {
        for istio_default in ["cache", "component", "tag", "wasm_filter"] {
            assert!(
                !sample.labels.contains_key(istio_default),
                "{} {:?}",
                sample.name,
                sample.labels
            );
        }
    }
    let dotted = [("model", "team.cache_v2"), ("outcome", "success")];
    assert!(
        envoy.metric(REQUESTS, &dotted) >= 1.0,
        "{REQUESTS}{dotted:?}"
    );
}

/// Sidecars of a namespace (docs/deploy/istio.md, "every feature"):
/// provider.yaml, envoyfilter-ecds.yaml, routes.yaml and access-log.yaml
/// through istiod, stats-tags.yaml in the mesh config, a
/// sidecar of `my-app`; its metrics labelled by what Istio's agent wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_configures_a_sidecar_with_the_examples() {
    let Some(bin) = skip_without_istiod("istiod_configures_a_sidecar_with_the_examples") else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let module = module();
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let istiod = istiod_with(
        &bin,
        &[
            "provider.yaml",
            "envoyfilter-ecds.yaml",
            "routes.yaml",
            "access-log.yaml",
        ],
        &module,
        &provider,
        false,
    );

    let node = Node::sidecar();
    let envoy = start_node(&node, &istiod);
    let dump = wait_synced(&envoy, &node, &istiod, &SIDECAR);
    let listeners = assert_generated(&dump, &SIDECAR, &module, true);
    eprintln!("sidecar listeners: {listeners:?}");
    assert!(module.server.hits() >= 1, "Envoy fetched the module");

    // The same sidecar with iptables interception, as in a pod: the names
    // the README gives.
    let mut pod = Node::sidecar();
    pod.id = "sidecar~127.0.0.4~app-1.my-app~my-app.svc.cluster.local".into();
    pod.ip = "127.0.0.4".into();
    pod.interception = None;
    let pod_envoy = start_node(&pod, &istiod);
    let pod_dump = wait_synced(&pod_envoy, &pod, &istiod, &SIDECAR_IPTABLES);
    let pod_listeners = assert_generated(&pod_dump, &SIDECAR_IPTABLES, &module, true);
    eprintln!("pod sidecar listeners: {pod_listeners:?}");
    drop(pod_envoy);

    let url = SIDECAR.chat_url();
    calls_through(&url, &provider, "sidecar", true).await;
    let r = post_json(
        &url,
        &chat_body("team.cache.v2", "a dotted model"),
        &[("host", PROVIDER)],
    )
    .await
    .expect("call");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_labelled_the_istio_way(&envoy, &node);
    // access-log.yaml's Telemetry: the call's record in the access log.
    let deadline = Instant::now() + Duration::from_secs(5);
    // Istio's JSON log format carries the record as a string (of JSON).
    let record = "\"llm\":\"{\\\"api\\\":\\\"chat\\\"";
    while !envoy.log_contents().contains(record) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        envoy.log_contents().contains(record),
        "{}",
        envoy.log_tail(20)
    );
    istiod
        .settled(node.proxy_id())
        .expect("no NACK after the calls");
}

/// wasmplugin.yaml through istiod: the WasmPlugin form, header features
/// only, on the labelled sidecars of `my-app`. From Istio 1.30 the
/// Kubernetes config store alone registers the WasmPlugin → TrafficExtension
/// translation; the file-mode build wires the same controller over the files
/// (scripts/istiod-file-mode.patch), so this is the translation a cluster's
/// istiod runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_translates_the_wasmplugin_for_the_labelled_sidecars() {
    let Some(bin) =
        skip_without_istiod("istiod_translates_the_wasmplugin_for_the_labelled_sidecars")
    else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let module = module();
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let istiod = istiod_with(
        &bin,
        &["provider.yaml", "wasmplugin.yaml"],
        &module,
        &provider,
        false,
    );

    let node = Node::sidecar();
    let envoy = start_node(&node, &istiod);
    let dump = wait_synced(&envoy, &node, &istiod, &WASMPLUGIN_SIDECAR);
    assert_before_the_router(&dump, &WASMPLUGIN_SIDECAR);

    let ecds = section(&dump, "EcdsConfigDump")["ecds_filters"]
        .as_array()
        .expect("ECDS filters")
        .iter()
        .map(|e| &e["ecds_filter"])
        .find(|e| e["name"] == WASMPLUGIN_SIDECAR.filter)
        .expect("the WasmPlugin's ECDS resource")
        .clone();
    let wasm = &ecds["typed_config"]["config"];
    // wasmplugin.yaml names the sidecar build's image.
    assert_eq!(
        wasm["vm_config"]["code"]["local"]["filename"],
        sidecar_wasm_path().display().to_string(),
        "{wasm}"
    );
    assert_eq!(wasm["failure_policy"], "FAIL_OPEN", "failStrategy: {wasm}");
    assert!(
        wasm.get("allow_on_headers_stop_iteration").is_none(),
        "no WasmPlugin field carries it: {wasm}"
    );
    let plugin_config: Value = serde_json::from_str(
        wasm["configuration"]["value"]
            .as_str()
            .unwrap_or_else(|| panic!("pluginConfig as a string: {wasm}")),
    )
    .expect("pluginConfig JSON");
    assert_eq!(
        plugin_config["priority"]["default"], "P1",
        "{plugin_config}"
    );

    // Header features: the caller's priority in baggage and Envoy's timeout
    // from its budget reach the provider; the body-based ones are off, and
    // say so.
    let url = WASMPLUGIN_SIDECAR.chat_url();
    let host = [
        ("host", PROVIDER),
        ("x-request-priority", "P0"),
        ("x-request-timeout-ms", "20000"),
    ];
    let body = cacheable("gpt-4o-mini", "through the WasmPlugin");
    for _ in 0..2 {
        let r = post_json(&url, &body, &host).await.expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        // The sidecar build keeps no cache: no x-cache of its own.
        assert_eq!(r.header("x-cache"), None, "no cache in the sidecar build");
    }
    let got = chats(&provider);
    assert_eq!(got.len(), 2, "both calls reached the provider");
    for call in &got {
        assert!(
            call.header("baggage")
                .is_some_and(|b| b.contains("priority=P0")),
            "{:?}",
            call.headers
        );
        assert_eq!(
            call.json().expect("JSON")["messages"][0]["content"],
            "through the WasmPlugin"
        );
    }
    // A budget of 1 s against a provider that answers in 3: Envoy's timeout
    // from the filter ends the call.
    let started = Instant::now();
    let slow = [
        ("host", PROVIDER),
        ("x-request-timeout-ms", "1000"),
        (HEADER_DELAY_MS, "3000"),
    ];
    let r = post_json(&url, &body, &slow).await.expect("slow call");
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(took < Duration::from_millis(2500), "{took:?}");
    let not_delivered = envoy.wait_for_metric(
        metrics::INTERNAL_ERRORS,
        &[("reason", "body_not_delivered")],
        1.0,
        Duration::from_secs(5),
    );
    assert!(not_delivered >= 1.0, "body_not_delivered: {not_delivered}");

    // A sidecar of my-app without the selector's label gets nothing.
    let plain = Node {
        id: "sidecar~127.0.0.5~other-0.my-app~my-app.svc.cluster.local".into(),
        namespace: "my-app".into(),
        labels: json!({"app": "other"}),
        ip: "127.0.0.5".into(),
        interception: None,
    };
    let other = start_node(&plain, &istiod);
    assert_without_the_filter(&other, &plain, &istiod);
    for n in [&node, &plain] {
        istiod.settled(n.proxy_id()).expect("no NACK");
    }
}

/// The egress gateway (egress-gateway.yaml) with the shard sidecars in front
/// (mesh-cache.yaml): provider.yaml, egress-gateway.yaml and mesh-cache.yaml
/// through istiod (stats-tags.yaml in the mesh config), the gateway node and
/// a `llm-filter: shard` sidecar of `my-app`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_configures_the_egress_gateway_with_the_examples() {
    let Some(bin) = skip_without_istiod("istiod_configures_the_egress_gateway_with_the_examples")
    else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let module = module();
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let istiod = istiod_with(
        &bin,
        &["provider.yaml", "egress-gateway.yaml", "mesh-cache.yaml"],
        &module,
        &provider,
        true,
    );

    let gateway_node = Node::egress_gateway();
    let gateway = start_node(&gateway_node, &istiod);
    let dump = wait_synced(&gateway, &gateway_node, &istiod, &GATEWAY);
    let listeners = assert_generated(&dump, &GATEWAY, &module, true);
    eprintln!("gateway listeners: {listeners:?}");

    let gateway_url = GATEWAY.chat_url();
    calls_through(&gateway_url, &provider, "gateway", true).await;

    // A shard sidecar: its calls to the provider go to the gateway (the
    // VirtualService for `mesh`), hashed on the key it writes.
    let mut shard_node = Node::sidecar();
    shard_node.labels = json!({"app": "my-app", "llm-filter": "shard"});
    let shard = start_node(&shard_node, &istiod);
    let dump = wait_synced(&shard, &shard_node, &istiod, &SHARD_SIDECAR);
    assert_generated(&dump, &SHARD_SIDECAR, &module, false);
    let before = chats(&provider).len();
    let body = cacheable("gpt-4o-mini", "cached for the mesh");
    let url = SHARD_SIDECAR.chat_url();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = post_json(
            &url,
            &body,
            &[("host", PROVIDER), ("x-llm-cache-key", "forged")],
        )
        .await
        .expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        seen.push(r.header("x-cache").unwrap_or("<none>").to_string());
    }
    assert_eq!(
        seen,
        ["MISS", "HIT", "HIT"],
        "the gateway's cache, through the sidecar"
    );
    let calls = chats(&provider);
    assert_eq!(calls.len(), before + 1, "{calls:?}");
    assert_eq!(calls.last().and_then(|c| c.header("x-llm-cache-key")), None);
    let written = shard.wait_for_stat(
        "wasmcustom.llm_filter_cache_shard_keys_totalresult=.=written;.;",
        3,
        Duration::from_secs(5),
    );
    assert_eq!(written, 3);
    let matched = gateway.wait_for_stat(
        "wasmcustom.llm_filter_cache_shard_keys_totalresult=.=matched;.;",
        3,
        Duration::from_secs(5),
    );
    assert_eq!(matched, 3);
    for node in [&gateway_node, &shard_node] {
        istiod
            .settled(node.proxy_id())
            .expect("no NACK after the calls");
    }
}

/// The HTTP filters of every connection manager of every listener `dump`
/// holds, by listener name.
fn http_filters(dump: &Value) -> Vec<(String, Vec<String>)> {
    section(dump, "ListenersConfigDump")["dynamic_listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            let filters = l["active_state"]["listener"]["filter_chains"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c["filters"].as_array().into_iter().flatten())
                .flat_map(|f| {
                    f["typed_config"]["http_filters"]
                        .as_array()
                        .into_iter()
                        .flatten()
                })
                .filter_map(|h| h["name"].as_str().map(str::to_string))
                .collect();
            (l["name"].as_str().unwrap_or("?").to_string(), filters)
        })
        .collect()
}

/// The HTTP filters of `layout`'s listener in `dump`, and where the
/// filter's sits among them; panics when either is missing.
fn filter_chain(dump: &Value, layout: &Layout) -> (Vec<String>, usize) {
    let filters = http_filters(dump);
    let (_, chain) = filters
        .iter()
        .find(|(l, _)| l == layout.listener)
        .unwrap_or_else(|| panic!("no {} in {filters:?}", layout.listener));
    let at = chain
        .iter()
        .position(|f| f == layout.filter)
        .unwrap_or_else(|| panic!("{}: no {} in {chain:?}", layout.listener, layout.filter));
    (chain.clone(), at)
}

/// The filter on `layout`'s listener, somewhere before the router, which
/// ends the chain (a WasmPlugin's phase places it, other filters may follow).
fn assert_before_the_router(dump: &Value, layout: &Layout) {
    let (chain, at) = filter_chain(dump, layout);
    assert_eq!(
        chain.last().map(String::as_str),
        Some("envoy.filters.http.router"),
        "{chain:?}"
    );
    assert!(at + 1 < chain.len(), "before the router: {chain:?}");
}

/// Waits until `node` (iptables: its listener `0.0.0.0_80` not bound) is
/// synced with that listener, asserts no listener of it has a filter of
/// llm-filter's, and returns its config dump.
fn assert_without_the_filter(envoy: &Envoy, node: &Node, istiod: &Istiod) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let dump = loop {
        let sync = istiod
            .debug("/debug/syncz")
            .and_then(|s| synced(&s, node.proxy_id()));
        let dump = config_dump(envoy);
        let has_80 = http_filters(&dump).iter().any(|(l, _)| l == "0.0.0.0_80");
        if sync.is_ok() && has_80 {
            break dump;
        }
        assert!(
            Instant::now() < deadline,
            "{}: not synced in 30 s: {sync:?}, listener 0.0.0.0_80 {has_80}\n{}",
            node.id,
            istiod.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    for (listener, filters) in http_filters(&dump) {
        assert!(
            !filters.iter().any(|f| f.contains("llm-filter")),
            "{}'s {listener}: {filters:?}",
            node.id
        );
    }
    dump
}

/// Enabling the filter for a namespace is one manifest in it:
/// envoyfilter-ecds.yaml, which has no workload selector, applied in
/// `my-app` reaches a sidecar of `my-app` whose pod carries no label of the
/// filter's, and no sidecar of another namespace, labelled or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_enables_the_filter_for_the_namespace_of_the_one_manifest() {
    let Some(bin) =
        skip_without_istiod("istiod_enables_the_filter_for_the_namespace_of_the_one_manifest")
    else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let module = module();
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let manifest = read_manifests(
        &workspace_root()
            .join(EXAMPLES)
            .join("envoyfilter-ecds.yaml"),
    )
    .expect("envoyfilter-ecds.yaml");
    assert_eq!(manifest.len(), 1, "one manifest");
    assert_eq!(manifest[0]["metadata"]["namespace"], "my-app");
    assert!(
        manifest[0]["spec"].get("workloadSelector").is_none(),
        "no workload selector: {}",
        manifest[0]["spec"]
    );
    let istiod = istiod_with(
        &bin,
        &["provider.yaml", "envoyfilter-ecds.yaml"],
        &module,
        &provider,
        false,
    );

    // A pod of my-app without any label of the filter's.
    let plain = Node {
        id: "sidecar~127.0.0.5~other-0.my-app~my-app.svc.cluster.local".into(),
        namespace: "my-app".into(),
        labels: json!({"app": "other"}),
        ip: "127.0.0.5".into(),
        interception: Some("NONE"),
    };
    let envoy = start_node(&plain, &istiod);
    let dump = wait_synced(&envoy, &plain, &istiod, &SIDECAR);
    assert_generated(&dump, &SIDECAR, &module, false);
    let url = SIDECAR.chat_url();
    let host = [("host", PROVIDER)];
    let body = cacheable("gpt-4o-mini", "cached in the namespace");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = post_json(&url, &body, &host).await.expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        seen.push(r.header("x-cache").unwrap_or("<none>").to_string());
    }
    assert_eq!(seen, ["MISS", "HIT"], "the filter in the unlabelled pod");
    assert_eq!(chats(&provider).len(), 1, "one provider call");

    // A pod of another namespace, labelled as the examples once selected
    // (iptables: its port-80 listener is not bound, so both can run).
    let elsewhere = Node {
        id: "sidecar~127.0.0.6~app-0.team-b~team-b.svc.cluster.local".into(),
        namespace: "team-b".into(),
        labels: json!({"app": "my-app", "llm-filter": "enabled"}),
        ip: "127.0.0.6".into(),
        interception: None,
    };
    let other = start_node(&elsewhere, &istiod);
    let other_dump = assert_without_the_filter(&other, &elsewhere, &istiod);
    let ecds = other_dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["ecds_filters"].as_array())
        .flatten()
        .count();
    assert_eq!(ecds, 0, "no extension config in team-b");
    assert_eq!(
        other.stat("wasm.envoy.wasm.runtime.v8.active"),
        0,
        "no Wasm VM in team-b's sidecar"
    );
    for node in [&plain, &elsewhere] {
        istiod.settled(node.proxy_id()).expect("no NACK");
    }
}

/// The bootstrap addition of examples/istio/bootstrap-memory.yaml: Envoy
/// returns up to 16 MiB a second of its allocator's free pages to the system.
fn release_free_memory() -> Value {
    let file = workspace_root()
        .join(EXAMPLES)
        .join("bootstrap-memory.yaml");
    let docs = read_manifests(&file).expect("bootstrap-memory.yaml");
    let custom = docs[0]["data"]["custom_bootstrap.json"]
        .as_str()
        .expect("custom_bootstrap.json");
    serde_json::from_str(custom).expect("custom bootstrap JSON")
}

/// One Envoy's memory: resident, proportional and private set (KiB, from
/// /proc; the private set is what another pod like it adds, the pages of
/// the Envoy binary it shares left out) and what its allocator holds
/// (`server.memory_allocated`, `memory_heap_size`).
fn memory(envoy: &Envoy) -> [u64; 5] {
    let pid = envoy.pid().expect("pid");
    let kib = |file: &str, key: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    [
        kib("status", "VmRSS:"),
        kib("smaps_rollup", "Pss:"),
        kib("smaps_rollup", "Private_Clean:") + kib("smaps_rollup", "Private_Dirty:"),
        envoy.stat("server.memory_allocated") / 1024,
        envoy.stat("server.memory_heap_size") / 1024,
    ]
}

/// Three calls through a sidecar at `url`, the `i`th with `body(i)`, each
/// answered; then the proxies are left idle for 3 s before they are measured.
async fn three_calls(url: &str, body: impl Fn(usize) -> Value) {
    for i in 0..3 {
        let r = post_json(url, &body(i), &[("host", PROVIDER)])
            .await
            .expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    std::thread::sleep(Duration::from_secs(3));
}

/// What a sidecar costs (docs/deploy/istio.md): two sidecars istiod
/// configures from the examples, Envoy at concurrency 2 (the builder's) with
/// the stats config Istio's agent writes, one of `team-b` without the filter
/// and one of `my-app` with envoyfilter-ecds.yaml, measured idle after a few
/// calls and with the cache filled to its bound (256 answers of about
/// 60 KiB, under the example's 64 KiB). `make bench-sidecar-memory`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: make bench-sidecar-memory"]
async fn istiod_sidecar_memory() {
    let Some(bin) = skip_without_istiod("istiod_sidecar_memory") else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let module = module();
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let istiod = istiod_with(
        &bin,
        &["provider.yaml", "envoyfilter-ecds.yaml"],
        &module,
        &provider,
        false,
    );
    let plain_node = Node {
        id: "sidecar~127.0.0.6~app-0.team-b~team-b.svc.cluster.local".into(),
        namespace: "team-b".into(),
        labels: json!({"app": "my-app"}),
        ip: "127.0.0.6".into(),
        interception: None,
    };
    let plain = start_node(&plain_node, &istiod);
    let node = Node::sidecar();
    let envoy = start_node(&node, &istiod);
    wait_synced(&envoy, &node, &istiod, &SIDECAR);
    assert_without_the_filter(&plain, &plain_node, &istiod);
    let url = SIDECAR.chat_url();
    let host = [("host", PROVIDER)];
    three_calls(&url, |i| cacheable("gpt-4o-mini", &format!("warm {i}"))).await;
    let idle = (memory(&plain), memory(&envoy));

    provider.set_answer_words(Some(12_000));
    let mut stored = 0;
    for i in 0..320 {
        let r = post_json(&url, &cacheable("gpt-4o-mini", &format!("fill {i}")), &host)
            .await
            .expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            r.text().len() > 60_000 && r.text().len() < 65_000,
            "{}",
            r.text().len()
        );
        stored += u64::from(r.header("x-cache") == Some("MISS"));
    }
    assert_eq!(stored, 320);
    let entries = "wasmcustom.llm_filter_cache_entries";
    // 320 answers through a cache of 256: it is at its bound (entries, or
    // the bytes bound of the cache's shared data, whichever comes first).
    let full = envoy.wait_for_stat(entries, 256, Duration::from_secs(8));
    assert!(full > 200, "the cache at its bound: {full}");
    let bytes = envoy.stat("wasmcustom.llm_filter_cache_bytes");
    std::thread::sleep(Duration::from_secs(3));
    let filled = (memory(&plain), memory(&envoy));

    // The same pod again, its bootstrap letting Envoy hand its allocator's
    // free pages back to the system (examples/istio/bootstrap-memory.yaml),
    // idle after three calls like the first.
    drop(envoy);
    let released = start_node_with(&node, &istiod, &release_free_memory());
    wait_synced(&released, &node, &istiod, &SIDECAR);
    provider.set_answer_words(None);
    three_calls(&url, |i| cacheable("gpt-4o-mini", &format!("again {i}"))).await;
    let idle_released = memory(&released);

    // The sidecar build (wasmplugin.yaml, which names its image), beside a
    // plain Envoy of the same istiod, idle after three calls.
    drop((released, plain, istiod));
    let istiod = istiod_with(
        &bin,
        &["provider.yaml", "wasmplugin.yaml"],
        &module,
        &provider,
        false,
    );
    let plain = start_node(&plain_node, &istiod);
    let sidecar = start_node(&node, &istiod);
    wait_synced(&sidecar, &node, &istiod, &WASMPLUGIN_SIDECAR);
    assert_without_the_filter(&plain, &plain_node, &istiod);
    three_calls(&url, |i| chat_body("gpt-4o-mini", &format!("sidecar {i}"))).await;
    assert_eq!(
        provider.last_request().expect("call").header("baggage"),
        Some("priority=P1"),
        "the sidecar build tagged the calls"
    );
    let sidecar_idle = (memory(&plain), memory(&sidecar));

    // A second pod of the namespace with the sidecar build (no iptables, so
    // its port-80 listener is not bound): the pages of the Envoy binary V8
    // runs from are one file's, shared, and PSS splits them between pods.
    let second_node = Node {
        id: "sidecar~127.0.0.7~app-1.my-app~my-app.svc.cluster.local".into(),
        namespace: "my-app".into(),
        labels: json!({"app": "my-app", "llm-filter": "enabled"}),
        ip: "127.0.0.7".into(),
        interception: None,
    };
    let second = start_node(&second_node, &istiod);
    let vms = "wasm.envoy.wasm.runtime.v8.active";
    assert!(
        second.wait_for_stat(vms, 1, Duration::from_secs(60)) >= 1,
        "the second pod's sidecar loaded the module"
    );
    std::thread::sleep(Duration::from_secs(3));
    let two_pods = [memory(&plain), memory(&sidecar), memory(&second)];

    // The sidecar build again, its bootstrap letting Envoy hand its
    // allocator's free pages back (bootstrap-memory.yaml).
    drop((second, sidecar));
    let sidecar = start_node_with(&node, &istiod, &release_free_memory());
    wait_synced(&sidecar, &node, &istiod, &WASMPLUGIN_SIDECAR);
    three_calls(&url, |i| chat_body("gpt-4o-mini", &format!("released {i}"))).await;
    let sidecar_released = (memory(&plain), memory(&sidecar));

    let mib = |k: u64| k as f64 / 1024.0;
    println!("sidecar memory, MiB (Envoy concurrency 2, Istio's stats config):");
    println!("| sidecar | RSS | PSS | private | memory_allocated | heap size |");
    println!("|---|---:|---:|---:|---:|---:|");
    let rows = [
        ("without the filter", idle.0),
        ("with the filter, after 3 calls", idle.1),
        ("without the filter (again, after the fill)", filled.0),
        ("with the filter, cache full", filled.1),
        (
            "with the filter, after 3 calls, free memory released",
            idle_released,
        ),
        (
            "without the filter (beside the sidecar build)",
            sidecar_idle.0,
        ),
        (
            "with the sidecar build (wasmplugin.yaml), after 3 calls",
            sidecar_idle.1,
        ),
        (
            "without the filter (beside two sidecar-build pods)",
            two_pods[0],
        ),
        ("with the sidecar build, first of two pods", two_pods[1]),
        ("with the sidecar build, second of two pods", two_pods[2]),
        (
            "with the sidecar build, after 3 calls, free memory released",
            sidecar_released.1,
        ),
    ];
    for (what, [rss, pss, private, allocated, heap]) in rows {
        println!(
            "| {what} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            mib(rss),
            mib(pss),
            mib(private),
            mib(allocated),
            mib(heap)
        );
    }
    println!(
        "cache: {full} entries, {:.1} MiB of answers; filter over plain: RSS {:+.1} MiB idle, {:+.1} MiB full, {:+.1} MiB idle with free memory released",
        bytes as f64 / 1048576.0,
        mib(idle.1[0]) - mib(idle.0[0]),
        mib(filled.1[0]) - mib(filled.0[0]),
        mib(idle_released[0]) - mib(idle.0[0])
    );
    let over = |i: usize, (plain, filter): ([u64; 5], [u64; 5])| mib(filter[i]) - mib(plain[i]);
    println!(
        "over plain Envoy, idle: full build RSS {:+.1} MiB, PSS {:+.1} MiB, private {:+.1} MiB; sidecar build RSS {:+.1} MiB, PSS {:+.1} MiB, private {:+.1} MiB",
        over(0, idle),
        over(1, idle),
        over(2, idle),
        over(0, sidecar_idle),
        over(1, sidecar_idle),
        over(2, sidecar_idle)
    );
    println!(
        "sidecar build over plain Envoy: PSS {:+.1} / {:+.1} MiB with two pods of it; RSS {:+.1} MiB, PSS {:+.1} MiB, private {:+.1} MiB with free memory released",
        mib(two_pods[1][1]) - mib(two_pods[0][1]),
        mib(two_pods[2][1]) - mib(two_pods[0][1]),
        over(0, sidecar_released),
        over(1, sidecar_released),
        over(2, sidecar_released)
    );
}
