//! Phase transitions check the phase they start from.

use crate::walk::body::HeldBody;
use crate::walk::state::{Phase, Progress, Timer};

fn body() -> HeldBody {
    HeldBody::parse(crate::dialect::Dialect::Chat, Vec::new(), 0)
}

#[test]
fn the_diagrams_transitions_pass() {
    let mut p = Progress::new();
    p.hold(5);
    assert_eq!(p.timer(), Some(Timer::BodyWatchdog { since_ms: 5 }));
    assert!(p.body_seen());
    p.forward();
    p.embed(body());
    assert!(p.stop_waiting().is_some());
    p.coalesce(9, body());
    assert_eq!(p.timer(), Some(Timer::Coalescing { deadline_ms: 9 }));
    assert!(p.stop_waiting().is_some());
    p.arm_hedge(7);
    assert_eq!(p.timer(), Some(Timer::Hedge { at_ms: 7 }));
    p.hedge_due();
    p.hedge_sent("a".to_string());
    assert_eq!(p.timer(), None);
    p.hold_error();
    p.fail_over();
    p.fail_over();
    p.failed_over();
    assert!(matches!(p.phase(), Phase::FailedOver));
    assert_eq!(p.strays(), 0);
}

#[test]
#[should_panic(expected = "no transition to Answered")]
fn a_second_local_reply_is_no_transition() {
    let mut p = Progress::new();
    p.answered(429);
    p.answered(200);
}

#[test]
#[should_panic(expected = "no transition to Embedding")]
fn a_call_answered_waits_for_nothing() {
    let mut p = Progress::new();
    p.answered(200);
    p.embed(body());
}

#[test]
#[should_panic(expected = "no transition to hedge Sent")]
fn a_hedge_goes_out_only_once_due() {
    let mut p = Progress::new();
    p.arm_hedge(7);
    p.hedge_sent("a".to_string());
}

#[test]
#[should_panic(expected = "no transition to FailedOver")]
fn a_held_error_is_no_answer_from_elsewhere() {
    let mut p = Progress::new();
    p.hold_error();
    p.failed_over();
}
