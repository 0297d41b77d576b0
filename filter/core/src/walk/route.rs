//! Routing's step in the walk: the call is placed on one of its model's
//! clusters by measured health (its affinity, its rules, the breakers that
//! would shed it), the body is written for that backend's name of the model,
//! and the routing header tells Envoy where it goes.

use std::cell::RefCell;

use crate::budget::{self, BreakerState, BudgetConfig};
use crate::dialect::features::Features;
use crate::dialect::Dialect;
use crate::host::SharedStore;
use crate::metrics::{self as names, internal_error};
use crate::routing::rewrite::{self, Edit};
use crate::routing::{self, affinity, stateful, RouteAsk};
use crate::summary::Try;

use super::upstream::{set_route_header, Chosen};
use super::{set_request, Call, Env, HeldBody, Host};

impl Call {
    /// The provider's prompt-cache markers the client placed none of, on a
    /// model that opts in (`routing.prompt_cache`): its dialect says where
    /// they go, on a prefix of at least the entry's tokens as the model's
    /// learnt ratio reads the estimate. After the cache step, whose key is
    /// over the body as the client meant it; before routing, so a failover
    /// or a hedge sends the same markers.
    pub(super) fn mark_prompt_cache(&mut self, env: &mut Env<'_>, body: &mut HeldBody) {
        let cfg = &self.routing_config(env.config).prompt_cache;
        let Some(mut ask) = self.model().and_then(|m| cfg.for_model(m)) else {
            return;
        };
        ask.min_tokens = self.estimate_ratio(env).uncalibrated(ask.min_tokens);
        let dialect = self.request.dialect;
        let placed = dialect.request().mark_cache(&mut body.doc, &ask);
        if placed == 0 {
            return;
        }
        // What routing reads of the body is as it was.
        body.edited = true;
        self.decided.cache_markers = placed;
        let label = env.model_labels.value(self.model()).to_string();
        env.metrics.counter(
            &names::name(
                names::PROMPT_CACHE_MARKERS,
                &[("model", &label), ("api", dialect.api())],
            ),
            u64::from(placed),
        );
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
            .map(|k| k.of_tenant(self.request.tenant.as_deref()))
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

    /// The health of the try's cluster learns from one try of the call,
    /// whose model `model` labels the try's tokens.
    pub(super) fn routing_learns(&self, env: &mut Env<'_>, model: &str, t: &Try<'_>) {
        let routing = self.routing_config(env.config);
        routing::learn::ended(env.store, routing, env.metrics, model, t);
    }

    /// Places the call on one of its model's clusters by measured health and
    /// writes the body it is sent with; returns what routing read of the
    /// chosen cluster.
    pub(super) fn route(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: &HeldBody,
    ) -> Chosen {
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
