//! The walk's credential step: a call for a backend the mesh holds the key
//! of (`credentials`) leaves without any credential the client sent, in a
//! header or in the query, with the headers the API needs beside a key, and
//! on the cluster that carries its tenant's own credential. Envoy's upstream
//! filters on that cluster put the key on; the filter never sees it.

use crate::credentials;
use crate::metrics::{self, CREDENTIAL_UNAVAILABLE, LLM_CLUSTER, UNKNOWN};

use super::upstream::set_route_header;
use super::{set_request, Call, Env, Host};

impl Call {
    /// As the call leaves for the cluster routing chose (or for wherever
    /// Envoy routes it, with `credentials.every_call`): when that backend
    /// is mesh-credentialed, the client's credentials are stripped from the
    /// request.
    pub(super) fn leave_keyless(&mut self, env: &mut Env<'_>, host: &mut dyn Host) {
        let cluster = self.dispatch.cluster.clone();
        if !env.config.credentials.mesh(cluster.as_deref()) {
            return;
        }
        let api = self.request.dialect.request();
        for name in credentials::CLIENT_HEADERS {
            set_request(env, host, name, None);
        }
        let path = host.request_header(":path");
        if let Some(path) = path.and_then(|p| api.without_query_credential(&p)) {
            set_request(env, host, ":path", Some(&path));
        }
        for (name, value) in api.keyless_headers() {
            if host.request_header(name).is_none() {
                set_request(env, host, name, Some(value));
            }
        }
        self.dispatch.keyless = true;
        if let Some(cluster) = &cluster {
            let own = env
                .config
                .credentials
                .cluster_for(cluster, self.request.tenant.as_deref());
            if own != cluster {
                let own = own.to_string();
                set_route_header(env, host, Some(&own));
            }
        }
    }

    /// The cluster a callout for backend `cluster` goes to (its tenant's
    /// credential set, when it has one), with `headers` made right for it:
    /// without the client's credentials for a mesh-credentialed backend (or
    /// after the call's first backend was one).
    pub(super) fn callout_cluster<'c>(
        &self,
        env: &'c Env<'_>,
        cluster: &'c str,
        headers: &mut Vec<(String, String)>,
    ) -> &'c str {
        let creds = &env.config.credentials;
        let mesh = creds.mesh(Some(cluster));
        credentials::for_callout(headers, mesh, self.dispatch.keyless);
        if !mesh {
            return cluster;
        }
        let api = self.request.dialect.request();
        for (_, v) in headers.iter_mut().filter(|(k, _)| k == ":path") {
            if let Some(p) = api.without_query_credential(v) {
                *v = p;
            }
        }
        for (name, value) in api.keyless_headers() {
            if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) {
                headers.push(((*name).to_string(), (*value).to_string()));
            }
        }
        creds.cluster_for(cluster, self.request.tenant.as_deref())
    }
}

/// Counts a call the mesh's credential for `cluster` was missing or
/// refused for.
pub(super) fn credential_unavailable(env: &mut Env<'_>, cluster: Option<&str>) {
    let labels = [(LLM_CLUSTER, cluster.unwrap_or(UNKNOWN))];
    env.metrics
        .counter(&metrics::name(CREDENTIAL_UNAVAILABLE, &labels), 1);
}
