//! Who the caller is, through the real Envoy: virtual keys the
//! configuration knows only by their digests (sent by the official SDKs,
//! never reaching the upstream, refused in each API's shape when unknown or
//! missing, two keys of a tenant sharing its limits and its cache, two
//! tenants never), a JWT claim Envoy's own `jwt_authn` verified (a local
//! JWKS, tokens signed here), and planted keys and tokens found in none of
//! Envoy's log, `/stats`, `/config_dump`, the access log, the spans or the
//! upstream's requests.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use llm_filter_e2e::{
    chat_body, messages_body, post_json, skip_without_envoy, Envoy, EnvoyBuilder, HttpResponse,
    MockConfig, MockUpstream,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::support::cache::{cacheable, x_cache};
use crate::support::otlp::Receiver;
use crate::support::sdk::{run, ANTHROPIC, GENAI, OPENAI};

const CHAT: &str = "/v1/chat/completions";
const GEMINI: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
/// Team a's two keys and team b's one.
const KEY_A1: &str = "vk-e2e-team-a-1f9c2d7e0b";
const KEY_A2: &str = "vk-e2e-team-a-2a6b41c8d3";
const KEY_B: &str = "vk-e2e-team-b-3e5d90f7a1";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `printf %s "$KEY" | sha256sum` prints.
fn sha256sum(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// The `tenant` section of the three keys, by digest.
fn virtual_keys() -> Value {
    json!({"from": "virtual_key", "keys": {
        "team-a": format!("{} {}", sha256sum(KEY_A1), sha256sum(KEY_A2)),
        "team-b": sha256sum(KEY_B)
    }})
}

fn start(mock: &MockUpstream, config: Value) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config(config)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

fn refused(e: &Envoy, reason: &str, api: &str) -> f64 {
    e.metric(
        "llm_filter_identity_refused_total",
        &[("reason", reason), ("api", api)],
    )
}

/// No request the upstream received carries `secret` anywhere.
fn upstream_never_saw(mock: &MockUpstream, secret: &str) {
    for r in mock.requests() {
        let all = format!(
            "{} {:?} {}",
            r.path,
            r.headers,
            String::from_utf8_lossy(&r.body)
        );
        assert!(!all.contains(secret), "the upstream saw {secret}: {all}");
    }
}

#[tokio::test]
async fn a_virtual_key_names_its_tenant_and_never_reaches_the_upstream() {
    if skip_without_envoy("a_virtual_key_names_its_tenant_and_never_reaches_the_upstream") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("vk"));
    let e = start(
        &mock,
        json!({"tenant": virtual_keys(),
               "limits": {"rules": [{"name": "team", "by": ["tenant"], "models": ["gpt-4o"],
                                     "requests_per_minute": 3}]}}),
    );
    let url = e.url(CHAT);
    let bearer = |k: &str| format!("Bearer {k}");
    let body = cacheable("who am I");
    // Team a's first key: a miss, sent on without the key.
    let r = post_json(&url, &body, &[("authorization", &bearer(KEY_A1))])
        .await
        .unwrap();
    assert_eq!((r.status, x_cache(&r)), (200, "MISS"), "{}", r.text());
    let seen = mock.requests().pop().unwrap();
    assert_eq!(seen.header("authorization"), None, "the key is taken off");
    assert!(seen.header("traceparent").is_some(), "the filter ran");
    // Team a's other key reads team a's entry.
    let r = post_json(&url, &body, &[("authorization", &bearer(KEY_A2))])
        .await
        .unwrap();
    assert_eq!((r.status, x_cache(&r)), (200, "HIT"));
    // Team b never does, though the call is the same.
    let r = post_json(&url, &body, &[("authorization", &bearer(KEY_B))])
        .await
        .unwrap();
    assert_eq!((r.status, x_cache(&r)), (200, "MISS"));
    assert_eq!(mock.request_count(), 2);
    // Team a's keys share one count of 3: the hit was the second.
    let other = chat_body("gpt-4o", "count me");
    let r = post_json(&url, &other, &[("api-key", KEY_A2)])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post_json(&url, &other, &[("authorization", &bearer(KEY_A1))])
        .await
        .unwrap();
    assert_eq!(r.status, 429, "team a's fourth call: {}", r.text());
    let r = post_json(&url, &other, &[("authorization", &bearer(KEY_B))])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "team b has its own count");
    // Anthropic's header, and Gemini's query: taken off too.
    let r = post_json(
        &e.url("/v1/messages"),
        &messages_body("claude-sonnet-4", "hi"),
        &[("x-api-key", KEY_B), ("anthropic-version", "2023-06-01")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.requests().pop().unwrap().header("x-api-key"), None);
    let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let r = post_json(&e.url(&format!("{GEMINI}?key={KEY_B}")), &gemini, &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.requests().pop().unwrap().path, GEMINI);
    for k in [KEY_A1, KEY_A2, KEY_B] {
        upstream_never_saw(&mock, k);
    }
}

/// A refused call: its path, body and headers, the reason, the `api` label.
type Refusal<'a> = (&'a str, Value, Vec<(&'a str, &'a str)>, &'a str, &'a str);

#[tokio::test]
async fn an_unknown_or_missing_key_is_a_401_in_each_apis_shape_and_spends_nothing() {
    if skip_without_envoy(
        "an_unknown_or_missing_key_is_a_401_in_each_apis_shape_and_spends_nothing",
    ) {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("vk-refused"));
    let e = start(
        &mock,
        json!({"tenant": virtual_keys(),
               "limits": {"rules": [{"name": "team", "by": ["tenant"], "requests_per_minute": 1}]}}),
    );
    let chat = chat_body("gpt-4o", "hi");
    let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let cases: [Refusal<'_>; 5] = [
        (
            CHAT,
            chat.clone(),
            vec![("authorization", "Bearer sk-provider-key")],
            "unknown",
            "chat",
        ),
        (CHAT, chat.clone(), vec![], "missing", "chat"),
        (
            "/v1/messages",
            messages_body("claude-sonnet-4", "hi"),
            vec![
                ("x-api-key", "sk-ant-unknown"),
                ("anthropic-version", "2023-06-01"),
            ],
            "unknown",
            "messages",
        ),
        (
            GEMINI,
            gemini.clone(),
            vec![("x-goog-api-key", "AIzaUnknown")],
            "unknown",
            "gemini",
        ),
        (GEMINI, gemini, vec![], "missing", "gemini"),
    ];
    for (path, body, headers, reason, api) in &cases {
        let r: HttpResponse = post_json(&e.url(path), body, headers).await.unwrap();
        assert_eq!(r.status, 401, "{path} {reason}: {}", r.text());
        let v = r.json();
        match *api {
            "chat" => {
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
                assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
            }
            "messages" => {
                assert_eq!(v["type"], "error");
                assert_eq!(v["error"]["type"], "authentication_error", "{v}");
            }
            _ => {
                assert_eq!(v["error"]["code"], 401, "{v}");
                assert_eq!(v["error"]["status"], "UNAUTHENTICATED", "{v}");
            }
        }
        for (_, sent) in headers {
            assert!(!r.text().contains(sent), "the refusal repeats {sent}");
        }
    }
    assert_eq!(mock.request_count(), 0, "nothing went upstream");
    assert_eq!(refused(&e, "unknown", "chat"), 1.0);
    assert_eq!(refused(&e, "missing", "chat"), 1.0);
    assert_eq!(refused(&e, "unknown", "messages"), 1.0);
    assert_eq!(refused(&e, "unknown", "gemini"), 1.0);
    assert_eq!(refused(&e, "missing", "gemini"), 1.0);
    // No limit was counted: team a's one call of the minute is still there.
    let r = post_json(
        &e.url(CHAT),
        &chat,
        &[("authorization", &format!("Bearer {KEY_A1}"))],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn the_official_sdks_call_with_a_virtual_key_and_raise_on_an_unknown_one() {
    if skip_without_envoy("the_official_sdks_call_with_a_virtual_key_and_raise_on_an_unknown_one") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("vk-sdk"));
    let e = start(&mock, json!({"tenant": virtual_keys()}));
    // OpenAI: a Bearer key.
    let out = run(OPENAI, "chat", &e.url("/v1"), &["--api-key", KEY_A1]).await;
    assert!(
        out["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with("echo:"),
        "{out}"
    );
    let out = run(
        OPENAI,
        "chat_error",
        &e.url("/v1"),
        &["--api-key", "sk-not-issued"],
    )
    .await;
    assert_eq!(out["error_class"], "AuthenticationError", "{out}");
    assert_eq!(
        (out["status"].as_u64(), out["code"].as_str()),
        (Some(401), Some("invalid_api_key"))
    );
    // Anthropic: `x-api-key`.
    let out = run(ANTHROPIC, "messages", &e.url(""), &["--api-key", KEY_A2]).await;
    assert!(out["error_class"].is_null(), "{out}");
    let out = run(
        ANTHROPIC,
        "messages_error",
        &e.url(""),
        &["--api-key", "sk-ant-not-issued"],
    )
    .await;
    assert_eq!(out["error_class"], "AuthenticationError", "{out}");
    assert_eq!(out["type"], "authentication_error", "{out}");
    // Gemini: `x-goog-api-key`.
    let out = run(GENAI, "generate", &e.url(""), &["--api-key", KEY_B]).await;
    assert!(out["error_class"].is_null(), "{out}");
    let out = run(
        GENAI,
        "generate_error",
        &e.url(""),
        &["--api-key", "AIza-not-issued"],
    )
    .await;
    assert_eq!(out["error_class"], "ClientError", "{out}");
    assert_eq!(
        (out["code"].as_u64(), out["status_name"].as_str()),
        (Some(401), Some("UNAUTHENTICATED"))
    );
    assert_eq!(
        mock.request_count(),
        3,
        "only the known keys' calls went on"
    );
    for k in [KEY_A1, KEY_A2, KEY_B] {
        upstream_never_saw(&mock, k);
    }
}

// ------------------------------------------------------------------- JWT

const ISSUER: &str = "https://auth.e2e.example";
const AUDIENCE: &str = "llm-gateway";

fn b64url(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| block.iter().map(|k| k ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// An HS256 token of `claims` (issuer, audience and expiry added).
fn token(secret: &[u8], claims: Value) -> String {
    let mut claims = claims;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    claims["iss"] = json!(ISSUER);
    claims["aud"] = json!(AUDIENCE);
    claims["exp"] = json!(now + 3600);
    let head = b64url(br#"{"alg":"HS256","typ":"JWT","kid":"e2e"}"#);
    let body = b64url(claims.to_string().as_bytes());
    let signed = format!("{head}.{body}");
    let signature = b64url(&hmac_sha256(secret, signed.as_bytes()));
    format!("{signed}.{signature}")
}

/// Envoy's `jwt_authn` with the key inline, letting a call without a token
/// through (the filter then refuses it), writing the payload for the filter.
fn jwt_authn(secret: &[u8]) -> String {
    let jwks = json!({"keys": [{"kty": "oct", "alg": "HS256", "kid": "e2e", "k": b64url(secret)}]});
    format!(
        r#"- name: envoy.filters.http.jwt_authn
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
    providers:
      platform:
        issuer: {ISSUER}
        audiences: [{AUDIENCE}]
        local_jwks: {{inline_string: '{jwks}'}}
        forward: false
        payload_in_metadata: jwt_payload
    rules:
    - match: {{prefix: /}}
      requires:
        requires_any:
          requirements:
          - provider_name: platform
          - allow_missing: {{}}
"#
    )
}

fn with_jwt(mock: &MockUpstream, secret: &[u8], config: Value) -> EnvoyBuilder {
    EnvoyBuilder::new()
        .plugin_config(config)
        .filters_before(&jwt_authn(secret))
        .upstream("mock", mock.port())
}

#[tokio::test]
async fn a_jwt_claim_verified_by_envoy_is_the_tenant() {
    if skip_without_envoy("a_jwt_claim_verified_by_envoy_is_the_tenant") {
        return;
    }
    let secret = b"e2e-hs256-secret-0123456789abcdef";
    let mock = MockUpstream::start(MockConfig::named("jwt"));
    let e = with_jwt(
        &mock,
        secret,
        json!({"tenant": {"from": "jwt", "claim": "team"},
               "limits": {"rules": [{"name": "team", "by": ["tenant"], "requests_per_minute": 2}]}}),
    )
    .start()
    .expect("envoy with jwt_authn and the filter");
    let url = e.url(CHAT);
    let body = chat_body("gpt-4o", "hi");
    let call = |t: String| {
        let url = url.clone();
        let body = body.clone();
        async move {
            post_json(&url, &body, &[("authorization", &format!("Bearer {t}"))])
                .await
                .unwrap()
        }
    };
    // Two people of one team share its count; another team has its own.
    let alice = token(secret, json!({"sub": "alice", "team": "payments"}));
    let bob = token(secret, json!({"sub": "bob", "team": "payments"}));
    let carol = token(secret, json!({"sub": "carol", "team": "search"}));
    assert_eq!(call(alice.clone()).await.status, 200);
    assert_eq!(call(bob.clone()).await.status, 200);
    let r = call(alice.clone()).await;
    assert_eq!(r.status, 429, "payments' third call: {}", r.text());
    assert_eq!(call(carol).await.status, 200);
    // `forward: false`: the token never reached the upstream.
    assert_eq!(mock.request_count(), 3);
    upstream_never_saw(&mock, &alice);
    upstream_never_saw(&mock, &bob);
    // A verified token without the claim, and no token at all: refused by
    // the filter, in OpenAI's shape, never counted under a shared tenant.
    let r = call(token(secret, json!({"sub": "dave"}))).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = post_json(&url, &body, &[]).await.unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    assert_eq!(refused(&e, "missing", "chat"), 2.0);
    // A token Envoy cannot verify never reaches the filter.
    let forged = token(
        b"another-secret-entirely-0123456789",
        json!({"team": "payments"}),
    );
    let r = call(forged).await;
    assert_eq!(r.status, 401);
    assert_eq!(refused(&e, "missing", "chat"), 2.0, "jwt_authn refused it");
    assert_eq!(mock.request_count(), 3);
}

// -------------------------------------------------------- planted secrets

#[tokio::test]
async fn planted_keys_and_tokens_appear_in_no_output() {
    if skip_without_envoy("planted_keys_and_tokens_appear_in_no_output") {
        return;
    }
    let secret = b"e2e-planted-hs256-secret-5f0c9a1b";
    let receiver = Receiver::start(&[]);
    let mock = MockUpstream::start(MockConfig::named("planted"));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let common = json!({"otlp": {"cluster": "otel", "interval_ms": 200}});
    // One Envoy with virtual keys, one with JWT claims: the same outputs searched.
    let vk = EnvoyBuilder::new()
        .plugin_config(json!({"tenant": virtual_keys(), "tracing": common,
                              "access_log": {"enabled": true}}))
        .upstream("mock", mock.port())
        .upstream("otel", receiver.port)
        .access_log(
            &log,
            "%FILTER_STATE(wasm.llm_filter.call:PLAIN)% %REQ(:PATH)%",
        )
        .component_log_level("wasm:debug")
        .start()
        .expect("envoy with virtual keys");
    let jwt_log = dir.path().join("jwt-access.log");
    let jwt = with_jwt(
        &mock,
        secret,
        json!({"tenant": {"from": "jwt"}, "tracing": common, "access_log": {"enabled": true}}),
    )
    .upstream("otel", receiver.port)
    .access_log(
        &jwt_log,
        "%FILTER_STATE(wasm.llm_filter.call:PLAIN)% %REQ(:PATH)%",
    )
    .component_log_level("wasm:debug")
    .start()
    .expect("envoy with jwt_authn");
    let token = token(secret, json!({"sub": "planted-user"}));
    let body = chat_body("gpt-4o", "hi");
    let mut sent = 0;
    for key in [KEY_A1, KEY_B, "vk-planted-unknown-77d1e0"] {
        let r = post_json(
            &vk.url(CHAT),
            &body,
            &[("authorization", &format!("Bearer {key}"))],
        )
        .await
        .unwrap();
        assert!(r.status == 200 || r.status == 401, "{}", r.text());
        sent += 1;
    }
    let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let r = post_json(&vk.url(&format!("{GEMINI}?key={KEY_A2}")), &gemini, &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    sent += 1;
    let r = post_json(
        &jwt.url(CHAT),
        &body,
        &[("authorization", &format!("Bearer {token}"))],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // The record names the tenant (the claim), and the span does.
    let record_deadline = Instant::now() + Duration::from_secs(5);
    let (records, jwt_records) = loop {
        let a = std::fs::read_to_string(&log).unwrap_or_default();
        let b = std::fs::read_to_string(&jwt_log).unwrap_or_default();
        if (a.lines().count() >= sent && b.lines().count() >= 1) || Instant::now() > record_deadline
        {
            break (a, b);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(records.contains(r#""tenant":"team-a""#), "{records}");
    assert!(records.contains(r#""tenant":"team-b""#), "{records}");
    assert!(
        jwt_records.contains(r#""tenant":"planted-user""#),
        "{jwt_records}"
    );
    let trace = r.header("x-trace-id").unwrap().to_string();
    let span = receiver
        .span_of(&trace, Duration::from_secs(5))
        .await
        .expect("the jwt call's span");
    assert_eq!(
        span["attributes"]["llm_filter.tenant"], "planted-user",
        "{span}"
    );
    // Every output, searched for every planted secret; the digests alone
    // are in the configuration.
    let mut outputs = vec![
        ("access log", records),
        ("jwt access log", jwt_records),
        ("spans", serde_json::to_string(&receiver.exports()).unwrap()),
    ];
    for (name, e) in [("virtual keys", &vk), ("jwt", &jwt)] {
        outputs.push((name, e.log_contents()));
        for path in ["/stats", "/stats/prometheus", "/config_dump", "/clusters"] {
            let (status, text) = e.admin_get(path).unwrap();
            assert_eq!(status, 200, "{path}");
            outputs.push((path, text));
        }
    }
    let config_dump = &outputs
        .iter()
        .find(|(n, _)| *n == "/config_dump")
        .unwrap()
        .1;
    assert!(
        config_dump.contains(&sha256sum(KEY_A1)),
        "the digest is configured"
    );
    let upstream: String = mock
        .requests()
        .iter()
        .map(|r| {
            format!(
                "{} {:?} {}\n",
                r.path,
                r.headers,
                String::from_utf8_lossy(&r.body)
            )
        })
        .collect();
    outputs.push(("upstream", upstream));
    let signature = token.rsplit('.').next().unwrap().to_string();
    let planted = [
        KEY_A1,
        KEY_A2,
        KEY_B,
        "vk-planted-unknown-77d1e0",
        &token,
        &signature,
    ];
    let mut leaks = Vec::new();
    for (name, text) in &outputs {
        for p in planted {
            if text.contains(p) {
                leaks.push(format!("{name}: {p}"));
            }
        }
    }
    assert!(leaks.is_empty(), "{leaks:?}");
}
