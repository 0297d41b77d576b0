//! Configuration changes at run time: Envoy takes a new filter configuration
//! by extension config discovery while it runs, as a control plane delivers
//! one. A call in flight finishes, new calls get the new configuration, and
//! the cache table takes its new size, keeping only entries their keys reach.

use std::time::Duration;

use llm_filter_e2e::{
    post_json, skip_without_envoy, unique, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::json;

use crate::support::cache::{cacheable, x_cache, CHAT, FILTER_STATS};

fn baggage_of(mock: &MockUpstream, content: &str) -> Option<String> {
    mock.requests()
        .iter()
        .rev()
        .find(|r| String::from_utf8_lossy(&r.body).contains(content))
        .and_then(|r| r.header("baggage").map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_config_takes_over_while_calls_finish_and_the_cache_shrinks() {
    if skip_without_envoy("a_new_config_takes_over_while_calls_finish_and_the_cache_shrinks") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("up"));
    let envoy = EnvoyBuilder::new()
        .discovered_config()
        .plugin_config(json!({"cache": {"max_entries": 64}}))
        .upstream(mock.name(), mock.port())
        .start()
        .expect("envoy with a discovered filter config");
    let url = envoy.url(CHAT);
    let prompts: Vec<String> = (0..40).map(|i| unique(&format!("fill {i}"))).collect();
    for p in &prompts {
        let r = post_json(&url, &cacheable(p), &[]).await.expect("fill");
        assert_eq!((r.status, x_cache(&r)), (200, "MISS"), "{p}");
    }
    let entries = format!("{FILTER_STATS}llm_filter_cache_entries");
    let filled = envoy.wait_for_stat(&entries, 30, Duration::from_secs(10));
    assert!(filled >= 30, "{filled} entries in 64 slots");

    // A slow call is under way when the new configuration arrives.
    mock.set_default_delay_ms(1_500);
    let slow_prompt = unique("in flight");
    // (Not stored: an answer stored by a call of the old, larger table may
    // land beyond the new one, which the next resize empties.)
    let slow = tokio::spawn({
        let (url, body) = (url.clone(), cacheable(&slow_prompt));
        async move { post_json(&url, &body, &[("cache-control", "no-store")]).await }
    });
    // Upstream, so tagged under the old configuration, before the reload.
    assert!(mock.in_flight_reaches(1, Duration::from_secs(5)).await);
    envoy
        .reload_plugin_config(json!({
            "cache": {"max_entries": 8},
            "priority": {"default": "P2"}
        }))
        .expect("the new config");
    let r = slow.await.expect("task").expect("the call in flight");
    assert_eq!(r.status, 200, "the call in flight finishes: {}", r.text());
    assert_eq!(
        baggage_of(&mock, &slow_prompt).as_deref(),
        Some("priority=P1")
    );
    mock.set_default_delay_ms(0);

    // New calls get the new configuration.
    let fresh = unique("after");
    let r = post_json(&url, &cacheable(&fresh), &[])
        .await
        .expect("call");
    assert_eq!(r.status, 200);
    assert_eq!(baggage_of(&mock, &fresh).as_deref(), Some("priority=P2"));

    // The table shrank to 8 slots: what no key reaches any more is gone, and
    // the totals say so.
    let left = envoy.stat(&entries);
    assert!(left <= 8, "{left} entries in 8 slots");
    let mut hits = 0;
    for p in &prompts {
        let r = post_json(&url, &cacheable(p), &[]).await.expect("again");
        assert_eq!(r.status, 200);
        if x_cache(&r) == "HIT" {
            hits += 1;
        }
    }
    eprintln!("filled {filled}, {left} left after the shrink, {hits} of 40 still hit");
    assert!(hits <= 8, "{hits} hits from 8 slots");
    assert!(envoy.stat(&entries) <= 8);
    assert!(!envoy.log_contents().contains("panicked"));
}
