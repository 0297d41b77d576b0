//! State the contexts of one worker VM share, taken in turn. Envoy calls the
//! module one callback at a time, but a host that called back into it from
//! inside a host call would find a callback's state still in use: a borrow
//! that panics there would trap the VM. So the state is only reached through
//! [`Turn::with`], which finds it busy instead; the caller then goes on as if
//! the filter were absent, and the miss is counted as
//! `llm_filter_internal_errors_total{reason="reentered"}`.

use std::cell::{Cell, RefCell, RefMut};

use llm_filter_core::host::Metrics;
use llm_filter_core::metrics;

/// The reason the misses are counted under.
const REENTERED: &str = "reentered";

thread_local! {
    /// Turns refused since the last [`count_missed`]: the stats may be the
    /// state that was busy.
    static MISSED: Cell<u64> = const { Cell::new(0) };
}

/// A value one callback at a time works on.
#[derive(Debug, Default)]
pub struct Turn<T: ?Sized>(RefCell<T>);

impl<T> Turn<T> {
    /// A turn at `value`.
    pub fn new(value: T) -> Self {
        Self(RefCell::new(value))
    }
}

impl<T: ?Sized> Turn<T> {
    /// The value until the guard is dropped; `None` (the miss noted) while
    /// another callback has it.
    pub fn take(&self) -> Option<RefMut<'_, T>> {
        let taken = self.0.try_borrow_mut().ok();
        if taken.is_none() {
            MISSED.with(|m| m.set(m.get().saturating_add(1)));
        }
        taken
    }

    /// Runs `f` on the value; `None` (the miss noted) while another callback
    /// has it.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.take().map(|mut value| f(&mut value))
    }
}

/// Moves the misses noted since the last time into the stats.
pub fn count_missed(m: &mut dyn Metrics) {
    for _ in 0..MISSED.with(|c| c.replace(0)) {
        metrics::internal_error(m, REENTERED);
    }
}

/// A stats sink that keeps nothing: what a callback writes to while the
/// worker's stats are busy, so the work still happens and only its stats are
/// lost.
pub struct Discard;

impl Metrics for Discard {
    fn counter(&mut self, _: &str, _: u64) {}
    fn gauge(&mut self, _: &str, _: i64) {}
    fn gauge_add(&mut self, _: &str, _: i64) {}
    fn histogram(&mut self, _: &str, _: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_filter_core::host::MemoryMetrics;

    #[test]
    fn a_busy_turn_is_refused_and_counted_once() {
        let mut m = MemoryMetrics::default();
        count_missed(&mut m);
        let turn = Turn::new(1);
        let inner = turn.with(|outer| {
            *outer += 1;
            turn.with(|inner| *inner += 1)
        });
        assert_eq!(inner, Some(None));
        assert_eq!(turn.with(|v| *v), Some(2));
        count_missed(&mut m);
        let stat = "llm_filter_internal_errors_totalreason=.=reentered;.;";
        assert_eq!(m.counters.get(stat), Some(&1));
        count_missed(&mut m);
        assert_eq!(m.counters.get(stat), Some(&1));
    }
}
