//! The HTTP context: adapts Envoy's stream callbacks to the core's request
//! walk. Nothing is decided here.

use std::rc::Rc;

use llm_filter_core::admin::AdminCall;
use llm_filter_core::walk::{Call, Env, Host, Step};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::adapter::Headers;
use crate::callout;
use crate::stream::Stream;
use crate::worker::{with_env, CallSlot, Worker};

/// One HTTP stream.
pub struct Http {
    id: u32,
    worker: Rc<Worker>,
    /// `None` for anything that is not an LLM call: it passes untouched.
    /// Shared with the timer while the call is parked.
    call: CallSlot,
    /// A request to the filter's own endpoints, answered here.
    admin: Option<AdminCall>,
    /// The request headers read while the call holds its body, for the
    /// callback that gets the body.
    held_request: Option<Headers>,
    /// The request concerned the filter ([`Call::concerns`]); the callbacks
    /// of any other return at once.
    concerned: bool,
}

impl Http {
    /// A context for stream `id`.
    pub fn new(id: u32, worker: Rc<Worker>) -> Self {
        Self {
            id,
            worker,
            call: CallSlot::default(),
            admin: None,
            held_request: None,
            concerned: false,
        }
    }

    /// Runs one callback of the walk on `stream`, parking the call when it
    /// waits for the timer and keeping the request headers read while it
    /// holds its body.
    fn step(
        &mut self,
        mut stream: Stream,
        f: impl FnOnce(&mut Call, &mut Env<'_>, &mut dyn Host) -> Step,
    ) -> Action {
        // A callback re-entered from inside another one (should the host ever
        // deliver one synchronously) finds the call busy and lets it pass.
        let Ok(mut slot) = self.call.try_borrow_mut() else {
            return Action::Continue;
        };
        let Some(call) = slot.as_mut() else {
            return Action::Continue;
        };
        // A worker busy in another callback: the call passes as it stands.
        let Some(step) = with_env(&self.worker, |env| f(call, env, &mut stream)) else {
            return Action::Continue;
        };
        let (parked, holds_body) = (call.is_parked(), call.holds_body());
        drop(slot);
        callout::register_calls(&self.worker, self.id, &self.call, stream.take_dispatched());
        if parked {
            self.worker.park(self.id, &self.call);
        }
        if holds_body {
            self.held_request = stream.into_request();
        }
        action(step)
    }
}

fn action(step: Step) -> Action {
    match step {
        Step::Continue => Action::Continue,
        Step::Pause => Action::Pause,
    }
}

impl Context for Http {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        #[cfg(feature = "hostcall-census")]
        let _timed =
            crate::hostcall::bench_census::Timed::new(self.worker.stats(), "callout_response");
        callout::deliver(&self.worker, token, body_size, Some(self.id));
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "hostcall-census")]
        let _timed =
            crate::hostcall::bench_census::Timed::new(self.worker.stats(), "request_headers");
        // The filter's own endpoints first, then the walk: one read of the
        // request's headers and of the clock serves both. A request that
        // concerns neither passes on that read alone.
        let mut stream = Stream::default();
        if !Call::concerns(&self.worker.config, &stream) {
            return Action::Continue;
        }
        self.concerned = true;
        let started = with_env(&self.worker, |env| {
            match AdminCall::start(env, &mut stream, end_of_stream) {
                Some(admin) => Err(admin),
                None => Ok(Call::start(env, &mut stream, end_of_stream)),
            }
        });
        let started = match started {
            // A worker busy in another callback: the request passes untouched.
            None => return Action::Continue,
            Some(Err((admin, step))) => {
                self.admin = Some(admin);
                return action(step);
            }
            Some(Ok(started)) => started,
        };
        let Some((call, step)) = started else {
            return Action::Continue;
        };
        let sent = stream.take_dispatched();
        let parked = call.is_parked();
        if call.holds_body() {
            self.held_request = stream.into_request();
        }
        let Ok(mut slot) = self.call.try_borrow_mut() else {
            return Action::Continue;
        };
        *slot = Some(call);
        drop(slot);
        callout::register_calls(&self.worker, self.id, &self.call, sent);
        if parked {
            self.worker.park(self.id, &self.call);
        }
        action(step)
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "hostcall-census")]
        let _timed = crate::hostcall::bench_census::Timed::new(self.worker.stats(), "request_body");
        if !self.concerned {
            return Action::Continue;
        }
        if let Some(admin) = self.admin.as_mut() {
            let step = with_env(&self.worker, |env| {
                admin.on_request_body(env, &mut Stream::default(), size, end_of_stream)
            });
            return step.map_or(Action::Continue, action);
        }
        // The headers kept are good only while the body is still held: a
        // request the timer let go (the body watchdog) has gone upstream.
        let still_held = self
            .call
            .try_borrow()
            .is_ok_and(|c| c.as_ref().is_some_and(Call::holds_body));
        let held = self.held_request.take().filter(|_| still_held);
        let stream = Stream::with_request(held);
        self.step(stream, |call, env, host| {
            call.on_request_body(env, host, size, end_of_stream)
        })
    }

    fn on_http_response_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "hostcall-census")]
        let _timed =
            crate::hostcall::bench_census::Timed::new(self.worker.stats(), "response_headers");
        if !self.concerned {
            return Action::Continue;
        }
        self.step(Stream::default(), |call, env, host| {
            call.on_response_headers(env, host, end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "hostcall-census")]
        let _timed =
            crate::hostcall::bench_census::Timed::new(self.worker.stats(), "response_body");
        if !self.concerned {
            return Action::Continue;
        }
        self.step(Stream::default(), |call, env, host| {
            call.on_response_body(env, host, size, end_of_stream)
        })
    }

    fn on_log(&mut self) {
        #[cfg(feature = "hostcall-census")]
        let _timed = crate::hostcall::bench_census::Timed::new(self.worker.stats(), "log");
        if !self.concerned {
            return;
        }
        let call = self.call.try_borrow_mut().ok().and_then(|mut c| c.take());
        self.worker.forget_calls(self.id);
        if let Some(call) = call {
            // A worker busy in another callback: the call ends unrecorded.
            let _ = with_env(&self.worker, |env| call.on_log(env));
        }
    }
}
