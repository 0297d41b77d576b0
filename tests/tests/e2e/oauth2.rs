//! Azure OpenAI with an Entra ID token, keyless: Envoy's `credential_injector`
//! with its `oauth2` credential (the cluster docs/credentials.md gives, read
//! from the page) fetches a token with the client credentials grant from a
//! mock token endpoint, the client secret from an SDS file in a watched
//! directory, and puts it on each call; the mock provider takes only live
//! tokens that endpoint issued. Tokens a few seconds long are refreshed
//! under load with no call failing; a token endpoint down, slow or refusing
//! the secret is the gateway's 503 in the caller's shape, never a 401, and
//! heals without a restart; the client secret and the tokens show up
//! nowhere Envoy or the filter writes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, Envoy, EnvoyBuilder, HttpResponse, MockConfig,
    MockUpstream, TokenEndpoint,
};
use serde_json::json;

use crate::support;
use crate::support::load::{tally, Loops};
use crate::support::secrets::{
    documented_options, documented_yaml, never_saw, write_secret, Outputs,
};

const SECTION: &str = "### Azure OpenAI with an Entra ID token";
/// The Entra tenant and the application the gateway is registered as.
const TENANT: &str = "00000000-0000-4000-8000-00000000e2e0";
const CLIENT_ID: &str = "llm-gateway-app-0001";
/// The client secret, as Entra writes them: it must show up nowhere.
const CLIENT_SECRET: &str = "Qx8~PLANTED.entra-secret_4kZr";
const WRONG_SECRET: &str = "Qx8~WRONG.entra-secret_0000";
/// The SDS secret (and file) the page names.
const SECRET_NAME: &str = "entra-client-secret";
const CLUSTER: &str = "azure-openai";
const DEPLOYMENT: &str = "gpt-4o";
const API_VERSION: &str = "2024-10-21";
/// Envoy's own counters of its OAuth2 token provider (no cluster in the
/// name: an upstream filter's stats have no prefix).
const FETCHED: &str = "credential_injector.oauth2.token_fetched";
const FAILED_ON_STATUS: &str = "credential_injector.oauth2.token_fetch_failed_on_bad_response_code";
const DEADLINE: Duration = Duration::from_secs(20);

/// The page's Azure cluster with the mock provider behind it, the page's
/// `entra` cluster at the mock token endpoint.
struct Azure {
    provider: MockUpstream,
    entra: TokenEndpoint,
    keys: tempfile::TempDir,
    outputs: Outputs,
    /// The token endpoint's timeout on the page.
    timeout: Duration,
    envoy: Envoy,
}

impl Azure {
    /// The gateway with `secret` in the client secret's SDS file (`None`:
    /// a file that is not YAML), tokens living `expires_in_s`, and the
    /// endpoint set up by `prepare` before Envoy starts.
    fn start(
        secret: Option<&str>,
        expires_in_s: u64,
        prepare: impl FnOnce(&TokenEndpoint),
    ) -> Self {
        let keys = tempfile::tempdir().unwrap();
        match secret {
            Some(secret) => write_secret(keys.path(), SECRET_NAME, Some(secret)),
            None => std::fs::write(
                keys.path().join(format!("{SECRET_NAME}.yaml")),
                "resources: [not yaml\n",
            )
            .unwrap(),
        }
        let options = documented_options(SECTION, keys.path());
        assert!(
            options.contains("envoy.http.injected_credentials.oauth2")
                && options.contains("cluster: entra")
                && options.contains(&format!("name: {SECRET_NAME}")),
            "{options}"
        );
        let options = options
            .replace("<app id>", CLIENT_ID)
            .replace("<tenant>", TENANT);
        let entra = TokenEndpoint::start(CLIENT_ID, CLIENT_SECRET, expires_in_s);
        prepare(&entra);
        let provider = MockUpstream::start(MockConfig::named(CLUSTER));
        provider.take_tokens_of(Some(&entra));
        let outputs = Outputs::start(keys.path());
        let config = outputs.config(json!({
            "llm_paths": ["/openai/deployments/*/chat/completions"],
            "routing": {"models": {DEPLOYMENT: [{"cluster": CLUSTER}]}},
            "credentials": {"clusters": {CLUSTER: {}}},
        }));
        let envoy = EnvoyBuilder::new()
            .node()
            .plugin_config(config)
            .upstream_pool(CLUSTER, &[provider.port()], &options)
            .upstream("entra", entra.port())
            .header_route("x-llm-cluster")
            // The token provider's own logging, where a leak would show.
            .component_log_level("credential_injector:debug");
        let envoy = outputs
            .envoy(envoy)
            .start()
            .expect("envoy with the Entra token injector");
        Self {
            provider,
            entra,
            keys,
            outputs,
            timeout: documented_timeout(),
            envoy,
        }
    }

    /// One chat call as Azure's API takes it, with `headers`.
    async fn call(&self, headers: &[(&str, &str)]) -> HttpResponse {
        let path =
            format!("/openai/deployments/{DEPLOYMENT}/chat/completions?api-version={API_VERSION}");
        post_json(
            &self.envoy.url(&path),
            &chat_body(DEPLOYMENT, "hello azure"),
            headers,
        )
        .await
        .unwrap()
    }

    /// Calls until one is answered 200 (within [`DEADLINE`]); how long that
    /// took.
    async fn until_served(&self) -> Duration {
        let started = Instant::now();
        loop {
            let r = self.call(&[]).await;
            if r.status == 200 {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < DEADLINE,
                "no call was served: {} {}; {} token requests\n{}",
                r.status,
                r.text(),
                self.entra.requests(),
                self.envoy.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (without blocking the test's other tasks) until Envoy's stat
    /// `name` reaches `min`.
    async fn stat_reaches(&self, name: &str, min: u64) {
        let deadline = Instant::now() + DEADLINE;
        while self.envoy.stat(name) < min {
            assert!(Instant::now() < deadline, "{name} never reached {min}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Neither client secret planted nor any token the endpoint issued is
    /// anywhere Envoy or the filter writes.
    async fn assert_no_secret_anywhere(&self) {
        let mut secrets = self.entra.ledger().tokens();
        assert!(!secrets.is_empty(), "tokens were issued");
        secrets.extend([CLIENT_SECRET.to_string(), WRONG_SECRET.to_string()]);
        let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
        self.outputs.assert_none_of(&self.envoy, &secrets).await;
    }
}

/// The token endpoint's timeout the page gives.
fn documented_timeout() -> Duration {
    documented_yaml(SECTION, 0)
        .lines()
        .find_map(|l| l.trim().strip_prefix("timeout: "))
        .and_then(|t| t.strip_suffix('s'))
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs_f64)
        .expect("the page's token endpoint timeout")
}

/// The gateway's refusal as the OpenAI shape has it: 503, the credential's
/// code, never a 401.
fn assert_gateways_503(r: &HttpResponse) {
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json();
    assert_eq!(
        body["error"]["code"], "llm_filter_credential_unavailable",
        "{body}"
    );
    assert_eq!(body["error"]["type"], "service_unavailable", "{body}");
}

/// The token `authorization: Bearer` of a call carried.
fn bearer(r: &llm_filter_e2e::RecordedRequest) -> Option<String> {
    r.header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
}

#[tokio::test]
async fn sdk_calls_with_no_key_or_a_stray_one_carry_the_mesh_token() {
    if skip_without_envoy("sdk_calls_with_no_key_or_a_stray_one_carry_the_mesh_token") {
        return;
    }
    let az = Azure::start(Some(CLIENT_SECRET), 60, |_| {});
    // Envoy is ready before its first token: that fetch runs before the
    // secret file is read, the next one a retry interval later.
    let first = az.until_served().await;
    eprintln!("oauth2: the first call served {first:?} after Envoy was ready");
    // Azure's own client of the OpenAI SDK, keyless and with a stray key
    // (it sends it as `api-key`).
    for key in ["", "azure-STRAY-app-key"] {
        let out = support::sdk::run(
            support::sdk::OPENAI,
            "chat",
            &az.envoy.url(""),
            &[
                "--api-key",
                key,
                "--azure-api-version",
                API_VERSION,
                "--model",
                DEPLOYMENT,
            ],
        )
        .await;
        assert!(
            out["content"]
                .as_str()
                .is_some_and(|c| c.contains(&format!("[{CLUSTER}]"))),
            "{out}"
        );
    }
    // Every place a client can put a key, an Entra token of its own among
    // them.
    let strays = [
        ("authorization", "Bearer STRAY-entra-token"),
        ("api-key", "STRAY-2"),
        ("x-api-key", "STRAY-3"),
    ];
    let r = az.call(&strays).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = az.provider.requests();
    // The readiness call, two SDK calls, one raw (and any retry Envoy made
    // of one on a busy machine).
    assert!(seen.len() >= 4, "{}", seen.len());
    let ledger = az.entra.ledger();
    for r in &seen {
        assert_eq!(
            r.path,
            format!("/openai/deployments/{DEPLOYMENT}/chat/completions")
        );
        assert_eq!(
            r.query.as_deref(),
            Some(format!("api-version={API_VERSION}").as_str())
        );
        let token = bearer(r).expect("a bearer token");
        assert!(
            ledger.valid_at(&token, r.received_at),
            "a live token of the endpoint"
        );
        assert_eq!(r.header("api-key"), None);
    }
    never_saw(&az.provider, "STRAY");
    assert!(az.entra.issued() >= 1);
    az.assert_no_secret_anywhere().await;
}

#[tokio::test]
async fn tokens_refreshed_under_load_fail_no_call() {
    if skip_without_envoy("tokens_refreshed_under_load_fail_no_call") {
        return;
    }
    const LIFE_S: u64 = 3;
    const RUN: Duration = Duration::from_secs(9);
    let az = Arc::new(Azure::start(Some(CLIENT_SECRET), LIFE_S, |_| {}));
    az.until_served().await;
    az.provider.clear();
    let requests_before = az.entra.requests();
    let caller = az.clone();
    // One loop with no key, one with a stray key of its own.
    let loops = Loops::start(2, move |i| {
        let az = caller.clone();
        async move {
            let stray = [("api-key", "STRAY-under-load")];
            let r = az.call(if i == 0 { &[] } else { &stray }).await;
            (r.status, r.text())
        }
    });
    tokio::time::sleep(RUN).await;
    let answers = loops.stop().await;
    let ok = tally(&answers, |(status, _)| *status == 200).0;
    let failures: Vec<_> = answers
        .into_iter()
        .map(|(_, answer)| answer)
        .filter(|(status, _)| *status != 200)
        .collect();
    let fetched = az.envoy.stat(FETCHED);
    let seen = az.provider.requests();
    let ledger = az.entra.ledger();
    let mut tokens: Vec<String> = seen.iter().filter_map(bearer).collect();
    tokens.sort();
    tokens.dedup();
    // How close to its expiry a token was used, as the provider saw it.
    let least_life_left = seen
        .iter()
        .map(|r| {
            let expiry = ledger.expiry(&bearer(r).unwrap()).expect("an issued token");
            expiry.saturating_duration_since(r.received_at)
        })
        .min()
        .unwrap();
    eprintln!(
        "oauth2 refresh: {ok} calls ok, {} failed over {RUN:?}; {} tokens of {LIFE_S} s used, \
         {} token requests ({FETCHED} {fetched}); least life left at use {least_life_left:?}",
        failures.len(),
        tokens.len(),
        az.entra.requests() - requests_before,
    );
    assert!(
        failures.is_empty(),
        "calls failed: {:?}",
        &failures[..failures.len().min(3)]
    );
    assert!(
        tokens.len() >= 3,
        "several refreshes: {} tokens",
        tokens.len()
    );
    assert!(
        fetched >= tokens.len() as u64,
        "Envoy counted its fetches: {fetched}"
    );
    assert!(
        seen.iter()
            .all(|r| ledger.valid_at(&bearer(r).unwrap(), r.received_at)),
        "no token was used expired"
    );
    assert!(ok > 50, "the loops ran: {ok}");
    never_saw(&az.provider, "STRAY");
}

#[tokio::test]
async fn a_token_endpoint_down_at_start_is_a_clear_503_until_it_comes_up() {
    if skip_without_envoy("a_token_endpoint_down_at_start_is_a_clear_503_until_it_comes_up") {
        return;
    }
    let az = Azure::start(Some(CLIENT_SECRET), 60, |e| e.set_down(true));
    az.stat_reaches(FAILED_ON_STATUS, 1).await;
    // Azure's SDK gets the gateway's error, no 401 of its key's.
    let out = support::sdk::run(
        support::sdk::OPENAI,
        "chat_error",
        &az.envoy.url(""),
        &[
            "--api-key",
            "",
            "--azure-api-version",
            API_VERSION,
            "--model",
            DEPLOYMENT,
        ],
    )
    .await;
    assert_eq!(out["error_class"], "InternalServerError", "{out}");
    assert_eq!(out["status"], 503, "{out}");
    assert_eq!(out["code"], "llm_filter_credential_unavailable", "{out}");
    assert!(
        out["message"].as_str().unwrap().contains("credential"),
        "{out}"
    );
    assert_gateways_503(&az.call(&[("api-key", "sk-app-own")]).await);
    assert_eq!(
        az.provider.request_count(),
        0,
        "no call left without the token"
    );
    let count = az.envoy.metric(
        "llm_filter_credential_unavailable_total",
        &[("llm_cluster", CLUSTER)],
    );
    assert!(count >= 2.0, "counted: {count}");
    // The endpoint comes up: Envoy's next try gets a token, no restart.
    az.entra.set_down(false);
    let healed = az.until_served().await;
    eprintln!("oauth2 endpoint up again: calls served after {healed:?}");
    az.assert_no_secret_anywhere().await;
}

#[tokio::test]
async fn a_slow_token_endpoint_is_the_same_clear_503_without_a_hang() {
    if skip_without_envoy("a_slow_token_endpoint_is_the_same_clear_503_without_a_hang") {
        return;
    }
    // The page's timeout, passed by a second.
    let late = documented_timeout() + Duration::from_secs(1);
    let az = Azure::start(Some(CLIENT_SECRET), 60, |e| {
        e.set_delay_ms(late.as_millis() as u64)
    });
    // Envoy gave up on the token request at its timeout.
    az.stat_reaches(FAILED_ON_STATUS, 1).await;
    let mut slow = Duration::ZERO;
    for _ in 0..5 {
        let r = az.call(&[("x-request-timeout-ms", "2000")]).await;
        assert_gateways_503(&r);
        slow = slow.max(r.elapsed);
    }
    assert!(slow < Duration::from_secs(1), "answered at once: {slow:?}");
    assert_eq!(az.provider.request_count(), 0);
    az.entra.set_delay_ms(0);
    let healed = az.until_served().await;
    eprintln!(
        "oauth2 slow endpoint ({late:?} > timeout {:?}): calls refused in at most {slow:?}; \
         served {healed:?} after it sped up",
        az.timeout
    );
}

#[tokio::test]
async fn a_bad_client_secret_is_a_clear_503_until_a_good_one_is_moved_in() {
    if skip_without_envoy("a_bad_client_secret_is_a_clear_503_until_a_good_one_is_moved_in") {
        return;
    }
    // A secret file that is not YAML: Envoy starts without the secret and
    // asks the endpoint nothing.
    let az = Azure::start(None, 60, |_| {});
    az.stat_reaches(
        "credential_injector.oauth2.token_fetch_failed_on_client_secret",
        1,
    )
    .await;
    assert_gateways_503(&az.call(&[]).await);
    assert_eq!(az.entra.requests(), 0);
    // A wrong secret moved in: the endpoint refuses it (401 invalid_client).
    write_secret(az.keys.path(), SECRET_NAME, Some(WRONG_SECRET));
    let deadline = Instant::now() + DEADLINE;
    while az.entra.requests() == 0 {
        assert!(
            Instant::now() < deadline,
            "the wrong secret was never tried"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    az.stat_reaches(FAILED_ON_STATUS, 1).await;
    assert_eq!(az.entra.issued(), 0);
    assert_gateways_503(&az.call(&[]).await);
    // The right one: served without a restart.
    assert_eq!(
        az.provider.request_count(),
        0,
        "no call went out without a token"
    );
    write_secret(az.keys.path(), SECRET_NAME, Some(CLIENT_SECRET));
    let healed = az.until_served().await;
    eprintln!("oauth2 client secret fixed: calls served after {healed:?}");
    let ledger = az.entra.ledger();
    for r in az.provider.requests() {
        assert!(ledger.valid_at(&bearer(&r).unwrap(), r.received_at));
    }
    az.assert_no_secret_anywhere().await;
}

/// How a call of a run was answered: served, the gateway's 503, or
/// anything else (with its body).
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Served,
    GatewaysNoCredential,
    Other(u16, String),
}

impl Answer {
    fn of(r: &HttpResponse) -> Self {
        match r.status {
            200 => Self::Served,
            503 if r.json()["error"]["code"] == "llm_filter_credential_unavailable" => {
                Self::GatewaysNoCredential
            }
            s => Self::Other(s, r.text()),
        }
    }
}

#[tokio::test]
async fn a_token_endpoint_lost_mid_run_is_the_gateways_503_never_a_401() {
    if skip_without_envoy("a_token_endpoint_lost_mid_run_is_the_gateways_503_never_a_401") {
        return;
    }
    const LIFE_S: u64 = 3;
    let az = Arc::new(Azure::start(Some(CLIENT_SECRET), LIFE_S, |_| {}));
    for fault in ["down", "slow"] {
        az.until_served().await;
        az.provider.clear();
        let caller = az.clone();
        let loops = Loops::start(2, move |_| {
            let az = caller.clone();
            async move { Answer::of(&az.call(&[]).await) }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        match fault {
            "down" => az.entra.set_down(true),
            _ => az
                .entra
                .set_delay_ms((az.timeout + Duration::from_secs(1)).as_millis() as u64),
        }
        // Past the token's life and Envoy's tries.
        tokio::time::sleep(Duration::from_secs(LIFE_S) + az.timeout + Duration::from_secs(2)).await;
        az.entra.set_down(false);
        az.entra.set_delay_ms(0);
        let healed_at = Instant::now();
        // Until a call is served again, and a second after.
        let deadline = healed_at + DEADLINE;
        let served_again = loop {
            let first = loops
                .answers()
                .iter()
                .find(|(at, a)| *at > healed_at && *a == Answer::Served)
                .map(|(at, _)| *at);
            if let Some(at) = first {
                break at;
            }
            assert!(Instant::now() < deadline, "{fault}: never served again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let answers = loops.stop().await;
        let count = |want: &Answer| answers.iter().filter(|(_, a)| a == want).count();
        let other: Vec<_> = answers
            .iter()
            .filter(|(_, a)| matches!(a, Answer::Other(..)))
            .collect();
        let ledger = az.entra.ledger();
        let seen = az.provider.requests();
        let expired: Vec<_> = seen
            .iter()
            .filter(|r| !ledger.valid_at(&bearer(r).unwrap_or_default(), r.received_at))
            .collect();
        let window = match (expired.first(), expired.last()) {
            (Some(a), Some(b)) => b.received_at - a.received_at,
            _ => Duration::ZERO,
        };
        eprintln!(
            "oauth2 endpoint {fault} mid-run: {} calls served, {} the gateway's 503, {} other; \
             {} reached the provider with an expired token, over {window:?}; served again \
             {:?} after the endpoint healed",
            count(&Answer::Served),
            count(&Answer::GatewaysNoCredential),
            other.len(),
            expired.len(),
            served_again - healed_at,
        );
        assert!(
            other.is_empty(),
            "{fault}: {:?}",
            &other[..other.len().min(3)]
        );
        assert!(
            count(&Answer::GatewaysNoCredential) > 0,
            "{fault}: the token ran out"
        );
        // Once served again, every call is (the breaker took no pressure
        // from the outage): a moment's grace for Envoy's other worker.
        let refused_after: Vec<_> = answers
            .iter()
            .filter(|(at, a)| {
                *at > served_again + Duration::from_millis(100) && *a != Answer::Served
            })
            .collect();
        assert!(refused_after.is_empty(), "{fault}: {refused_after:?}");
    }
}
