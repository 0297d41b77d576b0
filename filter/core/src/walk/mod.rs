//! The request walk of DESIGN.md for one HTTP stream: classify, tag, admit,
//! route, observe, learn. It drives the policy modules against a small
//! [`Host`] trait, so the whole walk runs natively against a fake host in tests
//! and the plugin only adapts Envoy's callbacks to it.

use crate::baggage;
use crate::budget::{self, breaker, parse as budget_parse, plan as budget_plan, reply};
use crate::classify::{self, Endpoint};
use crate::config::{Config, TracingMode};
use crate::host::{Metrics, Random, SharedStore};
use crate::metrics::{self as names, BoundedLabel};
use crate::observe::CallRecord;
use crate::priority::{self, Priority};
use crate::routing::{self, health, CallResult, Features};
use crate::trace_context;
use crate::usage::{self, SseScanner, Usage};

mod cache;
#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

pub use cache::AGE_HEADER;

/// Header carrying the caller's priority.
pub const PRIORITY_HEADER: &str = "x-request-priority";
/// Response header naming the trace id that went upstream.
pub const TRACE_ID_HEADER: &str = "x-trace-id";
/// Response header naming the cluster that served the call.
pub const CLUSTER_RESPONSE_HEADER: &str = "x-llm-cluster";
/// Envoy's `response.code_details` prefix of its reply to an upstream that
/// reset (or refused) the stream before any response.
pub const UPSTREAM_RESET_DETAILS: &str = "upstream_reset_before_response_started";
/// Breaker name of calls that routing did not place on a cluster.
pub const DEFAULT_BREAKER: &str = "default";

/// Stream operations the walk needs from the proxy.
pub trait Host {
    /// A request header (first value), lossily decoded.
    fn request_header(&self, name: &str) -> Option<String>;
    /// Every value of a request header, in order.
    fn request_header_all(&self, name: &str) -> Vec<String>;
    /// Sets (`Some`) or removes (`None`) a request header; false if refused.
    fn set_request_header(&mut self, name: &str, value: Option<&str>) -> bool;
    /// The request body received so far (`size` bytes of the current buffer).
    fn request_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Replaces the buffered request body; false if refused.
    fn set_request_body(&mut self, size: usize, body: &[u8]) -> bool;
    /// A response header.
    fn response_header(&self, name: &str) -> Option<String>;
    /// Sets or removes a response header; false if refused.
    fn set_response_header(&mut self, name: &str, value: Option<&str>) -> bool;
    /// The current response body chunk (or buffer).
    fn response_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Replaces the response body buffer; false if refused.
    fn set_response_body(&mut self, size: usize, body: &[u8]) -> bool;
    /// Envoy's `response.code_details` (why Envoy itself answered).
    fn response_code_details(&self) -> Option<String>;
    /// Answers the client locally; false if refused.
    fn send_local_reply(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> bool;
    /// Makes Envoy pick the route again after a routing header changed.
    fn clear_route_cache(&mut self) -> bool;
}

/// What the worker shares with every call.
pub struct Env<'a> {
    /// The compiled configuration.
    pub config: &'a Config,
    /// Shared data of all workers.
    pub store: &'a dyn SharedStore,
    /// Stats.
    pub metrics: &'a mut dyn Metrics,
    /// Randomness.
    pub rng: &'a mut dyn Random,
    /// Bound on model label values.
    pub models: &'a mut BoundedLabel,
    /// Now, in ms since the epoch.
    pub now_ms: u64,
    /// The host delivers request bodies to a paused stream (false once the
    /// watchdog saw it not do so).
    pub can_hold_body: bool,
}

/// What Envoy should do with the stream after a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on.
    Continue,
    /// Hold (headers: stop iteration; body: buffer) — to read the whole body,
    /// or because the filter answered locally.
    Pause,
}

/// What a parked call says on a timer tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Still waiting: tick again.
    Wait,
    /// Let the request go on (the host resumes it).
    Resume,
    /// The call was answered locally; nothing to resume.
    Answered,
    /// Resume, and stop holding bodies on this worker: the host never
    /// delivered the one this call waited for.
    ResumeWithoutBodies,
}

/// Why a call is held with no callback of its own to come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parked {
    /// Waiting for the request body since this time: if Envoy never delivers
    /// it (the Wasm plugin lacks `allow_on_headers_stop_iteration`), the
    /// watchdog lets the request go untouched.
    Body { since_ms: u64 },
    /// Waiting for an identical call in flight to store its answer, until
    /// this time at the latest (see [`crate::cache::coalesce`]).
    Coalescing { deadline_ms: u64 },
}

/// How long a held request may see no body callback before the watchdog
/// concludes the host will never deliver one.
pub const BODY_WATCHDOG_MS: u64 = 1000;

/// Largest request body or JSON answer copied aside to read `model` or `usage`
/// from a body the filter does not hold.
const MAX_OBSERVED_BODY: usize = 1 << 20;

/// One LLM call in flight.
#[derive(Debug)]
pub struct Call {
    endpoint: Endpoint,
    priority: Priority,
    trace_id: Option<String>,
    started_ms: u64,
    budget_ms: u64,
    /// The body is held until its end to decide on it.
    holding: bool,
    /// Held with nothing but a timer to wake it.
    parked: Option<Parked>,
    /// Copy of a body that streams through, for the model label.
    request_copy: Option<Vec<u8>>,
    model: Option<String>,
    /// The client asked for a stream (`None`: body not read).
    stream_requested: Option<bool>,
    cluster: Option<String>,
    breaker: Option<String>,
    /// The filter answered locally with this status (and why).
    local_reply: Option<u32>,
    status: Option<u16>,
    response_headers_ms: Option<u64>,
    first_byte_ms: Option<u64>,
    attempts: Option<u32>,
    /// Retries the plan let Envoy make (`x-envoy-max-retries` as sent).
    planned_retries: u32,
    envoy_timeout: bool,
    /// Envoy answered because the upstream reset before responding.
    upstream_reset: bool,
    sse: Option<SseScanner>,
    response_copy: Option<Vec<u8>>,
    /// A body to put in place of the response's (Envoy's own timeout page).
    replace_response: Option<Vec<u8>>,
    /// The response cache's part in the call.
    cache: cache::CacheCall,
}

impl Call {
    /// Starts the walk on request headers. `None`: not an LLM call — the
    /// request passes untouched and no other callback needs the walk.
    pub fn start(
        env: &mut Env<'_>,
        host: &mut dyn Host,
        end_of_stream: bool,
    ) -> Option<(Self, Step)> {
        let method = host.request_header(":method").unwrap_or_default();
        let path = host.request_header(":path").unwrap_or_default();
        let endpoint = classify::classify(&method, &path, &env.config.llm_paths)?;
        let cfg = env.config;
        let priority = priority::resolve(
            host.request_header(PRIORITY_HEADER).as_deref(),
            cfg.priority.trust_client,
            cfg.priority.default,
        );
        let budget_ms = if cfg.budget.enabled {
            budget_parse::budget_ms(
                host.request_header("x-request-timeout-ms").as_deref(),
                host.request_header("grpc-timeout").as_deref(),
                priority,
                &cfg.budget,
            )
        } else {
            cfg.budget.default_for(priority)
        };
        let mut call = Self {
            endpoint,
            priority,
            trace_id: None,
            started_ms: env.now_ms,
            budget_ms,
            holding: false,
            parked: None,
            request_copy: None,
            model: None,
            stream_requested: None,
            cluster: None,
            breaker: None,
            local_reply: None,
            status: None,
            response_headers_ms: None,
            first_byte_ms: None,
            attempts: None,
            planned_retries: 0,
            envoy_timeout: false,
            upstream_reset: false,
            sse: None,
            response_copy: None,
            replace_response: None,
            cache: cache::CacheCall::new(env.config.cache.enabled),
        };
        call.tag(env, host);
        if end_of_stream {
            let step = call.decide(env, host, Some(&[]), 0);
            return Some((call, step));
        }
        let length = host
            .request_header("content-length")
            .and_then(|v| v.trim().parse::<usize>().ok());
        // Holding a body past Envoy's buffer limit earns the client a 413, so
        // only a declared, bounded length is held; others stream through.
        if env.can_hold_body
            && call.wants_body(env.config)
            && length.is_some_and(|n| n <= env.config.max_body_bytes)
        {
            call.holding = true;
            call.parked = Some(Parked::Body {
                since_ms: env.now_ms,
            });
            return Some((call, Step::Pause));
        }
        call.request_copy = Some(Vec::new());
        let step = call.decide(env, host, None, 0);
        Some((call, step))
    }

    /// Body-based features are configured.
    fn wants_body(&self, cfg: &Config) -> bool {
        // The budget plan differs for streams, which only the body tells.
        !cfg.routing.models.is_empty() || cfg.budget.enabled || cfg.cache.enabled
    }

    /// Priority, baggage and trace context, written toward the upstream.
    fn tag(&mut self, env: &mut Env<'_>, host: &mut dyn Host) {
        let p = self.priority.as_str();
        set_request(env, host, PRIORITY_HEADER, Some(p));
        // Most calls carry no baggage: one lookup settles it, and only a call
        // that has some pays for reading every value.
        let existing = host
            .request_header("baggage")
            .map(|_| host.request_header_all("baggage").join(","));
        let merged = baggage::merge(existing.as_deref(), "priority", p);
        set_request(env, host, "baggage", Some(&merged));

        let incoming = host.request_header("traceparent");
        match env.config.tracing {
            TracingMode::Always => {
                let out = trace_context::next(incoming.as_deref(), env.rng);
                set_request(env, host, "traceparent", Some(&out.traceparent));
                if !out.continued {
                    set_request(env, host, "tracestate", None);
                }
                self.trace_id = Some(out.trace_id);
            }
            TracingMode::Off => {
                self.trace_id = incoming
                    .as_deref()
                    .and_then(trace_context::TraceParent::parse)
                    .map(|p| p.trace_id_hex());
            }
        }
    }

    /// Request body callback.
    pub fn on_request_body(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Step {
        if matches!(self.parked, Some(Parked::Body { .. })) {
            self.parked = None;
        }
        if self.holding {
            if !end_of_stream {
                return Step::Pause;
            }
            self.holding = false;
            let body = host.request_body(size).unwrap_or_default();
            return self.decide(env, host, Some(&body), size);
        }
        if self.request_copy.is_some() {
            if let Some(chunk) = host.request_body(size) {
                keep(&mut self.request_copy, &chunk);
            }
        }
        Step::Continue
    }

    /// Everything decided before the call goes upstream. `body` is the whole
    /// request body when held (or empty), `None` when it streams through.
    fn decide(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<&[u8]>,
        body_size: usize,
    ) -> Step {
        let features = body.and_then(Features::from_body);
        if let Some(f) = &features {
            self.model = f.model.clone();
            self.stream_requested = Some(f.stream);
        } else if body.is_some() {
            self.stream_requested = Some(false);
        }

        // Cache: answer from an entry, or wait for an identical call in
        // flight, before routing and admission (a cached answer is served
        // even while the backend sheds).
        if let Some(step) = self.cache_request(env, host, body, body_size) {
            return step;
        }
        self.go_upstream(env, host, features.as_ref(), body, body_size)
    }

    /// Routing and admission of a call that goes upstream.
    fn go_upstream(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        features: Option<&Features>,
        body: Option<&[u8]>,
        body_size: usize,
    ) -> Step {
        // Route: pick the model's cluster by measured health.
        if let (Some(f), Some(model), Some(body)) = (features, self.model.clone(), body) {
            self.route(env, host, f, &model, body, body_size);
        }
        if self.cluster.is_none() {
            keep_default_route(env, host);
        }

        // Admit and plan by the caller's budget.
        if env.config.budget.enabled {
            if let Some(reply) = self.admit_and_plan(env, host) {
                return self.reply_locally(env, host, reply);
            }
        }
        Step::Continue
    }

    fn route(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        features: &Features,
        model: &str,
        body: &[u8],
        body_size: usize,
    ) {
        let cfg = &env.config.routing;
        let budget = &env.config.budget;
        let (store, now) = (env.store, env.now_ms);
        // A backend whose budget breaker is not closed would shed or reject
        // the call: another backend of the model takes it when one can.
        let breaker_open = |cluster: &str| {
            budget.enabled
                && breaker::load(store, cluster, budget)
                    .is_ok_and(|s| s.tier(now, budget) != budget::Tier::Pass)
        };
        let Some(decision) = routing::plan_avoiding(
            cfg,
            env.store,
            model,
            features,
            self.priority,
            env.now_ms,
            env.rng,
            &breaker_open,
        ) else {
            return;
        };
        for (cluster, weight) in &decision.effective_weights {
            env.metrics.gauge(
                &names::name(
                    names::ROUTING_WEIGHT,
                    &[("model", &decision.model), ("cluster", cluster)],
                ),
                routing::weight::gauge_value(*weight),
            );
        }
        if decision.fallback {
            env.metrics.counter(
                &names::name(names::ROUTING_FALLBACKS, &[("model", &decision.model)]),
                1,
            );
        }
        if let Some(new_model) = &decision.rewrite_model {
            match routing::rewrite::rewrite_model(body, new_model) {
                Some(new_body) if host.set_request_body(body_size, &new_body) => {
                    set_request(
                        env,
                        host,
                        "content-length",
                        Some(&new_body.len().to_string()),
                    );
                }
                // The body could not be rewritten: the call goes to the
                // model's default route untouched rather than to a backend
                // that would not know the model.
                _ => {
                    internal_error(env, "rewrite_model");
                    return;
                }
            }
        }
        if let Some(authority) = &decision.authority {
            set_request(env, host, ":authority", Some(authority));
        }
        set_route_header(env, host, Some(&decision.cluster));
        if let Ok(r) = health::record_start(env.store, &decision.cluster, env.now_ms) {
            set_in_flight(env, &decision.cluster, &r.health);
        }
        self.cluster = Some(decision.cluster);
    }

    /// Breaker admission, then the Envoy timeout and retry plan. Returns the
    /// local reply when the call must not go upstream.
    fn admit_and_plan(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
    ) -> Option<reply::LocalReply> {
        let cfg = &env.config.budget;
        let name = self
            .cluster
            .clone()
            .unwrap_or_else(|| DEFAULT_BREAKER.to_string());
        let state = match breaker::load(env.store, &name, cfg) {
            Ok(s) => s,
            Err(_) => {
                internal_error(env, "breaker_load");
                budget::BreakerState::new(cfg)
            }
        };
        let admit = breaker::admit(&state, self.priority, env.now_ms, env.rng.next_f64(), cfg);
        if admit != budget::Admit::Pass {
            budget::count_admit(env.metrics, &admit, self.priority);
            let retry_after = breaker::retry_after_s(&admit, cfg, env.rng.next_f64());
            return reply::for_admit(&admit, retry_after);
        }
        let streaming = self.stream_requested.unwrap_or(true);
        let observed_ms = self.cluster.as_deref().and_then(|c| {
            let h = health::read(env.store, c)?;
            let e = if streaming { h.ttft } else { h.latency }?;
            e.value.is_finite().then_some(e.value as u64)
        });
        let input = budget_plan::PlanInput {
            remaining_ms: budget_parse::remaining_ms(self.budget_ms, self.started_ms, env.now_ms),
            observed_ms,
            streaming,
            retries_allowed: state.retries_allowed(env.now_ms, cfg),
        };
        match budget_plan::plan(&input, cfg) {
            Ok(plan) => {
                self.planned_retries = plan.retries(cfg);
                for (header, value) in plan.header_updates(cfg) {
                    set_request(env, host, header, value.as_deref());
                }
                if host.request_header(budget_plan::IDEMPOTENCY_KEY).is_none() {
                    let key = budget_plan::idempotency_key(env.rng);
                    set_request(env, host, budget_plan::IDEMPOTENCY_KEY, Some(&key));
                }
                budget::count_plan(env.metrics, &name, &plan);
                self.breaker = Some(name);
                None
            }
            Err(budget_plan::Exhausted) => {
                budget::count_exhausted(env.metrics, self.priority);
                Some(reply::local_reply(reply::ReplyKind::BudgetExhausted, None))
            }
        }
    }

    fn reply_locally(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        r: reply::LocalReply,
    ) -> Step {
        let mut headers: Vec<(&str, &str)> =
            r.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if let Some(t) = &self.trace_id {
            headers.push((TRACE_ID_HEADER, t));
        }
        if let Some(x_cache) = self.cache.header() {
            headers.push((crate::cache::X_CACHE, x_cache));
        }
        if host.send_local_reply(r.status, &headers, &r.body) {
            self.local_reply = Some(r.status);
            Step::Pause
        } else {
            internal_error(env, "local_reply");
            Step::Continue
        }
    }

    /// True while the call waits for a timer rather than for Envoy: the host
    /// must call [`Call::on_tick`] until it says otherwise.
    pub fn is_parked(&self) -> bool {
        self.parked.is_some()
    }

    /// A timer tick for a parked call.
    pub fn on_tick(&mut self, env: &mut Env<'_>, host: &mut dyn Host) -> Wake {
        match self.parked {
            None => Wake::Resume,
            Some(Parked::Body { since_ms }) => {
                if env.now_ms.saturating_sub(since_ms) < BODY_WATCHDOG_MS {
                    return Wake::Wait;
                }
                // Fail open: the request goes on as if the filter only tagged it.
                self.parked = None;
                self.holding = false;
                self.request_copy = Some(Vec::new());
                internal_error(env, "body_not_delivered");
                Wake::ResumeWithoutBodies
            }
            Some(Parked::Coalescing { deadline_ms }) => self.cache_on_tick(env, host, deadline_ms),
        }
    }

    /// Response headers callback.
    pub fn on_response_headers(&mut self, env: &mut Env<'_>, host: &mut dyn Host) -> Step {
        if self.local_reply.is_some() {
            return Step::Continue;
        }
        self.response_headers_ms = Some(env.now_ms);
        self.status = host.response_header(":status").and_then(|s| s.parse().ok());
        self.attempts = host
            .response_header("x-envoy-attempt-count")
            .and_then(|s| s.trim().parse().ok());
        let event_stream = host
            .response_header("content-type")
            .is_some_and(|c| c.contains(crate::cache::entry::SSE_CONTENT_TYPE));
        if event_stream {
            self.sse = Some(SseScanner::new());
        } else {
            self.response_copy = Some(Vec::new());
        }
        // Envoy's own replies that the walk reads the reason of are all 5xx.
        if let Some(status) = self.status.filter(|s| *s >= 500) {
            let details = host.response_code_details();
            // Envoy's own 503 for a reset upstream: the call got no answer.
            self.upstream_reset = details
                .as_deref()
                .is_some_and(|d| d.starts_with(UPSTREAM_RESET_DETAILS));
            if reply::is_envoy_timeout(u32::from(status), details.as_deref()) {
                self.envoy_timeout = true;
                let r = reply::local_reply(reply::ReplyKind::UpstreamTimeout, None);
                for (name, value) in &r.headers {
                    set_response(env, host, name, Some(value));
                }
                set_response(env, host, "content-length", None);
                self.replace_response = Some(r.body);
            }
        }
        if let Some(t) = self.trace_id.clone() {
            set_response(env, host, TRACE_ID_HEADER, Some(&t));
        }
        if let Some(c) = self.cluster.clone() {
            set_response(env, host, CLUSTER_RESPONSE_HEADER, Some(&c));
        }
        self.cache_on_response_headers(env, host);
        Step::Continue
    }

    /// Response body callback.
    pub fn on_response_body(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Step {
        if self.local_reply.is_some() {
            return Step::Continue;
        }
        if size > 0 && self.first_byte_ms.is_none() {
            self.first_byte_ms = Some(env.now_ms);
        }
        if let Some(new_body) = self.replace_response.as_ref() {
            if !end_of_stream {
                return Step::Pause;
            }
            if !host.set_response_body(size, new_body) {
                internal_error(env, "set_response_body");
            }
            return Step::Continue;
        }
        let chunk = if size == 0 {
            None
        } else {
            host.response_body(size)
        };
        if let Some(chunk) = &chunk {
            if let Some(sse) = self.sse.as_mut() {
                sse.feed(chunk);
            } else {
                keep(&mut self.response_copy, chunk);
            }
        }
        self.cache_on_response_body(env, size, chunk.as_deref(), end_of_stream);
        Step::Continue
    }

    /// End of the stream: metrics and what the call teaches the shared state.
    pub fn on_log(self, env: &mut Env<'_>) {
        self.cache_on_log(env);
        let model = self
            .model
            .clone()
            .or_else(|| self.request_copy.as_deref().and_then(classify::model));
        let usage: Option<Usage> = match (&self.sse, &self.response_copy) {
            (Some(sse), _) => sse.usage,
            (None, Some(copy)) => usage::from_json(copy),
            _ => None,
        };
        let status = self
            .local_reply
            .and_then(|s| u16::try_from(s).ok())
            .or(self.status.filter(|_| !self.upstream_reset));
        let model_label = env.models.value(model.as_deref()).to_string();
        CallRecord {
            priority: self.priority,
            model: &model_label,
            status,
            started_ms: self.started_ms,
            first_byte_ms: self.first_byte_ms,
            ended_ms: env.now_ms,
            usage,
            refused: self.local_reply.is_some_and(|s| s >= 400),
        }
        .emit(env.metrics);
        if self.local_reply.is_some() {
            // Routed, then answered here (breaker, budget): it never left.
            if let Some(cluster) = &self.cluster {
                if let Ok(r) = health::record_unsent(env.store, cluster, env.now_ms) {
                    set_in_flight(env, cluster, &r.health);
                }
            }
            return;
        }
        let elapsed = env.now_ms.saturating_sub(self.started_ms);
        if let Some(cluster) = &self.cluster {
            let result = match self.status {
                _ if self.envoy_timeout => CallResult::Timeout,
                _ if self.upstream_reset => CallResult::Reset,
                Some(s) => CallResult::Status(s),
                // Envoy answers every upstream failure itself (503 on a reset,
                // 504 on a timeout), so no status at all means the client left.
                None => CallResult::Cancelled,
            };
            let outcome = routing::Outcome {
                result,
                latency_ms: elapsed,
                ttft_ms: self
                    .first_byte_ms
                    .map(|t| t.saturating_sub(self.started_ms)),
            };
            env.metrics.counter(
                &names::name(
                    names::ROUTING_CALLS,
                    &[("cluster", cluster), ("outcome", result.label())],
                ),
                1,
            );
            env.metrics.histogram(
                &names::name(names::ROUTING_LATENCY, &[("cluster", cluster)]),
                elapsed,
            );
            match health::record_outcome(
                env.store,
                &env.config.routing,
                cluster,
                &outcome,
                env.now_ms,
            ) {
                Ok(r) => {
                    if r.ejected {
                        env.metrics.counter(
                            &names::name(names::ROUTING_EJECTIONS, &[("cluster", cluster)]),
                            1,
                        );
                    }
                    set_in_flight(env, cluster, &r.health);
                }
                Err(_) => internal_error(env, "routing_record"),
            }
        }
        // Envoy answers every upstream failure itself (503, 504), so a call
        // without any response status is one the client gave up on: it says
        // nothing about the backend's pressure.
        let client_left = self.status.is_none();
        if let Some(name) = self.breaker.as_ref().filter(|_| !client_left) {
            let cfg = &env.config.budget;
            // A stream's budget is spent waiting for its headers (see
            // `budget.streaming`); the stream itself may run long.
            let until = match (self.sse.is_some(), cfg.streaming) {
                (true, budget::StreamingMode::UntilHeaders) => self.response_headers_ms,
                _ => None,
            };
            let used = until.unwrap_or(env.now_ms).saturating_sub(self.started_ms);
            let failed = self.envoy_timeout || breaker::is_failure(self.status.map(u32::from));
            let retries = breaker::retries_made(self.attempts, self.planned_retries, failed);
            let sample = budget::Sample::new(used, self.budget_ms, failed, retries);
            budget::observe_used(
                env.metrics,
                self.priority,
                breaker::used_permille(used, self.budget_ms),
            );
            match breaker::record(env.store, name, env.now_ms, sample, cfg) {
                Ok(state) => budget::set_breaker_gauges(
                    env.metrics,
                    name,
                    state.tier(env.now_ms, cfg),
                    state.pressure(env.now_ms, cfg),
                ),
                Err(_) => internal_error(env, "breaker_record"),
            }
        }
    }

    /// The call's priority.
    pub fn priority(&self) -> Priority {
        self.priority
    }
}

/// Appends `chunk` to the copy up to [`MAX_OBSERVED_BODY`]; past it the copy is
/// useless (a cut JSON document) and is dropped.
fn keep(copy: &mut Option<Vec<u8>>, chunk: &[u8]) {
    let Some(buf) = copy.as_mut() else {
        return;
    };
    if buf.len().saturating_add(chunk.len()) > MAX_OBSERVED_BODY {
        *copy = None;
        return;
    }
    buf.extend_from_slice(chunk);
}

/// An LLM call that routing does not place goes to the route's default: a
/// cluster header sent by the client must not pick a cluster instead.
fn keep_default_route(env: &mut Env<'_>, host: &mut dyn Host) {
    let cfg = &env.config.routing;
    if cfg.models.is_empty() || host.request_header(&cfg.cluster_header).is_none() {
        return;
    }
    set_route_header(env, host, None);
}

/// Sets (or removes) the routing header and has Envoy pick the route again:
/// header edits alone no longer refresh the route cache.
fn set_route_header(env: &mut Env<'_>, host: &mut dyn Host, cluster: Option<&str>) {
    let header = env.config.routing.cluster_header.clone();
    set_request(env, host, &header, cluster);
    if !host.clear_route_cache() {
        internal_error(env, "clear_route_cache");
    }
}

/// Calls in flight to `cluster` across workers, as the record just written says.
fn set_in_flight(env: &mut Env<'_>, cluster: &str, h: &routing::Health) {
    env.metrics.gauge(
        &names::name(names::ROUTING_IN_FLIGHT, &[("cluster", cluster)]),
        i64::from(h.in_flight),
    );
}

fn internal_error(env: &mut Env<'_>, reason: &str) {
    env.metrics.counter(
        &names::name(names::INTERNAL_ERRORS, &[("reason", reason)]),
        1,
    );
}

fn set_request(env: &mut Env<'_>, host: &mut dyn Host, name: &str, value: Option<&str>) {
    if !host.set_request_header(name, value) {
        internal_error(env, "set_header");
    }
}

fn set_response(env: &mut Env<'_>, host: &mut dyn Host, name: &str, value: Option<&str>) {
    if !host.set_response_header(name, value) {
        internal_error(env, "set_header");
    }
}
