//! Keyless apps: the provider keys live in Envoy's secret manager (SDS files
//! in a watched directory) and Envoy's `credential_injector` on each
//! provider's cluster puts them on; the filter strips whatever credential the
//! client sent, adds what the API needs beside a key, and tells a caller
//! plainly when the mesh's key is missing. The mock checks each key as its
//! provider does, the official SDKs are the clients, a rotation fails no
//! call, and no planted secret shows up anywhere the filter or Envoy writes.

use std::path::Path;
use std::time::{Duration, Instant};

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

use crate::support;
use crate::support::load::{tally, Loops};
use crate::support::secrets::{never_saw, write_secret, Outputs};

const OPENAI_KEY: &str = "sk-mesh-openai-PLANTED-1";
const ANTHROPIC_KEY: &str = "sk-ant-mesh-PLANTED-2";
const GEMINI_KEY: &str = "goog-mesh-PLANTED-3";
const DEADLINE: Duration = Duration::from_secs(20);

/// The cluster options that put secret `name` of `dir` on every call in
/// `header` (Envoy's own upstream filters; the filter holds no secret).
fn injector(dir: &Path, name: &str, header: &str) -> String {
    let d = dir.display();
    format!(
        r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {{http_protocol_options: {{}}}}
    http_filters:
    - name: envoy.filters.http.credential_injector
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector
        overwrite: true
        credential:
          name: envoy.http.injected_credentials.generic
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic
            header: {header}
            credential:
              name: {name}
              sds_config:
                path_config_source:
                  path: {d}/{name}.yaml
                  watched_directory: {{path: {d}}}
    - name: envoy.filters.http.upstream_codec
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec
"#
    )
}

/// Three providers, each a mock that takes only its mesh key, behind one
/// Envoy whose clusters put the keys on; `extra` adds to the filter's
/// config.
struct Mesh {
    openai: MockUpstream,
    anthropic: MockUpstream,
    gemini: MockUpstream,
    secrets: tempfile::TempDir,
    outputs: Outputs,
    envoy: Envoy,
}

impl Mesh {
    /// The mesh with every key but those of `missing` in its secret files,
    /// and the files of `unreadable` not YAML at all.
    fn start(missing: &[&str], unreadable: &[&str]) -> Self {
        let secrets = tempfile::tempdir().unwrap();
        let dir = secrets.path();
        // OpenAI's secret is the whole header value, scheme and all.
        let bearer = format!("Bearer {OPENAI_KEY}");
        for (name, value) in [
            ("openai", bearer.as_str()),
            ("anthropic", ANTHROPIC_KEY),
            ("gemini", GEMINI_KEY),
        ] {
            write_secret(dir, name, Some(value).filter(|_| !missing.contains(&name)));
            if unreadable.contains(&name) {
                std::fs::write(dir.join(format!("{name}.yaml")), "resources: [not yaml\n").unwrap();
            }
        }
        let openai = MockUpstream::start(MockConfig::named("openai"));
        let anthropic = MockUpstream::start(MockConfig::named("anthropic"));
        let gemini = MockUpstream::start(MockConfig::named("gemini"));
        openai.set_keys(Some(&[OPENAI_KEY]));
        anthropic.set_keys(Some(&[ANTHROPIC_KEY]));
        gemini.set_keys(Some(&[GEMINI_KEY]));
        let outputs = Outputs::start(dir);
        let config = outputs.config(json!({
            "routing": {"models": {
                "gpt-4o-mini": [{"cluster": "openai"}],
                "claude-sonnet-4-5": [{"cluster": "anthropic"}],
                "gemini-2.5-flash": [{"cluster": "gemini"}],
            }},
            "credentials": {"clusters": {"openai": {}, "anthropic": {}, "gemini": {}}},
        }));
        let envoy = EnvoyBuilder::new()
            .node()
            .plugin_config(config)
            .upstream_pool(
                "openai",
                &[openai.port()],
                &injector(dir, "openai", "authorization"),
            )
            .upstream_pool(
                "anthropic",
                &[anthropic.port()],
                &injector(dir, "anthropic", "x-api-key"),
            )
            .upstream_pool(
                "gemini",
                &[gemini.port()],
                &injector(dir, "gemini", "x-goog-api-key"),
            )
            .header_route("x-llm-cluster");
        let envoy = outputs
            .envoy(envoy)
            .start()
            .expect("envoy with the mesh's keys");
        Self {
            openai,
            anthropic,
            gemini,
            secrets,
            outputs,
            envoy,
        }
    }
}

#[tokio::test]
async fn sdk_calls_without_a_key_or_with_a_stray_one_carry_the_mesh_key() {
    if skip_without_envoy("sdk_calls_without_a_key_or_with_a_stray_one_carry_the_mesh_key") {
        return;
    }
    let mesh = Mesh::start(&[], &[]);
    let envoy = &mesh.envoy;
    // OpenAI's SDK with no key at all: a keyless app.
    let out = support::sdk::run(
        support::sdk::OPENAI,
        "chat",
        &envoy.url("/v1"),
        &["--api-key", ""],
    )
    .await;
    assert!(
        out["content"]
            .as_str()
            .is_some_and(|c| c.contains("[openai]")),
        "{out}"
    );
    let seen = mesh.openai.last_request().unwrap();
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    // Anthropic's with a stray key of the app's own.
    let out = support::sdk::run(
        support::sdk::ANTHROPIC,
        "messages",
        &envoy.url(""),
        &["--api-key", "sk-ant-STRAY-app"],
    )
    .await;
    assert!(out.to_string().contains("[anthropic]"), "{out}");
    let seen = mesh.anthropic.last_request().unwrap();
    assert_eq!(seen.header("x-api-key"), Some(ANTHROPIC_KEY));
    never_saw(&mesh.anthropic, "STRAY");
    // Google's with a stray key.
    let out = support::sdk::run(
        support::sdk::GENAI,
        "generate",
        &envoy.url(""),
        &["--api-key", "goog-STRAY-app"],
    )
    .await;
    assert!(out["text"].is_string(), "{out}");
    assert_eq!(
        mesh.gemini.last_request().unwrap().header("x-goog-api-key"),
        Some(GEMINI_KEY)
    );
    never_saw(&mesh.gemini, "STRAY");

    // Every place a client can put a key is stripped: each header any API
    // reads, and Gemini's `?key=`; Anthropic's required version is added
    // when the client (not an SDK) sent none.
    let strays = [
        ("authorization", "Bearer STRAY-1"),
        ("api-key", "STRAY-2"),
        ("x-api-key", "STRAY-3"),
        ("x-goog-api-key", "STRAY-4"),
    ];
    let r = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o-mini", "hi"),
        &strays,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let m = json!({"model": "claude-sonnet-4-5", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = post_json(&envoy.url("/v1/messages"), &m, &strays)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = mesh.anthropic.last_request().unwrap();
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    let g = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let r = post_json(
        &envoy.url("/v1beta/models/gemini-2.5-flash:generateContent?key=STRAY-5&alt=json"),
        &g,
        &strays,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        mesh.gemini.last_request().unwrap().query.as_deref(),
        Some("alt=json")
    );
    for mock in [&mesh.openai, &mesh.anthropic, &mesh.gemini] {
        never_saw(mock, "STRAY");
    }
    assert_no_secret_anywhere(&mesh).await;
}

/// The planted secrets appear nowhere Envoy or the filter writes: Envoy's
/// log, its stats, its config dump (SDS secrets show as `[redacted]`), the
/// filter's state page, the access-log record and the spans.
async fn assert_no_secret_anywhere(mesh: &Mesh) {
    let (_, dump) = mesh.envoy.admin_get("/config_dump?include_eds").unwrap();
    assert!(
        dump.contains("[redacted]"),
        "the SDS secrets are in the dump, redacted"
    );
    mesh.outputs
        .assert_none_of(&mesh.envoy, &[OPENAI_KEY, ANTHROPIC_KEY, GEMINI_KEY])
        .await;
}

#[tokio::test]
async fn a_missing_or_unreadable_secret_is_the_gateways_error_never_the_apps_key() {
    if skip_without_envoy("a_missing_or_unreadable_secret_is_the_gateways_error_never_the_apps_key")
    {
        return;
    }
    // Anthropic's file holds no secret, OpenAI's is not YAML: Envoy starts
    // without either key.
    let mesh = Mesh::start(&["anthropic"], &["openai"]);
    // The mock would take the app's key: only the mesh's credential may go.
    mesh.openai.set_keys(Some(&[OPENAI_KEY, "sk-app-own"]));
    let out = support::sdk::run(
        support::sdk::OPENAI,
        "shed",
        &mesh.envoy.url("/v1"),
        &["--api-key", "sk-app-own"],
    )
    .await;
    assert_eq!(out["status"], 503, "{out}");
    assert_eq!(out["code"], "llm_filter_credential_unavailable", "{out}");
    assert!(
        out["message"].as_str().unwrap().contains("credential"),
        "{out}"
    );
    // Anthropic's shape for an Anthropic call.
    let m = json!({"model": "claude-sonnet-4-5", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = post_json(
        &mesh.envoy.url("/v1/messages"),
        &m,
        &[("x-api-key", "sk-app-own")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    assert_eq!(mesh.openai.request_count(), 0, "the call never left");
    assert_eq!(mesh.anthropic.request_count(), 0, "the call never left");
    let count = mesh.envoy.metric(
        "llm_filter_credential_unavailable_total",
        &[("llm_cluster", "openai")],
    );
    assert!(count >= 1.0, "counted: {count}");
}

#[tokio::test]
async fn a_rotated_secret_is_taken_up_with_no_call_failing() {
    if skip_without_envoy("a_rotated_secret_is_taken_up_with_no_call_failing") {
        return;
    }
    const NEW_KEY: &str = "sk-mesh-openai-ROTATED-9";
    let mesh = Mesh::start(&[], &[]);
    let url = mesh.envoy.url("/v1/chat/completions");
    let loops = Loops::start(2, move |_| {
        let url = url.clone();
        async move {
            let r = post_json(&url, &chat_body("gpt-4o-mini", "rotate"), &[]).await;
            r.map(|r| r.status).ok()
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The provider takes both keys while the new one rolls out.
    mesh.openai.set_keys(Some(&[OPENAI_KEY, NEW_KEY]));
    let bearer = format!("Bearer {NEW_KEY}");
    write_secret(mesh.secrets.path(), "openai", Some(&bearer));
    let deadline = Instant::now() + DEADLINE;
    while mesh
        .openai
        .last_request()
        .and_then(|r| r.header("authorization").map(str::to_string))
        != Some(bearer.clone())
    {
        assert!(Instant::now() < deadline, "the new key never went out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every worker has it once each took a call with it; then the old key
    // is revoked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    mesh.openai.set_keys(Some(&[NEW_KEY]));
    mesh.openai.clear();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (ok, failed) = tally(&loops.stop().await, |s| *s == Some(200));
    let after = mesh.openai.requests();
    assert!(
        after.len() > 5,
        "calls ran after the revocation: {}",
        after.len()
    );
    for r in &after {
        assert_eq!(r.header("authorization"), Some(bearer.as_str()));
    }
    eprintln!("rotation: {ok} calls ok, {failed} failed");
    assert_eq!(failed, 0, "no call failed across the rotation");
}
