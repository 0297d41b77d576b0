//! Request shaping through the real Envoy: the upstream receives the capped and
//! trimmed body with a matching `content-length`, the client hears what changed
//! in `x-llm-shaped`, the cache keys the body as sent, streamed calls are shaped
//! too, and P0 is left alone.

use llm_filter_e2e::post_raw;
use serde_json::{json, Value};

use crate::support::cache::{x_cache, Rig, CHAT};

fn config() -> Value {
    json!({
        "shaping": {
            "max_tokens_cap": {"P1": 256, "P2": 64},
            "max_history_turns": 2,
            "max_prompt_tokens": 3000
        },
        "cache": {"enabled": true}
    })
}

/// A conversation of `old` earlier turns (each a user question and an
/// answer), one recent turn and the current question.
fn conversation(old: &[&str], question: &str) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for q in old {
        messages.push(json!({"role": "user", "content": q}));
        messages.push(json!({"role": "assistant", "content": format!("answer to {q}")}));
    }
    messages.push(json!({"role": "user", "content": "recent"}));
    messages.push(json!({
        "role": "assistant", "content": null,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    }));
    messages.push(json!({"role": "tool", "tool_call_id": "c1", "content": "42"}));
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": "gpt-4o", "temperature": 0, "max_tokens": 4096, "messages": messages})
}

/// What the cap and the trim leave of [`conversation`]'s messages.
fn shaped_roles() -> Vec<&'static str> {
    vec!["system", "user", "assistant", "tool", "user"]
}

fn roles(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_the_shaped_body_and_the_client_hears_it() {
    let Some(rig) = Rig::start("shaping_upstream", config()) else {
        return;
    };
    let body = conversation(&["first", "second"], "now?");
    let r = rig.chat(&body, &[("x-request-priority", "P2")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-shaped"), Some("max_tokens,history"));
    let got = rig.mock.last_request().unwrap();
    let sent = got.json().unwrap();
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(roles(&sent), shaped_roles());
    assert_eq!(sent["messages"][1]["content"], "recent");
    assert_eq!(
        sent["messages"][2], body["messages"][6],
        "tool call kept whole"
    );
    assert_eq!(
        got.header("content-length"),
        Some(got.body.len().to_string().as_str())
    );

    // P1 gets its own cap; a call asking for less than the cap keeps it.
    let mut small = conversation(&[], "small?");
    small["max_tokens"] = json!(10);
    let r = rig.chat(&small, &[("x-request-priority", "P1")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-llm-shaped"), None);
    assert_eq!(rig.mock.last_request().unwrap().json().unwrap(), small);
    let r = rig
        .chat(
            &conversation(&["a", "b", "c"], "p1?"),
            &[("x-request-priority", "P1")],
        )
        .await;
    assert_eq!(r.header("x-llm-shaped"), Some("max_tokens,history"));
    assert_eq!(
        rig.mock.last_request().unwrap().json().unwrap()["max_tokens"],
        256
    );

    // A call that names no limit gets the cap set.
    let mut none = conversation(&[], "none?");
    none.as_object_mut().unwrap().remove("max_tokens");
    let r = rig.chat(&none, &[("x-request-priority", "P2")]).await;
    assert_eq!(r.header("x-llm-shaped"), Some("max_tokens"));
    assert_eq!(
        rig.mock.last_request().unwrap().json().unwrap()["max_tokens"],
        64
    );

    assert_eq!(
        rig.wait_stat(
            "llm_filter_shaped_totalwhat=.=history;.;priority=.=P2;.;",
            1
        ),
        1
    );
    assert_eq!(
        rig.wait_stat(
            "llm_filter_shaped_totalwhat=.=max_tokens;.;priority=.=P2;.;",
            2
        ),
        2
    );
    assert_eq!(
        rig.wait_stat(
            "llm_filter_shaped_totalwhat=.=max_tokens;.;priority=.=P1;.;",
            1
        ),
        1
    );
    let prom = rig.envoy.metric(
        "llm_filter_shaped_total",
        &[("what", "history"), ("priority", "P2")],
    );
    assert_eq!(prom, 1.0, "the stats tags give the labels");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p0_and_bodies_it_does_not_understand_pass_untouched() {
    let Some(rig) = Rig::start("shaping_p0", config()) else {
        return;
    };
    let body = conversation(&["first", "second"], "p0?");
    let r = rig.chat(&body, &[("x-request-priority", "P0")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-llm-shaped"), None);
    assert_eq!(rig.mock.last_request().unwrap().json().unwrap(), body);

    // Three turns over a limit of two, but a token limit shaping does not
    // understand: nothing is changed.
    let odd = r#"{"model":"gpt-4o","max_tokens":"lots","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"user","content":"z"},{"role":"assistant","content":"w"},{"role":"user","content":"v"}]}"#;
    let r = post_raw(&rig.url(CHAT), odd, &[("x-request-priority", "P2")])
        .await
        .unwrap();
    assert_eq!(r.header("x-llm-shaped"), None);
    assert_eq!(&rig.mock.last_request().unwrap().body[..], odd.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_keys_what_is_sent() {
    let Some(rig) = Rig::start("shaping_cache", config()) else {
        return;
    };
    let first = rig
        .chat(
            &conversation(&["old one"], "same?"),
            &[("x-request-priority", "P2")],
        )
        .await;
    assert_eq!(x_cache(&first), "MISS");
    rig.lookups("miss", 1);
    // Differs only in old turns that are dropped: the same call is sent.
    let second = rig
        .chat(
            &conversation(&["other", "older"], "same?"),
            &[("x-request-priority", "P2")],
        )
        .await;
    assert_eq!(x_cache(&second), "HIT");
    assert_eq!(second.header("x-llm-shaped"), Some("max_tokens,history"));
    assert_eq!(second.body, first.body);
    assert_eq!(rig.mock.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_are_shaped_too() {
    let Some(rig) = Rig::start("shaping_stream", config()) else {
        return;
    };
    let mut body = conversation(&["first", "second"], "stream?");
    body["stream"] = json!(true);
    body["max_completion_tokens"] = json!(5000);
    body.as_object_mut().unwrap().remove("max_tokens");
    let r = rig.chat(&body, &[("x-request-priority", "P2")]).await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(r.header("x-llm-shaped"), Some("max_tokens,history"));
    assert!(r.text().contains("data: [DONE]"));
    let sent = rig.mock.last_request().unwrap().json().unwrap();
    assert_eq!(sent["max_completion_tokens"], 64);
    assert!(sent.get("max_tokens").is_none());
    assert_eq!(roles(&sent), shaped_roles());
}

/// A Chinese conversation: each old turn a question and an answer of 100
/// ideographs (100 estimated tokens each; a quarter per character said 25).
fn chinese(old: usize) -> Value {
    let text = "天".repeat(100);
    let mut messages = vec![json!({"role": "system", "content": "s"})];
    for i in 0..old {
        messages.push(json!({"role": "user", "content": format!("{i}{text}")}));
        messages.push(json!({"role": "assistant", "content": text}));
    }
    messages.push(json!({"role": "user", "content": "现在呢？"}));
    json!({"model": "qwen", "messages": messages})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chinese_history_is_trimmed_where_its_tokens_reach_the_cap() {
    let config = json!({"shaping": {"max_prompt_tokens": 500}});
    let Some(rig) = Rig::start("shaping_chinese", config) else {
        return;
    };
    // Five old turns of 200 tokens: with the system prompt and the question
    // the newest two fit 500, a third does not. A quarter per character
    // weighed the whole conversation at about 260 and sent it all.
    let body = chinese(5);
    let r = rig.chat(&body, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-shaped"), Some("history"));
    let sent = rig.mock.last_request().unwrap().json().unwrap();
    let messages = body["messages"].as_array().unwrap();
    let mut want = vec![messages[0].clone()];
    want.extend_from_slice(&messages[7..]);
    assert_eq!(
        sent["messages"],
        json!(want),
        "the system prompt and turns 3, 4"
    );
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "echo: 现在呢？ [up]"
    );
}
