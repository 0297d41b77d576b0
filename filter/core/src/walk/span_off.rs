//! The span's part of the walk in a build without spans (the sidecar
//! build): nothing is captured and no span is queued; `tracing.otlp` and
//! `tracing.capture` are refused at load. The trace context itself
//! (`traceparent`) is carried all the same.

use crate::config::Config;
use crate::dialect::Dialect;
use crate::spans::Captured;
use crate::summary::CallSummary;

use super::state::Response;
use super::{Call, Env, HeldBody};

impl Call {
    /// Nothing is captured.
    pub(super) fn capture_prompt(&mut self, _env: &Env<'_>, _body: &HeldBody) {}

    /// No span is exported.
    pub(super) fn queue_span(&self, _env: &mut Env<'_>, _call: &CallSummary<'_>) {}

    /// Nothing is captured.
    pub(super) fn captured_completion<'a>(
        &self,
        _response: &'a Response,
        _dialect: Dialect,
        _config: &Config,
    ) -> Option<&'a Captured> {
        None
    }
}
