//! The walk's steps for a call that goes upstream: routing places it on a
//! cluster, the body with every step's edits is written to the host (once),
//! then the budget admits the call under that cluster's breaker and plans
//! Envoy's timeouts and retries. Each policy decides in its own module; this
//! only applies the decisions to the request.

use std::cell::RefCell;

use crate::budget::{
    self, plan::IDEMPOTENCY_KEY, Admission, Ask, BreakerState, BudgetConfig, DEFAULT_BREAKER,
};
use crate::dialect::features::Features;
use crate::dialect::Dialect;
use crate::host::SharedStore;
use crate::load;
use crate::metrics::internal_error;
use crate::routing::rewrite::{self, Edit};
use crate::routing::{self, affinity, stateful, Health, RouteAsk};

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

    /// The call's affinity key, with routing on (see
    /// [`crate::routing::affinity`]): the session header is read only when
    /// it is one of the key's sources.
    pub(super) fn affinity_key(
        &self,
        env: &Env<'_>,
        host: &dyn Host,
        body: &HeldBody,
    ) -> Option<affinity::Key> {
        let routing = &env.config.routing;
        let cfg = &routing.affinity;
        if routing.models.is_empty() || !cfg.enabled {
            return None;
        }
        let session = if cfg.sources.contains(&affinity::Source::Header) {
            host.request_header(&cfg.session_header)
        } else {
            None
        };
        cfg.key_of(self.request.dialect, body.tree(), session.as_deref())
    }

    /// The call's API and whether it streams: the shape a backend must
    /// speak to take it.
    pub(super) fn call_shape(&self) -> (Dialect, bool) {
        (
            self.request.dialect,
            self.request.view.stream.unwrap_or(false),
        )
    }

    /// The affinity key as the `prompt_cache_key` a backend that takes one
    /// (`takes`) gets: only on the APIs that have the field, and only when
    /// the caller named none.
    pub(super) fn cache_key_for(&self, takes: bool) -> Option<String> {
        let wanted = takes
            && !self.request.view.names_cache_key
            && affinity::takes_prompt_cache_key(self.request.dialect);
        self.request.affinity.filter(|_| wanted).map(|k| k.hex())
    }

    /// Places the call on one of its model's clusters by measured health and
    /// writes the body it is sent with; returns what routing read of the
    /// chosen cluster.
    fn route(&mut self, env: &mut Env<'_>, host: &mut dyn Host, body: &HeldBody) -> Chosen {
        let features = body.features.as_ref().map(|f| {
            if routing::rules::weigh_prompts(&self.routing_config(env.config).rules) {
                self.calibrated_features(env, f)
            } else {
                f.clone()
            }
        });
        let decision = features.and_then(|features| self.pick(env, &features));
        let Some((decision, breaker)) = decision else {
            self.send_body(env, host, body, None);
            return Chosen::default();
        };
        // The chosen backend's name of the model, when it has its own, and
        // the cache key it takes.
        let cache_key = self.cache_key_for(decision.prompt_cache_key);
        // The call as the backend takes it: the model in the body or in the
        // path, its path, its version.
        let (api, stream) = self.call_shape();
        let shaped = rewrite::for_serves(
            api,
            self.path(),
            stream,
            decision.serves.as_ref(),
            decision.rewrite_model.as_deref(),
            &decision.sent_model,
            &body.doc,
            cache_key.as_deref(),
        );
        let (edit, path) = (shaped.body, shaped.path);
        let written = match &edit {
            Edit::Refused => {
                self.send_body(env, host, body, None);
                false
            }
            Edit::Changed(new_body) => self.send_body(env, host, body, Some(new_body)),
            Edit::Unchanged => {
                self.send_body(env, host, body, None);
                true
            }
        };
        if !written {
            // The body could not be rewritten: the call goes to the model's
            // default route untouched rather than to a backend that would not
            // know the model.
            internal_error(env.metrics, "rewrite_model");
            return Chosen::default();
        }
        if let Some(authority) = &decision.authority {
            set_request(env, host, ":authority", Some(authority));
        }
        if let Some(path) = &path {
            // Envoy picks the route again below (the routing header's
            // refresh), on the rewritten path.
            set_request(env, host, ":path", Some(path));
        }
        if let Some((name, value)) = shaped.header {
            if host.request_header(name).is_none() {
                set_request(env, host, name, Some(value));
            }
        }
        set_route_header(env, host, Some(&decision.cluster));
        if let (Some(header), Some(key)) =
            (&env.config.routing.affinity.header, self.request.affinity)
        {
            let header = header.clone();
            set_request(env, host, &header, Some(&key.hex()));
        }
        routing::learn::started(env.store, env.metrics, &decision.cluster, env.now_ms);
        // A call continuing a backend's state has no other backend to go to.
        self.dispatch.alternatives =
            decision.effective_weights.len() > 1 && !self.request.view.continues.state;
        self.dispatch.model = Some(decision.model.clone());
        self.dispatch.elsewhere = decision.elsewhere;
        self.dispatch.cluster = Some(decision.cluster);
        Chosen {
            health: decision.health,
            breaker,
        }
    }

    /// Routing's pick for the call (no host edit yet), with the breaker
    /// window it read of the chosen cluster.
    fn pick(
        &self,
        env: &mut Env<'_>,
        features: &Features,
    ) -> Option<(routing::RouteDecision, Option<BreakerState>)> {
        let model = self.model()?;
        // A backend whose budget breaker is not closed would shed or reject
        // the call: another backend of the model takes it when one can.
        let windows = Windows::new(env);
        let avoid = |cluster: &str| windows.sheds(cluster);
        // The backend that produced the response the call continues.
        let pinned = self
            .request
            .view
            .continues
            .previous_response_id
            .as_deref()
            .and_then(|id| stateful::holder(env.store, id, env.now_ms));
        let ask = RouteAsk {
            shape: Some(self.call_shape()),
            model,
            features,
            priority: self.request.priority,
            now_ms: env.now_ms,
            avoid: &avoid,
            pinned: pinned.as_deref(),
            affinity: self.request.affinity,
        };
        let decision = routing::route(
            self.routing_config(env.config),
            env.store,
            env.metrics,
            env.rng,
            &ask,
        )?;
        let breaker = windows.take(&decision.cluster);
        Some((decision, breaker))
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

/// The breaker windows routing reads to steer calls away from backends that
/// would shed them, kept for the chosen backend's admission.
struct Windows<'e> {
    store: &'e dyn SharedStore,
    budget: &'e BudgetConfig,
    now_ms: u64,
    read: RefCell<Vec<(String, BreakerState)>>,
}

impl<'e> Windows<'e> {
    fn new(env: &Env<'e>) -> Self {
        Self {
            store: env.store,
            budget: &env.config.budget,
            now_ms: env.now_ms,
            read: RefCell::new(Vec::new()),
        }
    }

    /// True when `cluster`'s breaker would shed or reject the call now
    /// (never with budgets off).
    fn sheds(&self, cluster: &str) -> bool {
        let Some(window) = budget::breaker_window(self.store, self.budget, cluster) else {
            return false;
        };
        let sheds = budget::sheds(&window, self.budget, self.now_ms);
        self.read.borrow_mut().push((cluster.to_string(), window));
        sheds
    }

    /// The window read of `cluster`, if it was.
    fn take(self, cluster: &str) -> Option<BreakerState> {
        self.read
            .into_inner()
            .into_iter()
            .find(|(c, _)| c == cluster)
            .map(|(_, window)| window)
    }
}

/// What routing read of the cluster it chose, in the same callback as the
/// admission that reads them next: handed over, not read again.
#[derive(Default)]
struct Chosen {
    /// Its health (`None`: not read, or never recorded: read it again).
    health: Option<Health>,
    /// Its breaker window (`None`: not read).
    breaker: Option<BreakerState>,
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
    fn send_body(
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
