//! The mesh-wide sources of the degrade level, pulled by one worker per
//! proxy: Alertmanager's active alerts (`degrade.alertmanager`) and each
//! model's mesh-wide load from Prometheus (`degrade.prometheus`).
//!
//! Each source has a lease in shared data, as the routing probes do, so of
//! the workers' timers one asks it each interval; what it reads goes to
//! shared data, where every worker's calls find it. A pull that fails — no
//! answer, another status, an answer that does not parse — changes nothing:
//! the alerts last read hold until `degrade.alert_ttl_s` expires them, the
//! last load reading until `stale_after_s`, and then the webhook's alerts and
//! the local window are all that count. The glue only sends the pulls the
//! [`Puller`] says are due and hands back how each ended.

pub mod alertmanager;
pub mod config;
pub mod mesh;
pub mod prometheus;

use super::alerts;
use super::config::DegradeConfig;
use crate::config::service::Service;
use crate::config::Config;
use crate::host::lease::try_lease;
use crate::host::{Metrics, SharedStore};
use crate::load::Signal;
use crate::metrics as names;
use crate::routing::probe::ProbeEnd;

/// Shared-data key of Alertmanager's pull lease.
pub const ALERTMANAGER_LEASE_KEY: &str = crate::keyspace::ALERTMANAGER_LEASE.key;
/// Shared-data key of Prometheus's pull lease.
pub const PROMETHEUS_LEASE_KEY: &str = crate::keyspace::PROMETHEUS_LEASE.key;
/// Longest answer read; a longer one counts as `invalid` (narrow the alerts
/// with `filters`).
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// What a pull asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullKind {
    /// Alertmanager's active alerts.
    Alerts,
    /// Prometheus's mesh-wide value of one signal.
    Load(Signal),
}

impl PullKind {
    /// The `what` label of its metrics.
    pub fn source(self) -> &'static str {
        match self {
            Self::Alerts => "alertmanager",
            Self::Load(_) => "prometheus",
        }
    }
}

/// One pull to send: an HTTP GET callout to `cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pull {
    /// What it asks.
    pub kind: PullKind,
    /// Envoy cluster to send it to.
    pub cluster: String,
    /// Request headers, pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// Give up on the answer after this long.
    pub timeout_ms: u64,
}

impl Pull {
    /// A GET of `path_and_query` from `service`.
    fn get(kind: PullKind, service: &Service, path_and_query: &str) -> Self {
        Self {
            kind,
            cluster: service.cluster.clone(),
            headers: service.request_headers("GET", path_and_query, None),
            timeout_ms: service.timeout_ms,
        }
    }
}

/// The pulls of one worker: which are due when, and what their answers do.
#[derive(Debug, Clone, Default)]
pub struct Puller {
    /// This worker's id in the leases (random per worker VM, non-zero).
    worker_id: u64,
}

impl Puller {
    /// The puller of the worker `worker_id` (non-zero).
    pub fn new(worker_id: u64) -> Self {
        Self { worker_id }
    }

    /// The pulls to send at `now_ms`: each configured source whose lease this
    /// worker wins for its interval.
    pub fn due<S: SharedStore + ?Sized>(
        &self,
        cfg: &DegradeConfig,
        store: &S,
        now_ms: u64,
    ) -> Vec<Pull> {
        let mut due = Vec::new();
        if let Some(am) = &cfg.alertmanager {
            if try_lease(
                store,
                ALERTMANAGER_LEASE_KEY,
                self.worker_id,
                now_ms,
                am.interval_ms,
            ) {
                due.push(Pull::get(PullKind::Alerts, &am.service, &am.path_and_query));
            }
        }
        if let Some(prom) = &cfg.prometheus {
            if try_lease(
                store,
                PROMETHEUS_LEASE_KEY,
                self.worker_id,
                now_ms,
                prom.interval_ms,
            ) {
                for (signal, path) in &prom.queries {
                    due.push(Pull::get(PullKind::Load(*signal), &prom.service, path));
                }
            }
        }
        due
    }

    /// Applies how `pull` ended at `now_ms` and counts it.
    pub fn finish(
        &self,
        config: &Config,
        store: &dyn SharedStore,
        metrics: &mut dyn Metrics,
        pull: &Pull,
        end: ProbeEnd<'_>,
        now_ms: u64,
    ) {
        let result = match end {
            ProbeEnd::NotSent => Err("not_sent"),
            ProbeEnd::NoAnswer => Err("no_answer"),
            ProbeEnd::Answered { status, .. } if !(200..300).contains(&status) => Err("status"),
            ProbeEnd::Answered { body, .. } if body.len() > MAX_ANSWER_BYTES => Err("invalid"),
            ProbeEnd::Answered { body, .. } => apply(config, store, pull.kind, body, now_ms),
        };
        let source = pull.kind.source();
        let (label, dropped) = match result {
            Ok(dropped) => ("ok", dropped),
            Err(reason) => (reason, 0),
        };
        metrics.counter(
            &names::name(names::DEGRADE_PULLS, &[("what", source), ("result", label)]),
            1,
        );
        if dropped > 0 {
            metrics.counter(
                &names::name(names::DEGRADE_PULL_DROPPED, &[("what", source)]),
                u64::from(dropped),
            );
        }
        metrics.gauge(
            &names::name(names::DEGRADE_SOURCE_UP, &[("what", source)]),
            i64::from(label == "ok"),
        );
    }
}

/// Reads an answer of `kind` into shared data; what it dropped, or why it
/// changed nothing.
fn apply(
    config: &Config,
    store: &dyn SharedStore,
    kind: PullKind,
    body: &[u8],
    now_ms: u64,
) -> Result<u32, &'static str> {
    let cfg = &config.degrade;
    match kind {
        PullKind::Alerts => {
            let reports = alertmanager::parse(body, now_ms).map_err(|_| "invalid")?;
            let applied =
                alerts::apply_pulled(store, cfg, &reports, now_ms).map_err(|_| "store")?;
            Ok(applied.dropped)
        }
        PullKind::Load(signal) => {
            let label = cfg
                .prometheus
                .as_ref()
                .map_or(self::config::DEFAULT_MODEL_LABEL, |p| {
                    p.model_label.as_str()
                });
            let reading = prometheus::parse(body, label, &config.names).map_err(|_| "invalid")?;
            mesh::record(store, signal, reading.values, now_ms).map_err(|_| "store")?;
            Ok(reading.dropped)
        }
    }
}

#[cfg(test)]
mod tests;
