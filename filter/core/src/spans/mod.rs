//! A span per LLM call, exported over OTLP/HTTP (`tracing.otlp`): the span
//! whose id the filter writes upstream in `traceparent`, so the upstream's
//! own spans hang under a span the tracing backend has. Its name and
//! attributes follow the OpenTelemetry GenAI conventions
//! (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.*`, …),
//! and the filter's own decisions are attributes under `llm_filter.*`.
//!
//! Each worker keeps its spans in a bounded queue of its own ([`Queue`]) and
//! sends them in batches from its timer by HTTP callout, one export in flight
//! at a time: nothing is exported on the request path, nothing is shared
//! between workers (a span needs no other worker's eyes, and a queue in shared
//! data would cost every call a compare-and-swap), a full queue drops new
//! spans and counts them, and a collector that is down or slow costs a failed
//! batch, never a call. Sampling is parent-based: a continued trace is
//! exported when its caller sampled it; a new one with `sample_ratio`.

pub mod capture;
pub mod config;
pub mod otlp;
pub mod record;
pub mod redact;

use std::collections::VecDeque;

use crate::dialect::Dialect;
use crate::host::Metrics;
use crate::metrics as names;
use crate::pricing::Price;
use crate::summary::{CallSummary, End};
use crate::trace_context::SpanIds;
pub use capture::{Captured, Prompt};
pub use config::{CaptureConfig, OtlpConfig};
use otlp::Value;

/// Longest string attribute kept, bytes (cut on a character boundary).
pub const MAX_STRING_BYTES: usize = 256;

/// What the walk knew of a call beyond its [`CallSummary`], for its span.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Details<'a> {
    /// The model the request named.
    pub requested_model: Option<&'a str>,
    /// The model the answer named.
    pub response_model: Option<&'a str>,
    /// Why the answer ended, as it said.
    pub finish_reasons: &'a [&'a str],
    /// The request's output token cap.
    pub max_tokens: Option<u64>,
    /// The request's temperature.
    pub temperature: Option<f64>,
    /// `x-cache` told the client (`HIT`, `MISS`, …).
    pub cache: Option<&'static str>,
    /// The degrade level an action of which changed the call.
    pub degraded: Option<u8>,
    /// The model degrade switched to.
    pub fallback_model: Option<&'a str>,
    /// Who the caller is (see [`crate::identity`]): never a credential.
    pub tenant: Option<&'a str>,
    /// How the call's hedge ended (`won`, `lost`, `abandoned`), when one was sent.
    pub hedge: Option<&'static str>,
    /// The prompt-cache markers the filter put on (0: none).
    pub cache_markers: u32,
    /// The guardrail rules that fired (`rule:action`, joined by commas).
    pub guardrails: Option<&'a str>,
    /// The prompt, when captured (`tracing.capture.prompt`).
    pub prompt: Option<&'a Prompt>,
    /// The completion, when captured (`tracing.capture.completion`).
    pub completion: Option<&'a Captured>,
    /// The price of the call's model, when it has one.
    pub price: Option<&'a Price>,
}

impl Details<'_> {
    /// The captured attributes, by name: each a JSON string.
    pub fn captured(&self) -> [(&'static str, Option<&Captured>); 3] {
        let prompt = self.prompt;
        [
            (
                "gen_ai.system_instructions",
                prompt.and_then(|p| p.system.as_ref()),
            ),
            (
                "gen_ai.input.messages",
                prompt.and_then(|p| p.messages.as_ref()),
            ),
            ("gen_ai.output.messages", self.completion),
        ]
    }

    /// The names of the captured attributes that were cut to fit.
    pub fn cut(&self) -> Vec<&'static str> {
        self.captured()
            .into_iter()
            .filter(|(_, c)| c.is_some_and(|c| c.cut))
            .map(|(name, _)| name)
            .collect()
    }
}

/// `gen_ai.provider.name` as the dialect names it (the backend behind an
/// OpenAI-compatible API may be another: `server.address` says which).
fn provider(api: Dialect) -> &'static str {
    api.answer().provider()
}

/// `s` cut to [`MAX_STRING_BYTES`] on a character boundary.
fn bounded(s: &str) -> &str {
    if s.len() <= MAX_STRING_BYTES {
        return s;
    }
    let mut end = MAX_STRING_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

/// What the call cost, and what the provider's prompt cache saved on it
/// (net of its writes' premium; `None` when it neither read nor wrote),
/// in the price unit: when its model has a price and its answer a usage.
fn spend(call: &CallSummary<'_>, details: &Details<'_>) -> Option<(f64, Option<f64>)> {
    let (p, u) = (details.price?, call.served.usage.as_ref()?);
    let unit = |nanos: u64| nanos as f64 / crate::limits::config::NANOS_PER_UNIT;
    let e = p.cache_effect(u);
    let cached = u.cached_tokens > 0 || u.cache_write_tokens > 0;
    let saved = cached.then(|| unit(e.saved) - unit(e.premium));
    Some((unit(p.cost(u)), saved))
}

/// The `error.type` of a call that failed, `None` for one that did not.
fn error_type(end: End) -> Option<String> {
    match end {
        End::Answered(s) | End::Local(s) | End::NoCredential(s) if s >= 400 => Some(s.to_string()),
        End::TimedOut(_) => Some("timeout".to_string()),
        End::Reset(_) => Some("reset".to_string()),
        End::Cut(_) => Some("incomplete".to_string()),
        End::Abandoned => Some("cancelled".to_string()),
        _ => None,
    }
}

/// The status code the client got, when it got one.
fn status(end: End) -> Option<u16> {
    match end {
        End::Local(s)
        | End::Answered(s)
        | End::Cut(s)
        | End::TimedOut(s)
        | End::Reset(s)
        | End::NoCredential(s) => Some(s),
        End::Abandoned | End::Outlasted => None,
    }
}

/// The bytes of the span of a call: `ids` as written upstream, what the
/// summary and `details` say as attributes.
pub fn encode(ids: &SpanIds, call: &CallSummary<'_>, details: &Details<'_>) -> Vec<u8> {
    let op = call.api.operation();
    let requested = details.requested_model.map(bounded);
    let name = match requested {
        Some(m) => format!("{op} {m}"),
        None => op.to_string(),
    };
    let error = error_type(call.end());
    let mut a: Vec<(&str, Value<'_>)> = Vec::with_capacity(32);
    genai_attributes(&mut a, call, details, op, requested, error.as_deref());
    decision_attributes(&mut a, call, details);
    for (name, c) in details.captured() {
        if let Some(c) = c {
            a.push((name, Value::Str(&c.json)));
        }
    }
    let cut = details.cut();
    if !cut.is_empty() {
        a.push(("llm_filter.capture.truncated", Value::Strs(&cut)));
    }
    let ns = |ms: u64| ms.saturating_mul(1_000_000);
    otlp::span(&otlp::SpanFields {
        trace_id: ids.trace_id,
        span_id: ids.span_id,
        parent_span_id: ids.parent_id,
        name: &name,
        start_ns: ns(call.served.started_ms),
        end_ns: ns(call.served.ended_ms.max(call.served.started_ms)),
        attributes: &a,
        error: error.as_deref(),
        flags: ids.flags,
    })
}

/// The GenAI conventions' attributes of a call.
fn genai_attributes<'a>(
    a: &mut Vec<(&'static str, Value<'a>)>,
    call: &'a CallSummary<'_>,
    details: &'a Details<'_>,
    op: &'static str,
    requested: Option<&'a str>,
    error: Option<&'a str>,
) {
    a.push(("gen_ai.operation.name", Value::Str(op)));
    a.push(("gen_ai.provider.name", Value::Str(provider(call.api))));
    a.push(("gen_ai.system", Value::Str(provider(call.api))));
    if let Some(m) = requested {
        a.push(("gen_ai.request.model", Value::Str(m)));
    }
    if let Some(m) = details.response_model {
        a.push(("gen_ai.response.model", Value::Str(bounded(m))));
    }
    if !details.finish_reasons.is_empty() {
        a.push((
            "gen_ai.response.finish_reasons",
            Value::Strs(details.finish_reasons),
        ));
    }
    if let Some(n) = details.max_tokens {
        a.push((
            "gen_ai.request.max_tokens",
            Value::Int(i64::try_from(n).unwrap_or(i64::MAX)),
        ));
    }
    if let Some(t) = details.temperature {
        a.push(("gen_ai.request.temperature", Value::Double(t)));
    }
    if let Some(u) = &call.served.usage {
        let int = |n: u64| Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
        a.push(("gen_ai.usage.input_tokens", int(u.prompt_tokens)));
        a.push(("gen_ai.usage.output_tokens", int(u.completion_tokens)));
        for (name, n) in [
            ("gen_ai.usage.cache_read.input_tokens", u.cached_tokens),
            (
                "gen_ai.usage.cache_creation.input_tokens",
                u.cache_write_tokens,
            ),
            ("gen_ai.usage.reasoning.output_tokens", u.reasoning_tokens),
        ] {
            if n > 0 {
                a.push((name, int(n)));
            }
        }
    }
    if let Some(c) = call.served.cluster {
        a.push(("server.address", Value::Str(bounded(c))));
    }
    if let Some(s) = status(call.end()) {
        a.push(("http.response.status_code", Value::Int(i64::from(s))));
    }
    if let Some(e) = error {
        a.push(("error.type", Value::Str(e)));
    }
}

/// The filter's decisions on a call, as `llm_filter.*` attributes.
fn decision_attributes<'a>(
    a: &mut Vec<(&'static str, Value<'a>)>,
    call: &'a CallSummary<'_>,
    details: &'a Details<'_>,
) {
    a.push(("llm_filter.priority", Value::Str(call.priority.as_str())));
    a.push(("llm_filter.api", Value::Str(call.api.api())));
    if let Some(c) = details.cache {
        a.push(("llm_filter.cache", Value::Str(c)));
    }
    if let Some((cost, saved)) = spend(call, details) {
        a.push(("llm_filter.cost", Value::Double(cost)));
        if let Some(saved) = saved {
            a.push(("llm_filter.prompt_cache.saved", Value::Double(saved)));
        }
    }
    if details.cache_markers > 0 {
        a.push((
            "llm_filter.prompt_cache.markers",
            Value::Int(i64::from(details.cache_markers)),
        ));
    }
    if call.served.budget_ms > 0 {
        a.push((
            "llm_filter.budget_ms",
            Value::Int(i64::try_from(call.served.budget_ms).unwrap_or(i64::MAX)),
        ));
    }
    if let Some(n) = call.served.attempts.filter(|n| *n > 1) {
        a.push(("llm_filter.retries", Value::Int(i64::from(n - 1))));
    }
    if call.served.failovers > 0 {
        a.push((
            "llm_filter.failovers",
            Value::Int(i64::from(call.served.failovers)),
        ));
    }
    if let Some(h) = details.hedge {
        a.push(("llm_filter.hedge", Value::Str(h)));
    }
    if let Some(b) = call.served.breaker {
        a.push(("llm_filter.breaker", Value::Str(bounded(b))));
    }
    if let Some(level) = details.degraded {
        a.push(("llm_filter.degrade.level", Value::Int(i64::from(level))));
    }
    if let Some(m) = details.fallback_model {
        a.push(("llm_filter.degrade.fallback_model", Value::Str(bounded(m))));
    }
    if let Some(t) = details.tenant {
        a.push(("llm_filter.tenant", Value::Str(bounded(t))));
    }
    if let Some(g) = details.guardrails {
        a.push(("llm_filter.guardrails", Value::Str(bounded(g))));
    }
    if let Some(g) = call.group {
        a.push(("llm_filter.ab.group", Value::Str(bounded(g))));
    }
}

/// One batch to send: an HTTP POST callout to the collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// Envoy cluster of the collector.
    pub cluster: String,
    /// Request headers, pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// The `ExportTraceServiceRequest`.
    pub body: Vec<u8>,
    /// Give up on the answer after this long.
    pub timeout_ms: u64,
    /// Spans in it.
    pub spans: u32,
}

/// The spans of one worker waiting for export.
#[derive(Debug, Default)]
pub struct Queue {
    spans: VecDeque<Vec<u8>>,
    /// Bytes of the spans waiting.
    bytes: usize,
    /// When the last batch left (or the queue was made), ms.
    last_export_ms: u64,
    /// Spans of the batch in flight (0: none).
    in_flight: u32,
}

fn count(m: &mut dyn Metrics, result: &str, n: u64) {
    if n > 0 {
        m.counter(&names::name(names::SPANS, &[("result", result)]), n);
    }
}

impl Queue {
    /// Spans waiting.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// None waiting.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Bytes of the spans waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Queues a span, or drops it (counted) when `cfg.max_queue` are
    /// waiting or it would take the queue past `cfg.max_queue_bytes`.
    pub fn push(&mut self, cfg: &OtlpConfig, m: &mut dyn Metrics, span: Vec<u8>) {
        let bytes = self.bytes.saturating_add(span.len());
        if self.spans.len() >= cfg.max_queue as usize || bytes > cfg.max_queue_bytes {
            count(m, "dropped", 1);
            return;
        }
        self.bytes = bytes;
        self.spans.push_back(span);
        count(m, "queued", 1);
        m.gauge_add(names::SPANS_QUEUED, 1);
    }

    /// The batch due at `now_ms`: `batch_size` spans are waiting, or some
    /// have for `interval_ms`; none while a batch is in flight.
    pub fn due(&mut self, cfg: &OtlpConfig, m: &mut dyn Metrics, now_ms: u64) -> Option<Export> {
        if self.in_flight > 0 {
            return None;
        }
        if self.spans.is_empty() {
            // A span that comes waits `interval_ms` from about now.
            self.last_export_ms = now_ms;
            return None;
        }
        let full = self.spans.len() >= cfg.batch_size as usize;
        if !full && now_ms.saturating_sub(self.last_export_ms) < cfg.interval_ms {
            return None;
        }
        let n = self.spans.len().min(cfg.batch_size as usize);
        let batch: Vec<Vec<u8>> = self.spans.drain(..n).collect();
        let sent: usize = batch.iter().map(Vec::len).sum();
        self.bytes = self.bytes.saturating_sub(sent);
        let spans = u32::try_from(n).unwrap_or(u32::MAX);
        m.gauge_add(names::SPANS_QUEUED, -i64::from(spans));
        let body = otlp::export_request(
            &[("service.name", Value::Str(&cfg.service_name))],
            ("llm-filter", env!("CARGO_PKG_VERSION")),
            batch.iter().map(Vec::as_slice),
        );
        let service = &cfg.service;
        let headers = service.request_headers(
            "POST",
            &service.path,
            Some(("application/x-protobuf", body.len())),
        );
        self.in_flight = spans;
        self.last_export_ms = now_ms;
        Some(Export {
            cluster: service.cluster.clone(),
            headers,
            body,
            timeout_ms: service.timeout_ms,
            spans,
        })
    }

    /// The batch in flight ended: answered with `status` (`None`: no answer,
    /// or it was never sent). Its spans are counted exported or failed; a
    /// failed batch is not retried, so a collector that is down costs the
    /// spans of its batches and nothing more.
    pub fn finished(&mut self, m: &mut dyn Metrics, status: Option<u16>) {
        let n = u64::from(std::mem::take(&mut self.in_flight));
        let ok = status.is_some_and(|s| (200..300).contains(&s));
        count(m, if ok { "exported" } else { "failed" }, n);
    }
}

#[cfg(test)]
mod tests;
