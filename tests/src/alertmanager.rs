//! A launcher for the real Alertmanager (Debian's `prometheus-alertmanager`,
//! which `make e2e` installs): a temp config and storage, a free loopback
//! port, no clustering, killed by pid when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The binary: `ALERTMANAGER_BIN`, else the first of Debian's and upstream's names on `PATH`.
pub fn alertmanager_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ALERTMANAGER_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["prometheus-alertmanager", "alertmanager"].map(|n| dir.join(n)))
        .find(|p| p.is_file())
}

/// A running Alertmanager.
pub struct Alertmanager {
    child: Option<Child>,
    port: u16,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Alertmanager {
    /// Starts one with `config` (YAML) and waits until it is ready.
    pub fn start(config: &str) -> Result<Self> {
        let bin = alertmanager_bin().context("no alertmanager binary")?;
        let dir = tempfile::tempdir()?;
        let config_path = dir.path().join("alertmanager.yaml");
        std::fs::write(&config_path, config)?;
        let log = dir.path().join("alertmanager.log");
        let port = free_port()?;
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("spawn alertmanager")?;
        let am = Self {
            child: Some(child),
            port,
            _dir: dir,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if status_of(&am.url("/-/ready")).is_ok_and(|s| s == 200) {
                return Ok(am);
            }
            if Instant::now() >= deadline {
                bail!("alertmanager not ready: {}", am.log_contents());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A URL of its API.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Posts alerts to its API v2 (`labels`, `startsAt`, `endsAt`, …).
    pub async fn post_alerts(&self, alerts: &Value) -> Result<()> {
        let r = crate::http_client()
            .post(self.url("/api/v2/alerts"))
            .json(alerts)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("POST /api/v2/alerts: {} {}", r.status(), r.text().await?);
        }
        Ok(())
    }

    /// What it logged.
    pub fn log_contents(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The status of `GET http://host:port/path`, on a plain socket: the readiness
/// poll runs before any async runtime is needed.
fn status_of(url: &str) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    Ok(buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}
