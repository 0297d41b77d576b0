//! The official SDKs as clients: the scripts under `tests/sdk` (one scenario a
//! run, one JSON object printed) run with the venv's Python, which holds the
//! SDKs the Makefile pins (`make e2e` installs them).

use std::path::PathBuf;
use std::process::Stdio;

use llm_filter_e2e::workspace_root;
use serde_json::Value;

/// The OpenAI SDK's script; its `--base-url` ends in `/v1`.
pub const OPENAI: &str = "openai_client.py";
/// The Anthropic SDK's script; its `--base-url` is the listener alone.
pub const ANTHROPIC: &str = "anthropic_client.py";
/// The Google Gen AI SDK's script (the Gemini API); its `--base-url` is the
/// listener alone.
pub const GENAI: &str = "genai_client.py";

/// The venv's Python (`LLM_FILTER_SDK_PYTHON` names another).
pub fn python() -> PathBuf {
    std::env::var_os("LLM_FILTER_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"))
}

/// Runs `scenario` of `script` against `base_url`; the JSON it printed, which
/// always names the SDK's version. Fails the test, with the script's stderr,
/// when the script fails or prints anything else.
pub async fn run(script: &str, scenario: &str, base_url: &str, args: &[&str]) -> Value {
    let path = workspace_root().join("tests/sdk").join(script);
    let output = tokio::process::Command::new(python())
        .arg(&path)
        .arg(scenario)
        .arg("--base-url")
        .arg(base_url)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {}: {e}", python().display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} {scenario}: the SDK script failed ({}); are the SDKs installed (`make e2e`)?\n{stderr}",
        output.status
    );
    let out: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} {scenario}: not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    assert!(out["sdk_version"].is_string(), "{out}");
    out
}
