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
//! callback's time is taken, so the hand-over is not in it. It times each
//! host call the same way (`llm_filter_bench_hostcall_ns_total`, label
//! `call`), so the time inside the callbacks splits into the host's and the
//! module's own. Those clock reads are taken back out: each callback samples
//! what one costs, and its time and its host calls' lose what their reads
//! added. A normal build compiles none of this.

use std::cell::Cell;
use std::rc::Rc;

use llm_filter_core::host::Metrics;
use llm_filter_core::metrics::{name, BENCH_CALLBACK_NS, BENCH_HOSTCALLS, BENCH_HOSTCALL_NS};

use super::abi;
use super::tally::Tally;
use crate::turn::Turn;

/// The host's clock for the census: neither counted nor checked (a failed
/// read is a 0, which only the bench's numbers would show).
fn clock() -> u64 {
    let mut t: u64 = 0;
    // SAFETY: `t` outlives the call.
    unsafe { abi::proxy_get_current_time_nanoseconds(&mut t) };
    t
}

thread_local! {
    /// Host calls made since the last hand-over, by call.
    static COUNTS: Tally = const { Tally::new() };
    /// Nanoseconds inside callbacks since the last hand-over, by callback.
    static TIMES: Tally = const { Tally::new() };
    /// Nanoseconds inside host calls since the last hand-over, by call.
    static HOST_TIMES: Tally = const { Tally::new() };
    /// The last crossing's nanoseconds, until its check names the call.
    static PENDING_NS: Cell<u64> = const { Cell::new(0) };
    /// What one clock read costs, sampled as the current callback began.
    static CLOCK_NS: Cell<u64> = const { Cell::new(0) };
    /// Host calls timed since the current callback began.
    static TIMED: Cell<u64> = const { Cell::new(0) };
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

/// Times one crossing into the host (less one clock read: the end of the
/// first and the start of the second) for the [`count`] that follows.
pub fn crossing(f: impl FnOnce() -> u32) -> u32 {
    if QUIET.with(Cell::get) {
        return f();
    }
    let started = clock();
    let status = f();
    let ns = clock()
        .saturating_sub(started)
        .saturating_sub(CLOCK_NS.with(Cell::get));
    PENDING_NS.with(|p| p.set(ns));
    TIMED.with(|t| t.set(t.get() + 1));
    status
}

/// Counts one host call, with the time of the crossing it follows.
pub fn count(call: &'static str) {
    let ns = PENDING_NS.with(|p| p.replace(0));
    if QUIET.with(Cell::get) {
        return;
    }
    COUNTS.with(|c| c.add(call));
    HOST_TIMES.with(|t| t.add_n(call, ns));
}

/// Moves the counts and times into the stats, uncounted.
pub fn hand_over(m: &mut dyn Metrics) {
    let counts = COUNTS.with(Tally::take);
    let times = TIMES.with(Tally::take);
    let host_times = HOST_TIMES.with(Tally::take);
    let _quiet = Quiet::new();
    for (call, n) in counts {
        m.counter(&name(BENCH_HOSTCALLS, &[("call", call)]), n);
    }
    for (callback, ns) in times {
        m.counter(&name(BENCH_CALLBACK_NS, &[("callback", callback)]), ns);
    }
    for (call, ns) in host_times {
        m.counter(&name(BENCH_HOSTCALL_NS, &[("call", call)]), ns);
    }
}

/// Times one HTTP callback while it lives, then hands everything over to
/// the worker's stats.
pub struct Timed {
    stats: Rc<Turn<dyn Metrics>>,
    callback: &'static str,
    started_ns: u64,
}

impl Timed {
    /// Starts timing `callback`, for `stats`.
    pub fn new(stats: Rc<Turn<dyn Metrics>>, callback: &'static str) -> Self {
        let sample = clock();
        CLOCK_NS.with(|c| c.set(clock().saturating_sub(sample)));
        TIMED.with(|t| t.set(0));
        Self {
            stats,
            callback,
            started_ns: clock(),
        }
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        // Each timed host call added two clock reads.
        let reads = 2 * TIMED.with(|t| t.replace(0));
        let ns = clock()
            .saturating_sub(self.started_ns)
            .saturating_sub(reads * CLOCK_NS.with(Cell::get));
        TIMES.with(|t| t.add_n(self.callback, ns));
        // Busy stats keep the counts for the next hand-over.
        if let Some(mut m) = self.stats.take() {
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
