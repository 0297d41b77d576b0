//! What every context of one worker VM shares: the compiled configuration,
//! the host's stats and randomness, the calls parked for the timer, the
//! callouts in flight and the background jobs. The
//! root context builds it once; the HTTP contexts and the timer take turns at
//! it (see [`crate::turn`]).

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use llm_filter_core::config::Config;
use llm_filter_core::host::{Metrics, SplitMix64};
use llm_filter_core::metrics::{self, BoundedLabel};
use llm_filter_core::wait::{Continuation, Jobs, Waits};
use llm_filter_core::walk::{Call, Env};
use llm_filter_core::{load, spans};

use crate::adapter::{now_ms, EnvoyMetrics, EnvoyStore};
use crate::hostcall;
use crate::turn::{self, Discard, Turn};

/// A call slot shared between its HTTP context and the timer.
pub type CallSlot = Rc<RefCell<Option<Call>>>;
/// A parked call: its context id and its slot (gone once the stream ends).
pub type ParkedCall = (u32, Weak<RefCell<Option<Call>>>);
/// What the worker's registry keeps of a callout.
pub type Then = Continuation<ParkedCall>;

/// What the walk draws on besides the stats.
struct Draws {
    /// Randomness, seeded once from the host.
    rng: SplitMix64,
    /// Bound on the values of the `model` label.
    model_labels: BoundedLabel,
    /// Bound on the values of the `tenant` label.
    tenant_labels: BoundedLabel,
    /// This worker's spans waiting for export.
    spans: spans::Queue,
    /// This worker's ended calls not yet in the load records.
    load: load::Pending,
}

/// What every HTTP context of this worker shares.
pub struct Worker {
    /// The compiled configuration.
    pub config: Config,
    /// Envoy delivers request bodies to paused streams (it does not without
    /// `allow_on_headers_stop_iteration`).
    pub can_hold_body: Cell<bool>,
    /// The time the last callback read, ms: when a callout it sent left.
    last_now_ms: Cell<u64>,
    /// Stats sink (shared with a census build's timing of each callback).
    metrics: Rc<Turn<EnvoyMetrics>>,
    draws: Turn<Draws>,
    /// Calls waiting for the timer, by context id.
    parked: Turn<Vec<ParkedCall>>,
    /// The callouts in flight, by token, with what should happen to their
    /// answers.
    pub waits: Turn<Waits<ParkedCall>>,
    /// The background jobs: probes, the degrade sources' pulls, the span
    /// export.
    pub jobs: Turn<Jobs>,
}

impl Worker {
    /// The worker of `config`, with the stats defined so far, its generator,
    /// its bound on model labels and its background jobs.
    pub fn new(
        config: Config,
        metrics: EnvoyMetrics,
        rng: SplitMix64,
        model_labels: BoundedLabel,
        jobs: Jobs,
    ) -> Self {
        let tenant_labels = BoundedLabel::new(config.limits.tenant_labels);
        Self {
            config,
            can_hold_body: Cell::new(true),
            last_now_ms: Cell::new(0),
            metrics: Rc::new(Turn::new(metrics)),
            draws: Turn::new(Draws {
                rng,
                model_labels,
                tenant_labels,
                spans: spans::Queue::default(),
                load: load::Pending::default(),
            }),
            parked: Turn::new(Vec::new()),
            waits: Turn::new(Waits::default()),
            jobs: Turn::new(jobs),
        }
    }

    /// Registers `then` for the answer of callout `token`, sent now with a
    /// timeout of `timeout_ms`; the continuation when it was not kept (the
    /// registry full, or busy in another callback).
    pub fn register(&self, token: u32, then: Then, timeout_ms: u64) -> Option<Then> {
        let now = self.last_now_ms.get();
        let mut then = Some(then);
        self.waits.with(|w| {
            if let Some(t) = then.take() {
                then = w
                    .register(token, t, now, timeout_ms)
                    .err()
                    .map(|full| full.0);
            }
        });
        then
    }

    /// The call of stream `id` ended: answers to its callouts find nothing.
    pub fn forget_calls(&self, id: u32) {
        self.waits.with(|w| w.forget_calls(|(call, _)| *call == id));
    }

    /// Remembers a call that waits for the timer.
    pub fn park(&self, context_id: u32, slot: &CallSlot) {
        self.parked.with(|parked| {
            if !parked.iter().any(|(id, _)| *id == context_id) {
                parked.push((context_id, Rc::downgrade(slot)));
            }
        });
    }

    /// Takes the parked calls, for the timer to look at; it gives back those
    /// still waiting with [`Worker::repark`].
    pub fn take_parked(&self) -> Vec<ParkedCall> {
        self.parked.with(std::mem::take).unwrap_or_default()
    }

    /// Parks again calls taken with [`Worker::take_parked`].
    pub fn repark(&self, calls: Vec<ParkedCall>) {
        self.parked.with(|parked| parked.extend(calls));
    }

    /// Runs `f` with the worker's stats, or, while another callback has them,
    /// with a sink that keeps nothing: the work is done either way.
    pub fn with_metrics<T>(&self, f: impl FnOnce(&mut dyn Metrics) -> T) -> T {
        match self.metrics.take() {
            Some(mut m) => f(&mut *m),
            None => f(&mut Discard),
        }
    }

    /// Adds the calls that ended since the last tick to their load records
    /// (see [`load::Pending`]); while another callback has the worker, they
    /// wait for the next tick.
    pub fn flush_load(&self, now_ms: u64) {
        self.metrics.with(|m| {
            self.draws.with(|d| {
                if !d.load.is_empty() {
                    load::flush(&EnvoyStore, m, &self.config.names, &mut d.load, now_ms);
                }
            })
        });
    }

    /// Counts the filter's own trouble; the stream goes on untouched.
    pub fn internal_error(&self, reason: &str) {
        self.with_metrics(|m| metrics::internal_error(m, reason));
    }

    /// Counts the host calls that failed unexpectedly, and the turns
    /// refused, since the last time.
    pub fn count_host_errors(&self) {
        self.metrics.with(|m| {
            hostcall::count_unexpected(m);
            turn::count_missed(m);
        });
    }

    /// The stats, for a census build to hand its counts over to.
    #[cfg(feature = "hostcall-census")]
    pub fn stats(&self) -> Rc<Turn<dyn Metrics>> {
        self.metrics.clone()
    }
}

/// Runs `f` with the worker's environment, read at this instant, then counts
/// the host calls that failed unexpectedly meanwhile; `None` while another
/// callback has the worker, for the caller to go on as if the filter were
/// absent. (A census build hands its counts over when the callback's timing
/// ends, not here.)
pub fn with_env<T>(worker: &Worker, f: impl FnOnce(&mut Env<'_>) -> T) -> Option<T> {
    worker
        .metrics
        .with(|metrics| {
            let now = now_ms();
            worker.last_now_ms.set(now);
            let out = worker.draws.with(|draws| {
                let mut env = Env {
                    config: &worker.config,
                    store: &EnvoyStore,
                    metrics,
                    rng: &mut draws.rng,
                    model_labels: &mut draws.model_labels,
                    tenant_labels: &mut draws.tenant_labels,
                    spans: &mut draws.spans,
                    load: &mut draws.load,
                    now_ms: now,
                    can_hold_body: worker.can_hold_body.get(),
                };
                f(&mut env)
            });
            hostcall::count_unexpected(metrics);
            turn::count_missed(metrics);
            out
        })
        .flatten()
}
