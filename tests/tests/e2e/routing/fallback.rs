//! Fallback chains by error class through the real Envoy: a call that its
//! model's backend refuses for the context length or a spent quota moves to
//! the next model of its chain, the error held back; the client gets that
//! model's answer with `x-llm-model` naming it. Other refusals reach the
//! client as the backend wrote them.

use llm_filter_e2e::{
    chat_body, chat_stream_body, post_json, prometheus, skip_without_envoy, stream_sse, unique,
    MockUpstream,
};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const FALLBACKS: &str = "llm_filter_routing_model_fallbacks_total";

/// The models each mock received, in order.
fn models_seen(mock: &MockUpstream) -> Vec<String> {
    mock.requests()
        .iter()
        .filter(|r| r.path == CHAT)
        .filter_map(|r| Some(r.json()?.get("model")?.as_str()?.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_call_moves_along_its_chain_and_says_which_model_answered() {
    let test = "a_refused_call_moves_along_its_chain_and_says_which_model_answered";
    if skip_without_envoy(test) {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (small, big, mini) = (
        MockUpstream::backend("small", 0),
        MockUpstream::backend("big", 0),
        MockUpstream::backend("mini", 0),
    );
    let config = json!({
        "routing": {
            "models": {
                "gpt-4o": [{"cluster": "small"}],
                "gpt-4.1": [{"cluster": "big"}],
                "gpt-4o-mini": [{"cluster": "mini"}]
            },
            "fallbacks": {"gpt-4o": {"to": ["gpt-4.1", "gpt-4o-mini"]}},
            "probe_interval_s": 600
        },
        "cache": {"enabled": false}
    });
    let envoy = super::envoy(&config, &default, &[&small, &big, &mini]);
    let url = envoy.url(CHAT);

    // The prompt is too long for gpt-4o: gpt-4.1 answers.
    small.set_error(Some((400, "context_length_exceeded")));
    let r = post_json(&url, &chat_body("gpt-4o", &unique("a long history")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-model"), Some("gpt-4.1"));
    assert_eq!(r.header("x-llm-cluster"), Some("big"));
    assert_eq!(r.header("x-mock-instance"), Some("big"));
    assert_eq!(r.json()["object"], "chat.completion");
    assert_eq!(models_seen(&small), ["gpt-4o"]);
    assert_eq!(models_seen(&big), ["gpt-4.1"]);

    // A stream too: the refusal comes before any event, and the next
    // model's stream is the answer.
    let s = stream_sse(
        &url,
        &chat_stream_body("gpt-4o", &unique("stream it"), false),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-llm-model"), Some("gpt-4.1"));
    assert!(
        s.header("content-type")
            .is_some_and(|c| c.contains("text/event-stream")),
        "{:?}",
        s.headers
    );
    assert!(
        !s.chunks().is_empty(),
        "{}",
        String::from_utf8_lossy(&s.raw)
    );
    assert_eq!(models_seen(&big), ["gpt-4.1", "gpt-4.1"]);

    // gpt-4.1's quota is spent too: the chain goes on to gpt-4o-mini.
    big.set_error(Some((429, "insufficient_quota")));
    let r = post_json(&url, &chat_body("gpt-4o", &unique("still long")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-model"), Some("gpt-4o-mini"));
    assert_eq!(r.header("x-llm-cluster"), Some("mini"));
    assert_eq!(models_seen(&mini), ["gpt-4o-mini"]);
    assert_eq!(models_seen(&big).len(), 3);

    // Every model refuses: the client gets the chain's last refusal.
    mini.set_error(Some((400, "context_length_exceeded")));
    let r = post_json(&url, &chat_body("gpt-4o", &unique("far too long")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(r.header("x-llm-model"), Some("gpt-4o-mini"));
    assert_eq!(models_seen(&mini).len(), 2);

    // A bad request is the caller's: it reaches the client untouched, and
    // no other model is asked.
    small.set_error(Some((400, "invalid_value")));
    let (big_before, mini_before) = (models_seen(&big).len(), models_seen(&mini).len());
    let r = post_json(&url, &chat_body("gpt-4o", &unique("bad")), &[])
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let body: Value = r.json();
    assert_eq!(body["error"]["code"], "invalid_value");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("mock small")));
    assert_eq!(r.header("x-llm-model"), None);
    assert_eq!(models_seen(&big).len(), big_before);
    assert_eq!(models_seen(&mini).len(), mini_before);
    assert_eq!(default.count("POST", CHAT), 0);

    let samples = envoy.metrics();
    let counted = |reason: &str, result: &str| {
        prometheus::sum(
            &samples,
            FALLBACKS,
            &[("model", "gpt-4o"), ("reason", reason), ("result", result)],
        )
    };
    // Answered by gpt-4.1 twice; refused by gpt-4.1 then answered by mini;
    // refused all the way down.
    assert_eq!(counted("context_length", "answered"), 2.0);
    assert_eq!(counted("context_length", "failed"), 2.0);
    assert_eq!(counted("quota", "answered"), 1.0);
    assert_eq!(counted("quota", "failed"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fallback_is_held_to_the_limits_of_the_model_it_reaches() {
    let test = "a_fallback_is_held_to_the_limits_of_the_model_it_reaches";
    if skip_without_envoy(test) {
        return;
    }
    let default = MockUpstream::backend("default", 0);
    let (small, big) = (
        MockUpstream::backend("small", 0),
        MockUpstream::backend("big", 0),
    );
    // gpt-4.1 is the expensive model: one call a minute per key, whichever
    // way the call gets there.
    let config = json!({
        "routing": {
            "models": {"gpt-4o": [{"cluster": "small"}], "gpt-4.1": [{"cluster": "big"}]},
            "fallbacks": {"gpt-4o": {"to": ["gpt-4.1"]}},
            "probe_interval_s": 600
        },
        "limits": {"rules": [
            {"name": "big", "by": ["tenant"], "models": ["gpt-4.1"], "requests_per_minute": 1}
        ]},
        "cache": {"enabled": false}
    });
    let envoy = super::envoy(&config, &default, &[&small, &big]);
    let url = envoy.url(CHAT);
    let key = [("authorization", "Bearer sk-fallback-tenant")];
    small.set_error(Some((400, "context_length_exceeded")));
    // The first fallback of the key takes gpt-4.1's call.
    let r = post_json(&url, &chat_body("gpt-4o", &unique("long")), &key)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-model"), Some("gpt-4.1"));
    // The second may not reach gpt-4.1: the limit's 429, in OpenAI's shape,
    // and gpt-4.1's backend never sees it.
    let r = post_json(&url, &chat_body("gpt-4o", &unique("longer")), &key)
        .await
        .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "llm_filter_limit_exceeded");
    assert!(r.json()["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("rule big")));
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    assert!(r.header("retry-after").is_some());
    assert_eq!(models_seen(&big), ["gpt-4.1"]);
    assert_eq!(models_seen(&small), ["gpt-4o", "gpt-4o"]);
    // Calls of gpt-4o that need no fallback are no calls of gpt-4.1.
    small.set_error(None);
    for i in 0..3 {
        let r = post_json(
            &url,
            &chat_body("gpt-4o", &unique(&format!("short {i}"))),
            &key,
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Another key has its own call of gpt-4.1.
    small.set_error(Some((400, "context_length_exceeded")));
    let r = post_json(
        &url,
        &chat_body("gpt-4o", &unique("long")),
        &[("authorization", "Bearer sk-other-tenant")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(models_seen(&big).len(), 2);
    let samples = envoy.metrics();
    let limited = prometheus::sum(
        &samples,
        FALLBACKS,
        &[
            ("model", "gpt-4o"),
            ("reason", "context_length"),
            ("result", "limited"),
        ],
    );
    assert_eq!(limited, 1.0);
}
