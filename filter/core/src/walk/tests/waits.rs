//! The continuation a call registers with each callout, and answers the
//! call no longer waits for.

use super::*;
use crate::walk::CallWait;

#[test]
fn each_callout_names_what_its_answer_does() {
    // The failover's.
    let mut w = World::new(TWO_BACKENDS);
    let (_call, host, _, _) = failed_over_from_b(&mut w);
    assert_eq!(host.waits, [CallWait::Failover]);
    // The hedge's.
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    assert_eq!(host.waits, [CallWait::Hedge]);
}

#[test]
fn a_hedge_out_when_its_backend_fails_answers_as_the_failover() {
    let mut w = World::new(&hedged(1.0));
    let (mut call, mut host) = routed_to(&mut w, "b");
    w.now_ms += 150;
    assert_eq!(call.on_tick(&mut w.env(), &mut host), Wake::Idle);
    let mut host = host.with_response(503, "application/json", r#"{"error":{}}"#);
    assert_eq!(
        call.on_response_headers(&mut w.env(), &mut host, false),
        Step::Pause,
        "the failure is held for the hedge"
    );
    assert_eq!(host.waits, [CallWait::Hedge], "no second callout");
    let step = call.on_callout_response(&mut w.env(), &mut host, CallWait::Hedge, answer_200());
    assert_eq!(step, Step::Pause);
    let (status, headers, _) = host.local_reply.clone().unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers.get("x-llm-cluster").map(String::as_str), Some("a"));
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_hedges_totalresult=.=won;.;"),
        1
    );
}

#[test]
fn an_answer_the_call_no_longer_waits_for_changes_nothing() {
    let mut w = World::new(TWO_BACKENDS);
    let (mut call, mut host, _, _) = failed_over_from_b(&mut w);
    assert_eq!(
        call.answer_callout(&mut w.env(), &mut host, answer_200()),
        Step::Pause
    );
    let replied = host.local_reply.take();
    assert!(replied.is_some());
    // The call was answered: any other answer, of any kind, is too late.
    for then in [
        CallWait::Failover,
        CallWait::Hedge,
        CallWait::Fallback,
        CallWait::Embedding,
    ] {
        let step = call.on_callout_response(&mut w.env(), &mut host, then, answer_200());
        assert_eq!(step, Step::Pause, "{then:?}: nothing to resume");
        assert!(host.local_reply.is_none(), "{then:?}: no second reply");
    }
    // A call that never sent one: an embedding answer finds no wait.
    let (mut call, mut host) = routed_to(&mut w, "a");
    let step = call.on_callout_response(
        &mut w.env(),
        &mut host,
        CallWait::Embedding,
        CalloutAnswer::default(),
    );
    assert_eq!(step, Step::Pause);
    assert!(host.local_reply.is_none() && host.callouts.is_empty());
    call.on_log(&mut w.env());
    assert_eq!(
        w.counter("llm_filter_routing_failovers_totalresult=.=answered;.;"),
        1,
        "counted once"
    );
}
