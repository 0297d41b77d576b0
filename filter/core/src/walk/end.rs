//! The end of a call: one summary of what it was and how it ended, handed to
//! each policy to learn from (the request metrics, routing, the budget
//! breaker, the load signals).

use crate::cache::CacheStatus;
use crate::config::Config;
use crate::metrics::internal_error;
use crate::routing::hedge::HedgeResult;
use crate::summary::{CallSummary, End, Try};
use crate::{budget, dialect, load, observe, pricing, routing, spans};

use super::state::{Phase, Response};
use super::{Call, Env, Host};

/// A feature that only listens at the end of a call: it hears the call's
/// summary, nothing else (a new one is a variant and a line of [`AT_END`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AtEnd {
    /// The request metrics.
    Metrics,
    /// The call's span.
    Span,
    /// Routing, the budget breaker and the clusters' load learn the try.
    Learn,
    /// The prompt-token estimate's calibration.
    Calibration,
    /// The memory of stored Responses answers.
    ResponseMemory,
    /// The limits' reservations settle.
    Limits,
    /// What the provider's prompt cache saved, at the model's prices.
    PromptCache,
    /// The model's in-flight count.
    Load,
}

/// The listeners at a call's end, in the order they hear it.
const AT_END: [AtEnd; 8] = [
    AtEnd::Metrics,
    AtEnd::Span,
    AtEnd::Learn,
    AtEnd::Calibration,
    AtEnd::ResponseMemory,
    AtEnd::Limits,
    AtEnd::PromptCache,
    AtEnd::Load,
];

impl Call {
    /// End of the stream: one summary of the call, learnt from by each policy.
    pub fn on_log(mut self, env: &mut Env<'_>) {
        for _ in 0..self.progress.strays() {
            internal_error(env.metrics, "phase");
        }
        self.cache_on_log(env);
        self.settle_hedge(env);
        self.drop_verdict(env);
        let model = self.model_label(env);
        let summary = self.summary_in_group(env.config, self.served(), &model, env.now_ms);
        for listener in AT_END {
            self.hear_end(env, listener, &summary);
        }
    }

    /// One listener hears how the call ended (`call`, classified once).
    fn hear_end(&self, env: &mut Env<'_>, listener: AtEnd, call: &CallSummary<'_>) {
        match listener {
            AtEnd::Metrics => observe::record(env.metrics, call),
            AtEnd::Span => self.queue_span(env, call),
            AtEnd::Learn => self.learn_from(env, call.model, &call.served),
            AtEnd::Calibration => self.calibrate(env, call),
            AtEnd::ResponseMemory => self.remember_response(env, call),
            AtEnd::Limits => self.settle_limits(env, call),
            AtEnd::PromptCache => pricing::count_cache_effect(
                env.metrics,
                &env.config.limits.prices,
                self.priced_model(),
                call.model,
                call.served.usage.as_ref(),
            ),
            AtEnd::Load => {
                // It leaves the in-flight count of the record it joined; a
                // call that joined none is counted on the worker's next tick.
                let started = self.dispatch.load_model.as_deref();
                if !env.load.keep(call, started) {
                    load::ended(env.store, env.metrics, &env.config.names, call, started);
                }
            }
        }
    }

    /// The call's summary now, served as `served` says, with its A/B group:
    /// what the metrics, the span and the record say of it.
    fn summary_in_group<'a>(
        &'a self,
        config: &'a Config,
        served: Served<'a>,
        model: &'a str,
        now_ms: u64,
    ) -> CallSummary<'a> {
        CallSummary {
            group: self.group(config).map(|g| g.name.as_str()),
            ..self.summary_of(served, model, now_ms)
        }
    }

    /// What serves the call as it stands: its response and its cluster.
    pub(super) fn served(&self) -> Served<'_> {
        Served {
            response: self.response.as_ref(),
            cluster: self.dispatch.cluster.as_deref(),
            cache: self.cache.status,
        }
    }

    /// The model label of the call (bounded, as its metrics spell it).
    pub(super) fn model_label(&self, env: &mut Env<'_>) -> String {
        let model = self.model().map(str::to_string).or_else(|| {
            let copy = self.request.copy.as_ref()?;
            dialect::model(copy.bytes()?)
        });
        env.model_labels.value(model.as_deref()).to_string()
    }

    /// The call's access-log record, put in Envoy's filter state when
    /// `access_log.enabled`, before Envoy logs the stream: at the answer's
    /// end, or as the filter answers itself (`end`: how, since the phase does
    /// not say so yet).
    pub(super) fn write_record(&self, env: &mut Env<'_>, host: &mut dyn Host, end: Option<End>) {
        self.write_record_of(env, host, end, self.served());
    }

    /// The record of the call as `served` serves it (another backend's
    /// answer about to go out, say).
    pub(super) fn write_record_of(
        &self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        end: Option<End>,
        served: Served<'_>,
    ) {
        if !env.config.access_log {
            return;
        }
        let model = self.model_label(env);
        let mut call = self.summary_in_group(env.config, served, &model, env.now_ms);
        if let Some(end) = end {
            call.served.end = end;
        }
        let finish = served.finish_reasons();
        let details = self.details(env.config, &finish, served);
        let record = spans::record::record(self.decided.span.as_ref(), &call, &details);
        if !host.set_property(spans::record::PROPERTY, &record) {
            internal_error(env.metrics, "set_property");
        }
    }

    /// What the walk knew of the call beyond its summary, served as
    /// `served` says, for its span and its record.
    pub(super) fn details<'a>(
        &'a self,
        config: &'a Config,
        finish_reasons: &'a [&'a str],
        served: Served<'a>,
    ) -> spans::Details<'a> {
        let dialect = self.request.dialect;
        let response = served.response;
        spans::Details {
            prompt: self.request.prompt.as_ref(),
            completion: response.and_then(|r| self.captured_completion(r, dialect, config)),
            requested_model: self.request.view.model.as_deref(),
            response_model: response.and_then(Response::model),
            finish_reasons,
            max_tokens: self.request.view.max_tokens(),
            temperature: self.request.view.temperature,
            cache: served.cache.map(CacheStatus::header),
            degraded: self.decided.degraded,
            fallback_model: self.decided.fallback_model.as_deref(),
            tenant: self.request.tenant.as_deref(),
            hedge: self.decided.hedge.map(HedgeResult::as_str),
            guardrails: self.decided.guardrails.as_deref(),
            cache_markers: self.decided.cache_markers,
            price: config.limits.price(self.priced_model()),
        }
    }

    /// Routing, the budget breaker and the clusters' load learn from one try
    /// of the call, whose model `model` labels the try's tokens.
    pub(super) fn learn_from(&self, env: &mut Env<'_>, model: &str, t: &Try<'_>) {
        self.routing_learns(env, model, t);
        let priority = self.request.priority;
        budget::learn::ended(env.store, &env.config.budget, env.metrics, priority, t);
        load::tried(env.store, env.metrics, &env.config.names, t);
    }

    /// The try the call is on, ended now as the call's summary would read
    /// it; a try that ended otherwise (a hedge's, a failed backend's) is
    /// this with its own cluster, end and usage.
    pub(super) fn tried(&self, now_ms: u64) -> Try<'_> {
        self.try_of(self.served(), now_ms)
    }

    /// A stored Responses answer of a routed backend: the backend holds it,
    /// and a call that continues it goes there (see [`routing::stateful`]).
    /// (An answer another backend gave in place of a failed one is not
    /// remembered.)
    fn remember_response(&self, env: &mut Env<'_>, call: &CallSummary<'_>) {
        let (Some(cluster), Some(r)) = (self.dispatch.cluster.as_deref(), self.response.as_ref())
        else {
            return;
        };
        let answered =
            matches!(self.progress.phase(), Phase::Forwarded) && call.end().upstream_success();
        // Only a call that continues stored state (Responses) says `stored`.
        if !self.request.view.continues.stored || !answered {
            return;
        }
        if let Some(id) = r.id() {
            if !routing::stateful::remember(env.store, id, cluster, env.now_ms) {
                internal_error(env.metrics, "response_state");
            }
        }
    }

    /// What the call was and how it ended, served as `served` says.
    fn summary_of<'a>(
        &'a self,
        served: Served<'a>,
        model: &'a str,
        now_ms: u64,
    ) -> CallSummary<'a> {
        CallSummary {
            api: self.request.dialect,
            priority: self.request.priority,
            model,
            group: None,
            served: self.try_of(served, now_ms),
        }
    }

    /// The try that serves the call as `served` says, ended now: how it
    /// ended, classified once from the phase and the response.
    fn try_of<'a>(&'a self, served: Served<'a>, now_ms: u64) -> Try<'a> {
        let local = match *self.progress.phase() {
            Phase::Answered(status) => Some(status),
            _ => None,
        };
        let r = served.response;
        let end = match self.progress.phase() {
            // The stream ended while another backend was still asked.
            Phase::FailingOver => End::Abandoned,
            _ => End::classify(
                local,
                r.and_then(|r| r.status),
                r.and_then(|r| r.envoy),
                r.is_some_and(|r| r.ended),
            ),
        };
        Try {
            cluster: served.cluster,
            breaker: self.dispatch.breaker.as_deref(),
            end,
            started_ms: self.request.started_ms,
            response_headers_ms: r.map(|r| r.headers_ms),
            first_byte_ms: r.and_then(|r| r.first_byte_ms),
            ended_ms: now_ms,
            usage: r.and_then(Response::usage),
            streamed: r.is_some_and(Response::is_stream),
            budget_ms: self.request.budget_ms,
            planned_retries: self.dispatch.planned_retries,
            attempts: r.and_then(|r| r.attempts),
            failovers: 0,
        }
    }
}

/// What serves a call: the response that answers it, the cluster that
/// sent it and the cache's result. Passed explicitly where it is not yet
/// the call's own (another backend's answer or a cached one about to go
/// out), instead of swapping it in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Served<'a> {
    pub(super) response: Option<&'a Response>,
    pub(super) cluster: Option<&'a str>,
    pub(super) cache: Option<CacheStatus>,
}

impl<'a> Served<'a> {
    /// Why the answer ended, when it said.
    pub(super) fn finish_reasons(self) -> Vec<&'a str> {
        self.response
            .map(Response::finish_reasons)
            .unwrap_or_default()
    }
}
