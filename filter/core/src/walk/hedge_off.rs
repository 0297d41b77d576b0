//! Hedging in a build without routing: no call is ever hedged.

use crate::routing::health;

use super::{Call, Env, Host, Wake};

impl Call {
    /// Never.
    pub(super) fn may_hedge(&self, _env: &Env<'_>) -> bool {
        false
    }

    /// Nothing to arm.
    pub(super) fn arm_hedge(&mut self, _env: &Env<'_>, _health: Option<&health::Health>) {}

    /// No hedge is ever armed.
    pub(super) fn hedge_on_tick(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _at_ms: u64,
    ) -> Wake {
        Wake::Resume
    }

    /// No hedge to settle.
    pub(super) fn settle_hedge(&mut self, _env: &mut Env<'_>) {}
}
