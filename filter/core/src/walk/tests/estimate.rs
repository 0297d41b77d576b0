//! Scenario tests of the prompt-token estimate in the walk: a Chinese
//! history is weighed by script, each model's ratio is learnt from the usage
//! its provider reports, and the history cap and the prompt-length rules act
//! on the calibrated estimate; the ratio is read once per call, and only by
//! calls that use it.

use crate::tokens::calibration::KEY;
use crate::walk::fake::{FakeHost, World};

/// A conversation of `old` earlier turns, each a question and an answer of
/// 100 ideographs (100 estimated tokens each, where a quarter per character
/// said 25), then the current question.
fn conversation(model: &str, old: usize) -> String {
    let text = "天".repeat(100);
    let mut messages = vec![r#"{"role":"system","content":"s"}"#.to_string()];
    for i in 0..old {
        messages.push(format!(r#"{{"role":"user","content":"{i}{text}"}}"#));
        messages.push(format!(r#"{{"role":"assistant","content":"{text}"}}"#));
    }
    messages.push(r#"{"role":"user","content":"now"}"#.to_string());
    format!(
        r#"{{"model":"{model}","messages":[{}]}}"#,
        messages.join(",")
    )
}

/// The first digit of each old question kept: which turns were sent.
fn kept_turns(body: &[u8]) -> Vec<u32> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str()?.chars().next()?.to_digit(10))
        .collect()
}

fn answer(prompt_tokens: u64) -> String {
    format!(
        r#"{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"ok"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":1}}}}"#
    )
}

/// One whole call of `body`, answered with `prompt_tokens` reported; the
/// body the upstream got.
fn call(w: &mut World, body: &str, prompt_tokens: u64) -> FakeHost {
    let mut host = FakeHost::post("/v1/chat/completions").with_body(body);
    let (mut call, _) = w.request(&mut host).unwrap();
    let mut host = host.with_response(200, "application/json", &answer(prompt_tokens));
    w.respond(&mut call, &mut host);
    call.on_log(&mut w.env());
    host
}

const CAPPED: &str = r#"{"shaping":{"max_prompt_tokens":500}}"#;

fn gauge(w: &World, model: &str) -> Option<i64> {
    let name = format!("llm_filter_token_estimate_ratio_millimodel=.={model};.;");
    w.metrics.gauges.get(&name).copied()
}

#[test]
fn a_chinese_history_is_trimmed_where_its_tokens_reach_the_cap() {
    let mut w = World::new(CAPPED);
    // 5 old turns of 200 tokens: the newest two fit 500 with the system
    // prompt and the question (a quarter per character kept all five).
    let host = call(&mut w, &conversation("m", 5), 0);
    assert_eq!(kept_turns(&host.request_body), vec![3, 4]);
    assert_eq!(host.response("x-llm-shaped"), Some("history"));
}

#[test]
fn the_ratio_is_learnt_from_reported_usage_and_moves_the_cap() {
    let mut w = World::new(CAPPED);
    // Sent: 2 old turns, 400 + 2 estimated tokens; the provider counts twice that.
    for i in 0..3 {
        let before = w.store.reads(KEY);
        let host = call(&mut w, &conversation("m", 5), 804);
        // One read to weigh the call, one for the update at its end.
        assert_eq!(w.store.reads(KEY) - before, 2, "call {i}");
        assert_eq!(gauge(&w, "m"), Some(2000), "call {i}");
        if i == 0 {
            assert_eq!(kept_turns(&host.request_body), vec![3, 4]);
        } else {
            // 200 estimated tokens a turn are 400 of the model's: one fits.
            assert_eq!(kept_turns(&host.request_body), vec![4]);
        }
    }
    // A provider counting as estimated brings the ratio back by a fifth of
    // the way a call.
    call(&mut w, &conversation("m", 5), 202);
    assert_eq!(gauge(&w, "m"), Some(1800));
    // Another model has its own.
    let host = call(&mut w, &conversation("n", 5), 0);
    assert_eq!(kept_turns(&host.request_body), vec![3, 4]);
    assert_eq!(gauge(&w, "n"), None);
}

#[test]
fn calls_that_do_not_use_the_estimate_read_and_learn_nothing() {
    for config in [
        "{}",
        r#"{"shaping":{"max_tokens_cap":100}}"#,
        r#"{"shaping":{"max_prompt_tokens":{"P2":500}}}"#,
    ] {
        let mut w = World::new(config);
        call(&mut w, &conversation("m", 5), 4000);
        assert_eq!(w.store.reads(KEY), 0, "{config}");
        assert_eq!(gauge(&w, "m"), None, "{config}");
    }
    // The knob turns learning off, not the reading.
    let mut w = World::new(r#"{"shaping":{"max_prompt_tokens":500,"calibrate_estimate":false}}"#);
    call(&mut w, &conversation("m", 5), 4000);
    assert_eq!(w.store.reads(KEY), 1);
    assert_eq!(gauge(&w, "m"), None);
}

#[test]
fn tools_images_small_prompts_and_failures_teach_nothing() {
    let mut w = World::new(CAPPED);
    let tools = conversation("m", 1).replace(
        r#""messages""#,
        r#""tools":[{"type":"function","function":{"name":"f"}}],"messages""#,
    );
    call(&mut w, &tools, 4000);
    let image = conversation("m", 1).replace(
        r#""content":"now""#,
        r#""content":[{"type":"image_url","image_url":{"url":"data:x"}}]"#,
    );
    call(&mut w, &image, 4000);
    call(
        &mut w,
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        4000,
    );
    let mut host = FakeHost::post("/v1/chat/completions").with_body(&conversation("m", 1));
    let (mut c, _) = w.request(&mut host).unwrap();
    let mut host = host.with_response(500, "application/json", &answer(4000));
    w.respond(&mut c, &mut host);
    c.on_log(&mut w.env());
    assert_eq!(gauge(&w, "m"), None);
}

const RULES: &str = r#"{
  "routing": {
    "models": {"big": [{"cluster": "big"}], "small": [{"cluster": "small"}]},
    "rules": [
      {"when": {"model": "auto", "min_prompt_tokens": 300}, "model": "big"},
      {"when": {"model": "auto"}, "model": "small"}
    ]
  }
}"#;

/// Routing rules on the prompt's length (the `routing` feature).
#[cfg(feature = "routing")]
mod routed {
    use super::*;

    #[test]
    fn prompt_length_rules_weigh_the_calibrated_estimate() {
        let mut w = World::new(RULES);
        // 1 old turn: 202 estimated tokens, under the rule's 300.
        let body = conversation("auto", 1);
        let host = call(&mut w, &body, 404);
        assert_eq!(host.header("x-llm-cluster"), Some("small"));
        assert_eq!(gauge(&w, "auto"), Some(2000));
        // The same prompt is 404 of the model's tokens now.
        let host = call(&mut w, &body, 404);
        assert_eq!(host.header("x-llm-cluster"), Some("big"));
        // A rule that does not look at sizes reads no ratio.
        let mut w = World::new(&RULES.replace(r#", "min_prompt_tokens": 300"#, ""));
        call(&mut w, &body, 404);
        assert_eq!(w.store.reads(KEY), 0);
    }
}
