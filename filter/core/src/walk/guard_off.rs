//! The guardrails' step in a build without guardrails (the sidecar build:
//! the gateway tier checks prompts): every call goes on as it came. A
//! `guardrails` section is refused at load.

use std::ops::ControlFlow;

use super::{Call, Env, Flow, HeldBody, Host};

impl Call {
    /// Goes on: nothing is looked for.
    pub(super) fn guard(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        ControlFlow::Continue(body)
    }
}
