//! A guardrail service asked through the real Envoy, each preset against a
//! mock that speaks its service's published API and refuses any other
//! shape: a flagged prompt is refused in the caller's shape before anything
//! reaches the provider (the official SDKs see their typed error), a
//! masking service's texts are what the provider gets, a slow service lets
//! the call go on or refuses it as `on_error` says, and no planted value
//! shows up anywhere Envoy or the filter writes.

use llm_filter_e2e::{
    post_json, skip_without_envoy, Canned, Envoy, EnvoyBuilder, MockConfig, MockUpstream, Script,
};
use serde_json::{json, Value};

use llm_filter_e2e::mock::guardrail::FLAG;

use crate::support::sdk::{run, ANTHROPIC, OPENAI};
use crate::support::secrets::Outputs;

const MAIL: &str = "planted.guard-service@example.com";

/// An Envoy whose filter asks `service` (on the `guard` cluster, the
/// `guard` mock) about every prompt; `provider` answers the calls.
fn envoy(provider: &MockUpstream, guard: &MockUpstream, service: Value) -> Envoy {
    // The provider first: Envoy's default route goes to the first upstream.
    EnvoyBuilder::new()
        .upstream("provider", provider.port())
        .upstream("guard", guard.port())
        .plugin_config(json!({"guardrails": {"service": service}}))
        .start()
        .expect("envoy with a guardrail service")
}

fn chat(content: &str) -> Value {
    json!({"model": "gpt-4o", "messages": [{"role": "user", "content": content}]})
}

/// The texts the service was asked about, each request's.
fn asked(guard: &MockUpstream) -> Vec<Value> {
    guard.requests().iter().filter_map(|r| r.json()).collect()
}

/// The OpenAI and the Anthropic SDK (`prompt` as its `flag`) both see
/// `prompt` refused by the service `moderation` as their typed error,
/// whose message says `what` of the call did not pass.
async fn sdks_see_it_blocked(envoy: &Envoy, prompt: &str, flag: &str, what: &str) {
    let out = run(
        OPENAI,
        "chat_error",
        &envoy.url("/v1"),
        &["--prompt", prompt],
    )
    .await;
    assert_eq!(out["error_class"], "BadRequestError", "{out}");
    assert_eq!(out["code"], "llm_filter_guardrail_blocked", "{out}");
    let message = out["message"].as_str().unwrap();
    assert!(
        message.contains("`moderation`") && message.contains(what),
        "{message}"
    );
    let out = run(ANTHROPIC, "messages_error", &envoy.url(""), &[flag, prompt]).await;
    assert_eq!(out["error_class"], "BadRequestError", "{out}");
    assert_eq!(out["type"], "invalid_request_error", "{out}");
}

#[tokio::test]
async fn a_moderation_service_refuses_a_flagged_prompt_for_the_sdks() {
    if skip_without_envoy("a_moderation_service_refuses_a_flagged_prompt_for_the_sdks") {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    let envoy = envoy(
        &provider,
        &guard,
        json!({"name": "moderation", "preset": "openai_moderation", "cluster": "guard",
               "headers": {"authorization": "Bearer sk-moderation-PLANTED"}}),
    );

    // A clean prompt: asked about, then sent on.
    let out = run(
        OPENAI,
        "chat",
        &envoy.url("/v1"),
        &["--prompt", "hello there"],
    )
    .await;
    assert!(out["content"].is_string(), "{out}");
    let [question] = asked(&guard).try_into().unwrap();
    assert_eq!(question["model"], "omni-moderation-latest");
    assert_eq!(question["input"], json!(["hello there"]));
    assert_eq!(
        guard.last_request().unwrap().header("authorization"),
        Some("Bearer sk-moderation-PLANTED")
    );
    assert_eq!(provider.request_count(), 1);

    // Flagged: the OpenAI SDK raises BadRequestError, the Anthropic SDK
    // its own; the provider got nothing.
    let prompt = format!("tell me about {FLAG}");
    sdks_see_it_blocked(&envoy, &prompt, "--system", "nothing was sent").await;
    assert_eq!(
        provider.request_count(),
        1,
        "nothing more reached the provider"
    );
    // The Messages call's system prompt was asked about too.
    let last = asked(&guard).pop().unwrap();
    assert!(last["input"].to_string().contains(FLAG), "{last}");
    for api in ["chat", "messages"] {
        assert_eq!(
            envoy.metric(
                "llm_filter_guardrail_fired_total",
                &[("rule", "moderation"), ("action", "block"), ("api", api)]
            ),
            1.0,
            "{api}"
        );
    }
    assert!(envoy
        .prometheus()
        .unwrap()
        .contains("llm_filter_guardrail_service_duration_ms"));
}

#[tokio::test]
async fn a_masking_service_s_texts_are_what_the_provider_gets_and_leak_nowhere() {
    if skip_without_envoy("a_masking_service_s_texts_are_what_the_provider_gets_and_leak_nowhere") {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let config = outputs.config(json!({"guardrails": {"service": {
        "name": "presidio", "preset": "webhook", "cluster": "guard", "action": "mask"}}}));
    let envoy = outputs
        .envoy(
            EnvoyBuilder::new()
                .upstream("provider", provider.port())
                .upstream("guard", guard.port()),
        )
        .plugin_config(config)
        .component_log_level("wasm:debug")
        .start()
        .expect("envoy with a masking service");
    let prompt = format!("write to {MAIL} today");
    let out = run(
        ANTHROPIC,
        "messages",
        &envoy.url(""),
        &["--prompt", &prompt],
    )
    .await;
    assert!(out.get("error_class").is_none_or(Value::is_null), "{out}");
    let sent = provider.last_request().unwrap().json().unwrap();
    assert_eq!(
        sent["messages"][0]["content"], "write to <EMAIL_ADDRESS> today",
        "{sent}"
    );
    let out = run(OPENAI, "chat", &envoy.url("/v1"), &["--prompt", &prompt]).await;
    assert!(out["content"].is_string(), "{out}");
    let sent = provider.last_request().unwrap().json().unwrap();
    assert_eq!(
        sent["messages"][0]["content"], "write to <EMAIL_ADDRESS> today",
        "{sent}"
    );
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_fired_total",
            &[
                ("rule", "presidio"),
                ("action", "mask"),
                ("api", "messages")
            ]
        ),
        1.0
    );
    for r in provider.requests() {
        assert!(!String::from_utf8_lossy(&r.body).contains("planted.guard"));
    }
    outputs
        .assert_none_of(&envoy, &["planted.guard-service"])
        .await;
}

#[tokio::test]
async fn azure_and_bedrock_are_asked_in_their_own_shapes() {
    if skip_without_envoy("azure_and_bedrock_are_asked_in_their_own_shapes") {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    let url_of = |e: &Envoy| e.url("/v1/chat/completions");

    let azure = envoy(
        &provider,
        &guard,
        json!({"preset": "azure_content_safety", "cluster": "guard",
               "headers": {"Ocp-Apim-Subscription-Key": "azure-cs-key"}}),
    );
    let ok = post_json(&url_of(&azure), &cacheable("fine text"), &[])
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{}", ok.text());
    let r = guard.last_request().unwrap();
    assert_eq!(r.query.as_deref(), Some("api-version=2024-09-01"));
    assert_eq!(r.json().unwrap()["text"], "fine text");
    let refused = post_json(&url_of(&azure), &chat(&format!("{FLAG} now")), &[])
        .await
        .unwrap();
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("llm_filter_guardrail_blocked"));
    drop(azure);

    let bedrock = envoy(
        &provider,
        &guard,
        json!({"name": "bedrock", "preset": "bedrock_guardrail", "cluster": "guard",
               "guardrail_id": "gr0mesh1", "guardrail_version": "2", "action": "mask"}),
    );
    let before = provider.request_count();
    let ok = post_json(
        &url_of(&bedrock),
        &chat(&format!("mail {MAIL} please")),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(ok.status, 200, "{}", ok.text());
    let r = guard.last_request().unwrap();
    assert_eq!(r.path, "/guardrail/gr0mesh1/version/2/apply");
    assert_eq!(
        r.json().unwrap(),
        json!({"source": "INPUT", "content": [{"text": {"text": format!("mail {MAIL} please")}}]})
    );
    let sent = provider.last_request().unwrap().json().unwrap();
    assert_eq!(sent["messages"][0]["content"], "mail {EMAIL} please");
    assert_eq!(provider.request_count(), before + 1);
    // A guardrail that blocks (its content filter's action `BLOCKED`)
    // refuses the call even where it would mask: nothing is sent.
    let blocked = post_json(&url_of(&bedrock), &chat(&format!("{FLAG} and more")), &[])
        .await
        .unwrap();
    assert_eq!(blocked.status, 400, "{}", blocked.text());
    assert!(blocked.text().contains("`bedrock`"), "{}", blocked.text());
    assert_eq!(provider.request_count(), before + 1);
}

#[tokio::test]
async fn a_slow_service_lets_the_call_go_on_or_refuses_it_as_on_error_says() {
    if skip_without_envoy("a_slow_service_lets_the_call_go_on_or_refuses_it_as_on_error_says") {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    guard.set_default_delay_ms(1_500);
    for (on_error, status) in [("allow", 200), ("refuse", 503)] {
        let envoy = envoy(
            &provider,
            &guard,
            json!({"name": "slow", "preset": "webhook", "cluster": "guard",
                   "timeout_ms": 200, "on_error": on_error}),
        );
        let before = provider.request_count();
        let started = std::time::Instant::now();
        let r = post_json(&envoy.url("/v1/chat/completions"), &chat("hello"), &[])
            .await
            .unwrap();
        let waited = started.elapsed();
        assert_eq!(r.status, status, "{on_error}: {}", r.text());
        assert!(waited.as_millis() < 1_400, "{on_error}: waited {waited:?}");
        let reached = provider.request_count() - before;
        assert_eq!(reached, usize::from(status == 200), "{on_error}");
        if status == 503 {
            assert!(
                r.text().contains("llm_filter_guardrail_unavailable"),
                "{}",
                r.text()
            );
        }
        let result = if status == 200 { "allowed" } else { "refused" };
        assert_eq!(
            envoy.metric(
                "llm_filter_guardrail_service_failures_total",
                &[
                    ("rule", "slow"),
                    ("reason", "timeout"),
                    ("result", result),
                    ("api", "chat")
                ]
            ),
            1.0,
            "{on_error}"
        );
    }
}

/// A service asked in parallel (`mode`), of `delay_ms`, in an Envoy with
/// the cache on.
fn alongside(provider: &MockUpstream, guard: &MockUpstream, mode: &str) -> Envoy {
    EnvoyBuilder::new()
        .upstream("provider", provider.port())
        .upstream("guard", guard.port())
        .plugin_config(json!({
            "cache": {"max_entries": 64},
            "guardrails": {"service": {"name": "moderation", "preset": "webhook",
                "cluster": "guard", "mode": mode, "timeout_ms": 2_000}}}))
        .start()
        .expect("envoy with a guardrail service")
}

/// A chat call the cache keeps.
fn cacheable(content: &str) -> Value {
    let mut call = chat(content);
    call["temperature"] = json!(0);
    call
}

/// The median of `samples`, ms.
fn median(mut samples: Vec<u128>) -> u128 {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

#[tokio::test]
async fn in_parallel_an_allowed_call_saves_the_services_time() {
    if skip_without_envoy("in_parallel_an_allowed_call_saves_the_services_time") {
        return;
    }
    const SERVICE_MS: u64 = 150;
    const UPSTREAM_MS: u64 = 150;
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    provider.set_default_delay_ms(UPSTREAM_MS);
    guard.set_default_delay_ms(SERVICE_MS);
    let mut took = Vec::new();
    for mode in ["before", "parallel"] {
        let envoy = alongside(&provider, &guard, mode);
        let mut samples = Vec::new();
        for i in 0..6 {
            let started = std::time::Instant::now();
            let r = post_json(
                &envoy.url("/v1/chat/completions"),
                &cacheable(&format!("hello {mode} {i}")),
                &[],
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "{mode}: {}", r.text());
            assert_eq!(r.header("x-cache"), Some("MISS"), "{mode}");
            // The first warms the connections.
            if i > 0 {
                samples.push(started.elapsed().as_millis());
            }
        }
        took.push(median(samples));
    }
    let [before, parallel] = took[..] else {
        unreachable!()
    };
    eprintln!(
        "guardrail service {SERVICE_MS} ms, upstream {UPSTREAM_MS} ms: `before` {before} ms, \
         `parallel` {parallel} ms (median of 5 calls)"
    );
    assert!(
        before >= 290,
        "before: the service, then the upstream: {before} ms"
    );
    assert!(
        (150..250).contains(&parallel),
        "parallel: the longer of the two: {parallel} ms"
    );
    assert_eq!(guard.request_count(), 12, "every call was asked about");
}

#[tokio::test]
async fn in_parallel_a_flagged_call_gets_the_refusal_and_nothing_of_its_answer() {
    if skip_without_envoy("in_parallel_a_flagged_call_gets_the_refusal_and_nothing_of_its_answer") {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    let envoy = alongside(&provider, &guard, "parallel");
    let prompt = format!("tell me about {FLAG}");
    // The verdict after the answer came (held, then refused), and before
    // (the call already at the provider).
    for (service_ms, upstream_ms) in [(300, 0), (100, 400)] {
        guard.set_default_delay_ms(service_ms);
        provider.set_default_delay_ms(upstream_ms);
        let before = provider.request_count();
        sdks_see_it_blocked(&envoy, &prompt, "--prompt", "answer was withheld").await;
        // A stream: the refusal in place of the whole answer, no event.
        let mut streamed = cacheable(&prompt);
        streamed["stream"] = json!(true);
        let r = post_json(&envoy.url("/v1/chat/completions"), &streamed, &[])
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(!r.text().contains("data:"), "{}", r.text());
        assert!(r.text().contains("llm_filter_guardrail_blocked"));
        // A call the cache keeps, twice: refused each time, and the
        // prompt reached the provider each time (that is the trade): no
        // answer of a refused call was stored.
        for _ in 0..2 {
            let r = post_json(&envoy.url("/v1/chat/completions"), &cacheable(&prompt), &[])
                .await
                .unwrap();
            assert_eq!(r.status, 400, "{}", r.text());
            assert_eq!(r.header("x-cache"), Some("MISS"));
        }
        assert_eq!(
            provider.request_count() - before,
            5,
            "{service_ms} ms / {upstream_ms} ms"
        );
    }
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_fired_total",
            &[("rule", "moderation"), ("action", "block"), ("api", "chat")]
        ),
        8.0
    );
}

#[tokio::test]
async fn in_parallel_an_allowed_answer_passes_whole_and_its_entry_waits_for_a_verdict() {
    if skip_without_envoy(
        "in_parallel_an_allowed_answer_passes_whole_and_its_entry_waits_for_a_verdict",
    ) {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    let envoy = alongside(&provider, &guard, "parallel");
    // A stream whose events (50 ms apart) began before the verdict and
    // go on after it, and one the verdict came before: the same events.
    let mut streams = Vec::new();
    for service_ms in [250, 0] {
        guard.set_default_delay_ms(service_ms);
        let out = run(
            OPENAI,
            "stream",
            &envoy.url("/v1"),
            &["--prompt", "count to ten"],
        )
        .await;
        let chunks = out["chunks"].as_array().unwrap().clone();
        assert!(chunks.len() > 4, "{out}");
        let first_ms = chunks[0]["at_ms"].as_u64().unwrap();
        assert!(
            service_ms == 0 || first_ms >= service_ms,
            "held until the verdict: {first_ms} ms"
        );
        assert!(
            chunks.last().unwrap()["usage"].is_object(),
            "the usage it asked for: {out}"
        );
        streams.push((out["content"].clone(), chunks.len()));
        // The filter read the held stream's usage as it passed.
        let output = envoy.metric(
            "gen_ai_client_token_usage_total",
            &[
                ("model", "gpt-4o-mini"),
                ("token_type", "output"),
                ("api", "chat"),
            ],
        );
        assert!(output > 0.0, "{service_ms} ms: {output}");
    }
    assert_eq!(streams[0], streams[1], "nothing lost or doubled");
    // A JSON answer held, then stored; the same call again is the cache's,
    // held for its own verdict.
    guard.set_default_delay_ms(200);
    let first = post_json(
        &envoy.url("/v1/chat/completions"),
        &cacheable("fine text"),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    let asked = guard.request_count();
    let reached = provider.request_count();
    let started = std::time::Instant::now();
    let hit = post_json(
        &envoy.url("/v1/chat/completions"),
        &cacheable("fine text"),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(hit.header("x-cache"), Some("HIT"));
    assert_eq!(hit.text(), first.text());
    assert!(started.elapsed().as_millis() >= 200, "the hit waited");
    assert_eq!(guard.request_count(), asked + 1);
    assert_eq!(provider.request_count(), reached);
}

/// An Envoy with `outputs` on, whose filter runs `config` (with the
/// outputs' own settings), `provider` answering the calls and `guard` the
/// service.
fn observed(
    outputs: &Outputs,
    provider: &MockUpstream,
    guard: &MockUpstream,
    config: Value,
) -> Envoy {
    outputs
        .envoy(
            EnvoyBuilder::new()
                .upstream("provider", provider.port())
                .upstream("guard", guard.port()),
        )
        .plugin_config(outputs.config(config))
        .start()
        .expect("envoy with a guardrail service and its outputs")
}

/// Envoy's buffer of a stream (the listener's default), bytes, and what
/// the filter holds of an answer (at most that).
const ENVOY_BUFFER: usize = 1 << 20;
const HELD: usize = 256 << 10;
/// A value of the prompts that must show up nowhere.
const PLANTED: &str = "planted-long-answer-0x5eed";

/// A chat answer of `words` words as a provider sends it: all but its
/// last 200 bytes (longer than is held) in pieces of 16 KiB (a TLS
/// record's), 1 ms apart, then those `end_after_ms` later; and its text.
fn long_answer(words: usize, end_after_ms: u64) -> (String, Vec<(u64, String)>) {
    let text = "word ".repeat(words);
    let answer = json!({"id": "chatcmpl-long", "object": "chat.completion", "created": 7,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": words, "total_tokens": words + 5}})
    .to_string();
    let (head, tail) = answer.split_at(answer.len() - 200);
    let mut pieces: Vec<(u64, String)> = head
        .as_bytes()
        .chunks(16 << 10)
        .map(|c| (1, String::from_utf8(c.to_vec()).unwrap()))
        .collect();
    pieces.push((end_after_ms, tail.to_string()));
    (text, pieces)
}

/// In parallel, an answer longer than Envoy's buffer that begins before the
/// verdict: allowed, the client gets it whole, as it came; refused, the
/// client's stream is cut before its end, so the SDK raises an error rather
/// than take part of it for the answer. Whether its end came before the
/// verdict or after. Envoy itself never answers (a plain 500, before).
#[tokio::test]
async fn in_parallel_an_answer_longer_than_the_buffer_is_whole_or_cut_by_the_verdict() {
    if skip_without_envoy(
        "in_parallel_an_answer_longer_than_the_buffer_is_whole_or_cut_by_the_verdict",
    ) {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let config = json!({
        "max_body_bytes": HELD,
        "cache": {"max_entries": 64},
        "guardrails": {"service": {"name": "moderation", "preset": "webhook",
            "cluster": "guard", "mode": "parallel", "timeout_ms": 3_000}}});
    let envoy = observed(&outputs, &provider, &guard, config);
    // Half as long again as Envoy's buffer.
    let words = 3 * ENVOY_BUFFER / 10;
    // The verdict after the answer's end came, and before it.
    for (service_ms, end_after_ms) in [(700, 250), (250, 700)] {
        guard.set_default_delay_ms(service_ms);
        let (text, pieces) = long_answer(words, end_after_ms);
        provider.push_script(Script {
            answer: Some(Canned::Paced("application/json", pieces.clone())),
            ..Script::default()
        });
        let prompt = format!("write about {PLANTED} at length");
        let out = run(OPENAI, "chat", &envoy.url("/v1"), &["--prompt", &prompt]).await;
        assert_eq!(
            out["content"].as_str().map(str::len),
            Some(text.len()),
            "allowed, whole: {service_ms} ms / {end_after_ms} ms"
        );
        provider.push_script(Script {
            answer: Some(Canned::Paced("application/json", pieces)),
            ..Script::default()
        });
        let flagged = format!("write about {PLANTED} and {FLAG} at length");
        let out = run(
            OPENAI,
            "chat_error",
            &envoy.url("/v1"),
            &["--prompt", &flagged],
        )
        .await;
        assert_eq!(
            out["error_class"], "APIConnectionError",
            "refused, cut: {service_ms} ms / {end_after_ms} ms: {out}"
        );
        assert_eq!(out["attempts"].as_array().map(Vec::len), Some(1), "{out}");
    }
    let cut = envoy.metric(
        "llm_filter_guardrail_answer_cut_total",
        &[("rule", "moderation"), ("api", "chat")],
    );
    assert_eq!(cut, 2.0);
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_fired_total",
            &[("rule", "moderation"), ("action", "block"), ("api", "chat")]
        ),
        2.0
    );
    let too_large: u64 = envoy
        .stats_matching("rs_too_large")
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(too_large, 0, "Envoy never refused to buffer the answer");
    assert_eq!(provider.request_count(), 4);
    assert_eq!(guard.request_count(), 4);
    let records = outputs.records();
    assert_eq!(
        records.matches("moderation:block,moderation:cut").count(),
        2,
        "{records}"
    );
    outputs.assert_none_of(&envoy, &[PLANTED]).await;
}

/// In parallel, a stream longer than is held whose final event comes
/// before the end of the response (its last frame empty, 800 ms later),
/// with the verdict in between: the final event is kept back for the
/// verdict, so a flagged call's client never reads `[DONE]` (its stream is
/// cut), and a passed one reads every byte, `[DONE]` once and last.
#[tokio::test]
async fn in_parallel_a_released_streams_final_event_waits_for_the_verdict() {
    if skip_without_envoy("in_parallel_a_released_streams_final_event_waits_for_the_verdict") {
        return;
    }
    use futures_util::StreamExt;

    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    guard.set_default_delay_ms(400);
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let config = json!({
        "max_body_bytes": HELD,
        "guardrails": {"service": {"name": "moderation", "preset": "webhook",
            "cluster": "guard", "mode": "parallel", "timeout_ms": 3_000}}});
    let envoy = observed(&outputs, &provider, &guard, config);
    // 20 events of about 16 KiB, more than is held, then the final event,
    // then the end of the response 800 ms later.
    let event = format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 7,
               "model": "gpt-4o-mini",
               "choices": [{"index": 0, "delta": {"content": "word ".repeat(3200)}}]})
    );
    let mut pieces: Vec<(u64, String)> = (0..20).map(|_| (1, event.clone())).collect();
    pieces.push((1, "data: [DONE]\n\n".to_string()));
    pieces.push((800, String::new()));
    let whole: String = pieces.iter().map(|(_, p)| p.as_str()).collect();
    for flagged in [true, false] {
        provider.push_script(Script {
            answer: Some(Canned::Paced("text/event-stream", pieces.clone())),
            ..Script::default()
        });
        let prompt = match flagged {
            true => format!("stream about {PLANTED} and {FLAG}"),
            false => format!("stream about {PLANTED}"),
        };
        let body = with_stream(&prompt);
        let response = llm_filter_e2e::http_client()
            .post(envoy.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("the stream's head");
        assert_eq!(response.status(), 200);
        let mut got = Vec::new();
        let mut cut = false;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => got.extend_from_slice(&bytes),
                Err(_) => {
                    cut = true;
                    break;
                }
            }
        }
        let got = String::from_utf8_lossy(&got).to_string();
        if flagged {
            assert!(
                !got.contains("[DONE]"),
                "the final event reached the client"
            );
            assert!(
                cut || got.contains("llm_filter_guardrail_answer_blocked"),
                "neither cut nor ended by the error event"
            );
        } else {
            assert!(!cut, "a passed stream was cut");
            assert_eq!(got.len(), whole.len());
            assert!(got == whole, "not every byte once, in order");
        }
    }
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_answer_cut_total",
            &[("rule", "moderation"), ("api", "chat")],
        ),
        1.0
    );
    outputs.assert_none_of(&envoy, &[PLANTED]).await;
}

/// A streamed chat call's body, the client asking for no usage.
fn with_stream(prompt: &str) -> Value {
    json!({"model": "gpt-4o-mini", "stream": true,
           "messages": [{"role": "user", "content": prompt}]})
}

/// In parallel, a call a limit refuses while its verdict is pending gets
/// the 429 at once (the SDK's `RateLimitError`), and its record says the
/// verdict was pending; the verdict that comes later sends nothing more.
#[tokio::test]
async fn in_parallel_a_call_refused_here_is_recorded_with_its_verdict_pending() {
    if skip_without_envoy("in_parallel_a_call_refused_here_is_recorded_with_its_verdict_pending") {
        return;
    }
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    guard.set_default_delay_ms(400);
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    // The SDK's key names the tenant.
    let config = json!({
        "limits": {"rules": [{"name": "one", "by": ["tenant"], "requests_per_minute": 1}]},
        "guardrails": {"service": {"name": "moderation", "preset": "webhook",
            "cluster": "guard", "mode": "parallel", "timeout_ms": 2_000}}});
    let envoy = observed(&outputs, &provider, &guard, config);
    let first = run(OPENAI, "chat", &envoy.url("/v1"), &["--prompt", PLANTED]).await;
    assert!(first["content"].is_string(), "{first}");
    let out = run(
        OPENAI,
        "chat_error",
        &envoy.url("/v1"),
        &["--prompt", &format!("{PLANTED} {FLAG}")],
    )
    .await;
    assert_eq!(out["error_class"], "RateLimitError", "{out}");
    assert!(
        out["elapsed_ms"].as_u64().unwrap() < 400,
        "not held for the verdict: {out}"
    );
    // The verdict comes; nothing reads it.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(guard.request_count(), 2, "both were asked about");
    assert_eq!(provider.request_count(), 1, "the refused one never left");
    let records = outputs.records();
    assert_eq!(
        records.matches("moderation:pending").count(),
        1,
        "{records}"
    );
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_fired_total",
            &[("rule", "moderation"), ("action", "block"), ("api", "chat")]
        ),
        0.0
    );
    outputs.assert_none_of(&envoy, &[PLANTED]).await;
}

/// A service asked about answers is not asked about another backend's
/// answer after a failover (the reply would wait for a callout of its
/// own): it is an answer without a verdict, counted, and what `on_error`
/// says — `allow` lets it go, `refuse` sends the 502 in its place, which
/// the OpenAI SDK raises as `InternalServerError`, never retried.
#[tokio::test]
async fn another_backends_answer_after_a_failover_falls_under_on_error() {
    if skip_without_envoy("another_backends_answer_after_a_failover_falls_under_on_error") {
        return;
    }
    for on_error in ["allow", "refuse"] {
        let a = MockUpstream::start(MockConfig::named("a"));
        let b = MockUpstream::start(MockConfig::named("b"));
        let guard = MockUpstream::start(MockConfig::named("guard"));
        a.set_status(Some(503));
        let envoy = EnvoyBuilder::new()
            .plugin_config(json!({
                "routing": {"models": {"gpt-4o": [
                    {"cluster": "a", "weight": 1_000_000}, {"cluster": "b", "weight": 1}]}},
                "guardrails": {"service": {"name": "moderation", "preset": "webhook",
                    "cluster": "guard", "on": "answer", "on_error": on_error}}}))
            .upstream("a", a.port())
            .upstream("b", b.port())
            .upstream("guard", guard.port())
            .header_route("x-llm-cluster")
            .route_timeout_ms(30_000)
            .start()
            .expect("envoy with two backends and a service on answers");
        let args = ["--model", "gpt-4o", "--prompt", PLANTED];
        let result = match on_error {
            "allow" => {
                let out = run(OPENAI, "chat", &envoy.url("/v1"), &args).await;
                assert!(out["content"].is_string(), "{out}");
                "allowed"
            }
            _ => {
                let out = run(OPENAI, "chat_error", &envoy.url("/v1"), &args).await;
                assert_eq!(out["error_class"], "InternalServerError", "{out}");
                assert_eq!(out["code"], "llm_filter_guardrail_answer_blocked", "{out}");
                assert_eq!(out["attempts"].as_array().map(Vec::len), Some(1), "{out}");
                "refused"
            }
        };
        assert_eq!((a.request_count(), b.request_count()), (1, 1), "{on_error}");
        assert_eq!(guard.request_count(), 0, "{on_error}: not asked");
        assert_eq!(
            envoy.metric(
                "llm_filter_guardrail_service_failures_total",
                &[
                    ("rule", "moderation"),
                    ("reason", "failover"),
                    ("result", result),
                    ("api", "chat")
                ]
            ),
            1.0,
            "{on_error}"
        );
    }
}

/// Presidio's webhook glue (examples/guardrails/presidio_webhook.py) on a
/// free port, in the venv `make presidio` builds; `None`, saying why, when
/// Presidio is not installed.
async fn presidio() -> Option<(tokio::process::Child, u16)> {
    use tokio::io::AsyncBufReadExt;
    let root = llm_filter_e2e::workspace_root();
    let python = std::env::var_os("LLM_FILTER_PRESIDIO_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target/presidio/bin/python"));
    if !python.exists() {
        eprintln!("skipping: Presidio is not installed (`make presidio`)");
        return None;
    }
    let mut child = tokio::process::Command::new(python)
        .arg(root.join("examples/guardrails/presidio_webhook.py"))
        .args(["--port", "0"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let first = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::io::BufReader::new(stdout).lines().next_line(),
    )
    .await
    .expect("Presidio starts within a minute")
    .unwrap();
    let Some(line) = first else {
        // It said why on stderr (exit 3: the packages are missing).
        eprintln!(
            "skipping: Presidio's glue did not start: {:?}",
            child.wait().await
        );
        return None;
    };
    let port: Value = serde_json::from_str(&line).unwrap();
    Some((child, port["port"].as_u64().unwrap().try_into().unwrap()))
}

#[tokio::test]
async fn presidio_as_the_webhook_masks_what_its_recognizers_find() {
    if skip_without_envoy("presidio_as_the_webhook_masks_what_its_recognizers_find") {
        return;
    }
    let Some((_presidio, port)) = presidio().await else {
        return;
    };
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let config = outputs.config(json!({"guardrails": {"service": {
        "name": "presidio", "preset": "webhook", "cluster": "presidio", "action": "mask",
        "timeout_ms": 2_000}}}));
    let envoy = outputs
        .envoy(
            EnvoyBuilder::new()
                .upstream("provider", provider.port())
                .upstream("presidio", port),
        )
        .plugin_config(config)
        .start()
        .expect("envoy with Presidio as its guardrail service");
    let card = "4111 1111 1111 1111";
    let prompt = format!("write to {MAIL} or call +1 212 555 0123 about card {card}");
    let out = run(OPENAI, "chat", &envoy.url("/v1"), &["--prompt", &prompt]).await;
    assert!(out["content"].is_string(), "{out}");
    let sent = provider.last_request().unwrap().json().unwrap();
    assert_eq!(
        sent["messages"][0]["content"],
        "write to <EMAIL_ADDRESS> or call <PHONE_NUMBER> about card <CREDIT_CARD>",
        "{sent}"
    );
    // A clean prompt leaves as it was.
    let out = run(
        ANTHROPIC,
        "messages",
        &envoy.url(""),
        &["--prompt", "what is a haiku"],
    )
    .await;
    assert!(out.get("error_class").is_none_or(Value::is_null), "{out}");
    let sent = provider.last_request().unwrap().json().unwrap();
    assert_eq!(sent["messages"][0]["content"], "what is a haiku");
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_fired_total",
            &[("rule", "presidio"), ("action", "mask"), ("api", "chat")]
        ),
        1.0
    );
    for r in provider.requests() {
        let body = String::from_utf8_lossy(&r.body);
        assert!(
            !body.contains("planted.guard") && !body.contains(card),
            "{body}"
        );
    }
    outputs
        .assert_none_of(&envoy, &["planted.guard-service", card])
        .await;
}

/// Asked about answers (`on`): a flagged JSON answer is refused with the
/// 502 the OpenAI SDK raises as its `InternalServerError`, not retried; a
/// masking service's texts are the answer the Anthropic SDK reads; the
/// service reads the answer's texts, never the prompt's masked values.
#[tokio::test]
async fn a_service_asked_about_answers_refuses_or_masks_them_for_the_sdks() {
    if skip_without_envoy("a_service_asked_about_answers_refuses_or_masks_them_for_the_sdks") {
        return;
    }
    use crate::guardrails::{answers, chat_json, messages_json};
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let guard = MockUpstream::start(MockConfig::named("guard"));
    let dir = tempfile::tempdir().unwrap();
    let outputs = Outputs::start(dir.path());
    let phones = json!({"name": "phones", "detect": ["phone"], "action": "mask", "restore": true});
    let start = |service: Value| {
        outputs
            .envoy(
                EnvoyBuilder::new()
                    .upstream("provider", provider.port())
                    .upstream("guard", guard.port()),
            )
            .plugin_config(outputs.config(json!({"guardrails": {
                "rules": [phones.clone()], "service": service}})))
            .component_log_level("wasm:debug")
            .start()
            .expect("envoy with a service asked about answers")
    };
    let envoy = start(
        json!({"name": "moderation", "preset": "webhook", "cluster": "guard",
                             "on": "answer", "timeout_ms": 2000}),
    );
    const PHONE: &str = "+14155550123";

    // Flagged: a 502, named, nothing of the answer; the SDK did not retry.
    answers(&provider, chat_json(&format!("call [PHONE_1]: {FLAG}")));
    let out = run(
        OPENAI,
        "chat_error",
        &envoy.url("/v1"),
        &[
            "--prompt",
            &format!("call me at {PHONE}"),
            "--max-retries",
            "2",
        ],
    )
    .await;
    assert_eq!(out["status"], 502, "{out}");
    assert_eq!(out["error_class"], "InternalServerError", "{out}");
    assert_eq!(out["code"], "llm_filter_guardrail_answer_blocked", "{out}");
    let message = out["message"].as_str().unwrap();
    assert!(
        message.contains("guardrail service `moderation`"),
        "{message}"
    );
    assert!(!out.to_string().contains(FLAG), "{out}");
    assert_eq!(provider.request_count(), 1, "not retried");
    // Only the answer was asked about, its placeholder and not the number.
    let [question] = asked(&guard).try_into().unwrap();
    assert_eq!(
        question,
        json!({"api": "chat", "source": "answer", "texts": [format!("call [PHONE_1]: {FLAG}")]})
    );
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_answer_fired_total",
            &[("rule", "moderation"), ("action", "block"), ("api", "chat")]
        ),
        1.0
    );
    // Passed: the client reads its own number back.
    answers(&provider, chat_json("I will call [PHONE_1]."));
    let out = run(
        OPENAI,
        "chat",
        &envoy.url("/v1"),
        &["--prompt", &format!("call me at {PHONE}")],
    )
    .await;
    assert_eq!(out["content"], format!("I will call {PHONE}."), "{out}");
    drop(envoy);

    // A masking service: its texts are what the client reads.
    let envoy = start(
        json!({"name": "presidio", "preset": "webhook", "cluster": "guard",
                             "on": "both", "action": "mask"}),
    );
    answers(
        &provider,
        messages_json(&format!("Sure: write to {MAIL} about [PHONE_1]")),
    );
    let out = run(
        ANTHROPIC,
        "messages",
        &envoy.url(""),
        &["--prompt", &format!("who do I mail? call me at {PHONE}")],
    )
    .await;
    assert!(out.get("error_class").is_none_or(Value::is_null), "{out}");
    assert_eq!(
        out["text"],
        format!("Sure: write to <EMAIL_ADDRESS> about {PHONE}"),
        "{out}"
    );
    assert_eq!(
        envoy.metric(
            "llm_filter_guardrail_answer_fired_total",
            &[
                ("rule", "presidio"),
                ("action", "mask"),
                ("api", "messages")
            ]
        ),
        1.0
    );
    let last = asked(&guard).pop().unwrap();
    assert_eq!(last["source"], "answer", "{last}");
    for r in provider.requests() {
        assert!(!String::from_utf8_lossy(&r.body).contains(PHONE));
    }
    for r in guard.requests() {
        assert!(!String::from_utf8_lossy(&r.body).contains(PHONE));
    }
    outputs
        .assert_none_of(&envoy, &[PHONE, "planted.guard-service"])
        .await;
}
