//! The answer's guard step in a build without guardrails (the sidecar
//! build: the gateway tier checks answers): every answer passes as it
//! came. A `guardrails` section is refused at load.

use super::{Call, Env, Host, Step};

/// No answer is checked.
#[derive(Debug, Default)]
pub(super) struct AnswerGuard;

impl Call {
    /// No answer is held for a check.
    pub(super) fn guard_answer_headers(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _end_of_stream: bool,
        _stream: bool,
    ) -> bool {
        false
    }

    /// Read as usual.
    pub(super) fn guard_held_json(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _size: usize,
        _end_of_stream: bool,
    ) -> Option<Step> {
        None
    }

    /// Passes as it came.
    pub(super) fn guard_json_end(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _size: usize,
        _body: &[u8],
    ) {
    }

    /// Passes as it came.
    pub(super) fn guard_stream(
        &mut self,
        _env: &mut Env<'_>,
        _bytes: &[u8],
        _end: bool,
    ) -> Option<Vec<u8>> {
        None
    }
}
