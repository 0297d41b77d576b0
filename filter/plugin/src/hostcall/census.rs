//! A bench build's count of host calls (`--features hostcall-census`): how
//! many crossings into Envoy a call costs, by host call, which is where most
//! of the filter's cost per call goes. The counts are handed to Envoy's stats
//! as `llm_filter_bench_hostcalls_total` (label `call`) after each callback,
//! by calls that are themselves left out, so the bench reads them from the
//! admin port and divides by the calls it sent. The timer's work (probes, the
//! shared-data census, gauges; every 25 ms on every worker) is left out too:
//! it is paid per worker and tick, not per call. The same build times each
//! HTTP callback from its start to its end by the host's clock (a crossing
//! the no-op filter shows costs next to nothing) and hands the nanoseconds
//! over as `llm_filter_bench_callback_ns_total` (label `callback`) once the
//! callback's time is taken, so the hand-over is not in it. A normal build
//! compiles none of this.

use std::cell::Cell;
use std::rc::Rc;

use llm_filter_core::host::Metrics;
use llm_filter_core::metrics::{name, BENCH_CALLBACK_NS, BENCH_HOSTCALLS};

use super::Tally;
use crate::worker::Worker;

thread_local! {
    /// Host calls made since the last hand-over, by call.
    static COUNTS: Tally = const { Tally::new() };
    /// Nanoseconds inside callbacks since the last hand-over, by callback.
    static TIMES: Tally = const { Tally::new() };
    /// True while calls are not counted: the hand-over itself, the timer.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Leaves the host calls made while it lives out of the count.
pub struct Quiet {
    was: bool,
}

impl Quiet {
    /// Stops counting until dropped.
    pub fn new() -> Self {
        Self {
            was: QUIET.with(|q| q.replace(true)),
        }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.with(|q| q.set(self.was));
    }
}

/// Counts one host call.
pub fn count(call: &'static str) {
    if QUIET.with(Cell::get) {
        return;
    }
    COUNTS.with(|c| c.add(call));
}

/// Moves the counts and times into the stats, uncounted.
pub fn hand_over(m: &mut dyn Metrics) {
    let counts = COUNTS.with(Tally::take);
    let times = TIMES.with(Tally::take);
    let _quiet = Quiet::new();
    for (call, n) in counts {
        m.counter(&name(BENCH_HOSTCALLS, &[("call", call)]), n);
    }
    for (callback, ns) in times {
        m.counter(&name(BENCH_CALLBACK_NS, &[("callback", callback)]), ns);
    }
}

/// Times one HTTP callback while it lives, then hands everything over.
pub struct Timed {
    worker: Rc<Worker>,
    callback: &'static str,
    started_ns: u64,
}

impl Timed {
    /// Starts timing `callback`.
    pub fn new(worker: &Rc<Worker>, callback: &'static str) -> Self {
        let _quiet = Quiet::new();
        Self {
            worker: Rc::clone(worker),
            callback,
            started_ns: super::current_time_ns().unwrap_or(0),
        }
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        let quiet = Quiet::new();
        let ns = super::current_time_ns()
            .unwrap_or(0)
            .saturating_sub(self.started_ns);
        TIMES.with(|t| t.add_n(self.callback, ns));
        drop(quiet);
        if let Ok(mut m) = self.worker.metrics.try_borrow_mut() {
            hand_over(&mut *m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_filter_core::host::MemoryMetrics;

    #[test]
    fn counts_by_call_and_hands_over_once() {
        count("get_map_value");
        count("get_map_value");
        count("set_shared_data");
        let mut m = MemoryMetrics::default();
        hand_over(&mut m);
        let stat = |call| name(BENCH_HOSTCALLS, &[("call", call)]);
        assert_eq!(m.counters[&stat("get_map_value")], 2);
        assert_eq!(m.counters[&stat("set_shared_data")], 1);
        hand_over(&mut m);
        assert_eq!(m.counters[&stat("get_map_value")], 2);
        {
            let _quiet = Quiet::new();
            count("get_shared_data");
        }
        count("set_map_value");
        hand_over(&mut m);
        assert!(!m.counters.contains_key(&stat("get_shared_data")));
        assert_eq!(m.counters[&stat("set_map_value")], 1);
    }
}
