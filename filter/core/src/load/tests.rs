use super::*;
use crate::config::Config;
use crate::host::{MemoryMetrics, MemoryStore};
use crate::usage::Usage;

/// A configuration that names nothing.
fn none() -> Names {
    Names::default()
}

/// Routes `busy` to clusters `a` and `b`, with a threshold on it.
fn routed() -> Names {
    Config::parse(
        br#"{"routing":{"models":{"busy":[{"cluster":"a"},{"cluster":"b","model":"busy-v2"}]}},
             "degrade":{"thresholds":[{"model":"busy","signal":"rps","above":1,"level":2}]}}"#,
    )
    .unwrap()
    .names
}

fn call(model: &str, end: End, at_ms: u64, tokens: u64) -> CallSummary<'_> {
    CallSummary {
        model,
        served: try_on(None, end, at_ms, tokens),
        ..CallSummary::ended(end)
    }
}

/// A try on `cluster` that ended as `end` at `at_ms` with `tokens` output tokens.
fn try_on(cluster: Option<&str>, end: End, at_ms: u64, tokens: u64) -> Try<'_> {
    Try {
        cluster,
        ended_ms: at_ms,
        usage: Some(Usage {
            prompt_tokens: 1,
            completion_tokens: tokens,
            cached_tokens: 0,
            ..Usage::default()
        }),
        ..Try::ended(end)
    }
}

/// An answered call of `model` ending at `at_ms`, one output token.
fn call_of(model: &str, at_ms: u64) -> CallSummary<'_> {
    call(model, End::Answered(200), at_ms, 1)
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
        assert_eq!(
            started(&store, &mut m, &none(), "m", 0).as_deref(),
            Some("m")
        );
    }
    assert_eq!(read(&store, Scope::Model("m"), 0).in_flight, 8);
    for end in ends {
        ended(&store, &mut m, &none(), &call("m", end, 100, 5), Some("m"));
    }
    let s = read(&store, Scope::Model("m"), 100);
    assert_eq!(s.in_flight, 0);
    // The two local answers never reached the model.
    assert_eq!(s.rps, 6.0 / WINDOW_S);
    assert_eq!(s.tokens_per_s, 30.0 / WINDOW_S);
    // A call never counted in flight does not take another's place.
    started(&store, &mut m, &none(), "m", 0);
    ended(
        &store,
        &mut m,
        &none(),
        &call("m", End::Answered(200), 200, 0),
        None,
    );
    assert_eq!(read(&store, Scope::Model("m"), 200).in_flight, 1);
    assert!(m.counters.is_empty());
}

#[test]
fn a_leaked_in_flight_count_expires() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    started(&store, &mut m, &none(), "m", 0);
    assert_eq!(read(&store, Scope::Model("m"), 1).in_flight, 1);
    assert_eq!(
        read(&store, Scope::Model("m"), IN_FLIGHT_STALE_MS + 1).in_flight,
        0
    );
    // The next start counts from zero.
    started(&store, &mut m, &none(), "m", IN_FLIGHT_STALE_MS + 1);
    assert_eq!(
        read(&store, Scope::Model("m"), IN_FLIGHT_STALE_MS + 1).in_flight,
        1
    );
}

#[test]
fn clusters_count_tries_sent() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let mut c = try_on(Some("a"), End::Answered(200), 0, 7);
    tried(&store, &mut m, &none(), &c);
    c.end = End::Local(503);
    tried(&store, &mut m, &none(), &c);
    c.cluster = None;
    c.end = End::Answered(200);
    tried(&store, &mut m, &none(), &c);
    let s = read(&store, Scope::Cluster("a"), 0);
    assert_eq!((s.rps, s.tokens_per_s), (1.0 / WINDOW_S, 7.0 / WINDOW_S));
    assert_eq!(index(&store), ["llm_filter.load.v1.cluster.a"]);
}

#[test]
fn the_family_is_bounded_by_its_index() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    for i in 0..MAX_UNKNOWN + 5 {
        let model = format!("m{i}");
        let counted = started(&store, &mut m, &none(), &model, 0);
        let record = if i < MAX_UNKNOWN { &model } else { OVERFLOW };
        assert_eq!(counted.as_deref(), Some(record), "{model}");
    }
    // The first ones, and the one the later ones share.
    assert_eq!(index(&store).len(), MAX_UNKNOWN + 1);
    assert_eq!(read(&store, Scope::Model(OVERFLOW), 0).in_flight, 5);
    assert_eq!(store.len(), MAX_UNKNOWN + 2);
    let (keys, bytes) = footprint(&store);
    assert_eq!(keys, MAX_UNKNOWN as u64 + 2);
    assert!(keys <= max_keys(&none()));
    assert_eq!(bytes, store.value_bytes() as u64);
    // Known ones still count in their own.
    assert_eq!(
        started(&store, &mut m, &none(), "m0", 0).as_deref(),
        Some("m0")
    );
    assert!(m.counters.is_empty());
}

/// Two calls of `gpt-4o` started and one ended, answered with 50 tokens.
fn one_of_two_calls_ended() -> (MemoryStore, MemoryMetrics) {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    started(&store, &mut m, &none(), "gpt-4o", 0);
    started(&store, &mut m, &none(), "gpt-4o", 0);
    ended(
        &store,
        &mut m,
        &none(),
        &call("gpt-4o", End::Answered(200), 0, 50),
        Some("gpt-4o"),
    );
    (store, m)
}

#[cfg(feature = "routing")]
#[test]
fn gauges_come_from_shared_data() {
    let (store, mut m) = one_of_two_calls_ended();
    let c = try_on(Some("east"), End::Answered(200), 0, 50);
    tried(&store, &mut m, &none(), &c);
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

/// The sidecar build routes no call: its calls are counted by the gateway
/// tier's replicas it sends them to, so it publishes no gauge, while its
/// records still count them for its own thresholds.
#[cfg(not(feature = "routing"))]
#[test]
fn a_build_that_routes_no_call_publishes_no_gauge() {
    let (store, mut m) = one_of_two_calls_ended();
    publish(&store, &mut m, 0);
    assert!(m.gauges.is_empty(), "{:?}", m.gauges);
    let s = read(&store, Scope::Model("gpt-4o"), 0);
    assert_eq!((s.in_flight, (s.rps * 1000.0).round()), (1, 100.0));
}

#[test]
fn foreign_bytes_are_a_fresh_record() {
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    started(&store, &mut m, &none(), "m", 0);
    store
        .set(&Scope::Model("m").key(), b"\xff\xff", None)
        .unwrap();
    assert_eq!(read(&store, Scope::Model("m"), 0), Signals::default());
    assert!(started(&store, &mut m, &none(), "m", 0).is_some());
    assert_eq!(read(&store, Scope::Model("m"), 0).in_flight, 1);
    assert_eq!(Scope::Model("a b").key(), "llm_filter.load.v1.model.a_b");
    assert_eq!(
        Scope::Model(&"x".repeat(500)).key().len(),
        "llm_filter.load.v1.model.".len() + names::MAX_VALUE_LEN
    );
    assert_eq!(
        Scope::of_key("llm_filter.load.v1.model.gpt-4.1"),
        Some(Scope::Model("gpt-4.1"))
    );
    assert_eq!(Scope::of_key("llm_filter.load.v1.x"), None);
}

#[test]
fn calls_never_in_flight_are_kept_then_written_as_at_once() {
    let (kept, at_once) = (MemoryStore::new(), MemoryStore::new());
    let mut m = MemoryMetrics::default();
    let mut pending = Pending::default();
    let calls = [
        call("m", End::Answered(200), 100, 3),
        call("m", End::Answered(200), 900, 4),
        call("m", End::Answered(500), 1_200, 0),
        call("n", End::Answered(200), 1_300, 5),
        // The filter's own answer: counted nowhere.
        call("m", End::Local(429), 1_400, 0),
    ];
    for c in &calls {
        assert!(pending.keep(c, None));
        ended(&at_once, &mut m, &none(), c, None);
    }
    // Nothing is written before the flush.
    assert_eq!(read(&kept, Scope::Model("m"), 1_500), Signals::default());
    flush(&kept, &mut m, &none(), &mut pending, 1_500);
    assert!(pending.is_empty());
    for (scope, at) in [(Scope::Model("m"), 1_500), (Scope::Model("n"), 9_000)] {
        assert_eq!(
            read(&kept, scope, at),
            read(&at_once, scope, at),
            "{scope:?}"
        );
    }
    assert_eq!(read(&kept, Scope::Model("m"), 1_500).rps, 3.0 / WINDOW_S);
    assert_eq!(index(&kept), index(&at_once));
}

#[test]
fn a_call_in_flight_or_past_the_bound_is_written_at_once() {
    let mut pending = Pending::default();
    assert!(!pending.keep(&call_of("m", 0), Some("m")));
    for i in 0..MAX_PENDING {
        assert!(pending.keep(&call_of(&format!("m{i}"), 0), None));
    }
    assert!(
        pending.keep(&call_of("m0", 0), None),
        "a model kept already"
    );
    assert!(!pending.keep(&call_of("late", 0), None));
}

#[test]
fn calls_kept_past_the_window_are_dropped() {
    let store = MemoryStore::new();
    let mut m = MemoryMetrics::default();
    let mut pending = Pending::default();
    assert!(pending.keep(&call_of("m", 0), None));
    // A tick that comes a window later: the slot may hold a newer second.
    let mut newer = Record::default();
    newer.add(BUCKETS as u64 * BUCKET_MS, 5, 0);
    let key = Scope::Model("m").key();
    store.set(&key, &newer.encode().unwrap(), None).unwrap();
    flush(
        &store,
        &mut m,
        &none(),
        &mut pending,
        BUCKETS as u64 * BUCKET_MS,
    );
    assert!(pending.is_empty());
    let s = read(&store, Scope::Model("m"), BUCKETS as u64 * BUCKET_MS);
    assert_eq!(s.rps, 5.0 / WINDOW_S);
}

/// The records of the models and clusters routing names (the `routing`
/// feature).
#[cfg(feature = "routing")]
mod routed {
    use super::*;

    #[test]
    fn made_up_models_never_take_the_place_of_the_configurations() {
        let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        let names = routed();
        // A client names 70 made-up models first, each one call.
        for i in 0..70 {
            let model = format!("made-up-{i}");
            let record = started(&store, &mut m, &names, &model, 0);
            ended(
                &store,
                &mut m,
                &names,
                &call_of(&model, 100),
                record.as_deref(),
            );
        }
        // The routed model, its rewritten name and its clusters still get theirs.
        assert_eq!(
            started(&store, &mut m, &names, "busy", 0).as_deref(),
            Some("busy")
        );
        assert_eq!(
            started(&store, &mut m, &names, "busy-v2", 0).as_deref(),
            Some("busy-v2")
        );
        for cluster in ["a", "b"] {
            let c = try_on(Some(cluster), End::Answered(200), 100, 7);
            tried(&store, &mut m, &names, &c);
            assert_eq!(
                read(&store, Scope::Cluster(cluster), 100).rps,
                1.0 / WINDOW_S
            );
        }
        assert_eq!(read_model(&store, &names, "busy", 100).in_flight, 1);
        // Of the made-up ones, the first 64 have theirs, the other six share one.
        let measured = index(&store);
        let unknown = measured.iter().filter(|k| !reserved(&names, k)).count();
        assert_eq!(unknown, MAX_UNKNOWN);
        assert_eq!(measured.len(), MAX_UNKNOWN + 5, "{measured:?}");
        let other = read(&store, Scope::Model(OVERFLOW), 100);
        assert_eq!((other.rps, other.in_flight), (6.0 / WINDOW_S, 0));
        assert_eq!(
            read_model(&store, &names, "made-up-0", 100).rps,
            1.0 / WINDOW_S
        );
        // A model beyond the bound reads the record it counts in.
        assert_eq!(read_model(&store, &names, "made-up-69", 100), other);
        assert_eq!(read_model(&store, &names, "never-seen", 100), other);
        // A model the configuration names reads its own, even with none yet.
        let names_more = Config::parse(
            br#"{"routing":{"models":{"busy":[{"cluster":"a"}],"quiet":[{"cluster":"a"}]}}}"#,
        )
        .unwrap()
        .names;
        assert_eq!(
            read_model(&store, &names_more, "quiet", 100),
            Signals::default()
        );
        // The records and the index within the family's bound.
        assert!((index(&store).len() as u64) < max_keys(&names));
        assert!(m.counters.is_empty());
        // The gauges name the overflow `other`, next to the routed model.
        publish(&store, &mut m, 100);
        assert_eq!(m.gauges["llm_filter_load_rps_millimodel=.=other;.;"], 600);
        assert_eq!(m.gauges["llm_filter_load_in_flightmodel=.=busy;.;"], 1);
        assert!(!m
            .gauges
            .contains_key("llm_filter_load_rps_millimodel=.=made-up-69;.;"));
    }

    #[test]
    fn a_call_leaves_the_record_it_joined() {
        let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        let names = routed();
        for i in 0..MAX_UNKNOWN {
            started(&store, &mut m, &names, &format!("m{i}"), 0);
        }
        let record = started(&store, &mut m, &names, "late", 0);
        assert_eq!(record.as_deref(), Some(OVERFLOW));
        assert_eq!(read(&store, Scope::Model(OVERFLOW), 0).in_flight, 1);
        ended(
            &store,
            &mut m,
            &names,
            &call_of("late", 50),
            record.as_deref(),
        );
        let other = read(&store, Scope::Model(OVERFLOW), 50);
        assert_eq!((other.in_flight, other.rps), (0, 1.0 / WINDOW_S));
        assert_eq!(read(&store, Scope::Model("late"), 50), Signals::default());
        // A call never counted in flight counts where its model counts.
        ended(&store, &mut m, &names, &call_of("late", 50), None);
        assert_eq!(read(&store, Scope::Model(OVERFLOW), 50).rps, 2.0 / WINDOW_S);
    }

    #[test]
    fn an_index_filled_by_others_still_admits_the_configurations_names() {
        // Another writer (an older module, or a worker under another
        // configuration) left more unknown names than the bound.
        let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        let foreign: Vec<String> = (0..MAX_UNKNOWN * 2)
            .map(|i| Scope::Model(&format!("x{i}")).key())
            .collect();
        store
            .set(INDEX_KEY, &codec::encode(&foreign).unwrap(), None)
            .unwrap();
        let names = routed();
        assert_eq!(
            started(&store, &mut m, &names, "busy", 0).as_deref(),
            Some("busy")
        );
        assert_eq!(
            started(&store, &mut m, &names, "new", 0).as_deref(),
            Some(OVERFLOW)
        );
        assert_eq!(index(&store).len(), MAX_UNKNOWN * 2 + 2);
    }
}
