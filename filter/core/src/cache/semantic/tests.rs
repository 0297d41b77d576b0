use super::config::{RawEmbeddingsConfig, SemanticConfig};
use super::*;
use crate::cache::config::Scope;
use crate::dialect::Dialect;

fn sem() -> SemanticConfig {
    SemanticConfig::compile(RawSemanticConfig {
        embeddings: Some(RawEmbeddingsConfig {
            cluster: Some("emb".into()),
            model: Some("e5".into()),
            ..RawEmbeddingsConfig::default()
        }),
        ..RawSemanticConfig::default()
    })
    .unwrap()
}

fn ask(
    dialect: Dialect,
    path: &str,
    cred: Option<&str>,
    body: &str,
    cfg: &CacheConfig,
) -> Option<Query> {
    let creds = [cred, None];
    let tree = Json::parse(body.as_bytes()).unwrap();
    query(
        cfg,
        &sem(),
        &CacheRequest {
            dialect,
            path,
            body: Some(&tree),
            cache_control: None,
            credentials: &creds,
        },
        &tree,
    )
}

const CHAT: &str = "/v1/chat/completions";

fn chat(body: &str) -> Option<Query> {
    ask(
        Dialect::Chat,
        CHAT,
        Some("Bearer a"),
        body,
        &CacheConfig::default(),
    )
}

const BASE: &str = r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"What is the capital of France?"}]}"#;

#[test]
fn the_last_user_message_is_the_question_and_not_the_context() {
    let q = chat(BASE).unwrap();
    assert_eq!(q.text, "What is the capital of France?");
    let reworded =
        chat(&BASE.replace("What is the capital of France?", "france capital?")).unwrap();
    assert_eq!(reworded.text, "france capital?");
    assert_eq!(reworded.context, q.context);
    // Delivery fields are not context, as for the exact key.
    let streamed = chat(&BASE.replace(
        r#""temperature":0"#,
        r#""temperature":0,"stream":true,"user":"u9""#,
    ))
    .unwrap();
    assert_eq!(streamed.context, q.context);
    // Text parts count as text.
    let parts = chat(&BASE.replace(
        r#""What is the capital of France?""#,
        r#"[{"type":"text","text":"What is the capital"},{"type":"text","text":"of France?"}]"#,
    ))
    .unwrap();
    assert_eq!(parts.text, "What is the capital\nof France?");
    assert_eq!(parts.context, q.context);
}

#[test]
fn everything_else_partitions_the_context() {
    let k = chat(BASE).unwrap().context;
    let mut seen = vec![k];
    for other in [
        BASE.replace("gpt-4o", "gpt-4o-mini"),
        BASE.replace("be brief", "be long"),
        BASE.replace(r#"{"role":"system","content":"be brief"},"#, ""),
        BASE.replace(r#""temperature":0"#, r#""temperature":0.1"#),
        BASE.replace(r#""temperature":0"#, r#""temperature":0,"seed":1"#),
        BASE.replace(r#""temperature":0"#, r#""temperature":0,"max_tokens":5"#),
        BASE.replace(r#""temperature":0"#, r#""temperature":0,"tools":[{"type":"function","function":{"name":"f"}}]"#),
        BASE.replace(r#""temperature":0"#, r#""temperature":0,"response_format":{"type":"json_object"}"#),
        // An earlier user turn is context too.
        BASE.replace(
            r#"{"role":"user","content":"What"#,
            r#"{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"What"#,
        ),
        // The message's other members too.
        BASE.replace(r#"{"role":"user","content""#, r#"{"role":"user","name":"bob","content""#),
    ] {
        let c = chat(&other).unwrap_or_else(|| panic!("{other}")).context;
        assert!(!seen.contains(&c), "{other}");
        seen.push(c);
    }
    let cfg = CacheConfig::default();
    let tenant_b = ask(Dialect::Chat, CHAT, Some("Bearer b"), BASE, &cfg)
        .unwrap()
        .context;
    let no_tenant = ask(Dialect::Chat, CHAT, None, BASE, &cfg).unwrap().context;
    let other_path = ask(
        Dialect::Chat,
        "/v2/chat/completions",
        Some("Bearer a"),
        BASE,
        &cfg,
    )
    .unwrap()
    .context;
    for c in [tenant_b, no_tenant, other_path] {
        assert!(!seen.contains(&c));
        seen.push(c);
    }
    let global = CacheConfig {
        scope: Scope::Global,
        ..CacheConfig::default()
    };
    assert_eq!(
        ask(Dialect::Chat, CHAT, Some("Bearer a"), BASE, &global)
            .unwrap()
            .context,
        ask(Dialect::Chat, CHAT, Some("Bearer b"), BASE, &global)
            .unwrap()
            .context
    );
}

#[test]
fn the_context_is_never_an_exact_key() {
    let q = chat(BASE).unwrap();
    let tree = Json::parse(BASE.as_bytes()).unwrap();
    let creds = [Some("Bearer a"), None];
    let req = CacheRequest {
        dialect: Dialect::Chat,
        path: CHAT,
        body: Some(&tree),
        cache_control: None,
        credentials: &creds,
    };
    let crate::cache::Decision::Cacheable(c) = crate::cache::decide(&CacheConfig::default(), &req)
    else {
        panic!()
    };
    assert_ne!(c.key, q.context);
}

#[test]
fn calls_without_a_plain_text_question_do_not_take_part() {
    for body in [
        // An image in the question.
        BASE.replace(
            r#""What is the capital of France?""#,
            r#"[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]"#,
        ),
        BASE.replace(r#""What is the capital of France?""#, r#"[{"type":"text","text":"a","cache":1}]"#),
        BASE.replace(r#""What is the capital of France?""#, "[]"),
        BASE.replace(r#""What is the capital of France?""#, "null"),
        BASE.replace(r#""What is the capital of France?""#, r#""   ""#),
        BASE.replace(r#""role":"user""#, r#""role":"assistant""#),
        r#"{"model":"m","messages":"hi"}"#.to_string(),
        r#"{"model":"m"}"#.to_string(),
    ] {
        assert_eq!(chat(&body), None, "{body}");
    }
    let long = BASE.replace("What is the capital of France?", &"x".repeat(9000));
    assert_eq!(chat(&long), None);
    let cfg = CacheConfig::default();
    let emb = r#"{"model":"e","input":"hello"}"#;
    assert_eq!(
        ask(Dialect::Embeddings, "/v1/embeddings", None, emb, &cfg),
        None
    );
}

#[test]
fn a_completions_prompt_is_the_question() {
    let cfg = CacheConfig::default();
    let p = |prompt: &str| {
        let body = format!(r#"{{"model":"m","temperature":0,"prompt":{prompt}}}"#);
        ask(
            Dialect::Completions,
            "/v1/completions",
            Some("k"),
            &body,
            &cfg,
        )
    };
    let a = p(r#""Say hello""#).unwrap();
    let b = p(r#""hello, say it""#).unwrap();
    assert_eq!((a.text.as_str(), a.context), ("Say hello", b.context));
    assert_eq!(p(r#"["a","b"]"#), None);
    assert_eq!(p("[1,2]"), None);
}

#[test]
fn a_gemini_questions_last_user_parts_are_the_question() {
    let gemini = |path: &str, body: &str| {
        ask(
            Dialect::Gemini,
            path,
            Some("gk"),
            body,
            &CacheConfig::default(),
        )
    };
    let flash = "/v1beta/models/flash:generateContent";
    let body = r#"{"systemInstruction":{"parts":[{"text":"be brief"}]},"contents":[
        {"role":"user","parts":[{"text":"hi"}]},{"role":"model","parts":[{"text":"hello"}]},
        {"parts":[{"text":"What is the capital"},{"text":"of France?"}]}]}"#;
    let q = gemini(flash, body).unwrap();
    assert_eq!(q.text, "What is the capital\nof France?");
    let reworded = gemini(
        flash,
        &body.replace(
            r#"{"text":"What is the capital"},{"text":"of France?"}"#,
            r#"{"text":"france capital?"}"#,
        ),
    )
    .unwrap();
    assert_eq!(reworded.context, q.context, "the wording is no context");
    // The model is the path's, the system instruction and the turns before
    // are context.
    let pro = gemini("/v1beta/models/pro:generateContent", body).unwrap();
    assert_ne!(pro.context, q.context);
    let other = gemini(flash, &body.replace("be brief", "be long")).unwrap();
    assert_ne!(other.context, q.context);
    // A function's response, an image or a last content of the model's is
    // no question.
    for other in [
        r#"{"contents":[{"role":"user","parts":[{"functionResponse":{"name":"f","response":{}}}]}]}"#,
        r#"{"contents":[{"role":"user","parts":[{"text":"a"},{"inlineData":{"data":"AA"}}]}]}"#,
        r#"{"contents":[{"role":"user","parts":[{"text":"a","thought":true}]}]}"#,
        r#"{"contents":[{"role":"model","parts":[{"text":"a"}]}]}"#,
        r#"{"contents":[{"role":"user","parts":[]}]}"#,
        r#"{"contents":{}}"#,
    ] {
        assert_eq!(gemini(flash, other), None, "{other}");
    }
}

#[test]
fn the_callout_asks_the_configured_service() {
    let mut cfg = sem().embeddings;
    cfg.service.headers = vec![("authorization".into(), "Bearer e".into())];
    let (headers, body) = embeddings_request(&cfg, "a \"quoted\" question");
    let h = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(h(":method"), Some("POST"));
    assert_eq!(h(":path"), Some("/v1/embeddings"));
    assert_eq!(h(":authority"), Some("emb"));
    assert_eq!(h("authorization"), Some("Bearer e"));
    assert_eq!(h("content-length"), Some(body.len().to_string().as_str()));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"model":"e5","input":"a \"quoted\" question"})
    );
}

#[test]
fn only_one_finite_vector_is_an_embedding() {
    let ok = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[3,4]}],"model":"e5","usage":{}}"#;
    let v = read_embedding(Some(200), ok, 8).unwrap();
    assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
    assert_eq!(read_embedding(None, ok, 8), Err(EmbedFailure::Timeout));
    assert_eq!(read_embedding(Some(504), ok, 8), Err(EmbedFailure::Timeout));
    assert_eq!(read_embedding(Some(503), ok, 8), Err(EmbedFailure::Status));
    assert_eq!(
        read_embedding(Some(200), ok, 1),
        Err(EmbedFailure::Dimensions)
    );
    for bad in [
        &b"{"[..],
        br#"{"data":[]}"#,
        br#"{"data":[{"embedding":[1]},{"embedding":[1]}]}"#,
        br#"{"data":[{"embedding":[0,0]}]}"#,
        br#"{"data":[{"embedding":"AAAA"}]}"#,
        br#"{"data":[{"embedding":[1e300]}]}"#,
        br#"{"error":{"message":"x"}}"#,
    ] {
        assert_eq!(
            read_embedding(Some(200), bad, 8),
            Err(EmbedFailure::Invalid),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}
