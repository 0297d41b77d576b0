//! Who the caller is: the call's tenant, found once on request headers and
//! followed by every feature that tells tenants apart (limits, the cache's
//! isolation, the `tenant` label, the span, the access-log record). Where
//! the mesh can verify who calls — the mTLS peer, a JWT Envoy's `jwt_authn`
//! checked, a virtual key the platform issued — the tenant is that, and a
//! call that should carry a key or a claim and does not is refused before
//! anything is spent; else the one credential the call's API
//! authenticates with. A virtual key is digested, looked up and taken off
//! the call: no upstream, log or label ever sees it.

pub mod config;
pub mod credential;

use sha2::{Digest, Sha256};

pub use config::{Source, TenantConfig};

use crate::dialect::Dialect;

/// Longest tenant a claim may name: longer is no tenant (a claim is a
/// label value and a key part).
pub const MAX_CLAIM_LEN: usize = 256;
/// The namespace `jwt_authn` writes its dynamic metadata under.
pub const JWT_AUTHN: &str = "envoy.filters.http.jwt_authn";

/// Why a call is refused for who it is: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No virtual key, or no verified claim.
    Missing,
    /// A key that is none of the configured ones.
    Unknown,
}

impl Refusal {
    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Unknown => "unknown",
        }
    }

    /// What the caller is told (never the key it sent).
    pub fn message(self, from: Source) -> &'static str {
        match (self, from) {
            (Self::Missing, Source::Jwt) => "The request carries no verified identity.",
            (Self::Missing, _) => "The request carries no API key.",
            (Self::Unknown, _) => "Incorrect API key provided.",
        }
    }
}

/// Where a virtual key came in, to take it off the call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Presented {
    /// The API's credential headers the call carries.
    pub headers: Vec<&'static str>,
    /// The query carries it too (Gemini's `?key=`).
    pub query: bool,
}

/// Who the caller is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// The tenant; `None` where the source names none (a peer without a
    /// URI SAN, no tenant header, no credential).
    pub tenant: Option<String>,
    /// The virtual key's places, for `from: virtual_key`.
    pub presented: Presented,
}

/// What the request tells of its caller: a request header, the query
/// credential of a call of `path`, and a stream property.
pub struct Caller<'a> {
    /// A request header.
    pub header: &'a dyn Fn(&str) -> Option<String>,
    /// A property of the stream or its connection.
    pub property: &'a dyn Fn(&[&str]) -> Option<Vec<u8>>,
}

/// The identity of a call of `dialect` to `path`, as `cfg` says where it
/// comes from; a refusal where a virtual key or a verified claim is due
/// and missing, or the key is unknown.
pub fn resolve(
    cfg: &TenantConfig,
    dialect: Dialect,
    path: &str,
    caller: &Caller<'_>,
) -> Result<Identity, Refusal> {
    let tenant = match cfg.from {
        Source::Credential => credential::of_credential(dialect, cfg.header.as_deref(), |name| {
            presented(dialect, path, caller, name)
        }),
        Source::Header => cfg
            .header
            .as_deref()
            .and_then(|h| (caller.header)(h))
            .filter(|v| !v.is_empty()),
        Source::Peer => (caller.property)(&["connection", "uri_san_peer_certificate"])
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .filter(|v| !v.is_empty()),
        Source::Jwt => {
            let path = [
                "metadata",
                "filter_metadata",
                JWT_AUTHN,
                config::JWT_PAYLOAD,
                &cfg.claim,
            ];
            let claim = (caller.property)(&path)
                .and_then(claim)
                .ok_or(Refusal::Missing)?;
            Some(claim)
        }
        Source::VirtualKey => return virtual_key(cfg, dialect, path, caller),
    };
    Ok(Identity {
        tenant,
        presented: Presented::default(),
    })
}

/// The credential header `name` of a call, or the query's in its place.
fn presented(dialect: Dialect, path: &str, caller: &Caller<'_>, name: &str) -> Option<String> {
    (caller.header)(name).or_else(|| {
        dialect
            .request()
            .query_credential(path, name)
            .map(str::to_string)
    })
}

/// A claim's value as the host gives it, when it is a tenant: 1 to
/// [`MAX_CLAIM_LEN`] bytes of UTF-8 without control characters. Envoy
/// (1.40) walks the path into `jwt_authn`'s metadata Struct and returns a
/// string leaf as its bytes, no protobuf around them (the e2e test
/// `identity::a_jwt_claim_verified_by_envoy_is_the_tenant` holds it to
/// that); a claim of another type comes back as something else, which is
/// no tenant.
fn claim(bytes: Vec<u8>) -> Option<String> {
    if bytes.is_empty() || bytes.len() > MAX_CLAIM_LEN {
        return None;
    }
    if bytes.iter().any(|b| *b < b' ' || *b == 0x7f) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// The tenant of the virtual key the call presents in the first header
/// its API authenticates with (or Gemini's query), and every place that
/// carries a credential of the API.
fn virtual_key(
    cfg: &TenantConfig,
    dialect: Dialect,
    path: &str,
    caller: &Caller<'_>,
) -> Result<Identity, Refusal> {
    let names = dialect.authenticates_with();
    let key = names
        .iter()
        .find_map(|n| {
            let v = presented(dialect, path, caller, n)?;
            credential::normalised(n, &v).map(|c| c.into_owned())
        })
        .ok_or(Refusal::Missing)?;
    let tenant = cfg.key_tenant(&digest(&key)).ok_or(Refusal::Unknown)?;
    // Every credential of the API the call carries goes: the client's
    // credentials are virtual keys here, and the provider's is the mesh's.
    let headers = names
        .iter()
        .copied()
        .filter(|n| (caller.header)(n).is_some())
        .collect();
    let query = names
        .iter()
        .any(|n| dialect.request().query_credential(path, n).is_some());
    Ok(Identity {
        tenant: Some(tenant.to_string()),
        presented: Presented { headers, query },
    })
}

/// SHA-256 of a key, as `printf %s "$KEY" | sha256sum` writes it.
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

#[cfg(test)]
mod tests;
