//! The span export in a build without spans: nothing is ever exported.

use crate::walk::Env;

use super::{Callout, Job, Outcome};

/// No export: the span job of a build without spans.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanExport;

impl Job for SpanExport {
    type Ask = ();

    fn due(&mut self, _env: &mut Env<'_>) -> Vec<(Callout, ())> {
        Vec::new()
    }

    fn finish(&mut self, _env: &mut Env<'_>, _: &(), _outcome: Outcome<'_>) {}

    fn reads_body_up_to(_: &()) -> usize {
        0
    }
}
