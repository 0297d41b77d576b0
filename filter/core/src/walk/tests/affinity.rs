//! Affinity through the walk: a conversation's turns go to one backend with
//! its key in the affinity header, conversations spread, and a backend that
//! takes it gets the key as `prompt_cache_key`.

use std::collections::BTreeMap;

use super::*;

const CONFIG: &str = r#"{
  "routing": {
    "models": {"gpt-4o": [
      {"cluster": "a", "prompt_cache_key": true},
      {"cluster": "b"},
      {"cluster": "c"}
    ]}
  }
}"#;

/// Turn `turns` of conversation `topic`: the same first user turn, a
/// history growing by two messages a turn.
fn turn(topic: &str, turns: usize) -> String {
    let mut messages = vec![
        r#"{"role":"system","content":"be brief"}"#.to_string(),
        format!(r#"{{"role":"user","content":"tell me about {topic}"}}"#),
    ];
    for n in 0..turns {
        messages.push(format!(r#"{{"role":"assistant","content":"answer {n}"}}"#));
        messages.push(format!(r#"{{"role":"user","content":"and {n}?"}}"#));
    }
    format!(
        r#"{{"model":"gpt-4o","messages":[{}]}}"#,
        messages.join(",")
    )
}

/// The cluster, affinity header and body a call of `body` is sent with.
fn send(w: &mut World, body: &str, session: Option<&str>) -> (String, String, String) {
    let mut host = FakeHost::post("/v1/chat/completions").with_body(body);
    if let Some(s) = session {
        host = host.with_header("x-session-id", s);
    }
    let (call, _) = w.request(&mut host).unwrap();
    call.on_log(&mut w.env());
    (
        host.header("x-llm-cluster").unwrap_or_default().to_string(),
        host.header("x-llm-affinity")
            .unwrap_or_default()
            .to_string(),
        String::from_utf8(host.request_body.clone()).unwrap(),
    )
}

#[test]
fn a_conversation_stays_on_one_backend_and_conversations_spread() {
    let mut w = World::new(CONFIG);
    let mut by_cluster: BTreeMap<String, usize> = BTreeMap::new();
    for topic in 0..60 {
        let topic = format!("topic {topic}");
        let (cluster, key, _) = send(&mut w, &turn(&topic, 0), None);
        assert_eq!(key.len(), 16, "{key}");
        for turns in 1..5 {
            let (c, k, _) = send(&mut w, &turn(&topic, turns), None);
            assert_eq!((&c, &k), (&cluster, &key), "{topic}, turn {turns}");
        }
        *by_cluster.entry(cluster).or_default() += 1;
    }
    assert_eq!(by_cluster.len(), 3, "{by_cluster:?}");
    assert!(by_cluster.values().all(|n| *n >= 8), "{by_cluster:?}");
}

#[test]
fn a_session_header_keys_calls_whatever_they_say() {
    let mut w = World::new(CONFIG);
    let (cluster, key, _) = send(&mut w, &turn("x", 0), Some("session-1"));
    for topic in ["y", "z", "w"] {
        let (c, k, _) = send(&mut w, &turn(topic, 0), Some("session-1"));
        assert_eq!((&c, &k), (&cluster, &key));
    }
}

#[test]
fn a_backend_that_takes_it_gets_the_key_as_prompt_cache_key() {
    let mut w = World::new(CONFIG);
    let mut seen = BTreeMap::new();
    for topic in 0..40 {
        let (cluster, key, body) = send(&mut w, &turn(&format!("t{topic}"), 0), None);
        let added = format!(r#","prompt_cache_key":"{key}"}}"#);
        if cluster == "a" {
            assert!(body.ends_with(&added), "{body}");
        } else {
            assert!(!body.contains("prompt_cache_key"), "{cluster}: {body}");
        }
        seen.insert(cluster, ());
    }
    assert!(seen.contains_key("a"));
    // The caller's own key stays as it is, and keys the call.
    for topic in 0..10 {
        let body = format!(
            r#"{{"model":"gpt-4o","prompt_cache_key":"mine","messages":[{{"role":"user","content":"{topic}"}}]}}"#
        );
        let (cluster, _, sent) = send(&mut w, &body, None);
        assert_eq!(sent.matches("prompt_cache_key").count(), 1, "{sent}");
        assert!(sent.contains(r#""prompt_cache_key":"mine""#));
        let (again, _, _) = send(&mut w, &body.replace("gpt-4o\"", "gpt-4o\" "), None);
        assert_eq!(again, cluster);
    }
}

#[test]
fn affinity_off_writes_no_header_and_draws() {
    let mut w = World::new(
        r#"{"routing":{"models":{"gpt-4o":[{"cluster":"a"},{"cluster":"b"}]},
            "affinity":{"enabled":false}}}"#,
    );
    let mut seen = BTreeMap::new();
    for _ in 0..40 {
        let (cluster, key, _) = send(&mut w, &turn("x", 0), None);
        assert_eq!(key, "");
        seen.insert(cluster, ());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}
