//! Callouts and their answers: sends the background jobs' callouts, reads
//! each answer as far as its continuation needs, and hands it over. What
//! should happen to an answer is the core's (`llm_filter_core::wait`): one
//! lookup by token, one delivery, whatever kind of wait it was.

use std::rc::Rc;
use std::time::Duration;

use llm_filter_core::wait::{Continuation, JobWait, Outcome, Reads};
use llm_filter_core::walk::{CallWait, CalloutAnswer, Step};
use proxy_wasm::types::{BufferType, MapType};

use crate::adapter;
use crate::hostcall;
use crate::stream::{Sent, Stream};
use crate::worker::{with_env, CallSlot, Then, Worker};

/// Sends a callout; its token, `None` when the host would not (Envoy knows
/// no such cluster).
fn send(
    cluster: &str,
    headers: &[(String, String)],
    body: Option<&[u8]>,
    timeout_ms: u64,
) -> Option<u32> {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    hostcall::dispatch_http_call(cluster, &headers, body, Duration::from_millis(timeout_ms)).ok()
}

/// Registers the callouts the call in `slot` (stream `id`) sent during a
/// callback.
pub fn register_calls(worker: &Worker, id: u32, slot: &CallSlot, sent: Vec<Sent>) {
    for (token, then, timeout_ms) in sent {
        let call = (id, Rc::downgrade(slot));
        if worker
            .register(token, Continuation::Call { call, then }, timeout_ms)
            .is_some()
        {
            // Its answer will find no call: the call waits out Envoy's own
            // timeout instead. Counted.
            worker.internal_error("callout_untracked");
        }
    }
}

/// Sends the background jobs' callouts that are due, each registered with
/// the job its answer goes back to.
pub fn run_jobs(worker: &Worker) {
    let Some(due) = worker
        .jobs
        .with(|jobs| with_env(worker, |env| jobs.due(env)))
        .flatten()
    else {
        return;
    };
    for (callout, wait) in due {
        let body = callout.body.as_deref();
        let Some(token) = send(&callout.cluster, &callout.headers, body, callout.timeout_ms) else {
            finish_job(worker, &wait, Outcome::NotSent);
            continue;
        };
        let refused = worker.register(token, Continuation::Job(wait), callout.timeout_ms);
        if let Some(then) = refused {
            // Sent, but its answer will find no job: it ends unanswered now.
            worker.internal_error("callout_untracked");
            hand_over(worker, then, CalloutAnswer::default(), None);
        }
    }
}

/// The answer of callout `token` came (`body_size` bytes of body), to the
/// context `current` (`None`: the root): it goes where its continuation
/// says. An answer no longer waited for is dropped.
pub fn deliver(worker: &Worker, token: u32, body_size: usize, current: Option<u32>) {
    let Some(then) = worker.waits.with(|w| w.take(token)).flatten() else {
        return;
    };
    let answer = read_answer(then.reads(), body_size);
    hand_over(worker, then, answer, current);
}

/// The callouts given up on at `now_ms` end unanswered.
pub fn give_up(worker: &Worker, now_ms: u64) {
    let gone = worker.waits.with(|w| w.expired(now_ms)).unwrap_or_default();
    for then in gone {
        hand_over(worker, then, CalloutAnswer::default(), None);
    }
}

/// Hands `answer` to the call or the job that waits for it.
fn hand_over(worker: &Worker, then: Then, answer: CalloutAnswer, current: Option<u32>) {
    match then {
        Continuation::Call {
            call: (id, weak),
            then,
        } => {
            let Some(slot) = weak.upgrade() else {
                return;
            };
            if current != Some(id) && hostcall::set_effective_context(id).is_err() {
                // The stream is gone.
                return;
            }
            answer_call(worker, id, &slot, then, answer);
        }
        Continuation::Job(wait) => finish_job(worker, &wait, Outcome::Came(&answer)),
    }
}

/// Hands a job the end of one of its callouts.
fn finish_job(worker: &Worker, wait: &JobWait, outcome: Outcome<'_>) {
    worker.jobs.with(|jobs| {
        with_env(worker, |env| jobs.finish(env, wait, outcome));
    });
}

/// The answer in the host's callout buffers, read as far as `reads` says.
fn read_answer(reads: Reads, body_size: usize) -> CalloutAnswer {
    let (status, headers) = if reads.headers {
        let headers = adapter::headers(MapType::HttpCallResponseHeaders);
        let status = headers
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| v.parse::<u16>().ok());
        (status, headers)
    } else {
        let status = adapter::header(MapType::HttpCallResponseHeaders, ":status")
            .and_then(|s| s.parse::<u16>().ok());
        (status, Vec::new())
    };
    let body = if reads.body_up_to == 0 || body_size > reads.body_up_to {
        Vec::new()
    } else {
        hostcall::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    CalloutAnswer {
        status,
        headers,
        body,
    }
}

/// Hands the answer of a call's callout to the walk, and lets the request or
/// response held for it go on when the walk says so (parking the call when
/// it now waits for the timer). The stream (`id`) must be the effective
/// context.
fn answer_call(worker: &Worker, id: u32, slot: &CallSlot, then: CallWait, answer: CalloutAnswer) {
    let Ok(mut call) = slot.try_borrow_mut() else {
        return;
    };
    let Some(call) = call.as_mut() else {
        return;
    };
    let request_held = call.holds_request();
    let mut stream = Stream::default();
    // A worker busy in another callback: what is held goes on.
    let step = with_env(worker, |env| {
        call.on_callout_response(env, &mut stream, then, answer)
    })
    .unwrap_or(Step::Continue);
    let parked = call.is_parked();
    register_calls(worker, id, slot, stream.take_dispatched());
    if parked {
        worker.park(id, slot);
    }
    if step == Step::Continue {
        let resumed = if request_held {
            hostcall::resume_http_request()
        } else {
            hostcall::resume_http_response()
        };
        if resumed.is_err() {
            worker.internal_error("resume");
        }
    }
}
