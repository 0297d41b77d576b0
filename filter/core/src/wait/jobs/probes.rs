//! The routing probes as a background job.

use crate::routing::probe;
pub use crate::routing::probe::{Probe, Prober};
use crate::walk::Env;

use super::{Callout, Job, Outcome};

impl Job for Prober {
    type Ask = Probe;

    fn due(&mut self, env: &mut Env<'_>) -> Vec<(Callout, Probe)> {
        let probes = Prober::due(self, &env.config.routing, env.store, env.now_ms);
        probes
            .into_iter()
            .map(|p| {
                let callout = Callout {
                    cluster: p.cluster.clone(),
                    headers: p
                        .headers
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), v.clone()))
                        .collect(),
                    body: p.body.clone(),
                    timeout_ms: p.timeout_ms,
                };
                (callout, p)
            })
            .collect()
    }

    fn finish(&mut self, env: &mut Env<'_>, probe: &Probe, outcome: Outcome<'_>) {
        let cfg = &env.config.routing;
        Prober::finish(
            self,
            cfg,
            env.store,
            env.metrics,
            probe,
            outcome.probe_end(),
            env.now_ms,
        );
    }

    fn reads_body_up_to(probe: &Probe) -> usize {
        if probe.kind.reads_body() {
            probe::MAX_METRICS_BYTES
        } else {
            0
        }
    }
}
