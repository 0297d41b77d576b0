//! The span export as a background job.

use crate::walk::Env;

use super::{Callout, Job, Outcome};

/// The export of the worker's spans (`tracing.otlp`): one batch in flight
/// at a time, from the queue the calls fill.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanExport;

impl Job for SpanExport {
    type Ask = ();

    fn due(&mut self, env: &mut Env<'_>) -> Vec<(Callout, ())> {
        let Some(otlp) = env.config.otlp.as_ref() else {
            return Vec::new();
        };
        let Some(batch) = env.spans.due(otlp, env.metrics, env.now_ms) else {
            return Vec::new();
        };
        let callout = Callout {
            cluster: batch.cluster,
            headers: batch.headers,
            body: Some(batch.body),
            timeout_ms: batch.timeout_ms,
        };
        vec![(callout, ())]
    }

    fn finish(&mut self, env: &mut Env<'_>, _: &(), outcome: Outcome<'_>) {
        env.spans.finished(env.metrics, outcome.status());
    }

    fn reads_body_up_to(_: &()) -> usize {
        0
    }
}
