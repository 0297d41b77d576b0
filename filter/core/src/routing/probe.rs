//! Active probing: `on_tick` fires on every worker, so a lease in shared data
//! elects one worker per interval to probe every cluster; what each probe's
//! end means for the cluster's health; and the reading of a model server's
//! Prometheus metrics into load signals. The glue only sends the probes the
//! [`Prober`] says are due and hands back how each ended.

use serde::{Deserialize, Serialize};

use super::config::RoutingConfig;
use super::health::{self, Load};
use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::{Metrics, SharedStore};
use crate::metrics;

/// Shared-data key of the probe lease.
pub const LEASE_KEY: &str = "llm_filter.routing.v1.probe_lease";

/// Who probes until when. `owner` 0 is nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Id of the worker holding the lease (random per worker VM, non-zero).
    pub owner: u64,
    /// The lease ends at this time.
    pub expires_ms: u64,
}

/// Tries to win this interval's probe lease for `worker_id`; true means this
/// worker probes now and the others skip until `now_ms + interval_ms`.
///
/// Envoy writes a key that does not exist unconditionally, whatever CAS token
/// is passed, so two workers could both "create" the lease. Hence a worker
/// that finds no lease only creates an unowned one that nobody may take
/// before a full interval has passed, and wins nothing this tick. Even if a
/// late creation overwrites a lease won meanwhile, it pushes the next win past
/// that lease's end, so at most one worker wins per interval (provided no
/// worker stalls a whole interval between its read and its write). After the
/// first interval every win is a compare-and-swap on an existing key.
pub fn try_lease<S: SharedStore + ?Sized>(
    store: &S,
    worker_id: u64,
    now_ms: u64,
    interval_ms: u64,
) -> bool {
    let mine = Lease {
        owner: worker_id,
        expires_ms: now_ms.saturating_add(interval_ms.max(1)),
    };
    // Without a real token the write would be unconditional: never take the
    // lease so (`Skip`).
    let taken = cas::update(
        store,
        LEASE_KEY,
        Unguarded::Skip,
        |bytes| bytes.and_then(codec::decode::<Lease>),
        |lease| lease.as_ref().and_then(codec::encode),
        |lease| {
            // An unreadable lease (older format, corruption) counts as
            // expired; the compare-and-swap still lets only one worker
            // replace it.
            if lease.is_some_and(|l| now_ms < l.expires_ms) {
                return Change::Keep(false);
            }
            *lease = Some(mine);
            Change::Write(true)
        },
    );
    match taken {
        Ok(u) if u.written => true,
        // Free to take but no token: the lease was never created.
        Ok(u) if u.out => {
            let unowned = Lease {
                owner: 0,
                expires_ms: now_ms.saturating_add(interval_ms),
            };
            if let Some(b) = codec::encode(&unowned) {
                // A host error leaves the creation to the next tick.
                let _ = cas::create_if_absent(store, LEASE_KEY, &b);
            }
            false
        }
        _ => false,
    }
}

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
            || !try_lease(store, self.worker_id, now_ms, config.probe_interval_ms)
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

/// Samples of one load metric: sum and count over label sets.
#[derive(Default)]
struct Acc {
    sum: f64,
    n: u32,
}

impl Acc {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.n = self.n.saturating_add(1);
    }
    fn sum(&self) -> Option<f64> {
        (self.n > 0).then_some(self.sum)
    }
    fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / f64::from(self.n))
    }
}

/// Cap of a summed queue length: a sum of finite samples stays finite.
const MAX_WAITING: f64 = 1e9;

/// Reads load signals from a model server's Prometheus text exposition:
/// waiting requests (vLLM `vllm:num_requests_waiting`, SGLang
/// `sglang:num_queue_reqs`), summed over label sets, and KV-cache usage (vLLM
/// `vllm:kv_cache_usage_perc`, else the older `vllm:gpu_cache_usage_perc`,
/// SGLang `sglang:token_usage`), averaged over label sets since a sum of
/// fractions is no fraction. `None` when no known metric is present.
/// Comments, unknown metrics, malformed lines, NaN and infinities are skipped.
pub fn parse_load(text: &[u8]) -> Option<Load> {
    let mut waiting = Acc::default();
    let mut kv = Acc::default();
    let mut gpu = Acc::default();
    let mut sg_queue = Acc::default();
    let mut sg_tokens = Acc::default();
    for line in text.split(|b| *b == b'\n') {
        let Some((name, value)) = sample(line) else {
            continue;
        };
        match name {
            b"vllm:num_requests_waiting" => waiting.add(value.max(0.0)),
            b"sglang:num_queue_reqs" => sg_queue.add(value.max(0.0)),
            b"vllm:kv_cache_usage_perc" => kv.add(fraction(value)),
            b"vllm:gpu_cache_usage_perc" => gpu.add(fraction(value)),
            b"sglang:token_usage" => sg_tokens.add(fraction(value)),
            _ => {}
        }
    }
    let waiting = match (waiting.sum(), sg_queue.sum()) {
        (None, None) => None,
        (a, b) => Some((a.unwrap_or(0.0) + b.unwrap_or(0.0)).min(MAX_WAITING)),
    };
    let kv_usage = kv
        .mean()
        .or_else(|| gpu.mean())
        .or_else(|| sg_tokens.mean())
        .map(|u| u.clamp(0.0, 1.0));
    (waiting.is_some() || kv_usage.is_some()).then_some(Load { waiting, kv_usage })
}

/// A usage in `[0, 1]`. These metrics are fractions; a value above 1 can only
/// be a percentage from another exporter.
fn fraction(v: f64) -> f64 {
    let v = if v > 1.0 && v <= 100.0 { v / 100.0 } else { v };
    v.clamp(0.0, 1.0)
}

/// One sample line: `name{labels} value [timestamp]`, the value finite.
fn sample(line: &[u8]) -> Option<(&[u8], f64)> {
    let line = line.trim_ascii();
    if line.first().is_none_or(|b| *b == b'#') {
        return None;
    }
    let name_len = line
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b':')))
        .unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_len);
    if name.is_empty() {
        return None;
    }
    if rest.first() == Some(&b'{') {
        rest = rest.get(skip_labels(rest)?..)?;
    }
    // The value follows at least one blank; a timestamp may follow it.
    if !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return None;
    }
    let value = rest
        .trim_ascii_start()
        .split(|b| *b == b' ' || *b == b'\t')
        .next()?;
    let value: f64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    value.is_finite().then_some((name, value))
}

/// Length of a `{…}` label block, quotes and escapes inside values honoured;
/// `None` when it never closes.
fn skip_labels(s: &[u8]) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, b) in s.iter().enumerate().skip(1) {
        if in_quotes {
            if escaped {
                escaped = false;
            } else if *b == b'\\' {
                escaped = true;
            } else if *b == b'"' {
                in_quotes = false;
            }
        } else if *b == b'"' {
            in_quotes = true;
        } else if *b == b'}' {
            return Some(i + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{MemoryMetrics, MemoryStore, Random, SplitMix64, StoreError, Versioned};
    use crate::routing::ClusterTarget;
    use std::cell::RefCell;

    const I: u64 = 5_000;

    #[test]
    fn first_tick_creates_then_one_worker_wins_per_interval() {
        let s = MemoryStore::new();
        assert!(!try_lease(&s, 1, 0, I));
        assert!(!try_lease(&s, 2, 0, I));
        assert!(!try_lease(&s, 1, I - 1, I));
        assert!(try_lease(&s, 2, I, I));
        assert!(!try_lease(&s, 1, I, I));
        assert!(
            !try_lease(&s, 2, I + 1, I),
            "the owner too waits for its lease to end"
        );
        assert!(try_lease(&s, 1, 2 * I, I));
        let v = s.get(LEASE_KEY).unwrap();
        let l: Lease = codec::decode(&v.value.unwrap()).unwrap();
        assert_eq!(
            l,
            Lease {
                owner: 1,
                expires_ms: 3 * I
            }
        );
    }

    #[test]
    fn unreadable_lease_is_taken_over() {
        let s = MemoryStore::new();
        s.set(LEASE_KEY, b"?", None).unwrap();
        assert!(try_lease(&s, 7, 0, I));
        assert!(!try_lease(&s, 8, 0, I));
    }

    /// Another worker's tick, run in the middle of this one's.
    type Interloper<'a> = Box<dyn FnOnce(&MemoryStore) + 'a>;

    /// A store that runs other workers' ticks between this worker's read and
    /// its write, the interleaving Envoy allows across threads.
    struct Racy<'a> {
        inner: &'a MemoryStore,
        before_set: RefCell<Vec<Interloper<'a>>>,
    }

    impl SharedStore for Racy<'_> {
        fn get(&self, key: &str) -> Result<Versioned, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            let pending: Vec<_> = self.before_set.borrow_mut().drain(..).collect();
            for f in pending {
                f(self.inner);
            }
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn racing_creators_never_both_win() {
        let s = MemoryStore::new();
        let wins = RefCell::new(Vec::new());
        // Worker 2 reads "missing", then worker 1 creates the lease and, a
        // little later in the interval, tries to take it; then worker 2's
        // creation lands over it.
        let racy = Racy {
            inner: &s,
            before_set: RefCell::new(vec![Box::new(|s: &MemoryStore| {
                assert!(!try_lease(s, 1, 0, I));
                if try_lease(s, 1, I - 1, I) {
                    wins.borrow_mut().push((1, I - 1));
                }
            })]),
        };
        assert!(!try_lease(&racy, 2, 0, I));
        for now in [I - 1, I, I + 1] {
            for w in [1, 2, 3] {
                if try_lease(&s, w, now, I) {
                    wins.borrow_mut().push((w, now));
                }
            }
        }
        assert_eq!(*wins.borrow(), vec![(1, I)]);
    }

    #[test]
    fn racing_takers_never_both_win() {
        let s = MemoryStore::new();
        assert!(!try_lease(&s, 1, 0, I));
        let other_won = RefCell::new(false);
        // Both read an expired lease; worker 1 writes first.
        let racy = Racy {
            inner: &s,
            before_set: RefCell::new(vec![Box::new(|s: &MemoryStore| {
                *other_won.borrow_mut() = try_lease(s, 1, I, I);
            })]),
        };
        let won = try_lease(&racy, 2, I, I);
        assert!(*other_won.borrow());
        assert!(!won);
    }

    #[test]
    fn random_interleavings_keep_one_winner_per_interval() {
        let mut rng = SplitMix64::new(42);
        for _ in 0..50 {
            let s = MemoryStore::new();
            let wins: RefCell<Vec<u64>> = RefCell::new(Vec::new());
            let mut now = 0u64;
            for _ in 0..400 {
                now += rng.next_u64() % 700;
                let worker = 1 + rng.next_u64() % 4;
                let nested = 1 + rng.next_u64() % 4;
                let race = rng.next_u64().is_multiple_of(3);
                let wins_ref = &wins;
                let racy = Racy {
                    inner: &s,
                    before_set: RefCell::new(if race {
                        vec![Box::new(move |s: &MemoryStore| {
                            if try_lease(s, nested, now, I) {
                                wins_ref.borrow_mut().push(now);
                            }
                        })]
                    } else {
                        vec![]
                    }),
                };
                if try_lease(&racy, worker, now, I) {
                    wins.borrow_mut().push(now);
                }
            }
            let wins = wins.into_inner();
            assert!(wins.len() > 10, "{wins:?}");
            for pair in wins.windows(2) {
                assert!(pair[1] >= pair[0] + I, "{wins:?}");
            }
        }
    }

    #[test]
    fn lease_is_not_taken_without_a_token() {
        struct NoCas(MemoryStore);
        impl SharedStore for NoCas {
            fn get(&self, key: &str) -> Result<Versioned, StoreError> {
                let mut v = self.0.get(key)?;
                v.cas = None;
                Ok(v)
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
                self.0.set(key, value, cas)
            }
        }
        let s = NoCas(MemoryStore::new());
        assert!(!try_lease(&s, 1, 0, I));
        assert!(!try_lease(&s, 1, 10 * I, I));
    }

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

    #[test]
    fn reads_vllm_metrics() {
        let text = br#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B"} 4
vllm:num_requests_running{engine="0",model_name="x"} 12.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
vllm:kv_cache_usage_perc{engine="0",model_name="x"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="x"} 0.7
vllm:gpu_cache_usage_perc{model_name="x"} 0.99
vllm:num_requests_waiting_total 1000
"#;
        let l = parse_load(text).unwrap();
        assert_eq!(l.waiting, Some(7.0));
        assert!((l.kv_usage.unwrap() - 0.6).abs() < 1e-12);
    }

    #[test]
    fn reads_older_vllm_and_sglang_metrics() {
        let l = parse_load(b"vllm:gpu_cache_usage_perc{model_name=\"x\"} 0.25\n").unwrap();
        assert_eq!(
            l,
            Load {
                waiting: None,
                kv_usage: Some(0.25)
            }
        );
        let l = parse_load(
            b"sglang:num_queue_reqs{model_name=\"q\",dp_rank=\"0\"} 2\r\n\
              sglang:num_queue_reqs{model_name=\"q\",dp_rank=\"1\"} 5\r\n\
              sglang:token_usage{model_name=\"q\"} 0.9\r\n",
        )
        .unwrap();
        assert_eq!(
            l,
            Load {
                waiting: Some(7.0),
                kv_usage: Some(0.9)
            }
        );
    }

    #[test]
    fn parser_is_robust() {
        let text = concat!(
            "\n   \n# comment with vllm:num_requests_waiting 99\n",
            "vllm:num_requests_waiting{a=\"x}y\",b=\"q\\\"}\\\\\",c=\"1,2\"} 2 1712345678000\n",
            "vllm:num_requests_waiting{a=\"unterminated} 50\n",
            "vllm:num_requests_waiting NaN\n",
            "vllm:num_requests_waiting +Inf\n",
            "vllm:num_requests_waiting -Inf\n",
            "vllm:num_requests_waiting -4\n",
            "vllm:num_requests_waiting\n",
            "vllm:num_requests_waiting{} 1e0\n",
            "vllm:num_requests_waiting{}3\n",
            "vllm:num_requests_waiting 1e400\n",
            "vllm:num_requests_waiting abc\n",
            "vllm:num_requests_waiting\t0.5\t# trailing\n",
            "{} 7\n",
            "\u{0}\u{ff}garbage 3\n",
            "vllm:kv_cache_usage_perc 85\n",
            "vllm:kv_cache_usage_perc 250\n",
        );
        let l = parse_load(text.as_bytes()).unwrap();
        assert_eq!(l.waiting, Some(3.5));
        // 85 read as a percentage, 250 clamped.
        assert!((l.kv_usage.unwrap() - 0.925).abs() < 1e-12, "{l:?}");
        assert_eq!(parse_load(b""), None);
        assert_eq!(parse_load(b"up 1\n# EOF\n"), None);
        assert_eq!(parse_load(&[0xff, 0xfe, b'\n', b'{']), None);
        let huge = "vllm:num_requests_waiting 1e300\n".repeat(3);
        assert_eq!(
            parse_load(huge.as_bytes()).unwrap().waiting,
            Some(MAX_WAITING)
        );
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    fn labels() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("{}".to_string()),
            fuzz::text().prop_map(|t| {
                let v = t
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                format!("{{model_name=\"{v}\",engine=\"0\"}}")
            }),
        ]
    }

    fn known() -> impl Strategy<Value = (&'static str, f64)> {
        (
            prop::sample::select(vec![
                "vllm:num_requests_waiting",
                "sglang:num_queue_reqs",
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "sglang:token_usage",
            ]),
            prop_oneof![0.0f64..1.0, 0.0f64..1e12, -5.0f64..0.0],
        )
    }

    fn render(samples: &[(&str, f64)], labels: &[String], ts: bool) -> String {
        let mut out = String::from("# HELP x y\n# TYPE x gauge\n");
        for (i, (name, v)) in samples.iter().enumerate() {
            let l = labels.get(i).map_or("", String::as_str);
            out.push_str(&format!("{name}{l} {v:e}"));
            if ts {
                out.push_str(" 1700000000000");
            }
            out.push('\n');
        }
        out
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Labels, timestamps and comments never change what is read, and what
        /// is read stays within bounds.
        #[test]
        fn labels_do_not_change_the_load(samples in prop::collection::vec(known(), 0..12), labels in prop::collection::vec(labels(), 12), ts: bool) {
            let plain = parse_load(render(&samples, &[], false).as_bytes());
            prop_assert_eq!(parse_load(render(&samples, &labels, ts).as_bytes()), plain);
            prop_assert_eq!(plain.is_some(), !samples.is_empty());
            if let Some(l) = plain {
                prop_assert!(l.waiting.is_none_or(|w| (0.0..=MAX_WAITING).contains(&w)));
                prop_assert!(l.kv_usage.is_none_or(|u| (0.0..=1.0).contains(&u)));
            }
        }

        /// Arbitrary text: no panic, bounded values.
        #[test]
        fn any_text_reads_bounded(samples in prop::collection::vec(known(), 0..6), noise in prop::collection::vec(any::<u8>(), 0..256), at: usize) {
            let mut text = render(&samples, &[], false).into_bytes();
            let at = at % (text.len() + 1);
            text.splice(at..at, noise);
            if let Some(l) = parse_load(&text) {
                prop_assert!(l.waiting.is_none_or(|w| (0.0..=MAX_WAITING).contains(&w)));
                prop_assert!(l.kv_usage.is_none_or(|u| (0.0..=1.0).contains(&u)));
            }
        }
    }
}
