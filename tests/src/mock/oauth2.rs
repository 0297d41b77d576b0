//! A mock OAuth2 token endpoint (RFC 6749's client credentials grant, as
//! Microsoft Entra ID answers it), so a test can prove that a provider's
//! short-lived tokens are fetched and refreshed in time: it issues opaque
//! random tokens that expire after `expires_in`, remembers when each one
//! expires, and a [`MockUpstream`](super::MockUpstream) told to
//! [`take_tokens_of`](super::MockUpstream::take_tokens_of) it refuses any
//! other, or an expired one, as the provider does. It can be set down
//! (every connection closed unanswered) or slow at runtime, and counts the
//! token requests it got.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::{from_base64, json_response, lock, Body, ResetConnection, Server};

/// The tokens an endpoint issued, each with the moment it expires.
#[derive(Debug, Default)]
pub struct Ledger {
    expiry: Mutex<HashMap<String, Instant>>,
}

impl Ledger {
    /// When `token` expires; `None` for a token never issued.
    pub fn expiry(&self, token: &str) -> Option<Instant> {
        lock(&self.expiry).get(token).copied()
    }

    /// `token` was issued and has not expired at `at`.
    pub fn valid_at(&self, token: &str, at: Instant) -> bool {
        self.expiry(token).is_some_and(|expiry| at < expiry)
    }

    /// Every token issued, in no order.
    pub fn tokens(&self) -> Vec<String> {
        lock(&self.expiry).keys().cloned().collect()
    }
}

struct Issuer {
    client_id: String,
    client_secret: String,
    expires_in_s: AtomicU64,
    delay_ms: AtomicU64,
    down: AtomicBool,
    requests: AtomicU64,
    issued: AtomicU64,
    ledger: Arc<Ledger>,
    /// Keyed with the process's random SipHash keys: the source of tokens
    /// nobody can guess from the ones seen before.
    random: std::collections::hash_map::RandomState,
}

/// A running token endpoint; stops when dropped.
pub struct TokenEndpoint {
    issuer: Arc<Issuer>,
    server: Server,
}

impl TokenEndpoint {
    /// An endpoint on a free loopback port that takes only `client_id` with
    /// `client_secret` and issues tokens living `expires_in_s` seconds.
    pub fn start(client_id: &str, client_secret: &str, expires_in_s: u64) -> Self {
        let issuer = Arc::new(Issuer {
            client_id: client_id.to_string(),
            client_secret: client_secret.to_string(),
            expires_in_s: AtomicU64::new(expires_in_s),
            delay_ms: AtomicU64::new(0),
            down: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            issued: AtomicU64::new(0),
            ledger: Arc::default(),
            random: std::collections::hash_map::RandomState::new(),
        });
        let serving = Arc::clone(&issuer);
        let server = Server::start("token", IpAddr::V4(Ipv4Addr::LOCALHOST), 0, move |req| {
            token(Arc::clone(&serving), req)
        })
        .expect("mock token endpoint");
        Self { issuer, server }
    }

    /// Port the endpoint listens on.
    pub fn port(&self) -> u16 {
        self.server.addr.port()
    }

    /// The tokens issued so far and when each expires.
    pub fn ledger(&self) -> Arc<Ledger> {
        Arc::clone(&self.issuer.ledger)
    }

    /// Token requests received (answered or not) since start.
    pub fn requests(&self) -> u64 {
        self.issuer.requests.load(Ordering::SeqCst)
    }

    /// Tokens issued since start.
    pub fn issued(&self) -> u64 {
        self.issuer.issued.load(Ordering::SeqCst)
    }

    /// `true`: every later request's connection is closed unanswered, as
    /// an endpoint that is down looks to its client.
    pub fn set_down(&self, down: bool) {
        self.issuer.down.store(down, Ordering::SeqCst);
    }

    /// Every later answer waits `ms` first.
    pub fn set_delay_ms(&self, ms: u64) {
        self.issuer.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Every later token lives `s` seconds.
    pub fn set_expires_in(&self, s: u64) {
        self.issuer.expires_in_s.store(s, Ordering::SeqCst);
    }
}

/// Answers a token request: a token for the configured client, else
/// RFC 6749's error (`invalid_client` 401, `unsupported_grant_type` 400).
async fn token(
    issuer: Arc<Issuer>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    issuer.requests.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|_| ResetConnection)?
        .to_bytes();
    if issuer.down.load(Ordering::SeqCst) {
        return Err(ResetConnection);
    }
    let delay_ms = issuer.delay_ms.load(Ordering::SeqCst);
    if delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    if parts.method != Method::POST {
        return Ok(refusal(StatusCode::METHOD_NOT_ALLOWED, "invalid_request"));
    }
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return Ok(refusal(StatusCode::BAD_REQUEST, "unsupported_grant_type"));
    }
    // The client authenticates in the body or with HTTP Basic (RFC 6749
    // 2.3.1), never both.
    let basic = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(basic_credentials);
    let in_body = form
        .get("client_id")
        .cloned()
        .zip(form.get("client_secret").cloned());
    let client = match (basic, in_body) {
        (Some(basic), None) => Some(basic),
        (None, Some(in_body)) => Some(in_body),
        _ => None,
    };
    if client != Some((issuer.client_id.clone(), issuer.client_secret.clone())) {
        let mut refused = refusal(StatusCode::UNAUTHORIZED, "invalid_client");
        refused
            .headers_mut()
            .insert("www-authenticate", HeaderValue::from_static("Basic"));
        return Ok(refused);
    }
    let expires_in = issuer.expires_in_s.load(Ordering::SeqCst);
    let n = issuer.issued.fetch_add(1, Ordering::SeqCst);
    let token = opaque(&issuer.random, n);
    let expiry = Instant::now() + Duration::from_secs(expires_in);
    lock(&issuer.ledger.expiry).insert(token.clone(), expiry);
    let mut answer = json_response(
        StatusCode::OK,
        &json!({"token_type": "Bearer", "expires_in": expires_in, "access_token": token}),
    );
    answer
        .headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-store"));
    Ok(answer)
}

/// An OAuth2 error answer.
fn refusal(status: StatusCode, error: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"error": error, "error_description": format!("mock token endpoint: {error}")}),
    )
}

/// The client id and secret of an HTTP Basic `authorization` value, each
/// form-urlencoded as RFC 6749 2.3.1 has them.
fn basic_credentials(value: &str) -> Option<(String, String)> {
    let decoded = from_base64(value.strip_prefix("Basic ")?.trim())?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    let unescape = |s: &str| -> String {
        form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    Some((unescape(id), unescape(secret)))
}

/// The `n`-th token: 128 bits from the keyed hasher, in hex.
fn opaque(random: &std::collections::hash_map::RandomState, n: u64) -> String {
    let half = |salt: u64| {
        let mut h = random.build_hasher();
        h.write_u64(n);
        h.write_u64(salt);
        h.finish()
    };
    format!("mesh-tok-{:016x}{:016x}", half(1), half(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_decoded_and_unescaped() {
        // "app%3A1:s%26cret" → id "app:1", secret "s&cret".
        let value = format!("Basic {}", super::super::base64(b"app%3A1:s%26cret"));
        assert_eq!(
            basic_credentials(&value),
            Some(("app:1".to_string(), "s&cret".to_string()))
        );
        assert_eq!(basic_credentials("Bearer x"), None);
        assert_eq!(basic_credentials("Basic !!!"), None);
    }

    #[test]
    fn tokens_are_distinct_and_opaque() {
        let random = std::collections::hash_map::RandomState::new();
        let (a, b) = (opaque(&random, 0), opaque(&random, 1));
        assert_ne!(a, b);
        assert_eq!(a.len(), "mesh-tok-".len() + 32);
    }
}
