//! The walk's steps for a call that goes upstream: routing places it on a
//! cluster, the body with every step's edits is written to the host (once),
//! then the budget admits the call under that cluster's breaker and plans
//! Envoy's timeouts and retries. Each policy decides in its own module; this
//! only applies the decisions to the request.

use crate::budget::{self, plan::IDEMPOTENCY_KEY, Admission, Ask, BreakerState, DEFAULT_BREAKER};
use crate::load;
use crate::metrics::internal_error;
use crate::routing::{self, Health};

use super::{set_request, Call, Env, HeldBody, Host, Step};

impl Call {
    /// Routing and admission of a call that goes upstream. `body` is the
    /// held request body (`None`: it streams through).
    pub(super) fn go_upstream(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Step {
        self.count_in_flight(env);
        let mut chosen = Chosen::default();
        if let Some(mut body) = body {
            self.ask_for_usage(&mut body);
            self.mark_prompt_cache(env, &mut body);
            self.note_sent_estimate(&body);
            chosen = self.route(env, host, &body);
            if self.may_fail_over(env) || self.may_hedge(env) || self.may_fall_back(env) {
                // Kept to send another backend; only the bytes and the
                // features are needed again.
                body.drop_tree();
                self.dispatch.held = Some(body);
            }
        }
        self.leave_keyless(env, host);
        let health = chosen.health;
        if env.config.budget.enabled {
            if let Some(reply) = self.admit(env, host, chosen) {
                return self.reply_locally(env, host, reply);
            }
        }
        self.arm_hedge(env, health.as_ref());
        Step::Continue
    }

    /// The call joins its model's in-flight count (see [`crate::load`]).
    fn count_in_flight(&mut self, env: &mut Env<'_>) {
        let Some(model) = self.model() else {
            return;
        };
        let label = env.model_labels.value(Some(model)).to_string();
        self.dispatch.load_model = load::started(
            env.store,
            env.metrics,
            &env.config.names,
            &label,
            env.now_ms,
        );
    }

    /// A streamed chat or completions call asks the provider for its usage
    /// (the load signals count output tokens), which the client then does not
    /// see unless it asked. Responses and Messages streams always carry it.
    fn ask_for_usage(&mut self, body: &mut HeldBody) {
        if self.request.dialect.request().ask_for_usage(&mut body.doc) {
            // Routing reads the features, which this does not change.
            body.edited = true;
            self.decided.usage_asked = true;
        }
    }

    /// Breaker admission, then the Envoy timeout and retry plan, on what
    /// routing read of the cluster when it placed the call. Returns the
    /// local reply when the call must not go upstream.
    fn admit(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        chosen: Chosen,
    ) -> Option<budget::LocalReply> {
        let cluster = self.dispatch.cluster.as_deref();
        let streaming = self.request.view.stream.unwrap_or(true);
        let observed_ms = match (cluster, chosen.health) {
            (Some(_), Some(health)) => health.typical_ms(streaming),
            (Some(c), None) => routing::typical_ms(env.store, c, streaming),
            (None, _) => None,
        };
        let ask = Ask {
            breaker: cluster.unwrap_or(DEFAULT_BREAKER),
            priority: self.request.priority,
            streaming,
            observed_ms,
            remaining_ms: self.request.remaining_ms(env.now_ms),
            failover: self.may_fail_over(env),
            now_ms: env.now_ms,
        };
        let breaker = ask.breaker.to_string();
        let cfg = &env.config.budget;
        match budget::admit(env.store, cfg, env.metrics, env.rng, &ask, chosen.breaker) {
            Admission::Refused(reply) => Some(reply),
            Admission::Planned { headers, retries } => {
                for (header, value) in headers {
                    set_request(env, host, header, value.as_deref());
                }
                if host.request_header(IDEMPOTENCY_KEY).is_none() {
                    let key = budget::plan::idempotency_key(env.rng);
                    set_request(env, host, IDEMPOTENCY_KEY, Some(&key));
                }
                self.dispatch.planned_retries = retries;
                self.dispatch.breaker = Some(breaker);
                None
            }
        }
    }
}

/// What routing read of the cluster it chose, in the same callback as the
/// admission that reads them next: handed over, not read again.
#[derive(Default)]
pub(super) struct Chosen {
    /// Its health (`None`: not read, or never recorded: read it again).
    pub(super) health: Option<Health>,
    /// Its breaker window (`None`: not read).
    pub(super) breaker: Option<BreakerState>,
}

/// Removes a routing header the client sent, from every request the filter
/// sees (LLM call or not, routing configured or not): only the filter's own
/// choice may steer a request to a cluster, so on a gateway no client can
/// reach a cluster by naming it.
pub(super) fn drop_client_route_header(env: &mut Env<'_>, host: &mut dyn Host) {
    if host
        .request_header(&env.config.routing.cluster_header)
        .is_some()
    {
        set_route_header(env, host, None);
    }
}

/// Sets (or removes) the routing header and has Envoy pick the route again:
/// header edits alone no longer refresh the route cache.
pub(super) fn set_route_header(env: &mut Env<'_>, host: &mut dyn Host, cluster: Option<&str>) {
    let header = env.config.routing.cluster_header.clone();
    set_request(env, host, &header, cluster);
    if !host.clear_route_cache() {
        internal_error(env.metrics, "clear_route_cache");
    }
}

impl Call {
    /// The one write of the request body, as the call leaves: `body` with
    /// every step's edits, or `rewritten` (that body for the chosen backend's
    /// name of the model). The host's buffer is replaced, with its
    /// `content-length`, only when what is sent differs from it. False
    /// (counted) when the host refused: the call then goes on with the body
    /// as received, whose answer is not stored under a key taken over the
    /// edits.
    pub(super) fn send_body(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: &HeldBody,
        rewritten: Option<&[u8]>,
    ) -> bool {
        let new = match rewritten {
            Some(new) => new,
            None if body.edited => body.raw(),
            None => return true,
        };
        if !host.set_request_body(body.size, new) {
            internal_error(env.metrics, "set_request_body");
            if let Some(c) = self.cache.cacheable.as_mut().filter(|_| body.edited) {
                c.store = false;
            }
            return false;
        }
        set_request(env, host, "content-length", Some(&new.len().to_string()));
        true
    }
}
