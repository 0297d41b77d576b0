//! Health-weighted routing: pick a model's backend cluster by measured health.
//! Envoy balances hosts inside a cluster; choosing between clusters per model,
//! by LLM-level health shared across workers, is this filter's job.
//!
//! The walk calls [`route`] once the request body is read, sets
//! [`RoutingConfig::cluster_header`] to the chosen cluster (then refreshes the
//! route) and rewrites the body when asked; it reports every dispatched call
//! with [`learn::started`] and its end with [`learn::ended`]; and on each
//! tick it sends the probes [`probe::Prober::due`] lists (every cluster of
//! [`RoutingConfig::clusters`], on the one worker that wins the lease) and
//! hands each one's end to [`probe::Prober::finish`].

pub mod affinity;
pub mod config;
pub mod ewma;
pub mod failover;
pub mod fallback;
pub mod health;
pub mod hedge;
pub mod learn;
pub mod outcome;
pub mod probe;
pub mod prompt_cache;
pub mod rewrite;
pub mod rules;
pub mod stateful;
pub mod weight;

pub use config::{Backend, ClusterTarget, RawRoutingConfig, RoutingConfig, Rule, Serves, When};
pub use health::{Health, Load};
pub use outcome::{CallResult, CallSample};

use crate::dialect::features::Features;
use crate::dialect::Dialect;
use crate::host::{Metrics, Random, SharedStore};
use crate::metrics as names;
use crate::priority::Priority;

/// Response header naming the cluster that served the call: the name of the
/// default request header that carries the choice to Envoy.
pub const CLUSTER_RESPONSE_HEADER: &str = config::DEFAULT_CLUSTER_HEADER;
/// Response header naming the provider that answered, for a backend
/// declared as one.
pub const PROVIDER_HEADER: &str = "x-llm-provider";

/// Where one call goes.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteDecision {
    /// The model routed: the requested one, or the one a rule chose.
    pub model: String,
    /// Envoy cluster to send the call to (the cluster header's value).
    pub cluster: String,
    /// New `model` for the request body, when it must change.
    pub rewrite_model: Option<String>,
    /// `:authority` to set for this cluster.
    pub authority: Option<String>,
    /// The backend takes the affinity key as `prompt_cache_key` when the
    /// caller sent none.
    pub prompt_cache_key: bool,
    /// The name the backend knows the model by.
    pub sent_model: String,
    /// The provider the backend was declared as.
    pub provider: Option<&'static str>,
    /// How it takes the call's API (`None`: as the call came).
    pub serves: Option<Serves>,
    /// Effective weight of every backend of the model, in configured order
    /// (for the weight gauges).
    pub effective_weights: Vec<(String, f64)>,
    /// Every backend was ejected and base weights were used.
    pub fallback: bool,
    /// The chosen cluster's health as the weighing read it (`None`: never
    /// recorded), for what the call reads of it next.
    pub health: Option<Health>,
    /// The health of the backend a failover or hedge of the call would go
    /// to as the weighing read it: the other one of highest effective
    /// weight (`None`: none has weight, or it was never recorded).
    pub elsewhere: Option<Health>,
}

/// A call to place.
#[derive(Clone, Copy)]
pub struct RouteAsk<'a> {
    /// The model the call asked for.
    pub model: &'a str,
    /// What the rules look at.
    pub features: &'a Features,
    /// The call's priority.
    pub priority: Priority,
    /// Now, ms since the epoch.
    pub now_ms: u64,
    /// Clusters to steer away from (e.g. those whose budget breaker is not
    /// closed) as long as another backend of the model can take the call;
    /// when every positive weight is avoided the weights stand.
    pub avoid: &'a dyn Fn(&str) -> bool,
    /// The backend that holds the state the call continues (see
    /// [`stateful`]): when it is one of the model's, the call goes there
    /// whatever the weights.
    pub pinned: Option<&'a str>,
    /// The call's affinity key: with one, the backend is picked by weighted
    /// rendezvous hashing (see [`affinity`]) rather than drawn at random.
    pub affinity: Option<affinity::Key>,
    /// The call's API, and whether it streams: only a backend that speaks
    /// that shape takes it (`None`: any backend).
    pub shape: Option<(Dialect, bool)>,
}

/// Plans the route of a call: rules may first pick another model, then one
/// of its backends is chosen by effective weight from the health in `store`:
/// the one its affinity key hashes to, or drawn at random for a call without
/// one. `None` when the model is not routed: the call passes untouched to the
/// route's default.
pub fn plan<S, R>(
    config: &RoutingConfig,
    store: &S,
    rng: &mut R,
    ask: &RouteAsk<'_>,
) -> Option<RouteDecision>
where
    S: SharedStore + ?Sized,
    R: Random + ?Sized,
{
    let weighed = weigh(config, store, ask)?;
    let r = rng.next_f64();
    let pinned = ask.pinned.and_then(|p| {
        let at = weighed.backends.iter().position(|b| b.cluster == p)?;
        weighed.speaks.get(at).copied()?.then_some(at)
    });
    if let Some(index) = pinned {
        return weighed.decision(index, ask.model);
    }
    if let Some(key) = ask.affinity.filter(|_| config.affinity.enabled) {
        let hashes: Vec<u64> = weighed
            .backends
            .iter()
            .map(|b| key.hash_with(&b.cluster))
            .collect();
        if let Some(index) = affinity::pick(&weighed.weights.values, &hashes) {
            return weighed.decision(index, ask.model);
        }
    }
    // Effective weights always leave one positive; the base weights are the
    // belt and braces.
    let index = weight::pick(&weighed.weights.values, r).or_else(|| {
        let base: Vec<f64> = weighed
            .backends
            .iter()
            .zip(&weighed.speaks)
            .map(|(b, s)| if *s { f64::from(b.weight) } else { 0.0 })
            .collect();
        weight::pick(&base, r)
    })?;
    weighed.decision(index, ask.model)
}

/// Where a call that failed on one backend goes instead: the other backend
/// of its model with the highest effective weight (the first configured on a
/// tie), never one `asked` names (the one that failed and every other the
/// call asked), and none that `ask.avoid` names while another can take it.
/// `None` when no backend left has any weight.
pub fn failover_target<S>(
    config: &RoutingConfig,
    store: &S,
    ask: &RouteAsk<'_>,
    asked: &dyn Fn(&str) -> bool,
) -> Option<RouteDecision>
where
    S: SharedStore + ?Sized,
{
    let avoid = |cluster: &str| asked(cluster) || (ask.avoid)(cluster);
    let weighed = weigh(
        config,
        store,
        &RouteAsk {
            avoid: &avoid,
            ..*ask
        },
    )?;
    let index = best_except(&weighed.weights.values, |i| {
        weighed.backends.get(i).is_some_and(|b| asked(&b.cluster))
    })?;
    weighed.decision(index, ask.model)
}

/// The index of the highest positive, finite weight among those `skip`
/// does not name (the first on a tie); `None` when none has weight.
fn best_except(values: &[f64], skip: impl Fn(usize) -> bool) -> Option<usize> {
    values
        .iter()
        .enumerate()
        .filter(|(i, w)| !skip(*i) && w.is_finite() && **w > 0.0)
        .max_by(|(i, a), (j, b)| a.total_cmp(b).then(j.cmp(i)))
        .map(|(i, _)| i)
}

/// A model's backends with their effective weights for one call.
struct Weighed<'c> {
    /// The model routed: the requested one, or the one a rule chose.
    target: String,
    backends: &'c [Backend],
    /// The call's shape, and whether each backend speaks it, in the same
    /// order.
    shape: Option<(Dialect, bool)>,
    speaks: Vec<bool>,
    /// Each backend's health as read, in the same order.
    health: Vec<Option<Health>>,
    weights: weight::Weights,
}

/// The backends of the call's model weighed by their health, those `avoid`
/// names set to 0 while another has weight; `None` when the model is not routed.
fn weigh<'c, S>(config: &'c RoutingConfig, store: &S, ask: &RouteAsk<'_>) -> Option<Weighed<'c>>
where
    S: SharedStore + ?Sized,
{
    let target = rules::choose_model(&config.rules, ask.model, ask.features, ask.priority)
        .unwrap_or_else(|| ask.model.to_string());
    let backends = config.backends(&target)?;
    let speaks: Vec<bool> = backends
        .iter()
        .map(|b| {
            ask.shape
                .is_none_or(|(api, stream)| b.serving(api, stream).is_some())
        })
        .collect();
    if !speaks.contains(&true) {
        return None;
    }
    let health: Vec<Option<Health>> = backends
        .iter()
        .map(|b| health::read(store, &b.cluster))
        .collect();
    let mut weights = weight::effective_weights(config, backends, &health, ask.now_ms);
    // A backend that does not speak the call's shape never takes it.
    for (w, s) in weights.values.iter_mut().zip(&speaks) {
        if !*s {
            *w = 0.0;
        }
    }
    let avoided: Vec<bool> = backends.iter().map(|b| (ask.avoid)(&b.cluster)).collect();
    let open_weight: f64 = weights
        .values
        .iter()
        .zip(&avoided)
        .filter(|(_, a)| !**a)
        .map(|(w, _)| *w)
        .sum();
    if open_weight > 0.0 {
        for (w, a) in weights.values.iter_mut().zip(&avoided) {
            if *a {
                *w = 0.0;
            }
        }
    }
    Some(Weighed {
        target,
        backends,
        shape: ask.shape,
        speaks,
        health,
        weights,
    })
}

impl Weighed<'_> {
    /// The health of the backend of highest positive effective weight other
    /// than `index` (the first on a tie), as [`failover_target`] picks.
    fn best_other(&self, index: usize) -> Option<Health> {
        let other = best_except(&self.weights.values, |i| i == index)?;
        self.health.get(other).copied().flatten()
    }

    /// The decision to send a call that asked for `requested` to backend `index`.
    fn decision(self, index: usize, requested: &str) -> Option<RouteDecision> {
        let backend = self.backends.get(index)?;
        let serves = match &self.shape {
            Some((api, stream)) => backend.serving(*api, *stream)?.cloned(),
            None => None,
        };
        let rewrite_model = backend
            .model
            .clone()
            .or_else(|| Some(self.target.clone()))
            .filter(|m| m != requested);
        Some(RouteDecision {
            cluster: backend.cluster.clone(),
            rewrite_model,
            authority: backend.authority.clone(),
            prompt_cache_key: backend.prompt_cache_key,
            sent_model: backend.model.clone().unwrap_or_else(|| self.target.clone()),
            provider: backend.provider,
            serves,
            effective_weights: self
                .backends
                .iter()
                .zip(self.weights.values.iter())
                .map(|(b, w)| (b.cluster.clone(), *w))
                .collect(),
            fallback: self.weights.fallback,
            health: self.health.get(index).copied().flatten(),
            elsewhere: self.best_other(index),
            model: self.target,
        })
    }
}

/// A cluster's typical latency, ms ([`Health::typical_ms`]).
pub fn typical_ms(store: &dyn SharedStore, cluster: &str, streaming: bool) -> Option<u64> {
    health::read(store, cluster)?.typical_ms(streaming)
}

/// Routing's decision at the start of a call: [`plan`], with the weight
/// gauges and the fallback counter it moves.
pub fn route(
    config: &RoutingConfig,
    store: &dyn SharedStore,
    m: &mut dyn Metrics,
    rng: &mut dyn Random,
    ask: &RouteAsk<'_>,
) -> Option<RouteDecision> {
    let decision = plan(config, store, rng, ask)?;
    for (cluster, weight) in &decision.effective_weights {
        m.gauge(
            &names::name(
                names::ROUTING_WEIGHT,
                &[("model", &decision.model), (names::LLM_CLUSTER, cluster)],
            ),
            weight::gauge_value(*weight),
        );
    }
    if decision.fallback {
        m.counter(
            &names::name(names::ROUTING_FALLBACKS, &[("model", &decision.model)]),
            1,
        );
    }
    Some(decision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avoided_clusters_get_nothing_while_another_can_serve() {
        let s = MemoryStore::new();
        let mut rng = SplitMix64::new(3);
        let c = config();
        let f = features(0);
        let ask = |features, avoid| RouteAsk {
            shape: None,
            pinned: None,
            affinity: None,
            model: "gpt-4o",
            features,
            priority: Priority::P1,
            now_ms: 0,
            avoid,
        };
        for _ in 0..200 {
            let d = super::plan(&c, &s, &mut rng, &ask(&f, &|cl| cl == "openai")).unwrap();
            assert_eq!(d.cluster, "azure");
        }
        // Everything avoided: the weights stand, the call still goes somewhere.
        let d = super::plan(&c, &s, &mut rng, &ask(&f, &|_| true));
        assert!(d.is_some());
    }
    use crate::host::{MemoryStore, SplitMix64};

    #[test]
    fn a_pinned_backend_of_the_model_takes_the_call_whatever_the_weights() {
        let s = MemoryStore::new();
        let mut rng = SplitMix64::new(5);
        let c = config();
        let f = features(0);
        for (pinned, want) in [
            (Some("openai"), Some("openai")),
            (Some("azure"), Some("azure")),
            (Some("elsewhere"), None),
        ] {
            for _ in 0..50 {
                let ask = RouteAsk {
                    shape: None,
                    model: "gpt-4o",
                    features: &f,
                    priority: Priority::P1,
                    now_ms: 0,
                    avoid: &|cl| Some(cl) == pinned,
                    pinned,
                    affinity: None,
                };
                let d = super::plan(&c, &s, &mut rng, &ask).unwrap();
                if let Some(w) = want {
                    assert_eq!(d.cluster, w);
                }
            }
        }
    }

    /// [`super::plan`] of a call with affinity `key`, avoiding nothing.
    fn plan_keyed(c: &RoutingConfig, s: &MemoryStore, key: u64, now_ms: u64) -> String {
        let f = features(0);
        let ask = RouteAsk {
            shape: None,
            pinned: None,
            model: "gpt-4o",
            features: &f,
            priority: Priority::P1,
            now_ms,
            avoid: &|_| false,
            affinity: Some(affinity::Key(key)),
        };
        // The draw is never used for a keyed call: any source will do.
        let mut rng = SplitMix64::new(key);
        super::plan(c, s, &mut rng, &ask).unwrap().cluster
    }

    #[test]
    fn a_key_stays_on_its_backend_and_keys_spread_by_weight() {
        let s = MemoryStore::new();
        let c = config();
        let keys: Vec<u64> = (0..400u64)
            .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let first: Vec<String> = keys.iter().map(|k| plan_keyed(&c, &s, *k, 0)).collect();
        for _ in 0..3 {
            let again: Vec<String> = keys.iter().map(|k| plan_keyed(&c, &s, *k, 0)).collect();
            assert_eq!(again, first);
        }
        let openai = first.iter().filter(|c| *c == "openai").count();
        assert!((160..240).contains(&openai), "{openai} of 400");
        // Off: the draw decides again.
        let mut off = config();
        off.affinity.enabled = false;
        let drawn: Vec<String> = (0..40).map(|_| plan_keyed(&off, &s, 7, 0)).collect();
        assert!(drawn.iter().all(|c| c == &drawn[0]), "one seed, one draw");
        let seeds: std::collections::BTreeSet<String> =
            (0..40).map(|k| plan_keyed(&off, &s, k, 0)).collect();
        assert_eq!(seeds.len(), 2);
    }

    /// Three 503s at 1 s: `azure` is ejected.
    fn eject_azure(s: &MemoryStore, c: &RoutingConfig) {
        let fail = CallSample {
            result: CallResult::Status(503),
            latency_ms: 3,
            ttft_ms: None,
            streamed: false,
            output_tokens: None,
        };
        for _ in 0..3 {
            health::record_outcome(s, c, "azure", &fail, 1_000).unwrap();
        }
    }

    #[test]
    fn a_key_leaves_an_ejected_backend_and_comes_back_after_the_ramp() {
        let s = MemoryStore::new();
        let c = config();
        let on_azure: Vec<u64> = (0..200u64)
            .filter(|k| plan_keyed(&c, &s, *k, 0) == "azure")
            .collect();
        let on_openai: Vec<u64> = (0..200u64)
            .filter(|k| plan_keyed(&c, &s, *k, 0) == "openai")
            .collect();
        eject_azure(&s, &c);
        assert!(on_azure
            .iter()
            .all(|k| plan_keyed(&c, &s, *k, 2_000) == "openai"));
        // openai's keys never moved.
        assert!(on_openai
            .iter()
            .all(|k| plan_keyed(&c, &s, *k, 2_000) == "openai"));
        // Back at a tenth of its weight, azure takes about a tenth of its keys
        // back; ramped up, all of them.
        let back = on_azure
            .iter()
            .filter(|k| plan_keyed(&c, &s, **k, 11_000) == "azure")
            .count();
        assert!(back * 4 < on_azure.len(), "{back} of {}", on_azure.len());
        let ramp_end = 11_000 + c.ramp_ms;
        assert!(on_azure
            .iter()
            .all(|k| plan_keyed(&c, &s, *k, ramp_end) == "azure"));
        assert!(on_openai
            .iter()
            .all(|k| plan_keyed(&c, &s, *k, ramp_end) == "openai"));
    }

    #[test]
    fn a_pinned_backend_wins_over_the_key() {
        let s = MemoryStore::new();
        let c = config();
        let f = features(0);
        for key in 0..50u64 {
            let ask = RouteAsk {
                shape: None,
                pinned: Some("azure"),
                model: "gpt-4o",
                features: &f,
                priority: Priority::P1,
                now_ms: 0,
                avoid: &|_| false,
                affinity: Some(affinity::Key(key)),
            };
            let d = super::plan(&c, &s, &mut SplitMix64::new(1), &ask).unwrap();
            assert_eq!(d.cluster, "azure");
        }
    }

    /// [`super::plan`] avoiding nothing.
    fn plan(
        c: &RoutingConfig,
        s: &MemoryStore,
        model: &str,
        features: &Features,
        priority: Priority,
        now_ms: u64,
        rng: &mut SplitMix64,
    ) -> Option<RouteDecision> {
        let ask = RouteAsk {
            shape: None,
            pinned: None,
            affinity: None,
            model,
            features,
            priority,
            now_ms,
            avoid: &|_| false,
        };
        super::plan(c, s, rng, &ask)
    }

    #[test]
    fn typical_latency_is_read_per_kind_of_call() {
        let s = MemoryStore::new();
        let c = RoutingConfig::default();
        assert_eq!(typical_ms(&s, "a", false), None);
        let call = |latency_ms, ttft_ms, streamed| CallSample {
            output_tokens: None,
            result: CallResult::Status(200),
            latency_ms,
            ttft_ms: Some(ttft_ms),
            streamed,
        };
        health::record_outcome(&s, &c, "a", &call(400, 400, false), 0).unwrap();
        assert_eq!(typical_ms(&s, "a", false), Some(400));
        // No stream yet: the first-byte average stands in.
        assert_eq!(typical_ms(&s, "a", true), Some(400));
        health::record_outcome(&s, &c, "a", &call(9_000, 50, true), 0).unwrap();
        assert_eq!(typical_ms(&s, "a", true), Some(50));
        assert_eq!(
            typical_ms(&s, "a", false),
            Some(400),
            "streams' length stays out"
        );
    }

    #[test]
    fn only_a_backend_that_speaks_the_calls_shape_takes_it() {
        let raw: RawRoutingConfig = serde_json::from_str(
            r#"{"models": {"claude": [
              {"cluster": "anthropic", "provider": "anthropic"},
              {"cluster": "bedrock", "provider": "bedrock"},
              {"cluster": "mantle", "provider": "bedrock_mantle", "model": "claude-m"}
            ]}}"#,
        )
        .unwrap();
        let c = RoutingConfig::compile(raw).unwrap();
        let s = MemoryStore::new();
        let f = features(0);
        let ask = |shape, pinned| RouteAsk {
            shape,
            pinned,
            affinity: None,
            model: "claude",
            features: &f,
            priority: Priority::P1,
            now_ms: 0,
            avoid: &|_| false,
        };
        let mut rng = SplitMix64::new(3);
        let stream = Some((Dialect::Messages, true));
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let d = super::plan(&c, &s, &mut rng, &ask(stream, Some("bedrock"))).unwrap();
            seen.insert(d.cluster.clone());
            let serves = d.serves.unwrap();
            assert_eq!(serves.api, Dialect::Messages);
        }
        // Bedrock's InvokeModel streams no SSE: never a stream's, even pinned.
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            ["anthropic", "mantle"]
        );
        let d = super::failover_target(&c, &s, &ask(stream, None), &|c| c == "anthropic").unwrap();
        assert_eq!(
            (d.cluster.as_str(), d.sent_model.as_str()),
            ("mantle", "claude-m")
        );
        assert_eq!(d.provider, Some("bedrock_mantle"));
        assert!(
            super::failover_target(&c, &s, &ask(stream, None), &|c| c == "mantle")
                .is_some_and(|d| d.cluster == "anthropic")
        );
        // A non-stream may go to Bedrock, and once both others were asked,
        // nowhere: no backend is asked twice.
        let messages = ask(Some((Dialect::Messages, false)), None);
        let d = super::failover_target(&c, &s, &messages, &|c| c == "anthropic");
        assert!(d.is_some());
        let asked = |c: &str| c != "bedrock";
        let d = super::failover_target(&c, &s, &messages, &asked).unwrap();
        assert_eq!(d.cluster, "bedrock");
        let asked = |_: &str| true;
        assert_eq!(super::failover_target(&c, &s, &messages, &asked), None);
        let asked = |c: &str| c != "bedrock";
        assert_eq!(
            super::failover_target(&c, &s, &ask(stream, None), &asked),
            None
        );
        // Nobody speaks Gemini's API for this model: not routed.
        let gemini = ask(Some((Dialect::Gemini, false)), None);
        assert_eq!(super::plan(&c, &s, &mut rng, &gemini), None);
    }

    fn config() -> RoutingConfig {
        let raw: RawRoutingConfig = serde_json::from_str(
            r#"{
              "models": {
                "gpt-4o": [
                  {"cluster": "openai", "weight": 1, "authority": "api.openai.com"},
                  {"cluster": "azure", "weight": 1, "model": "gpt-4o-2024-08-06"}
                ],
                "small": [{"cluster": "vllm", "model": "llama-3.1-8b"}],
                "big": [{"cluster": "vllm-big"}]
              },
              "rules": [
                {"when": {"model": "auto", "min_prompt_tokens": 1000}, "model": "big"},
                {"when": {"model": "auto"}, "model": "small"}
              ]
            }"#,
        )
        .unwrap();
        RoutingConfig::compile(raw).unwrap()
    }

    fn features(prompt_tokens: u64) -> Features {
        Features {
            prompt_tokens,
            ..Features::default()
        }
    }

    #[test]
    fn unknown_model_is_untouched() {
        let s = MemoryStore::new();
        let mut rng = SplitMix64::new(1);
        let c = config();
        assert_eq!(
            plan(&c, &s, "gpt-3.5", &features(0), Priority::P1, 0, &mut rng),
            None
        );
        assert_eq!(
            plan(
                &RoutingConfig::default(),
                &s,
                "gpt-4o",
                &features(0),
                Priority::P1,
                0,
                &mut rng
            ),
            None
        );
    }

    #[test]
    fn splits_by_weight_and_rewrites_per_backend() {
        let s = MemoryStore::new();
        let c = config();
        let mut rng = SplitMix64::new(7);
        let mut openai = 0;
        for _ in 0..2_000 {
            let d = plan(&c, &s, "gpt-4o", &features(0), Priority::P1, 0, &mut rng).unwrap();
            assert_eq!(d.model, "gpt-4o");
            assert!(!d.fallback);
            assert_eq!(
                d.effective_weights,
                vec![("openai".to_string(), 1.0), ("azure".to_string(), 1.0)]
            );
            match d.cluster.as_str() {
                "openai" => {
                    openai += 1;
                    assert_eq!(d.rewrite_model, None);
                    assert_eq!(d.authority.as_deref(), Some("api.openai.com"));
                }
                "azure" => {
                    assert_eq!(d.rewrite_model.as_deref(), Some("gpt-4o-2024-08-06"));
                    assert_eq!(d.authority, None);
                }
                other => panic!("{other}"),
            }
        }
        assert!((900..1_100).contains(&openai), "{openai}");
    }

    #[test]
    fn rules_pick_the_model_and_the_body_follows() {
        let s = MemoryStore::new();
        let c = config();
        let mut rng = SplitMix64::new(3);
        let d = plan(&c, &s, "auto", &features(5_000), Priority::P1, 0, &mut rng).unwrap();
        assert_eq!((d.model.as_str(), d.cluster.as_str()), ("big", "vllm-big"));
        assert_eq!(d.rewrite_model.as_deref(), Some("big"));
        let d = plan(&c, &s, "auto", &features(10), Priority::P1, 0, &mut rng).unwrap();
        assert_eq!((d.model.as_str(), d.cluster.as_str()), ("small", "vllm"));
        // The backend's own name wins over the rule's.
        assert_eq!(d.rewrite_model.as_deref(), Some("llama-3.1-8b"));
        // Asking for a routed model by its name needs no rewrite.
        let d = plan(&c, &s, "big", &features(10), Priority::P1, 0, &mut rng).unwrap();
        assert_eq!(d.rewrite_model, None);
    }

    #[test]
    fn traffic_leaves_a_failing_cluster_and_returns_with_a_ramp() {
        let s = MemoryStore::new();
        let c = config();
        let mut rng = SplitMix64::new(11);
        eject_azure(&s, &c);
        for _ in 0..200 {
            let d = plan(
                &c,
                &s,
                "gpt-4o",
                &features(0),
                Priority::P1,
                2_000,
                &mut rng,
            )
            .unwrap();
            assert_eq!(d.cluster, "openai");
            assert_eq!(d.effective_weights[1], ("azure".to_string(), 0.0));
        }
        // Both out: fall back to base weights rather than fail.
        health::record_probe(&s, &c, "openai", false, 2_000, None, 2_000).unwrap();
        let d = plan(
            &c,
            &s,
            "gpt-4o",
            &features(0),
            Priority::P1,
            2_000,
            &mut rng,
        )
        .unwrap();
        assert!(d.fallback);
        assert_eq!(
            d.effective_weights,
            vec![("openai".to_string(), 1.0), ("azure".to_string(), 1.0)]
        );
        // Azure's ejection ends first; it comes back at a tenth of its weight.
        let d = plan(
            &c,
            &s,
            "gpt-4o",
            &features(0),
            Priority::P1,
            11_000,
            &mut rng,
        )
        .unwrap();
        assert!(!d.fallback);
        assert_eq!(d.cluster, "azure");
        let w = d.effective_weights[1].1;
        assert!((w - 0.1).abs() < 1e-9, "{w}");
    }

    #[test]
    fn slow_cluster_gets_less() {
        let s = MemoryStore::new();
        let c = config();
        let mut rng = SplitMix64::new(5);
        for (cluster, ms) in [("openai", 100), ("azure", 400)] {
            let o = CallSample {
                result: CallResult::Status(200),
                latency_ms: ms,
                ttft_ms: Some(ms / 4),
                streamed: false,
                output_tokens: None,
            };
            health::record_start(&s, cluster, 0).unwrap();
            health::record_outcome(&s, &c, cluster, &o, 0).unwrap();
        }
        let mut azure = 0;
        for _ in 0..5_000 {
            let d = plan(&c, &s, "gpt-4o", &features(0), Priority::P1, 0, &mut rng).unwrap();
            if d.cluster == "azure" {
                azure += 1;
            }
        }
        // Weights 1 and 0.25: a fifth of the calls.
        assert!((850..1_150).contains(&azure), "{azure}");
    }

    #[test]
    fn long_answers_at_the_same_speed_are_not_judged_slower() {
        let s = MemoryStore::new();
        let c = config();
        // Both decode 2 ms a token after 64 ms; openai's answers are 20
        // times as long.
        for (cluster, tokens) in [("openai", 400u64), ("azure", 20)] {
            for _ in 0..20 {
                let o = CallSample {
                    result: CallResult::Status(200),
                    latency_ms: 64 + 2 * tokens,
                    ttft_ms: Some(64 + 2 * tokens),
                    streamed: false,
                    output_tokens: Some(tokens),
                };
                health::record_start(&s, cluster, 0).unwrap();
                health::record_outcome(&s, &c, cluster, &o, 0).unwrap();
            }
        }
        let mut rng = SplitMix64::new(9);
        let d = plan(&c, &s, "gpt-4o", &features(0), Priority::P1, 0, &mut rng).unwrap();
        let (openai, azure) = (d.effective_weights[0].1, d.effective_weights[1].1);
        assert!((openai - azure).abs() < 1e-9, "{openai} vs {azure}");
        // Without the token counts, openai's 864 ms against azure's 104 ms
        // would leave it about a tenth of the weight.
        let bare = MemoryStore::new();
        for (cluster, ms) in [("openai", 864u64), ("azure", 104)] {
            let o = CallSample {
                result: CallResult::Status(200),
                latency_ms: ms,
                ttft_ms: Some(ms),
                streamed: false,
                output_tokens: None,
            };
            health::record_outcome(&bare, &c, cluster, &o, 0).unwrap();
        }
        let d = plan(&c, &bare, "gpt-4o", &features(0), Priority::P1, 0, &mut rng).unwrap();
        assert!(d.effective_weights[0].1 < 0.2, "{:?}", d.effective_weights);
    }
}
