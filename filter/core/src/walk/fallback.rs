//! The walk's fallback step: a routed, held call whose backend refused it
//! with an error a fallback chain names (see [`crate::routing::fallback`])
//! has that error held to its end and read; when its class moves the call
//! on, the held request goes to the chain's next model while the error is
//! held back, and the client gets that model's answer, named in
//! `x-llm-model`. The failover step's callout, reply and budget carry it.

use crate::dialect::answer::ErrorClass;
use crate::dialect::provider;
use crate::limits;
use crate::routing::failover::FailoverResult;
use crate::routing::fallback::{self, Chain};
use crate::summary::End;

use super::failover::Sent;
use super::state::{Answer, FellBack};
use super::{Call, CalloutAnswer, Env, Host, Phase, Step};

impl Call {
    /// The model whose chain the call is on: the one it was first routed to.
    fn chain_model(&self) -> Option<&str> {
        match &self.dispatch.fallback {
            Some(f) => Some(f.from.as_str()),
            None => self.dispatch.model.as_deref(),
        }
    }

    /// The fallback chain of the model the call first went to.
    fn chain<'c>(&self, env: &Env<'c>) -> Option<&'c Chain> {
        self.routing_config(env.config)
            .fallbacks
            .get(self.chain_model()?)
    }

    /// The call was routed to a model with a fallback chain: its body is
    /// worth keeping for the next model.
    pub(super) fn may_fall_back(&self, env: &Env<'_>) -> bool {
        self.dispatch.cluster.is_some() && self.chain(env).is_some()
    }

    /// At the response headers, when failover let them pass: an error
    /// answer a chain may move on from is held to its end (`Step::Pause`)
    /// to read its class. Not while a hedge is out: its answer is the
    /// call's other chance.
    pub(super) fn hold_error(&mut self, env: &Env<'_>, end_of_stream: bool) -> Step {
        let Some(r) = self.response.as_ref() else {
            return Step::Continue;
        };
        // Envoy's own replies (its 413) are no backend's refusal.
        let json_error = r.status.is_some_and(fallback::candidate)
            && r.envoy.is_none()
            && matches!(r.answer, Answer::Json { .. });
        if end_of_stream
            || !json_error
            || !matches!(self.progress.phase(), Phase::Forwarded)
            || self.dispatch.held.is_none()
            || self.progress.hedge_out().is_some()
            || self.chain(env).is_none()
            || !self.has_room_for_a_try(env)
        {
            return Step::Continue;
        }
        self.progress.hold_error();
        Step::Pause
    }

    /// A body callback of a held error. Envoy buffers it while the filter
    /// pauses, and each callback sees the whole body buffered so far
    /// (`size`): it is held to its end (or let go once longer than an error
    /// body), then read once; the chain's next model is asked when its
    /// class says so, else the error goes on to the client.
    pub(super) fn error_body(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Step {
        if size > fallback::MAX_ERROR_BODY {
            self.progress.forward();
            return Step::Continue;
        }
        if !end_of_stream {
            return Step::Pause;
        }
        let body = host.response_body(size).unwrap_or_default();
        let status = self.response.as_ref().and_then(|r| r.status);
        if let Some(Answer::Json { copy, .. }) = self.response.as_mut().map(|r| &mut r.answer) {
            copy.append(&body);
        }
        let dialect = self.request.dialect;
        let named = host.response_header(provider::ERROR_TYPE);
        let class = status.and_then(|s| fallback::classify(dialect, s, &body, named.as_deref()));
        if let (Some(class), Some(status)) = (class, status) {
            if self.fall_back(env, host, class, End::Answered(status)) {
                return Step::Pause;
            }
        }
        self.progress.forward();
        self.write_record(env, host, None);
        Step::Continue
    }

    /// Moves the call to the next model of its chain for `class`, the try
    /// that ended so (`failed`) learnt: true once the callout is out.
    fn fall_back(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        class: ErrorClass,
        failed: End,
    ) -> bool {
        let step = self.dispatch.fallback.as_ref().map_or(0, |f| f.step);
        let Some(next) = self.chain(env).and_then(|c| c.next(class, step)) else {
            return false;
        };
        let from = self.chain_model().unwrap_or_default().to_string();
        // The rules of the model the call would reach hold it before it goes.
        if let Some(held_back) = self.limit_move(env, next) {
            fallback::count(env.metrics, &from, class, FailoverResult::Limited);
            return match held_back {
                limits::Switch::Refuse(r) => self.refuse_move(env, host, &r),
                // Kept on the cheaper model: its own answer goes on.
                _ => false,
            };
        }
        let cluster = match self.send_to_model(env, host, next) {
            Sent::To(cluster) => cluster,
            Sent::Refused => {
                fallback::count(env.metrics, &from, class, FailoverResult::NotSent);
                return false;
            }
            Sent::Nowhere => return false,
        };
        // The refusing backend learns its answer now; the call is the next
        // model's from here (its held body stays, for the chain's next).
        self.hand_over(env, Some(failed), 0, cluster, true);
        self.dispatch.model = Some(next.to_string());
        self.dispatch.fallback = Some(FellBack {
            from,
            class,
            step: step.saturating_add(1),
            asked: self.dispatch.asked.len(),
        });
        true
    }

    /// The class of a refusal another backend answered the call with, when
    /// the call's model has a chain (else none: the answer is the client's).
    pub(super) fn refusal_class(
        &self,
        env: &Env<'_>,
        answer: &CalloutAnswer,
    ) -> Option<ErrorClass> {
        self.chain(env)?;
        let named = answer.header(provider::ERROR_TYPE);
        fallback::classify(self.request.dialect, answer.status?, &answer.body, named)
    }

    /// A fallback's answer (`then`), counted by its result: a refusal for a
    /// class is a failure too, whatever its status.
    pub(super) fn count_fallback(
        &self,
        env: &mut Env<'_>,
        class: Option<ErrorClass>,
        status: Option<u16>,
    ) {
        let Some(f) = self.dispatch.fallback.as_ref() else {
            return;
        };
        let result = match class {
            Some(_) => FailoverResult::Failed,
            None => FailoverResult::of(status),
        };
        fallback::count(env.metrics, &f.from, f.class, result);
    }

    /// The last backend another one's failure or refusal led to refused the
    /// call for `class` (failover, which comes first, had nowhere left to
    /// go): the chain goes on from the model it is on, while the budget
    /// leaves a try's room. True when the call went on to another model.
    pub(super) fn fall_back_after(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        class: Option<ErrorClass>,
        status: Option<u16>,
    ) -> bool {
        let (Some(class), Some(status)) = (class, status) else {
            return false;
        };
        self.has_room_for_a_try(env) && self.fall_back(env, host, class, End::Answered(status))
    }
}
