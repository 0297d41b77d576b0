//! The degrade step of the walk: after shaping and before the cache step, a
//! call of a model at a degrade level gets what its level does to its
//! priority — refused, answered from the cache (even past expiry), or sent
//! with a cheaper model, fewer output tokens and a lower temperature. The
//! body edits come before the cache key, so the key is over what is sent.

use std::ops::ControlFlow;

use crate::degrade::{self, Action};
use crate::metrics as names;

use super::{Call, Env, Flow, HeldBody, Host, Step};

impl Call {
    /// Applies the call's degrade actions: refused or answered from the
    /// cache here, or on with the edited body.
    pub(super) fn degrade(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        let Some(model) = self.request.view.model.clone() else {
            return ControlFlow::Continue(body);
        };
        let (level, signals) = degrade::level_with(env.store, env.config, &model, env.now_ms);
        // The timer publishes the level of every model with load each second
        // (`degrade::publish`); a degraded call sets it at once, since a model
        // whose calls are all refused has no load to be published by.
        if level > 0 {
            let label = env.model_labels.value(Some(&model)).to_string();
            degrade::set_level_gauge(env.metrics, &label, level);
        }
        // The level is the model's; what it does is the call's group's.
        let cfg = self.degrade_config(env.config);
        let priority = self.request.priority;
        let actions = cfg.actions(level, priority);
        if actions.is_empty() {
            return ControlFlow::Continue(body);
        }
        if let Some((action, reply)) = degrade::refusal(cfg, actions) {
            self.decided.degraded = Some(level);
            degrade::count(env.metrics, action, priority);
            return ControlFlow::Break(self.reply_locally(env, host, reply));
        }
        let Some(mut body) = body else {
            return ControlFlow::Continue(None);
        };
        if actions.contains(&Action::Cache) && self.answer_downgraded(env, host, &body, level) {
            degrade::count(env.metrics, Action::Cache, priority);
            return ControlFlow::Break(Step::Pause);
        }
        let dialect = self.request.dialect;
        let field = self.shaping_config(env.config).field;
        // What the dialect has no field for is skipped, and counted.
        let api = dialect.request();
        let (apply, skip): (Vec<Action>, Vec<Action>) = actions.iter().partition(|a| match a {
            Action::MaxTokens => api.caps_output(),
            Action::Temperature => api.samples(),
            _ => true,
        });
        for action in skip {
            env.metrics.counter(
                &names::name(
                    names::DEGRADE_SKIPPED,
                    &[("action", action.as_str()), ("api", dialect.api())],
                ),
                1,
            );
        }
        let target = degrade::Target {
            dialect,
            path: self.path(),
            model: &model,
        };
        let edited = degrade::edit(cfg, &apply, &mut body.doc, &target, field, &signals);
        if let Some(edited) = edited {
            body.was_edited();
            self.decided.degraded = Some(level);
            for action in &edited.applied {
                degrade::count(env.metrics, *action, priority);
            }
            if let Some(fallback) = edited.model {
                self.decided.fallback_model = Some(fallback);
            }
            if let Some(path) = edited.path {
                self.switch_path(env, host, path);
            }
        }
        ControlFlow::Continue(Some(body))
    }
}
