//! The credentials' step in a build without mesh credentials (the sidecar
//! build: provider keys live at the gateway tier): the call leaves with the
//! headers it came with. A `credentials` section is refused at load.

use super::{Call, Env, Host};

impl Call {
    /// Nothing to strip: no backend is mesh-credentialed here.
    pub(super) fn leave_keyless(&mut self, _env: &mut Env<'_>, _host: &mut dyn Host) {}
}

/// Never: no backend is mesh-credentialed here.
pub(super) fn credential_unavailable(_env: &mut Env<'_>, _cluster: Option<&str>) {}
