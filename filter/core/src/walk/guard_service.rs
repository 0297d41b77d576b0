//! The guardrail service's step of the walk (see [`crate::guard::service`]):
//! once the rules let a prompt through, and before anything reads it, its
//! texts go to the service by a callout no longer than the call's budget
//! allows, and the call waits for the verdict. A flagged call is refused,
//! masked or only counted, as the service's `action` says; a verdict that
//! does not come (or cannot be read) lets the call go on or refuses it, as
//! `on_error` says.
//!
//! With `mode: parallel` the call goes upstream at once and only its answer
//! waits: the response's headers and the body Envoy buffers meanwhile (and
//! any answer the filter gives itself, a cache entry's) are held, no longer
//! than the callout's timeout, and go on as if read then, or are replaced
//! by the refusal; an answer longer than Envoy's buffer holds goes on but
//! for its end, and a refusal then cuts it.

use std::ops::ControlFlow;

use crate::budget::reply::{self, LocalReply};
use crate::dialect::answer::ReplyKind;
use crate::guard::policy::{Action, Side, Verdict};
use crate::guard::service::{self, Failure, GuardService, Judged, OnError};
use crate::json::Json;
use crate::metrics::{self as names, internal_error};

use super::answer::{blocked_reply, check_said, error_event, Ask, By};
use super::response::reply_in_place;
use super::state::{Answer, Held};
use super::{Call, CallWait, CalloutAnswer, Env, Flow, HeldBody, Host, Phase, Step};

impl Call {
    /// Sends the prompt's texts to the guardrail service and parks the call
    /// until its verdict (or, in parallel, lets it go upstream meanwhile);
    /// goes on when there is no service or nothing to ask about.
    pub(super) fn ask_verdict(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        let guardrails = &env.config.guardrails;
        let Some(svc) = guardrails.asks(Side::Prompt) else {
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
            svc.request(&texts, api.api(), Side::Prompt)
                .map(|r| Some((r, texts.len())))
        });
        let sent = match asked {
            None | Some(Ok(None)) => return ControlFlow::Continue(Some(body)),
            Some(Ok(Some((callout, sent)))) => self
                .ask_service(env, host, &svc.service, &callout, CallWait::Guardrail)
                .then_some(sent)
                .ok_or(Failure::Dispatch),
            Some(Err(failure)) => Err(failure),
        };
        let sent = match sent {
            Ok(sent) => sent,
            Err(failure) => {
                return match self.unjudged(env, svc, failure) {
                    None => ControlFlow::Continue(Some(body)),
                    Some(r) => ControlFlow::Break(self.reply_locally(env, host, r)),
                }
            }
        };
        self.decided.verdict = Some((env.now_ms, sent));
        if svc.parallel {
            self.progress.await_verdict();
            return ControlFlow::Continue(Some(body));
        }
        self.progress.guard(body);
        ControlFlow::Break(Step::Pause)
    }

    /// The service answered (or did not in time): the call is refused here
    /// (`Step::Pause`) or goes on with the rest of the walk; in parallel,
    /// what was held for the verdict goes on (`Step::Continue`: the
    /// response held is resumed) or is refused.
    pub(super) fn verdict_answered(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
    ) -> Step {
        if let Some(held) = self.progress.verdict_in() {
            return self.parallel_verdict(env, host, answer, held);
        }
        let Some(mut body) = self.progress.stop_waiting() else {
            return Step::Pause;
        };
        let masked = match self.judge(env, answer) {
            Ok(masked) => masked,
            Err(r) => return self.reply_locally(env, host, r),
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

    /// The verdict on a call that went upstream while it was awaited: what
    /// was held goes on, or the refusal takes its place and nothing of the
    /// upstream's answer is read or stored.
    fn parallel_verdict(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
        held: Held,
    ) -> Step {
        let judged = self.judge(env, answer);
        if matches!(self.progress.phase(), Phase::Answered(_)) {
            // Refused meanwhile (a limit, admission): nothing is held.
            return Step::Pause;
        }
        if held.released {
            return match (judged, held.end) {
                (Err(_), end) => self.cut(env, host, end),
                // The end held goes on as it would have.
                (Ok(_), Some(size)) => self.on_response_body(env, host, size, true),
                (Ok(_), None) => Step::Pause,
            };
        }
        let Err(r) = judged else {
            return self.release(env, host, held);
        };
        // Calls waiting for this one's answer go on without it.
        self.release_lease(env);
        let step = self.reply_locally(env, host, r);
        match held.headers {
            Some(_) => step,
            None => Step::Pause,
        }
    }

    /// A body callback of an answer while a verdict asked in parallel is
    /// awaited: `Some` step while it is held, `None` when the walk reads it
    /// as usual. Envoy's buffer holds it, which must not pass its limit
    /// (Envoy would answer a plain 500 in place of the answer): past
    /// `max_body_bytes` the answer is released, its headers and what came
    /// go on, and only its end is held until the verdict, which lets it go
    /// or cuts the answer (see [`Call::cut`]). An answer that comes whole
    /// and longer than that cannot wait: it has no verdict (`on_error`).
    pub(super) fn hold_for_verdict(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Option<Step> {
        if let Some(held) = self.progress.released() {
            if !end_of_stream {
                return None;
            }
            held.end = Some(size);
            return Some(Step::Pause);
        }
        let held = self.progress.held()?;
        if size <= env.config.max_body_bytes {
            // Envoy buffers it; each callback sees all of it so far.
            held.body = Some((size, end_of_stream));
            return Some(Step::Pause);
        }
        if !end_of_stream {
            held.released = true;
            let headers_end = held.headers.unwrap_or(false);
            self.on_response_headers(env, host, headers_end);
            return Some(self.on_response_body(env, host, size, false));
        }
        let mut held = self.progress.verdict_in()?;
        held.body = Some((size, true));
        let svc = env.config.guardrails.service.as_ref()?;
        Some(match self.unjudged(env, svc, Failure::AnswerTooLong) {
            None => self.release(env, host, held),
            Some(r) => {
                self.release_lease(env);
                self.reply_locally(env, host, r)
            }
        })
    }

    /// What of a body chunk goes on to the client (`None`: `outgoing`, or
    /// the chunk as it came, unchanged). While an answer released before
    /// its verdict awaits it, the last event of a stream (its final event,
    /// `[DONE]` or `message_stop`, is one) or the last byte of any other
    /// body is kept back with what was kept before, so the client never
    /// holds the answer whole before the verdict lets it go or cuts it;
    /// what was kept goes on ahead of the next chunk once the verdict let
    /// the answer go. At most [`MAX_KEPT`] bytes: an event longer than that
    /// keeps only its last byte back.
    pub(super) fn keep_back(
        &mut self,
        outgoing: Option<Vec<u8>>,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Option<Vec<u8>> {
        let awaiting = !end_of_stream && self.progress.released().is_some();
        let Some(response) = self.response.as_mut() else {
            return outgoing;
        };
        if !awaiting && response.kept.is_empty() {
            return outgoing;
        }
        let mut all = std::mem::take(&mut response.kept);
        all.extend_from_slice(outgoing.as_deref().unwrap_or(chunk));
        if awaiting {
            let last = all.len().saturating_sub(1);
            let at = match response.answer {
                Answer::Stream(_) => last_event_start(&all),
                Answer::Json { .. } => last,
            };
            let at = if all.len() - at > MAX_KEPT { last } else { at };
            response.kept = all.split_off(at);
        }
        Some(all)
    }

    /// A released answer refused by its verdict: part of it reached the
    /// client, so that no client takes what came for the whole answer, a
    /// stream whose end is held (`end`, its size) ends with the dialect's
    /// error event in its place, and any other is reset before its end;
    /// nothing of it is stored. Counted, and named in the record as
    /// `service:cut`.
    fn cut(&mut self, env: &mut Env<'_>, host: &mut dyn Host, end: Option<usize>) -> Step {
        let Some(svc) = env.config.guardrails.service.as_ref() else {
            return Step::Pause;
        };
        let labels = [
            ("rule", svc.name.as_str()),
            ("api", self.request.dialect.api()),
        ];
        env.metrics
            .counter(&names::name(names::GUARDRAIL_ANSWER_CUT, &labels), 1);
        self.name_fired(format!("{}:cut", svc.name));
        self.forget_answer(env);
        let stream = self.response.as_ref().is_some_and(|r| r.is_stream());
        if let (Some(size), true) = (end, stream) {
            let by = Some(By::Service(svc.name.as_str()));
            let event = error_event(self.request.dialect.answer(), by);
            if host.set_response_body(size, &event) {
                if let Some(r) = self.response.as_mut() {
                    r.ended = true;
                }
                self.write_record(env, host, None);
                return Step::Continue;
            }
            internal_error(env.metrics, "set_response_body");
        }
        self.write_record(env, host, None);
        if !host.reset_response() {
            internal_error(env.metrics, "reset_response");
        }
        Step::Pause
    }

    /// What was held for a verdict that let the call go on passes as it
    /// would have without the wait: the filter's own answer is sent, the
    /// upstream's is read from its headers and the body Envoy buffered.
    fn release(&mut self, env: &mut Env<'_>, host: &mut dyn Host, held: Held) -> Step {
        if let Some((status, headers, body, cache)) = held.reply {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            self.send_local_reply(env, host, status, &headers, &body, cache);
            return Step::Pause;
        }
        // Nothing came yet: the answer passes as it comes.
        let Some(end) = held.headers else {
            return Step::Pause;
        };
        let step = self.on_response_headers(env, host, end);
        if matches!(
            self.progress.phase(),
            Phase::Answered(_) | Phase::FailedOver | Phase::FailingOver
        ) {
            return Step::Pause;
        }
        match held.body {
            Some((size, ended)) => self.on_response_body(env, host, size, ended),
            None => step,
        }
    }

    /// The service's answer read and counted: `Ok` (with the texts it
    /// masked, when it did) when the call goes on, judged or, failing a
    /// verdict, by `on_error`; `Err` with its refusal.
    fn judge(
        &mut self,
        env: &mut Env<'_>,
        answer: &CalloutAnswer,
    ) -> Result<Option<Vec<String>>, LocalReply> {
        let (Some(svc), Some((sent_ms, sent))) =
            (env.config.guardrails.service.as_ref(), self.decided.verdict)
        else {
            return Ok(None);
        };
        env.metrics.histogram(
            names::GUARDRAIL_SERVICE_DURATION,
            env.now_ms.saturating_sub(sent_ms),
        );
        match svc.read(answer.status, &answer.body, sent) {
            Ok(Judged::Pass) => Ok(None),
            Ok(Judged::Flagged(masked)) => {
                self.note_service_fired(env, svc, Side::Prompt);
                // A masking service that masked nothing refuses the call.
                if svc.action == Action::Block || (svc.action == Action::Mask && masked.is_none()) {
                    let message = format!(
                        "The request was blocked by the guardrail service `{}`; {}.",
                        svc.name,
                        withheld(svc)
                    );
                    return Err(reply::with_message(ReplyKind::Blocked, &message, None));
                }
                Ok(masked)
            }
            Err(failure) => self.unjudged(env, svc, failure).map_or(Ok(None), Err),
        }
    }

    /// The service gave no verdict: counted, and the refusal when
    /// `on_error` refuses.
    fn unjudged(
        &mut self,
        env: &mut Env<'_>,
        svc: &GuardService,
        failure: Failure,
    ) -> Option<LocalReply> {
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
            return None;
        }
        let message = format!(
            "The guardrail service `{}` could not check the request; {}.",
            svc.name,
            withheld(svc)
        );
        Some(reply::with_message(
            ReplyKind::GuardrailUnavailable,
            &message,
            None,
        ))
    }

    /// The call is answered here (a refusal: a limit's 429), or ends, while
    /// its verdict asked in parallel is awaited: nothing is held for it any
    /// more, and the span and the record name it `service:pending` (the
    /// verdict, when it comes, is read by nothing).
    pub(super) fn drop_verdict(&mut self, env: &Env<'_>) {
        let Some(svc) = env.config.guardrails.service.as_ref() else {
            return;
        };
        if self.progress.verdict_in().is_some() {
            self.name_fired(format!("{}:pending", svc.name));
        }
    }

    /// Counts the service's flag on `side` and names it beside the rules
    /// that fired.
    fn note_service_fired(&mut self, env: &mut Env<'_>, svc: &GuardService, side: Side) {
        let labels = [
            ("rule", svc.name.as_str()),
            ("action", svc.action.as_str()),
            ("api", self.request.dialect.api()),
        ];
        let (metric, tail) = match side {
            Side::Prompt => (names::GUARDRAIL_FIRED, ""),
            Side::Answer => (names::GUARDRAIL_ANSWER_FIRED, ":answer"),
        };
        env.metrics.counter(&names::name(metric, &labels), 1);
        self.name_fired(format!("{}:{}{tail}", svc.name, svc.action.as_str()));
    }

    /// Names `fired` in the span and the record, after the rules that fired.
    fn name_fired(&mut self, fired: String) {
        self.decided.guardrails = Some(match self.decided.guardrails.take() {
            Some(rules) => format!("{rules},{fired}"),
            None => fired,
        });
    }
}

impl Call {
    /// The end of a JSON answer held for its check, `size` bytes: when the
    /// service is asked about answers, its texts — as the rules mask them,
    /// none of the prompt's values put back — go to it, and the answer
    /// waits for the verdict (`Some(Pause)`). `None` when the walk reads it
    /// now: not asked, asked already, or the rules settle it (they block,
    /// or cannot read it).
    pub(super) fn ask_about_answer(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
    ) -> Option<Step> {
        let rules = &env.config.guardrails;
        let svc = rules.asks(Side::Answer)?;
        let asked = self.response.as_ref()?.guard.as_ref()?.ask.is_asked();
        if asked {
            return None;
        }
        let answer = self.request.dialect.answer();
        // Read once: what the rules make of it is kept for its end.
        let mut tree = Json::parse(&host.response_body(size)?)?;
        let mut verdict = Verdict::default();
        let vault = &mut self.decided.vault;
        let changed = check_said(rules, answer, &mut tree, vault, &mut verdict, false);
        // The rules settle it (they block, or could not read it whole).
        let settled = verdict.blocked_by().is_some() || verdict.truncated;
        let api = self.request.dialect.api();
        let sent = match service::texts(&tree, answer.said_fields(), rules.max_scan_bytes) {
            _ if settled => Ok(None),
            None => Err(Failure::TooLong),
            Some(texts) if texts.is_empty() => Ok(None),
            Some(texts) => svc.request(&texts, api, Side::Answer).and_then(|c| {
                self.ask_service(env, host, &svc.service, &c, CallWait::Guardrail)
                    .then_some(Some(texts.len()))
                    .ok_or(Failure::Dispatch)
            }),
        };
        let (ask, step) = match sent {
            Ok(Some(sent)) => {
                let sent_ms = env.now_ms;
                let ask = Ask::Asking {
                    size,
                    tree,
                    changed,
                    sent,
                    sent_ms,
                };
                (ask, Some(Step::Pause))
            }
            Ok(None) => (Ask::Read { tree, changed }, None),
            Err(failure) => match self.unjudged(env, svc, failure) {
                Some(_) => (Ask::Refused(false), None),
                None => (Ask::Read { tree, changed }, None),
            },
        };
        let g = self.response.as_mut()?.guard.as_mut()?;
        g.ask = ask;
        g.verdict = verdict;
        step
    }

    /// A stream is not sent to the service asked about answers: counted,
    /// and with `on_error: refuse`, refused before a byte of it goes (true:
    /// the refusal takes its place, as an Envoy reply's does).
    pub(super) fn stream_unasked(&mut self, env: &mut Env<'_>, host: &mut dyn Host) -> bool {
        let Some(svc) = env.config.guardrails.asks(Side::Answer) else {
            return false;
        };
        if self.unjudged(env, svc, Failure::Stream).is_none() {
            return false;
        }
        let r = blocked_reply(None).in_dialect(self.request.dialect);
        let body = reply_in_place(env, host, r);
        if let Some(response) = self.response.as_mut() {
            response.replacement = Some(body);
        }
        self.forget_answer(env);
        true
    }

    /// Another backend's answer (a failover's, a hedge's) about to go out in
    /// the call's place, of `status`: not sent to the service asked about
    /// answers (the reply would wait for a callout of its own), so counted
    /// as unjudged (`reason` `failover`, or `stream`); `Some` refusal, in
    /// its place, with `on_error: refuse`.
    pub(super) fn answer_elsewhere_unasked(
        &mut self,
        env: &mut Env<'_>,
        status: u16,
        stream: bool,
    ) -> Option<LocalReply> {
        let svc = env.config.guardrails.asks(Side::Answer)?;
        let says = !self.request.dialect.answer().said_fields().is_empty();
        if !(200..300).contains(&status) || !says {
            return None;
        }
        let why = match stream {
            true => Failure::Stream,
            false => Failure::Failover,
        };
        self.unjudged(env, svc, why)?;
        self.forget_answer(env);
        Some(blocked_reply(None))
    }

    /// The service's verdict on an answer is awaited.
    pub(super) fn awaits_answer_verdict(&self) -> bool {
        self.response
            .as_ref()
            .and_then(|r| r.guard.as_ref())
            .is_some_and(|g| matches!(g.ask, Ask::Asking { .. }))
    }

    /// The service answered about the answer (or did not in time): the
    /// answer is read on as it is, masked by its texts or refused, and the
    /// response goes on.
    pub(super) fn answer_verdict(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        answer: &CalloutAnswer,
    ) -> Step {
        let Some(svc) = env.config.guardrails.asks(Side::Answer) else {
            return Step::Continue;
        };
        let Some(g) = self.response.as_mut().and_then(|r| r.guard.as_mut()) else {
            return Step::Continue;
        };
        let Ask::Asking {
            size,
            mut tree,
            changed,
            sent,
            sent_ms,
        } = std::mem::take(&mut g.ask)
        else {
            return Step::Pause;
        };
        env.metrics.histogram(
            names::GUARDRAIL_SERVICE_DURATION,
            env.now_ms.saturating_sub(sent_ms),
        );
        let fields = self.request.dialect.answer().said_fields();
        let ask = match svc.read(answer.status, &answer.body, sent) {
            Ok(Judged::Pass) => Ask::Read { tree, changed },
            Ok(Judged::Flagged(masked)) => {
                self.note_service_fired(env, svc, Side::Answer);
                match (svc.action, masked) {
                    (Action::Log, _) => Ask::Read { tree, changed },
                    (Action::Mask, Some(masked)) => {
                        for (field, _, value) in service::put_back(&tree, fields, &masked) {
                            if let Some(v) = tree.get_mut(field) {
                                *v = value;
                            }
                        }
                        Ask::Masked(tree)
                    }
                    // A masking service that masked nothing refuses it.
                    _ => Ask::Refused(true),
                }
            }
            Err(failure) => match self.unjudged(env, svc, failure) {
                Some(_) => Ask::Refused(false),
                None => Ask::Read { tree, changed },
            },
        };
        if let Some(g) = self.response.as_mut().and_then(|r| r.guard.as_mut()) {
            g.ask = ask;
        }
        self.on_response_body(env, host, size, true)
    }
}

/// What of a refused call did not pass: the call (asked before), or the
/// answer (asked in parallel: the prompt had left).
fn withheld(svc: &GuardService) -> &'static str {
    match svc.parallel {
        true => "its answer was withheld",
        false => "nothing was sent",
    }
}

/// The most bytes of a released answer kept back from the client for its
/// verdict: one event of a stream.
const MAX_KEPT: usize = 64 * 1024;

/// Where the last complete event of SSE `bytes` starts (with the partial
/// one after it, if any): after the blank line that ends the event before
/// it, or 0.
pub(super) fn last_event_start(bytes: &[u8]) -> usize {
    // The ends of the last two blank lines (`\n\n`, `\n\r\n`), which end events.
    let mut ends = [0usize; 2];
    for (i, w) in bytes.windows(2).enumerate() {
        let blank = w == b"\n\n" || (w == b"\r\n" && i > 0 && bytes.get(i - 1) == Some(&b'\n'));
        if blank {
            ends = [ends[1], i + 2];
        }
    }
    ends[0]
}
