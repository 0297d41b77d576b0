//! Active probing: which probes the worker that holds this interval's
//! [`lease`] sends, and what each probe's end means for the cluster's health
//! and load. The glue only sends the probes the [`Prober`] says are due and
//! hands back how each ended.

pub mod prometheus;

use super::config::RoutingConfig;
use super::health;
use crate::host::lease::try_lease;
use crate::host::{Metrics, SharedStore};
use crate::metrics;

/// Shared-data key of the probe lease.
pub const LEASE_KEY: &str = crate::keyspace::PROBE_LEASE.key;
/// Most bytes of a model server's metrics page read: a longer one is left
/// unread (no load signal from it), so a backend's page costs the proxy a
/// bounded copy per worker that probes.
pub const MAX_METRICS_BYTES: usize = 4 << 20;
pub use prometheus::parse_load;

/// What a probe asks a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// GET of the liveness path: its end feeds the cluster's health (a failure
    /// ejects it) and is counted in [`metrics::ROUTING_PROBES`].
    Liveness,
    /// GET of the model server's Prometheus metrics path: its body is read for
    /// load signals only; it says nothing about liveness and is not counted.
    Load,
}

impl ProbeKind {
    /// The glue reads the response body (only load probes need it).
    pub fn reads_body(self) -> bool {
        self == Self::Load
    }
}

/// One probe to send: an HTTP callout to `cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Envoy cluster to send it to.
    pub cluster: String,
    /// What it asks, which says what its end means.
    pub kind: ProbeKind,
    /// Request headers, pseudo-headers included.
    pub headers: Vec<(&'static str, String)>,
    /// Request body, if any.
    pub body: Option<Vec<u8>>,
    /// Give up on the answer after this long.
    pub timeout_ms: u64,
    /// When it was due, for its latency.
    pub sent_ms: u64,
}

/// How a probe ended, as the host reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeEnd<'a> {
    /// A response with this status (the body is empty unless
    /// [`ProbeKind::reads_body`]).
    Answered {
        /// The response status.
        status: u16,
        /// The response body.
        body: &'a [u8],
    },
    /// No response: it timed out or its connection failed (Envoy then calls
    /// back without headers).
    NoAnswer,
    /// The host would not send it (Envoy knows no such cluster).
    NotSent,
}

impl<'a> ProbeEnd<'a> {
    /// The end of a callout the host called back for: `status` `None` when
    /// no answer came.
    pub fn of(status: Option<u16>, body: &'a [u8]) -> Self {
        match status {
            Some(status) => Self::Answered { status, body },
            None => Self::NoAnswer,
        }
    }
}

/// The active-probing policy of one worker: which probes are due when, and
/// what their ends mean.
#[derive(Debug, Clone, Default)]
pub struct Prober {
    /// This worker's id in the probe lease (random per worker VM, non-zero).
    worker_id: u64,
}

impl Prober {
    /// The prober of the worker `worker_id` (non-zero).
    pub fn new(worker_id: u64) -> Self {
        Self { worker_id }
    }

    /// The probes to send at `now_ms`: every cluster's liveness path, and its
    /// metrics path when it has one, when this worker wins the interval's
    /// lease ([`try_lease`]); none otherwise.
    pub fn due<S: SharedStore + ?Sized>(
        &self,
        config: &RoutingConfig,
        store: &S,
        now_ms: u64,
    ) -> Vec<Probe> {
        if config.clusters.is_empty()
            || !try_lease(
                store,
                LEASE_KEY,
                self.worker_id,
                now_ms,
                config.probe_interval_ms,
            )
        {
            return Vec::new();
        }
        let mut due = Vec::with_capacity(config.clusters.len().saturating_mul(2));
        for target in &config.clusters {
            let authority = target.authority.as_deref().unwrap_or(&target.cluster);
            let paths = std::iter::once((ProbeKind::Liveness, target.health_path.as_str()))
                .chain(target.metrics_path.as_deref().map(|p| (ProbeKind::Load, p)));
            for (kind, path) in paths {
                due.push(Probe {
                    cluster: target.cluster.clone(),
                    kind,
                    headers: vec![
                        (":method", "GET".to_string()),
                        (":path", path.to_string()),
                        (":authority", authority.to_string()),
                    ],
                    body: None,
                    timeout_ms: config.probe_timeout_ms,
                    sent_ms: now_ms,
                });
            }
        }
        due
    }

    /// Learns from how `probe` ended at `now_ms`. A liveness probe records its
    /// result in the cluster's health and counts it (and the ejection it may
    /// cause); one not sent counts as failed, since traffic to a cluster Envoy
    /// does not know would fail too. A load probe stores the load signals its
    /// answer carries, whatever its status.
    pub fn finish<S: SharedStore + ?Sized>(
        &self,
        config: &RoutingConfig,
        store: &S,
        metrics: &mut dyn Metrics,
        probe: &Probe,
        end: ProbeEnd<'_>,
        now_ms: u64,
    ) {
        let cluster = probe.cluster.as_str();
        match probe.kind {
            ProbeKind::Load => {
                if let ProbeEnd::Answered { body, .. } = end {
                    if let Some(load) = parse_load(body) {
                        let _ = health::record_load(store, cluster, load, now_ms);
                    }
                }
            }
            ProbeKind::Liveness => {
                let status = match end {
                    ProbeEnd::Answered { status, .. } => Some(status),
                    ProbeEnd::NoAnswer | ProbeEnd::NotSent => None,
                };
                let ok = probe_ok(status);
                let recorded = health::record_probe(
                    store,
                    config,
                    cluster,
                    ok,
                    now_ms.saturating_sub(probe.sent_ms),
                    None,
                    now_ms,
                );
                let result = if ok { "ok" } else { "fail" };
                metrics.counter(
                    &metrics::name(
                        metrics::ROUTING_PROBES,
                        &[(metrics::LLM_CLUSTER, cluster), ("result", result)],
                    ),
                    1,
                );
                if recorded.is_ok_and(|r| r.ejected) {
                    metrics.counter(
                        &metrics::name(
                            metrics::ROUTING_EJECTIONS,
                            &[(metrics::LLM_CLUSTER, cluster)],
                        ),
                        1,
                    );
                }
            }
        }
    }
}

/// Whether a probe's answer shows a live server: any response below 500 but
/// 429. A 401/404 still proves the server up (providers guard `/v1/models`
/// with the key the probe does not carry); `None` is a timeout or reset.
pub fn probe_ok(status: Option<u16>) -> bool {
    matches!(status, Some(s) if (100..500).contains(&s) && s != 429)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{MemoryMetrics, MemoryStore};
    use crate::routing::ClusterTarget;

    const I: u64 = 5_000;

    fn probed() -> RoutingConfig {
        let target =
            |cluster: &str, authority: Option<&str>, metrics_path: Option<&str>| ClusterTarget {
                cluster: cluster.to_string(),
                authority: authority.map(str::to_string),
                health_path: "/health".to_string(),
                metrics_path: metrics_path.map(str::to_string),
            };
        RoutingConfig {
            clusters: vec![
                target("a", None, Some("/metrics")),
                target("b", Some("b.example"), None),
            ],
            probe_interval_ms: I,
            probe_timeout_ms: 700,
            ..RoutingConfig::default()
        }
    }

    #[test]
    fn prober_probes_every_cluster_once_per_interval() {
        let c = probed();
        let s = MemoryStore::new();
        let (one, two) = (Prober::new(1), Prober::new(2));
        // The first tick only creates the lease.
        assert_eq!(one.due(&c, &s, 0), vec![]);
        assert_eq!(two.due(&c, &s, I - 1), vec![]);
        let due = two.due(&c, &s, I);
        assert_eq!(one.due(&c, &s, I), vec![]);
        let got: Vec<_> = due
            .iter()
            .map(|p| {
                (
                    p.cluster.as_str(),
                    p.kind,
                    p.headers[1].1.as_str(),
                    p.headers[2].1.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", ProbeKind::Liveness, "/health", "a"),
                ("a", ProbeKind::Load, "/metrics", "a"),
                ("b", ProbeKind::Liveness, "/health", "b.example"),
            ]
        );
        for p in &due {
            assert_eq!(p.headers[0], (":method", "GET".to_string()));
            assert_eq!((p.body.as_ref(), p.timeout_ms, p.sent_ms), (None, 700, I));
        }
        assert!(ProbeKind::Load.reads_body() && !ProbeKind::Liveness.reads_body());
    }

    #[test]
    fn prober_without_clusters_takes_no_lease() {
        let c = RoutingConfig::default();
        let s = MemoryStore::new();
        for now in [0, I, 2 * I] {
            assert_eq!(Prober::new(1).due(&c, &s, now), vec![]);
        }
        assert!(s.is_empty());
    }

    fn probe(kind: ProbeKind) -> Probe {
        Probe {
            cluster: "a".to_string(),
            kind,
            headers: vec![],
            body: None,
            timeout_ms: 700,
            sent_ms: 1_000,
        }
    }

    fn probes(m: &MemoryMetrics, result: &str) -> u64 {
        let name = metrics::name(
            metrics::ROUTING_PROBES,
            &[(metrics::LLM_CLUSTER, "a"), ("result", result)],
        );
        m.counters.get(&name).copied().unwrap_or(0)
    }

    #[test]
    fn liveness_ends_feed_health_and_metrics() {
        let c = probed();
        let ejections = metrics::name(metrics::ROUTING_EJECTIONS, &[(metrics::LLM_CLUSTER, "a")]);
        let p = probe(ProbeKind::Liveness);
        for (end, ok) in [
            (
                ProbeEnd::Answered {
                    status: 200,
                    body: b"",
                },
                true,
            ),
            (
                ProbeEnd::Answered {
                    status: 404,
                    body: b"",
                },
                true,
            ),
            (
                ProbeEnd::Answered {
                    status: 503,
                    body: b"",
                },
                false,
            ),
            (
                ProbeEnd::Answered {
                    status: 429,
                    body: b"",
                },
                false,
            ),
            (ProbeEnd::NoAnswer, false),
            (ProbeEnd::NotSent, false),
        ] {
            let s = MemoryStore::new();
            let mut m = MemoryMetrics::default();
            Prober::new(1).finish(&c, &s, &mut m, &p, end, 1_250);
            let h = health::read(&s, "a").unwrap();
            let rec = h.probe.unwrap();
            assert_eq!(
                (rec.ok, rec.at_ms, rec.latency_ms),
                (ok, 1_250, 250),
                "{end:?}"
            );
            assert_eq!(h.is_ejected(1_250), !ok, "{end:?}");
            assert_eq!(
                (probes(&m, "ok"), probes(&m, "fail")),
                (u64::from(ok), u64::from(!ok))
            );
            assert_eq!(m.counters.get(&ejections).copied(), (!ok).then_some(1));
        }
        // Failing again while ejected is no new ejection.
        let s = MemoryStore::new();
        let mut m = MemoryMetrics::default();
        for now in [1_000, 2_000] {
            Prober::new(1).finish(&c, &s, &mut m, &p, ProbeEnd::NoAnswer, now);
        }
        assert_eq!(probes(&m, "fail"), 2);
        assert_eq!(m.counters.get(&ejections), Some(&1));
    }

    #[test]
    fn load_ends_store_load_only() {
        let c = probed();
        let p = probe(ProbeKind::Load);
        let body = b"vllm:num_requests_waiting 3\n";
        for (end, stored) in [
            (ProbeEnd::Answered { status: 200, body }, true),
            // The status is not looked at: the body speaks for itself.
            (ProbeEnd::Answered { status: 500, body }, true),
            (
                ProbeEnd::Answered {
                    status: 200,
                    body: b"up 1\n",
                },
                false,
            ),
            (ProbeEnd::NoAnswer, false),
            (ProbeEnd::NotSent, false),
        ] {
            let s = MemoryStore::new();
            let mut m = MemoryMetrics::default();
            Prober::new(1).finish(&c, &s, &mut m, &p, end, 2_000);
            let h = health::read(&s, "a");
            assert_eq!(
                h.and_then(|h| h.load).and_then(|l| l.waiting),
                stored.then_some(3.0),
                "{end:?}"
            );
            assert!(h.is_none_or(|h| h.probe.is_none() && !h.is_ejected(2_000)));
            assert!(m.counters.is_empty(), "{end:?}");
        }
    }

    #[test]
    fn probe_status_shows_liveness() {
        for (status, want) in [
            (Some(200), true),
            (Some(401), true),
            (Some(404), true),
            (Some(429), false),
            (Some(500), false),
            (Some(503), false),
            (Some(0), false),
            (None, false),
        ] {
            assert_eq!(probe_ok(status), want, "{status:?}");
        }
    }
}
