//! The guardrail service's step of the walk (see [`crate::guard::service`]):
//! once the rules let a prompt through, and before anything reads it, its
//! texts go to the service by a callout no longer than the call's budget
//! allows, and the call waits for the verdict. A flagged call is refused,
//! masked or only counted, as the service's `action` says; a verdict that
//! does not come (or cannot be read) lets the call go on or refuses it, as
//! `on_error` says.

use std::ops::ControlFlow;

use crate::budget::reply;
use crate::dialect::answer::ReplyKind;
use crate::guard::policy::Action;
use crate::guard::service::{self, Failure, GuardService, Judged, OnError};
use crate::metrics as names;

use super::{Call, CallWait, CalloutAnswer, Env, Flow, HeldBody, Host, Step};

impl Call {
    /// Sends the prompt's texts to the guardrail service and parks the call
    /// until its verdict; goes on when there is no service or nothing to
    /// ask about.
    pub(super) fn ask_verdict(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        let guardrails = &env.config.guardrails;
        let Some(svc) = guardrails.service.as_ref() else {
            return ControlFlow::Continue(body);
        };
        // A body the rules could not read was settled by them (`unchecked`).
        let Some(body) = body else {
            return ControlFlow::Continue(None);
        };
        let api = self.request.dialect;
        let fields = api.request().guarded_fields();
        let asked = body.tree().map(|tree| {
            let texts =
                service::texts(tree, fields, guardrails.max_scan_bytes).ok_or(Failure::TooLong)?;
            if texts.is_empty() {
                return Ok(None);
            }
            svc.request(&texts, api.api())
                .map(|r| Some((r, texts.len())))
        });
        let (callout, sent) = match asked {
            None | Some(Ok(None)) => return ControlFlow::Continue(Some(body)),
            Some(Ok(Some(asked))) => asked,
            Some(Err(failure)) => return self.unjudged(env, host, svc, failure, body),
        };
        if !self.ask_service(env, host, &svc.service, &callout, CallWait::Guardrail) {
            return self.unjudged(env, host, svc, Failure::Dispatch, body);
        }
        self.decided.verdict = Some((env.now_ms, sent));
        self.progress.guard(body);
        ControlFlow::Break(Step::Pause)
    }

    /// The service answered (or did not in time): the call is refused here
    /// (`Step::Pause`) or goes on with the rest of the walk.
    pub(super) fn verdict_answered(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
    ) -> Step {
        let Some(mut body) = self.progress.stop_waiting() else {
            return Step::Pause;
        };
        let (Some(svc), Some((sent_ms, sent))) =
            (env.config.guardrails.service.as_ref(), self.decided.verdict)
        else {
            return self.guarded(env, host, Some(body));
        };
        env.metrics.histogram(
            names::GUARDRAIL_SERVICE_DURATION,
            env.now_ms.saturating_sub(sent_ms),
        );
        let masked = match svc.read(answer.status, &answer.body, sent) {
            Ok(Judged::Pass) => None,
            Ok(Judged::Flagged(masked)) => {
                self.note_service_fired(env, svc);
                // A masking service that masked nothing refuses the call.
                if svc.action == Action::Block || (svc.action == Action::Mask && masked.is_none()) {
                    let message = format!(
                        "The request was blocked by the guardrail service `{}`; nothing was \
                         sent.",
                        svc.name
                    );
                    let r = reply::with_message(ReplyKind::Blocked, &message, None);
                    return self.reply_locally(env, host, r);
                }
                masked
            }
            Err(failure) => {
                return match self.unjudged(env, host, svc, failure, body) {
                    ControlFlow::Continue(body) => self.guarded(env, host, body),
                    ControlFlow::Break(step) => step,
                };
            }
        };
        if let Some(masked) = masked {
            let fields = self.request.dialect.request().guarded_fields();
            let edits = body
                .tree()
                .map(|tree| service::put_back(tree, fields, &masked))
                .unwrap_or_default();
            if !edits.is_empty() {
                for (field, bytes, tree) in edits {
                    body.doc.set(field, &bytes, tree);
                }
                body.was_edited();
            }
        }
        self.guarded(env, host, Some(body))
    }

    /// The service gave no verdict: counted, and the call goes on or is
    /// refused by `on_error`.
    fn unjudged(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        svc: &GuardService,
        failure: Failure,
        body: HeldBody,
    ) -> Flow {
        let refused = svc.on_error == OnError::Refuse;
        let labels = [
            ("rule", svc.name.as_str()),
            ("reason", failure.as_str()),
            ("result", if refused { "refused" } else { "allowed" }),
            ("api", self.request.dialect.api()),
        ];
        env.metrics
            .counter(&names::name(names::GUARDRAIL_SERVICE_FAILURES, &labels), 1);
        if !refused {
            return ControlFlow::Continue(Some(body));
        }
        let message = format!(
            "The guardrail service `{}` could not check the request; nothing was sent.",
            svc.name
        );
        let r = reply::with_message(ReplyKind::GuardrailUnavailable, &message, None);
        ControlFlow::Break(self.reply_locally(env, host, r))
    }

    /// Counts the service's flag and names it beside the rules that fired.
    fn note_service_fired(&mut self, env: &mut Env<'_>, svc: &GuardService) {
        let labels = [
            ("rule", svc.name.as_str()),
            ("action", svc.action.as_str()),
            ("api", self.request.dialect.api()),
        ];
        env.metrics
            .counter(&names::name(names::GUARDRAIL_FIRED, &labels), 1);
        let fired = format!("{}:{}", svc.name, svc.action.as_str());
        self.decided.guardrails = Some(match self.decided.guardrails.take() {
            Some(rules) => format!("{rules},{fired}"),
            None => fired,
        });
    }
}
