use super::*;
use crate::metrics::{self as names, ROUTING_PROBES};
#[cfg(feature = "routing")]
use crate::routing::probe::{Probe, ProbeKind};
use crate::walk::fake::World;
use crate::walk::CallWait;
use crate::walk::CalloutAnswer;

/// A call's handle as a host keeps it: here, its context id.
type Ctx = u32;

fn call(id: Ctx, then: CallWait) -> Continuation<Ctx> {
    Continuation::Call { call: id, then }
}

fn answered(status: u16) -> CalloutAnswer {
    CalloutAnswer {
        status: Some(status),
        ..CalloutAnswer::default()
    }
}

#[test]
fn a_token_hands_its_continuation_over_once() {
    let mut waits = Waits::default();
    waits
        .register(7, call(1, CallWait::Hedge), 1_000, 300)
        .unwrap();
    waits
        .register(8, Continuation::Job(JobWait::SpanExport), 1_000, 300)
        .unwrap();
    assert_eq!(waits.len(), 2);
    assert!(matches!(
        waits.take(7),
        Some(Continuation::Call {
            call: 1,
            then: CallWait::Hedge
        })
    ));
    // Answered once: the same token again is unknown.
    assert!(waits.take(7).is_none());
    assert!(matches!(
        waits.take(8),
        Some(Continuation::Job(JobWait::SpanExport))
    ));
    assert!(waits.is_empty());
}

#[test]
fn an_unknown_token_finds_nothing_and_leaves_the_others() {
    let mut waits = Waits::default();
    waits
        .register(3, call(1, CallWait::Embedding), 0, 100)
        .unwrap();
    assert!(waits.take(4).is_none());
    assert!(waits.take(u32::MAX).is_none());
    assert_eq!(waits.len(), 1);
}

#[test]
fn the_answer_after_its_call_ended_finds_nothing() {
    let mut waits = Waits::default();
    waits
        .register(1, call(10, CallWait::Failover), 0, 100)
        .unwrap();
    waits
        .register(2, call(11, CallWait::Hedge), 0, 100)
        .unwrap();
    waits
        .register(3, call(10, CallWait::Fallback), 0, 100)
        .unwrap();
    waits
        .register(4, Continuation::Job(JobWait::SpanExport), 0, 100)
        .unwrap();
    assert_eq!(waits.forget_calls(|id| *id == 10), 2);
    assert!(waits.take(1).is_none() && waits.take(3).is_none());
    // Other calls and the jobs keep theirs.
    assert!(waits.take(2).is_some() && waits.take(4).is_some());
}

#[test]
fn a_callout_the_host_never_answers_is_given_up_after_its_timeout_and_the_grace() {
    let mut waits = Waits::default();
    waits
        .register(1, call(1, CallWait::Embedding), 1_000, 200)
        .unwrap();
    waits
        .register(2, call(2, CallWait::Hedge), 1_000, 10_000)
        .unwrap();
    // Within the timeout and the grace the host may still answer.
    assert!(waits.expired(1_000 + 200 + GRACE_MS - 1).is_empty());
    let gone = waits.expired(1_000 + 200 + GRACE_MS);
    assert!(matches!(
        gone.as_slice(),
        [Continuation::Call {
            call: 1,
            then: CallWait::Embedding
        }]
    ));
    // A late answer to it is unknown; the other still waits.
    assert!(waits.take(1).is_none());
    assert_eq!(waits.len(), 1);
    // A timeout at the end of time does not wrap around.
    waits
        .register(3, call(3, CallWait::Failover), u64::MAX - 1, u64::MAX)
        .unwrap();
    assert_eq!(waits.expired(u64::MAX - 1).len(), 1, "only token 2");
    assert!(waits.take(3).is_some());
}

#[test]
fn a_full_registry_hands_the_continuation_back() {
    let mut waits = Waits::default();
    for token in 0..MAX_PENDING as u32 {
        waits
            .register(token, Continuation::Job(JobWait::SpanExport), 0, 1)
            .unwrap();
    }
    let refused = waits.register(u32::MAX, call(1, CallWait::Hedge), 0, 1);
    assert!(matches!(
        refused,
        Err(Full(Continuation::Call {
            then: CallWait::Hedge,
            ..
        }))
    ));
    // A token already in is replaced, not refused.
    assert!(waits.register(0, call(2, CallWait::Failover), 0, 1).is_ok());
    assert_eq!(waits.len(), MAX_PENDING);
}

// A job of a feature the build leaves out is never due.
#[cfg(feature = "routing")]
#[test]
fn a_continuation_reads_what_its_answer_needs() {
    let full = Reads {
        headers: true,
        body_up_to: usize::MAX,
    };
    assert_eq!(call(1, CallWait::Embedding).reads(), full);
    let status_only = Reads {
        headers: false,
        body_up_to: 0,
    };
    assert_eq!(
        Continuation::<Ctx>::Job(JobWait::SpanExport).reads(),
        status_only
    );
    let probe = |kind| {
        Continuation::<Ctx>::Job(JobWait::Probe(Probe {
            cluster: "a".to_string(),
            kind,
            headers: vec![],
            body: None,
            timeout_ms: 1,
            sent_ms: 0,
        }))
    };
    assert_eq!(probe(ProbeKind::Liveness).reads(), status_only);
    assert_eq!(
        probe(ProbeKind::Load).reads().body_up_to,
        crate::routing::probe::MAX_METRICS_BYTES
    );
}

fn spans(w: &World, result: &str) -> u64 {
    let name = names::name(names::SPANS, &[("result", result)]);
    w.metrics.counters.get(&name).copied().unwrap_or(0)
}

// A job of a feature the build leaves out is never due.
#[cfg(feature = "spans")]
#[test]
fn the_span_export_is_due_with_a_batch_and_finishes_with_its_answer() {
    let mut w = World::new(r#"{"tracing":{"otlp":{"cluster":"otel","batch_size":1}}}"#);
    let mut jobs = Jobs::new(1, 2);
    // Nothing queued: nothing due.
    assert!(jobs.due(&mut w.env()).is_empty());
    let cfg = w.config.otlp.clone().unwrap();
    w.spans.push(&cfg, &mut w.metrics, b"span".to_vec());
    let due = jobs.due(&mut w.env());
    let [(callout, wait)] = due.as_slice() else {
        panic!("one batch due: {due:?}");
    };
    assert_eq!(
        (callout.cluster.as_str(), wait),
        ("otel", &JobWait::SpanExport)
    );
    assert!(callout.body.as_ref().is_some_and(|b| !b.is_empty()));
    // One batch in flight at a time.
    w.spans.push(&cfg, &mut w.metrics, b"span".to_vec());
    assert!(jobs.due(&mut w.env()).is_empty());
    jobs.finish(&mut w.env(), wait, Outcome::Came(&answered(200)));
    assert_eq!(spans(&w, "exported"), 1);
    // The next batch goes; the host would not send it: it failed.
    let due = jobs.due(&mut w.env());
    assert_eq!(due.len(), 1);
    jobs.finish(&mut w.env(), &JobWait::SpanExport, Outcome::NotSent);
    assert_eq!(spans(&w, "failed"), 1);
}

// A job of a feature the build leaves out is never due.
#[cfg(feature = "routing")]
#[test]
fn the_probes_are_due_once_per_interval_and_finish_into_the_health_counts() {
    let mut w =
        World::new(r#"{"routing":{"probe_interval_s":5,"models":{"m":[{"cluster":"a"}]}}}"#);
    let mut jobs = Jobs::new(1, 2);
    // The first tick takes the lease; the interval after, the probe is due.
    assert!(jobs.due(&mut w.env()).is_empty());
    w.now_ms += 5_000;
    let due = jobs.due(&mut w.env());
    let [(callout, wait @ JobWait::Probe(probe))] = due.as_slice() else {
        panic!("one probe due: {due:?}");
    };
    assert_eq!(callout.cluster, "a");
    assert_eq!(callout.timeout_ms, probe.timeout_ms);
    assert!(callout.headers.iter().any(|(k, _)| k == ":path"));
    w.now_ms += 5_000;
    assert!(
        jobs.due(&mut w.env()).len() == 1,
        "the next interval probes again"
    );
    jobs.finish(&mut w.env(), wait, Outcome::Came(&answered(200)));
    jobs.finish(&mut w.env(), wait, Outcome::Came(&CalloutAnswer::default()));
    jobs.finish(&mut w.env(), wait, Outcome::NotSent);
    let probes = |result: &str| {
        let name = names::name(
            ROUTING_PROBES,
            &[(names::LLM_CLUSTER, "a"), ("result", result)],
        );
        w.metrics.counters.get(&name).copied().unwrap_or(0)
    };
    // An answer proves the server up; no answer, or none sent, does not.
    assert_eq!((probes("ok"), probes("fail")), (1, 2));
}
