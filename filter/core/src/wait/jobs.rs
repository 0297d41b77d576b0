//! The worker's background jobs — the routing probes, the degrade sources'
//! pulls, the span export — behind one small trait: which callouts are due,
//! and how one ended. The timer asks every job alike, and each callout's
//! continuation names the job its answer goes back to.

use crate::degrade::sources::{self, Pull, Puller};
use crate::routing::probe::ProbeEnd;
use crate::walk::{CalloutAnswer, Env};

// A job whose feature the build leaves out is its `*_off.rs` twin: nothing
// is ever due (filter/core/Cargo.toml).
#[cfg_attr(not(feature = "routing"), path = "jobs/probes_off.rs")]
mod probes;
#[cfg_attr(not(feature = "spans"), path = "jobs/spans_off.rs")]
mod spans;

use probes::{Probe, Prober};
pub use spans::SpanExport;

/// One callout a job sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callout {
    /// Envoy cluster to send it to.
    pub cluster: String,
    /// Request headers, pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// Request body, if any.
    pub body: Option<Vec<u8>>,
    /// Give up on the answer after this long.
    pub timeout_ms: u64,
}

/// How a job's callout ended.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// The host would not send it (Envoy knows no such cluster).
    NotSent,
    /// Its answer came (`status` `None`: it timed out or its connection failed).
    Came(&'a CalloutAnswer),
}

impl<'a> Outcome<'a> {
    /// The end as the probes and pulls read it.
    pub(super) fn probe_end(self) -> ProbeEnd<'a> {
        match self {
            Self::NotSent => ProbeEnd::NotSent,
            Self::Came(a) => ProbeEnd::of(a.status, &a.body),
        }
    }

    /// The answer's status, when one came.
    pub(super) fn status(self) -> Option<u16> {
        match self {
            Self::NotSent => None,
            Self::Came(a) => a.status,
        }
    }
}

/// A background job of the worker: the timer asks it for the callouts due,
/// and hands each one's end back.
pub trait Job {
    /// What the job keeps of one callout until its answer.
    type Ask;
    /// The callouts due at `env.now_ms`, each with what it keeps of it.
    fn due(&mut self, env: &mut Env<'_>) -> Vec<(Callout, Self::Ask)>;
    /// How the callout `ask` ended.
    fn finish(&mut self, env: &mut Env<'_>, ask: &Self::Ask, outcome: Outcome<'_>);
    /// The longest answer body `ask` reads (0: none).
    fn reads_body_up_to(ask: &Self::Ask) -> usize;
}

impl Job for Puller {
    type Ask = Pull;

    fn due(&mut self, env: &mut Env<'_>) -> Vec<(Callout, Pull)> {
        let pulls = Puller::due(self, &env.config.degrade, env.store, env.now_ms);
        pulls
            .into_iter()
            .map(|p| {
                let callout = Callout {
                    cluster: p.cluster.clone(),
                    headers: p.headers.clone(),
                    body: None,
                    timeout_ms: p.timeout_ms,
                };
                (callout, p)
            })
            .collect()
    }

    fn finish(&mut self, env: &mut Env<'_>, pull: &Pull, outcome: Outcome<'_>) {
        Puller::finish(
            self,
            env.config,
            env.store,
            env.metrics,
            pull,
            outcome.probe_end(),
            env.now_ms,
        );
    }

    fn reads_body_up_to(_: &Pull) -> usize {
        sources::MAX_ANSWER_BYTES
    }
}

/// What a background job's callout goes back to: one variant per job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobWait {
    /// A routing probe.
    Probe(Probe),
    /// A degrade source's pull.
    Pull(Pull),
    /// A batch of spans.
    SpanExport,
}

impl JobWait {
    /// The longest answer body it reads.
    pub(super) fn reads_body_up_to(&self) -> usize {
        match self {
            Self::Probe(p) => Prober::reads_body_up_to(p),
            Self::Pull(p) => Puller::reads_body_up_to(p),
            Self::SpanExport => SpanExport::reads_body_up_to(&()),
        }
    }
}

/// Every background job of one worker.
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    probes: Prober,
    pulls: Puller,
    spans: SpanExport,
}

impl Jobs {
    /// The jobs of the worker whose ids in the probe and pull leases are
    /// `prober_id` and `puller_id` (non-zero, random per worker VM).
    pub fn new(prober_id: u64, puller_id: u64) -> Self {
        Self {
            probes: Prober::new(prober_id),
            pulls: Puller::new(puller_id),
            spans: SpanExport,
        }
    }

    /// Every job's callouts due at `env.now_ms`, each with where its answer
    /// goes back to.
    pub fn due(&mut self, env: &mut Env<'_>) -> Vec<(Callout, JobWait)> {
        let mut due: Vec<(Callout, JobWait)> = Job::due(&mut self.probes, env)
            .into_iter()
            .map(|(c, p)| (c, JobWait::Probe(p)))
            .collect();
        due.extend(
            Job::due(&mut self.pulls, env)
                .into_iter()
                .map(|(c, p)| (c, JobWait::Pull(p))),
        );
        due.extend(
            Job::due(&mut self.spans, env)
                .into_iter()
                .map(|(c, ())| (c, JobWait::SpanExport)),
        );
        due
    }

    /// Hands the end of a callout to the job that sent it.
    pub fn finish(&mut self, env: &mut Env<'_>, wait: &JobWait, outcome: Outcome<'_>) {
        match wait {
            JobWait::Probe(p) => Job::finish(&mut self.probes, env, p, outcome),
            JobWait::Pull(p) => Job::finish(&mut self.pulls, env, p, outcome),
            JobWait::SpanExport => Job::finish(&mut self.spans, env, &(), outcome),
        }
    }
}
