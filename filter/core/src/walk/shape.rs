//! The shaping step of the walk: before the cache looks the call up, the held
//! body is reshaped under the limits of the call's priority (those of its A/B
//! group when the group overrides them), so the cache key is taken over what
//! is actually sent. The client hears what changed in
//! `x-llm-shaped`.

use std::ops::ControlFlow;

use crate::metrics as names;
use crate::shaping::{self, Limits};

use super::{Call, Env, Flow, HeldBody};

impl Call {
    /// Shapes a held chat completions, Responses, Messages or Gemini body,
    /// each by its own fields; any other body (or one shaping does not understand)
    /// goes on as it was. Always goes on.
    pub(super) fn shape(&mut self, env: &mut Env<'_>, body: Option<HeldBody>) -> Flow {
        let Some(mut body) = body else {
            return ControlFlow::Continue(None);
        };
        let mut limits = self.shaping_limits(env);
        if let Some(cap) = limits.prompt_tokens {
            // The cap is on the tokens the model counts.
            limits.prompt_tokens = Some(self.estimate_ratio(env).uncalibrated(cap));
        }
        let dialect = self.request.dialect;
        if !dialect.request().shaped() || !limits.any() {
            return ControlFlow::Continue(Some(body));
        }
        let field = self.shaping_config(env.config).field;
        let changes = shaping::shape(&mut body.doc, dialect, &limits, field);
        if changes.is_empty() {
            return ControlFlow::Continue(Some(body));
        }
        body.was_edited();
        self.decided.shaped = changes;
        for what in changes.iter() {
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
        ControlFlow::Continue(Some(body))
    }

    /// The limits for this call: its group's, or the top-level ones.
    fn shaping_limits(&self, env: &Env<'_>) -> Limits {
        self.shaping_config(env.config)
            .limits(self.request.priority)
    }
}
