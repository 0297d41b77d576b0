//! The HTTP context: adapts Envoy's stream callbacks to the core's request
//! walk. Nothing is decided here.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use llm_filter_core::admin::AdminCall;
use llm_filter_core::wait::CallWait;
use llm_filter_core::walk::{Call, Env, Host, Step};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use crate::adapter::{self, Headers};
use crate::callout::{self, Sent};
use crate::hostcall;
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
        let _timed = hostcall::bench_census::Timed::new(self.worker.stats(), "callout_response");
        callout::deliver(&self.worker, token, body_size, Some(self.id));
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "hostcall-census")]
        let _timed = hostcall::bench_census::Timed::new(self.worker.stats(), "request_headers");
        // The filter's own endpoints first, then the walk: one read of the
        // request's headers and of the clock serves both.
        let mut stream = Stream::default();
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
        let _timed = hostcall::bench_census::Timed::new(self.worker.stats(), "request_body");
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
        let _timed = hostcall::bench_census::Timed::new(self.worker.stats(), "response_headers");
        self.step(Stream::default(), |call, env, host| {
            call.on_response_headers(env, host, end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "hostcall-census")]
        let _timed = hostcall::bench_census::Timed::new(self.worker.stats(), "response_body");
        self.step(Stream::default(), |call, env, host| {
            call.on_response_body(env, host, size, end_of_stream)
        })
    }

    fn on_log(&mut self) {
        #[cfg(feature = "hostcall-census")]
        let _timed = hostcall::bench_census::Timed::new(self.worker.stats(), "log");
        let call = self.call.try_borrow_mut().ok().and_then(|mut c| c.take());
        self.worker.forget_calls(self.id);
        if let Some(call) = call {
            // A worker busy in another callback: the call ends unrecorded.
            let _ = with_env(&self.worker, |env| call.on_log(env));
        }
    }
}

/// The current stream (the effective context), through the host calls that
/// return errors. Each header map is fetched once, on first use, and kept in
/// step with the walk's own edits: one crossing into the host instead of one
/// per header, and none for removing a header the map does not have.
#[derive(Default)]
pub struct Stream {
    request: Cell<Option<Headers>>,
    response: Cell<Option<Headers>>,
    /// The callouts sent, for the worker's registry to route their answers
    /// back (see [`callout::register_calls`]).
    dispatched: Vec<Sent>,
}

impl Stream {
    /// A stream whose request headers were read by an earlier callback of
    /// the same held request (nothing else edits them while it is held).
    pub fn with_request(request: Option<Headers>) -> Self {
        Self {
            request: Cell::new(request),
            ..Self::default()
        }
    }

    /// The request headers as this stream knows them, for the next callback
    /// of a request still held.
    pub fn into_request(self) -> Option<Headers> {
        self.request.into_inner()
    }

    /// The callouts this stream sent during the callback.
    pub fn take_dispatched(&mut self) -> Vec<Sent> {
        std::mem::take(&mut self.dispatched)
    }

    /// Runs `f` on the map, read from the host on first use. The map is
    /// taken out while `f` runs and put back after, so no borrow can clash
    /// (`f` is this module's own and never comes back here).
    fn with<T>(&self, map: MapType, f: impl FnOnce(&mut Headers) -> T) -> T {
        let cell = match map {
            MapType::HttpResponseHeaders => &self.response,
            _ => &self.request,
        };
        let mut headers = cell.take().unwrap_or_else(|| Headers::read(map));
        let out = f(&mut headers);
        cell.set(Some(headers));
        out
    }

    fn set(&self, map: MapType, name: &str, value: Option<&str>) -> bool {
        self.with(map, |headers| {
            if value.is_none() && !headers.has(name) {
                return true;
            }
            if !adapter::set_header(map, name, value) {
                return false;
            }
            headers.record(name, value);
            true
        })
    }
}

impl Host for Stream {
    fn request_header(&self, name: &str) -> Option<String> {
        self.with(MapType::HttpRequestHeaders, |h| h.first(name))
    }

    fn request_header_all(&self, name: &str) -> Vec<String> {
        self.with(MapType::HttpRequestHeaders, |h| h.all(name))
    }

    fn set_request_header(&mut self, name: &str, value: Option<&str>) -> bool {
        self.set(MapType::HttpRequestHeaders, name, value)
    }

    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        hostcall::get_buffer(BufferType::HttpRequestBody, 0, size)
            .ok()
            .flatten()
    }

    fn set_request_body(&mut self, size: usize, body: &[u8]) -> bool {
        hostcall::set_buffer(BufferType::HttpRequestBody, 0, size, body).is_ok()
    }

    fn response_header(&self, name: &str) -> Option<String> {
        self.with(MapType::HttpResponseHeaders, |h| h.first(name))
    }

    fn set_response_header(&mut self, name: &str, value: Option<&str>) -> bool {
        self.set(MapType::HttpResponseHeaders, name, value)
    }

    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        hostcall::get_buffer(BufferType::HttpResponseBody, 0, size)
            .ok()
            .flatten()
    }

    fn set_response_body(&mut self, size: usize, body: &[u8]) -> bool {
        hostcall::set_buffer(BufferType::HttpResponseBody, 0, size, body).is_ok()
    }

    fn response_code_details(&self) -> Option<String> {
        hostcall::get_property(&["response", "code_details"])
            .ok()
            .flatten()
            .map(|b| adapter::text(&b))
    }

    fn send_local_reply(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> bool {
        hostcall::send_http_response(status, headers, body).is_ok()
    }

    fn set_property(&mut self, path: &str, value: &[u8]) -> bool {
        hostcall::set_property(path, value).is_ok()
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        hostcall::get_property(path).ok().flatten()
    }

    fn clear_route_cache(&mut self) -> bool {
        hostcall::call_foreign_function("clear_route_cache", None).is_ok()
    }

    fn request_headers(&self) -> Vec<(String, String)> {
        self.with(MapType::HttpRequestHeaders, |h| h.pairs())
    }

    fn dispatch_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
        then: CallWait,
    ) -> bool {
        let timeout = Duration::from_millis(timeout_ms);
        match hostcall::dispatch_http_call(cluster, headers, Some(body), timeout) {
            Ok(token) => {
                self.dispatched.push((token, then, timeout_ms));
                true
            }
            Err(_) => false,
        }
    }
}
