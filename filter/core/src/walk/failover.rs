//! The walk's failover step: a routed, held call that its backend failed
//! retriably is sent to another backend of its model while the failed
//! response is held back, and the client gets that backend's answer; when
//! that one fails it too, the next one not asked yet is, and so on down the
//! model's backends that speak the call's shape. The budget stays the law:
//! only with room for one more try left, only when the retry budget allows,
//! at most `budget.max_retries` times in one call, and each callout ends
//! with the caller's budget.

use crate::budget;
use crate::cache::entry::SSE_CONTENT_TYPE;
use crate::cache::CacheStatus;
use crate::dialect::answer::ReplyKind;
use crate::dialect::provider;
use crate::host::{Random, SharedStore};
use crate::metrics::internal_error;
use crate::routing::failover::{self, FailoverResult};
use crate::routing::hedge::{self, HedgeResult};
use crate::routing::rewrite::{self, Edit};
use crate::routing::{self, affinity, RouteAsk, RouteDecision, RoutingConfig};
use crate::summary::{End, Try};
use crate::walk::CallWait;

use super::answer::{blocked_reply, by_rule, Checked};
use super::credentials::credential_unavailable;
use super::end::Served;
use super::state::Response;
use super::{Call, CalloutAnswer, Env, Host, Phase, Step};

impl Call {
    /// Failover is on and the call was routed to a model with another
    /// backend: the held body is worth keeping for a failover.
    pub(super) fn may_fail_over(&self, env: &Env<'_>) -> bool {
        env.config.routing.failover && self.dispatch.cluster.is_some() && self.dispatch.alternatives
    }

    /// At the response headers: when the backend failed the call in a way
    /// another could answer and the budget allows, asks another backend and
    /// holds this response (`Step::Pause`) until it answers. A hedge already
    /// asking another backend serves as the failover.
    pub(super) fn fail_over(&mut self, env: &mut Env<'_>, host: &mut dyn Host) -> Step {
        if !self.failover_due(env) {
            return Step::Continue;
        }
        let hedged = self.progress.hedge_out().map(str::to_string);
        let target = match hedged.clone() {
            Some(cluster) => cluster,
            None => match self.send_elsewhere(env, host, CallWait::Failover) {
                Sent::To(cluster) => cluster,
                Sent::Nowhere => return Step::Continue,
                Sent::Refused => {
                    failover::count(env.metrics, FailoverResult::NotSent);
                    return Step::Continue;
                }
            },
        };
        // The failed backend learns now, with the failover as a retry it
        // cost; the call is the other backend's from here.
        let end = self.answer_end();
        // The held body stays: that backend may fail the call too.
        self.hand_over(env, end, 1, target, hedged.is_none());
        Step::Pause
    }

    /// The call leaves the backend that failed or refused it for `target`,
    /// whose callout is out: the try that ended so (`end`, else as the
    /// summary reads it, with the `failovers` it cost) is learnt, `target`
    /// counts the call in flight unless it already did (`dispatched`: false
    /// for a hedge already out), and the call's breaker follows it. Its
    /// response is held while `target` answers.
    pub(super) fn hand_over(
        &mut self,
        env: &mut Env<'_>,
        end: Option<End>,
        failovers: u32,
        target: String,
        dispatched: bool,
    ) {
        let model = self.model_label(env);
        let mut ended = self.tried(env.now_ms);
        ended.failovers = failovers;
        if let Some(end) = end {
            ended.end = end;
        }
        self.learn_from(env, &model, &ended);
        if dispatched {
            routing::learn::started(env.store, env.metrics, &target, env.now_ms);
        }
        if self.dispatch.breaker.is_some() {
            self.dispatch.breaker = Some(target.clone());
        }
        if let Some(left) = self.dispatch.cluster.replace(target) {
            self.dispatch.asked.push(left);
        }
        self.progress.fail_over();
    }

    /// The caller's budget still leaves room for another try.
    pub(super) fn has_room_for_a_try(&self, env: &Env<'_>) -> bool {
        self.request.remaining_ms(env.now_ms) >= env.config.budget.min_per_try_ms
    }

    /// Sends the held request to the best other backend of its model (the
    /// one a fallback reached, if it did) than the one it is on and those
    /// it asked for that model, as a callout that ends with the caller's
    /// budget and whose answer goes on by `then`.
    pub(super) fn send_elsewhere(
        &self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        then: CallWait,
    ) -> Sent {
        let fell_back = self.dispatch.fallback.as_ref();
        let model = match fell_back {
            Some(_) => self.dispatch.model.as_deref(),
            None => self.model(),
        };
        let (Some(failed), Some(model)) = (self.dispatch.cluster.as_deref(), model) else {
            return Sent::Nowhere;
        };
        let walked = self
            .dispatch
            .asked
            .get(fell_back.map_or(0, |f| f.asked)..)
            .unwrap_or_default();
        let asked = |c: &str| c == failed || walked.iter().any(|a| a == c);
        let target = self.with_ask(env, model, None, |config, store, _, ask| {
            routing::failover_target(config, store, ask, &asked)
        });
        match target.flatten() {
            Some(target) => {
                // A fallback's held body still names the first model.
                let model = match (&target.rewrite_model, fell_back) {
                    (Some(m), _) => Some(m.as_str()),
                    (None, Some(_)) => Some(target.model.as_str()),
                    (None, None) => None,
                };
                self.send_to(env, host, &target, model, then)
            }
            None => Sent::Nowhere,
        }
    }

    /// Sends the held request to a backend of `model` (another model than
    /// the call's, named in the body), picked as a call asking for it would
    /// be, as a callout that ends with the caller's budget (a fallback's).
    pub(super) fn send_to_model(
        &self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        model: &str,
    ) -> Sent {
        let affinity = self.request.affinity;
        let target = self.with_ask(env, model, affinity, |config, store, rng, ask| {
            routing::plan(config, store, rng, ask)
        });
        match target.flatten() {
            Some(target) => {
                let name = target.rewrite_model.as_deref().unwrap_or(&target.model);
                self.send_to(env, host, &target, Some(name), CallWait::Fallback)
            }
            None => Sent::Nowhere,
        }
    }

    /// Runs `f` with the routing ask of the held request for `model`,
    /// steering away from backends whose breaker sheds; `None` without a
    /// held body.
    fn with_ask<T>(
        &self,
        env: &mut Env<'_>,
        model: &str,
        affinity: Option<affinity::Key>,
        f: impl FnOnce(&RoutingConfig, &dyn SharedStore, &mut dyn Random, &RouteAsk<'_>) -> T,
    ) -> Option<T> {
        let held = self.dispatch.held.as_ref()?.features.as_ref()?;
        // As the first pick weighed it (no new read).
        let features = &held.calibrated(self.known_ratio());
        let (store, budget_cfg, now_ms) = (env.store, &env.config.budget, env.now_ms);
        let avoid = |cluster: &str| budget::breaker_sheds(store, budget_cfg, cluster, now_ms);
        let ask = RouteAsk {
            shape: Some(self.call_shape()),
            pinned: None,
            affinity,
            model,
            features,
            priority: self.request.priority,
            now_ms,
            avoid: &avoid,
        };
        Some(f(
            self.routing_config(env.config),
            store,
            &mut *env.rng,
            &ask,
        ))
    }

    /// Sends the held request to `target` with `model` in its body, as a
    /// callout that ends with the caller's budget and whose answer goes on
    /// by `then`.
    fn send_to(
        &self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        target: &RouteDecision,
        model: Option<&str>,
        then: CallWait,
    ) -> Sent {
        let Some(body) = self.dispatch.held.as_ref() else {
            return Sent::Nowhere;
        };
        let cache_key = self.cache_key_for(target.prompt_cache_key);
        // The call as that backend takes it: its path (the client's, with
        // the backend's name of the model where the dialect names it
        // there), its body, its version header.
        let (api, stream) = self.call_shape();
        let shaped = rewrite::for_serves(
            api,
            self.path(),
            stream,
            target.serves.as_ref(),
            model,
            model.unwrap_or(&target.sent_model),
            &body.doc,
            cache_key.as_deref(),
        );
        let new_body = match shaped.body {
            Edit::Unchanged => body.raw().to_vec(),
            Edit::Changed(b) => b,
            Edit::Refused => {
                internal_error(env.metrics, "rewrite_model");
                return Sent::Nowhere;
            }
        };
        let mut headers = failover::callout_headers(
            &host.request_headers(),
            &env.config.routing.cluster_header,
            target.authority.as_deref(),
            new_body.len(),
        );
        // The path this backend takes the call on, never the one the first
        // backend did.
        let path = shaped.path.unwrap_or_else(|| self.path().to_string());
        for (_, v) in headers.iter_mut().filter(|(k, _)| k == ":path") {
            v.clone_from(&path);
        }
        if let Some((name, value)) = shaped.header {
            if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) {
                headers.push((name.to_string(), value.to_string()));
            }
        }
        let cluster = self.callout_cluster(env, &target.cluster, &mut headers);
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let timeout_ms = self.request.remaining_ms(env.now_ms);
        if !host.dispatch_call(cluster, &headers, &new_body, timeout_ms, then) {
            internal_error(env.metrics, "callout_dispatch");
            return Sent::Refused;
        }
        Sent::To(target.cluster.clone())
    }

    /// How the answer read so far ended the try, by its status alone: held
    /// back, it never got to end.
    fn answer_end(&self) -> Option<End> {
        let r = self.response.as_ref()?;
        Some(End::classify(None, r.status, r.envoy, true))
    }

    /// The response just read failed the call retriably, it is still held by
    /// nothing else, failover is on (or a hedge already asks another
    /// backend), and the budget leaves room for one more try.
    fn failover_due(&self, env: &Env<'_>) -> bool {
        let Some(end) = self.answer_end() else {
            return false;
        };
        let breaker = self.dispatch.breaker.as_deref();
        matches!(self.progress.phase(), Phase::Forwarded)
            && self.dispatch.held.is_some()
            && (self.may_fail_over(env) || self.progress.hedge_out().is_some())
            && self.response.as_ref().is_some_and(|r| failover::retriable_as_told(end, r.should_retry))
            // An expired entry already answers the failure.
            && self.cache.status != Some(CacheStatus::Stale)
            && self.has_room_for_a_try(env)
            && breaker.is_none_or(|b| budget::retry_allowed(env.store, &env.config.budget, b, env.now_ms))
    }

    /// The answer of a callout the call sent, which goes on by `then` (the
    /// `wait` module's registry hands it over): the question's embedding, or the answer of the
    /// backend a failover, a hedge or a fallback asked. An answer the call
    /// no longer waits for (it moved on meanwhile) is dropped. A hedge's
    /// answer after its backend failed the call is the failover's.
    /// `Step::Continue`: let the held failure go on to the client (the
    /// other backend did not answer); `Step::Pause`: nothing to resume (the
    /// client was answered here, or the response was never held).
    pub fn on_callout_response(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        then: CallWait,
        answer: CalloutAnswer,
    ) -> Step {
        let phase = self.progress.phase();
        match then {
            CallWait::Embedding if matches!(phase, Phase::Embedding { .. }) => {
                self.embedding_answered(env, host, &answer)
            }
            CallWait::Guardrail if self.awaits_answer_verdict() => {
                self.answer_verdict(env, host, &answer)
            }
            CallWait::Guardrail
                if matches!(phase, Phase::Guarding { .. }) || self.progress.awaits_verdict() =>
            {
                self.verdict_answered(env, host, &answer)
            }
            CallWait::Failover | CallWait::Fallback | CallWait::Hedge
                if matches!(phase, Phase::FailingOver) =>
            {
                self.failover_answered(env, host, then, answer)
            }
            CallWait::Hedge if matches!(phase, Phase::Forwarded) => {
                self.hedge_answered(env, host, answer);
                Step::Pause
            }
            _ => Step::Pause,
        }
    }

    /// The answer of the backend asked in place of one that failed or
    /// refused the call (`then`: by a failover, a hedge or a fallback).
    /// Failover comes first: a retriable failure walks on to the model's
    /// next backend; a refusal its chain names, where the walk ends, moves
    /// the call to the chain's next model; else the client gets it.
    fn failover_answered(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        then: CallWait,
        answer: CalloutAnswer,
    ) -> Step {
        let class = self.refusal_class(env, &answer);
        let result = FailoverResult::of(answer.status);
        match then {
            CallWait::Fallback => self.count_fallback(env, class, answer.status),
            _ => failover::count(env.metrics, result),
        }
        if self.progress.settle_hedge().is_some() {
            // The hedge was the failover: it won when it answered.
            let won = result == FailoverResult::Answered;
            let result = if won {
                HedgeResult::Won
            } else {
                HedgeResult::Lost
            };
            self.decided.hedge = Some(result);
            hedge::count(env.metrics, result);
        }
        if let Some(step) = self.callout_without_credential(env, host, &answer) {
            return step;
        }
        if self.fail_over_again(env, host, &answer)
            || self.fall_back_after(env, host, class, answer.status)
        {
            return Step::Pause;
        }
        match answer.status {
            Some(status) if self.reply_with(env, host, None, status, &answer) => {
                self.progress.answered_elsewhere();
                Step::Pause
            }
            _ => {
                // No answer in the budget left: this backend learns its
                // timeout now (it reported no tokens: the response held is
                // the failed backend's), and the client gets the failure
                // held back.
                let model = self.model_label(env);
                let timed_out = Try {
                    end: End::TimedOut(504),
                    usage: None,
                    ..self.tried(env.now_ms)
                };
                self.learn_from(env, &model, &timed_out);
                self.dispatch.cluster = None;
                self.dispatch.breaker = None;
                self.progress.forward();
                Step::Continue
            }
        }
    }

    /// The backend asked in place of a failed one failed the call too
    /// (retriably, as its answer tells, or with no answer): the next backend
    /// of the model not asked yet in this call is, while the budget leaves
    /// a try's room, the retry budget allows and the call failed over fewer
    /// than `budget.max_retries` times (its fallbacks are no failovers).
    /// True once its callout is out. A model a fallback reached walks its
    /// backends so too, when failover is on.
    fn fail_over_again(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
    ) -> bool {
        let end = answer.status.map_or(End::TimedOut(504), End::Answered);
        let told = failover::told(
            answer.header(budget::reply::SHOULD_RETRY),
            answer.header(provider::ERROR_TYPE),
        );
        let breaker = self.dispatch.breaker.as_deref();
        let fell_back = self.dispatch.fallback.as_ref().map(|f| f.step);
        let failovers = self
            .dispatch
            .asked
            .len()
            .saturating_sub(fell_back.unwrap_or(0));
        let due = (fell_back.is_none() || env.config.routing.failover)
            && failover::retriable_as_told(end, told)
            && u32::try_from(failovers).is_ok_and(|n| n < env.config.budget.max_retries)
            && self.has_room_for_a_try(env)
            && breaker.is_none_or(|b| {
                budget::retry_allowed(env.store, &env.config.budget, b, env.now_ms)
            });
        if !due {
            return false;
        }
        match self.send_elsewhere(env, host, CallWait::Failover) {
            Sent::To(target) => {
                self.hand_over(env, Some(end), 1, target, true);
                true
            }
            Sent::Refused => {
                failover::count(env.metrics, FailoverResult::NotSent);
                false
            }
            Sent::Nowhere => false,
        }
    }

    /// A mesh-credentialed backend asked in place of another answered 401:
    /// the mesh's credential for it is missing or refused, which is the
    /// gateway's fault, not the caller's key (the call left without it).
    /// The client gets the gateway's 503 in its API's shape, counted by
    /// the backend, as the first try's 401 would have been.
    fn callout_without_credential(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
    ) -> Option<Step> {
        let cluster = self.dispatch.cluster.clone();
        if answer.status != Some(401) || !env.config.credentials.mesh(cluster.as_deref()) {
            return None;
        }
        credential_unavailable(env, cluster.as_deref());
        let r = budget::reply::local_reply(ReplyKind::NoCredential, None);
        Some(self.reply_locally(env, host, r))
    }

    /// Answers the client with the other backend's answer, of `cluster`
    /// (`None`: the one the call is on); false (counted) when the host
    /// refused. The answer is the call's once it went out.
    pub(super) fn reply_with(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        cluster: Option<&str>,
        status: u16,
        answer: &CalloutAnswer,
    ) -> bool {
        let cluster = cluster
            .or(self.dispatch.cluster.as_deref())
            .map(str::to_string);
        let cluster = cluster.as_deref();
        let mut headers = failover::reply_headers(&answer.headers);
        let told = self.client_headers(env.config, cluster, self.cache.status);
        headers.extend(told.into_iter().map(|(k, v)| (k.to_string(), v)));
        let refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let stream = headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v.contains(SSE_CONTENT_TYPE));
        // The client sees the stream without the usage it did not ask for.
        let (response, stripped) = Response::from_callout(
            self.request.dialect,
            status,
            stream,
            self.decided.usage_asked,
            &env.config.capture,
            &answer.body,
            env.now_ms,
        );
        let body = stripped.as_deref().unwrap_or(&answer.body);
        let checked = match (200..300).contains(&status) {
            true => self.check_whole(env, stream, body),
            false => Checked::Pass,
        };
        let body = match &checked {
            Checked::Body(b) => b,
            Checked::Pass => body,
            Checked::Blocked(rule) => {
                let r = blocked_reply(by_rule(&env.config.guardrails, *rule));
                return matches!(self.reply_locally(env, host, r), Step::Pause);
            }
        };
        if let Some(r) = self.answer_elsewhere_unasked(env, status, stream) {
            return matches!(self.reply_locally(env, host, r), Step::Pause);
        }
        // The record is of the answer sent, written before it goes.
        let served = Served {
            response: Some(&response),
            cluster,
            cache: self.cache.status,
        };
        self.write_record_of(env, host, Some(End::Answered(status)), served);
        if !host.send_local_reply(u32::from(status), &refs, body) {
            internal_error(env.metrics, "local_reply");
            return false;
        }
        self.response = Some(response);
        true
    }
}

/// Where [`Call::send_elsewhere`] sent the request.
pub(super) enum Sent {
    /// To this cluster.
    To(String),
    /// Nowhere: no other backend has weight, or nothing to send.
    Nowhere,
    /// The host refused the callout.
    Refused,
}
