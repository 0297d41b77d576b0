//! Concurrent identical calls through the real Envoy: while one is in flight
//! the others, on any worker, wait for its entry instead of paying for the same
//! answer; when it fails or the wait runs out they go upstream themselves.

use std::time::Duration;

use crate::support::cache::{cacheable, x_cache, Rig, CHAT};
use llm_filter_e2e::HttpResponse;
use serde_json::{json, Value};

/// Starts `n` identical calls at once (each on its own connection).
fn launch(rig: &Rig, body: &Value, n: usize) -> Vec<tokio::task::JoinHandle<HttpResponse>> {
    (0..n)
        .map(|_| {
            let url = rig.url(CHAT);
            let body = body.clone();
            tokio::spawn(async move {
                llm_filter_e2e::post_json(&url, &body, &[])
                    .await
                    .unwrap_or_else(|e| panic!("twin: {e:#}"))
            })
        })
        .collect()
}

#[tokio::test]
async fn concurrent_twins_share_one_upstream_call() {
    let Some(rig) = Rig::start("concurrent_twins_share_one_upstream_call", json!({})) else {
        return;
    };
    let body = cacheable("Twins ask the same slow question.");
    // The first call is slow upstream; the twins arrive while it is in flight.
    let url = rig.url(CHAT);
    let leader_body = body.clone();
    let leader = tokio::spawn(async move {
        llm_filter_e2e::post_json(&url, &leader_body, &[("x-mock-delay-ms", "2000")])
            .await
            .unwrap()
    });
    assert!(
        rig.mock.requests_reach(1, Duration::from_secs(10)).await,
        "the first call reached the upstream"
    );
    let twins = launch(&rig, &body, 4);
    let leader = leader.await.unwrap();
    assert_eq!((leader.status, x_cache(&leader)), (200, "MISS"));
    for twin in twins {
        let twin = twin.await.unwrap();
        assert_eq!(twin.status, 200);
        assert_eq!(x_cache(&twin), "COALESCED");
        assert_eq!(twin.json(), leader.json(), "the leader's answer");
        assert!(twin.header("age").is_some());
        assert!(twin.header("x-trace-id").is_some());
    }
    assert_eq!(
        rig.mock.request_count(),
        1,
        "one upstream call for five callers"
    );
    assert_eq!(
        rig.wait_stat(
            "llm_filter_cache_coalesced_waits_totaloutcome=.=served;.;",
            4
        ),
        4
    );
    assert!(rig.lookups("coalesced", 4) >= 4);
}

#[tokio::test]
async fn a_twin_whose_leader_fails_goes_upstream_itself() {
    // No retries: the leader's failure is final at once.
    let Some(rig) = Rig::start(
        "a_twin_whose_leader_fails_goes_upstream_itself",
        json!({"budget": {"max_retries": 0}}),
    ) else {
        return;
    };
    let body = cacheable("The first attempt fails.");
    let url = rig.url(CHAT);
    let leader_body = body.clone();
    let leader = tokio::spawn(async move {
        llm_filter_e2e::post_json(
            &url,
            &leader_body,
            &[("x-mock-delay-ms", "1500"), ("x-mock-status", "500")],
        )
        .await
        .unwrap()
    });
    assert!(rig.mock.requests_reach(1, Duration::from_secs(10)).await);
    let twin = launch(&rig, &body, 1).pop().unwrap();
    let leader = leader.await.unwrap();
    assert_eq!((leader.status, x_cache(&leader)), (500, "MISS"));
    let twin = twin.await.unwrap();
    assert_eq!(twin.status, 200, "{}", twin.text());
    assert_eq!(x_cache(&twin), "MISS", "went upstream itself");
    // The twin's own answer is stored.
    let after = rig.chat(&body, &[]).await;
    assert_eq!(x_cache(&after), "HIT");
    assert_eq!(after.json(), twin.json());
    assert!(rig.mock.request_count() >= 2);
    assert!(
        rig.wait_stat(
            "llm_filter_cache_coalesced_waits_totaloutcome=.=upstream;.;",
            1
        ) >= 1
    );
}

#[tokio::test]
async fn no_twin_waits_longer_than_coalesce_wait_ms() {
    let Some(rig) = Rig::start(
        "no_twin_waits_longer_than_coalesce_wait_ms",
        json!({"cache": {"coalesce_wait_ms": 300}}),
    ) else {
        return;
    };
    let body = cacheable("A very slow leader.");
    let url = rig.url(CHAT);
    let leader_body = body.clone();
    let leader = tokio::spawn(async move {
        llm_filter_e2e::post_json(&url, &leader_body, &[("x-mock-delay-ms", "5000")])
            .await
            .unwrap()
    });
    assert!(rig.mock.requests_reach(1, Duration::from_secs(10)).await);
    let twin = launch(&rig, &body, 1).pop().unwrap().await.unwrap();
    assert_eq!((twin.status, x_cache(&twin)), (200, "MISS"));
    assert!(
        !leader.is_finished(),
        "the twin gave up waiting and was answered before the leader"
    );
    assert_eq!(rig.mock.request_count(), 2);
    let leader = leader.await.unwrap();
    assert_eq!(leader.status, 200);
}
