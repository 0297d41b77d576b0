//! A real istiod (`pilot-discovery`, built from Istio's source by `make
//! tools-istiod`) run without Kubernetes: file mode on loopback, the config
//! read from a folder of manifests, plaintext xDS, no CA. Envoys connect to
//! it over ADS with a bootstrap of ours as a sidecar node or as the egress
//! gateway node; what istiod generated is read back from Envoy's config dump
//! and istiod's debug endpoints.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::daemon::free_port;
use crate::envoy::http_request;
use crate::istio::merge;
use crate::{running_in_ci, skip_without_envoy};

/// Where `make tools-istiod` put `pilot-discovery` (the Makefile exports it).
pub const BIN_ENV: &str = "PILOT_DISCOVERY_BIN";

/// Where `make tools-istiod` put `istio-bootstrap` (tests/istio-bootstrap:
/// the bootstrap Istio's agent writes, by the agent's own code) and the
/// bootstrap template of the same Istio source.
pub const AGENT_BOOTSTRAP_BIN_ENV: &str = "ISTIO_BOOTSTRAP_BIN";
pub const AGENT_BOOTSTRAP_TEMPLATE_ENV: &str = "ISTIO_BOOTSTRAP_TEMPLATE";

/// The Envoy bootstrap Istio's agent (pilot-agent) writes for `node` when
/// the mesh config is `mesh`: `ConstructProxyConfig`, `GetNodeMetaData` and
/// Istio's template rendered by Istio's own code, built from the same source
/// as istiod.
pub fn agent_bootstrap(mesh: &str, node: &Node) -> Result<Value> {
    let var = |name: &str| {
        std::env::var_os(name).map(PathBuf::from).ok_or_else(|| {
            anyhow!("{name} unset: `make tools-istiod` builds istio-bootstrap and sets it")
        })
    };
    let (bin, template) = (
        var(AGENT_BOOTSTRAP_BIN_ENV)?,
        var(AGENT_BOOTSTRAP_TEMPLATE_ENV)?,
    );
    let dir = tempfile::Builder::new()
        .prefix("llm-filter-e2e-agent-")
        .tempdir()?;
    let (mesh_path, out) = (
        dir.path().join("mesh.yaml"),
        dir.path().join("bootstrap.json"),
    );
    std::fs::write(&mesh_path, mesh)?;
    let run = Command::new(&bin)
        .arg(&mesh_path)
        .arg(&template)
        .arg(&node.id)
        .arg(&node.ip)
        .arg(&out)
        // It reads pod annotations and writes nothing else under here.
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    if !run.status.success() {
        bail!(
            "{} failed: {}\n{}",
            bin.display(),
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let text = std::fs::read_to_string(&out)?;
    serde_json::from_str(&text).with_context(|| format!("the agent's bootstrap: {text}"))
}

/// The Istio version the test nodes announce (`ISTIO_VERSION` metadata):
/// the release the pinned istiod is built from.
pub const PROXY_ISTIO_VERSION: &str = "1.31.0";

/// Whether a test that runs istiod skips. Under `make test` (which exports
/// [`BIN_ENV`]) or CI a missing binary fails the test; elsewhere, with no
/// [`BIN_ENV`], the test skips with the reason printed.
pub fn skip_without_istiod(test: &str) -> Option<PathBuf> {
    if skip_without_envoy(test) {
        return None;
    }
    match std::env::var_os(BIN_ENV).map(PathBuf::from) {
        Some(bin) => {
            assert!(
                bin.is_file(),
                "{test}: no istiod at {} ({BIN_ENV}); `make tools-istiod` builds it",
                bin.display()
            );
            Some(bin)
        }
        None => {
            assert!(
                !running_in_ci(),
                "{test}: {BIN_ENV} unset under CI; `make test` builds istiod and sets it"
            );
            eprintln!("SKIP {test}: no {BIN_ENV}; `make tools-istiod` builds istiod");
            None
        }
    }
}

/// Holds the fixed ports the nodes istiod generates bind (a sidecar's
/// outbound `127.0.0.1:80`, the gateway's `0.0.0.0:8080`) for one test at a
/// time, across every test process of the machine.
pub struct PortLock(#[allow(dead_code)] File);

impl PortLock {
    pub fn acquire() -> Result<Self> {
        let path = std::env::temp_dir().join("llm-filter-e2e-istiod.lock");
        let file = File::create(&path).with_context(|| format!("create {}", path.display()))?;
        file.lock().context("lock the istiod ports")?;
        Ok(Self(file))
    }
}

/// A running istiod; killed by pid and reaped on drop.
pub struct Istiod {
    child: Option<Child>,
    dir: tempfile::TempDir,
    grpc_port: u16,
    monitoring: SocketAddr,
}

impl Istiod {
    /// Starts `bin` in file mode on the manifests `config` (file name, YAML
    /// text) with mesh config `mesh`, and waits until it is ready. Up to
    /// three tries, each on fresh ports: one whose port another process
    /// took first, or that never computed the endpoints its ServiceEntries
    /// list, is stopped and started again.
    pub fn start(bin: &Path, config: &[(String, String)], mesh: &str) -> Result<Self> {
        let listed = hosts_with_endpoints(config)?;
        let mut tries = Vec::new();
        for _ in 0..3 {
            match Self::start_once(bin, config, mesh, &listed) {
                Ok(istiod) => return Ok(istiod),
                Err(e) => tries.push(format!("{e:#}")),
            }
        }
        bail!(
            "istiod did not start in three tries:\n{}",
            tries.join("\n---\n")
        )
    }

    /// One try of [`Istiod::start`]; ready once it holds the endpoints of
    /// the `listed` hosts too.
    fn start_once(
        bin: &Path,
        config: &[(String, String)],
        mesh: &str,
        listed: &[String],
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("llm-filter-e2e-istiod-")
            .tempdir()?;
        let config_dir = dir.path().join("config");
        std::fs::create_dir(&config_dir)?;
        for (name, text) in config {
            std::fs::write(config_dir.join(name), text)?;
        }
        let mesh_path = dir.path().join("mesh.yaml");
        std::fs::write(&mesh_path, mesh)?;
        let [grpc, http, monitoring, ctrlz] =
            [free_port()?, free_port()?, free_port()?, free_port()?];
        let log = File::create(dir.path().join("istiod.log"))?;
        let child = Command::new(bin)
            .arg("discovery")
            .arg(format!("--configDir={}", config_dir.display()))
            .arg("--registries=")
            .arg(format!("--meshConfig={}", mesh_path.display()))
            .args(["--clusterID=Kubernetes", "--domain=cluster.local"])
            .arg(format!("--grpcAddr=127.0.0.1:{grpc}"))
            .args(["--secureGRPCAddr=", "--httpsAddr="])
            .arg(format!("--httpAddr=127.0.0.1:{http}"))
            .arg(format!("--monitoringAddr=127.0.0.1:{monitoring}"))
            .arg(format!("--ctrlz_port={ctrlz}"))
            .arg("--ctrlz_address=127.0.0.1")
            // It writes under ./var/run and ./etc of where it runs.
            .current_dir(dir.path())
            .env("POD_NAMESPACE", "istio-system")
            .env("ENABLE_CA_SERVER", "false")
            // Istio-only filters upstream Envoy does not have.
            .env("PILOT_ENABLE_METADATA_EXCHANGE", "false")
            .env("PILOT_ENABLE_ALPN_FILTER", "false")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let mut istiod = Self {
            child: Some(child),
            dir,
            grpc_port: grpc,
            monitoring: SocketAddr::from(([127, 0, 0, 1], monitoring)),
        };
        // `/ready` (on `http`) also waits for the injector and validation
        // webhooks, which never start without Kubernetes: wait for the
        // discovery server's own readiness instead, which it logs.
        let _ = http;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = istiod
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("istiod exited with {status}:\n{}", istiod.log_tail(40));
            }
            // Ready once it also holds the endpoints its ServiceEntries
            // list: it marks itself ready before it has computed them, and
            // a proxy that connects meanwhile gets clusters without
            // endpoints (the module server's among them: its Wasm fetch
            // gives up and the filter never loads).
            if !istiod.log_lines("marking server ready").is_empty()
                && std::net::TcpStream::connect(("127.0.0.1", grpc)).is_ok()
                && istiod.holds_endpoints(listed)
            {
                return Ok(istiod);
            }
            if Instant::now() >= deadline {
                bail!(
                    "istiod not ready in 30 s (endpoints of {listed:?}):\n{}",
                    istiod.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether `/debug/endpointz` has endpoints for each of `hosts`.
    fn holds_endpoints(&self, hosts: &[String]) -> bool {
        if hosts.is_empty() {
            return true;
        }
        self.debug("/debug/endpointz").is_ok_and(|all| {
            hosts
                .iter()
                .all(|h| all.get(h).is_some_and(|e| !e.is_null()))
        })
    }

    /// Replaces the manifests of `name` in its config folder, as one rename
    /// (istiod watches the folder and pushes what changed, as a `kubectl
    /// apply` would have it).
    pub fn write_config(&self, name: &str, text: &str) -> Result<()> {
        let config_dir = self.dir.path().join("config");
        // Not a .yaml name: istiod reads no half-written file.
        let staged = self.dir.path().join(format!("{name}.staged"));
        std::fs::write(&staged, text)?;
        std::fs::rename(&staged, config_dir.join(name))?;
        Ok(())
    }

    /// Its plaintext xDS port on 127.0.0.1.
    pub fn grpc_port(&self) -> u16 {
        self.grpc_port
    }

    /// A debug endpoint (`/debug/syncz`, `/debug/configz`, ...) as JSON.
    pub fn debug(&self, path: &str) -> Result<Value> {
        let (status, body) = http_request(self.monitoring, "GET", path)?;
        if status != 200 {
            bail!("istiod {path}: {status} {body}");
        }
        serde_json::from_str(&body).with_context(|| format!("istiod {path}: {body}"))
    }

    /// Waits until `proxy` has acked everything istiod sent it: a push in
    /// flight (sent, not acked yet) is waited out for up to 20 s, a NACK is
    /// an error at once.
    pub fn settled(&self, proxy: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let syncz = self.debug("/debug/syncz")?;
            match synced(&syncz, proxy) {
                Ok(()) => return Ok(()),
                Err(e) if e.to_string().contains("NACKed") || Instant::now() >= deadline => {
                    return Err(e)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("istiod.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        let skip = all.len().saturating_sub(lines);
        all.into_iter().skip(skip).collect::<Vec<_>>().join("\n")
    }

    /// Every line of its log with `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("istiod.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Istiod {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A proxy of the mesh as it introduces itself to istiod.
#[derive(Debug, Clone)]
pub struct Node {
    /// `sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local` or `router~...`.
    pub id: String,
    pub namespace: String,
    pub labels: Value,
    pub ip: String,
    /// `NONE` for a sidecar without iptables: its outbound listeners bind
    /// 127.0.0.1:<service port>. Gateways always bind their ports.
    pub interception: Option<&'static str>,
}

impl Node {
    /// The name istiod's debug endpoints give it: `<pod>.<namespace>`.
    pub fn proxy_id(&self) -> &str {
        self.id.split('~').nth(2).unwrap_or(&self.id)
    }

    /// A sidecar of `my-app` labelled `llm-filter: enabled`, as the examples select it.
    pub fn sidecar() -> Self {
        Self {
            id: "sidecar~127.0.0.2~app-0.my-app~my-app.svc.cluster.local".into(),
            namespace: "my-app".into(),
            labels: json!({"app": "my-app", "llm-filter": "enabled"}),
            ip: "127.0.0.2".into(),
            interception: Some("NONE"),
        }
    }

    /// Istio's default egress gateway, `istio: egressgateway` in istio-system.
    pub fn egress_gateway() -> Self {
        Self {
            id:
                "router~127.0.0.3~istio-egressgateway-0.istio-system~istio-system.svc.cluster.local"
                    .into(),
            namespace: "istio-system".into(),
            labels: json!({"app": "istio-egressgateway", "istio": "egressgateway"}),
            ip: "127.0.0.3".into(),
            interception: None,
        }
    }

    /// The Envoy bootstrap of this node: ADS to istiod at `grpc_port`,
    /// `stats_config` (the one of [`agent_bootstrap`], whole) in, admin on a
    /// free port.
    pub fn bootstrap(&self, grpc_port: u16, stats_config: Option<&Value>) -> Result<String> {
        let mut metadata = json!({
            "ISTIO_VERSION": PROXY_ISTIO_VERSION,
            "CLUSTER_ID": "Kubernetes",
            "NAMESPACE": self.namespace,
            "LABELS": self.labels,
            "INSTANCE_IPS": self.ip,
            "SERVICE_ACCOUNT": "default",
        });
        if let (Some(mode), Some(m)) = (self.interception, metadata.as_object_mut()) {
            m.insert("INTERCEPTION_MODE".into(), json!(mode));
        }
        let mut config = json!({
            "node": {"id": self.id, "cluster": format!("{}.{}", self.labels.get("app").and_then(Value::as_str).unwrap_or("app"), self.namespace), "metadata": metadata},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "stats_flush_interval": "1s",
            "dynamic_resources": {
                "ads_config": {"api_type": "GRPC", "transport_api_version": "V3",
                    "set_node_on_first_message_only": true,
                    "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]},
                "cds_config": {"ads": {}, "resource_api_version": "V3"},
                "lds_config": {"ads": {}, "resource_api_version": "V3"}
            },
            "static_resources": {"clusters": [{
                "name": "xds-grpc", "type": "STATIC", "connect_timeout": "1s",
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}},
                "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": grpc_port}}}}]}]}
            }]}
        });
        if let Some(stats) = stats_config {
            merge(&mut config, &json!({"stats_config": stats}));
        }
        Ok(serde_json::to_string_pretty(&config)?)
    }
}

/// `ok` when istiod's `/debug/syncz` shows `proxy` ([`Node::proxy_id`]) connected with every type
/// it was sent acknowledged (no NACK, no error); else what is not.
pub fn synced(syncz: &Value, proxy: &str) -> Result<()> {
    let status = syncz
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|s| s.get("proxy").and_then(Value::as_str) == Some(proxy))
        })
        .ok_or_else(|| anyhow!("{proxy} not connected: {syncz}"))?;
    let resources = status
        .get("resources")
        .and_then(Value::as_object)
        .ok_or_else(|| anyhow!("{proxy}: no resources in {status}"))?;
    for (type_url, r) in resources {
        let error = r.get("lastError").and_then(Value::as_str).unwrap_or("");
        if !error.is_empty() {
            bail!("{proxy}: {type_url} NACKed: {error}");
        }
        let sent = r.get("sent").and_then(Value::as_str).unwrap_or("");
        let acked = r.get("acked").and_then(Value::as_str).unwrap_or("");
        if sent != acked {
            bail!("{proxy}: {type_url} sent {sent:?}, acked {acked:?}");
        }
    }
    Ok(())
}

/// A plain-HTTP file server on 127.0.0.1 answering every GET with one body
/// (the filter's module, fetched by Envoy's remote data source); stops on drop.
pub struct FileServer {
    port: u16,
    stop: Arc<AtomicBool>,
    hits: Arc<std::sync::atomic::AtomicU64>,
}

impl FileServer {
    pub fn start(body: Vec<u8>) -> Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let hits = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stop2, hits2) = (stop.clone(), hits.clone());
        std::thread::spawn(move || {
            use std::io::{BufRead, BufReader, Write};
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                hits2.fetch_add(1, Ordering::SeqCst);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/wasm\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body);
            }
        });
        Ok(Self { port, stop, hits })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many requests it answered.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The hosts of the ServiceEntries in `config` (file name, YAML text) that
/// list endpoints of their own.
fn hosts_with_endpoints(config: &[(String, String)]) -> Result<Vec<String>> {
    let mut hosts = Vec::new();
    for (name, text) in config {
        for doc in crate::istio::parse_manifests(text).with_context(|| format!("parse {name}"))? {
            let spec = doc.get("spec");
            let field = |name: &str| spec.and_then(|s| s.get(name)).and_then(Value::as_array);
            let listed = field("endpoints").is_some_and(|e| !e.is_empty());
            let kind = doc.get("kind").and_then(Value::as_str);
            if kind == Some("ServiceEntry") && listed {
                hosts.extend(
                    field("hosts")
                        .into_iter()
                        .flatten()
                        .filter_map(|h| h.as_str().map(str::to_string)),
                );
            }
        }
    }
    Ok(hosts)
}
