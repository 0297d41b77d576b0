//! The `tenant` section: where a call's tenant comes from, one answer that
//! the limits, the cache's isolation, the `tenant` label, the span and the
//! access-log record all follow. Virtual keys are held only as their
//! SHA-256 digests: the configuration is readable by whoever reads the
//! namespace, and appears whole in Envoy's `/config_dump`.

use std::collections::BTreeMap;

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{Named, Setting, Table};
use crate::dialect::Dialect;

/// `from`.
const FROM: Named<Source> = Named {
    name: "from",
    default: Source::Credential,
    spell: Source::as_str,
};
/// `claim`: the claim of the verified JWT that names the tenant.
const CLAIM: Setting<&str> = Setting::any("claim", "sub");
/// The `payload_in_metadata` of the `jwt_authn` provider: the key the
/// verified payload is read under.
pub const JWT_PAYLOAD: &str = "jwt_payload";
/// Most virtual keys.
pub const MAX_KEYS: usize = 4_096;
/// Longest tenant name of a virtual key (a label and a key part).
pub const MAX_TENANT_LEN: usize = 64;
/// Longest claim name.
const MAX_CLAIM_LEN: usize = 128;

/// The section's settings.
pub const SETTINGS: Table = &[("tenant", &[&FROM, &CLAIM])];

crate::read_fields! {
    /// `tenant` as written.
    #[derive(Debug, Default)]
    pub struct RawTenant {
        /// `credential` (default) | `header` | `peer` | `jwt` | `virtual_key`.
        pub from: Option<Source>,
        /// The header, for `from: header`; for `from: credential`, the one
        /// credential header the backends read (default: the API's own).
        pub header: Option<String>,
        /// For `from: jwt`, the claim naming the tenant, default `sub`.
        pub claim: Option<String>,
        /// For `from: virtual_key`, the keys the platform issued: each tenant's
        /// keys, as their SHA-256 digests (64 hex digits each, separated by
        /// spaces or commas), never the keys.
        pub keys: Option<BTreeMap<String, String>>,
    }
}

/// Who the tenant of a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// A digest of the one credential the call's API authenticates with
    /// (see [`super::credential`]): every API key is a tenant.
    #[default]
    Credential,
    /// The value of a header a trusted hop sets.
    Header,
    /// The mTLS peer's identity (its URI SAN, the SPIFFE id in a mesh).
    Peer,
    /// A claim of the JWT Envoy's `jwt_authn` verified before the filter.
    Jwt,
    /// A key the platform issued, known by its digest.
    VirtualKey,
}

impl crate::config::read::Read for Source {
    fn read(v: &serde_json::Value) -> Result<Self, ConfigError> {
        let all = [
            Self::Credential,
            Self::Header,
            Self::Peer,
            Self::Jwt,
            Self::VirtualKey,
        ];
        crate::config::read::variant(v, &all, Self::as_str)
    }
}

impl Source {
    /// The document's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Credential => "credential",
            Self::Header => "header",
            Self::Peer => "peer",
            Self::Jwt => "jwt",
            Self::VirtualKey => "virtual_key",
        }
    }

    /// The tenant is verified by the mesh, not read from whatever
    /// credential the call carries: the cache isolates by it.
    pub fn verified(self) -> bool {
        !matches!(self, Self::Credential)
    }
}

/// The compiled section.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantConfig {
    /// Where the tenant comes from.
    pub from: Source,
    /// The tenant header ([`Source::Header`]); the one credential header
    /// ([`Source::Credential`], default: the API's own).
    pub header: Option<String>,
    /// The claim ([`Source::Jwt`]).
    pub claim: String,
    /// The virtual keys by digest, sorted for a binary search.
    pub keys: Vec<([u8; 32], String)>,
}

#[cfg(test)]
impl Default for TenantConfig {
    fn default() -> Self {
        check::defaults(Self::compile)
    }
}

impl TenantConfig {
    /// Compiles the section.
    pub fn compile(raw: RawTenant) -> Result<Self, ConfigError> {
        let from = FROM.default_or(raw.from);
        for (set, field, ok) in [
            (raw.claim.is_some(), CLAIM.name, from == Source::Jwt),
            (raw.keys.is_some(), "keys", from == Source::VirtualKey),
        ] {
            if set && !ok {
                return Err(ConfigError::new(field, "this `from` does not read it"));
            }
        }
        let claim = CLAIM.or_string(raw.claim);
        if claim.is_empty() || claim.len() > MAX_CLAIM_LEN {
            return Err(ConfigError::new(CLAIM.name, "is not 1 to 128 bytes"));
        }
        Ok(Self {
            header: compile_header(from, raw.header)?,
            claim,
            keys: match from {
                Source::VirtualKey => compile_keys(&raw.keys.unwrap_or_default())?,
                _ => Vec::new(),
            },
            from,
        })
    }

    /// The tenant of the virtual key whose digest is `digest`.
    pub fn key_tenant(&self, digest: &[u8; 32]) -> Option<&str> {
        let i = self.keys.binary_search_by(|(d, _)| d.cmp(digest)).ok()?;
        self.keys.get(i).map(|(_, t)| t.as_str())
    }
}

/// `header`, by the source that reads it.
fn compile_header(from: Source, raw: Option<String>) -> Result<Option<String>, ConfigError> {
    let refuse = |why: &str| Err(ConfigError::new("header", why));
    let Some(h) = raw.map(|h| h.to_ascii_lowercase()) else {
        if from == Source::Header {
            return refuse("`from: header` needs the header's name");
        }
        return Ok(None);
    };
    match from {
        Source::Header | Source::Credential if !check::is_header_name(&h) => {
            refuse("is not a header name")
        }
        // The tenant is a label and a key part: a credential must be
        // counted by its digest, never as itself.
        Source::Header if is_credential(&h) => {
            refuse("carries a credential; count it with `from: credential`")
        }
        Source::Header | Source::Credential => Ok(Some(h)),
        _ => refuse("this `from` reads no header"),
    }
}

/// A header some API authenticates with.
pub fn is_credential(name: &str) -> bool {
    name == "authorization" || name == "api-key" || Dialect::is_credential_header(name)
}

/// `keys`: at least one, at most [`MAX_KEYS`], each digest once. Errors
/// never echo a value: a key pasted here by mistake stays out of the log.
fn compile_keys(raw: &BTreeMap<String, String>) -> Result<Vec<([u8; 32], String)>, ConfigError> {
    // Kept sorted by inserting each in its place: a sort would compile
    // kilobytes of code into the module for a list read once.
    let mut keys: Vec<([u8; 32], String)> = Vec::new();
    for (tenant, digests) in raw {
        if !check::is_label(tenant, MAX_TENANT_LEN) {
            return Err(ConfigError::new(
                "keys",
                "a tenant is 1 to 64 of [A-Za-z0-9_-]",
            ));
        }
        for d in digests.split([' ', ',']).filter(|d| !d.is_empty()) {
            let Some(digest) = hex_digest(d) else {
                return Err(ConfigError::new(
                    "keys",
                    "holds a value that is not a SHA-256 digest (64 hex digits)",
                ));
            };
            match keys.binary_search_by(|(k, _)| k.cmp(&digest)) {
                Ok(_) => return Err(ConfigError::new("keys", "lists a digest twice")),
                Err(at) => keys.insert(at, (digest, tenant.clone())),
            }
        }
    }
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(ConfigError::new(
            "keys",
            "`from: virtual_key` needs 1 to 4096 keys",
        ));
    }
    Ok(keys)
}

/// 64 hex digits (either case) as the 32 bytes they spell.
fn hex_digest(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let hi = char::from(*pair.first()?).to_digit(16)?;
        let lo = char::from(*pair.get(1)?).to_digit(16)?;
        *o = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
    const B: &str = "81b637d8fcd2c6da6359e6963113a1170de795e4b725b84d1e0b4cfd9ec58ce9";

    fn parse(json: &str) -> Result<TenantConfig, ConfigError> {
        TenantConfig::compile(crate::config::read::parse(json.as_bytes()).unwrap())
    }

    #[test]
    fn empty_is_the_credential() {
        let c = TenantConfig::default();
        assert_eq!(c.from, Source::Credential);
        assert!(!c.from.verified());
        assert_eq!(c.claim, "sub");
        assert!(c.keys.is_empty() && c.header.is_none());
    }

    #[test]
    fn reads_each_source() {
        let h = parse(r#"{"from":"header","header":"X-Tenant"}"#).unwrap();
        assert_eq!(h.header.as_deref(), Some("x-tenant"));
        let pinned = parse(r#"{"header":"API-Key"}"#).unwrap();
        assert_eq!(pinned.header.as_deref(), Some("api-key"));
        let j = parse(r#"{"from":"jwt","claim":"team"}"#).unwrap();
        assert_eq!(j.claim, "team");
        let doc = format!(
            r#"{{"from":"virtual_key","keys":{{"b":"{B}","a":" {},"}}}}"#,
            A.to_uppercase()
        );
        let v = parse(&doc).unwrap();
        assert!(v.from.verified());
        assert_eq!(v.key_tenant(&hex_digest(A).unwrap()), Some("a"));
        assert_eq!(v.key_tenant(&hex_digest(B).unwrap()), Some("b"));
        assert_eq!(v.key_tenant(&[0; 32]), None);
    }

    #[test]
    fn refuses_what_would_not_apply() {
        let short = &A[..63];
        let key = |sha: &str, tenant: &str| {
            format!(r#"{{"from":"virtual_key","keys":{{"{tenant}":"{sha}"}}}}"#)
        };
        for (doc, field) in [
            (r#"{"from":"header"}"#.to_string(), "header"),
            (r#"{"from":"peer","header":"x"}"#.into(), "header"),
            (r#"{"from":"jwt","header":"x"}"#.into(), "header"),
            (
                r#"{"from":"header","header":"Authorization"}"#.into(),
                "header",
            ),
            (r#"{"from":"header","header":"x-api-key"}"#.into(), "header"),
            (r#"{"from":"header","header":"a b"}"#.into(), "header"),
            (r#"{"claim":"sub"}"#.into(), "claim"),
            (r#"{"from":"jwt","claim":""}"#.into(), "claim"),
            (r#"{"from":"jwt","keys":{}}"#.into(), "keys"),
            (r#"{"from":"virtual_key"}"#.into(), "keys"),
            (r#"{"from":"virtual_key","keys":{}}"#.into(), "keys"),
            (
                r#"{"from":"virtual_key","keys":{"a":" , "}}"#.into(),
                "keys",
            ),
            (key(short, "a"), "keys"),
            (key(&format!("{short}g"), "a"), "keys"),
            (key("sk-live-not-a-digest", "a"), "keys"),
            (key(A, ""), "keys"),
            (key(A, "a b"), "keys"),
            (
                format!(
                    r#"{{"from":"virtual_key","keys":{{"a":"{A} {B}","b":"{}"}}}}"#,
                    A.to_uppercase()
                ),
                "keys",
            ),
            (
                format!(r#"{{"from":"virtual_key","keys":{{"a":"{A},{A}"}}}}"#),
                "keys",
            ),
        ] {
            let e = parse(&doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
        }
        // A key pasted in place of its digest is never echoed.
        let e = parse(&key("sk-live-not-a-digest", "a")).unwrap_err();
        assert!(!e.to_string().contains("sk-live"), "{e}");
    }

    #[test]
    fn a_digest_is_exactly_64_hex_digits() {
        assert_eq!(hex_digest(&"0".repeat(64)), Some([0; 32]));
        assert_eq!(hex_digest(&"f".repeat(64)), Some([0xff; 32]));
        for bad in ["", "0", &"0".repeat(65), &"é".repeat(32), &"+1".repeat(32)] {
            assert_eq!(hex_digest(bad), None, "{bad}");
        }
    }
}
