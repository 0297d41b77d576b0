//! The degrade step of the walk: after shaping and before the cache step, a
//! call of a model at a degrade level gets what its level does to its
//! priority — refused, answered from the cache (even past expiry), or sent
//! with a cheaper model, fewer output tokens and a lower temperature. The
//! body edits come before the cache key, so the key is over what is sent.

use crate::degrade::{self, Action};
use crate::json::Json;

use super::{Call, Env, HeldBody, Host, Step};

impl Call {
    /// Applies the call's degrade actions. `Ok(step)`: the call was answered
    /// here; `Err(body)`: it goes on with this body.
    pub(super) fn degrade(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Result<Step, Option<HeldBody>> {
        let Some(model) = self.request.model.clone() else {
            return Err(body);
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
            return Err(body);
        }
        if let Some((action, reply)) = degrade::refusal(cfg, actions) {
            self.request.degraded = Some(level);
            degrade::count(env.metrics, action, priority);
            return Ok(self.reply_locally(env, host, reply));
        }
        let Some(mut body) = body else {
            return Err(None);
        };
        if actions.contains(&Action::Cache) && self.answer_downgraded(env, host, &body, level) {
            degrade::count(env.metrics, Action::Cache, priority);
            return Ok(Step::Pause);
        }
        let field = self.shaping_config(env.config).field;
        let edited = body.tree.as_ref().and_then(|tree: &Json| {
            degrade::edit(cfg, actions, &body.raw, tree, &model, field, &signals)
        });
        if let Some(edited) = edited {
            body = match body.replace(env, host, edited.body) {
                Ok(body) => body,
                Err(unchanged) => return Err(Some(unchanged)),
            };
            self.request.degraded = Some(level);
            for action in &edited.applied {
                degrade::count(env.metrics, *action, priority);
            }
            if let Some(fallback) = edited.model {
                self.request.model = Some(fallback);
            }
        }
        Err(Some(body))
    }
}
