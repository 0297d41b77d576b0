//! The shaping step of the walk: before the cache looks the call up, the held
//! body is reshaped under the limits of the call's priority (those of its A/B
//! group when the group overrides them), so the cache key is taken over what
//! is actually sent. The client hears what changed in
//! `x-llm-shaped`.

use crate::classify::Endpoint;
use crate::metrics as names;
use crate::shaping::{self, Limits};

use super::{Call, Env, HeldBody, Host};

impl Call {
    /// Shapes a held chat completions body; any other body (or one shaping
    /// does not understand, or the host refused to replace) goes on as it was.
    pub(super) fn shape(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Option<HeldBody> {
        let body = body?;
        let limits = self.shaping_limits(env);
        if self.request.endpoint != Endpoint::Chat || !limits.any() {
            return Some(body);
        }
        let field = self.shaping_config(env.config).field;
        let Some(shaped) = body
            .tree
            .as_ref()
            .and_then(|tree| shaping::shape(&body.raw, tree, &limits, field))
        else {
            return Some(body);
        };
        let body = match body.replace(env, host, shaped.body) {
            Ok(body) => body,
            Err(unchanged) => return Some(unchanged),
        };
        self.request.shaped = shaped.changes;
        for what in shaped.changes.iter() {
            env.metrics.counter(
                &names::name(
                    names::SHAPED,
                    &[
                        ("what", what.as_str()),
                        ("priority", self.request.priority.as_str()),
                    ],
                ),
                1,
            );
        }
        Some(body)
    }

    /// The limits for this call: its group's, or the top-level ones.
    fn shaping_limits(&self, env: &Env<'_>) -> Limits {
        self.shaping_config(env.config)
            .limits(self.request.priority)
    }
}
