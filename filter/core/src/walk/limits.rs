//! The limits step of the walk (see [`crate::limits`]): after degrade and
//! before the cache, the call reserves what it may cost under every rule
//! that applies, or is refused with a 429 in its API's shape, or goes
//! cheaper; the caller hears what is left in the rate-limit headers its SDK
//! knows. At the call's end the reservation is settled with the usage.
//!
//! Before the cache, because a rule's degrade edits the body the cache keys
//! on; a cached answer then costs its request and nothing else.

use std::ops::ControlFlow;

use crate::budget::reply::{self, SHOULD_RETRY};
use crate::dialect::answer::ReplyKind;
use crate::dialect::answer::Reset;
use crate::dialect::request::Switched;
use crate::dialect::Dialect;
use crate::limits::{self, window, Ask, Decision, Ended, Left, Measure, Refused};
use crate::summary::CallSummary;

use super::state::{token_cap, LimitsCall};
use super::{set_request, Call, Env, Flow, HeldBody, Host};

/// A refusal whose window frees later than this tells SDKs not to retry:
/// they wait at most about a minute for `retry-after` and would otherwise
/// retry at once.
const RETRY_HORIZON_S: u64 = 60;

/// The response header telling the caller its call went cheaper.
pub const LIMITED_HEADER: &str = "x-llm-limited";

impl Call {
    /// Reserves the call's cost under the limits, or refuses it.
    pub(super) fn limit(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        mut body: Option<HeldBody>,
    ) -> Flow {
        if !env.config.limits.enabled() {
            return ControlFlow::Continue(body);
        }
        let tenant = self.request.tenant.clone();
        let user = host.request_header(&env.config.limits.user_header);
        let label = env.tenant_labels.value(tenant.as_deref()).to_string();
        // The per-script estimate, calibrated by the model's reported usage.
        let prompt_tokens = body
            .as_ref()
            .and_then(|b| self.prompt_tokens_estimate(env, b))
            .unwrap_or(0);
        let max_tokens = body
            .as_ref()
            .and_then(|b| b.tree())
            .and_then(|t| token_cap(self.request.dialect, t));
        let model = self.model().map(str::to_string);
        let ask = Ask {
            priority: self.request.priority,
            model: model.as_deref(),
            tenant: tenant.as_deref(),
            tenant_label: &label,
            user: user.as_deref(),
            prompt_tokens,
            max_tokens,
            now_ms: env.now_ms,
        };
        let cfg = &env.config.limits;
        let admitted = match limits::admit(env.store, cfg, env.metrics, &ask) {
            Decision::Refuse(r) => {
                let reply = refusal(&r, self.request.dialect, env.now_ms);
                return ControlFlow::Break(self.reply_locally(env, host, reply));
            }
            Decision::Pass(a) => a,
        };
        if let (Some(cheaper), Some(b)) = (&admitted.cheaper, body.as_mut()) {
            let api = self.request.dialect.request();
            let field = self.shaping_config(env.config).field;
            let capped = cheaper
                .max_tokens
                .is_some_and(|cap| api.cap_output(&mut b.doc, cap, field));
            // Where the dialect names the model: the body, or the path.
            let switched = cheaper
                .model
                .as_deref()
                .and_then(|m| api.set_model(&mut b.doc, self.path(), m).map(|to| (m, to)));
            if let Some((m, to)) = switched {
                self.decided.fallback_model = Some(m.to_string());
                match to {
                    Switched::Body => b.was_edited(),
                    Switched::Path(path) => self.switch_path(env, host, path),
                }
            }
            if capped {
                b.was_edited();
            }
        }
        self.decided.limits = Some(LimitsCall {
            reserved_output: max_tokens.unwrap_or(cfg.reserve_output_tokens),
            admitted,
            prompt_tokens,
            at_ms: env.now_ms,
            tenant,
            tenant_label: label,
            user,
            max_tokens,
        });
        ControlFlow::Continue(body)
    }

    /// The tenant for the hop after this one: a front (`limits.mode:
    /// shard`) names the call's tenant id in the shard header, replacing any
    /// value the client sent, so the route to the gateway replicas hashes
    /// the very credential the replicas count; a proxy enforcing rules
    /// removes the header, so no upstream sees it. A replica never trusts
    /// it: it computes the tenant itself, so a forged value chooses at most
    /// the replica.
    pub(super) fn name_tenant(&self, env: &mut Env<'_>, host: &mut dyn Host) {
        let config = env.config;
        let cfg = &config.limits;
        if !cfg.uses_shard_header() {
            return;
        }
        let tenant = match cfg.mode {
            limits::config::Mode::Shard => self.request.tenant.as_deref(),
            limits::config::Mode::Local => None,
        };
        set_request(env, host, &cfg.shard_header, tenant);
    }

    /// Before the call goes to `model`, another model than it was admitted
    /// as (a fallback chain's next): that model's rules hold it there too.
    /// `None`: it may go (its reservations follow it; those of the model it
    /// leaves that the new one does not share are settled as a refused
    /// call's, its request only); else what the rules said.
    pub(super) fn limit_move(&mut self, env: &mut Env<'_>, model: &str) -> Option<limits::Switch> {
        let l = self.decided.limits.as_mut()?;
        let ask = Ask {
            priority: self.request.priority,
            model: Some(model),
            tenant: l.tenant.as_deref(),
            tenant_label: &l.tenant_label,
            user: l.user.as_deref(),
            prompt_tokens: l.prompt_tokens,
            max_tokens: l.max_tokens,
            now_ms: env.now_ms,
        };
        let cfg = &env.config.limits;
        match limits::switch(env.store, cfg, env.metrics, &ask, &l.admitted.held) {
            limits::Switch::Go { held, left_behind } => {
                let refused = limits::Charge {
                    requests: 1,
                    ..limits::Charge::default()
                };
                limits::settle(
                    env.store,
                    cfg,
                    env.metrics,
                    &left_behind,
                    refused,
                    env.now_ms,
                );
                l.admitted.held = held;
                None
            }
            other => Some(other),
        }
    }

    /// The 429 of a rule of the model a move would have gone to.
    pub(super) fn refuse_move(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        r: &Refused,
    ) -> bool {
        let reply = refusal(r, self.request.dialect, env.now_ms);
        self.reply_locally(env, host, reply) == super::Step::Pause
    }

    /// Settles the call's reservations with what it was charged, by how it
    /// ended (`call`).
    pub(super) fn settle_limits(&self, env: &mut Env<'_>, call: &CallSummary<'_>) {
        let Some(l) = &self.decided.limits else {
            return;
        };
        if l.admitted.held.is_empty() {
            return;
        }
        let r = self.response.as_ref();
        let ended = Ended {
            usage: call.served.usage,
            answered: call.end().upstream_success(),
            streamed: call.served.streamed,
            completed: r.is_some_and(|r| r.finished()),
            events: r.map_or(0, |r| r.events()),
            prompt_tokens: l.prompt_tokens,
            reserved_output: l.reserved_output,
        };
        let cfg = &env.config.limits;
        let charge = limits::charge(cfg, env.metrics, self.priced_model(), &ended);
        limits::settle(
            env.store,
            cfg,
            env.metrics,
            &l.admitted.held,
            charge,
            env.now_ms,
        );
    }

    /// The model the call is priced as: the backend's name for it, else
    /// the one it asked for.
    pub(super) fn priced_model(&self) -> Option<&str> {
        self.dispatch.model.as_deref().or(self.model())
    }

    /// The rate-limit headers of the call's tightest limits, in its
    /// dialect's names.
    pub(super) fn limit_headers(&self, out: &mut Vec<(&'static str, String)>) {
        let Some(l) = &self.decided.limits else {
            return;
        };
        let a = &l.admitted;
        rate_headers(out, self.request.dialect, a.requests, a.tokens, l.at_ms);
        if a.cheaper.is_some() {
            out.push((LIMITED_HEADER, "degraded".to_string()));
        }
    }
}

/// The headers the call's dialect names what is left in (OpenAI's
/// `x-ratelimit-*`, Anthropic's `anthropic-ratelimit-*`).
fn rate_headers(
    out: &mut Vec<(&'static str, String)>,
    dialect: Dialect,
    requests: Option<Left>,
    tokens: Option<Left>,
    now_ms: u64,
) {
    let headers = dialect.answer().rate_headers();
    for (left, names) in [(requests, headers.requests), (tokens, headers.tokens)] {
        let Some(left) = left else { continue };
        let [limit, remaining, reset] = names;
        out.push((limit, left.limit.to_string()));
        out.push((remaining, left.remaining.to_string()));
        let reset_value = match headers.reset {
            Reset::Instant => window::rfc3339(now_ms.saturating_add(left.reset_ms)),
            Reset::Seconds => format!("{}s", left.reset_ms.div_ceil(1000)),
        };
        out.push((reset, reset_value));
    }
}

/// The 429 for a call over `r`, with `retry-after` until it fits and what
/// is left of the tightest request and token limits.
fn refusal(r: &Refused, dialect: Dialect, now_ms: u64) -> reply::LocalReply {
    let wait_s = r.wait_ms.map(|ms| ms.div_ceil(1000).max(1));
    let amount = match r.measure {
        // Nanos as units with six decimals, without float formatting.
        Measure::Cost => format!(
            "{}.{:06}",
            r.max / 1_000_000_000,
            r.max % 1_000_000_000 / 1_000
        ),
        _ => r.max.to_string(),
    };
    let message = match wait_s {
        Some(s) => format!(
            "Limit {} of rule {} reached (limit {amount}); retry in {s}s.",
            r.limit, r.rule
        ),
        None => format!(
            "The request alone is more than limit {} of rule {} (limit {amount}).",
            r.limit, r.rule
        ),
    };
    let mut reply = reply::with_message(ReplyKind::OverLimit, &message, wait_s);
    if wait_s.is_none_or(|s| s > RETRY_HORIZON_S) {
        reply.headers.push((SHOULD_RETRY, "false".to_string()));
    }
    // Every SDK reads what is left from a 429 as from any answer: both
    // measures, in the dialect's names (OpenAI's and Anthropic's APIs send
    // them on their own 429s).
    rate_headers(&mut reply.headers, dialect, r.requests, r.tokens, now_ms);
    reply.in_dialect(dialect)
}
