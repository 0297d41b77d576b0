//! Istio's shape of a proxy's outbound HTTP in plain Envoy config, and
//! istiod's way of applying an `EnvoyFilter` to it, so the manifests of
//! `examples/istio/` are checked against what a proxy really runs. A sidecar:
//! listener `0.0.0.0_80`, route configuration `80`; an egress gateway: listener
//! `0.0.0.0_8080`, route configuration `http.8080`; both: virtual host
//! `api.openai.com:80`, clusters `outbound|80||api.openai.com`, the bootstrap
//! override merged in. Istio-only filters (metadata exchange, stats) are left
//! out: upstream Envoy has none of them and the filter does not depend on them.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// The directory of the Istio manifests, relative to the workspace root.
pub const EXAMPLES: &str = "examples/istio";

/// The service port Istio's outbound listener, route configuration and
/// cluster names carry for the providers in the examples.
pub const SERVICE_PORT: u16 = 80;

/// Where the sidecar sends a provider's traffic.
#[derive(Debug, Clone)]
pub enum Upstream {
    /// The provider itself: DNS, TLS originated with SNI (as provider.yaml's
    /// DestinationRule makes Istio build it). Only for validation.
    Tls { port: u16 },
    /// A plain-HTTP stand-in on 127.0.0.1 (a mock), for runs.
    Loopback { port: u16 },
}

/// One external service of the mesh (a ServiceEntry host on [`SERVICE_PORT`]).
#[derive(Debug, Clone)]
pub struct Service {
    pub host: String,
    pub upstream: Upstream,
}

impl Service {
    pub fn new(host: &str, upstream: Upstream) -> Self {
        Self {
            host: host.to_string(),
            upstream,
        }
    }

    /// Istio's cluster name, `outbound|<port>||<host>`.
    pub fn cluster(&self) -> String {
        cluster_name(&self.host)
    }
}

/// Istio's name of the outbound cluster of `host` on [`SERVICE_PORT`].
pub fn cluster_name(host: &str) -> String {
    format!("outbound|{SERVICE_PORT}||{host}")
}

/// Istio's name of the virtual host of `host` on [`SERVICE_PORT`].
pub fn vhost_name(host: &str) -> String {
    format!("{host}:{SERVICE_PORT}")
}

/// Which proxy of the mesh, as EnvoyFilters select it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A sidecar of the application's namespace `my-app`, labelled
    /// `llm-filter: enabled` (which the examples no longer need: they reach
    /// every sidecar of `my-app`).
    Sidecar,
    /// Istio's default egress gateway in `istio-system`: server port 80 on
    /// container port 8080.
    EgressGateway,
    /// A sidecar of `my-app` labelled `llm-filter: shard`: the front of the
    /// mesh-scale cache (examples/istio/mesh-cache.yaml).
    ShardSidecar,
}

impl Role {
    /// `match.context` of the patches that apply to it.
    pub fn context(self) -> &'static str {
        match self {
            Role::Sidecar | Role::ShardSidecar => "SIDECAR_OUTBOUND",
            Role::EgressGateway => "GATEWAY",
        }
    }

    /// The port its HTTP listener for the providers binds.
    pub fn listener_port(self) -> u16 {
        match self {
            Role::Sidecar | Role::ShardSidecar => SERVICE_PORT,
            Role::EgressGateway => 8080,
        }
    }

    /// Istio's name of the route configuration an EnvoyFilter's
    /// `routeConfiguration.portNumber` `port` matches: a sidecar's by the
    /// service port; a gateway's by the Service port too (80), the name by
    /// the listener's (`http.8080`), as istiod matches them.
    pub fn route_config_name(self, port: u64) -> String {
        match self {
            Role::Sidecar | Role::ShardSidecar => port.to_string(),
            Role::EgressGateway if port == u64::from(SERVICE_PORT) => {
                format!("http.{}", self.listener_port())
            }
            Role::EgressGateway => format!("http.{port}"),
        }
    }

    fn namespace(self) -> &'static str {
        match self {
            Role::Sidecar | Role::ShardSidecar => "my-app",
            Role::EgressGateway => ROOT_NAMESPACE,
        }
    }

    fn labels(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Role::Sidecar => &[("app", "my-app"), ("llm-filter", "enabled")],
            Role::ShardSidecar => &[("app", "my-app"), ("llm-filter", "shard")],
            Role::EgressGateway => &[("app", "istio-egressgateway"), ("istio", "egressgateway")],
        }
    }

    /// Whether istiod applies an EnvoyFilter of `namespace` selecting `labels`
    /// to this proxy: its own namespace or the root one, and every label.
    fn selected_by(self, namespace: &str, labels: &serde_json::Map<String, Value>) -> bool {
        (namespace == self.namespace() || namespace == ROOT_NAMESPACE)
            && labels.iter().all(|(k, v)| {
                self.labels()
                    .iter()
                    .any(|(lk, lv)| lk == k && v.as_str() == Some(*lv))
            })
    }
}

/// Istio's root namespace, whose EnvoyFilters apply in every namespace.
const ROOT_NAMESPACE: &str = "istio-system";

/// How the filter's extension config reaches Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// As istiod sends it: the listener names the filter, ADS delivers it
    /// (the bootstrap has an `xds-grpc` cluster, as Istio's does).
    Ads,
    /// As Envoy runs it once discovered: the extension config inline in the
    /// filter chain.
    Inline,
}

/// A proxy's Envoy config as Istio lays it out, and the extension configs
/// (ECDS resources) `EXTENSION_CONFIG` patches added.
#[derive(Debug, Clone)]
pub struct Proxy {
    pub role: Role,
    pub config: Value,
    pub extension_configs: Vec<Value>,
}

impl Proxy {
    /// The bootstrap and static resources of a proxy whose mesh knows
    /// `services`, its HTTP listener bound to `127.0.0.1:0`.
    pub fn new(role: Role, services: &[Service], discovery: Discovery) -> Self {
        let mut vhosts: Vec<Value> = services
            .iter()
            .map(|s| {
                json!({
                    "name": vhost_name(&s.host),
                    "domains": [s.host, vhost_name(&s.host)],
                    "routes": [istio_default_route(&s.cluster(), &vhost_name(&s.host))],
                    "include_request_attempt_count": true
                })
            })
            .collect();
        vhosts.push(json!({
            "name": "allow_any",
            "domains": ["*"],
            "routes": [{
                "name": "allow_any",
                "match": {"prefix": "/"},
                "route": {"cluster": "PassthroughCluster", "timeout": "0s", "max_grpc_timeout": "0s"}
            }],
            "include_request_attempt_count": true
        }));
        let port = role.listener_port();
        let listener = json!({
            "name": format!("0.0.0.0_{port}"),
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{
                "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": format!("outbound_0.0.0.0_{port}"),
                        "route_config": {
                            "name": role.route_config_name(u64::from(port)),
                            "virtual_hosts": vhosts,
                            "validate_clusters": false
                        },
                        "http_filters": [
                            {"name": "envoy.filters.http.grpc_stats", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
                                "emit_filter_state": true, "stats_for_all_methods": false}},
                            {"name": "envoy.filters.http.fault", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}},
                            {"name": "envoy.filters.http.cors", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}},
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                        ],
                        "use_remote_address": false,
                        "normalize_path": true,
                        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
                        "request_id_extension": {"typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig",
                            "use_request_id_for_trace_sampling": true}}
                    }
                }]
            }],
            "traffic_direction": "OUTBOUND"
        });
        let mut clusters: Vec<Value> = services.iter().map(service_cluster).collect();
        clusters.push(json!({
            "name": "PassthroughCluster", "type": "ORIGINAL_DST", "connect_timeout": "10s",
            "lb_policy": "CLUSTER_PROVIDED"
        }));
        clusters.push(json!({
            "name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"
        }));
        let mut config = json!({
            "node": {"id": "sidecar~10.0.0.1~app-0.my-app~my-app.svc.cluster.local", "cluster": "app.my-app"},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "stats_flush_interval": "1s",
            "stats_config": {
                "use_all_default_tags": false,
                "stats_tags": [
                    {"tag_name": "cluster_name", "regex": "^cluster\\.((.+?(\\..+?\\.svc\\.cluster\\.local)?)\\.)"},
                    {"tag_name": "tcp_prefix", "regex": "^tcp\\.((.*?)\\.)\\w+?$"},
                    {"tag_name": "response_code_class", "regex": "_rq(_(\\dxx))$"}
                ],
                // Istio's defaults (whose `wasm` also keeps the filter's
                // `wasmcustom.` stats) and what the tests read besides.
                "stats_matcher": {"inclusion_list": {"patterns": [
                    {"prefix": "reporter="}, {"prefix": "cluster_manager"}, {"prefix": "listener_manager"},
                    {"prefix": "server"}, {"prefix": "cluster.xds-grpc"}, {"prefix": "wasm"},
                    {"suffix": "rbac.allowed"}, {"suffix": "rbac.denied"}, {"prefix": "component"},
                    {"prefix": "extension_config_discovery"},
                    {"prefix": "http.outbound"}, {"prefix": "cluster.outbound"}
                ]}}
            },
            "static_resources": {"listeners": [listener], "clusters": clusters}
        });
        if discovery == Discovery::Ads {
            let dynamic = json!({
                "ads_config": {
                    "api_type": "GRPC", "transport_api_version": "V3", "set_node_on_first_message_only": true,
                    "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]
                }
            });
            if let Some(c) = config.as_object_mut() {
                c.insert("dynamic_resources".to_string(), dynamic);
            }
            push(
                config.pointer_mut("/static_resources/clusters"),
                json!({
                    "name": "xds-grpc", "type": "STATIC", "connect_timeout": "1s",
                    "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}}},
                    "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 15012}}}}]}]}
                }),
            );
        }
        Self {
            role,
            config,
            extension_configs: Vec::new(),
        }
    }

    /// Applies every Istio resource that changes this proxy's Envoy config:
    /// the patches of each `EnvoyFilter` that selects it (as istiod does) and
    /// the stats tags an `IstioOperator`'s `extraStatTags` give (as the
    /// agent's bootstrap template writes them). Others are left alone.
    pub fn apply_manifest(&mut self, doc: &Value) -> Result<()> {
        match doc.get("kind").and_then(Value::as_str) {
            Some("EnvoyFilter") => {
                let name = doc
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                let namespace = doc
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .ok_or_else(|| anyhow!("EnvoyFilter {name} names no namespace"))?;
                let labels = doc
                    .pointer("/spec/workloadSelector/labels")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                if !self.role.selected_by(namespace, &labels) {
                    return Ok(());
                }
                let patches = doc
                    .pointer("/spec/configPatches")
                    .and_then(Value::as_array)
                    .ok_or_else(|| anyhow!("EnvoyFilter {name} has no configPatches"))?;
                for (i, patch) in patches.iter().enumerate() {
                    self.apply_patch(patch)
                        .with_context(|| format!("EnvoyFilter {name}, configPatches[{i}]"))?;
                }
                Ok(())
            }
            Some("IstioOperator") => {
                let rules: Vec<Value> = mesh_stats_tags(doc)?
                    .into_iter()
                    .map(|(tag, regex)| json!({"tag_name": tag, "regex": regex}))
                    .collect();
                merge(
                    &mut self.config,
                    &json!({"stats_config": {"stats_tags": rules}}),
                );
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn apply_patch(&mut self, patch: &Value) -> Result<()> {
        let apply_to = str_at(patch, "/applyTo")?;
        let operation = str_at(patch, "/patch/operation")?;
        let value = patch
            .pointer("/patch/value")
            .cloned()
            .ok_or_else(|| anyhow!("no patch.value"))?;
        let m = patch.get("match").cloned().unwrap_or(Value::Null);
        if let Some(context) = m.get("context").and_then(Value::as_str) {
            if context != self.role.context() && context != "ANY" {
                bail!(
                    "match.context {context} on a {:?}: not laid out here",
                    self.role
                );
            }
        }
        match (apply_to, operation) {
            ("EXTENSION_CONFIG", "ADD") => {
                self.extension_configs.push(value);
                Ok(())
            }
            ("HTTP_FILTER", op) => {
                let chain = self.http_filters(&m)?;
                let sub = m
                    .pointer("/listener/filterChain/filter/subFilter/name")
                    .and_then(Value::as_str);
                let at = match sub {
                    Some(sub) => chain
                        .iter()
                        .position(|f| f.get("name").and_then(Value::as_str) == Some(sub))
                        .ok_or_else(|| anyhow!("no HTTP filter {sub} in the chain"))?,
                    None if op == "INSERT_FIRST" => 0,
                    None => bail!(
                        "HTTP_FILTER {op} without match.listener.filterChain.filter.subFilter"
                    ),
                };
                match op {
                    "INSERT_BEFORE" | "INSERT_FIRST" => chain.insert(at, value),
                    "INSERT_AFTER" => chain.insert(at + 1, value),
                    _ => bail!("HTTP_FILTER operation {op} is not laid out here"),
                }
                Ok(())
            }
            ("VIRTUAL_HOST", "MERGE") => {
                let vhost = self.vhost(&m)?;
                merge(vhost, &value);
                Ok(())
            }
            ("HTTP_ROUTE", op) => {
                let vhost = self.vhost(&m)?;
                let routes = vhost
                    .get_mut("routes")
                    .and_then(Value::as_array_mut)
                    .ok_or_else(|| anyhow!("virtual host without routes"))?;
                match op {
                    "INSERT_FIRST" => routes.insert(0, value),
                    "INSERT_BEFORE" | "INSERT_AFTER" | "MERGE" => {
                        let name = m
                            .pointer("/routeConfiguration/vhost/route/name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                anyhow!("HTTP_ROUTE {op} needs routeConfiguration.vhost.route.name")
                            })?;
                        let at = routes
                            .iter()
                            .position(|r| r.get("name").and_then(Value::as_str) == Some(name))
                            .ok_or_else(|| anyhow!("no route named {name}"))?;
                        match op {
                            "INSERT_BEFORE" => routes.insert(at, value),
                            "INSERT_AFTER" => routes.insert(at + 1, value),
                            _ => {
                                if let Some(route) = routes.get_mut(at) {
                                    merge(route, &value);
                                }
                            }
                        }
                    }
                    _ => bail!("HTTP_ROUTE operation {op} is not laid out here"),
                }
                Ok(())
            }
            (what, op) => bail!("{what} {op} is not laid out here"),
        }
    }

    /// The HTTP filter chain of the listener `m.listener` selects.
    fn http_filters(&mut self, m: &Value) -> Result<&mut Vec<Value>> {
        let port = m.pointer("/listener/portNumber").and_then(Value::as_u64);
        let name = port.map(|p| format!("0.0.0.0_{p}"));
        let listeners = self
            .config
            .pointer_mut("/static_resources/listeners")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| anyhow!("no listeners"))?;
        let listener = listeners
            .iter_mut()
            .find(|l| name.is_none() || l.get("name").and_then(Value::as_str) == name.as_deref())
            .ok_or_else(|| anyhow!("no outbound listener on port {port:?} in Istio's layout"))?;
        listener
            .pointer_mut("/filter_chains/0/filters/0/typed_config/http_filters")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| anyhow!("listener without an HTTP connection manager"))
    }

    /// The virtual host `m.routeConfiguration` selects.
    fn vhost(&mut self, m: &Value) -> Result<&mut Value> {
        let port = m
            .pointer("/routeConfiguration/portNumber")
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("routeConfiguration.portNumber is required here"))?;
        let vhost = m
            .pointer("/routeConfiguration/vhost/name")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("routeConfiguration.vhost.name is required here"))?
            .to_string();
        let wanted = self.role.route_config_name(port);
        let route_config = self
            .config
            .pointer_mut("/static_resources/listeners")
            .and_then(Value::as_array_mut)
            .and_then(|ls| {
                ls.iter_mut().find_map(|l| {
                    l.pointer_mut("/filter_chains/0/filters/0/typed_config/route_config")
                        .filter(|rc| {
                            rc.get("name").and_then(Value::as_str) == Some(wanted.as_str())
                        })
                })
            })
            .ok_or_else(|| anyhow!("no route configuration {wanted} in Istio's layout"))?;
        route_config["virtual_hosts"]
            .as_array_mut()
            .and_then(|vs| {
                vs.iter_mut()
                    .find(|v| v.get("name").and_then(Value::as_str) == Some(vhost.as_str()))
            })
            .ok_or_else(|| anyhow!("no virtual host {vhost} in route configuration {wanted}"))
    }

    /// What the Istio agent hands Envoy: each extension config's remote code
    /// (an `oci://` image) replaced by the module it pulled, a local file.
    pub fn fetch_remote_code(&mut self, wasm: &Path) -> Result<()> {
        for ec in &mut self.extension_configs {
            let name = ec
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            let code = ec
                .pointer_mut("/typed_config/config/vm_config/code")
                .ok_or_else(|| anyhow!("extension config {name} has no vm_config.code"))?;
            let uri = code
                .pointer("/remote/http_uri/uri")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("extension config {name}: no code.remote.http_uri.uri"))?;
            if !uri.starts_with("oci://") {
                bail!("extension config {name}: {uri} is not an oci:// image");
            }
            let sha = code
                .pointer("/remote/sha256")
                .and_then(Value::as_str)
                .unwrap_or("");
            if sha.is_empty() {
                bail!("extension config {name}: code.remote has no sha256");
            }
            *code = json!({"local": {"filename": wasm.to_string_lossy()}});
        }
        Ok(())
    }

    /// Replaces the filter configuration (the Wasm `configuration` string) of
    /// every extension config, as a test needs its own.
    pub fn set_plugin_config(&mut self, config: &Value) {
        for ec in &mut self.extension_configs {
            if let Some(value) = ec.pointer_mut("/typed_config/config/configuration/value") {
                *value = Value::String(config.to_string());
            }
        }
    }

    /// Every filter that names its config by discovery gets the extension
    /// config of that name inline, as Envoy runs it once discovered.
    pub fn inline_extension_configs(&mut self) -> Result<()> {
        let configs = self.extension_configs.clone();
        self.each_discovered_filter(
            |filter, ec| {
                let typed = ec
                    .get("typed_config")
                    .cloned()
                    .ok_or_else(|| anyhow!("extension config without typed_config"))?;
                let name = filter.get("name").cloned().unwrap_or(Value::Null);
                *filter = json!({"name": name, "typed_config": typed});
                Ok(())
            },
            &configs,
        )
    }

    /// Every filter that names its config by discovery reads it from a file
    /// in `dir` (Envoy watches it) instead of ADS: the run of an Istio-shaped
    /// config without istiod.
    pub fn discover_from_files(&mut self, dir: &Path) -> Result<()> {
        let configs = self.extension_configs.clone();
        let dir = dir.to_path_buf();
        self.each_discovered_filter(
            |filter, ec| {
                let name = ec.get("name").and_then(Value::as_str).unwrap_or("filter");
                let file = dir.join(format!("ecds-{}.json", name.replace(['/', '|'], "_")));
                let resource = json!({"resources": [{
                    "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
                    "name": name,
                    "typed_config": ec.get("typed_config").cloned().unwrap_or(Value::Null)
                }]});
                std::fs::write(&file, resource.to_string())
                    .context("write the discovered config")?;
                let source = json!({"path_config_source": {"path": file.to_string_lossy()}});
                let discovery = filter
                    .as_object_mut()
                    .ok_or_else(|| anyhow!("a discovered filter that is not an object"))?
                    .entry("config_discovery")
                    .or_insert_with(|| json!({}));
                if let Some(d) = discovery.as_object_mut() {
                    d.insert("config_source".to_string(), source);
                }
                Ok(())
            },
            &configs,
        )
    }

    fn each_discovered_filter(
        &mut self,
        mut f: impl FnMut(&mut Value, &Value) -> Result<()>,
        configs: &[Value],
    ) -> Result<()> {
        let listeners = self
            .config
            .pointer_mut("/static_resources/listeners")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| anyhow!("no listeners"))?;
        for listener in listeners {
            let Some(chain) = listener
                .pointer_mut("/filter_chains/0/filters/0/typed_config/http_filters")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for filter in chain
                .iter_mut()
                .filter(|f| f.get("config_discovery").is_some())
            {
                let name = filter
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let ec = configs
                    .iter()
                    .find(|ec| ec.get("name").and_then(Value::as_str) == Some(name.as_str()))
                    .ok_or_else(|| {
                        anyhow!("filter {name} discovers a config no EXTENSION_CONFIG adds")
                    })?;
                f(filter, ec)?;
            }
        }
        Ok(())
    }

    /// The config as YAML text for Envoy (JSON is YAML).
    pub fn to_yaml(&self) -> String {
        serde_json::to_string_pretty(&self.config).unwrap_or_default()
    }
}

/// The route Istio generates for a service's virtual host, with the retry
/// policy it puts on every route (which replaces the virtual host's).
fn istio_default_route(cluster: &str, vhost: &str) -> Value {
    json!({
        "name": "default",
        "match": {"prefix": "/"},
        "route": {
            "cluster": cluster,
            "timeout": "0s",
            "retry_policy": {
                "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
                "num_retries": 2,
                "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
                "host_selection_retry_max_attempts": "5",
                "retriable_status_codes": [503]
            },
            "max_grpc_timeout": "0s"
        },
        "decorator": {"operation": format!("{vhost}/*")}
    })
}

fn service_cluster(s: &Service) -> Value {
    let name = s.cluster();
    match s.upstream {
        Upstream::Tls { port } => json!({
            "name": name, "type": "STRICT_DNS", "connect_timeout": "10s", "lb_policy": "ROUND_ROBIN",
            "dns_lookup_family": "V4_ONLY",
            "circuit_breakers": {"thresholds": [{"max_retries": 64}]},
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": s.host, "port_value": port}}}}]}]},
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": s.host}}
        }),
        Upstream::Loopback { port } => json!({
            "name": name, "type": "STATIC", "connect_timeout": "10s", "lb_policy": "ROUND_ROBIN",
            "circuit_breakers": {"thresholds": [{"max_retries": 64}]},
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}
        }),
    }
}

/// Protobuf's merge on JSON, as `MERGE` patches and bootstrap overrides work:
/// objects field by field, lists appended, everything else replaced.
pub fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (a, b) => *a = b.clone(),
    }
}

fn push(list: Option<&mut Value>, item: Value) {
    if let Some(list) = list.and_then(Value::as_array_mut) {
        list.push(item);
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Result<&'a str> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("no {pointer}"))
}

/// Every YAML document of a manifest file, as JSON values.
pub fn read_manifests(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    parse_manifests(&text).with_context(|| format!("parse {}", path.display()))
}

/// Every YAML document of manifests' `text`, as JSON values.
pub fn parse_manifests(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The manifests of `examples/istio/`, each with its file name, in name order.
pub fn example_manifests() -> Result<Vec<(String, Value)>> {
    let dir = crate::workspace_root().join(EXAMPLES);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for doc in read_manifests(&file)? {
            out.push((name.clone(), doc));
        }
    }
    Ok(out)
}

/// The names of `meshConfig.defaultConfig.extraStatTags` in an `IstioOperator`.
pub fn extra_stat_tags(doc: &Value) -> Result<Vec<String>> {
    doc.pointer("/spec/meshConfig/defaultConfig/extraStatTags")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("no spec.meshConfig.defaultConfig.extraStatTags"))?
        .iter()
        .map(|t| {
            t.as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("a tag that is no string: {t}"))
        })
        .collect()
}

/// The `(tag_name, regex)` rule Istio's bootstrap template
/// (`tools/packaging/common/envoy_bootstrap.json`) writes for one name of
/// `extraStatTags`: `"regex": "({{ $tag }}=\\.=(.*?);\\.;)"`.
pub fn istio_stat_tag_rule(tag: &str) -> (String, String) {
    (tag.to_string(), format!(r"({tag}=\.=(.*?);\.;)"))
}

/// The `(tag_name, regex)` rules the mesh config `doc` (an `IstioOperator`)
/// gives every proxy through its `extraStatTags`.
pub fn mesh_stats_tags(doc: &Value) -> Result<Vec<(String, String)>> {
    Ok(extra_stat_tags(doc)?
        .iter()
        .map(|t| istio_stat_tag_rule(t))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_as_protobuf_does() {
        let mut a = json!({"x": {"y": 1, "l": [1]}, "s": "a"});
        merge(&mut a, &json!({"x": {"z": 2, "l": [2]}, "s": "b"}));
        assert_eq!(a, json!({"x": {"y": 1, "z": 2, "l": [1, 2]}, "s": "b"}));
    }

    #[test]
    fn envoy_filters_apply_where_istiod_applies_them() {
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
        };
        let app = labels(&[("llm-filter", "enabled")]);
        let gateway = labels(&[("istio", "egressgateway")]);
        assert!(Role::Sidecar.selected_by("my-app", &app));
        assert!(!Role::Sidecar.selected_by("other", &app));
        assert!(Role::Sidecar.selected_by("istio-system", &app));
        assert!(!Role::Sidecar.selected_by("istio-system", &gateway));
        assert!(Role::EgressGateway.selected_by("istio-system", &gateway));
        assert!(!Role::EgressGateway.selected_by("istio-system", &app));
        let shard = labels(&[("llm-filter", "shard")]);
        assert!(Role::ShardSidecar.selected_by("my-app", &shard));
        assert!(!Role::ShardSidecar.selected_by("my-app", &app));
        assert!(!Role::Sidecar.selected_by("my-app", &shard));
        assert_eq!(Role::EgressGateway.route_config_name(80), "http.8080");
        assert_eq!(Role::Sidecar.route_config_name(80), "80");
    }

    #[test]
    fn a_patch_that_matches_nothing_is_an_error() {
        let mut sidecar = Proxy::new(
            Role::Sidecar,
            &[Service::new(
                "api.openai.com",
                Upstream::Loopback { port: 1 },
            )],
            Discovery::Inline,
        );
        let patch = json!({"applyTo": "VIRTUAL_HOST",
            "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 80, "vhost": {"name": "api.openai.com"}}},
            "patch": {"operation": "MERGE", "value": {"include_attempt_count_in_response": true}}});
        let err = sidecar.apply_patch(&patch).unwrap_err().to_string();
        assert!(
            err.contains("no virtual host api.openai.com in route configuration 80"),
            "{err}"
        );
        let good = json!({"applyTo": "VIRTUAL_HOST",
            "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 80, "vhost": {"name": "api.openai.com:80"}}},
            "patch": {"operation": "MERGE", "value": {"include_attempt_count_in_response": true}}});
        sidecar.apply_patch(&good).unwrap();
        assert_eq!(
            cluster_name("api.openai.com"),
            "outbound|80||api.openai.com"
        );
    }
}
