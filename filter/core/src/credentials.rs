//! Provider keys belong to the mesh, not the apps: Envoy's own upstream
//! filters on a provider's cluster (`credential_injector` with a secret from
//! SDS, `aws_request_signing`) put the credential on, so no secret is ever
//! in this filter's configuration. The filter's part is to say which
//! backends are so credentialed, to strip whatever credential the client
//! sent before a call for one leaves (an app's stray key never reaches a
//! provider), to pick a tenant's own credential set, and to tell a caller
//! plainly when the mesh's credential is missing.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{Setting, Table};

/// `every_call`.
const EVERY_CALL: Setting<bool> = Setting::any("every_call", false);

/// The section's settings.
pub const SETTINGS: Table = &[("credentials", &[&EVERY_CALL])];

/// Envoy's `response.code_details` of `credential_injector`'s 401 when it
/// has no credential to put on (its secret is missing or unreadable).
pub const NOT_INJECTED_DETAILS: &str = "failed_to_inject_credential";

/// `credentials` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCredentialsConfig {
    /// Every call through the filter is mesh-credentialed (an egress gateway).
    pub every_call: Option<bool>,
    /// The mesh-credentialed clusters, each an object of its tenants' own
    /// clusters (tenant id → the cluster carrying that tenant's
    /// credential). Read as a JSON value: the module already holds its
    /// reader, where a typed map of maps would add one of its own.
    pub clusters: Option<Value>,
}

/// The compiled `credentials` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialsConfig {
    /// Every call through the filter is mesh-credentialed.
    pub every_call: bool,
    /// Mesh-credentialed clusters, each with its tenants' own clusters
    /// (tenant id, cluster: the same endpoints, another secret).
    pub clusters: Vec<(String, Vec<(String, String)>)>,
}

impl CredentialsConfig {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawCredentialsConfig) -> Result<Self, ConfigError> {
        let mut clusters = Vec::new();
        for (name, tenants) in object("clusters", raw.clusters)? {
            let field = format!("clusters.{name}");
            cluster(&field, &name)?;
            let mut sets = Vec::new();
            for (tenant, to) in object(&field, Some(tenants))? {
                let at = format!("{field}.{tenant}");
                match to {
                    Value::String(to) if !tenant.is_empty() => {
                        cluster(&at, &to)?;
                        sets.push((tenant, to));
                    }
                    _ => return Err(ConfigError::new(at, "is not a tenant id → cluster name")),
                }
            }
            clusters.push((name, sets));
        }
        Ok(Self {
            every_call: EVERY_CALL.or(raw.every_call),
            clusters,
        })
    }

    /// True when a call to `cluster` (`None`: not routed by the filter)
    /// carries the mesh's credential, not the client's.
    pub fn mesh(&self, cluster: Option<&str>) -> bool {
        self.every_call || cluster.is_some_and(|c| self.tenants(c).is_some())
    }

    /// The tenant sets of mesh-credentialed `cluster`; `None`: not one.
    fn tenants(&self, cluster: &str) -> Option<&[(String, String)]> {
        self.clusters
            .iter()
            .find(|(c, _)| c == cluster)
            .map(|(_, t)| t.as_slice())
    }

    /// True when some backend has per-tenant credential sets.
    pub fn per_tenant(&self) -> bool {
        self.clusters.iter().any(|(_, t)| !t.is_empty())
    }

    /// The cluster a call for `cluster` is sent to: the one holding
    /// `tenant`'s own credential, else `cluster` itself.
    pub fn cluster_for<'a>(&'a self, cluster: &'a str, tenant: Option<&str>) -> &'a str {
        tenant
            .and_then(|t| self.tenants(cluster)?.iter().find(|(id, _)| id == t))
            .map_or(cluster, |(_, c)| c.as_str())
    }
}

/// The members of `value`, a JSON object (none when absent).
fn object(field: &str, value: Option<Value>) -> Result<Map<String, Value>, ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m),
        Some(_) => Err(ConfigError::new(field, "is not an object")),
    }
}

/// `name` of `field` is a cluster name.
fn cluster(field: &str, name: &str) -> Result<(), ConfigError> {
    if check::is_cluster(name) {
        return Ok(());
    }
    Err(ConfigError::new(
        field,
        format!("{name:?} is not a cluster name ([A-Za-z0-9_.|-])"),
    ))
}

/// Every header any dialect's providers authenticate a call with
/// ([`crate::dialect::Dialect::authenticates_with`], which a test holds
/// this to): what a
/// call for a mesh-credentialed backend leaves without.
pub const CLIENT_HEADERS: [&str; 4] = ["authorization", "api-key", "x-api-key", "x-goog-api-key"];

/// `headers` (a callout's) made right for a backend: without any client
/// credential when it is `mesh`-credentialed or the call's first backend
/// was (`keyless`: what is left there may be a key the mesh put on another
/// cluster's call).
pub fn for_callout(headers: &mut Vec<(String, String)>, mesh: bool, keyless: bool) {
    if mesh || keyless {
        headers.retain(|(k, _)| !CLIENT_HEADERS.iter().any(|h| k.eq_ignore_ascii_case(h)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    fn compile(json: &str) -> Result<CredentialsConfig, ConfigError> {
        CredentialsConfig::compile(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn names_the_mesh_credentialed_backends() {
        let c = compile(r#"{"clusters":{"openai":{},"claude":{"team-a":"claude-a"}}}"#).unwrap();
        assert!(c.mesh(Some("openai")) && c.mesh(Some("claude")));
        assert!(!c.mesh(Some("local")) && !c.mesh(None));
        assert!(c.per_tenant());
        assert_eq!(c.cluster_for("claude", Some("team-a")), "claude-a");
        assert_eq!(c.cluster_for("claude", Some("team-b")), "claude");
        assert_eq!(c.cluster_for("claude", None), "claude");
        assert_eq!(c.cluster_for("openai", Some("team-a")), "openai");
        let all = compile(r#"{"every_call":true}"#).unwrap();
        assert!(all.mesh(None) && all.mesh(Some("x")) && !all.per_tenant());
        let none = compile("{}").unwrap();
        assert!(!none.mesh(None) && !none.mesh(Some("openai")));
    }

    #[test]
    fn refuses_what_is_not_a_cluster() {
        for (json, field) in [
            (r#"{"clusters":{"a b":{}}}"#, "clusters.a b"),
            (r#"{"clusters":{"a":{"t":""}}}"#, "clusters.a.t"),
            (r#"{"clusters":{"a":{"":"b"}}}"#, "clusters.a."),
            (r#"{"clusters":{"a":{"t":1}}}"#, "clusters.a.t"),
            (r#"{"clusters":{"a":[]}}"#, "clusters.a"),
            (r#"{"clusters":[]}"#, "clusters"),
        ] {
            assert_eq!(compile(json).unwrap_err().field, field, "{json}");
        }
        assert!(serde_json::from_str::<RawCredentialsConfig>(r#"{"secret":"x"}"#).is_err());
    }

    #[test]
    fn every_dialects_credential_header_is_stripped() {
        let mut all: Vec<&str> = Dialect::names()
            .filter_map(Dialect::named)
            .flat_map(|d| d.authenticates_with().iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        let mut listed = CLIENT_HEADERS.to_vec();
        listed.sort_unstable();
        assert_eq!(all, listed, "the list is the union of every dialect's");
    }

    #[test]
    fn a_callout_carries_no_client_key_where_the_mesh_puts_one_on() {
        let base = || {
            vec![
                (":path".to_string(), "/v1/messages".to_string()),
                ("X-Api-Key".to_string(), "injected".to_string()),
                ("anthropic-version".to_string(), "2023-06-01".to_string()),
            ]
        };
        for (mesh, keyless) in [(true, false), (true, true), (false, true)] {
            let mut h = base();
            for_callout(&mut h, mesh, keyless);
            assert_eq!(h.len(), 2, "{mesh} {keyless}");
            assert!(h.iter().all(|(k, _)| !k.eq_ignore_ascii_case("x-api-key")));
        }
        // Neither: the headers stay as the client sent them.
        let mut h = base();
        for_callout(&mut h, false, false);
        assert_eq!(h, base());
    }
}
