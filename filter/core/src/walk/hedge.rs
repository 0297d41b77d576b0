//! The walk's hedging step: a slow held call of a hedged priority is also
//! sent to the best other backend of its model once its own backend has had
//! about its usual slow latency; the first good answer reaches the client.

use crate::routing::failover;
use crate::routing::hedge::{self, HedgeResult};
use crate::routing::{self, health};
use crate::summary::{End, Try};
use crate::usage::Usage;
use crate::walk::CallWait;

use super::failover::Sent;
use super::{Call, CalloutAnswer, Env, Host, Phase, Wake};

impl Call {
    /// Hedging is on for the call's priority, the call is not a stream, and
    /// it was routed to a model with another backend.
    pub(super) fn may_hedge(&self, env: &Env<'_>) -> bool {
        env.config
            .routing
            .hedge
            .as_ref()
            .is_some_and(|h| h.priorities.contains(&self.request.priority))
            && self.request.view.stream == Some(false)
            && self.dispatch.cluster.is_some()
            && self.dispatch.alternatives
    }

    /// Arms the hedge of a call going upstream with its body kept: it counts
    /// toward the cap, and is due after its backend's usual slow latency
    /// (`health`, as routing read it; see [`hedge::delay_ms`]) when the
    /// budget still leaves a try's room then.
    pub(super) fn arm_hedge(&mut self, env: &Env<'_>, health: Option<&health::Health>) {
        let (Some(cfg), Some(model)) = (
            env.config.routing.hedge.as_ref(),
            self.dispatch.model.as_deref(),
        ) else {
            return;
        };
        if !self.may_hedge(env) || self.dispatch.held.is_none() {
            return;
        }
        let budget = &env.config.budget;
        hedge::count_call(env.store, model, env.now_ms, budget.window_ms);
        let delay = hedge::delay_ms(cfg, health, self.dispatch.elsewhere.as_ref());
        let room = self
            .request
            .remaining_ms(env.now_ms)
            .saturating_sub(budget.min_per_try_ms);
        if delay < room {
            self.progress.arm_hedge(env.now_ms.saturating_add(delay));
        }
    }

    /// A timer tick of a call whose hedge is armed for `at_ms`: sends the
    /// hedge once it is due, unless the backend answered, the budget has no
    /// room left or the cap is reached.
    pub(super) fn hedge_on_tick(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        at_ms: u64,
    ) -> Wake {
        if self.response.is_some() || !matches!(self.progress.phase(), Phase::Forwarded) {
            self.progress.disarm_hedge();
            return Wake::Idle;
        }
        if env.now_ms < at_ms {
            return Wake::Wait;
        }
        self.progress.hedge_due();
        let (Some(cfg), Some(model)) = (
            env.config.routing.hedge.as_ref(),
            self.dispatch.model.as_deref(),
        ) else {
            return Wake::Idle;
        };
        let budget = &env.config.budget;
        if !self.has_room_for_a_try(env)
            || !hedge::take(
                env.store,
                model,
                env.now_ms,
                budget.window_ms,
                cfg.max_ratio,
            )
        {
            return Wake::Idle;
        }
        if let Sent::To(cluster) = self.send_elsewhere(env, host, CallWait::Hedge) {
            routing::learn::started(env.store, env.metrics, &cluster, env.now_ms);
            self.progress.hedge_sent(cluster);
        }
        Wake::Idle
    }

    /// The hedge answered while the call was still upstream: a good answer
    /// before the backend's reaches the client (Envoy then resets the first
    /// request); otherwise the hedge lost and its backend learns its answer.
    pub(super) fn hedge_answered(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: CalloutAnswer,
    ) {
        let Some(cluster) = self.progress.settle_hedge() else {
            return;
        };
        let good = answer
            .status
            .filter(|s| !failover::retriable(End::Answered(*s)));
        if let (Some(status), None) = (good, self.response.as_ref()) {
            if self.reply_with(env, host, Some(&cluster), status, &answer) {
                let first = self.dispatch.cluster.replace(cluster.clone());
                // The first backend was dropped unanswered: its tail learns
                // it was at least this slow; its breaker learns nothing, and
                // it reported no tokens (the answer is the hedge's).
                let model = self.model_label(env);
                let outlasted = Try {
                    end: End::Outlasted,
                    cluster: first.as_deref(),
                    usage: None,
                    ..self.tried(env.now_ms)
                };
                self.learn_from(env, &model, &outlasted);
                if self.dispatch.breaker.is_some() {
                    self.dispatch.breaker = Some(cluster);
                }
                self.progress.answered_elsewhere();
                self.decided.hedge = Some(HedgeResult::Won);
                hedge::count(env.metrics, HedgeResult::Won);
                return;
            }
        }
        let end = answer.status.map_or(End::TimedOut(504), End::Answered);
        // The hedge's own tokens, not those of the answer that beat it.
        let usage = self.request.dialect.answer().head(&answer.body).usage;
        self.hedge_learns(env, &cluster, end, usage);
        // Asked once in this call: a failover goes elsewhere.
        self.dispatch.asked.push(cluster);
        self.decided.hedge = Some(HedgeResult::Lost);
        hedge::count(env.metrics, HedgeResult::Lost);
    }

    /// At the end of the call: a hedge still out lost to the backend's
    /// answer, or was abandoned with the call; its backend leaves the
    /// in-flight count.
    pub(super) fn settle_hedge(&mut self, env: &mut Env<'_>) {
        let Some(cluster) = self.progress.settle_hedge() else {
            return;
        };
        let answered = self
            .response
            .as_ref()
            .and_then(|r| r.status)
            .is_some_and(|s| !failover::retriable(End::Answered(s)));
        let result = if answered {
            HedgeResult::Lost
        } else {
            HedgeResult::Abandoned
        };
        self.decided.hedge = Some(result);
        hedge::count(env.metrics, result);
        if self.dispatch.cluster.as_deref() != Some(cluster.as_str()) {
            self.hedge_learns(env, &cluster, End::Abandoned, None);
        }
    }

    /// The hedge's backend learns how its try ended and the tokens its
    /// answer reported (`usage`); its breaker does not: the call was never
    /// its to serve.
    fn hedge_learns(&self, env: &mut Env<'_>, cluster: &str, end: End, usage: Option<Usage>) {
        let model = self.model_label(env);
        let hedge_try = Try {
            end,
            cluster: Some(cluster),
            breaker: None,
            usage,
            ..self.tried(env.now_ms)
        };
        self.learn_from(env, &model, &hedge_try);
    }
}
