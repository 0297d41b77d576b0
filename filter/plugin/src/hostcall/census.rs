//! A bench build's count of host calls (`--features hostcall-census`): how
//! many crossings into Envoy a call costs, by host call, which is where most
//! of the filter's cost per call goes. The counts are handed to Envoy's stats
//! as `llm_filter_bench_hostcalls_total` (label `call`) after each callback,
//! by calls that are themselves left out, so the bench reads them from the
//! admin port and divides by the calls it sent. The timer's work (probes, the
//! shared-data census, gauges; every 25 ms on every worker) is left out too:
//! it is paid per worker and tick, not per call. A normal build compiles none
//! of this.

use std::cell::Cell;

use llm_filter_core::host::Metrics;
use llm_filter_core::metrics::{name, BENCH_HOSTCALLS};

use super::Tally;

thread_local! {
    /// Host calls made since the last hand-over, by call.
    static COUNTS: Tally = const { Tally::new() };
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

/// Moves the counts into the stats, uncounted.
pub fn hand_over(m: &mut dyn Metrics) {
    let counts = COUNTS.with(Tally::take);
    let _quiet = Quiet::new();
    for (call, n) in counts {
        m.counter(&name(BENCH_HOSTCALLS, &[("call", call)]), n);
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
