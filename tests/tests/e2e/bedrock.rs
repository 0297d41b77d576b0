//! Bedrock, keyless: Envoy's `aws_request_signing` on the Bedrock cluster
//! signs each call (SigV4) with an AWS key from a file only Envoy reads, and
//! a mock Bedrock checks every signature as AWS does, with AWS's own signer
//! (botocore, `tests/sdk/sigv4_verify.py`) over the exact bytes it received.
//! The cluster is the one docs/credentials.md gives, read from the page. As
//! an upstream filter the signer signs the body the filter sent (model
//! rewritten, `max_tokens` capped); the control puts the same signer
//! downstream, before the filter, and the filter's edit breaks its
//! signature.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use llm_filter_e2e::{
    post_json, skip_without_envoy, workspace_root, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
    RecordedRequest,
};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::support;
use crate::support::load::{tally, Loops};
use crate::support::secrets::{self, never_saw, Outputs};

const ACCESS_KEY: &str = "AKIAMESHBEDROCK00001";
/// The AWS secret key: it signs, and must show up nowhere.
const SECRET_KEY: &str = "mesh/Bedrock+PLANTED-secret-5xK9";
const REGION: &str = "us-east-1";
const HOST: &str = "bedrock-runtime.us-east-1.amazonaws.com";
/// The cap shaping puts on `max_tokens`.
const CAP: u64 = 256;

/// The Bedrock cluster's `typed_extension_protocol_options` as
/// docs/credentials.md gives them, at column 0, with the credentials file
/// in `dir` instead of the page's.
fn documented_options(dir: &Path) -> String {
    let route = secrets::documented_yaml("### Bedrock", 1);
    assert!(
        route.contains(&format!("host_rewrite_literal: {HOST}")),
        "the page's route rewrites the host as the test's does: {route}"
    );
    let options = secrets::documented_options("### Bedrock", dir);
    assert!(
        options.contains(&format!("{}/aws-credentials", dir.display())),
        "{options}"
    );
    options
}

/// The signer of `options` alone, a list item at column 0 (to place it
/// elsewhere).
fn signer_item(options: &str) -> String {
    let lines: Vec<&str> = options.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim() == "- name: envoy.filters.http.aws_request_signing")
        .unwrap();
    let indent = lines[at].len() - lines[at].trim_start().len();
    let next_item = format!("{}- ", " ".repeat(indent));
    let mut item = vec![&lines[at][indent..]];
    for l in &lines[at + 1..] {
        if l.starts_with(&next_item) || l.len() - l.trim_start().len() < indent {
            break;
        }
        item.push(&l[indent..]);
    }
    item.join("\n") + "\n"
}

/// Writes the AWS shared credentials file the signer reads, atomically (a
/// rename into the watched directory, as Kubernetes' Secret volumes and an
/// operator's `mv` do).
fn write_credentials(dir: &Path, access_key: &str, secret: &str) {
    let tmp = dir.join(".aws-credentials.tmp");
    std::fs::write(
        &tmp,
        format!("[default]\naws_access_key_id = {access_key}\naws_secret_access_key = {secret}\n"),
    )
    .unwrap();
    std::fs::rename(&tmp, dir.join("aws-credentials")).unwrap();
}

/// Each of `requests`, as the mock received it, checked by botocore's
/// SigV4 signer with the key `access_key`, `secret`: the verifier's result
/// of each.
async fn verify(requests: &[RecordedRequest], access_key: &str, secret: &str) -> Vec<Value> {
    let spec = json!({
        "access_key": access_key,
        "secret_key": secret,
        "region": REGION,
        "service": "bedrock",
        "requests": requests.iter().map(RecordedRequest::as_received).collect::<Vec<_>>(),
    });
    let script = workspace_root().join("tests/sdk/sigv4_verify.py");
    let mut child = tokio::process::Command::new(support::sdk::python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(spec.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the verifier failed; is botocore installed (`make sdk`)?\n{stderr}"
    );
    let out: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out["sdk_version"].is_string(), "{out}");
    let results = out["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), requests.len(), "{out}");
    results
}

/// The filter's configuration of a Bedrock gateway; `keyless`: the cluster
/// is mesh-credentialed.
fn filter_config(keyless: bool) -> Value {
    let mut config = json!({
        "llm_paths": ["/openai/v1/chat/completions", "/v1/messages"],
        "routing": {"models": {
            "gpt-oss-120b": [{"cluster": "bedrock", "model": "openai.gpt-oss-120b-1:0"}],
            "claude-sonnet-4-5": [{"cluster": "bedrock",
                "model": "anthropic.claude-sonnet-4-5-20250929-v1:0"}],
        }},
        "shaping": {"max_tokens_cap": CAP},
        // No retry or hedge of the filter's own on a slow machine: each
        // call is one request signed.
        "budget": {"enabled": false},
    });
    if keyless {
        config["credentials"] = json!({"clusters": {"bedrock": {}}});
    }
    config
}

struct Gateway {
    bedrock: MockUpstream,
    outputs: Outputs,
    /// The directory Envoy watches for the credentials file.
    keys: std::path::PathBuf,
    _dir: tempfile::TempDir,
    envoy: Envoy,
}

impl Gateway {
    /// The signer as docs/credentials.md places it (an upstream filter of
    /// the Bedrock cluster) or, `downstream`, as an HTTP filter before this
    /// one (the control: no host rewrite, the cluster not keyless, so only
    /// the body can break the signature).
    fn start(downstream: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        write_credentials(&keys, ACCESS_KEY, SECRET_KEY);
        let options = documented_options(&keys);
        let bedrock = MockUpstream::start(MockConfig::named("bedrock"));
        let outputs = Outputs::start(dir.path());
        let mut builder = EnvoyBuilder::new()
            .plugin_config(outputs.config(filter_config(!downstream)))
            .header_route("x-llm-cluster")
            // The signer's own logging, where a leak would show.
            .component_log_level("aws:debug");
        builder = if downstream {
            builder
                .filters_before(&signer_item(&options))
                .upstream("bedrock", bedrock.port())
        } else {
            builder
                .upstream_pool("bedrock", &[bedrock.port()], &options)
                .extra_route_yaml(&format!("host_rewrite_literal: {HOST}"))
        };
        let envoy = outputs
            .envoy(builder)
            .start()
            .expect("envoy with the Bedrock signer");
        Self {
            bedrock,
            outputs,
            keys,
            _dir: dir,
            envoy,
        }
    }
}

/// The LLM calls Bedrock received, without the health probes routing sends
/// a backend now and then (`GET /v1/models`, signed as well).
fn calls(bedrock: &MockUpstream) -> Vec<RecordedRequest> {
    let mut seen = bedrock.requests();
    seen.retain(|r| r.method != "GET");
    seen
}

/// The paths of `requests`, for a failure's message.
fn paths(requests: &[RecordedRequest]) -> Vec<&str> {
    requests.iter().map(|r| r.path.as_str()).collect()
}

/// A Messages call as Anthropic's API takes it, asking for `max_tokens`.
fn messages_call(max_tokens: u64) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn bedrock_calls_are_signed_over_the_body_the_filter_sent() {
    if skip_without_envoy("bedrock_calls_are_signed_over_the_body_the_filter_sent") {
        return;
    }
    let gw = Gateway::start(false);
    let envoy = &gw.envoy;
    // OpenAI's SDK on Bedrock's OpenAI-compatible path, with no key and with
    // a stray one of the app's own; it names no `max_tokens`, so shaping
    // sets the cap, and routing rewrites the model.
    for key in ["", "sk-STRAY-app"] {
        let out = support::sdk::run(
            support::sdk::OPENAI,
            "chat",
            &envoy.url("/openai/v1"),
            &["--api-key", key, "--model", "gpt-oss-120b"],
        )
        .await;
        assert!(
            out["content"]
                .as_str()
                .is_some_and(|c| c.contains("[bedrock]")),
            "{out}"
        );
    }
    // Streamed: the answer streams back as the provider sends it.
    let out = support::sdk::run(
        support::sdk::OPENAI,
        "stream",
        &envoy.url("/openai/v1"),
        &["--api-key", "", "--model", "gpt-oss-120b"],
    )
    .await;
    assert!(
        out["chunks"].as_array().is_some_and(|c| c.len() > 2),
        "{out}"
    );
    // A raw Anthropic Messages call with every kind of stray key, asking
    // for more than the cap.
    let strays = [
        ("authorization", "Bearer STRAY-1"),
        ("x-api-key", "STRAY-2"),
        ("api-key", "STRAY-3"),
    ];
    let r = post_json(&envoy.url("/v1/messages"), &messages_call(4096), &strays)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    let seen = calls(&gw.bedrock);
    assert_eq!(seen.len(), 4, "{:?}", paths(&seen));
    for (r, (path, model)) in seen.iter().zip([
        ("/openai/v1/chat/completions", "openai.gpt-oss-120b-1:0"),
        ("/openai/v1/chat/completions", "openai.gpt-oss-120b-1:0"),
        ("/openai/v1/chat/completions", "openai.gpt-oss-120b-1:0"),
        ("/v1/messages", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
    ]) {
        assert_eq!(r.path, path);
        assert_eq!(r.header("host"), Some(HOST));
        // The body received is the one the filter edited.
        let body = r.json().unwrap();
        assert_eq!(body["model"], model, "{body}");
        assert_eq!(body["max_tokens"], CAP, "{body}");
        let auth = r.header("authorization").unwrap();
        assert!(
            auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")),
            "{auth}"
        );
        assert!(r.header("x-api-key").is_none() && r.header("api-key").is_none());
    }
    assert_eq!(seen[2].json().unwrap()["stream"], true);
    assert_eq!(seen[3].header("anthropic-version"), Some("2023-06-01"));
    never_saw(&gw.bedrock, "STRAY");
    // AWS's signer takes every signature over the bytes received...
    for (result, r) in verify(&seen, ACCESS_KEY, SECRET_KEY)
        .await
        .iter()
        .zip(&seen)
    {
        assert_eq!(result["valid"], true, "{result} {}", r.path);
        let signed = result["signed_headers"].to_string();
        assert!(
            signed.contains("\"host\"") && signed.contains("\"x-amz-content-sha256\""),
            "{signed}"
        );
    }
    // ... and would refuse them under another secret (the check can fail).
    for result in verify(&seen, ACCESS_KEY, "another-secret").await {
        assert_eq!(result["valid"], false, "{result}");
    }
    // The signer logged at debug level, where it names the credentials it
    // found: the secret only as `*`.
    assert!(
        envoy.log_contents().contains("AWS_SECRET_ACCESS_KEY=*"),
        "the signer's debug log is in the searched log"
    );
    gw.outputs.assert_none_of(envoy, &[SECRET_KEY]).await;
}

#[tokio::test]
async fn a_signature_made_before_the_filter_edits_fails() {
    if skip_without_envoy("a_signature_made_before_the_filter_edits_fails") {
        return;
    }
    let gw = Gateway::start(true);
    let url = gw.envoy.url("/openai/v1/chat/completions");
    let chat = |max_tokens: u64| {
        json!({"model": "gpt-oss-120b", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}]})
    };
    // Within the cap and already naming Bedrock's model: the filter leaves
    // the body as it was signed, and the signature holds.
    let mut unedited = chat(16);
    unedited["model"] = json!("openai.gpt-oss-120b-1:0");
    let r = post_json(&url, &unedited, &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // Over the cap: the filter caps it after the signer signed the body
    // the client sent.
    let r = post_json(&url, &chat(4096), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    let seen = calls(&gw.bedrock);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].json().unwrap(), unedited);
    let edited = seen[1].json().unwrap();
    assert_eq!(edited["max_tokens"], CAP, "{edited}");
    assert_eq!(edited["model"], "openai.gpt-oss-120b-1:0", "{edited}");
    let results = verify(&seen, ACCESS_KEY, SECRET_KEY).await;
    assert_eq!(results[0]["valid"], true, "{}", results[0]);
    assert_eq!(results[1]["valid"], false, "{}", results[1]);
    assert!(
        results[1]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("hash of the body")),
        "{}",
        results[1]
    );
}

/// The access key id a SigV4 `authorization` names.
fn access_key_of(r: &RecordedRequest) -> String {
    let auth = r.header("authorization").unwrap_or_default();
    let credential = auth.split("Credential=").nth(1).unwrap_or_default();
    credential.split('/').next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_rotated_aws_key_is_taken_up_with_no_call_failing() {
    if skip_without_envoy("a_rotated_aws_key_is_taken_up_with_no_call_failing") {
        return;
    }
    const NEW_ACCESS_KEY: &str = "AKIAMESHBEDROCK00002";
    const NEW_SECRET_KEY: &str = "mesh/Bedrock+ROTATED-secret-7pQ2";
    let gw = Gateway::start(false);
    let url = gw.envoy.url("/openai/v1/chat/completions");
    let loops = Loops::start(2, move |_| {
        let url = url.clone();
        async move {
            let call = json!({"model": "gpt-oss-120b",
                "messages": [{"role": "user", "content": "rotate"}]});
            post_json(&url, &call, &[]).await.map(|r| r.status).ok()
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    write_credentials(&gw.keys, NEW_ACCESS_KEY, NEW_SECRET_KEY);
    let deadline = Instant::now() + Duration::from_secs(20);
    while gw
        .bedrock
        .last_request()
        .is_none_or(|r| access_key_of(&r) != NEW_ACCESS_KEY)
    {
        assert!(Instant::now() < deadline, "the new key never signed a call");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ok, failed) = tally(&loops.stop().await, |s| *s == Some(200));
    // Every call a real Bedrock would have taken: each signature verifies
    // under the key it names, the old one before the rotation and the new
    // one after.
    let seen = calls(&gw.bedrock);
    let (old, new): (Vec<_>, Vec<_>) = seen
        .into_iter()
        .partition(|r| access_key_of(r) == ACCESS_KEY);
    assert!(
        new.iter().all(|r| access_key_of(r) == NEW_ACCESS_KEY),
        "every call is signed by one of the two keys"
    );
    assert!(
        !old.is_empty() && new.len() > 5,
        "{} {}",
        old.len(),
        new.len()
    );
    let mut refused = 0;
    for (requests, access, secret) in [
        (&old, ACCESS_KEY, SECRET_KEY),
        (&new, NEW_ACCESS_KEY, NEW_SECRET_KEY),
    ] {
        for result in verify(requests, access, secret).await {
            if result["valid"] != true {
                refused += 1;
                eprintln!("refused: {result}");
            }
        }
    }
    eprintln!(
        "aws key rotation: {ok} calls ok ({} signed by the old key, {} by the new), {failed} failed, {refused} signatures refused",
        old.len(),
        new.len(),
    );
    assert_eq!(failed, 0, "no call failed");
    assert_eq!(refused, 0, "every signature verifies under its key");
}

/// The text the guardrail mock flags.
const FLAG: &str = llm_filter_e2e::mock::guardrail::FLAG;

#[tokio::test]
async fn the_bedrock_guardrail_callout_is_signed_by_its_cluster() {
    if skip_without_envoy("the_bedrock_guardrail_callout_is_signed_by_its_cluster") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    write_credentials(&keys, ACCESS_KEY, SECRET_KEY);
    // The Bedrock cluster of docs/credentials.md in front of a mock
    // ApplyGuardrail; the provider a plain one.
    let options = documented_options(&keys);
    let guardrail = MockUpstream::start(MockConfig::named("bedrock"));
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let outputs = Outputs::start(dir.path());
    let config = outputs.config(json!({"guardrails": {"service": {
        "name": "bedrock-guardrail", "preset": "bedrock_guardrail", "cluster": "bedrock",
        "authority": HOST, "guardrail_id": "gr0mesh1", "guardrail_version": "1",
        "action": "mask"}}}));
    let envoy = outputs
        .envoy(
            EnvoyBuilder::new()
                .upstream("provider", provider.port())
                .upstream_pool("bedrock", &[guardrail.port()], &options),
        )
        .plugin_config(config)
        .component_log_level("aws:debug")
        .start()
        .expect("envoy with a signed guardrail service");
    let url = envoy.url("/v1/chat/completions");
    let chat = |content: &str| json!({"model": "gpt-4o", "messages": [{"role": "user", "content": content}]});
    // Masked by the guardrail: the provider gets its texts.
    let r = post_json(&url, &chat("mail ops@example.com today"), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = provider.last_request().unwrap().json().unwrap();
    assert_eq!(sent["messages"][0]["content"], "mail {EMAIL} today");
    // Blocked by it: refused, nothing sent.
    let r = post_json(&url, &chat(&format!("{FLAG} please")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(provider.request_count(), 1);

    let asked = guardrail.requests();
    assert_eq!(asked.len(), 2);
    for r in &asked {
        assert_eq!(r.path, "/guardrail/gr0mesh1/version/1/apply");
        assert_eq!(r.header("host"), Some(HOST));
        let auth = r.header("authorization").unwrap();
        assert!(
            auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")),
            "{auth}"
        );
    }
    // AWS's own signer takes each signature over the bytes received, the
    // body's hash among what is signed...
    for result in verify(&asked, ACCESS_KEY, SECRET_KEY).await {
        assert_eq!(result["valid"], true, "{result}");
        let signed = result["signed_headers"].to_string();
        assert!(signed.contains("\"x-amz-content-sha256\""), "{signed}");
    }
    // ... and refuses them under another secret.
    for result in verify(&asked, ACCESS_KEY, "another-secret").await {
        assert_eq!(result["valid"], false, "{result}");
    }
    outputs.assert_none_of(&envoy, &[SECRET_KEY]).await;
}
