//! Istio's agent (`pilot-agent`, built from the same Istio source as istiod
//! by `make tools-istiod`) run as a sidecar's agent without Kubernetes: the
//! environment the sidecar injector would give the `istio-proxy` container
//! (PROXY_CONFIG, ISTIO_META_*, the pod's name, namespace and IP), the
//! container's file layout under a temp folder it runs in (mesh config,
//! bootstrap template), plaintext xDS to istiod, no CA. It writes the Envoy
//! bootstrap, starts Envoy, proxies its xDS (turning an `oci://` module into
//! a local file) and serves its SDS.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::daemon::free_port;
use crate::envoy::{envoy_bin, http_request, parse_stats_json};
use crate::istiod::{Node, AGENT_BOOTSTRAP_TEMPLATE_ENV};
use crate::running_in_ci;

/// Where `make tools-istiod` put `pilot-agent` (the Makefile exports it).
pub const BIN_ENV: &str = "PILOT_AGENT_BIN";

/// Where the agent keeps the modules it pulls: Istio's constant
/// (`constants.IstioDataDir`), an emptyDir of the pod in Kubernetes; the
/// agent makes a folder per module in it but not the folder itself.
pub const WASM_DATA_DIR: &str = "/var/lib/istio/data";

/// `pilot-agent`, or `None` (the test skips) outside `make test` and CI,
/// which set [`BIN_ENV`]; there a missing binary fails the test.
pub fn agent_bin(test: &str) -> Option<PathBuf> {
    match std::env::var_os(BIN_ENV).map(PathBuf::from) {
        Some(bin) => {
            assert!(
                bin.is_file(),
                "{test}: no pilot-agent at {} ({BIN_ENV}); `make tools-istiod` builds it",
                bin.display()
            );
            Some(bin)
        }
        None => {
            assert!(
                !running_in_ci(),
                "{test}: {BIN_ENV} unset under CI; `make test` builds pilot-agent and sets it"
            );
            eprintln!("SKIP {test}: no {BIN_ENV}; `make tools-istiod` builds pilot-agent");
            None
        }
    }
}

/// Where the agent reads a workload certificate mounted as files (Istio's
/// `security.DefaultCertChainFilePath` and its siblings, relative to where it
/// runs): the chain, its key and the mesh's root, served to Envoy by SDS as
/// `default` and `ROOTCA`, the names istiod's mTLS settings ask for.
pub const WORKLOAD_CERT_FILES: [&str; 3] = [
    "etc/certs/cert-chain.pem",
    "etc/certs/key.pem",
    "etc/certs/root-cert.pem",
];

/// A running agent and the Envoy it started; both killed (the agent's
/// process group, by its id) on drop, and the modules it pulled removed.
pub struct PilotAgent {
    child: Option<Child>,
    dir: tempfile::TempDir,
    admin: SocketAddr,
    /// Envoy's Prometheus listener (15090 in a pod), what the mesh's
    /// Prometheus scrapes.
    prometheus: u16,
    config_path: PathBuf,
    data_dir: DataDir,
}

impl PilotAgent {
    /// Starts `bin` as the agent of `node` (a sidecar or a gateway) with
    /// istiod's plaintext xDS at `discovery_port` and the mesh config `mesh`
    /// (mounted where Istio mounts it), `env` added to what the injector
    /// sets, and waits until its Envoy is ready (the agent's readiness probe).
    pub fn start(
        bin: &Path,
        node: &Node,
        discovery_port: u16,
        mesh: &str,
        env: &[(&str, String)],
    ) -> Result<Self> {
        Self::start_with_files(bin, node, discovery_port, mesh, env, &[])
    }

    /// [`PilotAgent::start`] with `files` (path relative to the container's
    /// root, contents) laid into the container first: e.g. the workload
    /// certificate the agent serves by SDS when mounted as files
    /// ([`WORKLOAD_CERT_FILES`]).
    pub fn start_with_files(
        bin: &Path,
        node: &Node,
        discovery_port: u16,
        mesh: &str,
        env: &[(&str, String)],
        files: &[(&str, &str)],
    ) -> Result<Self> {
        let template = std::env::var_os(AGENT_BOOTSTRAP_TEMPLATE_ENV)
            .map(PathBuf::from)
            .ok_or_else(|| {
                anyhow!("{AGENT_BOOTSTRAP_TEMPLATE_ENV} unset: `make tools-istiod` sets it")
            })?;
        let dir = tempfile::Builder::new()
            .prefix("llm-filter-e2e-pilot-agent-")
            .tempdir()?;
        // The istio-proxy container's files, relative to where it runs.
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc/istio/config"))?;
        std::fs::write(root.join("etc/istio/config/mesh"), mesh)?;
        std::fs::create_dir_all(root.join("var/lib/istio/envoy"))?;
        std::fs::copy(
            &template,
            root.join("var/lib/istio/envoy/envoy_bootstrap_tmpl.json"),
        )
        .with_context(|| format!("copy {}", template.display()))?;
        let config_path = root.join("etc/istio/proxy");
        std::fs::create_dir_all(&config_path)?;
        for (path, contents) in files {
            let path = root.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, contents).with_context(|| format!("write {}", path.display()))?;
        }

        let mut parts = node.id.split('~');
        let (Some(kind), Some(ip), Some(pod_ns)) = (parts.next(), parts.next(), parts.next())
        else {
            bail!("node id {}: not <type>~<ip>~<pod>.<ns>~<domain>", node.id);
        };
        let pod = pod_ns.split_once('.').map_or(pod_ns, |(pod, _)| pod);
        let [admin, status, envoy_status, prometheus] =
            [free_port()?, free_port()?, free_port()?, free_port()?];
        let proxy_config = json!({
            "discoveryAddress": format!("127.0.0.1:{discovery_port}"),
            // Plaintext to istiod: no istiod certificate to check without a CA.
            "controlPlaneAuthPolicy": "NONE",
            "binaryPath": envoy_bin(),
            "configPath": config_path,
            "proxyAdminPort": admin,
            "statusPort": status,
            "concurrency": 2,
        });
        let data_dir = DataDir::prepare()?;
        let log = File::create(root.join("agent.log"))?;
        let mut command = Command::new(bin);
        command
            .args(["proxy", kind])
            .current_dir(root)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PROXY_CONFIG", proxy_config.to_string())
            .env("POD_NAME", pod)
            .env("POD_NAMESPACE", &node.namespace)
            .env("INSTANCE_IP", ip)
            .env("SERVICE_ACCOUNT", "default")
            .env("ISTIO_META_CLUSTER_ID", "Kubernetes")
            .env("ISTIO_METAJSON_LABELS", node.labels.to_string())
            // No CA: the workload certificate, when there is one, is files
            // under ./etc/certs ([`WORKLOAD_CERT_FILES`]); with mTLS off
            // nothing asks for it, and the SDS server still serves files (a
            // DestinationRule's caCertificates).
            .env("FILE_MOUNTED_CERTS", "true")
            // The fixed ports of Istio's bootstrap (15021, 15090) on free ones.
            .env("ENVOY_STATUS_PORT", envoy_status.to_string())
            .env("ENVOY_PROMETHEUS_PORT", prometheus.to_string());
        if let Some(mode) = node.interception {
            command.env("ISTIO_META_INTERCEPTION_MODE", mode);
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command
            // Its own process group: Envoy, its child, goes with it.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let mut agent = Self {
            child: Some(child),
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
            prometheus,
            config_path,
            data_dir,
        };
        let ready = SocketAddr::from(([127, 0, 0, 1], status));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = agent
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("pilot-agent exited with {status}:\n{}", agent.log_tail(40));
            }
            if http_request(ready, "GET", "/healthz/ready").is_ok_and(|(s, _)| s == 200) {
                return Ok(agent);
            }
            if Instant::now() >= deadline {
                bail!(
                    "pilot-agent's Envoy not ready in 60 s:\n{}",
                    agent.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// GET on its Envoy's admin interface: status and body.
    pub fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        http_request(self.admin, "GET", path)
    }

    /// The port of its Envoy's Prometheus listener (Istio's 15090), serving
    /// `/stats/prometheus`.
    pub fn prometheus_port(&self) -> u16 {
        self.prometheus
    }

    /// Its Envoy's `/config_dump`.
    pub fn config_dump(&self) -> Result<Value> {
        let (status, body) = self.admin_get("/config_dump")?;
        if status != 200 {
            bail!("/config_dump: {status} {body}");
        }
        serde_json::from_str(&body).context("config_dump JSON")
    }

    /// One counter or gauge of its Envoy; 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        self.admin_get("/stats?format=json")
            .ok()
            .and_then(|(_, body)| parse_stats_json(&body).ok())
            .and_then(|stats| stats.get(name).copied())
            .unwrap_or(0)
    }

    /// The bootstrap it wrote for Envoy (`<configPath>/envoy-rev.json`).
    pub fn bootstrap(&self) -> Result<Value> {
        let path = self.config_path.join("envoy-rev.json");
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).context("envoy-rev.json")
    }

    /// Everything it and its Envoy logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// The last `lines` lines of [`PilotAgent::log`].
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        let skip = all.len().saturating_sub(lines);
        all.into_iter().skip(skip).collect::<Vec<_>>().join("\n")
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(group) = i32::try_from(child.id()) {
                // SAFETY: kill(2) with the id of the group this test started.
                unsafe {
                    libc::kill(-group, libc::SIGKILL);
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PilotAgent {
    fn drop(&mut self) {
        self.stop();
        self.data_dir.clean();
    }
}

/// [`WASM_DATA_DIR`], made if missing (as the pod's emptyDir would be);
/// what the agent adds to it and the folders made for it are removed again.
struct DataDir {
    made: Vec<PathBuf>,
    before: BTreeSet<PathBuf>,
}

impl DataDir {
    fn prepare() -> Result<Self> {
        let dir = Path::new(WASM_DATA_DIR);
        let made: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|d| !d.exists())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(dir).with_context(|| {
            format!("make {WASM_DATA_DIR}, where pilot-agent keeps the modules it pulls")
        })?;
        Ok(Self {
            made,
            before: entries(dir),
        })
    }

    fn clean(&self) {
        for added in entries(Path::new(WASM_DATA_DIR)).difference(&self.before) {
            let _ = std::fs::remove_dir_all(added).or_else(|_| std::fs::remove_file(added));
        }
        for dir in &self.made {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn entries(dir: &Path) -> BTreeSet<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}
