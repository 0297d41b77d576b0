//! A launcher for the real Prometheus server (Debian's `prometheus`, which
//! `make e2e` installs with `promtool`): a scrape config of its own, a temp
//! TSDB, a free loopback port, killed by pid when dropped ([`Daemon`]).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::Value;

pub use crate::daemon::free_port;
use crate::daemon::Daemon;

/// The binary: `PROMETHEUS_BIN`, else `prometheus` on `PATH`.
pub fn prometheus_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PROMETHEUS_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("prometheus"))
        .find(|p| p.is_file())
}

/// The config of a server that scrapes `/stats/prometheus` of the Envoy
/// admin ports `targets` every second.
pub fn scrape_envoys(targets: &[u16]) -> String {
    let targets: Vec<String> = targets
        .iter()
        .map(|p| format!("\"127.0.0.1:{p}\""))
        .collect();
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n- job_name: envoy\n  metrics_path: /stats/prometheus\n  \
         static_configs:\n  - targets: [{}]\n",
        targets.join(", ")
    )
}

/// `config` (from [`scrape_envoys`]) that also evaluates the recording
/// rules and alerts of the file at `rules`, every second.
pub fn with_rules(config: &str, rules: &std::path::Path) -> String {
    format!("{config}rule_files:\n- '{}'\n", rules.display())
}

/// `config` that also sends the alerts of its rules to the Alertmanager on
/// 127.0.0.1:`port`.
pub fn with_alertmanager(config: &str, port: u16) -> String {
    format!(
        "{config}alerting:\n  alertmanagers:\n  - static_configs:\n    - targets: ['127.0.0.1:{port}']\n"
    )
}

/// A running Prometheus.
pub struct PrometheusServer {
    daemon: Daemon,
}

impl PrometheusServer {
    /// Starts one on `port` with `config` (YAML) and waits until it is
    /// ready. The Envoys it scrapes need its port before it has their admin
    /// ports: take one with [`free_port`] first.
    pub fn start(port: u16, config: &str) -> Result<Self> {
        let bin = prometheus_bin().context("no prometheus binary")?;
        let daemon = Daemon::start(
            &bin,
            "prometheus",
            port,
            ("prometheus.yml", config),
            |dir, port| {
                vec![
                    format!("--storage.tsdb.path={}", dir.join("data").display()),
                    format!("--web.listen-address=127.0.0.1:{port}"),
                ]
            },
        )?;
        Ok(Self { daemon })
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.daemon.port()
    }

    /// Kills it now (a source that went down).
    pub fn stop(&mut self) {
        self.daemon.stop();
    }

    /// The samples of an instant query, as its API answers them.
    pub async fn query(&self, promql: &str) -> Result<Vec<Value>> {
        self.api("/api/v1/query", &[("query", promql)]).await
    }

    /// The series of a range query from `start` to `end` (Unix seconds)
    /// every `step_s` seconds, as its API answers them.
    pub async fn query_range(
        &self,
        promql: &str,
        start: f64,
        end: f64,
        step_s: f64,
    ) -> Result<Vec<Value>> {
        let (start, end, step) = (start.to_string(), end.to_string(), step_s.to_string());
        self.api(
            "/api/v1/query_range",
            &[
                ("query", promql),
                ("start", &start),
                ("end", &end),
                ("step", &step),
            ],
        )
        .await
    }

    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Vec<Value>> {
        let promql = params.first().map_or("", |p| p.1);
        let r = crate::http_client()
            .get(self.daemon.url(path))
            .query(params)
            .send()
            .await?;
        let body: Value = r.json().await?;
        if body.get("status").and_then(Value::as_str) != Some("success") {
            bail!("query {promql}: {body}");
        }
        Ok(body
            .pointer("/data/result")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }

    /// What it logged.
    pub fn log_contents(&self) -> String {
        self.daemon.log_contents()
    }
}
