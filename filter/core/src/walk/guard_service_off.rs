//! The guardrail service's step in a build without guardrails (the sidecar
//! build: the gateway tier asks it): no call waits for a verdict. A
//! `guardrails` section is refused at load.

use std::ops::ControlFlow;

use super::{Call, CalloutAnswer, Env, Flow, HeldBody, Host, Step};

impl Call {
    /// Goes on: no service is asked.
    pub(super) fn ask_verdict(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        ControlFlow::Continue(body)
    }

    /// Never asked for: no call waits for a verdict.
    pub(super) fn verdict_answered(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _answer: &CalloutAnswer,
    ) -> Step {
        Step::Pause
    }

    /// No service is asked about answers.
    pub(super) fn answer_elsewhere_unasked(
        &mut self,
        _env: &mut Env<'_>,
        _status: u16,
        _stream: bool,
    ) -> Option<crate::budget::reply::LocalReply> {
        None
    }

    /// No verdict is awaited.
    pub(super) fn drop_verdict(&mut self, _env: &Env<'_>) {}

    /// No answer is held for a verdict.
    pub(super) fn hold_for_verdict(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _size: usize,
        _end_of_stream: bool,
    ) -> Option<Step> {
        None
    }

    /// Nothing is kept back: no answer waits for a verdict.
    pub(super) fn keep_back(
        &mut self,
        outgoing: Option<Vec<u8>>,
        _chunk: &[u8],
        _end_of_stream: bool,
    ) -> Option<Vec<u8>> {
        outgoing
    }

    /// No answer waits for a verdict.
    pub(super) fn awaits_answer_verdict(&self) -> bool {
        false
    }

    /// Never asked for.
    pub(super) fn answer_verdict(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _answer: &CalloutAnswer,
    ) -> Step {
        Step::Pause
    }
}
