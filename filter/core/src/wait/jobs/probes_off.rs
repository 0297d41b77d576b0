//! The routing probes in a build without routing: none is ever due.

use crate::walk::Env;

use super::{Callout, Job, Outcome};

/// No probe: the prober of a build without routing.
#[derive(Debug, Clone, Default)]
pub struct Prober;

impl Prober {
    /// The prober of any worker.
    pub fn new(_worker_id: u64) -> Self {
        Self
    }
}

/// A probe, of which this build sends none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {}

impl Job for Prober {
    type Ask = Probe;

    fn due(&mut self, _env: &mut Env<'_>) -> Vec<(Callout, Probe)> {
        Vec::new()
    }

    fn finish(&mut self, _env: &mut Env<'_>, probe: &Probe, _outcome: Outcome<'_>) {
        match *probe {}
    }

    fn reads_body_up_to(probe: &Probe) -> usize {
        match *probe {}
    }
}
