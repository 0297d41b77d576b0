//! Counts by host call, kept aside until taken: the stats sink may be
//! borrowed (or failing) when a host call is made, so what a host call has to
//! say is noted here and handed to the stats later.

use std::cell::RefCell;

/// Counts by host call, kept aside until taken: the stats sink may be
/// borrowed (or failing) when a host call is made.
pub struct Tally(RefCell<Vec<(&'static str, u64)>>);

impl Tally {
    /// An empty tally.
    pub const fn new() -> Self {
        Self(RefCell::new(Vec::new()))
    }

    /// Counts one more `call`.
    pub fn add(&self, call: &'static str) {
        self.add_n(call, 1);
    }

    /// Counts `n` more under `call`.
    pub fn add_n(&self, call: &'static str, n: u64) {
        let Ok(mut t) = self.0.try_borrow_mut() else {
            return;
        };
        match t.iter_mut().find(|(c, _)| *c == call) {
            Some((_, m)) => *m = m.saturating_add(n),
            None => t.push((call, n)),
        }
    }

    /// The counts since the last take, by call.
    pub fn take(&self) -> Vec<(&'static str, u64)> {
        self.0
            .try_borrow_mut()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
    }
}
