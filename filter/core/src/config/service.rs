//! A service the filter asks itself, by an HTTP callout to an Envoy cluster:
//! the embeddings service, Alertmanager, Prometheus. Where it is and how it
//! is asked is written the same way for each, and checked in one place.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::check;
use super::error::ConfigError;
use super::setting::{Empty, Setting};

/// Most extra headers a service is sent.
const MAX_HEADERS: usize = 16;
/// A service's `headers`: none beside the request's own.
pub const HEADERS: Empty = Empty::map("headers");
/// Headers the filter sets itself on a callout.
const RESERVED: [&str; 5] = ["content-type", "content-length", "host", "te", "connection"];

/// A service's fields as written: `cluster`, `authority`, `path`, `headers`,
/// `timeout_ms` of its section.
#[derive(Debug, Default, Clone)]
pub struct RawService {
    /// The Envoy cluster that reaches it.
    pub cluster: Option<String>,
    /// `:authority`, default the cluster name.
    pub authority: Option<String>,
    /// `:path`, default the service's.
    pub path: Option<String>,
    /// Extra request headers (e.g. a credential).
    pub headers: Option<BTreeMap<String, String>>,
    /// Wait for the answer, ms.
    pub timeout_ms: Option<u64>,
}

/// The [`RawService`] of a section's `cluster`, `authority`, `path`,
/// `headers` and `timeout_ms` fields (each section declares them itself:
/// serde cannot flatten into a struct that refuses unknown fields).
#[macro_export]
macro_rules! raw_service {
    ($raw:expr) => {
        $crate::config::service::RawService {
            cluster: $raw.cluster,
            authority: $raw.authority,
            path: $raw.path,
            headers: $raw.headers,
            timeout_ms: $raw.timeout_ms,
        }
    };
}

/// What a kind of service defaults to: its `path` and its `timeout_ms`
/// (the wait and its range).
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// Its path.
    pub path: Setting<&'static str>,
    /// Its wait, ms.
    pub timeout: Setting<u64>,
}

/// A callout to a service: its headers and its body.
pub type Callout = (Vec<(String, String)>, Vec<u8>);

/// A compiled service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Envoy cluster.
    pub cluster: String,
    /// `:authority` sent.
    pub authority: String,
    /// `:path` sent.
    pub path: String,
    /// Extra headers, lowercase names.
    pub headers: Vec<(String, String)>,
    /// Wait for the answer, ms.
    pub timeout_ms: u64,
}

impl Service {
    /// Compiles the fields; errors name them relative to the section.
    pub fn compile(raw: RawService, defaults: Defaults) -> Result<Self, ConfigError> {
        let cluster = raw
            .cluster
            .filter(|c| !c.is_empty())
            .ok_or_else(|| ConfigError::new("cluster", "is required: an Envoy cluster name"))?;
        let authority = raw.authority.unwrap_or_else(|| cluster.clone());
        if authority.is_empty() || check::has_blank_or_control(&authority) {
            return Err(ConfigError::new(
                "authority",
                format!("{authority:?} is not a host"),
            ));
        }
        let path = defaults.path.or_string(raw.path);
        if !path.starts_with('/') || check::has_blank_or_control(&path) {
            return Err(ConfigError::new("path", format!("{path:?} is not a path")));
        }
        Ok(Self {
            cluster,
            authority,
            path,
            headers: compile_headers(HEADERS.or(raw.headers))?,
            timeout_ms: defaults.timeout.read(raw.timeout_ms)?,
        })
    }

    /// The callout's headers: `method` to `path_and_query`, its body's
    /// content type and length if it has one (else it accepts JSON), then
    /// the configured ones.
    pub fn request_headers(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<(&str, usize)>,
    ) -> Vec<(String, String)> {
        let mut headers = vec![
            (":method".to_string(), method.to_string()),
            (":path".to_string(), path_and_query.to_string()),
            (":authority".to_string(), self.authority.clone()),
        ];
        match body {
            Some((content_type, len)) => {
                headers.push(("content-type".to_string(), content_type.to_string()));
                headers.push(("content-length".to_string(), len.to_string()));
            }
            None => headers.push(("accept".to_string(), "application/json".to_string())),
        }
        headers.extend(self.headers.iter().cloned());
        headers
    }
}

fn compile_headers(raw: BTreeMap<String, String>) -> Result<Vec<(String, String)>, ConfigError> {
    if raw.len() > MAX_HEADERS {
        return Err(ConfigError::new(
            "headers",
            format!("{} headers, at most {MAX_HEADERS}", raw.len()),
        ));
    }
    let mut headers = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let lower = name.to_ascii_lowercase();
        if !check::is_token(&name) || RESERVED.contains(&lower.as_str()) {
            return Err(ConfigError::new(
                format!("headers.{name}"),
                "is not a header name the filter may set",
            ));
        }
        if !check::is_header_value(&value) {
            return Err(ConfigError::new(
                format!("headers.{lower}"),
                "has a control character in its value",
            ));
        }
        headers.push((lower, value));
    }
    Ok(headers)
}

/// `s` percent-encoded for a URL query value: every byte but the unreserved
/// ones of RFC 3986.
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Defaults = Defaults {
        path: Setting::any("path", "/x"),
        timeout: Setting::range("timeout_ms", 50, 1, 100),
    };

    #[test]
    fn defaults_and_errors_name_the_field() {
        let s = Service::compile(
            RawService {
                cluster: Some("c".into()),
                ..RawService::default()
            },
            D,
        )
        .unwrap();
        assert_eq!(
            (s.authority.as_str(), s.path.as_str(), s.timeout_ms),
            ("c", "/x", 50)
        );
        let bad = |raw: RawService| Service::compile(raw, D).unwrap_err().field;
        let with = |f: fn(&mut RawService)| {
            let mut r = RawService {
                cluster: Some("c".into()),
                ..RawService::default()
            };
            f(&mut r);
            r
        };
        assert_eq!(bad(RawService::default()), "cluster");
        assert_eq!(bad(with(|r| r.path = Some("x".into()))), "path");
        assert_eq!(bad(with(|r| r.authority = Some("a b".into()))), "authority");
        assert_eq!(bad(with(|r| r.timeout_ms = Some(101))), "timeout_ms");
        assert_eq!(
            bad(with(
                |r| r.headers = Some([("Host".into(), "h".into())].into())
            )),
            "headers.Host"
        );
        assert_eq!(
            bad(with(
                |r| r.headers = Some([("X".into(), "a\nb".into())].into())
            )),
            "headers.x"
        );
    }

    #[test]
    fn request_headers_put_the_configured_ones_last() {
        let s = Service::compile(
            RawService {
                cluster: Some("c".into()),
                headers: Some([("Authorization".into(), "Bearer k".into())].into()),
                ..RawService::default()
            },
            D,
        )
        .unwrap();
        let h = s.request_headers("GET", "/x?a=1", None);
        assert_eq!(h[1], (":path".into(), "/x?a=1".into()));
        assert_eq!(h[3], ("accept".into(), "application/json".into()));
        assert_eq!(h[4], ("authorization".into(), "Bearer k".into()));
        let h = s.request_headers("POST", "/x", Some(("application/json", 7)));
        assert!(h.contains(&("content-length".into(), "7".into())));
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(query_escape("a-Z_0.~"), "a-Z_0.~");
        assert_eq!(
            query_escape(r#"severity=~"crit|warn" é"#),
            "severity%3D~%22crit%7Cwarn%22%20%C3%A9"
        );
    }
}
