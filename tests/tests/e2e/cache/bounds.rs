//! The cache's limits through the real Envoy: a fixed table of slots however
//! many keys come, and expired entries answering upstream failures only within
//! `stale_if_error_s`.

use std::time::Duration;

use crate::support::cache::{cacheable, cacheable_stream, eventually, message, x_cache, Rig, CHAT};
use llm_filter_e2e::stream_sse;
use serde_json::json;

const SLOTS: u64 = 8;
const MAX_ENTRY_BYTES: u64 = 4096;

#[tokio::test]
async fn the_slot_table_stays_bounded_under_churn() {
    let Some(rig) = Rig::start(
        "the_slot_table_stays_bounded_under_churn",
        json!({"cache": {"max_entries": SLOTS, "max_entry_bytes": MAX_ENTRY_BYTES}}),
    ) else {
        return;
    };
    let keys = 5 * SLOTS;
    let mut last = None;
    for n in 0..keys {
        let body = cacheable(&format!("distinct question number {n}"));
        let r = rig.chat(&body, &[]).await;
        assert_eq!((r.status, x_cache(&r)), (200, "MISS"), "key {n}");
        let entries = rig.stat("llm_filter_cache_entries");
        let bytes = rig.stat("llm_filter_cache_bytes");
        assert!(entries <= SLOTS, "{entries} entries after key {n}");
        assert!(
            bytes <= SLOTS * MAX_ENTRY_BYTES,
            "{bytes} bytes after key {n}"
        );
        last = Some((body, r));
    }
    assert_eq!(rig.mock.request_count() as u64, keys);
    assert!(
        eventually(Duration::from_secs(5), || {
            rig.stat("llm_filter_cache_stores_totalresult=.=stored;.;") == keys
        }),
        "every answer was stored: {:?}",
        rig.envoy.stats_matching("llm_filter_cache")
    );
    let entries = rig.stat("llm_filter_cache_entries");
    assert!((1..=SLOTS).contains(&entries), "{entries}");
    let evictions = rig.stat("llm_filter_cache_evictions_total");
    assert!(
        evictions >= keys - SLOTS,
        "{evictions} evictions for {keys} keys in {SLOTS} slots"
    );
    // The newest answer is in the table and served.
    let (body, answer) = last.unwrap();
    let hit = rig.chat(&body, &[]).await;
    assert_eq!(x_cache(&hit), "HIT");
    assert_eq!(hit.json(), answer.json());
    // The gauges reach Prometheus with the same bounds.
    let metrics = rig.envoy.metrics();
    let gauge = |name: &str| llm_filter_e2e::prometheus::sum(&metrics, name, &[]);
    assert!(gauge("llm_filter_cache_entries") <= SLOTS as f64);
    assert!(gauge("llm_filter_cache_bytes") <= (SLOTS * MAX_ENTRY_BYTES) as f64);
}

#[tokio::test]
async fn an_expired_entry_answers_an_upstream_failure() {
    let Some(rig) = Rig::start(
        "an_expired_entry_answers_an_upstream_failure",
        json!({"cache": {"ttl_s": 1, "ttl_jitter": 0, "stale_if_error_s": 300}}),
    ) else {
        return;
    };
    let question = "Will this survive an outage?";
    let body = cacheable(question);
    let old = rig.chat(&body, &[]).await;
    assert_eq!(x_cache(&old), "MISS");
    assert!(wait_until_expired(&rig, &body).await);

    // The upstream fails (every retry too): the old answer instead.
    rig.mock.set_status(Some(503));
    let stale = rig.chat(&body, &[]).await;
    assert_eq!(stale.status, 200, "{}", stale.text());
    assert_eq!(x_cache(&stale), "STALE");
    assert_eq!(stale.json(), old.json());
    assert_eq!(stale.header("content-type"), Some("application/json"));
    assert!(stale.header("age").unwrap().parse::<u64>().unwrap() >= 1);

    // A streamed call gets the old answer as a stream.
    let sse = stream_sse(&rig.url(CHAT), &cacheable_stream(question, false), &[])
        .await
        .unwrap();
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("x-cache"), Some("STALE"));
    assert_eq!(sse.header("content-type"), Some("text/event-stream"));
    assert!(sse.done());
    assert_eq!(sse.content(), message(&old));

    // A dropped connection (Envoy answers 503 itself) too.
    rig.mock.set_status(None);
    let reset = rig.chat(&body, &[("x-mock-reset", "1")]).await;
    assert_eq!((reset.status, x_cache(&reset)), (200, "STALE"));
    assert_eq!(reset.json(), old.json());

    // And Envoy's own timeout, when the caller's budget runs out upstream.
    let timed_out = rig
        .chat(
            &body,
            &[
                ("x-request-timeout-ms", "1500"),
                ("x-mock-delay-ms", "4000"),
            ],
        )
        .await;
    assert_eq!((timed_out.status, x_cache(&timed_out)), (200, "STALE"));
    assert_eq!(timed_out.json(), old.json());

    assert!(rig.lookups("stale", 4) >= 4);
    // An uncached call's failure still reaches the client.
    rig.mock.set_status(Some(503));
    let other = rig.chat(&cacheable("never cached"), &[]).await;
    assert_eq!((other.status, x_cache(&other)), (503, "MISS"));
}

#[tokio::test]
async fn without_stale_if_error_failures_pass_through() {
    let Some(rig) = Rig::start(
        "without_stale_if_error_failures_pass_through",
        json!({"cache": {"ttl_s": 1, "ttl_jitter": 0}}),
    ) else {
        return;
    };
    let body = cacheable("No safety net.");
    rig.chat(&body, &[]).await;
    assert!(wait_until_expired(&rig, &body).await);
    rig.mock.set_status(Some(503));
    let r = rig.chat(&body, &[]).await;
    assert_eq!((r.status, x_cache(&r)), (503, "MISS"));
}

/// Waits (up to 5 s) until `body` is no longer a hit. The probes ask the
/// upstream for a 418 when they miss: never stored, never answered stale.
async fn wait_until_expired(rig: &Rig, body: &serde_json::Value) -> bool {
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    for _ in 0..40 {
        let probe = rig.chat(body, &[("x-mock-status", "418")]).await;
        if x_cache(&probe) != "HIT" {
            assert_eq!(probe.status, 418);
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
