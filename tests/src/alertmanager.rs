//! A launcher for the real Alertmanager (Debian's `prometheus-alertmanager`,
//! which `make e2e` installs): a temp config and storage, a free loopback
//! port, no clustering, killed by pid when dropped ([`Daemon`]).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::daemon::{free_port, Daemon};

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
    daemon: Daemon,
}

impl Alertmanager {
    /// Starts one with `config` (YAML) and waits until it is ready.
    pub fn start(config: &str) -> Result<Self> {
        let bin = alertmanager_bin().context("no alertmanager binary")?;
        let port = free_port()?;
        let daemon = Daemon::start(
            &bin,
            "alertmanager",
            port,
            ("alertmanager.yaml", config),
            |dir, port| {
                vec![
                    format!("--storage.path={}", dir.join("data").display()),
                    format!("--web.listen-address=127.0.0.1:{port}"),
                    "--cluster.listen-address=".to_string(),
                ]
            },
        )?;
        Ok(Self { daemon })
    }

    /// A URL of its API.
    pub fn url(&self, path: &str) -> String {
        self.daemon.url(path)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.daemon.port()
    }

    /// Kills it now (a source that went down); its port is free again.
    pub fn stop(&mut self) {
        self.daemon.stop();
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

    /// The alerts it holds (its API v2's `GET /api/v2/alerts`).
    pub async fn alerts(&self) -> Result<Vec<Value>> {
        let r = crate::http_client()
            .get(self.url("/api/v2/alerts"))
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("GET /api/v2/alerts: {} {}", r.status(), r.text().await?);
        }
        Ok(r.json().await?)
    }

    /// What it logged.
    pub fn log_contents(&self) -> String {
        self.daemon.log_contents()
    }
}
