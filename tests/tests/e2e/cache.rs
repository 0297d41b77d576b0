//! The response cache through the real Envoy: deterministic calls are answered
//! from shared data after the first (on any worker), per tenant, keyed by every
//! parameter that changes the answer, in JSON or SSE whichever way the entry was
//! filled; everything else passes through untouched and says `BYPASS`.

mod bounds;
mod coalesce;
mod semantic;
mod shard;

use std::time::Duration;

use crate::support::cache::{cacheable, cacheable_stream, message, x_cache, Rig, CHAT};
use llm_filter_e2e::{post_json, post_raw, stream_sse};
use serde_json::{json, Value};

#[tokio::test]
async fn a_hit_after_a_miss_gives_the_same_answer() {
    let Some(rig) = Rig::start("a_hit_after_a_miss_gives_the_same_answer", json!({})) else {
        return;
    };
    let body = cacheable("What is the capital of France?");
    let first = rig.chat(&body, &[("accept-encoding", "gzip")]).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(x_cache(&first), "MISS");
    assert!(first.header("age").is_none());
    let upstream = rig.mock.last_request().unwrap();
    assert_eq!(
        upstream.header("accept-encoding"),
        None,
        "a cacheable call asks for an uncompressed answer"
    );

    let second = rig.chat(&body, &[]).await;
    assert_eq!(second.status, 200);
    assert_eq!(x_cache(&second), "HIT");
    assert_eq!(second.json(), first.json(), "the stored answer, id and all");
    assert_eq!(second.header("content-type"), Some("application/json"));
    let age: u64 = second.header("age").unwrap().parse().unwrap();
    assert!(age < 60, "age {age}");
    assert_eq!(second.header("x-trace-id").map(str::len), Some(32));
    assert_ne!(second.header("x-trace-id"), first.header("x-trace-id"));
    assert_eq!(rig.mock.request_count(), 1, "the hit never went upstream");

    // Embeddings are deterministic: cached too.
    let url = rig.url("/v1/embeddings");
    let input = json!({"model": "text-embedding-3-small", "input": ["a b", "c"]});
    let e1 = post_json(&url, &input, &[]).await.unwrap();
    let e2 = post_json(&url, &input, &[]).await.unwrap();
    assert_eq!((x_cache(&e1), x_cache(&e2)), ("MISS", "HIT"));
    assert_eq!(e1.json(), e2.json());
    assert_eq!(rig.mock.request_count(), 2);

    assert!(rig.lookups("hit", 2) >= 2);
    assert!(rig.lookups("miss", 2) >= 2);
    assert!(rig.wait_stat("llm_filter_cache_stores_totalresult=.=stored;.;", 2) >= 2);
    assert!(rig.stat("llm_filter_cache_entries") >= 2);
}

#[tokio::test]
async fn entries_are_shared_by_every_worker() {
    let Some(rig) = Rig::start("entries_are_shared_by_every_worker", json!({})) else {
        return;
    };
    let body = cacheable("shared across workers");
    let first = rig.chat(&body, &[]).await;
    assert_eq!(x_cache(&first), "MISS");
    // Every call opens its own connection; keep calling until both workers
    // accepted some, so the hits provably come from the other worker too.
    let workers = |rig: &Rig| {
        let per_worker = rig.envoy.stats_matching(".worker_");
        ["worker_0.", "worker_1."].map(|w| {
            per_worker.iter().any(|(name, v)| {
                name.contains(w) && name.ends_with("downstream_cx_total") && *v > 0
            })
        })
    };
    let mut calls = 0;
    while calls < 8 || workers(&rig) != [true, true] {
        let r = rig.chat(&body, &[]).await;
        assert_eq!(x_cache(&r), "HIT", "call {calls}");
        assert_eq!(r.json(), first.json());
        calls += 1;
        assert!(calls < 200, "connections never reached both workers");
    }
    assert_eq!(rig.mock.request_count(), 1);
}

#[tokio::test]
async fn tenants_never_share_unless_global() {
    let Some(rig) = Rig::start("tenants_never_share_unless_global", json!({})) else {
        return;
    };
    let body = cacheable("tenant question");
    let call = |headers: &'static [(&'static str, &'static str)]| {
        let rig = &rig;
        let body = body.clone();
        async move { x_cache(&rig.chat(&body, headers).await).to_string() }
    };
    assert_eq!(call(&[("authorization", "Bearer tenant-a")]).await, "MISS");
    assert_eq!(call(&[("authorization", "Bearer tenant-b")]).await, "MISS");
    assert_eq!(call(&[("authorization", "Bearer tenant-a")]).await, "HIT");
    assert_eq!(call(&[("authorization", "Bearer tenant-b")]).await, "HIT");
    assert_eq!(
        call(&[]).await,
        "MISS",
        "no credential is a tenant of its own"
    );
    assert_eq!(call(&[("api-key", "tenant-a")]).await, "MISS");
    assert_eq!(rig.mock.request_count(), 4);

    let Some(global) = Rig::start(
        "tenants_never_share_unless_global",
        json!({"cache": {"scope": "global"}}),
    ) else {
        return;
    };
    let a = global
        .chat(&body, &[("authorization", "Bearer tenant-a")])
        .await;
    let b = global
        .chat(&body, &[("authorization", "Bearer tenant-b")])
        .await;
    assert_eq!((x_cache(&a), x_cache(&b)), ("MISS", "HIT"));
    assert_eq!(global.mock.request_count(), 1);
}

#[tokio::test]
async fn uncacheable_calls_bypass_and_pass_untouched() {
    let Some(rig) = Rig::start(
        "uncacheable_calls_bypass_and_pass_untouched",
        json!({"cache": {"dynamic_markers": ["{{now}}"]}}),
    ) else {
        return;
    };
    let warm = json!({"model": "gpt-4o", "temperature": 0.7, "messages": [{"role": "user", "content": "x"}]});
    let default_temperature =
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]});
    let marked = cacheable("The time is {{now}}: greet me");
    type Case<'a> = (&'a str, &'a Value, &'a [(&'a str, &'a str)]);
    let cases: [Case; 4] = [
        ("temperature above the maximum", &warm, &[]),
        (
            "no temperature (the default 1.0)",
            &default_temperature,
            &[],
        ),
        ("a dynamic marker", &marked, &[]),
        (
            "cache-control: no-store",
            &cacheable("private"),
            &[("cache-control", "no-store")],
        ),
    ];
    for (case, body, headers) in cases {
        let before = rig.mock.request_count();
        for _ in 0..2 {
            let r = rig
                .chat(body, &[headers, &[("accept-encoding", "gzip")]].concat())
                .await;
            assert_eq!(r.status, 200, "{case}");
            assert_eq!(x_cache(&r), "BYPASS", "{case}");
            let upstream = rig.mock.last_request().unwrap();
            assert_eq!(upstream.header("accept-encoding"), Some("gzip"), "{case}");
            assert_eq!(upstream.json().as_ref(), Some(body), "{case}");
        }
        assert_eq!(
            rig.mock.request_count(),
            before + 2,
            "{case}: both went upstream"
        );
    }
    // A body that is not JSON reaches the upstream byte for byte.
    for _ in 0..2 {
        let r = post_raw(&rig.url(CHAT), "{not json", &[]).await.unwrap();
        assert_eq!(r.status, 400, "the provider's own answer");
        assert_eq!(x_cache(&r), "BYPASS");
        assert_eq!(rig.mock.last_request().unwrap().body.as_ref(), b"{not json");
    }
    assert!(rig.lookups("bypass", 10) >= 10);
    assert_eq!(
        rig.stat("llm_filter_cache_stores_totalresult=.=stored;.;"),
        0
    );

    // Switched off, the cache says nothing at all.
    let Some(off) = Rig::start(
        "uncacheable_calls_bypass_and_pass_untouched",
        json!({"cache": {"enabled": false}}),
    ) else {
        return;
    };
    for _ in 0..2 {
        let r = off.chat(&cacheable("off"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-cache"), None);
    }
    assert_eq!(off.mock.request_count(), 2);
}

#[tokio::test]
async fn every_parameter_is_in_the_key() {
    let Some(rig) = Rig::start("every_parameter_is_in_the_key", json!({})) else {
        return;
    };
    let base = json!({
        "model": "gpt-4o",
        "temperature": 0,
        "max_tokens": 50,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."},
        ],
    });
    assert_eq!(x_cache(&rig.chat(&base, &[]).await), "MISS");
    // The same request spelled differently is the same key.
    let respelled = r#"{ "messages": [ {"content": "Be brief.", "role": "system"},
        {"role": "user", "content": "Name a \u0063olour."} ],
        "max_tokens": 5e1, "temperature": 0.0, "model": "gpt-4o", "user": "someone" }"#;
    let r = post_raw(&rig.url(CHAT), respelled, &[]).await.unwrap();
    assert_eq!(x_cache(&r), "HIT");

    let mut variants: Vec<(&str, Value)> = Vec::new();
    let mut with = |what: &'static str, change: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        change(&mut v);
        variants.push((what, v));
    };
    with("max_tokens", &|v| v["max_tokens"] = json!(51));
    with("top_p", &|v| v["top_p"] = json!(0.5));
    with("seed", &|v| v["seed"] = json!(7));
    with(
        "tools",
        &|v| {
            v["tools"] =
                json!([{"type": "function", "function": {"name": "paint", "parameters": {}}}])
        },
    );
    with("response_format", &|v| {
        v["response_format"] = json!({"type": "json_object"})
    });
    with("system message", &|v| {
        v["messages"][0]["content"] = json!("Be verbose.")
    });
    with("model", &|v| v["model"] = json!("gpt-4o-mini"));
    with("no system message", &|v| {
        v["messages"] = json!([{"role": "user", "content": "Name a colour."}])
    });
    for (what, body) in &variants {
        let r = rig.chat(body, &[]).await;
        assert_eq!(r.status, 200, "{what}");
        assert_eq!(x_cache(&r), "MISS", "{what} must change the key");
    }
    assert_eq!(rig.mock.request_count(), 1 + variants.len());
    // …and each variant now has its own entry.
    for (what, body) in &variants {
        assert_eq!(x_cache(&rig.chat(body, &[]).await), "HIT", "{what}");
    }
}

#[tokio::test]
async fn errors_are_never_cached() {
    let Some(rig) = Rig::start("errors_are_never_cached", json!({})) else {
        return;
    };
    let body = cacheable("flaky question");
    // Every attempt (Envoy retries 5xx) fails.
    let failed = rig.chat(&body, &[("x-mock-status", "503")]).await;
    assert_eq!(failed.status, 503);
    assert_eq!(x_cache(&failed), "MISS");
    let ok = rig.chat(&body, &[]).await;
    assert_eq!((ok.status, x_cache(&ok)), (200, "MISS"));
    let hit = rig.chat(&body, &[]).await;
    assert_eq!((hit.status, x_cache(&hit)), (200, "HIT"));
    assert_eq!(hit.json(), ok.json());
    assert!(rig.mock.request_count() >= 2);
    assert!(rig.wait_stat("llm_filter_cache_stores_totalresult=.=status;.;", 1) >= 1);
}

#[tokio::test]
async fn a_plain_entry_replays_as_a_stream_and_back() {
    let Some(rig) = Rig::start("a_plain_entry_replays_as_a_stream_and_back", json!({})) else {
        return;
    };
    let url = rig.url(CHAT);

    // Filled by a plain call, read as a stream.
    let plain = rig
        .chat(
            &cacheable("Tell me something long enough to be streamed in pieces."),
            &[],
        )
        .await;
    assert_eq!(x_cache(&plain), "MISS");
    let text = message(&plain);
    for include_usage in [true, false] {
        let body = cacheable_stream(
            "Tell me something long enough to be streamed in pieces.",
            include_usage,
        );
        let sse = stream_sse(&url, &body, &[]).await.unwrap();
        assert_eq!(sse.status, 200);
        assert_eq!(sse.header("x-cache"), Some("HIT"));
        assert_eq!(sse.header("content-type"), Some("text/event-stream"));
        assert!(sse.done(), "ends with [DONE]: {:?}", sse.events);
        assert!(sse.events.len() >= 5, "{} events", sse.events.len());
        assert!(sse.trailing.is_empty());
        let chunks = sse.chunks();
        assert!(chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(sse.content(), text);
        assert_eq!(
            sse.usage().is_some(),
            include_usage,
            "include_usage honoured"
        );
        if include_usage {
            assert_eq!(sse.usage().unwrap(), plain.json()["usage"]);
        }
    }

    // Filled by a stream (still delivered event by event), read as JSON.
    let streamed_body = cacheable_stream("Stream this one first, please.", true);
    let first = stream_sse(&url, &streamed_body, &[("x-mock-chunk-delay-ms", "40")])
        .await
        .unwrap();
    assert_eq!(first.header("x-cache"), Some("MISS"));
    assert!(first.done());
    let spread = first.events.last().unwrap().at - first.events[0].at;
    assert!(
        spread >= Duration::from_millis(150),
        "passed event by event: {spread:?}"
    );
    let json_hit = rig
        .chat(&cacheable("Stream this one first, please."), &[])
        .await;
    assert_eq!(x_cache(&json_hit), "HIT");
    let answer = json_hit.json();
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(message(&json_hit), first.content());
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(Some(answer["usage"].clone()), first.usage());
    // And as a stream again, without waiting for the upstream's pace.
    let again = stream_sse(&url, &streamed_body, &[]).await.unwrap();
    assert_eq!(again.header("x-cache"), Some("HIT"));
    assert_eq!(again.content(), first.content());
    assert_eq!(again.usage(), first.usage());
    assert_eq!(rig.mock.request_count(), 2);
}

#[tokio::test]
async fn no_cache_refetches_and_refreshes_the_entry() {
    let Some(rig) = Rig::start("no_cache_refetches_and_refreshes_the_entry", json!({})) else {
        return;
    };
    let body = cacheable("refresh me");
    let old = rig.chat(&body, &[]).await;
    assert_eq!(x_cache(&rig.chat(&body, &[]).await), "HIT");
    let fresh = rig.chat(&body, &[("cache-control", "no-cache")]).await;
    assert_eq!(x_cache(&fresh), "MISS");
    assert_ne!(
        fresh.json()["id"],
        old.json()["id"],
        "a new upstream answer"
    );
    let hit = rig.chat(&body, &[]).await;
    assert_eq!(x_cache(&hit), "HIT");
    assert_eq!(hit.json(), fresh.json(), "the entry was refreshed");
    assert_eq!(rig.mock.request_count(), 2);
}

#[tokio::test]
async fn age_grows_with_the_entry() {
    let Some(rig) = Rig::start("age_grows_with_the_entry", json!({})) else {
        return;
    };
    let body = cacheable("how old?");
    rig.chat(&body, &[]).await;
    let age =
        |r: &llm_filter_e2e::HttpResponse| -> u64 { r.header("age").unwrap().parse().unwrap() };
    let early = age(&rig.chat(&body, &[]).await);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let later = age(&rig.chat(&body, &[]).await);
    assert!(later >= early + 2, "age {early} then {later}");
}
