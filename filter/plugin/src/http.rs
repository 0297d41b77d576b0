//! The HTTP context: walks one request through the core (classify, priority,
//! trace) and observes its response (timings, usage) for the metrics.

use std::rc::Rc;

use llm_filter_core::baggage;
use llm_filter_core::classify::{self, Endpoint};
use llm_filter_core::config::TracingMode;
use llm_filter_core::observe::CallRecord;
use llm_filter_core::priority::{self, Priority};
use llm_filter_core::trace_context;
use llm_filter_core::usage::{self, SseScanner, Usage};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use crate::host::{self, now_ms};
use crate::root::Worker;

/// Largest request or JSON response body copied aside to read `model` or `usage`.
const MAX_OBSERVED_BODY: usize = 1 << 20;

const PRIORITY_HEADER: &str = "x-request-priority";
const TRACE_ID_HEADER: &str = "x-trace-id";

/// One HTTP stream.
pub struct Http {
    id: u32,
    worker: Rc<Worker>,
    /// `None` for anything that is not an LLM call: it passes untouched.
    call: Option<Call>,
}

/// What the filter knows about one LLM call.
struct Call {
    #[allow(dead_code)]
    endpoint: Endpoint,
    priority: Priority,
    trace_id: Option<String>,
    started_ms: u64,
    request_body: Vec<u8>,
    request_body_overflow: bool,
    status: Option<u16>,
    first_byte_ms: Option<u64>,
    stream: Option<SseScanner>,
    response_body: Vec<u8>,
    response_body_overflow: bool,
}

impl Http {
    /// A context for stream `id`.
    pub fn new(id: u32, worker: Rc<Worker>) -> Self {
        Self {
            id,
            worker,
            call: None,
        }
    }

    fn request_header(name: &str) -> Option<String> {
        host::header(MapType::HttpRequestHeaders, name)
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) {
        if !host::set_header(MapType::HttpRequestHeaders, name, value) {
            log::warn!("#{} cannot set request header {name}", self.id);
            self.worker
                .metrics
                .borrow_mut()
                .internal_error("set_header");
        }
    }

    /// Priority and trace context, written toward the upstream.
    fn tag(&self, call: &mut Call) {
        let cfg = &self.worker.config;
        call.priority = priority::resolve(
            Self::request_header(PRIORITY_HEADER).as_deref(),
            cfg.priority.trust_client,
            cfg.priority.default,
        );
        let p = call.priority.as_str();
        self.set_request_header(PRIORITY_HEADER, Some(p));
        let existing = host::header_all(MapType::HttpRequestHeaders, "baggage");
        let existing = (!existing.is_empty()).then(|| existing.join(","));
        let merged = baggage::merge(existing.as_deref(), "priority", p);
        self.set_request_header("baggage", Some(&merged));

        let incoming = Self::request_header("traceparent");
        match cfg.tracing {
            TracingMode::Always => {
                let out =
                    trace_context::next(incoming.as_deref(), &mut *self.worker.rng.borrow_mut());
                self.set_request_header("traceparent", Some(&out.traceparent));
                if !out.continued {
                    self.set_request_header("tracestate", None);
                }
                call.trace_id = Some(out.trace_id);
            }
            TracingMode::Off => {
                call.trace_id = incoming
                    .as_deref()
                    .and_then(trace_context::TraceParent::parse)
                    .map(|_| {
                        incoming
                            .unwrap_or_default()
                            .get(3..35)
                            .unwrap_or("")
                            .to_string()
                    });
            }
        }
    }
}

/// Appends `chunk` to `buf` unless that would pass `MAX_OBSERVED_BODY`.
fn keep(buf: &mut Vec<u8>, overflow: &mut bool, chunk: &[u8]) {
    if *overflow || buf.len().saturating_add(chunk.len()) > MAX_OBSERVED_BODY {
        *overflow = true;
        buf.clear();
        return;
    }
    buf.extend_from_slice(chunk);
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, _end_of_stream: bool) -> Action {
        let method = Self::request_header(":method").unwrap_or_default();
        let path = Self::request_header(":path").unwrap_or_default();
        let Some(endpoint) = classify::classify(&method, &path, &self.worker.config.llm_paths)
        else {
            return Action::Continue;
        };
        let mut call = Call {
            endpoint,
            priority: Priority::default(),
            trace_id: None,
            started_ms: now_ms(),
            request_body: Vec::new(),
            request_body_overflow: false,
            status: None,
            first_byte_ms: None,
            stream: None,
            response_body: Vec::new(),
            response_body_overflow: false,
        };
        self.tag(&mut call);
        self.call = Some(call);
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        let Some(call) = self.call.as_mut() else {
            return Action::Continue;
        };
        if !call.request_body_overflow {
            if let Ok(Some(chunk)) =
                hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            {
                keep(
                    &mut call.request_body,
                    &mut call.request_body_overflow,
                    &chunk,
                );
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _end_of_stream: bool) -> Action {
        let Some(call) = self.call.as_mut() else {
            return Action::Continue;
        };
        call.status =
            host::header(MapType::HttpResponseHeaders, ":status").and_then(|s| s.parse().ok());
        let content_type = host::header(MapType::HttpResponseHeaders, "content-type");
        if content_type.is_some_and(|c| c.contains("text/event-stream")) {
            call.stream = Some(SseScanner::new());
        }
        if let Some(trace_id) = &call.trace_id {
            if !host::set_header(
                MapType::HttpResponseHeaders,
                TRACE_ID_HEADER,
                Some(trace_id),
            ) {
                self.worker
                    .metrics
                    .borrow_mut()
                    .internal_error("set_header");
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        let Some(call) = self.call.as_mut() else {
            return Action::Continue;
        };
        if body_size > 0 && call.first_byte_ms.is_none() {
            call.first_byte_ms = Some(now_ms());
        }
        let Ok(Some(chunk)) = hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size)
        else {
            return Action::Continue;
        };
        match call.stream.as_mut() {
            Some(scanner) => scanner.feed(&chunk),
            None => keep(
                &mut call.response_body,
                &mut call.response_body_overflow,
                &chunk,
            ),
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let model = classify::model(&call.request_body);
        let usage: Option<Usage> = match &call.stream {
            Some(scanner) => scanner.usage,
            None => usage::from_json(&call.response_body),
        };
        let mut models = self.worker.models.borrow_mut();
        let record = CallRecord {
            priority: call.priority,
            model: models.value(model.as_deref()),
            status: call.status,
            started_ms: call.started_ms,
            first_byte_ms: call.first_byte_ms,
            ended_ms: now_ms(),
            usage,
        };
        record.emit(&mut *self.worker.metrics.borrow_mut());
    }
}
