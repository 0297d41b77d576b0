//! The end of a call: one summary of what it was and how it ended, handed to
//! each policy to learn from (the request metrics, routing, the budget
//! breaker, the load signals).

use crate::cache::CacheStatus;
use crate::config::Config;
use crate::metrics::internal_error;
use crate::routing::hedge::HedgeResult;
use crate::summary::{CallSummary, End};
use crate::{budget, dialect, load, observe, routing, spans};

use super::state::{Phase, Response};
use super::{Call, Env, Host};

impl Call {
    /// End of the stream: one summary of the call, learnt from by each policy.
    pub fn on_log(mut self, env: &mut Env<'_>) {
        self.cache_on_log(env);
        self.settle_hedge(env);
        let model = self.model_label(env);
        let summary = self.summary_in_group(env.config, &model, env.now_ms);
        observe::record(env.metrics, &summary);
        self.queue_span(env, &summary);
        self.learn_from(env, &summary);
        self.calibrate(env, &summary);
        self.remember_response(env);
        self.settle_limits(env);
        // It leaves the in-flight count of the record it joined.
        let started = self.dispatch.load_model.as_deref();
        load::ended(env.store, env.metrics, &env.config.names, &summary, started);
    }

    /// The call's summary now, with its A/B group: what the metrics, the span
    /// and the record say of it.
    fn summary_in_group<'a>(
        &'a self,
        config: &'a Config,
        model: &'a str,
        now_ms: u64,
    ) -> CallSummary<'a> {
        CallSummary {
            group: self.group(config).map(|g| g.name.as_str()),
            ..self.summary(model, now_ms)
        }
    }

    /// The model label of the call (bounded, as its metrics spell it).
    fn model_label(&self, env: &mut Env<'_>) -> String {
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
        if !env.config.access_log {
            return;
        }
        let model = self.model_label(env);
        let mut call = self.summary_in_group(env.config, &model, env.now_ms);
        if let Some(end) = end {
            call.end = end;
        }
        let finish = self.finish_reasons();
        let details = self.details(env.config, &finish);
        let record = spans::record::record(self.decided.span.as_ref(), &call, &details);
        if !host.set_property(spans::record::PROPERTY, &record) {
            internal_error(env.metrics, "set_property");
        }
    }

    /// The call's span, queued for export when spans are exported and the
    /// trace is sampled.
    fn queue_span(&self, env: &mut Env<'_>, call: &CallSummary<'_>) {
        let (Some(otlp), Some(ids)) = (env.config.otlp.as_ref(), self.decided.span) else {
            return;
        };
        if !ids.sampled() {
            return;
        }
        let finish = self.finish_reasons();
        let span = spans::encode(&ids, call, &self.details(env.config, &finish));
        env.spans.push(otlp, env.metrics, span);
    }

    /// Why the answer ended, when it said.
    fn finish_reasons(&self) -> Vec<&str> {
        self.response
            .as_ref()
            .map(Response::finish_reasons)
            .unwrap_or_default()
    }

    /// What the walk knew of the call beyond its summary, for its span and
    /// its record.
    fn details<'a>(
        &'a self,
        config: &'a Config,
        finish_reasons: &'a [&'a str],
    ) -> spans::Details<'a> {
        let endpoint = self.request.endpoint;
        spans::Details {
            prompt: self.request.prompt.as_ref(),
            completion: self
                .response
                .as_ref()
                .and_then(|r| r.completion(endpoint, &config.capture)),
            requested_model: self.request.view.model.as_deref(),
            response_model: self.response.as_ref().and_then(Response::model),
            finish_reasons,
            max_tokens: self.request.view.max_tokens(),
            temperature: self.request.view.temperature,
            cache: self.cache.status.map(CacheStatus::header),
            degraded: self.decided.degraded,
            fallback_model: self.decided.fallback_model.as_deref(),
            hedge: self.decided.hedge.map(HedgeResult::as_str),
        }
    }

    /// Routing, the budget breaker and the clusters' load learn from one try
    /// of the call.
    pub(super) fn learn_from(&self, env: &mut Env<'_>, call: &CallSummary<'_>) {
        let routing = self.routing_config(env.config);
        routing::learn::ended(env.store, routing, env.metrics, call);
        budget::learn::ended(env.store, &env.config.budget, env.metrics, call);
        load::tried(env.store, env.metrics, &env.config.names, call);
    }

    /// A stored Responses answer of a routed backend: the backend holds it,
    /// and a call that continues it goes there (see [`routing::stateful`]).
    fn remember_response(&self, env: &mut Env<'_>) {
        let (Some(cluster), Some(r)) = (self.dispatch.cluster.as_deref(), self.response.as_ref())
        else {
            return;
        };
        let answered = matches!(self.progress.phase(), Phase::Forwarded)
            && r.status.is_some_and(|s| (200..300).contains(&s));
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

    /// What the call was and how it ended.
    pub(super) fn summary<'a>(&'a self, model: &'a str, now_ms: u64) -> CallSummary<'a> {
        let local = match *self.progress.phase() {
            Phase::Answered(status) => Some(status),
            _ => None,
        };
        let r = self.response.as_ref();
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
        CallSummary {
            api: self.request.endpoint,
            priority: self.request.priority,
            model,
            end,
            started_ms: self.request.started_ms,
            response_headers_ms: r.map(|r| r.headers_ms),
            first_byte_ms: r.and_then(|r| r.first_byte_ms),
            ended_ms: now_ms,
            usage: r.and_then(Response::usage),
            streamed: r.is_some_and(Response::is_stream),
            cluster: self.dispatch.cluster.as_deref(),
            breaker: self.dispatch.breaker.as_deref(),
            budget_ms: self.request.budget_ms,
            planned_retries: self.dispatch.planned_retries,
            attempts: r.and_then(|r| r.attempts),
            failovers: 0,
            group: None,
        }
    }
}
