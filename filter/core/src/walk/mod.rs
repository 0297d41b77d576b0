//! The request walk (docs/design.md) for one HTTP stream: classify, tag, admit,
//! route, observe, learn. It drives the policy modules against a small
//! [`Host`] trait, so the whole walk runs natively against a fake host in tests
//! and the plugin only adapts Envoy's callbacks to it.
//!
//! A call's state has one shape, and its phases one diagram (`state`). The
//! steps before the trip upstream — the A/B group (`group`), shaping
//! (`shape`), degrade (`degrade`), the cache (`cache`, `semantic`) — share one
//! protocol, [`Flow`]: each says go on with the body, or the call is settled
//! here. Then the trip upstream (`upstream`: routing, then admission, and the
//! one write of the edited body), and what comes back (`response`, `failover`,
//! `hedge`). Each policy decides in its own module; at the end one
//! [`CallSummary`] is handed to each of them to learn from.

use std::ops::ControlFlow;

use crate::baggage;
use crate::budget::parse as budget_parse;
use crate::config::service::{Callout, Service};
use crate::config::{Config, TracingMode};
use crate::dialect::request::View;
use crate::dialect::{self, Dialect};
use crate::host::{Metrics, Random, SharedStore};
use crate::metrics::{internal_error, BoundedLabel};
use crate::priority::{self, Priority};
use crate::spans;
use crate::trace_context;

#[cfg_attr(not(feature = "guardrails"), path = "answer_off.rs")]
mod answer;
mod body;
// A step whose feature the build leaves out is its `*_off.rs` twin: the
// same interface, doing nothing (filter/core/Cargo.toml).
#[cfg_attr(not(feature = "cache"), path = "cache_off.rs")]
mod cache;
#[cfg_attr(not(feature = "credentials"), path = "credentials_off.rs")]
mod credentials;
mod degrade;
mod end;
mod estimate;
#[cfg_attr(not(feature = "routing"), path = "failover_off.rs")]
mod failover;
#[cfg(test)]
pub(crate) mod fake;
#[cfg_attr(not(feature = "routing"), path = "fallback_off.rs")]
mod fallback;
#[cfg_attr(not(feature = "ab"), path = "group_off.rs")]
mod group;
#[cfg_attr(not(feature = "guardrails"), path = "guard_off.rs")]
mod guard;
#[cfg_attr(not(feature = "guardrails"), path = "guard_service_off.rs")]
mod guard_service;
#[cfg_attr(not(feature = "routing"), path = "hedge_off.rs")]
mod hedge;
mod identify;
#[cfg_attr(not(feature = "limits"), path = "limits_off.rs")]
mod limits;
mod proxy;
mod reply;
mod response;
#[cfg_attr(not(feature = "routing"), path = "route_off.rs")]
mod route;
#[cfg_attr(not(feature = "cache"), path = "semantic_off.rs")]
mod semantic;
mod shape;
#[cfg_attr(not(feature = "spans"), path = "span_off.rs")]
mod span;
mod state;
#[cfg(test)]
mod tests;
mod upstream;

use body::{BodyCopy, HeldBody};
pub use proxy::{CallWait, CalloutAnswer, Host};
use state::{CacheCall, Decided, Dispatch, Phase, Progress, Request, Response, Timer};

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
    /// Bound on the values of the `model` label.
    pub model_labels: &'a mut BoundedLabel,
    /// Bound on the values of the `tenant` label.
    pub tenant_labels: &'a mut BoundedLabel,
    /// This worker's spans waiting for export.
    pub spans: &'a mut spans::Queue,
    /// This worker's ended calls not yet in the load records (see
    /// [`crate::load::Pending`]); the host flushes them on its timer.
    pub load: &'a mut crate::load::Pending,
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

/// What a step before the trip upstream says: `Continue(body)`, the call
/// goes on to the next step with its request body (`None`: the body streams
/// through); `Break(step)`, the step settled the call here — answered it, or
/// parked it to wait — and Envoy does `step` with the stream.
type Flow = ControlFlow<Step, Option<HeldBody>>;

/// What a parked call says on a timer tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Still waiting: tick again.
    Wait,
    /// Let the request go on (the host resumes it).
    Resume,
    /// The call was answered locally; nothing to resume.
    Answered,
    /// Stop ticking; nothing to resume (the request went on long ago).
    Idle,
}

/// How long a held request may see no body callback before the watchdog
/// concludes the host will never deliver one.
pub const BODY_WATCHDOG_MS: u64 = 1000;

/// One LLM call in flight.
#[derive(Debug)]
pub struct Call {
    /// What the request said.
    request: Request,
    /// What the filter decided and tells the client.
    decided: Decided,
    /// Where the call (and its hedge) stands.
    progress: Progress,
    /// What was decided for the trip upstream.
    dispatch: Dispatch,
    /// What came back; `None` until response headers.
    response: Option<Response>,
    /// The response cache's part in the call.
    cache: CacheCall,
}

impl Call {
    /// Whether the request whose headers `host` holds concerns the filter
    /// at all: an LLM call, one of the filter's own endpoints, or a request
    /// that carries a header only the filter may set (the route header,
    /// the shard header), stripped by [`Call::start`]. Any other passes
    /// before the clock or the worker's state is read: in a mesh most
    /// requests are no LLM call.
    pub fn concerns(config: &Config, host: &dyn Host) -> bool {
        let path = host.request_header(":path").unwrap_or_default();
        let method = host.request_header(":method").unwrap_or_default();
        dialect::classify(&method, &path, &config.llm_paths).is_some()
            || (crate::build::ADMIN && config.admin.own_rest(&path).is_some())
            || host
                .request_header(&config.routing.cluster_header)
                .is_some()
            || host.request_header(&config.cache.shard_header).is_some()
    }

    /// Starts the walk on request headers. `None`: not an LLM call — the
    /// request passes untouched (but for a routing header the client sent,
    /// removed from every request) and no other callback needs the walk.
    pub fn start(
        env: &mut Env<'_>,
        host: &mut dyn Host,
        end_of_stream: bool,
    ) -> Option<(Self, Step)> {
        upstream::drop_client_route_header(env, host);
        let shard_key = cache::take_shard_header(env, host);
        let method = host.request_header(":method").unwrap_or_default();
        let path = host.request_header(":path").unwrap_or_default();
        let dialect = dialect::classify(&method, &path, &env.config.llm_paths)?;
        // Read once: it may set the priority, and the priority joins it.
        let baggage = request_baggage(host);
        let mut call = Self {
            request: Request::read(env, host, dialect, path, baggage.as_deref()),
            decided: Decided::default(),
            progress: Progress::new(),
            dispatch: Dispatch::default(),
            response: None,
            cache: CacheCall::new(env.config.cache.keeps_entries(), shard_key),
        };
        call.tag(env, host, baggage.as_deref());
        // Before anything is spent: a refused caller costs no count, no
        // cache read and no trip upstream.
        if let Some(step) = call.identify(env, host) {
            return Some((call, step));
        }
        call.name_tenant(env, host);
        if end_of_stream {
            let step = call.decide(env, host, Some(HeldBody::parse(dialect, Vec::new(), 0)));
            return Some((call, step));
        }
        if call.can_hold_body(env, host) {
            call.progress.hold(env.now_ms);
            return Some((call, Step::Pause));
        }
        call.request.streams_through();
        let step = call.decide(env, host, None);
        Some((call, step))
    }

    /// Body-based features are configured and the body may be held: holding
    /// a body past Envoy's buffer limit earns the client a 413, so only a
    /// declared, bounded length is held; others stream through.
    fn can_hold_body(&self, env: &Env<'_>, host: &dyn Host) -> bool {
        let cfg = env.config;
        // The budget plan differs for streams, which only the body tells.
        // A/B reads the body's `user` only when the user header is absent.
        let ab_wants_body = cfg.ab.needs_body()
            || (!cfg.ab.groups.is_empty() && host.request_header(&cfg.ab.user_header).is_none());
        let wants_body = !cfg.routing.models.is_empty()
            || cfg.budget.enabled
            || cfg.cache.enabled
            || cfg.shaping.enabled()
            || cfg.limits.enabled()
            || cfg.capture.prompt
            || cfg.guardrails.enabled()
            || ab_wants_body
            // Alerts can arrive, or the load can cross a threshold.
            || cfg.admin.token.is_some()
            || !cfg.degrade.thresholds.is_empty();
        let length = host
            .request_header("content-length")
            .and_then(|v| v.trim().parse::<usize>().ok());
        env.can_hold_body && wants_body && length.is_some_and(|n| n <= cfg.max_body_bytes)
    }

    /// Priority, baggage and trace context, written toward the upstream.
    fn tag(&mut self, env: &mut Env<'_>, host: &mut dyn Host, baggage: Option<&str>) {
        let p = self.request.priority.as_str();
        set_request(env, host, priority::HEADER, Some(p));
        set_baggage(env, host, baggage, priority::BAGGAGE_KEY, p);

        let parsed = host
            .request_header(trace_context::TRACEPARENT)
            .as_deref()
            .and_then(trace_context::TraceParent::parse);
        self.decided.trace_id = match (env.config.tracing, parsed) {
            // A hop that exports no span is no participant in the trace: a
            // valid `traceparent` goes on with the caller's ids and flags,
            // so the next hop's span hangs under the caller's, not under an
            // id no tracing backend holds (written back as version 00, one
            // header). The record names the span the upstream was given.
            (TracingMode::Always, Some(p)) if env.config.otlp.is_none() => {
                set_request(env, host, trace_context::TRACEPARENT, Some(&p.header()));
                self.decided.span = Some(p.as_sent());
                Some(p.trace_id_hex())
            }
            (TracingMode::Always, _) => {
                // Parent-based: a continued trace keeps its caller's flags;
                // a new one is sampled at the ratio of the spans exported.
                let sample_root =
                    env.config.otlp.as_ref().is_none_or(|o| {
                        o.sample_ratio >= 1.0 || env.rng.next_f64() < o.sample_ratio
                    });
                let out = trace_context::next(parsed, env.rng, sample_root);
                self.decided.span = Some(out.span);
                set_request(
                    env,
                    host,
                    trace_context::TRACEPARENT,
                    Some(&out.traceparent),
                );
                if !out.continued {
                    set_request(env, host, trace_context::TRACESTATE, None);
                }
                Some(out.trace_id)
            }
            (TracingMode::Off, _) => parsed.map(|p| p.trace_id_hex()),
        };
    }

    /// Request body callback.
    pub fn on_request_body(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Step {
        if self.progress.body_seen() {
            if !end_of_stream {
                return Step::Pause;
            }
            let body = host.request_body(size).unwrap_or_default();
            let dialect = self.request.dialect;
            return self.decide(env, host, Some(HeldBody::parse(dialect, body, size)));
        }
        // A copy past its bound is gone: the rest of the body is not fetched.
        if let Some(copy) = self.request.copy.as_mut().filter(|c| c.is_open()) {
            // An empty end of stream has nothing to copy: no host call.
            if let Some(chunk) = (size > 0).then(|| host.request_body(size)).flatten() {
                copy.append(&chunk);
            }
        }
        Step::Continue
    }

    /// Everything decided before the call goes upstream. `body` is the whole
    /// request body when held (or empty), `None` when it streams through.
    fn decide(&mut self, env: &mut Env<'_>, host: &mut dyn Host, body: Option<HeldBody>) -> Step {
        self.progress.forward();
        if let Some(b) = &body {
            self.request.read_body(b);
        }
        // Before anything reads the prompt: capture, affinity, the cache.
        let body = match self.guard(env, host, body) {
            ControlFlow::Continue(body) => body,
            ControlFlow::Break(step) => return step,
        };
        match self.ask_verdict(env, host, body) {
            ControlFlow::Continue(body) => self.guarded(env, host, body),
            ControlFlow::Break(step) => step,
        }
    }

    /// Sends `callout` to `service`, waiting for the answer no longer than
    /// its timeout nor what is left of the caller's budget; false when the
    /// host would not send it.
    fn ask_service(
        &self,
        env: &Env<'_>,
        host: &mut dyn Host,
        service: &Service,
        (headers, body): &Callout,
        then: CallWait,
    ) -> bool {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let remaining_ms = self.request.remaining_ms(env.now_ms);
        let timeout_ms = service.timeout_ms.min(remaining_ms).max(1);
        host.dispatch_call(&service.cluster, &headers, body, timeout_ms, then)
    }

    /// The rest of the walk once the prompt passed the guardrails.
    fn guarded(&mut self, env: &mut Env<'_>, host: &mut dyn Host, body: Option<HeldBody>) -> Step {
        if let Some(b) = &body {
            self.capture_prompt(env, b);
            // Before shaping, which may drop the turns the key covers.
            self.request.affinity = self.affinity_key(env, host, b);
        }
        let flow = self.before_upstream(env, host, body);
        self.then_upstream(env, host, flow)
    }

    /// The steps before the trip upstream, in order.
    fn before_upstream(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        // The group picks the overrides of every step below.
        let body = self.join_group(env, host, body)?;
        // Shaped before the cache step, so the key is over what is sent.
        let body = self.shape(env, body)?;
        // Degraded by the model's level, before the cache step too.
        let body = self.degrade(env, host, body)?;
        // Limits: reserved (or refused, or sent cheaper) before the cache
        // keys the body a rule's degrade may edit.
        let body = self.limit(env, host, body)?;
        // Cache: answer from an entry, or wait for an identical call in
        // flight, before routing and admission (a cached answer is served
        // even while the backend sheds).
        self.cache_request(env, host, body)
    }

    /// The call goes upstream unless a step settled it.
    fn then_upstream(&mut self, env: &mut Env<'_>, host: &mut dyn Host, flow: Flow) -> Step {
        match flow {
            ControlFlow::Break(step) => step,
            ControlFlow::Continue(body) => self.go_upstream(env, host, body),
        }
    }

    /// True while the call waits for a timer rather than for Envoy: the host
    /// must call [`Call::on_tick`] until it says otherwise.
    pub fn is_parked(&self) -> bool {
        self.progress.is_parked()
    }

    /// True while the request is held for a callout of its own (the
    /// embedding, the guardrail service's verdict): when the callout
    /// answers with `Step::Continue`, the host resumes the request rather
    /// than the response.
    pub fn holds_request(&self) -> bool {
        matches!(
            self.progress.phase(),
            Phase::Embedding { .. } | Phase::Guarding { .. }
        )
    }

    /// True while the request's body is held for the walk to read whole:
    /// nothing but the walk edits the request headers meanwhile.
    pub fn holds_body(&self) -> bool {
        matches!(self.progress.phase(), Phase::Holding { .. })
    }

    /// A timer tick for a parked call, which goes on by what it waits for.
    pub fn on_tick(&mut self, env: &mut Env<'_>, host: &mut dyn Host) -> Wake {
        match self.progress.timer() {
            Some(Timer::BodyWatchdog { since_ms }) => {
                if env.now_ms.saturating_sub(since_ms) < BODY_WATCHDOG_MS {
                    return Wake::Wait;
                }
                // Fail open: the call goes on without its body, as the
                // worker's calls will from now on (budget, header routing).
                self.request.streams_through();
                self.request.body_not_delivered = true;
                internal_error(env.metrics, "body_not_delivered");
                match self.decide(env, host, None) {
                    Step::Continue => Wake::Resume,
                    Step::Pause if self.is_parked() => Wake::Wait,
                    Step::Pause => Wake::Answered,
                }
            }
            Some(Timer::Coalescing { deadline_ms }) => self.cache_on_tick(env, host, deadline_ms),
            // No hedge's answer may outrun a verdict awaited.
            Some(Timer::Hedge { .. }) if self.progress.awaits_verdict() => Wake::Wait,
            Some(Timer::Hedge { at_ms }) => self.hedge_on_tick(env, host, at_ms),
            None => Wake::Resume,
        }
    }

    /// The host never delivered the body this call waited for: the worker
    /// should hold no more bodies (Envoy without
    /// `allow_on_headers_stop_iteration`).
    pub fn body_not_delivered(&self) -> bool {
        self.request.body_not_delivered
    }

    /// The call's priority.
    pub fn priority(&self) -> Priority {
        self.request.priority
    }

    /// The model the call asks for: degrade's fallback, else the requested one.
    fn model(&self) -> Option<&str> {
        self.decided
            .fallback_model
            .as_deref()
            .or(self.request.view.model.as_deref())
    }

    /// The `:path` the call goes on: as received, or with the model a step
    /// switched it to, for a dialect naming the model there.
    fn path(&self) -> &str {
        self.decided.path.as_deref().unwrap_or(&self.request.path)
    }

    /// The call goes on `path` (a model switched in it): written once, and
    /// Envoy picks the route again, as for routing's own path edits.
    fn switch_path(&mut self, env: &mut Env<'_>, host: &mut dyn Host, path: String) {
        set_request(env, host, ":path", Some(&path));
        if !host.clear_route_cache() {
            internal_error(env.metrics, "clear_route_cache");
        }
        self.decided.path = Some(path);
    }
}

impl Request {
    /// What the request headers say (`baggage`: all of the request's, as
    /// read): priority and the caller's budget.
    fn read(
        env: &Env<'_>,
        host: &dyn Host,
        dialect: Dialect,
        path: String,
        baggage: Option<&str>,
    ) -> Self {
        let cfg = env.config;
        let priority = priority::resolve(
            host.request_header(priority::HEADER).as_deref(),
            baggage.and_then(|b| baggage::member(b, priority::BAGGAGE_KEY)),
            cfg.priority.trust_client,
            cfg.priority.default,
        );
        let budget_ms = if cfg.budget.enabled {
            budget_parse::budget_ms(
                host.request_header(budget_parse::REQUEST_TIMEOUT_MS)
                    .as_deref(),
                host.request_header(budget_parse::GRPC_TIMEOUT).as_deref(),
                priority,
                &cfg.budget,
            )
        } else {
            cfg.budget.default_for(priority)
        };
        Self {
            dialect,
            priority,
            started_ms: env.now_ms,
            budget_ms,
            // A dialect that names the model in the path names it before
            // any body is read (or when none is).
            view: View {
                model: dialect.request().model_in_path(&path).map(str::to_string),
                ..View::default()
            },
            path,
            copy: None,
            affinity: None,
            body_not_delivered: false,
            prompt: None,
            tenant: None,
        }
    }

    /// What is left of the caller's budget now, ms.
    fn remaining_ms(&self, now_ms: u64) -> u64 {
        budget_parse::remaining_ms(self.budget_ms, self.started_ms, now_ms)
    }
}

fn set_request(env: &mut Env<'_>, host: &mut dyn Host, name: &str, value: Option<&str>) {
    if !host.set_request_header(name, value) {
        internal_error(env.metrics, "set_header");
    }
}

/// Every `baggage` header of the request, joined in order. Most calls carry
/// no baggage: one lookup settles it, and only a call that has some pays for
/// reading every value.
fn request_baggage(host: &dyn Host) -> Option<String> {
    host.request_header(baggage::HEADER)
        .map(|_| host.request_header_all(baggage::HEADER).join(","))
}

/// Merges the member `key=value` into the request's `baggage`, keeping the
/// other members.
fn merge_baggage(env: &mut Env<'_>, host: &mut dyn Host, key: &str, value: &str) {
    let existing = request_baggage(host);
    set_baggage(env, host, existing.as_deref(), key, value);
}

/// Writes `existing` (the request's baggage as read) with `key=value` merged in.
fn set_baggage(
    env: &mut Env<'_>,
    host: &mut dyn Host,
    existing: Option<&str>,
    key: &str,
    value: &str,
) {
    let merged = baggage::merge(existing, key, value);
    set_request(env, host, baggage::HEADER, Some(&merged));
}

fn set_response(env: &mut Env<'_>, host: &mut dyn Host, name: &str, value: Option<&str>) {
    if !host.set_response_header(name, value) {
        internal_error(env.metrics, "set_header");
    }
}
