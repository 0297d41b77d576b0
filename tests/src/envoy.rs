//! Runs the real Envoy binary with the built filter, so end-to-end tests exercise
//! exactly what users deploy: config generation, start with a readiness deadline,
//! the admin API (stats, Prometheus text) and cleanup by pid on drop.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// The demo bootstrap, the one source of the `stats_config` rules that turn the
/// filter's `<metric>.<label>.<value>...` stat names into Prometheus labels.
const DEMO_ENVOY_YAML: &str = include_str!("../../envoy/envoy.yaml");

/// The `stats_config:` block of `envoy/envoy.yaml`, from that line to the next
/// top-level key, so generated configs label stats exactly as the demo does.
pub fn stats_config_yaml() -> String {
    top_level_block(DEMO_ENVOY_YAML, "stats_config")
}

/// The lines of the top-level key `key` in `yaml`: its own line and every
/// following line up to the next line starting at column 0 (comments and blank
/// lines inside the block are kept). Empty when the key is missing.
pub fn top_level_block(yaml: &str, key: &str) -> String {
    let head = format!("{key}:");
    let mut out = String::new();
    let mut inside = false;
    for line in yaml.lines() {
        let top_level = !line.is_empty() && !line.starts_with([' ', '#']);
        if top_level {
            inside = line.trim_end() == head;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The `(tag_name, regex)` pairs of every `stats_tags` rule in a YAML text, in
/// order, whether written as block mappings or as `{ tag_name: .., regex: '..' }`.
/// Regexes are read as YAML single-quoted strings, the form these files use.
pub fn stats_tag_rules(yaml: &str) -> Vec<(String, String)> {
    let mut rules = Vec::new();
    let mut name: Option<String> = None;
    for line in yaml.lines() {
        let line = line.split(" #").next().unwrap_or(line);
        if let Some(rest) = line.split("tag_name:").nth(1) {
            let value = rest.split([',', '}']).next().unwrap_or(rest);
            name = Some(value.trim().trim_matches(['\'', '"']).to_string());
        }
        if let Some(rest) = line.split("regex:").nth(1) {
            let rest = rest.trim_start();
            let regex = rest
                .strip_prefix('\'')
                .and_then(|r| r.find('\'').map(|end| &r[..end]))
                .unwrap_or(rest.trim_end_matches([' ', '}']));
            if let Some(name) = name.take() {
                rules.push((name, regex.to_string()));
            }
        }
    }
    rules
}

/// Name the filter is configured under (`name`, `root_id` and `vm_id`).
pub const FILTER_NAME: &str = "llm_filter";

/// Header Envoy routes by when [`EnvoyBuilder::cluster_header`] is set.
pub const DEFAULT_CLUSTER_HEADER: &str = "x-llm-cluster";

const READY_DEADLINE: Duration = Duration::from_secs(30);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The workspace root, one level above this crate.
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The Envoy binary: `ENVOY_BIN`, else `.venv/bin/envoy` under the workspace root.
pub fn envoy_bin() -> PathBuf {
    std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/envoy"))
}

/// The filter module: `LLM_FILTER_WASM`, else the release build under the workspace root.
/// `make test` runs the suite's sidecar-relevant tests a second time with
/// this set to the sidecar build.
pub fn wasm_path() -> PathBuf {
    std::env::var_os("LLM_FILTER_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/llm_filter.wasm"))
}

/// The sidecar build of the module (`make build`): `LLM_FILTER_SIDECAR_WASM`,
/// else its place under the workspace root.
pub fn sidecar_wasm_path() -> PathBuf {
    std::env::var_os("LLM_FILTER_SIDECAR_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/llm_filter_sidecar.wasm"))
}

/// The no-op module the benches compare the filter with (tests/noop):
/// `LLM_FILTER_NOOP_WASM`, else its release build under the workspace root
/// (`make bench-noop` builds it).
pub fn noop_wasm_path() -> PathBuf {
    std::env::var_os("LLM_FILTER_NOOP_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            workspace_root().join("target/wasm32-wasip1/release/llm_filter_noop.wasm")
        })
}

/// Whether the Envoy binary exists (see [`crate::skip_without_envoy`]).
pub fn envoy_available() -> bool {
    envoy_bin().is_file()
}

/// Whether the built filter exists.
pub fn wasm_available() -> bool {
    wasm_path().is_file()
}

/// What the route does with a request.
#[derive(Debug, Clone)]
enum RouteTarget {
    /// The first upstream, or the cluster named by a header.
    Upstream,
    /// Envoy answers itself (benchmark backend).
    Direct {
        status: u16,
        body: String,
        content_type: String,
    },
}

/// Builds an Envoy configuration and starts Envoy with it.
#[derive(Debug, Clone)]
pub struct EnvoyBuilder {
    filter: bool,
    plugin_config: String,
    concurrency: u32,
    upstreams: Vec<Upstream>,
    cluster_header: Option<String>,
    header_route: Option<String>,
    route_timeout_ms: Option<u64>,
    extra_route_yaml: Option<String>,
    virtual_host_yaml: Option<String>,
    /// A file the HTTP connection manager logs each stream to, with a format.
    access_log: Option<(PathBuf, String)>,
    /// More fields of the HTTP connection manager (`tracing: ...`).
    hcm_yaml: Option<String>,
    target: RouteTarget,
    log_level: String,
    component_log_level: Option<String>,
    envoy_bin: PathBuf,
    wasm_path: PathBuf,
    ecds: bool,
    /// The bootstrap names a node (secrets from SDS need one).
    node: bool,
    read_body_first: bool,
    /// A whole bootstrap to run instead of the generated one.
    bootstrap: Option<String>,
    /// HTTP filters placed before the filter (`jwt_authn`, say), YAML list
    /// items at column 0.
    filters_before: Option<String>,
}

impl Default for EnvoyBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl EnvoyBuilder {
    /// Envoy with the filter configured with `{}`, concurrency 2, no upstream yet.
    pub fn new() -> Self {
        Self {
            filter: true,
            plugin_config: "{}".to_string(),
            concurrency: 2,
            upstreams: Vec::new(),
            cluster_header: None,
            header_route: None,
            route_timeout_ms: None,
            extra_route_yaml: None,
            virtual_host_yaml: None,
            access_log: None,
            hcm_yaml: None,
            target: RouteTarget::Upstream,
            log_level: "info".to_string(),
            component_log_level: None,
            envoy_bin: envoy_bin(),
            wasm_path: wasm_path(),
            ecds: false,
            node: false,
            read_body_first: false,
            bootstrap: None,
            filters_before: None,
        }
    }

    /// Runs `yaml` as it is instead of a generated bootstrap, from the
    /// workspace root (so a module path relative to it resolves as for `make
    /// run`); the first listener is the one [`Envoy::url`] names. For the
    /// bootstraps the project ships.
    pub fn bootstrap(mut self, yaml: impl Into<String>) -> Self {
        self.bootstrap = Some(yaml.into());
        self
    }

    /// The filter's configuration comes from a watched file by extension
    /// config discovery (ECDS), as a control plane delivers it, so
    /// [`Envoy::reload_plugin_config`] can change it while Envoy runs.
    pub fn discovered_config(mut self) -> Self {
        self.ecds = true;
        self.filter = true;
        self
    }

    /// The filter's JSON configuration: a `serde_json::Value` or a `&str`.
    pub fn plugin_config(mut self, config: impl std::fmt::Display) -> Self {
        self.plugin_config = config.to_string();
        self.filter = true;
        self
    }

    /// The bootstrap names a node, as config sources other than the
    /// bootstrap (secrets from SDS files among them) need.
    pub fn node(mut self) -> Self {
        self.node = true;
        self
    }

    /// Plain Envoy without the filter, for comparison.
    pub fn no_filter(mut self) -> Self {
        self.filter = false;
        self
    }

    /// Worker threads (`--concurrency`), 2 by default.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    /// Adds a STATIC cluster `name` at 127.0.0.1:`port`; the first one is the route's default.
    pub fn upstream(self, name: &str, port: u16) -> Self {
        self.upstream_pool(name, &[port], "")
    }

    /// Adds a STATIC cluster `name` with an endpoint at 127.0.0.1 for each of
    /// `ports`, and `cluster_yaml` added to the cluster (`lb_policy`,
    /// `outlier_detection`, `health_checks`, …). The hash policy of a
    /// `RING_HASH` or `MAGLEV` cluster goes on the route
    /// ([`EnvoyBuilder::extra_route_yaml`]).
    pub fn upstream_pool(mut self, name: &str, ports: &[u16], cluster_yaml: &str) -> Self {
        self.upstreams.push(Upstream {
            name: name.to_string(),
            ports: ports.to_vec(),
            yaml: cluster_yaml.to_string(),
        });
        self
    }

    /// Route by the cluster named in this header (usually [`DEFAULT_CLUSTER_HEADER`])
    /// instead of the first upstream; `None` restores the fixed cluster. Envoy answers
    /// a missing header or an unknown cluster itself (404/503).
    pub fn cluster_header(mut self, header: Option<&str>) -> Self {
        self.cluster_header = header.map(str::to_string);
        self
    }

    /// Adds a route ahead of the default one, as a deployment of model routing
    /// has it: requests carrying `header` go to the cluster it names
    /// (`cluster_header`), all others to the first upstream. Timeout and extra
    /// route YAML apply to both routes.
    pub fn header_route(mut self, header: &str) -> Self {
        self.header_route = Some(header.to_string());
        self
    }

    /// Route timeout (Envoy's default is 15 s).
    pub fn route_timeout_ms(mut self, ms: u64) -> Self {
        self.route_timeout_ms = Some(ms);
        self
    }

    /// YAML added under the route action, e.g. `"retry_policy:\n  retry_on: 5xx\n  num_retries: 2"`.
    pub fn extra_route_yaml(mut self, yaml: &str) -> Self {
        self.extra_route_yaml = Some(yaml.to_string());
        self
    }

    /// YAML added to the virtual host, e.g. `"include_attempt_count_in_response: true"`.
    pub fn virtual_host_yaml(mut self, yaml: &str) -> Self {
        self.virtual_host_yaml = Some(yaml.to_string());
        self
    }

    /// Envoy answers every request itself with this status and JSON body (a
    /// benchmark backend).
    pub fn direct_response(self, status: u16, body: &str) -> Self {
        self.direct_response_typed(status, body, "application/json")
    }

    /// [`EnvoyBuilder::direct_response`] with a `content-type` of its own:
    /// `text/event-stream` for a backend that answers a whole stream at once.
    pub fn direct_response_typed(mut self, status: u16, body: &str, content_type: &str) -> Self {
        self.target = RouteTarget::Direct {
            status,
            body: body.to_string(),
            content_type: content_type.to_string(),
        };
        self
    }

    /// Logs each stream to `path` in `format` (Envoy's access-log
    /// substitution format; a newline is added).
    pub fn access_log(mut self, path: impl Into<PathBuf>, format: &str) -> Self {
        self.access_log = Some((path.into(), format.to_string()));
        self
    }

    /// More fields of the HTTP connection manager, YAML at column 0 (its
    /// `tracing`, say).
    pub fn hcm_yaml(mut self, yaml: &str) -> Self {
        self.hcm_yaml = Some(yaml.to_string());
        self
    }

    /// Envoy reads each request whole (a buffer filter) before routing it.
    /// A [`EnvoyBuilder::direct_response`] backend that answers at the
    /// headers leaves the sender a request body it can no longer send, and
    /// the sender closes the connection: this keeps it reusable.
    pub fn read_body_first(mut self) -> Self {
        self.read_body_first = true;
        self
    }

    /// HTTP filters before the filter (each a `- name: …` list item at
    /// column 0), as Envoy's `jwt_authn` goes before it.
    pub fn filters_before(mut self, yaml: &str) -> Self {
        self.filters_before = Some(yaml.to_string());
        self
    }

    /// Envoy's `-l` level, `info` by default.
    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = level.to_string();
        self
    }

    /// Envoy's `--component-log-level`, e.g. `wasm:debug`.
    pub fn component_log_level(mut self, levels: &str) -> Self {
        self.component_log_level = Some(levels.to_string());
        self
    }

    /// Overrides the Envoy binary.
    pub fn envoy_bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.envoy_bin = path.into();
        self
    }

    /// Overrides the filter module.
    pub fn wasm_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.wasm_path = path.into();
        self
    }

    /// The bootstrap YAML this builder starts Envoy with.
    pub fn config_yaml(&self) -> String {
        self.config_yaml_in(Path::new("."))
    }

    /// The bootstrap YAML, with the discovered filter config (if any) read
    /// from `dir`.
    fn config_yaml_in(&self, dir: &Path) -> String {
        let mut yaml = String::new();
        yaml.push_str("admin:\n  address: {socket_address: {address: 127.0.0.1, port_value: 0}}\n");
        // Histograms reach /stats/prometheus on flush; keep tests waiting briefly.
        yaml.push_str("stats_flush_interval: 1s\n");
        if self.ecds || self.node {
            // Config sources other than the bootstrap need a node identity.
            yaml.push_str("node: {id: llm-filter-e2e, cluster: llm-filter-e2e}\n");
        }
        yaml.push_str(&stats_config_yaml());
        let mut head = match &self.virtual_host_yaml {
            Some(extra) => LISTENER_HEAD.replace(
                "              routes:\n",
                &format!("{}              routes:\n", indent(extra, 14)),
            ),
            None => LISTENER_HEAD.to_string(),
        };
        if let Some((path, format)) = &self.access_log {
            let log = format!(
                "          access_log:\n          - name: envoy.access_loggers.file\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog\n              path: {}\n              log_format: {{text_format_source: {{inline_string: {}}}}}\n",
                yaml_string(&path.to_string_lossy()),
                yaml_string(&format!("{format}\n")),
            );
            head = head.replace(
                "          codec_type: AUTO\n",
                &format!("          codec_type: AUTO\n{log}"),
            );
        }
        if let Some(extra) = &self.hcm_yaml {
            head = head.replace(
                "          codec_type: AUTO\n",
                &format!("          codec_type: AUTO\n{}", indent(extra, 10)),
            );
        }
        yaml.push_str(&head);
        yaml.push_str(&indent(&self.route_yaml(), 16));
        yaml.push_str("          http_filters:\n");
        if let Some(before) = &self.filters_before {
            yaml.push_str(&indent(before, 10));
        }
        if self.filter && self.ecds {
            let filter = ECDS_FILTER
                .replace("{name}", FILTER_NAME)
                .replace("{path}", &yaml_string(&ecds_path(dir).to_string_lossy()))
                .replace("{dir}", &yaml_string(&dir.to_string_lossy()));
            yaml.push_str(&filter);
        } else if self.filter {
            yaml.push_str("          - name: envoy.filters.http.wasm\n            typed_config:\n");
            yaml.push_str(&indent(
                &wasm_typed_config(&self.wasm_path, &self.plugin_config),
                14,
            ));
        }
        if self.read_body_first {
            yaml.push_str(BUFFER_FILTER);
        }
        yaml.push_str(ROUTER_FILTER);
        yaml.push_str("  clusters:");
        if self.upstreams.is_empty() {
            yaml.push_str(" []\n");
        } else {
            yaml.push('\n');
            for u in &self.upstreams {
                yaml.push_str(&u.cluster_yaml());
            }
        }
        yaml
    }

    /// The route entries (`match` plus action) at column 0.
    fn route_yaml(&self) -> String {
        let (Some(header), RouteTarget::Upstream) = (&self.header_route, &self.target) else {
            return self.default_route_yaml();
        };
        let mut route = format!(
            "- match: {{prefix: \"/\", headers: [{{name: {}, present_match: true}}]}}\n  route:\n",
            yaml_string(header)
        );
        let _ = writeln!(route, "    cluster_header: {}", yaml_string(header));
        self.push_route_settings(&mut route);
        route.push_str(&self.default_route_yaml());
        route
    }

    fn push_route_settings(&self, route: &mut String) {
        if let Some(ms) = self.route_timeout_ms {
            let _ = writeln!(route, "    timeout: {}s", ms as f64 / 1000.0);
        }
        if let Some(extra) = &self.extra_route_yaml {
            route.push_str(&indent(extra, 4));
        }
    }

    /// The catch-all route entry at column 0.
    fn default_route_yaml(&self) -> String {
        let mut route = String::from("- match: {prefix: \"/\"}\n");
        match &self.target {
            RouteTarget::Direct {
                status,
                body,
                content_type,
            } => {
                let _ = write!(
                    route,
                    "  direct_response:\n    status: {status}\n    body: {{inline_string: {}}}\n",
                    yaml_string(body)
                );
                // Answers look like a provider's: its content type, not Envoy's
                // default text/plain.
                let _ = write!(
                    route,
                    "  response_headers_to_add:\n  - header: {{key: content-type, value: {}}}\n    append_action: OVERWRITE_IF_EXISTS_OR_ADD\n",
                    yaml_string(content_type)
                );
            }
            RouteTarget::Upstream => {
                route.push_str("  route:\n");
                match (&self.cluster_header, self.upstreams.first()) {
                    (Some(header), _) => {
                        let _ = writeln!(route, "    cluster_header: {}", yaml_string(header));
                    }
                    (None, Some(u)) => {
                        let _ = writeln!(route, "    cluster: {}", yaml_string(&u.name));
                    }
                    // Envoy rejects a route to no cluster; a header nobody sends keeps it valid.
                    (None, None) => {
                        let _ = writeln!(route, "    cluster_header: {DEFAULT_CLUSTER_HEADER}");
                    }
                }
                self.push_route_settings(&mut route);
            }
        }
        route
    }

    /// Writes the config into a temp dir, starts Envoy and waits until `/ready`
    /// answers 200 (30 s deadline). Errors carry the tail of Envoy's log.
    pub fn start(&self) -> Result<Envoy> {
        if !self.envoy_bin.is_file() {
            bail!("envoy binary not found at {}", self.envoy_bin.display());
        }
        if self.filter && !self.wasm_path.is_file() {
            bail!(
                "filter module not found at {} (build it with `cargo build -p llm-filter --target wasm32-wasip1 --release`, or set LLM_FILTER_WASM)",
                self.wasm_path.display()
            );
        }
        let dir = temp_dir()?;
        if self.ecds {
            write_ecds(dir.path(), &self.wasm_path, &self.plugin_config)?;
        }
        let config = match &self.bootstrap {
            Some(yaml) => yaml.clone(),
            None => self.config_yaml_in(dir.path()),
        };
        self.start_config_in(dir, &config)
    }

    /// Starts Envoy with a whole config written elsewhere (an Istio-shaped
    /// one, say) in `dir`, which may already hold files the config names; the
    /// builder's binary, concurrency and log levels apply, and readiness is
    /// awaited as for [`EnvoyBuilder::start`]. The listener is the first one.
    pub fn start_config_in(&self, dir: tempfile::TempDir, config: &str) -> Result<Envoy> {
        if !self.envoy_bin.is_file() {
            bail!("envoy binary not found at {}", self.envoy_bin.display());
        }
        let config_path = dir.path().join("envoy.yaml");
        let admin_path = dir.path().join("admin-address");
        let log_path = dir.path().join("envoy.log");
        std::fs::write(&config_path, config).context("write envoy.yaml")?;
        let log = std::fs::File::create(&log_path).context("create envoy.log")?;
        let mut command = Command::new(&self.envoy_bin);
        if self.bootstrap.is_some() {
            command.current_dir(workspace_root());
        }
        command
            .arg("-c")
            .arg(&config_path)
            .arg("--concurrency")
            .arg(self.concurrency.to_string())
            // No hot restart: no shared memory, so parallel Envoys never collide
            // on a base id and no shared-memory file is left behind.
            .arg("--disable-hot-restart")
            // Access logs reach their file within 0.2 s, not Envoy's 10 s.
            .arg("--file-flush-interval-msec")
            .arg("200")
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("-l")
            .arg(&self.log_level);
        if let Some(levels) = &self.component_log_level {
            command.arg("--component-log-level").arg(levels);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("clone log handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", self.envoy_bin.display()))?;
        let mut envoy = Envoy {
            child: Some(child),
            dir,
            wasm_path: self.wasm_path.clone(),
            log_path,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        match envoy.wait_ready(&admin_path) {
            Ok(()) => Ok(envoy),
            Err(e) => Err(anyhow!(
                "envoy did not become ready: {e:#}\n--- envoy log (tail) ---\n{}",
                envoy.log_tail(60)
            )),
        }
    }
}

/// A temp dir for one Envoy's files, removed on drop.
pub fn temp_dir() -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("llm-filter-e2e-")
        .tempdir()
        .context("temp dir")
}

/// Holds each request until its body is complete (at most 1 MiB).
const BUFFER_FILTER: &str = r#"          - name: envoy.filters.http.buffer
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
              max_request_bytes: 1048576
"#;

const LISTENER_HEAD: &str = r#"static_resources:
  listeners:
  - name: ingress
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          codec_type: AUTO
          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
"#;

/// The filter's Wasm config at column 0, for the listener or for discovery.
const WASM_TYPED_CONFIG: &str = r#""@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
config:
  name: {name}
  root_id: {name}
  allow_on_headers_stop_iteration: true
  fail_open: false
  vm_config:
    vm_id: {name}
    runtime: envoy.wasm.runtime.v8
    code: {local: {filename: {wasm}}}
  configuration:
    "@type": type.googleapis.com/google.protobuf.StringValue
    value: {config}
"#;

/// The filter's typed config for the module at `wasm` with `config`.
fn wasm_typed_config(wasm: &Path, config: &str) -> String {
    WASM_TYPED_CONFIG
        .replace("{name}", FILTER_NAME)
        .replace("{wasm}", &yaml_string(&wasm.to_string_lossy()))
        .replace("{config}", &yaml_string(config))
}

/// The filter, its config discovered from a watched file (ECDS).
const ECDS_FILTER: &str = r#"          - name: {name}
            config_discovery:
              config_source:
                path_config_source:
                  path: {path}
                  watched_directory: {path: {dir}}
              type_urls: ["type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"]
"#;

/// The head of the discovery response Envoy reads the filter's config from.
const ECDS_RESOURCE: &str = r#"resources:
- "@type": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig
  name: {name}
  typed_config:
"#;

fn ecds_path(dir: &Path) -> PathBuf {
    dir.join("ecds.yaml")
}

/// Writes the discovery file for `config` in `dir`, replacing it at once (a
/// rename in the watched directory), so Envoy never reads half a file.
fn write_ecds(dir: &Path, wasm: &Path, config: &str) -> Result<()> {
    let body =
        ECDS_RESOURCE.replace("{name}", FILTER_NAME) + &indent(&wasm_typed_config(wasm, config), 4);
    let staged = dir.join(".ecds.yaml.new");
    std::fs::write(&staged, body).context("write the discovered config")?;
    std::fs::rename(&staged, ecds_path(dir)).context("move the discovered config in place")
}

const ROUTER_FILTER: &str = r#"          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#;

/// A cluster of the generated bootstrap.
#[derive(Debug, Clone)]
struct Upstream {
    name: String,
    ports: Vec<u16>,
    /// More of the cluster, at column 0.
    yaml: String,
}

impl Upstream {
    /// The cluster's entry under `clusters:`.
    fn cluster_yaml(&self) -> String {
        let mut out = CLUSTER.replace("{name}", &yaml_string(&self.name));
        for port in &self.ports {
            out.push_str(&ENDPOINT.replace("{port}", &port.to_string()));
        }
        out.push_str(&indent(&self.yaml, 4));
        out
    }
}

const CLUSTER: &str = r#"  - name: {name}
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
"#;

const ENDPOINT: &str = r#"        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: {port}}}}
"#;

/// Prefixes every non-empty line with `spaces` spaces; ends with a newline.
fn indent(text: &str, spaces: usize) -> String {
    let pad = " ".repeat(spaces);
    let mut out = String::new();
    for line in text.lines() {
        if !line.trim().is_empty() {
            out.push_str(&pad);
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
fn yaml_string(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A running Envoy; killed by pid and reaped on drop.
pub struct Envoy {
    child: Option<Child>,
    dir: tempfile::TempDir,
    wasm_path: PathBuf,
    log_path: PathBuf,
    admin: SocketAddr,
    listener: SocketAddr,
}

impl Envoy {
    fn wait_ready(&mut self, admin_path: &Path) -> Result<()> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().context("poll envoy")? {
                    bail!("envoy exited with {status}");
                }
            }
            if self.admin.port() == 0 {
                if let Ok(text) = std::fs::read_to_string(admin_path) {
                    if let Ok(addr) = text.trim().parse() {
                        self.admin = addr;
                    }
                }
            }
            if self.admin.port() != 0 {
                if let Ok((200, _)) = http_request(self.admin, "GET", "/ready") {
                    self.listener = self.find_listener()?;
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                bail!("not ready after {READY_DEADLINE:?}");
            }
            // Fine enough for `make bench-load` to time a start by.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Port 0 was bound by Envoy itself (no race); read the real one back.
    fn find_listener(&self) -> Result<SocketAddr> {
        let (_, body) = http_request(self.admin, "GET", "/listeners?format=json")?;
        let listeners: Value = serde_json::from_str(&body).context("parse /listeners")?;
        let socket = listeners
            .pointer("/listener_statuses/0/local_address/socket_address")
            .ok_or_else(|| anyhow!("no listener in {body}"))?;
        let address = socket
            .get("address")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("no listener address in {body}"))?;
        let port = socket
            .get("port_value")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| anyhow!("no listener port in {body}"))?;
        Ok(SocketAddr::new(address.parse()?, port))
    }

    /// Envoy's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Envoy's resident memory (`VmRSS`), kB; `None` once it has exited.
    pub fn rss_kb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Listener port.
    pub fn port(&self) -> u16 {
        self.listener.port()
    }

    /// Admin port.
    pub fn admin_port(&self) -> u16 {
        self.admin.port()
    }

    /// URL of `path` on the listener, e.g. `url("/v1/chat/completions")`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listener, path)
    }

    /// URL of `path` on the admin interface.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// The temp dir holding `envoy.yaml` and `envoy.log` (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// GET on the admin interface: status and body.
    pub fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        http_request(self.admin, "GET", path)
    }

    /// POST on the admin interface (e.g. `/reset_counters`): status and body.
    pub fn admin_post(&self, path: &str) -> Result<(u16, String)> {
        http_request(self.admin, "POST", path)
    }

    /// Counters and gauges by full stat name (histograms left out).
    pub fn stats(&self) -> Result<HashMap<String, u64>> {
        let (status, body) = self.admin_get("/stats?format=json")?;
        if status != 200 {
            bail!("/stats answered {status}: {body}");
        }
        parse_stats_json(&body)
    }

    /// Delivers a new filter configuration by extension config discovery
    /// (the Envoy was built with [`EnvoyBuilder::discovered_config`]): the
    /// file Envoy watches is replaced at once, and this waits until Envoy
    /// took the new config (or refused it: an error).
    pub fn reload_plugin_config(&self, config: impl std::fmt::Display) -> Result<()> {
        let failures = format!("extension_config_discovery.http_filter.{FILTER_NAME}.config_fail");
        let (before, failed_before) = (self.plugin_reloads(), self.stat(&failures));
        self.push_plugin(&self.wasm_path, config)?;
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if self.plugin_reloads() > before {
                return Ok(());
            }
            if self.stat(&failures) > failed_before {
                bail!("envoy refused the new config\n{}", self.log_tail(40));
            }
            if Instant::now() > deadline {
                bail!("envoy did not take the new config\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Delivers the module `wasm` with the filter configuration `config` by
    /// extension config discovery, as [`Envoy::reload_plugin_config`] does,
    /// without waiting for Envoy to take it (`make bench-load` times that).
    pub fn push_plugin(&self, wasm: &Path, config: impl std::fmt::Display) -> Result<()> {
        write_ecds(self.dir.path(), wasm, &config.to_string())
    }

    /// The filter configurations Envoy took by discovery so far.
    pub fn plugin_reloads(&self) -> u64 {
        self.stat(&format!(
            "extension_config_discovery.http_filter.{FILTER_NAME}.config_reload"
        ))
    }

    /// CPU time Envoy's threads have used so far, in nanoseconds (the sum
    /// of each thread's `schedstat`); `None` once it has exited.
    pub fn cpu_ns(&self) -> Option<u64> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid()?)).ok()?;
        let used = tasks.filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        });
        Some(used.sum())
    }

    /// One counter or gauge; 0 when it does not exist (yet) or admin fails.
    pub fn stat(&self, name: &str) -> u64 {
        self.stat_opt(name).unwrap_or(0)
    }

    /// One counter or gauge, `None` when it does not exist.
    pub fn stat_opt(&self, name: &str) -> Option<u64> {
        self.stats().ok()?.get(name).copied()
    }

    /// Stats whose name contains `pattern`, sorted by name (handy in assertion messages).
    pub fn stats_matching(&self, pattern: &str) -> Vec<(String, u64)> {
        let mut stats: Vec<(String, u64)> = self
            .stats()
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| name.contains(pattern))
            .collect();
        stats.sort();
        stats
    }

    /// Polls until `stat(name) >= min` or `timeout` passes; returns the last value.
    pub fn wait_for_stat(&self, name: &str, min: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.stat(name);
            if value >= min || Instant::now() >= deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The Prometheus exposition from `/stats/prometheus`.
    pub fn prometheus(&self) -> Result<String> {
        let (status, body) = self.admin_get("/stats/prometheus")?;
        if status != 200 {
            bail!("/stats/prometheus answered {status}: {body}");
        }
        Ok(body)
    }

    /// The sum of the samples of `/stats/prometheus` named `name` that carry
    /// `labels` (0 when there are none or admin fails).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        crate::prometheus::sum(&self.metrics(), name, labels)
    }

    /// The samples of `/stats/prometheus` (empty when admin fails).
    pub fn metrics(&self) -> Vec<crate::prometheus::Sample> {
        self.prometheus()
            .map(|text| crate::prometheus::parse(&text))
            .unwrap_or_default()
    }

    /// Polls `/stats/prometheus` until the samples named `name` with `labels` sum
    /// to at least `min` or `timeout` passes; returns the last sum. Counters move
    /// when Envoy logs a stream, just after its last byte; histograms show after a
    /// stats flush.
    pub fn wait_for_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        min: f64,
        timeout: Duration,
    ) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let value = crate::prometheus::sum(&self.metrics(), name, labels);
            if value >= min || Instant::now() >= deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything Envoy logged so far.
    pub fn log_contents(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log_contents();
        let all: Vec<&str> = log.lines().collect();
        let from = all.len().saturating_sub(lines);
        all.get(from..).unwrap_or_default().join("\n")
    }

    /// Whether Envoy is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Kills Envoy (by pid) and waits for it; also done on drop.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Parses admin `/stats?format=json`: `{"stats":[{"name":..,"value":..},..,{"histograms":..}]}`.
pub fn parse_stats_json(body: &str) -> Result<HashMap<String, u64>> {
    let parsed: Value = serde_json::from_str(body).context("parse /stats?format=json")?;
    let entries = parsed
        .get("stats")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("no `stats` array"))?;
    Ok(entries
        .iter()
        .filter_map(|entry| {
            let name = entry.get("name")?.as_str()?;
            let value = entry.get("value")?;
            let value = value
                .as_u64()
                .or_else(|| value.as_i64().map(|v| v.max(0) as u64))
                .or_else(|| value.as_f64().map(|v| v.max(0.0) as u64))?;
            Some((name.to_string(), value))
        })
        .collect())
}

/// `envoy/provider.yaml` for the provider at `host:port` as `make run` renders
/// it (`scripts/provider-config.sh`), its certificate checked against the CA
/// bundle `ca` (`None`: the system's).
pub fn provider_bootstrap(host: &str, port: u16, ca: Option<&Path>) -> Result<String> {
    provider_bootstrap_from("envoy/provider.yaml", host, port, ca)
}

/// [`provider_bootstrap`] of another file with the same placeholders
/// (`template`, relative to the workspace root).
pub fn provider_bootstrap_from(
    template: &str,
    host: &str,
    port: u16,
    ca: Option<&Path>,
) -> Result<String> {
    let mut command = Command::new(workspace_root().join("scripts/provider-config.sh"));
    command
        .arg(host)
        .arg(port.to_string())
        .env("PROVIDER_TEMPLATE", template);
    match ca {
        Some(ca) => command.env("PROVIDER_CA", ca),
        None => command.env_remove("PROVIDER_CA"),
    };
    let output = command
        .stdin(Stdio::null())
        .output()
        .context("run scripts/provider-config.sh")?;
    if !output.status.success() {
        bail!(
            "scripts/provider-config.sh failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8(output.stdout).context("provider bootstrap is not UTF-8")
}

/// Runs `envoy --mode validate` on a config text; the error carries Envoy's output.
pub fn validate_config(yaml: &str) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("llm-filter-validate-")
        .tempdir()?;
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, yaml)?;
    validate_config_file(&path)
}

/// Runs `envoy --mode validate -c path` from the workspace root, so relative paths
/// in the config (the demo's wasm module) resolve as they do for `make run`; the
/// error carries Envoy's output.
pub fn validate_config_file(path: &Path) -> Result<()> {
    let output = Command::new(envoy_bin())
        .current_dir(workspace_root())
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(path)
        .arg("--disable-hot-restart")
        .arg("-l")
        .arg("error")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", envoy_bin().display()))?;
    if output.status.success() {
        Ok(())
    } else {
        bail!(
            "envoy --mode validate {} failed ({}):\n{}{}",
            path.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }
}

/// A minimal blocking HTTP/1.1 exchange for the admin API: usable from sync and
/// async tests alike (a blocking reqwest client must not be dropped inside Tokio).
pub(crate) fn http_request(addr: SocketAddr, method: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, ADMIN_TIMEOUT)?;
    stream.set_read_timeout(Some(ADMIN_TIMEOUT))?;
    stream.set_write_timeout(Some(ADMIN_TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP head from {addr}{path}"))?;
    let (head, body) = (raw.get(..split), raw.get(split + 4..));
    let (Some(head), Some(body)) = (head, body) else {
        return Err(anyhow!("no HTTP head from {addr}{path}"));
    };
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line from {addr}{path}"))?;
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunk size"))?;
        let size_text = String::from_utf8_lossy(data.get(..line_end).unwrap_or_default());
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        data = data.get(line_end + 2..).unwrap_or_default();
        if size == 0 {
            return Ok(out);
        }
        let chunk = data.get(..size).ok_or_else(|| anyhow!("truncated chunk"))?;
        out.extend_from_slice(chunk);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_and_gauges_skipping_histograms() {
        let body = r#"{"stats":[
            {"name":"cluster.a.upstream_rq_200","value":3},
            {"name":"server.live","value":1},
            {"histograms":{"supported_quantiles":[0.5],"computed_quantiles":[]}}
        ]}"#;
        let stats = parse_stats_json(body).unwrap();
        assert_eq!(stats.len(), 2);
        assert_eq!(stats["cluster.a.upstream_rq_200"], 3);
        assert!(parse_stats_json("[]").is_err());
    }

    #[test]
    fn dechunks_bodies() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"zz\r\n").is_err());
        assert!(dechunk(b"5\r\nab").is_err());
    }

    #[test]
    fn reads_a_top_level_block() {
        let yaml =
            "a: 1\nstats_config:\n  # why\n  x: 1\n\n  y:\n  - z\nstatic_resources:\n  b: 2\n";
        assert_eq!(
            top_level_block(yaml, "stats_config"),
            "stats_config:\n  # why\n  x: 1\n\n  y:\n  - z\n"
        );
        assert_eq!(top_level_block(yaml, "stats"), "");
        assert_eq!(top_level_block(yaml, "missing"), "");
    }

    #[test]
    fn reads_stats_tag_rules_in_block_and_flow_style() {
        let block = "stats_tags:\n- tag_name: priority\n  regex: '(\\.priority\\.([^.]+))'\n";
        let flow = "  - { tag_name: priority, regex: '(\\.priority\\.([^.]+))' }\n";
        let want = vec![("priority".to_string(), r"(\.priority\.([^.]+))".to_string())];
        assert_eq!(stats_tag_rules(block), want);
        assert_eq!(stats_tag_rules(flow), want);
    }

    #[test]
    fn generated_stats_config_is_the_demo_one() {
        let block = stats_config_yaml();
        assert!(block.starts_with("stats_config:\n"), "{block}");
        assert!(block.contains("use_all_default_tags: true"), "{block}");
        let rules = stats_tag_rules(&block);
        for label in ["priority", "model", "outcome", "token_type"] {
            assert!(rules.iter().any(|(name, _)| name == label), "{rules:?}");
        }
        let yaml = EnvoyBuilder::new().upstream("x", 1).config_yaml();
        assert!(yaml.contains(&block), "{yaml}");
    }

    #[test]
    fn header_route_precedes_the_default_route() {
        let yaml = EnvoyBuilder::new()
            .no_filter()
            .upstream("default", 1)
            .upstream("a", 2)
            .header_route("x-llm-cluster")
            .route_timeout_ms(2000)
            .route_yaml();
        assert_eq!(
            yaml,
            "- match: {prefix: \"/\", headers: [{name: \"x-llm-cluster\", present_match: true}]}\n  \
             route:\n    cluster_header: \"x-llm-cluster\"\n    timeout: 2s\n\
             - match: {prefix: \"/\"}\n  route:\n    cluster: \"default\"\n    timeout: 2s\n"
        );
    }

    #[test]
    fn a_direct_response_carries_its_content_type() {
        let json = EnvoyBuilder::new().direct_response(200, "{}").route_yaml();
        assert!(
            json.contains("{key: content-type, value: \"application/json\"}"),
            "{json}"
        );
        let sse = EnvoyBuilder::new()
            .direct_response_typed(200, "data: {}\n\n", "text/event-stream")
            .route_yaml();
        assert!(
            sse.contains("{key: content-type, value: \"text/event-stream\"}"),
            "{sse}"
        );
        assert!(sse.contains("inline_string: \"data: {}\\n\\n\""), "{sse}");
    }

    #[test]
    fn indents_non_empty_lines() {
        assert_eq!(indent("a:\n  b: 1\n\nc", 2), "  a:\n    b: 1\n\n  c\n");
    }

    #[test]
    fn config_embeds_plugin_json_as_one_string() {
        let yaml = EnvoyBuilder::new()
            .wasm_path("/f.wasm")
            .plugin_config(serde_json::json!({"a": "quote \" and\nnewline"}))
            .upstream("first", 1)
            .upstream("second", 2)
            .config_yaml();
        assert!(
            yaml.contains(r#"value: "{\"a\":\"quote \\\" and\\nnewline\"}""#),
            "{yaml}"
        );
        assert!(yaml.contains("cluster: \"first\""));
        assert!(yaml.contains("port_value: 2}"));
        assert!(yaml.contains("envoy.filters.http.wasm"));

        let plain = EnvoyBuilder::new()
            .no_filter()
            .upstream("x", 1)
            .config_yaml();
        assert!(!plain.contains("envoy.filters.http.wasm"));
        let routed = EnvoyBuilder::new()
            .no_filter()
            .cluster_header(Some("x-llm-cluster"))
            .route_timeout_ms(1500)
            .extra_route_yaml("retry_policy:\n  num_retries: 2")
            .route_yaml();
        assert_eq!(
            routed,
            "- match: {prefix: \"/\"}\n  route:\n    cluster_header: \"x-llm-cluster\"\n    \
             timeout: 1.5s\n    retry_policy:\n      num_retries: 2\n"
        );
    }
}
