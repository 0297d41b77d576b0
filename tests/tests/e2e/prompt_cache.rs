//! The provider's prompt cache used by the mesh, through the real Envoy.
//! Anthropic Messages calls of a model `routing.prompt_cache` names get
//! `cache_control` breakpoints the official `anthropic` SDK never placed; the
//! mock plays Anthropic's cache (breakpoints, the minimum prefix, the
//! 20-block look-back, its 400 past four markers), so the later turns of a
//! conversation read their prefix back and the filter's saving counter
//! prices the reads at the catalog's cached rate. A client's own marker and
//! a prompt below the threshold leave as they came. OpenAI-shaped calls
//! through the official `openai` SDK get a `prompt_cache_key` that is the
//! tenant's own and the conversation's, and the affinity key besides.

use std::time::Duration;

use llm_filter_e2e::{
    post_json, skip_without_envoy, Envoy, EnvoyBuilder, MockConfig, MockUpstream, RecordedRequest,
};
use serde_json::{json, Value};

use crate::pricing::with_catalog;
use crate::support::sdk::{run, ANTHROPIC, OPENAI};

const MODEL: &str = "claude-sonnet-4-5";
/// The mock's smallest cacheable prefix, in its tokens (words).
const MOCK_MIN: u64 = 300;

/// An application's instructions: 600 words (1,200 estimated tokens), past
/// the mock's minimum and the filter's.
fn long_system() -> String {
    "Answer questions about the platform precisely. ".repeat(100)
}

fn start(config: Value) -> (MockUpstream, Envoy) {
    let mock = MockUpstream::start(MockConfig::named("anthropic"));
    mock.set_messages_cache(Some(MOCK_MIN));
    let envoy = EnvoyBuilder::new()
        .plugin_config(with_catalog(&config))
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter");
    (mock, envoy)
}

/// Where the markers of a call the mock received are: `tools`, `system`,
/// or `messages[i]`.
fn markers(r: &RecordedRequest) -> Vec<String> {
    let body = r.json().unwrap_or_default();
    let mut out = Vec::new();
    let marked = |v: &Value| v.get("cache_control").is_some();
    for part in ["tools", "system"] {
        if body[part].as_array().is_some_and(|a| a.iter().any(marked)) {
            out.push(part.to_string());
        }
    }
    for (i, m) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if m["content"]
            .as_array()
            .is_some_and(|a| a.iter().any(marked))
        {
            out.push(format!("messages[{i}]"));
        }
    }
    out
}

/// Conversations through the SDK: each turn's usage.
async fn converse(
    e: &Envoy,
    model: &str,
    system: &str,
    n: usize,
    turns: usize,
    more: &[&str],
) -> Value {
    let (n, turns) = (n.to_string(), turns.to_string());
    let args = [
        &["--model", model, "--max-tokens", "16", "--system", system],
        &["--conversations", n.as_str(), "--turns", turns.as_str()][..],
        more,
    ]
    .concat();
    run(ANTHROPIC, "conversations", &e.url(""), &args).await
}

/// The share of the prompt tokens read from the cache, and the tokens
/// read by each call.
fn read_share(out: &Value) -> (f64, Vec<u64>) {
    let turns = out["turns"].as_array().expect("turns");
    let mut reads = Vec::new();
    let (mut read, mut all) = (0, 0);
    for t in turns {
        let u = &t["usage"];
        let r = u["cache_read"].as_u64().unwrap_or(0);
        read += r;
        all += u["input"].as_u64().unwrap_or(0) + r + u["cache_creation"].as_u64().unwrap_or(0);
        reads.push(r);
    }
    (read as f64 / all.max(1) as f64, reads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_the_mesh_puts_on_are_read_back_and_saved_at_the_cached_rate() {
    if skip_without_envoy("markers_the_mesh_puts_on_are_read_back_and_saved_at_the_cached_rate") {
        return;
    }
    // The threshold in the model's tokens: the mock counts words, which the
    // calibration learns, so a word is worth two estimated tokens here.
    let (mock, e) =
        start(json!({"routing": {"prompt_cache": {MODEL: {"min_prefix_tokens": MOCK_MIN}}}}));
    let system = long_system();
    // Without markers (a model the configuration does not name): nothing
    // is ever read from the cache.
    let plain = converse(&e, "claude-sonnet-4-6", &system, 20, 6, &[]).await;
    assert_eq!(plain["error"], Value::Null, "{plain}");
    let (share_without, _) = read_share(&plain);
    assert_eq!(share_without, 0.0);
    assert!(mock.requests().iter().all(|r| markers(r).is_empty()));
    let before = mock.requests().len();

    // With them: 20 conversations of 6 turns.
    let out = converse(&e, MODEL, &system, 20, 6, &[]).await;
    assert_eq!(out["error"], Value::Null, "{out}");
    let sent: Vec<RecordedRequest> = mock.requests().into_iter().skip(before).collect();
    assert_eq!(sent.len(), 120);
    let mut placed = 0;
    for (i, r) in sent.iter().enumerate() {
        let m = markers(r);
        let turn = i % 6;
        // The first question: its instructions only; later turns: the
        // instructions, the previous question and the last one.
        let want: Vec<String> = if turn == 0 {
            vec!["system".into()]
        } else {
            vec![
                "system".into(),
                format!("messages[{}]", 2 * turn - 2),
                format!("messages[{}]", 2 * turn),
            ]
        };
        assert_eq!(m, want, "call {i}");
        assert!(m.len() <= 4);
        placed += m.len();
    }
    let (share_with, mut reads) = read_share(&out);
    // Every call but the very first reads the instructions; every later
    // turn reads its conversation up to the previous question too.
    assert!(
        reads[0] == 0 && reads[1..].iter().all(|r| *r > 0),
        "{reads:?}"
    );
    assert!(share_with > 0.8, "{share_with}");
    println!(
        "prompt tokens read from the provider's cache, 20 conversations × 6 turns: \
         {share_without:.3} without markers, {share_with:.3} with them ({placed} markers)"
    );

    // With a tool of 600 words besides: four markers from the second turn
    // on, the tool first, and the provider takes them.
    let before = mock.requests().len();
    let out = converse(&e, MODEL, &system, 1, 3, &["--tool-words", "600"]).await;
    assert_eq!(out["error"], Value::Null, "{out}");
    let sent: Vec<Vec<String>> = mock.requests().iter().skip(before).map(markers).collect();
    assert_eq!(
        sent,
        [
            vec!["tools", "system"],
            vec!["tools", "system", "messages[0]", "messages[2]"],
            vec!["tools", "system", "messages[2]", "messages[4]"],
        ]
    );
    placed += 10;
    let (_, with_tool) = read_share(&out);
    assert!(with_tool[1..].iter().all(|r| *r > 1200), "{with_tool:?}");

    // Counted: the markers, the tokens read and written, the saving at the
    // catalog's rates ($3 input, $0.30 cached: 2.7 millionths a token read).
    let model = [("model", MODEL), ("api", "messages")];
    let counted = e.wait_for_metric(
        "llm_filter_prompt_cache_markers_total",
        &model,
        placed as f64,
        Duration::from_secs(5),
    );
    assert_eq!(counted, placed as f64);
    reads.extend(with_tool);
    let read: u64 = reads.iter().sum();
    let saved = reads.iter().map(|r| r * 27 / 10).sum::<u64>() as f64;
    let by_model = [("model", MODEL)];
    e.wait_for_metric(
        "llm_filter_prompt_cache_saved_micros_total",
        &by_model,
        saved,
        Duration::from_secs(5),
    );
    assert!(saved > 0.0);
    assert_eq!(
        e.metric("llm_filter_prompt_cache_saved_micros_total", &by_model),
        saved
    );
    assert_eq!(
        e.metric(
            "gen_ai_client_token_usage_total",
            &[("model", MODEL), ("token_type", "cached_input")]
        ),
        read as f64
    );
    let premium = e.metric(
        "llm_filter_prompt_cache_write_premium_micros_total",
        &by_model,
    );
    println!("saved {saved} µ$, writes' premium {premium} µ$ ({read} tokens read)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_own_markers_and_a_short_prompt_leave_as_they_came() {
    if skip_without_envoy("a_clients_own_markers_and_a_short_prompt_leave_as_they_came") {
        return;
    }
    let (mock, e) =
        start(json!({"routing": {"prompt_cache": {"claude-*": {"min_prefix_tokens": MOCK_MIN}}}}));
    // The client marked its instructions: that one marker, every turn.
    let system = long_system();
    let out = converse(&e, MODEL, &system, 1, 3, &["--client-marker"]).await;
    assert_eq!(out["error"], Value::Null, "{out}");
    let sent = mock.requests();
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(|r| markers(r) == ["system"]), "{sent:?}");
    // Its later turns read the instructions it cached.
    let (_, reads) = read_share(&out);
    assert_eq!(reads, [0, 600, 600]);
    // A prompt below the threshold: no marker.
    let out = converse(&e, MODEL, "Be brief.", 1, 3, &[]).await;
    assert_eq!(out["error"], Value::Null, "{out}");
    assert!(mock
        .requests()
        .iter()
        .skip(3)
        .all(|r| markers(r).is_empty()));
    // Five markers of the client's own: never thinned, so the provider's
    // 400 reaches the client in Anthropic's words.
    let block =
        |t: &str| json!({"type": "text", "text": t, "cache_control": {"type": "ephemeral"}});
    let five = json!({"model": MODEL, "max_tokens": 16,
        "system": [block(&system), block("b")],
        "messages": [{"role": "user", "content": [block("c"), block("d"), block("e")]}]});
    let r = post_json(
        &e.url("/v1/messages"),
        &five,
        &[("anthropic-version", "2023-06-01")],
    )
    .await
    .expect("a call");
    assert_eq!(r.status, 400);
    let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
    assert_eq!(
        body["error"]["message"],
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    );
    assert_eq!(
        e.metric("llm_filter_prompt_cache_markers_total", &[("model", MODEL)]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_call_gets_its_tenants_and_conversations_prompt_cache_key() {
    if skip_without_envoy("an_openai_call_gets_its_tenants_and_conversations_prompt_cache_key") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("mock"));
    let e = EnvoyBuilder::new()
        .plugin_config(json!({"routing": {"models": {
            "gpt-4o": [{"cluster": "mock", "prompt_cache_key": true}]}}}))
        .upstream("mock", mock.port())
        .header_route("x-llm-cluster")
        .start()
        .expect("envoy with the filter");
    let url = e.url("/v1");
    // Each key is a tenant (the default: the credential's digest).
    let mut keys = Vec::new();
    for (api_key, turns) in [("sk-team-a", "0"), ("sk-team-a", "3"), ("sk-team-b", "0")] {
        let out = run(
            OPENAI,
            "chat",
            &url,
            &["--model", "gpt-4o", "--api-key", api_key, "--turns", turns],
        )
        .await;
        assert!(out["content"].is_string(), "{out}");
        // The last chat call (routing's probes of the backend come between).
        let r = mock
            .requests()
            .into_iter()
            .rfind(|r| r.path == "/v1/chat/completions")
            .expect("the call reached the mock");
        let key = r.json().unwrap_or_default()["prompt_cache_key"]
            .as_str()
            .expect("a prompt_cache_key upstream")
            .to_string();
        // The key routing placed the call by is the key the provider got.
        assert_eq!(r.header("x-llm-affinity"), Some(key.as_str()));
        assert!(!key.contains("team") && !key.contains("sk-"), "{key}");
        keys.push(key);
    }
    assert_eq!(keys[0], keys[1], "one tenant's conversation keeps its key");
    assert_ne!(keys[0], keys[2], "two tenants never share one");
    // A Responses call gets one too.
    let out = run(
        OPENAI,
        "responses",
        &url,
        &["--model", "gpt-4o", "--api-key", "sk-team-a"],
    )
    .await;
    assert_eq!(out["status"], "completed", "{out}");
    let r = mock
        .requests()
        .into_iter()
        .rfind(|r| r.path == "/v1/responses")
        .expect("the Responses call reached the mock");
    let key = r.json().unwrap_or_default()["prompt_cache_key"].clone();
    assert!(key.as_str().is_some_and(|k| k.len() == 16), "{key}");
    let stats = e.prometheus().unwrap();
    assert!(!stats.contains("sk-team-a") && !stats.contains("sk-team-b"));
}
