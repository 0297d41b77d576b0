//! Fallback chains in a build without routing: an error answer goes on to
//! the client as it came.

use super::{Call, Env, Host, Step};

impl Call {
    /// Never: there are no chains.
    pub(super) fn may_fall_back(&self, _env: &Env<'_>) -> bool {
        false
    }

    /// The error goes on.
    pub(super) fn hold_error(&mut self, _env: &Env<'_>, _end_of_stream: bool) -> Step {
        Step::Continue
    }

    /// Never called: no error is held.
    pub(super) fn error_body(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _size: usize,
        _end_of_stream: bool,
    ) -> Step {
        Step::Continue
    }
}
