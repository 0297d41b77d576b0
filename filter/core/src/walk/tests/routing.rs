//! Scenario tests of the walk with routing (the `routing` feature): the model
//! routed to its cluster, breakers steering, failover to another backend,
//! hedges and fallback chains.

use super::*;

#[test]
fn a_routed_model_gets_its_cluster_and_name() {
    let mut w = World::new(ROUTED);
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, step) = Call::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Pause, "the body is held to route on it");
    let size = host.request_body.len();
    let step = call.on_request_body(&mut w.env(), &mut host, size, true);
    assert_eq!(step, Step::Continue);
    assert_eq!(host.header("x-llm-cluster"), Some("azure"));
    assert_eq!(host.route_cache_cleared, 1);
    let body = String::from_utf8(host.request_body.clone()).unwrap();
    assert_eq!(body, CHAT.replace("gpt-4o", "gpt-4o-2024-08-06"));
    assert_eq!(
        host.header("content-length"),
        Some(body.len().to_string().as_str())
    );

    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    assert_eq!(host.response("x-llm-cluster"), Some("azure"));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=azure;.;outcome=.=success;.;"),
        1
    );
    assert!(health::read(&w.store, "azure").is_some());
}

#[test]
fn admission_takes_what_routing_read_of_the_chosen_cluster() {
    let mut w =
        World::new(r#"{"routing":{"models":{"gpt-4o":[{"cluster":"a"},{"cluster":"b"}]}}}"#);
    // Both clusters have a history: a typical latency for the plan to read.
    let done = health::CallSample {
        result: health::CallResult::Status(200),
        latency_ms: 800,
        ttft_ms: Some(100),
        streamed: false,
        output_tokens: None,
    };
    for cluster in ["a", "b"] {
        health::record_outcome(&w.store, &w.config.routing, cluster, &done, w.now_ms).unwrap();
    }
    let health_reads = |w: &World, c: &str| w.store.reads(&health::key(c));
    let before = [health_reads(&w, "a"), health_reads(&w, "b")];
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    w.request(&mut host).unwrap();
    let chosen = host.header("x-llm-cluster").unwrap().to_string();
    let before = before[usize::from(chosen == "b")];
    // The window once (routing's weighing; admission takes it over), the
    // health twice (the weighing, then the in-flight count's write).
    assert_eq!(w.store.reads(&breaker::key(&chosen)), 1);
    assert_eq!(health_reads(&w, &chosen) - before, 2);
    // The plan still saw the cluster's typical latency.
    assert!(host.header("x-envoy-upstream-rq-timeout-ms").is_some());
}

#[test]
fn rules_pick_the_model_and_unknown_models_pass() {
    let mut w = World::new(ROUTED);
    let mut host =
        FakeHost::post("/v1/chat/completions").with_body(&CHAT.replace("gpt-4o", "auto"));
    w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), Some("vllm"));
    assert!(String::from_utf8_lossy(&host.request_body).contains(r#""model":"small""#));

    let mut host =
        FakeHost::post("/v1/chat/completions").with_body(&CHAT.replace("gpt-4o", "other"));
    w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), None);
    assert_eq!(host.route_cache_cleared, 0);
    assert_eq!(
        host.request_body,
        CHAT.replace("gpt-4o", "other").as_bytes()
    );
}

#[test]
fn a_client_that_leaves_teaches_routing_nothing() {
    let mut w = World::new(ROUTED);
    for _ in 0..5 {
        let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
        let (call, _) = w.request(&mut host).unwrap();
        assert_eq!(
            w.metrics
                .gauges
                .get("llm_filter_routing_in_flightllm_cluster=.=azure;.;"),
            Some(&1)
        );
        // No response at all: the client went away.
        call.on_log(&mut w.env());
    }
    let h = health::read(&w.store, "azure").unwrap();
    assert!(!h.is_ejected(w.now_ms));
    assert_eq!(
        (h.in_flight, h.consecutive_failures, h.errors),
        (0, 0, None)
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=azure;.;outcome=.=cancelled;.;"),
        5
    );
    assert_eq!(
        w.metrics
            .gauges
            .get("llm_filter_routing_in_flightllm_cluster=.=azure;.;"),
        Some(&0)
    );
}

#[test]
fn a_routed_call_answered_locally_leaves_the_in_flight_count() {
    let mut w = World::new(r#"{"routing": {"models": {"gpt-4o": [{"cluster": "a"}]}}}"#);
    let mut host = FakeHost::post("/v1/chat/completions")
        .with_header("x-request-timeout-ms", "100")
        .with_body(CHAT);
    let (mut call, _) = Call::start(&mut w.env(), &mut host, false).unwrap();
    w.now_ms += 150;
    let size = host.request_body.len();
    call.on_request_body(&mut w.env(), &mut host, size, true);
    assert_eq!(host.local_reply.as_ref().unwrap().0, 504);
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 1);
    call.on_log(&mut w.env());
    let h = health::read(&w.store, "a").unwrap();
    assert_eq!((h.in_flight, h.errors), (0, None));
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=server_error;.;"),
        0
    );
}

#[test]
fn routing_steers_around_a_backend_whose_breaker_is_open() {
    let mut w = World::new(
        r#"{"routing": {"models": {"gpt-4o": [{"cluster": "a"}, {"cluster": "b"}]}},
            "budget": {"min_calls": 1, "probe_fraction": 0}}"#,
    );
    for _ in 0..20 {
        let sample = budget::Sample::new(60_000, 60_000, true, 0);
        breaker::record(&w.store, "a", w.now_ms, sample, &w.config.budget).unwrap();
    }
    for _ in 0..50 {
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_header("x-request-priority", "P2")
            .with_body(&unique_chat());
        let (_, step) = w.request(&mut host).unwrap();
        assert_eq!(step, Step::Continue);
        assert_eq!(host.header("x-llm-cluster"), Some("b"));
        assert!(host.local_reply.is_none());
    }
}

#[test]
fn a_failed_call_is_sent_to_the_other_backend_as_it_would_have_left() {
    let mut w = World::new(TWO_BACKENDS);
    let (_call, _host, (cluster, headers, body, timeout), key) = failed_over_from_b(&mut w);
    assert_eq!(cluster, "a");
    let header = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header(":authority"), Some("a.example"));
    assert_eq!(header("idempotency-key"), Some(key.as_str()));
    assert_eq!(header("authorization"), Some("Bearer k"));
    assert_eq!(header("x-llm-cluster"), None);
    assert_eq!(
        String::from_utf8(body.clone()).unwrap(),
        CHAT.replace("gpt-4o", "gpt-4o-a")
    );
    assert_eq!(
        header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert!(timeout > 0 && timeout <= 60_000, "{timeout}");
    // b learnt its failure already.
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=b;.;outcome=.=server_error;.;"),
        1
    );
}

#[test]
fn a_mesh_credentialed_backend_asked_in_place_of_another_that_answers_401_is_the_gateways_503() {
    let config = TWO_BACKENDS.replacen(
        "\"eject_after_failures\": 100\n  }",
        "\"eject_after_failures\": 100\n  },\n  \"credentials\": {\"every_call\": true}",
        1,
    );
    for (mesh, want) in [(true, 503), (false, 401)] {
        let config = if mesh {
            config.clone()
        } else {
            TWO_BACKENDS.to_string()
        };
        let mut w = World::new(&config);
        let (mut call, mut host, _, _) = failed_over_from_b(&mut w);
        let body = br#"{"error":{"message":"Invalid API key","type":"invalid_request_error"}}"#;
        let answer = CalloutAnswer {
            status: Some(401),
            headers: vec![
                (":status".into(), "401".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: body.to_vec(),
        };
        assert_eq!(
            call.answer_callout(&mut w.env(), &mut host, answer),
            Step::Pause
        );
        let (status, _, sent) = host.local_reply.clone().unwrap();
        assert_eq!(status, want, "mesh {mesh}");
        let unavailable = w.counter("llm_filter_credential_unavailable_totalllm_cluster=.=a;.;");
        if mesh {
            let sent: serde_json::Value = serde_json::from_slice(&sent).unwrap();
            assert_eq!(sent["error"]["code"], "llm_filter_credential_unavailable");
            assert_eq!(unavailable, 1);
        } else {
            assert_eq!(
                sent,
                body.to_vec(),
                "the provider's word on the client's key"
            );
            assert_eq!(unavailable, 0);
        }
    }
}

#[test]
fn the_other_backends_answer_reaches_the_client_and_is_learnt() {
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, mut host, _, _) = failed_over_from_b(&mut w);
    w.now_ms += 40;
    let answer = CalloutAnswer {
        status: Some(200),
        headers: vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/json".into()),
            ("content-length".into(), ANSWER.len().to_string()),
        ],
        body: ANSWER.as_bytes().to_vec(),
    };
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, answer),
        Step::Pause
    );
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers.get("x-llm-cluster").map(String::as_str), Some("a"));
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert!(!headers.contains_key("content-length"));
    assert_eq!(body, ANSWER.as_bytes());
    call.on_log(&mut w.env());
    for (counter, n) in [
        ("llm_filter_routing_failovers_totalresult=.=answered;.;", 1),
        (
            "llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=success;.;",
            1,
        ),
        (
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=success;.;api=.=chat;.;",
            1,
        ),
        (
            "gen_ai_client_token_usage_totalmodel=.=gpt-4o;.;token_type=.=input;.;api=.=chat;.;",
            3,
        ),
    ] {
        assert_eq!(w.counter(counter), n, "{counter}");
    }
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
    assert_eq!(health::read(&w.store, "b").unwrap().in_flight, 0);
}

#[test]
fn no_answer_from_the_other_backend_lets_the_failure_through() {
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(502, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Pause
    );
    let step = call.answer_callout(&mut w.env(), &mut host, CalloutAnswer::default());
    assert_eq!(step, Step::Continue, "the held failure goes on");
    assert!(host.local_reply.is_none());
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, 12, true),
        Step::Continue
    );
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_failovers_totalresult=.=no_answer;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=timeout;.;"),
        1
    );
    assert_eq!(
        w.counter(
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;outcome=.=server_error;.;api=.=chat;.;"
        ),
        1
    );
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
    assert_eq!(health::read(&w.store, "b").unwrap().in_flight, 0);
}

#[test]
fn failover_needs_a_retriable_failure_budget_and_another_backend() {
    // A client error is not retried elsewhere.
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(400, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());
    call.on_log(&mut w.env());

    // No room left in the budget for another try.
    let (mut call, host) = routed_to(&mut w, "b");
    w.now_ms += 59_900;
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());
    call.on_log(&mut w.env());

    // Off by configuration.
    let mut w = World::new(&TWO_BACKENDS.replace(
        r#""eject_after_failures""#,
        r#""failover": false, "eject_after_failures""#,
    ));
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());

    // A model with one backend has nowhere to go.
    let mut w = World::new(ROUTED);
    let mut host = FakeHost::post("/v1/chat/completions").with_body(CHAT);
    let (mut call, _) = w.request(&mut host).unwrap();
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    assert!(host.callouts.is_empty());
}

#[test]
fn a_slow_call_is_hedged_and_the_first_answer_wins() {
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    assert!(call.is_parked(), "the hedge timer runs");
    w.now_ms += 50;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Wait);
    assert!(host.callouts.is_empty());
    w.now_ms += 60;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert!(!call.is_parked());
    let (cluster, _, body, _) = host.callouts.pop().unwrap();
    assert_eq!(cluster, "a");
    assert_eq!(
        String::from_utf8(body).unwrap(),
        CHAT.replace("gpt-4o", "gpt-4o-a")
    );

    w.now_ms += 30;
    let step = call.answer_callout(&mut w.env(), &mut host, answer_200());
    assert_eq!(step, Step::Pause);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers.get("x-llm-cluster").map(String::as_str), Some("a"));
    // Envoy's reset of the first request, then its own reply passing by.
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Continue
    );
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=won;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=success;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=b;.;outcome=.=outlasted;.;"),
        1
    );
    // b learnt it took at least the 140 ms until a answered.
    let b = health::read(&w.store, "b").unwrap();
    assert_eq!(b.calls.and_then(|c| c.mean()), Some(140.0));
    assert_eq!(b.consecutive_failures, 0);
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
    assert_eq!(health::read(&w.store, "b").unwrap().in_flight, 0);
}

#[test]
fn a_backend_answering_before_its_hedge_wins() {
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert_eq!(host.callouts.len(), 1);
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    let step = call.answer_callout(&mut w.env(), &mut host, answer_200());
    assert_eq!(step, Step::Pause, "nothing to resume");
    assert!(host.local_reply.is_none());
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=lost;.;"),
        1
    );
    assert_eq!(
        w.counter("llm_filter_routing_calls_totalllm_cluster=.=b;.;outcome=.=success;.;"),
        1
    );
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);

    // A hedge still out when the call ends lost too, and leaves in flight.
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    call.on_tick(&mut w.env(), &mut host);
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=lost;.;"),
        2
    );
    assert_eq!(health::read(&w.store, "a").unwrap().in_flight, 0);
}

/// The routing token counts of `cluster`, by model label and token type.
fn routing_tokens(w: &World, cluster: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = w
        .metrics
        .counters
        .iter()
        .filter(|(k, _)| {
            k.starts_with("llm_filter_routing_tokens_total")
                && k.contains(&format!("llm_cluster=.={cluster};.;"))
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    out.sort();
    out
}

/// The routing token counter of a call of gpt-4o on `cluster`.
fn tokens_of(cluster: &str, kind: &str, n: u64) -> (String, u64) {
    (
        format!("llm_filter_routing_tokens_totalmodel=.=gpt-4o;.;llm_cluster=.={cluster};.;token_type=.={kind};.;"),
        n,
    )
}

#[test]
fn a_try_counts_its_own_tokens_under_the_calls_model() {
    // The backend answers first (3 in, 1 out); the hedge loses with its
    // own answer (20 in, 9 out): each cluster counts its own tokens.
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert_eq!(host.callouts.len(), 1);
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    let hedge = CalloutAnswer {
        body: ANSWER
            .replace(
                r#""prompt_tokens":3,"completion_tokens":1"#,
                r#""prompt_tokens":20,"completion_tokens":9"#,
            )
            .into_bytes(),
        ..answer_200()
    };
    call.answer_callout(&mut w.env(), &mut host, hedge);
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=lost;.;"),
        1
    );
    assert_eq!(
        routing_tokens(&w, "a"),
        [tokens_of("a", "input", 20), tokens_of("a", "output", 9)]
    );
    assert_eq!(
        routing_tokens(&w, "b"),
        [tokens_of("b", "input", 3), tokens_of("b", "output", 1)]
    );

    // The hedge wins: the backend it beat reported nothing.
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    call.answer_callout(&mut w.env(), &mut host, answer_200());
    assert!(host.local_reply.is_some());
    call.on_response_headers(&mut w.env(), &mut host, false);
    call.on_log(&mut w.env());
    assert_eq!(
        routing_tokens(&w, "a"),
        [tokens_of("a", "input", 3), tokens_of("a", "output", 1)]
    );
    assert_eq!(routing_tokens(&w, "b"), []);
}

#[test]
fn hedges_respect_their_cap_and_the_answer_in_time() {
    // No share of calls may be hedged: hedging is off, nothing is armed and
    // the tick is any call's.
    let mut w = World::new(&hedged(0.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Resume);
    assert!(host.callouts.is_empty());

    // An answer in time disarms the hedge.
    let mut w = World::new(&hedged(1.0));
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(200, "application/json", ANSWER);
    w.respond(&mut call, &mut host);
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert!(host.callouts.is_empty());

    // Streams are not hedged.
    let (call, _) = {
        let mut host = FakeHost::post("/v1/chat/completions")
            .with_body(&CHAT.replace(r#""model""#, r#""stream":true,"model""#));
        w.request(&mut host).unwrap()
    };
    assert!(!call.is_parked());
}

const CHAINED: &str = r#"{
  "routing": {
    "models": {
      "gpt-4o": [{"cluster": "a"}],
      "gpt-4.1": [{"cluster": "b"}],
      "gpt-4o-mini": [{"cluster": "c"}]
    },
    "fallbacks": {"gpt-4o": {"on": ["context_length", "quota"], "to": ["gpt-4.1", "gpt-4o-mini"]}}
  },
  "cache": {"enabled": false}
}"#;

/// The error body as Envoy delivers it: the headers, then the whole body.
fn answer_with(call: &mut Call, w: &mut World, host: &mut FakeHost) -> (Step, Step) {
    let size = host.response_body.len();
    let headers = call.on_response_headers(&mut w.env(), host, false);
    let body = call.on_response_body(&mut w.env(), host, size, true);
    (headers, body)
}

#[test]
fn a_refusal_of_a_named_class_moves_along_the_chain() {
    let mut w = World::new(CHAINED);
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    assert_eq!(
        answer_with(&mut call, &mut w, &mut host),
        (Step::Pause, Step::Pause)
    );
    // The held request goes to the chain's first model, named in its body.
    let (cluster, _, body, _) = host.callouts.last().cloned().unwrap();
    assert_eq!(cluster, "b");
    let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent["model"], "gpt-4.1");
    // gpt-4.1 refuses for its quota: the chain goes on to gpt-4o-mini.
    let quota = CalloutAnswer {
        status: Some(429),
        headers: vec![(":status".into(), "429".into())],
        body: refusal("insufficient_quota").into_bytes(),
    };
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, quota),
        Step::Pause
    );
    let (cluster, _, body, _) = host.callouts.last().cloned().unwrap();
    assert_eq!(cluster, "c");
    assert!(String::from_utf8_lossy(&body).contains(r#""model":"gpt-4o-mini""#));
    // gpt-4o-mini answers: the client gets it, with the model named.
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, answer_200()),
        Step::Pause
    );
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("x-llm-model").map(String::as_str),
        Some("gpt-4o-mini")
    );
    assert_eq!(headers.get("x-llm-cluster").map(String::as_str), Some("c"));
    call.on_log(&mut w.env());
    let counted = |reason: &str, result: &str| {
        w.counter(&format!(
            "llm_filter_routing_model_fallbacks_totalmodel=.=gpt-4o;.;reason=.={reason};.;result=.={result};.;"
        ))
    };
    assert_eq!(counted("context_length", "failed"), 1);
    assert_eq!(counted("quota", "answered"), 1);
    assert_eq!(
        w.counter("llm_filter_routing_failovers_totalresult=.=answered;.;"),
        0
    );
    for c in ["a", "b", "c"] {
        assert_eq!(health::read(&w.store, c).unwrap().in_flight, 0, "{c}");
    }
}

/// [`CHAINED`] with a limit on `gpt-4.1` (`degrade`: its rule's degrade).
fn chained_with_a_limit(degrade: &str) -> World {
    let limits = format!(
        r#""limits": {{"rules": [{{"name": "big", "by": ["tenant"], "models": ["gpt-4.1"],
            "requests_per_minute": 1{degrade}}}]}},"#
    );
    World::new(&CHAINED.replacen('{', &format!("{{{limits}"), 1))
}

#[test]
fn a_fallback_is_held_to_the_limits_of_the_model_it_would_reach() {
    let mut w = chained_with_a_limit("");
    // The first fallback of the key takes gpt-4.1's one call a minute.
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    answer_with(&mut call, &mut w, &mut host);
    let (cluster, _, _, _) = host.callouts.last().cloned().unwrap();
    assert_eq!(cluster, "b");
    call.answer_callout(&mut w.env(), &mut host, answer_200());
    call.on_log(&mut w.env());
    let rule = |w: &World, result: &str| {
        w.counter(&format!(
            "llm_filter_limits_calls_totalrule=.=big;.;result=.={result};.;"
        ))
    };
    assert_eq!(rule(&w, "pass"), 1);
    // The next one may not reach gpt-4.1: refused with the limit's 429 in
    // its API's shape, nothing sent.
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    assert_eq!(
        answer_with(&mut call, &mut w, &mut host),
        (Step::Pause, Step::Pause)
    );
    assert!(host.callouts.is_empty(), "nothing sent to gpt-4.1");
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "llm_filter_limit_exceeded");
    assert!(v["error"]["message"].as_str().unwrap().contains("big"));
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    call.on_log(&mut w.env());
    assert_eq!(rule(&w, "rejected"), 1);
    assert_eq!(
        w.counter("llm_filter_routing_model_fallbacks_totalmodel=.=gpt-4o;.;reason=.=context_length;.;result=.=limited;.;"),
        1
    );
    // The call to gpt-4o alone is no call of gpt-4.1: the rule never held it.
    assert_eq!(rule(&w, "pass"), 1);
}

#[test]
fn over_a_degrading_limit_a_fallback_stays_on_the_cheaper_model() {
    let mut w = chained_with_a_limit(r#", "degrade": {"model": "gpt-4o-mini"}"#);
    for expected in [Some("b"), None] {
        let (mut call, host) = routed_to(&mut w, "a");
        let mut host =
            host.with_response(400, "application/json", &refusal("context_length_exceeded"));
        let (_, body) = answer_with(&mut call, &mut w, &mut host);
        let sent = host.callouts.last().map(|c| c.0.as_str());
        assert_eq!(sent, expected);
        if expected.is_none() {
            // gpt-4o's own refusal goes on to the client.
            assert_eq!(body, Step::Continue);
            assert!(host.local_reply.is_none());
        } else {
            call.answer_callout(&mut w.env(), &mut host, answer_200());
        }
        call.on_log(&mut w.env());
    }
}

#[test]
fn other_refusals_reach_the_client_untouched() {
    let mut w = World::new(CHAINED);
    // A class the chain does not name, a bad request, a body that is no error.
    for (status, body) in [
        (404, refusal("model_not_found")),
        (400, refusal("invalid_value")),
        (400, "not json".to_string()),
    ] {
        let (mut call, host) = routed_to(&mut w, "a");
        let mut host = host.with_response(status, "application/json", &body);
        assert_eq!(
            answer_with(&mut call, &mut w, &mut host),
            (Step::Pause, Step::Continue)
        );
        assert!(host.callouts.is_empty(), "{status} {body}");
        assert!(host.local_reply.is_none());
        call.on_log(&mut w.env());
    }
    // The chain's last model refuses too: its refusal is the answer.
    let (mut call, host) = routed_to(&mut w, "a");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    answer_with(&mut call, &mut w, &mut host);
    let too_long = || CalloutAnswer {
        status: Some(400),
        headers: vec![(":status".into(), "400".into())],
        body: refusal("context_length_exceeded").into_bytes(),
    };
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, too_long()),
        Step::Pause
    );
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, too_long()),
        Step::Pause
    );
    assert_eq!(host.callouts.len(), 2);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 400);
    assert_eq!(
        headers.get("x-llm-model").map(String::as_str),
        Some("gpt-4o-mini")
    );
    call.on_log(&mut w.env());
    // A model without a chain holds nothing back.
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, host) = routed_to(&mut w, "b");
    let mut host = host.with_response(400, "application/json", &refusal("context_length_exceeded"));
    assert_eq!(
        answer_with(&mut call, &mut w, &mut host),
        (Step::Continue, Step::Continue)
    );
}
