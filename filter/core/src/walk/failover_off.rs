//! Failover in a build without routing: no call is sent to another backend;
//! the one callout a call may still wait for is its embedding.

use super::state::Phase;
use super::{Call, CallWait, CalloutAnswer, Env, Host, Step};

impl Call {
    /// Never: no call was routed to a model with another backend.
    pub(super) fn may_fail_over(&self, _env: &Env<'_>) -> bool {
        false
    }

    /// The failure goes on to the client.
    pub(super) fn fail_over(&mut self, _env: &mut Env<'_>, _host: &mut dyn Host) -> Step {
        Step::Continue
    }

    /// The answer of a callout the call sent (`failover.rs`): here only the
    /// question's embedding.
    pub fn on_callout_response(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        then: CallWait,
        answer: CalloutAnswer,
    ) -> Step {
        match then {
            CallWait::Embedding if matches!(self.progress.phase(), Phase::Embedding { .. }) => {
                self.embedding_answered(env, host, &answer)
            }
            _ => Step::Pause,
        }
    }
}
