//! Failover down a model's backends within one call: each provider's own
//! pacing or overload moves the call on to the next backend that speaks its
//! shape and was not asked yet, on that backend's path, while the budget, the
//! retry budget and `budget.max_retries` allow.

use crate::routing::health;
use crate::walk::fake::{FakeHost, World};
use crate::walk::*;

/// Claude on Anthropic, Bedrock and Vertex, in that order of weight.
fn claude(budget: &str) -> String {
    format!(
        r#"{{
  "budget": {{{budget}}},
  "routing": {{"eject_after_failures": 100, "models": {{"claude": [
    {{"cluster": "anthropic", "provider": "anthropic", "weight": 1000000}},
    {{"cluster": "bedrock", "provider": "bedrock", "weight": 1000, "model": "anthropic.claude-v1:0"}},
    {{"cluster": "vertex", "provider": "vertex", "apis": ["messages"], "weight": 1, "model": "claude@1",
     "paths": {{"messages": "/v1/projects/p/locations/l/publishers/anthropic/models/{{model}}:rawPredict"}}}}
  ]}}}}
}}"#
    )
}

const MESSAGES: &str =
    r#"{"model":"claude","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
const OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
const ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"yo"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#;

/// A Messages call Anthropic overloaded (529) and the callout that went to
/// the next backend in its place.
fn overloaded_on_anthropic(w: &mut World) -> (Call, FakeHost) {
    for n in 0..100 {
        let mut host = FakeHost::post("/v1/messages")
            .with_header("anthropic-version", "2023-06-01")
            .with_header("x-session-id", &format!("s{n}"))
            .with_body(MESSAGES);
        let (mut call, _) = w.request(&mut host).unwrap();
        if host.header("x-llm-cluster") != Some("anthropic") {
            call.on_log(&mut w.env());
            continue;
        }
        let mut host = host.with_response(529, "application/json", OVERLOADED);
        assert_eq!(
            call.on_response_headers(&mut w.env(), &mut host, false),
            Step::Pause
        );
        return (call, host);
    }
    panic!("never routed to anthropic");
}

fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> CalloutAnswer {
    let mut all = vec![
        (":status".to_string(), status.to_string()),
        ("content-type".to_string(), "application/json".to_string()),
    ];
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    CalloutAnswer {
        status: Some(status),
        headers: all,
        body: body.as_bytes().to_vec(),
    }
}

/// Bedrock's throttling, as bedrock-runtime answers it.
fn throttled() -> CalloutAnswer {
    answer(
        429,
        &[(
            "x-amzn-errortype",
            "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/",
        )],
        r#"{"message":"Too many requests, please wait before trying again."}"#,
    )
}

/// Vertex's quota for the moment, as Google's APIs answer it.
fn exhausted() -> CalloutAnswer {
    answer(
        429,
        &[],
        r#"{"error":{"code":429,"message":"Resource exhausted. Please try again later.","status":"RESOURCE_EXHAUSTED"}}"#,
    )
}

/// A Messages call of `body` routed to Anthropic, which overloaded it
/// (529), and the callout that went to the next backend in its place.
fn overloaded_first(w: &mut World, body: &str) -> (Call, FakeHost) {
    let mut host = FakeHost::post("/v1/messages")
        .with_header("anthropic-version", "2023-06-01")
        .with_body(body);
    let (mut call, _) = w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), Some("anthropic"));
    let mut host = host.with_response(529, "application/json", OVERLOADED);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Pause
    );
    (call, host)
}

/// The last callout's cluster, `:path` and body.
fn last_callout(host: &FakeHost) -> (String, String, serde_json::Value) {
    let (cluster, headers, body, _) = host.callouts.last().cloned().unwrap();
    let path = headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map(|(_, v)| v.clone())
        .unwrap();
    (cluster, path, serde_json::from_slice(&body).unwrap())
}

#[test]
fn a_call_walks_anthropic_bedrock_vertex_within_one_client_call() {
    let mut w = World::new(&claude(""));
    let (mut call, mut host) = overloaded_on_anthropic(&mut w);
    let (cluster, path, body) = last_callout(&host);
    assert_eq!(cluster, "bedrock");
    assert_eq!(path, "/model/anthropic.claude-v1%3A0/invoke");
    assert_eq!(body["anthropic_version"], "bedrock-2023-05-31");

    // Bedrock throttles: Vertex is asked, on its own path, never Anthropic again.
    w.now_ms += 30;
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, throttled()),
        Step::Pause
    );
    assert!(host.local_reply.is_none(), "nothing reached the client yet");
    assert_eq!(host.callouts.len(), 2);
    let (cluster, path, body) = last_callout(&host);
    assert_eq!(cluster, "vertex");
    assert_eq!(
        path,
        "/v1/projects/p/locations/l/publishers/anthropic/models/claude@1:rawPredict"
    );
    assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
    assert!(body.get("model").is_none(), "{body}");
    let (_, headers, _, timeout) = host.callouts.last().unwrap();
    assert!(*timeout > 0 && *timeout < 60_000, "what is left: {timeout}");
    assert!(headers.iter().any(|(k, _)| k == "anthropic-version"));

    w.now_ms += 30;
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, answer(200, &[], ANSWER)),
        Step::Pause
    );
    let (status, headers, sent) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(sent, ANSWER.as_bytes());
    let told = |n: &str| headers.get(n).map(String::as_str);
    assert_eq!(told("x-llm-provider"), Some("vertex"));
    assert_eq!(told("x-llm-model"), Some("claude@1"));
    assert_eq!(told("x-llm-cluster"), Some("vertex"));
    call.on_log(&mut w.env());
    for (counter, n) in [
        ("llm_filter_routing_failovers_totalresult=.=failed;.;", 1),
        ("llm_filter_routing_failovers_totalresult=.=answered;.;", 1),
        (
            "llm_filter_routing_calls_totalllm_cluster=.=vertex;.;outcome=.=success;.;",
            1,
        ),
    ] {
        assert_eq!(w.counter(counter), n, "{counter}");
    }
    for cluster in ["anthropic", "bedrock", "vertex"] {
        assert_eq!(
            health::read(&w.store, cluster).unwrap().in_flight,
            0,
            "{cluster}"
        );
    }
}

#[test]
fn each_backend_is_asked_once_and_the_last_failure_reaches_the_client() {
    let mut w = World::new(&claude(r#""max_retries": 5"#));
    let (mut call, mut host) = overloaded_on_anthropic(&mut w);
    call.answer_callout(&mut w.env(), &mut host, throttled());
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, exhausted()),
        Step::Pause
    );
    assert_eq!(host.callouts.len(), 2, "nobody is asked twice");
    let (status, headers, body) = host.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    assert_eq!(
        headers.get("x-llm-provider").map(String::as_str),
        Some("vertex")
    );
    assert!(String::from_utf8(body)
        .unwrap()
        .contains("RESOURCE_EXHAUSTED"));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_failovers_totalresult=.=failed;.;"),
        2
    );
}

/// Bedrock's ModelErrorException: the model failed a valid call.
fn model_error() -> CalloutAnswer {
    answer(
        424,
        &[(
            "x-amzn-errortype",
            "ModelErrorException:http://internal.amazon.com/coral/com.amazon.bedrock/",
        )],
        r#"{"message":"Model failed to process the request.","originalStatusCode":500,"resourceName":"anthropic.claude-v1:0"}"#,
    )
}

/// Vertex's 429 naming the quota it broke, per `period` (`Minute`, `Day`).
fn over_quota(period: &str) -> CalloutAnswer {
    answer(
        429,
        &[],
        &format!(
            r#"{{"error":{{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests.","status":"RESOURCE_EXHAUSTED","details":[{{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{{"quotaMetric":"aiplatform.googleapis.com/generate_content_requests","quotaId":"GenerateContentRequestsPer{period}PerProjectPerModel"}}]}},{{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"26s"}}]}}}}"#
        ),
    )
}

#[test]
fn a_model_error_fails_over_and_a_days_quota_where_the_walk_ends_takes_the_chain() {
    // Claude's backends as `claude` has them, and Haiku its fallback.
    let config = claude("").replace(
        "  ]}}",
        r#"  ], "haiku": [{"cluster": "anthropic", "provider": "anthropic", "weight": 1000000},
    {"cluster": "bedrock", "provider": "bedrock", "weight": 1, "model": "anthropic.haiku-v1:0"}]},
  "fallbacks": {"claude": {"to": ["haiku"]}}}"#,
    );
    assert!(config.contains("fallbacks"));
    for (period, chain) in [("Day", true), ("Minute", false)] {
        let mut w = World::new(&config);
        let (mut call, mut host) = overloaded_on_anthropic(&mut w);
        assert_eq!(last_callout(&host).0, "bedrock");
        // Bedrock's model fails the call: Vertex is asked.
        assert_eq!(
            call.answer_callout(&mut w.env(), &mut host, model_error()),
            Step::Pause
        );
        assert!(host.local_reply.is_none());
        assert_eq!(last_callout(&host).0, "vertex");
        // Vertex's quota ends Claude's walk.
        assert_eq!(
            call.answer_callout(&mut w.env(), &mut host, over_quota(period)),
            Step::Pause
        );
        if !chain {
            // A minute's quota is no class: the client gets Vertex's 429.
            assert_eq!(host.callouts.len(), 2);
            let (status, headers, _) = host.local_reply.clone().unwrap();
            assert_eq!(status, 429);
            assert_eq!(
                headers.get("x-llm-provider").map(String::as_str),
                Some("vertex")
            );
            continue;
        }
        // A day's: Haiku is asked, on Anthropic, and answers.
        assert_eq!(host.callouts.len(), 3);
        let (cluster, path, body) = last_callout(&host);
        assert_eq!(
            (cluster.as_str(), path.as_str()),
            ("anthropic", "/v1/messages")
        );
        assert_eq!(body["model"], "haiku");
        call.answer_callout(&mut w.env(), &mut host, answer(200, &[], ANSWER));
        let (status, headers, _) = host.local_reply.clone().unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            headers.get("x-llm-model").map(String::as_str),
            Some("haiku")
        );
        call.on_log(&mut w.env());
        assert_eq!(
            w.counter("llm_filter_routing_model_fallbacks_totalmodel=.=claude;.;reason=.=quota;.;result=.=answered;.;"),
            1
        );
    }
}

#[test]
fn the_walk_stops_at_max_retries_the_budget_and_the_backends_word() {
    // One failover a call: Bedrock's throttling is the client's answer.
    let mut w = World::new(&claude(r#""max_retries": 1"#));
    let (mut call, mut host) = overloaded_on_anthropic(&mut w);
    call.answer_callout(&mut w.env(), &mut host, throttled());
    assert_eq!(host.callouts.len(), 1);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    assert_eq!(
        headers.get("x-llm-provider").map(String::as_str),
        Some("bedrock")
    );

    // No room left in the budget for a third try.
    let mut w = World::new(&claude(""));
    let (mut call, mut host) = overloaded_on_anthropic(&mut w);
    w.now_ms += 59_500;
    call.answer_callout(&mut w.env(), &mut host, throttled());
    assert_eq!(host.callouts.len(), 1);
    assert_eq!(host.local_reply.as_ref().unwrap().0, 429);

    // A backend that says not to retry is not retried elsewhere.
    let mut w = World::new(&claude(""));
    let (mut call, mut host) = overloaded_on_anthropic(&mut w);
    let refused = answer(503, &[("x-should-retry", "false")], OVERLOADED);
    call.answer_callout(&mut w.env(), &mut host, refused);
    assert_eq!(host.callouts.len(), 1);
    assert_eq!(host.local_reply.as_ref().unwrap().0, 503);

    // A success or a client error ends the walk where it is.
    let mut w = World::new(&claude(""));
    let (mut call, mut host) = overloaded_on_anthropic(&mut w);
    let bad = r#"{"message":"Malformed input request"}"#;
    call.answer_callout(&mut w.env(), &mut host, answer(400, &[], bad));
    assert_eq!(host.callouts.len(), 1);
    assert_eq!(host.local_reply.as_ref().unwrap().0, 400);
}

#[test]
fn a_stream_walks_only_the_backends_that_stream_its_shape() {
    let config = claude("").replace(
        r#"{"cluster": "bedrock", "provider": "bedrock","#,
        r#"{"cluster": "bedrock", "provider": "bedrock_mantle","#,
    );
    let mut w = World::new(&config);
    let stream = MESSAGES.replace(r#""max_tokens":8"#, r#""max_tokens":8,"stream":true"#);
    let (mut call, mut host) = overloaded_first(&mut w, &stream);
    let (cluster, path, _) = last_callout(&host);
    assert_eq!(
        (cluster.as_str(), path.as_str()),
        ("bedrock", "/anthropic/v1/messages")
    );
    let paced = answer(
        429,
        &[],
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
    );
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, paced),
        Step::Pause
    );
    let (cluster, path, body) = last_callout(&host);
    assert_eq!(cluster, "vertex");
    assert!(path.ends_with("/claude@1:streamRawPredict"), "{path}");
    assert_eq!(body["stream"], true);
}

/// Opus on Anthropic then Bedrock; Sonnet, its fallback for every class, on
/// Bedrock then Anthropic.
fn opus_then_sonnet(budget: &str) -> String {
    format!(
        r#"{{
  "budget": {{{budget}}},
  "routing": {{"eject_after_failures": 100,
    "models": {{
      "opus": [
        {{"cluster": "anthropic", "provider": "anthropic", "weight": 1000000}},
        {{"cluster": "bedrock", "provider": "bedrock", "weight": 1, "model": "anthropic.opus-v1:0"}}
      ],
      "sonnet": [
        {{"cluster": "bedrock", "provider": "bedrock", "weight": 1000000, "model": "anthropic.sonnet-v1:0"}},
        {{"cluster": "anthropic", "provider": "anthropic", "weight": 1}}
      ]
    }},
    "fallbacks": {{"opus": {{"to": ["sonnet"]}}}}
  }}
}}"#
    )
}

/// An Opus call Anthropic overloaded, failed over to Bedrock, whose
/// refusal for the prompt's length (as Bedrock words it) ends Opus's walk.
fn opus_refused_after_failover(w: &mut World) -> (Call, FakeHost) {
    let opus = MESSAGES.replace(r#""claude""#, r#""opus""#);
    let (mut call, mut host) = overloaded_first(w, &opus);
    let (cluster, path, _) = last_callout(&host);
    assert_eq!(
        (cluster.as_str(), path.as_str()),
        ("bedrock", "/model/anthropic.opus-v1%3A0/invoke")
    );
    let too_long = answer(
        400,
        &[("x-amzn-errortype", "ValidationException")],
        r#"{"message":"Input is too long for requested model."}"#,
    );
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, too_long),
        Step::Pause
    );
    assert!(host.local_reply.is_none(), "the refusal is held back");
    (call, host)
}

#[test]
fn a_refusal_after_a_failover_takes_the_chain_and_the_fallback_model_fails_over_too() {
    let mut w = World::new(&opus_then_sonnet(""));
    let (mut call, mut host) = opus_refused_after_failover(&mut w);
    // The walk's last refusal moves the call to Sonnet, on Bedrock.
    assert_eq!(host.callouts.len(), 2);
    let (cluster, path, body) = last_callout(&host);
    assert_eq!(cluster, "bedrock");
    assert_eq!(path, "/model/anthropic.sonnet-v1%3A0/invoke");
    assert!(body.get("model").is_none(), "{body}");
    // Bedrock throttles Sonnet: Sonnet's own walk goes on to Anthropic,
    // which Opus's walk asked but Sonnet's did not, with Sonnet named.
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, throttled()),
        Step::Pause
    );
    assert!(host.local_reply.is_none());
    assert_eq!(host.callouts.len(), 3);
    let (cluster, path, body) = last_callout(&host);
    assert_eq!(
        (cluster.as_str(), path.as_str()),
        ("anthropic", "/v1/messages")
    );
    assert_eq!(body["model"], "sonnet");
    assert!(body.get("anthropic_version").is_none(), "{body}");
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, answer(200, &[], ANSWER)),
        Step::Pause
    );
    let (status, headers, sent) = host.local_reply.clone().unwrap();
    assert_eq!((status, sent.as_slice()), (200, ANSWER.as_bytes()));
    let told = |n: &str| headers.get(n).map(String::as_str);
    assert_eq!(told("x-llm-provider"), Some("anthropic"));
    assert_eq!(told("x-llm-model"), Some("sonnet"));
    assert_eq!(told("x-llm-cluster"), Some("anthropic"));
    call.on_log(&mut w.env());
    let fallbacks = |result: &str| {
        w.counter(&format!(
            "llm_filter_routing_model_fallbacks_totalmodel=.=opus;.;reason=.=context_length;.;result=.={result};.;"
        ))
    };
    // Sonnet's first backend failed; its failover answered, as did Opus's.
    assert_eq!(fallbacks("failed"), 1);
    assert_eq!(fallbacks("answered"), 0);
    assert_eq!(
        w.counter("llm_filter_routing_failovers_totalresult=.=answered;.;"),
        2
    );
    for cluster in ["anthropic", "bedrock"] {
        assert_eq!(
            health::read(&w.store, cluster).unwrap().in_flight,
            0,
            "{cluster}"
        );
    }
}

#[test]
fn the_fallback_models_walk_counts_against_the_calls_failovers_and_the_switch() {
    // One failover a call, spent on Opus's: Sonnet's throttling is the answer.
    let mut w = World::new(&opus_then_sonnet(r#""max_retries": 1"#));
    let (mut call, mut host) = opus_refused_after_failover(&mut w);
    assert_eq!(last_callout(&host).0, "bedrock");
    call.answer_callout(&mut w.env(), &mut host, throttled());
    assert_eq!(host.callouts.len(), 2);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 429);
    assert_eq!(
        headers.get("x-llm-model").map(String::as_str),
        Some("anthropic.sonnet-v1:0")
    );

    // Failover off: a fallback model's backend is not walked either.
    let config = opus_then_sonnet("").replace(
        r#""eject_after_failures": 100,"#,
        r#""eject_after_failures": 100, "failover": false,"#,
    );
    let mut w = World::new(&config);
    let mut host = FakeHost::post("/v1/messages")
        .with_header("anthropic-version", "2023-06-01")
        .with_body(&MESSAGES.replace(r#""claude""#, r#""opus""#));
    let (mut call, _) = w.request(&mut host).unwrap();
    let refused = r#"{"type":"error","error":{"type":"billing_error","message":"Billing issue"}}"#;
    let mut host = host.with_response(402, "application/json", refused);
    let size = host.response_body.len();
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Pause
    );
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, size, true),
        Step::Pause
    );
    assert_eq!(last_callout(&host).0, "bedrock", "billing: Sonnet is asked");
    call.answer_callout(&mut w.env(), &mut host, throttled());
    assert_eq!(host.callouts.len(), 1);
    assert_eq!(host.local_reply.clone().unwrap().0, 429);
}

/// Anthropic's account out of credit (402 `billing_error`) is that
/// backend's: the same model on Bedrock, billed to its own account, is
/// asked before the model's chain, and its answer is the client's.
#[test]
fn a_backends_billing_refusal_fails_over_before_the_chain() {
    let mut w = World::new(&opus_then_sonnet(""));
    let mut host = FakeHost::post("/v1/messages")
        .with_header("anthropic-version", "2023-06-01")
        .with_body(&MESSAGES.replace(r#""claude""#, r#""opus""#));
    let (mut call, _) = w.request(&mut host).unwrap();
    assert_eq!(host.header("x-llm-cluster"), Some("anthropic"));
    let refused = r#"{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low"}}"#;
    let mut host = host.with_response(402, "application/json", refused);
    let size = host.response_body.len();
    call.on_response_headers(&mut w.env(), &mut host, false);
    assert_eq!(
        call.on_response_body(&mut w.env(), &mut host, size, true),
        Step::Pause
    );
    let (cluster, path, _) = last_callout(&host);
    assert_eq!(
        (cluster.as_str(), path.as_str()),
        ("bedrock", "/model/anthropic.opus-v1%3A0/invoke"),
        "Opus on Bedrock, not Sonnet"
    );
    call.answer_callout(&mut w.env(), &mut host, answer(200, &[], ANSWER));
    assert_eq!(host.callouts.len(), 1);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("x-llm-model").map(String::as_str),
        Some("anthropic.opus-v1:0"),
        "Bedrock's Opus, no fallback: {headers:?}"
    );
}

/// Bedrock's account quota spent (a 400 named only in `x-amzn-errortype`)
/// is that account's: the same model at Anthropic is asked before the
/// chain; a 400 AWS names a bad request reaches the client.
#[test]
fn bedrocks_quota_fails_over_before_the_chain() {
    let config = r#"{"routing": {"eject_after_failures": 100, "models": {
            "opus": [{"cluster": "bedrock", "provider": "bedrock", "weight": 1000000,
                      "apis": ["messages"], "model": "anthropic.opus-v1:0"},
                     {"cluster": "anthropic", "provider": "anthropic", "weight": 1}],
            "sonnet": [{"cluster": "anthropic", "provider": "anthropic"}]},
          "fallbacks": {"opus": {"to": ["sonnet"]}}}}"#;
    let quota = r#"{"message":"Your request exceeds the service quota for your account."}"#;
    for (error_type, fails_over) in [
        (
            "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/",
            true,
        ),
        ("ValidationException", false),
    ] {
        let mut w = World::new(config);
        let mut host = FakeHost::post("/v1/messages")
            .with_header("anthropic-version", "2023-06-01")
            .with_body(&MESSAGES.replace(r#""claude""#, r#""opus""#));
        let (mut call, _) = w.request(&mut host).unwrap();
        assert_eq!(host.header("x-llm-cluster"), Some("bedrock"));
        let mut host = host
            .with_response(400, "application/json", quota)
            .with_response_header("x-amzn-errortype", error_type);
        let size = host.response_body.len();
        call.on_response_headers(&mut w.env(), &mut host, false);
        let step = call.on_response_body(&mut w.env(), &mut host, size, true);
        if !fails_over {
            assert_eq!(step, Step::Continue, "{error_type}");
            assert!(host.callouts.is_empty(), "{error_type}");
            continue;
        }
        assert_eq!(step, Step::Pause);
        let (cluster, _, body) = last_callout(&host);
        assert_eq!(cluster, "anthropic", "Opus at Anthropic, not Sonnet");
        assert_eq!(body["model"], "opus");
        call.answer_callout(&mut w.env(), &mut host, answer(200, &[], ANSWER));
        assert_eq!(host.callouts.len(), 1);
        assert_eq!(host.local_reply.clone().unwrap().0, 200);
    }
}

#[test]
fn bedrocks_quota_named_in_its_header_takes_the_chain() {
    let mut w = World::new(
        r#"{"routing": {"models": {
            "opus": [{"cluster": "bedrock", "provider": "bedrock", "apis": ["messages"],
                      "model": "anthropic.opus-v1:0"}],
            "sonnet": [{"cluster": "anthropic", "provider": "anthropic"}]},
          "fallbacks": {"opus": {"to": ["sonnet"]}}}}"#,
    );
    let quota = r#"{"message":"Your request exceeds the service quota for your account."}"#;
    let named =
        "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/";
    // Named only in the header: without it, a bad request for the client.
    for error_type in [None, Some(named)] {
        let mut host = FakeHost::post("/v1/messages")
            .with_header("anthropic-version", "2023-06-01")
            .with_body(&MESSAGES.replace(r#""claude""#, r#""opus""#));
        let (mut call, _) = w.request(&mut host).unwrap();
        assert_eq!(host.header("x-llm-cluster"), Some("bedrock"));
        let mut host = host.with_response(400, "application/json", quota);
        if let Some(t) = error_type {
            host = host.with_response_header("x-amzn-errortype", t);
        }
        let size = host.response_body.len();
        call.on_response_headers(&mut w.env(), &mut host, false);
        let step = call.on_response_body(&mut w.env(), &mut host, size, true);
        if error_type.is_none() {
            assert_eq!(step, Step::Continue);
            assert!(host.callouts.is_empty());
            call.on_log(&mut w.env());
            continue;
        }
        assert_eq!(step, Step::Pause);
        let (cluster, path, body) = last_callout(&host);
        assert_eq!(
            (cluster.as_str(), path.as_str()),
            ("anthropic", "/v1/messages")
        );
        assert_eq!(body["model"], "sonnet");
    }
}
