//! Who a call's tenant is when its credential says so: the one credential
//! the call's API authenticates with, normalised, so one API key is one
//! tenant whatever else the caller sends. A header the provider ignores (an
//! `api-key` beside a chat call's Bearer key, an `authorization` beside
//! Anthropic's `x-api-key`, an empty value, `bearer` spelt in any case)
//! cannot make the same key a new tenant with fresh counts.
//!
//! The tenant is a digest of the credential, never the credential: 12 hex
//! digits, safe as a metric label and a header a front hashes on.

use sha2::{Digest, Sha256};

use crate::dialect::Dialect;

/// What the digest of a credential starts with, so a tenant id is never the
/// digest of anything else.
const DOMAIN: &[u8] = b"llm_filter.tenant.v2";
/// Bytes of the digest a tenant id keeps (as hex: 12 digits).
const ID_BYTES: usize = 6;

/// The credential in `value` of header `name`, normalised: an
/// `authorization` value's `Bearer` scheme (any case) is dropped, so the
/// same key in `authorization` and in `x-api-key` is one credential; other
/// schemes are kept, lowercased. Surrounding whitespace never counts; an
/// empty credential is none.
pub fn normalised<'v>(name: &str, value: &'v str) -> Option<std::borrow::Cow<'v, str>> {
    let value = value.trim_matches(|c: char| c.is_ascii_whitespace());
    if !name.eq_ignore_ascii_case("authorization") {
        return (!value.is_empty()).then_some(std::borrow::Cow::Borrowed(value));
    }
    let (scheme, rest) = match value.split_once(|c: char| c.is_ascii_whitespace()) {
        Some((s, r)) => (s, r.trim_start_matches(|c: char| c.is_ascii_whitespace())),
        None => (value, ""),
    };
    if rest.is_empty() {
        // A bare token is the credential; `Bearer` alone (or nothing) is none.
        if scheme.is_empty() || scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        return Some(std::borrow::Cow::Borrowed(scheme));
    }
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(std::borrow::Cow::Borrowed(rest));
    }
    Some(std::borrow::Cow::Owned(format!(
        "{} {rest}",
        scheme.to_ascii_lowercase()
    )))
}

/// The tenant id of a call of `dialect`: the digest of the first
/// credential among the headers its API authenticates with
/// ([`Dialect::authenticates_with`]), or of `pinned` alone when the
/// configuration names the one header its backends read. `header` reads a
/// request header. `None` without a credential.
pub fn of_credential(
    dialect: Dialect,
    pinned: Option<&str>,
    header: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let pinned = pinned.as_slice();
    let names = if pinned.is_empty() {
        dialect.authenticates_with()
    } else {
        pinned
    };
    names.iter().find_map(|name| {
        let value = header(name)?;
        normalised(name, &value).map(|c| id(&c))
    })
}

/// The tenant id of a credential.
fn id(credential: &str) -> String {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    h.update(credential.as_bytes());
    h.finalize()
        .iter()
        .take(ID_BYTES)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(dialect: Dialect, headers: &[(&str, &str)]) -> Option<String> {
        of_credential(dialect, None, |n| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn a_stray_header_never_makes_a_key_a_new_tenant() {
        let chat = Dialect::Chat;
        let key = tenant(chat, &[("authorization", "Bearer sk-one")]);
        assert!(key.is_some());
        for extra in [
            &[("authorization", "Bearer sk-one"), ("api-key", "x")][..],
            &[("authorization", "Bearer sk-one"), ("api-key", "")],
            &[("authorization", "bearer sk-one"), ("x-api-key", "junk")],
            &[("authorization", "BEARER   sk-one  ")],
            &[("authorization", "\tBearer\tsk-one")],
        ] {
            assert_eq!(tenant(chat, extra), key, "{extra:?}");
        }
        // Anthropic: `x-api-key` is the credential; `authorization` beside it is not.
        let m = Dialect::Messages;
        let anthropic = tenant(m, &[("x-api-key", "sk-ant-1")]);
        assert_eq!(
            tenant(m, &[("x-api-key", "sk-ant-1"), ("authorization", "x")]),
            anthropic
        );
        assert_eq!(
            tenant(m, &[("x-api-key", "sk-ant-1"), ("api-key", "y")]),
            anthropic
        );
        // The same key as a Bearer token, where `x-api-key` is absent: one key, one tenant.
        assert_eq!(
            tenant(m, &[("authorization", "Bearer sk-ant-1")]),
            anthropic
        );
        // Azure's header where there is no Bearer key.
        assert_eq!(tenant(chat, &[("api-key", " sk-one ")]), key);
    }

    #[test]
    fn two_keys_are_two_tenants_and_no_key_is_none() {
        let chat = Dialect::Chat;
        let a = tenant(chat, &[("authorization", "Bearer sk-a")]);
        let b = tenant(chat, &[("authorization", "Bearer sk-b")]);
        assert_ne!(a, b);
        assert_eq!(tenant(chat, &[]), None);
        assert_eq!(tenant(chat, &[("authorization", "Bearer ")]), None);
        assert_eq!(
            tenant(chat, &[("authorization", "  "), ("api-key", "")]),
            None
        );
        // An empty Bearer falls through to Azure's header.
        assert_eq!(
            tenant(chat, &[("authorization", "Bearer"), ("api-key", "sk-a")]),
            a
        );
        // Another scheme is part of the credential.
        let basic = tenant(chat, &[("authorization", "Basic dXNlcg==")]);
        assert_ne!(basic, tenant(chat, &[("authorization", "dXNlcg==")]));
        assert_eq!(basic, tenant(chat, &[("authorization", "basic  dXNlcg==")]));
        // An id is 12 hex digits and never the credential.
        let id = a.unwrap_or_default();
        assert_eq!(id.len(), 12);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn a_pinned_header_is_the_only_credential() {
        let h = |n: &str| match n {
            "authorization" => Some("Bearer junk".to_string()),
            "api-key" => Some("sk-azure".to_string()),
            _ => None,
        };
        let pinned = of_credential(Dialect::Chat, Some("api-key"), h);
        let alone = of_credential(Dialect::Chat, Some("api-key"), |n| {
            (n == "api-key").then(|| "sk-azure".to_string())
        });
        assert_eq!(pinned, alone);
        assert_ne!(pinned, of_credential(Dialect::Chat, None, h));
        assert_eq!(of_credential(Dialect::Chat, Some("x-key"), h), None);
    }
}
