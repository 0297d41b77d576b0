use super::*;
use crate::host::{MemoryMetrics, MemoryStore};
use crate::usage::Usage;

fn call(model: &'static str, end: End, at_ms: u64, tokens: u64) -> CallSummary<'static> {
    CallSummary {
        model,
        ended_ms: at_ms,
        usage: Some(Usage {
            prompt_tokens: 1,
            completion_tokens: tokens,
            cached_tokens: 0,
        }),
        ..CallSummary::ended(end)
    }
}

#[test]
fn the_window_slides_bucket_by_bucket() {
    let mut r = Record::default();
    r.add(0, 1, 10);
    r.add(999, 1, 10);
    r.add(1_000, 2, 0);
    let s = r.signals(1_500);
    assert_eq!(s.rps, 4.0 / WINDOW_S);
    assert_eq!(s.tokens_per_s, 20.0 / WINDOW_S);
    // The first bucket leaves the window after BUCKETS seconds.
    assert_eq!(r.signals(9_999).rps, 4.0 / WINDOW_S);
    assert_eq!(r.signals(10_000).rps, 2.0 / WINDOW_S);
    assert_eq!(r.signals(11_000).rps, 0.0);
    // A bucket a lap old is reset when its slot is used again.
    r.add(10_000, 1, 0);
    assert_eq!(r.signals(10_000).rps, 3.0 / WINDOW_S);
    // A clock that went back does not count the future.
    assert_eq!(r.signals(500).rps, 0.0);
}

#[test]
fn every_started_call_leaves_in_flight_once_whatever_its_end() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let ends = [
        End::Local(200),
        End::Local(503),
        End::Answered(200),
        End::Answered(500),
        End::Cut(200),
        End::TimedOut(504),
        End::Reset(503),
        End::Abandoned,
    ];
    for _ in &ends {
        assert!(started(&store, &mut m, "m", 0));
    }
    assert_eq!(read(&store, Scope::Model("m"), 0).in_flight, 8);
    for end in ends {
        ended(&store, &mut m, &call("m", end, 100, 5), true);
    }
    let s = read(&store, Scope::Model("m"), 100);
    assert_eq!(s.in_flight, 0);
    // The two local answers never reached the model.
    assert_eq!(s.rps, 6.0 / WINDOW_S);
    assert_eq!(s.tokens_per_s, 30.0 / WINDOW_S);
    // A call never counted in flight does not take another's place.
    started(&store, &mut m, "m", 0);
    ended(
        &store,
        &mut m,
        &call("m", End::Answered(200), 200, 0),
        false,
    );
    assert_eq!(read(&store, Scope::Model("m"), 200).in_flight, 1);
    assert!(m.counters.is_empty());
}

#[test]
fn a_leaked_in_flight_count_expires() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    started(&store, &mut m, "m", 0);
    assert_eq!(read(&store, Scope::Model("m"), 1).in_flight, 1);
    assert_eq!(
        read(&store, Scope::Model("m"), IN_FLIGHT_STALE_MS + 1).in_flight,
        0
    );
    // The next start counts from zero.
    started(&store, &mut m, "m", IN_FLIGHT_STALE_MS + 1);
    assert_eq!(
        read(&store, Scope::Model("m"), IN_FLIGHT_STALE_MS + 1).in_flight,
        1
    );
}

#[test]
fn clusters_count_tries_sent() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let mut c = call("", End::Answered(200), 0, 7);
    c.cluster = Some("a");
    tried(&store, &mut m, &c);
    c.end = End::Local(503);
    tried(&store, &mut m, &c);
    c.cluster = None;
    c.end = End::Answered(200);
    tried(&store, &mut m, &c);
    let s = read(&store, Scope::Cluster("a"), 0);
    assert_eq!((s.rps, s.tokens_per_s), (1.0 / WINDOW_S, 7.0 / WINDOW_S));
    assert_eq!(index(&store), ["llm_filter.load.v1.cluster.a"]);
}

#[test]
fn the_family_is_bounded_by_its_index() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    for i in 0..MAX_RECORDS + 5 {
        let model = format!("m{i}");
        let counted = started(&store, &mut m, &model, 0);
        assert_eq!(counted, i < MAX_RECORDS, "{model}");
    }
    assert_eq!(index(&store).len(), MAX_RECORDS);
    assert_eq!(store.len(), MAX_RECORDS + 1);
    let (keys, bytes) = footprint(&store);
    assert_eq!(keys, MAX_RECORDS as u64 + 1);
    assert_eq!(bytes, store.value_bytes() as u64);
    // Known ones still count.
    assert!(started(&store, &mut m, "m0", 0));
}

#[test]
fn gauges_come_from_shared_data() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    started(&store, &mut m, "gpt-4o", 0);
    started(&store, &mut m, "gpt-4o", 0);
    ended(
        &store,
        &mut m,
        &call("gpt-4o", End::Answered(200), 0, 50),
        true,
    );
    let mut c = call("", End::Answered(200), 0, 50);
    c.cluster = Some("east");
    tried(&store, &mut m, &c);
    publish(&store, &mut m, 0);
    assert_eq!(m.gauges["llm_filter_load_rps_millimodel=.=gpt-4o;.;"], 100);
    assert_eq!(m.gauges["llm_filter_load_tokens_per_smodel=.=gpt-4o;.;"], 5);
    assert_eq!(m.gauges["llm_filter_load_in_flightmodel=.=gpt-4o;.;"], 1);
    assert_eq!(
        m.gauges["llm_filter_load_cluster_rps_millillm_cluster=.=east;.;"],
        100
    );
    assert_eq!(
        m.gauges["llm_filter_load_cluster_tokens_per_sllm_cluster=.=east;.;"],
        5
    );
}

#[test]
fn foreign_bytes_are_a_fresh_record() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    started(&store, &mut m, "m", 0);
    store
        .set(&Scope::Model("m").key(), b"\xff\xff", None)
        .unwrap();
    assert_eq!(read(&store, Scope::Model("m"), 0), Signals::default());
    assert!(started(&store, &mut m, "m", 0));
    assert_eq!(read(&store, Scope::Model("m"), 0).in_flight, 1);
    assert_eq!(Scope::Model("a b").key(), "llm_filter.load.v1.model.a_b");
    assert_eq!(
        Scope::Model(&"x".repeat(500)).key().len(),
        KEY_PREFIX.len() + 6 + names::MAX_VALUE_LEN
    );
    assert_eq!(
        Scope::of_key("llm_filter.load.v1.model.gpt-4.1"),
        Some(Scope::Model("gpt-4.1"))
    );
    assert_eq!(Scope::of_key("llm_filter.load.v1.x"), None);
}
