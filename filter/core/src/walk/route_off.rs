//! Routing's step in a build without routing (the sidecar build: the
//! gateway tier routes): the call goes where Envoy's route sends it, with
//! the body every step edited. A `routing` section is refused at load.

use crate::routing::affinity;
use crate::summary::Try;

use super::upstream::Chosen;
use super::{Call, Env, HeldBody, Host};

impl Call {
    /// No markers: `routing.prompt_cache` is the gateway tier's.
    pub(super) fn mark_prompt_cache(&mut self, _env: &mut Env<'_>, _body: &mut HeldBody) {}

    /// No affinity: nothing routes by it.
    pub(super) fn affinity_key(
        &self,
        _env: &Env<'_>,
        _host: &dyn Host,
        _body: &HeldBody,
    ) -> Option<affinity::Key> {
        None
    }

    /// Nothing to learn: no try has a cluster the filter chose.
    pub(super) fn routing_learns(&self, _env: &mut Env<'_>, _model: &str, _t: &Try<'_>) {}

    /// Writes the edited body; no cluster is chosen.
    pub(super) fn route(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: &HeldBody,
    ) -> Chosen {
        self.send_body(env, host, body, None);
        Chosen::default()
    }
}
