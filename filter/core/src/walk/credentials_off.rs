//! The credentials' step in a build without mesh credentials (the sidecar
//! build: provider keys live at the gateway tier): the call leaves with the
//! headers it came with. A `credentials` section is refused at load.

use super::{Call, Env, Host};

impl Call {
    /// Nothing to strip: no backend is mesh-credentialed here.
    pub(super) fn leave_keyless(&mut self, _env: &mut Env<'_>, _host: &mut dyn Host) {}

    /// A callout goes to the backend's own cluster, its headers as the
    /// call's.
    pub(super) fn callout_cluster<'c>(
        &self,
        _env: &'c Env<'_>,
        cluster: &'c str,
        _headers: &mut Vec<(String, String)>,
    ) -> &'c str {
        cluster
    }
}

/// Never: no backend is mesh-credentialed here.
pub(super) fn credential_unavailable(_env: &mut Env<'_>, _cluster: Option<&str>) {}
