//! The shipped `envoy/provider.yaml`, rendered by `scripts/provider-config.sh`
//! as `make run PROVIDER_HOST=…` renders it, in front of a TLS upstream made
//! at test time: Envoy sends the client's call, and so its `Authorization`,
//! only to a server whose certificate chains to the trusted CAs and is issued
//! for the provider's name. A refused handshake never reaches the backend.

use std::path::Path;

use llm_filter_e2e::tls::{self, ServerCert, TestCa, TlsFront};
use llm_filter_e2e::{
    chat_body, post_json, provider_bootstrap, skip_without_envoy, Envoy, EnvoyBuilder,
    HttpResponse, MockConfig, MockUpstream,
};

const HOST: &str = "localhost";
const KEY: &str = "Bearer sk-e2e-provider-secret";

/// The provider bootstrap for `HOST` at the front's port, checked against
/// `ca` (`None`: the system bundle), on free ports instead of the demo's.
fn provider_envoy(front: &TlsFront, ca: Option<&Path>) -> Envoy {
    let yaml = provider_bootstrap(HOST, front.port(), ca).expect("render provider.yaml");
    start_provider(yaml)
}

fn start_provider(yaml: String) -> Envoy {
    for port in ["port_value: 10000", "port_value: 9901"] {
        assert!(yaml.contains(port), "provider.yaml has no `{port}`");
    }
    let yaml = yaml
        .replace("port_value: 10000", "port_value: 0")
        .replace("port_value: 9901", "port_value: 0");
    EnvoyBuilder::new()
        .bootstrap(yaml)
        .start()
        .expect("envoy with envoy/provider.yaml")
}

async fn call(envoy: &Envoy) -> HttpResponse {
    post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o-mini", "hello"),
        &[("authorization", KEY)],
    )
    .await
    .expect("call")
}

/// A TLS front with `cert` before a fresh mock.
fn upstream(cert: &ServerCert) -> (MockUpstream, TlsFront) {
    let mock = MockUpstream::start(MockConfig::named("provider"));
    let front = TlsFront::start(cert, mock.addr()).expect("tls front");
    (mock, front)
}

/// The call was refused before any byte of it left Envoy.
fn assert_refused(
    r: &HttpResponse,
    envoy: &Envoy,
    mock: &MockUpstream,
    front: &TlsFront,
    stat: &str,
) {
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        mock.request_count(),
        0,
        "the backend got {:?}",
        mock.requests()
    );
    assert_eq!(front.handshakes(), 0, "a handshake completed");
    assert!(front.failed_handshakes() >= 1, "Envoy never tried");
    let refused = envoy.stat(&format!("cluster.provider.ssl.{stat}"));
    assert!(refused >= 1, "cluster.provider.ssl.{stat} = {refused}");
}

#[tokio::test]
async fn a_self_signed_provider_never_gets_the_key() {
    if skip_without_envoy("a_self_signed_provider_never_gets_the_key") {
        return;
    }
    // The right name, but no CA of the system's vouches for it.
    let cert = tls::self_signed(&[HOST]).expect("certificate");
    let (mock, front) = upstream(&cert);
    let envoy = provider_envoy(&front, None);
    let r = call(&envoy).await;
    assert_refused(&r, &envoy, &mock, &front, "fail_verify_error");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    if skip_without_envoy("a_certificate_for_another_name_is_refused") {
        return;
    }
    // A CA Envoy trusts, but a certificate issued for someone else.
    let dir = tempfile::tempdir().expect("dir");
    let ca = TestCa::new("llm-filter e2e CA").expect("ca");
    let cert = ca.issue(&["api.example.com"]).expect("certificate");
    let (mock, front) = upstream(&cert);
    let envoy = provider_envoy(&front, Some(&ca.write(dir.path()).expect("ca file")));
    let r = call(&envoy).await;
    assert_refused(&r, &envoy, &mock, &front, "fail_verify_san");
}

#[tokio::test]
async fn the_provider_it_trusts_gets_the_call() {
    if skip_without_envoy("the_provider_it_trusts_gets_the_call") {
        return;
    }
    // What the two refusals are measured against: the same bootstrap and
    // upstream, with a certificate for the name from a CA Envoy trusts.
    let dir = tempfile::tempdir().expect("dir");
    let ca = TestCa::new("llm-filter e2e CA").expect("ca");
    let cert = ca.issue(&[HOST]).expect("certificate");
    let (mock, front) = upstream(&cert);
    let envoy = provider_envoy(&front, Some(&ca.write(dir.path()).expect("ca file")));
    let r = call(&envoy).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(front.handshakes() >= 1);
    let seen = mock.last_request().expect("the provider got the call");
    assert_eq!(seen.header("authorization"), Some(KEY));
    assert_eq!(seen.header("host"), Some(HOST));
    assert!(r.header("x-trace-id").is_some(), "the filter ran");
}

#[tokio::test]
async fn a_wildcard_certificate_covers_the_provider() {
    if skip_without_envoy("a_wildcard_certificate_covers_the_provider") {
        return;
    }
    // Providers such as Azure OpenAI serve `<resource>.openai.azure.com`
    // under a `*.openai.azure.com` certificate: the SAN check follows DNS
    // wildcard rules. Only the endpoint's address is pinned to loopback; the
    // SNI and the name checked stay the provider's.
    let dir = tempfile::tempdir().expect("dir");
    let ca = TestCa::new("llm-filter e2e CA").expect("ca");
    let cert = ca.issue(&["*.provider.test"]).expect("certificate");
    let ca_file = ca.write(dir.path()).expect("ca file");
    let render = |host: &str, front: &TlsFront| {
        let yaml = provider_bootstrap(host, front.port(), Some(&ca_file)).expect("render");
        let endpoint = format!("address: {host}, port_value");
        assert!(yaml.contains(&endpoint), "no endpoint {endpoint}");
        yaml.replace(&endpoint, "address: 127.0.0.1, port_value")
    };
    let (mock, front) = upstream(&cert);
    let envoy = start_provider(render("eu.provider.test", &front));
    let r = call(&envoy).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        mock.last_request()
            .and_then(|q| q.header("authorization").map(str::to_string)),
        Some(KEY.to_string())
    );
    // The wildcard covers one label only.
    let (mock, front) = upstream(&cert);
    let envoy = start_provider(render("a.eu.provider.test", &front));
    let r = call(&envoy).await;
    assert_refused(&r, &envoy, &mock, &front, "fail_verify_san");
}
