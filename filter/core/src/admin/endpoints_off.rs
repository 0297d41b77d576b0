//! The endpoints in a build without them (the sidecar build: Alertmanager's
//! webhook reaches no sidecar, which pulls its alerts, and the levels are
//! the gateway tier's to show): no request is theirs, so one under the
//! prefix goes on like any other. An `admin` section is refused at load.

use crate::walk::{Env, Host, Step};

/// A request to the endpoints; none is ever taken.
#[derive(Debug)]
pub struct AdminCall;

impl AdminCall {
    /// `None`: the request is someone else's.
    pub fn start(
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _end_of_stream: bool,
    ) -> Option<(Self, Step)> {
        None
    }

    /// Never called: no call is taken.
    pub fn on_request_body(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _size: usize,
        _end_of_stream: bool,
    ) -> Step {
        Step::Continue
    }
}
