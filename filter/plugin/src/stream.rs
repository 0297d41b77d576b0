//! The walk's [`Host`] over Envoy's current stream: the HTTP context's
//! callbacks and the callouts' answers both drive a call through it. It
//! records the callouts the call sends, for the worker's registry.

use std::cell::Cell;
use std::time::Duration;

use llm_filter_core::walk::{CallWait, Host};
use proxy_wasm::types::{BufferType, MapType};

use crate::adapter::{self, Headers};
use crate::hostcall;

/// A callout a call sent during a callback: its token, what the call does
/// with its answer, and its timeout.
pub type Sent = (u32, CallWait, u64);

/// The current stream (the effective context), through the host calls that
/// return errors. Each header map is fetched once, on first use, and kept in
/// step with the walk's own edits: one crossing into the host instead of one
/// per header, and none for removing a header the map does not have.
#[derive(Default)]
pub struct Stream {
    request: Cell<Option<Headers>>,
    response: Cell<Option<Headers>>,
    /// The callouts sent, for the worker's registry to route their answers
    /// back (the callouts module registers them).
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

    #[cfg(feature = "guardrails")]
    fn reset_response(&mut self) -> bool {
        hostcall::reset_http_response().is_ok()
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
