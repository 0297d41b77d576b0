//! What every context of one worker VM shares: the compiled configuration,
//! the host's stats and randomness, and the calls parked for the timer. The
//! root context builds it once; the HTTP contexts and the timer borrow it.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use llm_filter_core::config::Config;
use llm_filter_core::host::SplitMix64;
use llm_filter_core::metrics::{self, BoundedLabel};
use llm_filter_core::walk::{Call, Env};

use crate::host::{now_ms, EnvoyMetrics, EnvoyStore};
use crate::hostcall;

/// A call slot shared between its HTTP context and the timer.
pub type CallSlot = Rc<RefCell<Option<Call>>>;
/// A parked call: its context id and its slot (gone once the stream ends).
pub type ParkedCall = (u32, Weak<RefCell<Option<Call>>>);

/// What every HTTP context of this worker shares.
pub struct Worker {
    /// The compiled configuration.
    pub config: Config,
    /// Stats sink.
    pub metrics: RefCell<EnvoyMetrics>,
    /// Randomness, seeded once from the host.
    pub rng: RefCell<SplitMix64>,
    /// Bound on the values of the `model` label.
    pub model_labels: RefCell<BoundedLabel>,
    /// Envoy delivers request bodies to paused streams (it does not without
    /// `allow_on_headers_stop_iteration`).
    pub can_hold_body: Cell<bool>,
    /// Calls waiting for the timer, by context id.
    pub parked: RefCell<Vec<ParkedCall>>,
}

impl Worker {
    /// Remembers a call that waits for the timer.
    pub fn park(&self, context_id: u32, slot: &CallSlot) {
        let mut parked = self.parked.borrow_mut();
        if !parked.iter().any(|(id, _)| *id == context_id) {
            parked.push((context_id, Rc::downgrade(slot)));
        }
    }

    /// Takes the parked calls, for the timer to look at; it gives back those
    /// still waiting with [`Worker::repark`].
    pub fn take_parked(&self) -> Vec<ParkedCall> {
        std::mem::take(&mut *self.parked.borrow_mut())
    }

    /// Counts the filter's own trouble; the stream goes on untouched.
    pub fn internal_error(&self, reason: &str) {
        metrics::internal_error(&mut *self.metrics.borrow_mut(), reason);
    }

    /// Counts the host calls that failed unexpectedly since the last time.
    pub fn count_host_errors(&self) {
        if let Ok(mut m) = self.metrics.try_borrow_mut() {
            hostcall::count_unexpected(&mut *m);
        }
    }

    /// Parks again calls taken with [`Worker::take_parked`].
    pub fn repark(&self, calls: Vec<ParkedCall>) {
        self.parked.borrow_mut().extend(calls);
    }
}

/// Runs `f` with the worker's environment, read at this instant, then counts
/// the host calls that failed unexpectedly meanwhile. (A census build hands
/// its counts over when the callback's timing ends, not here.)
pub fn with_env<T>(worker: &Worker, f: impl FnOnce(&mut Env<'_>) -> T) -> T {
    let mut metrics = worker.metrics.borrow_mut();
    let mut rng = worker.rng.borrow_mut();
    let mut model_labels = worker.model_labels.borrow_mut();
    let mut env = Env {
        config: &worker.config,
        store: &EnvoyStore,
        metrics: &mut *metrics,
        rng: &mut *rng,
        model_labels: &mut model_labels,
        now_ms: now_ms(),
        can_hold_body: worker.can_hold_body.get(),
    };
    let out = f(&mut env);
    hostcall::count_unexpected(&mut *metrics);
    out
}
