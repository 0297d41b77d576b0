//! The limits' steps in a build without limits (the sidecar build: limits
//! are held in one place, the gateway tier): nothing is reserved, refused or
//! settled. A `limits` section is refused at load.

use std::ops::ControlFlow;

use crate::limits::{Refused, Switch};
use crate::summary::CallSummary;

use super::{Call, Env, Flow, HeldBody, Host};

impl Call {
    /// Goes on: nothing to reserve.
    pub(super) fn limit(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        ControlFlow::Continue(body)
    }

    /// No shard header: no replica counts the tenant.
    pub(super) fn name_tenant(&self, _env: &mut Env<'_>, _host: &mut dyn Host) {}

    /// A move to another model is held by no rule.
    pub(super) fn limit_move(&mut self, _env: &mut Env<'_>, _model: &str) -> Option<Switch> {
        None
    }

    /// Never called: no rule refuses a move.
    pub(super) fn refuse_move(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _r: &Refused,
    ) -> bool {
        false
    }

    /// Nothing reserved, nothing to settle.
    pub(super) fn settle_limits(&self, _env: &mut Env<'_>, _call: &CallSummary<'_>) {}

    /// The model the call asked for: no backend renamed it.
    pub(super) fn priced_model(&self) -> Option<&str> {
        self.model()
    }

    /// No limits, no rate-limit headers.
    pub(super) fn limit_headers(&self, _out: &mut Vec<(&'static str, String)>) {}
}
