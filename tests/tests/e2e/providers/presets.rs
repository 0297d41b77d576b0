//! The `gemini`, `vertex` (Gemini's API) and `vllm` presets with the
//! official SDKs as clients: the google-genai SDK through Gemini backends,
//! failing over from Vertex's 429 `RESOURCE_EXHAUSTED` to the Gemini API; the
//! OpenAI and Anthropic SDKs through a vLLM backend, which serves both shapes.
//! Each mock refuses a call not in its provider's shape.

use llm_filter_e2e::{post_json, skip_without_envoy, MockUpstream, Provider};
use serde_json::json;

use super::{body, envoy, last_post, mock, posts, sdk};
use super::{FLASH, FLASH_ID, VERTEX_GOOGLE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genai_sdk_reaches_gemini_backends_and_fails_over_from_vertex() {
    if skip_without_envoy("the_genai_sdk_reaches_gemini_backends") {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let vertex = mock("vertex", Provider::Vertex);
    let gemini = mock("gemini", Provider::Gemini);
    let generate = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let chat = json!({"model": FLASH, "messages": [{"role": "user", "content": "hi"}]});
    for (m, path, b) in [
        (
            &gemini,
            format!("{VERTEX_GOOGLE}/{FLASH}:generateContent"),
            &generate,
        ),
        (&gemini, "/v1/chat/completions".to_string(), &chat),
        (
            &vertex,
            format!("/v1beta/models/{FLASH}:generateContent"),
            &generate,
        ),
        (
            &vertex,
            "/v1beta/openai/chat/completions".to_string(),
            &chat,
        ),
    ] {
        let r = post_json(&m.url(&path), b, &[]).await.unwrap();
        assert_eq!(r.status, 400, "{} {path}: {}", m.name(), r.text());
    }
    vertex.clear();
    gemini.clear();
    let routing = json!({
        "eject_after_failures": 1000,
        "models": {FLASH: [
            {"cluster": "vertex", "provider": "vertex", "apis": ["gemini"], "weight": 1_000_000,
             "paths": {"gemini": format!("{VERTEX_GOOGLE}/{{model}}:generateContent")}},
            {"cluster": "gemini", "provider": "gemini", "weight": 1, "model": FLASH_ID}
        ]}
    });
    let envoy = envoy(&default, &[&vertex, &gemini], routing);
    let base = envoy.url("");
    let base = base.trim_end_matches('/');

    let out = sdk::run(sdk::GENAI, "generate", base, &[]).await;
    assert_eq!(out["headers"]["x-llm-provider"], "vertex", "{out}");
    assert_eq!(out["finish_reason"], "STOP", "{out}");
    let v = last_post(&vertex).unwrap();
    assert_eq!(v.path, format!("{VERTEX_GOOGLE}/{FLASH}:generateContent"));

    // Vertex's quota for the moment (429 RESOURCE_EXHAUSTED): the Gemini
    // API answers, on its own path, with its name of the model.
    vertex.set_status(Some(429));
    let out = sdk::run(sdk::GENAI, "generate", base, &[]).await;
    assert_eq!(out["headers"]["x-llm-provider"], "gemini", "{out}");
    assert_eq!(out["headers"]["x-llm-model"], FLASH_ID, "{out}");
    assert!(out["text"].as_str().is_some_and(|t| !t.is_empty()), "{out}");
    assert_eq!(posts(&vertex).len(), 2, "vertex was asked, and refused");
    let g = last_post(&gemini).unwrap();
    assert_eq!(g.path, format!("/v1beta/models/{FLASH_ID}:generateContent"));
    assert!(g.header("x-goog-api-client").is_some(), "the SDK's headers");
    assert_eq!(body(&g)["contents"], body(&v)["contents"]);

    // The stream too, before its first byte, on the stream's path.
    let out = sdk::run(sdk::GENAI, "generate_stream", base, &[]).await;
    assert_eq!(out["finish_reason"], "STOP", "{out}");
    assert!(out["chunks"].as_u64().unwrap() > 1, "{out}");
    let g = last_post(&gemini).unwrap();
    assert_eq!(
        g.path,
        format!("/v1beta/models/{FLASH_ID}:streamGenerateContent")
    );
    assert_eq!(g.query.as_deref(), Some("alt=sse"));
    let v = last_post(&vertex).unwrap();
    assert_eq!(
        v.path,
        format!("{VERTEX_GOOGLE}/{FLASH}:streamGenerateContent")
    );

    // A chat call for the model goes only where it is spoken: the Gemini
    // API's OpenAI-compatible path (the Vertex backend serves `gemini` alone).
    let before = posts(&vertex).len();
    let out = sdk::run(
        sdk::OPENAI,
        "chat_raw",
        &envoy.url("/v1"),
        &["--model", FLASH],
    )
    .await;
    let call = &out["calls"][0];
    assert_eq!(call["status"], 200, "{out}");
    assert_eq!(call["headers"]["x-llm-provider"], "gemini", "{out}");
    let g = last_post(&gemini).unwrap();
    assert_eq!(g.path, "/v1beta/openai/chat/completions");
    assert_eq!(body(&g)["model"], FLASH_ID);
    assert_eq!(posts(&vertex).len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_backend_serves_the_openai_and_anthropic_sdks() {
    if skip_without_envoy("a_vllm_backend_serves_the_openai_and_anthropic_sdks") {
        return;
    }
    const LLAMA: &str = "llama-3.1-8b";
    const SERVED: &str = "meta-llama/Llama-3.1-8B-Instruct";
    let default = MockUpstream::backend("default", 0);
    let vllm = mock("vllm", Provider::Vllm);
    let no_model = json!({"messages": [{"role": "user", "content": "hi"}]});
    for (path, b) in [
        ("/v1/chat/completions", &no_model),
        ("/openai/v1/chat/completions", &json!({"model": SERVED})),
        ("/v1beta/models/x:generateContent", &json!({})),
    ] {
        let r = post_json(&vllm.url(path), b, &[]).await.unwrap();
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.json()["object"], "error");
    }
    vllm.clear();
    let routing = json!({"models": {LLAMA: [
        {"cluster": "vllm", "provider": "vllm", "model": SERVED}
    ]}});
    let envoy = envoy(&default, &[&vllm], routing);
    let base = envoy.url("");
    let base = base.trim_end_matches('/');

    for (script, scenario, url, path) in [
        (
            sdk::OPENAI,
            "chat_raw",
            envoy.url("/v1"),
            "/v1/chat/completions",
        ),
        (
            sdk::OPENAI,
            "responses_raw",
            envoy.url("/v1"),
            "/v1/responses",
        ),
        (
            sdk::ANTHROPIC,
            "messages_raw",
            base.to_string(),
            "/v1/messages",
        ),
    ] {
        let out = sdk::run(script, scenario, &url, &["--model", LLAMA]).await;
        let call = &out["calls"][0];
        assert_eq!(call["status"], 200, "{scenario}: {out}");
        assert_eq!(call["headers"]["x-llm-provider"], "vllm", "{out}");
        assert_eq!(call["headers"]["x-llm-model"], SERVED, "{out}");
        let r = last_post(&vllm).unwrap();
        assert_eq!(r.path, path, "{scenario}");
        assert_eq!(body(&r)["model"], SERVED, "{scenario}");
    }
    // The Anthropic SDK's own version header reached vLLM unchanged.
    let m = last_post(&vllm).unwrap();
    assert!(m.header("anthropic-version").is_some());
}
