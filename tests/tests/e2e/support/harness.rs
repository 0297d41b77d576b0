//! Proves the harness itself: the mock answers like an OpenAI-compatible provider,
//! the OpenAI Responses API and the Anthropic Messages API, and plain Envoy (no filter) carries requests to it unchanged. Filter scenarios
//! build on these guarantees.

use std::time::Duration;

use llm_filter_e2e::mock::gunzip_stored;
use llm_filter_e2e::{
    chat_body, chat_stream_body, get, messages_body, post_json, post_raw, responses_body,
    skip_without_envoy, stream_sse, validate_config, EnvoyBuilder, MockConfig, MockUpstream,
    Script, SseResponse,
};
use serde_json::json;

#[tokio::test]
async fn mock_answers_chat_json() {
    let mock = MockUpstream::start(MockConfig::named("alpha"));
    let response = post_json(
        &mock.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "hello there"),
        &[("authorization", "Bearer sk-test"), ("x-multi", "one")],
    )
    .await
    .expect("chat call");

    assert_eq!(response.status, 200);
    assert_eq!(response.header("x-mock-instance"), Some("alpha"));
    let body = response.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "echo: hello there [alpha]"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let usage = &body["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );

    let recorded = mock.requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].method, "POST");
    assert_eq!(recorded[0].path, "/v1/chat/completions");
    assert_eq!(recorded[0].header("Authorization"), Some("Bearer sk-test"));
    assert_eq!(recorded[0].json().unwrap()["model"], "gpt-4o");
}

#[tokio::test]
async fn mock_streams_chat_sse_with_usage() {
    let mock = MockUpstream::start(MockConfig::named("beta"));
    mock.set_chunk_delay_ms(40);
    let sse = stream_sse(
        &mock.url("/v1/chat/completions"),
        &chat_stream_body("gpt-4o-mini", "stream me", true),
        &[],
    )
    .await
    .expect("stream call");

    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("content-type"), Some("text/event-stream"));
    assert!(sse.done(), "last event is [DONE]: {:?}", sse.events);
    let chunks = sse.chunks();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "gpt-4o-mini"));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(sse.usage(), Some(usage_chunk["usage"].clone()));
    assert_eq!(sse.content(), "echo: stream me [beta]");
    // Events were flushed one by one, a chunk delay apart (the bounds leave room
    // for a busy machine merging a few reads).
    let events = sse.events.len();
    assert!(events >= 6, "events: {events}");
    let spread = sse.events[events - 1].at - sse.events[0].at;
    assert!(
        spread >= Duration::from_millis(20 * (events as u64 - 1)),
        "spread {spread:?}"
    );
    let reads = sse.gaps().iter().filter(|g| !g.is_zero()).count() + 1;
    assert!(reads >= events / 2, "{reads} reads for {events} events");
    assert!(sse.trailing.is_empty());

    // Without include_usage there is no usage chunk.
    let sse = stream_sse(
        &mock.url("/v1/chat/completions"),
        &chat_stream_body("gpt-4o-mini", "no usage", false),
        &[("x-mock-chunk-delay-ms", "0")],
    )
    .await
    .expect("stream call");
    assert!(sse.done());
    assert_eq!(sse.usage(), None);
    assert!(sse.chunks().iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn mock_other_endpoints_and_errors() {
    let mock = MockUpstream::start(MockConfig::named("gamma"));

    let embeddings = post_json(
        &mock.url("/v1/embeddings"),
        &json!({"model": "text-embedding-3-small", "input": ["a b", "c"]}),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(embeddings.status, 200);
    let body = embeddings.json();
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    let again = post_json(
        &mock.url("/v1/embeddings"),
        &json!({"model": "text-embedding-3-small", "input": "a b"}),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        again.json()["data"][0]["embedding"],
        body["data"][0]["embedding"]
    );

    let completion = post_json(
        &mock.url("/v1/completions"),
        &json!({"model": "m", "prompt": "say x"}),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(completion.json()["object"], "text_completion");
    assert_eq!(
        completion.json()["choices"][0]["text"],
        "echo: say x [gamma]"
    );

    let stream = stream_sse(
        &mock.url("/v1/completions"),
        &json!({"model": "m", "prompt": "say y", "stream": true}),
        &[("x-mock-chunk-delay-ms", "0")],
    )
    .await
    .unwrap();
    assert!(stream.done());
    assert_eq!(stream.content(), "echo: say y [gamma]");

    assert_eq!(get(&mock.url("/health"), &[]).await.unwrap().text(), "ok");
    let models = get(&mock.url("/v1/models"), &[]).await.unwrap();
    assert_eq!(models.json()["object"], "list");

    let missing = get(&mock.url("/v2/nothing"), &[]).await.unwrap();
    assert_eq!(missing.status, 404);
    assert!(missing.json()["error"]["message"].is_string());

    let invalid = post_raw(&mock.url("/v1/chat/completions"), "{not json", &[])
        .await
        .unwrap();
    assert_eq!(invalid.status, 400);
    assert_eq!(invalid.json()["error"]["type"], "invalid_request_error");
    assert_eq!(mock.last_request().unwrap().body.as_ref(), b"{not json");
}

#[tokio::test]
async fn mock_is_scriptable() {
    let mock = MockUpstream::start(MockConfig::named("delta"));
    let url = mock.url("/v1/chat/completions");
    let body = chat_body("gpt-4o", "hi");

    let status = post_json(&url, &body, &[("x-mock-status", "503")])
        .await
        .unwrap();
    assert_eq!(status.status, 503);
    assert_eq!(status.json()["error"]["type"], "server_error");
    assert_eq!(status.header("x-mock-instance"), Some("delta"));

    let delayed = post_json(&url, &body, &[("x-mock-delay-ms", "150")])
        .await
        .unwrap();
    assert!(delayed.elapsed >= Duration::from_millis(150));

    let reset = post_json(&url, &body, &[("x-mock-reset", "1")]).await;
    assert!(reset.is_err(), "reset must not answer: {reset:?}");

    let retry = [("x-mock-fail-first", "2"), ("idempotency-key", "k-1")];
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(post_json(&url, &body, &retry).await.unwrap().status);
    }
    assert_eq!(statuses, [503, 503, 200]);

    mock.push_script(Script {
        status: Some(429),
        ..Script::default()
    });
    mock.push_script(Script {
        reset: true,
        ..Script::default()
    });
    assert_eq!(post_json(&url, &body, &[]).await.unwrap().status, 429);
    assert!(post_json(&url, &body, &[]).await.is_err());
    assert_eq!(post_json(&url, &body, &[]).await.unwrap().status, 200);

    mock.set_status(Some(500));
    assert_eq!(post_json(&url, &body, &[]).await.unwrap().status, 500);
    mock.set_status(None);

    mock.set_default_delay_ms(400);
    let slow = {
        let url = url.clone();
        let body = body.clone();
        tokio::spawn(async move { post_json(&url, &body, &[]).await })
    };
    assert!(mock.in_flight_reaches(1, Duration::from_secs(5)).await);
    assert_eq!(mock.in_flight(), 1);
    assert_eq!(slow.await.unwrap().unwrap().status, 200);
    assert_eq!(mock.in_flight(), 0);
    assert!(mock.peak_in_flight() >= 1);

    assert_eq!(mock.request_count(), 11);
    mock.clear();
    assert_eq!(mock.request_count(), 0);
}

#[test]
fn generated_configs_validate() {
    if skip_without_envoy("generated_configs_validate") {
        return;
    }
    let configs = [
        EnvoyBuilder::new().no_filter().upstream("mock", 9),
        EnvoyBuilder::new()
            .no_filter()
            .upstream("a", 9)
            .upstream("b", 10)
            .cluster_header(Some("x-llm-cluster"))
            .route_timeout_ms(2500)
            .extra_route_yaml("retry_policy:\n  retry_on: 5xx,reset\n  num_retries: 2"),
        EnvoyBuilder::new()
            .no_filter()
            .direct_response(200, "{\"quoted\": \"body\"}\n"),
    ];
    for builder in configs {
        let yaml = builder.config_yaml();
        validate_config(&yaml).unwrap_or_else(|e| panic!("{e:#}\n{yaml}"));
    }
}

#[tokio::test]
async fn plain_envoy_proxies_json_and_sse() {
    if skip_without_envoy("plain_envoy_proxies_json_and_sse") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("upstream-a"));
    let envoy = EnvoyBuilder::new()
        .no_filter()
        .upstream("mock_a", mock.port())
        .start()
        .expect("envoy start");

    let response = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "through envoy"),
        &[
            ("x-request-priority", "P1"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ],
    )
    .await
    .expect("proxied call");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-mock-instance"), Some("upstream-a"));
    assert_eq!(
        response.json()["choices"][0]["message"]["content"],
        "echo: through envoy [upstream-a]"
    );

    let recorded = mock.last_request().expect("mock saw the request");
    assert_eq!(recorded.path, "/v1/chat/completions");
    assert_eq!(recorded.header("x-request-priority"), Some("P1"));
    assert!(
        recorded.header("x-request-id").is_some(),
        "envoy adds x-request-id"
    );
    assert_eq!(
        recorded.json().unwrap(),
        chat_body("gpt-4o", "through envoy")
    );

    // Streaming keeps its pacing through Envoy: events are not buffered.
    let sse = stream_sse(
        &envoy.url("/v1/chat/completions"),
        &chat_stream_body("gpt-4o", "stream via envoy", true),
        &[("x-mock-chunk-delay-ms", "60")],
    )
    .await
    .expect("proxied stream");
    assert_eq!(sse.status, 200);
    assert!(sse.done());
    assert!(sse.usage().is_some());
    assert_eq!(sse.content(), "echo: stream via envoy [upstream-a]");
    let spread = sse.events.last().unwrap().at - sse.events[0].at;
    assert!(
        spread >= Duration::from_millis(300),
        "events bunched: {spread:?}"
    );

    // Mock failures surface as Envoy sees them.
    let reset = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "x"),
        &[("x-mock-reset", "1")],
    )
    .await
    .unwrap();
    assert_eq!(reset.status, 503);

    let stats = envoy.stats().expect("stats");
    assert_eq!(stats.get("cluster.mock_a.upstream_rq_200"), Some(&2));
    // Envoy counts a stream as completed when it tears it down, just after the last byte.
    let completed = envoy.wait_for_stat(
        "http.ingress.downstream_rq_completed",
        3,
        Duration::from_secs(2),
    );
    assert_eq!(completed, 3);
    assert!(envoy.prometheus().unwrap().contains(
        "envoy_cluster_upstream_rq{envoy_response_code=\"200\",envoy_cluster_name=\"mock_a\"} 2"
    ));
}

#[tokio::test]
async fn plain_envoy_routes_by_cluster_header() {
    if skip_without_envoy("plain_envoy_routes_by_cluster_header") {
        return;
    }
    let a = MockUpstream::start(MockConfig::named("a"));
    let b = MockUpstream::start(MockConfig::named("b"));
    let envoy = EnvoyBuilder::new()
        .no_filter()
        .concurrency(1)
        .upstream("mock_a", a.port())
        .upstream("mock_b", b.port())
        .cluster_header(Some("x-llm-cluster"))
        .start()
        .expect("envoy start");
    let url = envoy.url("/v1/chat/completions");
    let body = chat_body("gpt-4o", "pick");

    for (cluster, instance) in [("mock_a", "a"), ("mock_b", "b")] {
        let response = post_json(&url, &body, &[("x-llm-cluster", cluster)])
            .await
            .unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-mock-instance"), Some(instance));
    }
    let unknown = post_json(&url, &body, &[("x-llm-cluster", "nope")])
        .await
        .unwrap();
    assert!(
        matches!(unknown.status, 404 | 503),
        "status {}",
        unknown.status
    );
    assert_eq!(a.request_count() + b.request_count(), 2);
}

#[tokio::test]
async fn filter_with_empty_config_loads_and_labels_metrics() {
    if skip_without_envoy("filter_with_empty_config_loads_and_labels_metrics") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("upstream-f"));
    let envoy = EnvoyBuilder::new()
        .plugin_config(json!({}))
        .upstream("mock_f", mock.port())
        .start()
        .expect("envoy with filter");

    let response = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", "with filter"),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        response.json()["choices"][0]["message"]["content"],
        "echo: with filter [upstream-f]"
    );
    let sse = stream_sse(
        &envoy.url("/v1/chat/completions"),
        &chat_stream_body("gpt-4o", "streamed with filter", true),
        &[("x-mock-chunk-delay-ms", "5")],
    )
    .await
    .unwrap();
    assert!(sse.done());
    assert_eq!(sse.content(), "echo: streamed with filter [upstream-f]");
    assert_eq!(get(&envoy.url("/health"), &[]).await.unwrap().text(), "ok");
    assert_eq!(mock.request_count(), 3);

    // The stats_tags rules turn the filter's encoded stat names into labels.
    let prometheus = envoy.prometheus().unwrap();
    assert!(
        prometheus
            .lines()
            .any(|l| l.starts_with("llm_filter_requests_total{") && l.contains("model=\"gpt-4o\"")),
        "{prometheus}"
    );
}

/// Checks what every dialect stream shares: each event named as its data's
/// `type`, the deltas joined into the echo text, nothing after the last event.
fn assert_named_events(sse: &SseResponse, names: &[&str], text: &str) {
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("content-type"), Some("text/event-stream"));
    assert_eq!(sse.event_names(), names, "{:?}", sse.events);
    for (event, data) in sse.events.iter().zip(sse.chunks()) {
        assert_eq!(Some(data["type"].as_str().unwrap()), event.event.as_deref());
        assert!(
            event.data.starts_with("{\"type\":"),
            "type first: {}",
            event.data
        );
    }
    assert!(!sse.done(), "no [DONE]");
    assert!(sse.trailing.is_empty());
    assert_eq!(sse.content(), text);
}

/// The event names of a streamed answer of `deltas` text pieces.
fn names<'a>(head: &[&'a str], delta: &'a str, deltas: usize, tail: &[&'a str]) -> Vec<&'a str> {
    let mut names = head.to_vec();
    names.extend(std::iter::repeat_n(delta, deltas));
    names.extend_from_slice(tail);
    names
}

const RESPONSES_HEAD: [&str; 4] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
];
const RESPONSES_TAIL: [&str; 4] = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
];
const MESSAGES_HEAD: [&str; 3] = ["message_start", "content_block_start", "ping"];
const MESSAGES_TAIL: [&str; 3] = ["content_block_stop", "message_delta", "message_stop"];

#[tokio::test]
async fn mock_answers_responses_json_and_sse() {
    let mock = MockUpstream::start(MockConfig::named("resp"));
    let url = mock.url("/v1/responses");
    let body = json!({
        "model": "gpt-4.1",
        "instructions": "Answer in one word.",
        "input": [
            {"role": "user", "content": "an earlier question"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "an answer"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "two words"},
            {"role": "user", "content": [{"type": "input_text", "text": "the last one"}]},
        ],
        "max_output_tokens": 64,
        "user": "u-7",
    });
    let r = post_json(&url, &body, &[("authorization", "Bearer sk-r")])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-mock-instance"), Some("resp"));
    let answer = r.json();
    assert!(answer["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["status"], "completed");
    assert_eq!(answer["model"], "gpt-4.1");
    assert!(answer["created_at"].as_u64().is_some());
    assert_eq!(answer["instructions"], "Answer in one word.");
    assert_eq!(answer["max_output_tokens"], 64);
    assert_eq!(answer["user"], "u-7");
    let item = &answer["output"][0];
    assert_eq!(answer["output"].as_array().unwrap().len(), 1);
    assert_eq!(item["type"], "message");
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (&item["status"], &item["role"]),
        (&json!("completed"), &json!("assistant"))
    );
    assert_eq!(
        item["content"][0],
        json!({"type": "output_text", "text": "echo: the last one [resp]", "annotations": [], "logprobs": []})
    );
    let usage = &answer["usage"];
    // Instructions 4 words, the items 3 + 2 + 2 (`{"x": 1}`) + 2 + 3.
    assert_eq!(usage["input_tokens"], 16);
    assert_eq!(usage["output_tokens"], 5);
    assert_eq!(usage["total_tokens"], 21);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(
        mock.last_request().unwrap().header("authorization"),
        Some("Bearer sk-r")
    );

    // A string input is one user message; the stream's events as OpenAI names
    // and numbers them, the usage in response.completed.
    mock.set_chunk_delay_ms(20);
    let stream_body = json!({"model": "gpt-4.1", "input": "stream me please", "stream": true});
    let sse = stream_sse(&url, &stream_body, &[]).await.unwrap();
    let text = "echo: stream me please [resp]";
    let expected = names(
        &RESPONSES_HEAD,
        "response.output_text.delta",
        5,
        &RESPONSES_TAIL,
    );
    assert_named_events(&sse, &expected, text);
    let chunks = sse.chunks();
    let numbers: Vec<u64> = chunks
        .iter()
        .map(|c| c["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..chunks.len() as u64).collect::<Vec<_>>());
    let id = chunks[0]["response"]["id"].as_str().unwrap();
    for (n, status) in [(0, "in_progress"), (1, "in_progress")] {
        assert_eq!(chunks[n]["response"]["status"], status);
        assert_eq!(chunks[n]["response"]["output"], json!([]));
        assert!(chunks[n]["response"]["usage"].is_null());
    }
    assert_eq!(chunks[2]["item"]["status"], "in_progress");
    let item_id = chunks[2]["item"]["id"].as_str().unwrap();
    assert!(chunks[3..11]
        .iter()
        .all(|c| c["item_id"] == item_id && c["output_index"] == 0));
    assert_eq!(chunks[9]["text"], text);
    assert_eq!(chunks[10]["part"]["text"], text);
    assert_eq!(chunks[11]["item"]["content"][0]["text"], text);
    let completed = &chunks[12]["response"];
    assert_eq!(completed["id"], id);
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"][0]["content"][0]["text"], text);
    let usage = sse.usage().unwrap();
    assert_eq!(usage, completed["usage"]);
    assert_eq!(
        (
            usage["input_tokens"].as_u64(),
            usage["output_tokens"].as_u64()
        ),
        (Some(3), Some(5))
    );
    assert_eq!(usage["total_tokens"], 8);
    assert_eq!(
        mock.sent_streams().last().unwrap().as_slice(),
        sse.raw.as_ref()
    );

    // A stored response continues; one this instance never produced is refused.
    let next = json!({"model": "gpt-4.1", "input": "and then?", "previous_response_id": id});
    let r = post_json(&url, &next, &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["previous_response_id"], id);
    let elsewhere = MockUpstream::start(MockConfig::named("other"));
    let r = post_json(&elsewhere.url("/v1/responses"), &next, &[])
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
    let unstored = json!({"model": "m", "input": "x", "store": false});
    let unstored_id = post_json(&url, &unstored, &[]).await.unwrap().json()["id"].clone();
    let r = post_json(
        &url,
        &json!({"model": "m", "input": "y", "previous_response_id": unstored_id}),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400, "store: false keeps nothing to continue");
}

#[tokio::test]
async fn mock_answers_messages_json_and_sse() {
    let mock = MockUpstream::start(MockConfig::named("claude"));
    let url = mock.url("/v1/messages");
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "system": [{"type": "text", "text": "You are terse."}],
        "metadata": {"user_id": "u-9"},
        "messages": [
            {"role": "user", "content": "what is the weather"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "let me look"},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                {"type": "text", "text": "and tomorrow?"},
            ]},
        ],
    });
    let headers = [
        ("x-api-key", "sk-ant-test"),
        ("anthropic-version", "2023-06-01"),
    ];
    let r = post_json(&url, &body, &headers).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("request-id").unwrap().starts_with("req_"));
    let answer = r.json();
    assert!(answer["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (&answer["type"], &answer["role"]),
        (&json!("message"), &json!("assistant"))
    );
    assert_eq!(answer["model"], "claude-sonnet-4-5");
    assert_eq!(
        answer["content"],
        json!([{"type": "text", "text": "echo: sunny and tomorrow? [claude]"}])
    );
    assert_eq!(answer["stop_reason"], "end_turn");
    assert!(answer["stop_sequence"].is_null());
    // System 3 words, then 4, 3 + 1 (the tool input), 1 + 2.
    assert_eq!(
        answer["usage"],
        json!({"input_tokens": 14, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
    );
    let seen = mock.last_request().unwrap();
    assert_eq!(seen.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen.json().unwrap()["metadata"]["user_id"], "u-9");

    // The stream: Anthropic's events, the usage split over message_start
    // (input, and 1 output token) and message_delta (the output).
    mock.set_chunk_delay_ms(20);
    let mut stream_body = messages_body("claude-haiku-4-5", "stream this answer");
    stream_body["stream"] = json!(true);
    let sse = stream_sse(&url, &stream_body, &headers).await.unwrap();
    let text = "echo: stream this answer [claude]";
    let expected = names(&MESSAGES_HEAD, "content_block_delta", 5, &MESSAGES_TAIL);
    assert_named_events(&sse, &expected, text);
    let chunks = sse.chunks();
    let start = &chunks[0]["message"];
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    assert_eq!(start["model"], "claude-haiku-4-5");
    assert_eq!(
        (
            &start["usage"]["input_tokens"],
            &start["usage"]["output_tokens"]
        ),
        (&json!(3), &json!(1))
    );
    assert_eq!(
        chunks[1]["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert!(chunks[3..8]
        .iter()
        .all(|c| c["index"] == 0 && c["delta"]["type"] == "text_delta"));
    assert_eq!(chunks[8], json!({"type": "content_block_stop", "index": 0}));
    assert_eq!(
        chunks[9],
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 5}})
    );
    assert_eq!(chunks[10], json!({"type": "message_stop"}));
    let usage = sse.usage().unwrap();
    assert_eq!(
        (&usage["input_tokens"], &usage["output_tokens"]),
        (&json!(3), &json!(5))
    );
    // The same usage as the JSON answer to the same call.
    let json_answer = post_json(&url, &messages_body("m", "stream this answer"), &[])
        .await
        .unwrap();
    assert_eq!(json_answer.json()["usage"], usage);
}

#[tokio::test]
async fn mock_dialects_fail_in_their_own_shapes() {
    let mock = MockUpstream::start(MockConfig::named("err"));
    let messages = mock.url("/v1/messages");
    let responses = mock.url("/v1/responses");

    // Anthropic: the error type its SDK maps to the exception, by status.
    for (status, kind) in [
        ("529", "overloaded_error"),
        ("429", "rate_limit_error"),
        ("500", "api_error"),
        ("503", "api_error"),
        ("504", "timeout_error"),
        ("401", "authentication_error"),
        ("400", "invalid_request_error"),
    ] {
        let r = post_json(
            &messages,
            &messages_body("m", "x"),
            &[("x-mock-status", status)],
        )
        .await
        .unwrap();
        assert_eq!(r.status.to_string(), status);
        let body = r.json();
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], kind, "{status}: {body}");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("scripted status"));
        assert_eq!(body["request_id"].as_str(), r.header("request-id"));
    }
    // max_tokens is required; a body that is not JSON is refused too.
    let no_max = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let r = post_json(&messages, &no_max, &[]).await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"],
        json!({"type": "invalid_request_error", "message": "max_tokens: Field required"})
    );
    let r = post_raw(&messages, "{not json", &[]).await.unwrap();
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    // retry-after and x-should-retry come with any error, as scripted.
    let knobs = [
        ("x-mock-fail-first", "1"),
        ("x-mock-retry-after", "7"),
        ("x-mock-should-retry", "false"),
    ];
    let r = post_json(&messages, &messages_body("m", "x"), &knobs)
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(
        (r.header("retry-after"), r.header("x-should-retry")),
        (Some("7"), Some("false"))
    );
    assert_eq!(r.json()["error"]["type"], "api_error");
    let r = post_json(&messages, &messages_body("m", "x"), &knobs)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.header("retry-after"), r.header("x-should-retry")),
        (None, None)
    );

    // OpenAI's shape on the Responses API.
    let r = post_json(
        &responses,
        &responses_body("m", "x"),
        &[("x-mock-status", "429")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert_eq!(r.json()["error"]["code"], "mock_status");
    let r = post_json(&responses, &json!({"input": "x"}), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "missing_required_parameter");
    let r = post_raw(&responses, "[1, 2]", &[]).await.unwrap();
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
}

#[tokio::test]
async fn mock_dialect_streams_misbehave_on_request() {
    let mock = MockUpstream::start(MockConfig {
        chunk_delay_ms: 0,
        ..MockConfig::named("odd")
    });
    let mut responses = responses_body("m", "one two");
    responses["stream"] = json!(true);
    let mut messages = messages_body("m", "one two");
    messages["stream"] = json!(true);
    let cases = [
        (
            "/v1/responses",
            &responses,
            "response.mock_unknown",
            "response.completed",
        ),
        ("/v1/messages", &messages, "mock_unknown", "message_stop"),
    ];
    for (path, body, unknown, last) in cases {
        // An event of a type the API does not define, second, the rest as usual.
        let sse = stream_sse(&mock.url(path), body, &[("x-mock-sse", "unknown")])
            .await
            .unwrap();
        assert_eq!(sse.event_names()[1], unknown, "{path}");
        assert_eq!(sse.event_names().last(), Some(&last));
        assert_eq!(sse.content(), "echo: one two [odd]");
        // The whole stream gzipped, decoded to the same events.
        let plain = stream_sse(&mock.url(path), body, &[]).await.unwrap();
        let gz = stream_sse(
            &mock.url(path),
            body,
            &[("x-mock-content-encoding", "gzip")],
        )
        .await
        .unwrap();
        assert_eq!(gz.header("content-encoding"), Some("gzip"));
        let decoded = gunzip_stored(&gz.raw).expect("gzip");
        assert_eq!(decoded.len(), plain.raw.len(), "{path}");
        // Cut after 100 bytes: the reader sees the connection drop.
        let cut = stream_sse(
            &mock.url(path),
            body,
            &[("x-mock-reset-after-bytes", "100")],
        )
        .await;
        assert!(cut.is_err(), "{path}: {cut:?}");
    }
    // A JSON answer gzipped and delayed like any other.
    let r = post_json(
        &mock.url("/v1/messages"),
        &messages_body("m", "zip"),
        &[
            ("x-mock-content-encoding", "gzip"),
            ("x-mock-delay-ms", "100"),
        ],
    )
    .await
    .unwrap();
    assert!(r.elapsed >= Duration::from_millis(100));
    let json: serde_json::Value = serde_json::from_slice(&gunzip_stored(&r.body).unwrap()).unwrap();
    assert_eq!(json["content"][0]["text"], "echo: zip [odd]");
}
