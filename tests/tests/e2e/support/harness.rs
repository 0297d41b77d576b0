//! Proves the harness itself: the mock answers like an OpenAI-compatible provider
//! and plain Envoy (no filter) carries requests to it unchanged. Filter scenarios
//! build on these guarantees.

use std::time::Duration;

use llm_filter_e2e::{
    chat_body, chat_stream_body, get, post_json, post_raw, skip_without_envoy, stream_sse,
    validate_config, EnvoyBuilder, MockConfig, MockUpstream, Script,
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
