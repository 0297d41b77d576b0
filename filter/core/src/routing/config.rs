//! The `routing` section: which clusters serve which model, how health is
//! measured and which rules pick a model. Compiled once at load time so the data
//! path only ever meets valid, typed values.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::affinity::{AffinityConfig, RawAffinity};
use super::fallback::{self, Chains};
use super::prompt_cache::PromptCacheConfig;
use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{Bound, Empty, List, Setting, Table};
use crate::dialect::provider::{self, Streams, Version};
use crate::dialect::Dialect;
use crate::priority::Priority;

/// `cluster_header`: carries the chosen cluster to Envoy's `cluster_header`
/// route.
const CLUSTER_HEADER: Setting<&str> = Setting::any("cluster_header", "x-llm-cluster");
/// The default `cluster_header`.
pub const DEFAULT_CLUSTER_HEADER: &str = CLUSTER_HEADER.default;
/// `health_path`, probed on each cluster: every OpenAI-compatible server
/// answers it cheaply.
const HEALTH_PATH: Setting<&str> = Setting::any("health_path", "/v1/models");
/// The default `health_path`.
pub const DEFAULT_HEALTH_PATH: &str = HEALTH_PATH.default;
/// A backend's `weight`.
const WEIGHT: Setting<u32> = Setting {
    name: "weight",
    default: 1,
    bound: Bound::Positive("weight"),
};
/// A backend's `prompt_cache_key`.
const PROMPT_CACHE_KEY: Setting<bool> = Setting::any("prompt_cache_key", false);

// Upper bounds keep every millisecond conversion far from overflow and reject
// values that can only be typos.
const MAX_INTERVAL_S: u64 = 3_600;
const MAX_EJECT_S_VALUE: u64 = 86_400;

const PROBE_INTERVAL_S: Setting<u64> = Setting::range("probe_interval_s", 5, 1, MAX_INTERVAL_S);
const PROBE_TIMEOUT_MS: Setting<u64> = Setting::range("probe_timeout_ms", 2_000, 1, 60_000);
const EJECT_AFTER_FAILURES: Setting<u32> = Setting::range("eject_after_failures", 3, 1, 1_000);
const EJECT_S: Setting<u64> = Setting::range("eject_s", 10, 1, MAX_EJECT_S_VALUE);
/// `max_eject_s`: a long first ejection raises the default cap with it.
const MAX_EJECT_S: Setting<u64> = Setting {
    name: "max_eject_s",
    default: 300,
    bound: Bound::Stated("`eject_s` to 86,400"),
};
const RAMP_S: Setting<u64> = Setting::range("ramp_s", 20, 0, MAX_INTERVAL_S);
const EWMA_HALF_LIFE_S: Setting<f64> = Setting::real(
    "ewma_half_life_s",
    10.0,
    (0.1, false),
    (MAX_INTERVAL_S as f64, false),
);
/// `failover`: a held call its backend fails retriably goes to another
/// backend.
const FAILOVER: Setting<bool> = Setting::any("failover", true);
/// `hedge.priorities`: every priority's calls are hedged.
const HEDGE_PRIORITIES: List<Priority> = List::new("priorities", &Priority::ALL);
const HEDGE_MIN_DELAY_MS: Setting<u64> = Setting::range("min_delay_ms", 250, 1, 60_000);
const HEDGE_MAX_RATIO: Setting<f64> = Setting::fraction("max_ratio", 0.05);

/// The section's settings.
pub const SETTINGS: Table = &[
    (
        "routing",
        &[
            &Empty::map("models"),
            &Empty::list("rules"),
            &Empty::map("prompt_cache"),
            &CLUSTER_HEADER,
            &PROBE_INTERVAL_S,
            &PROBE_TIMEOUT_MS,
            &EJECT_AFTER_FAILURES,
            &EJECT_S,
            &MAX_EJECT_S,
            &RAMP_S,
            &EWMA_HALF_LIFE_S,
            &FAILOVER,
        ],
    ),
    (
        "routing.models.<>[]",
        &[&WEIGHT, &HEALTH_PATH, &PROMPT_CACHE_KEY],
    ),
    (
        "routing.hedge",
        &[&HEDGE_PRIORITIES, &HEDGE_MIN_DELAY_MS, &HEDGE_MAX_RATIO],
    ),
    ("routing.affinity", super::affinity::SETTINGS),
    ("routing.prompt_cache.<>", super::prompt_cache::SETTINGS),
];

/// `routing` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawRoutingConfig {
    /// Model name → the backends that serve it.
    pub models: BTreeMap<String, Vec<RawBackend>>,
    /// Request header naming the chosen cluster, default `x-llm-cluster`.
    pub cluster_header: Option<String>,
    /// Seconds between active probes, default 5.
    pub probe_interval_s: Option<u64>,
    /// Probe timeout in milliseconds, default 2000.
    pub probe_timeout_ms: Option<u64>,
    /// Consecutive failed calls that eject a cluster, default 3.
    pub eject_after_failures: Option<u32>,
    /// First ejection in seconds, default 10; doubles on each repeated ejection.
    pub eject_s: Option<u64>,
    /// Longest ejection in seconds, default 300 (or `eject_s` when larger).
    pub max_eject_s: Option<u64>,
    /// Seconds over which a returning cluster ramps back to full weight, default 20.
    pub ramp_s: Option<u64>,
    /// Half-life of the latency and error averages in seconds, default 10.
    pub ewma_half_life_s: Option<f64>,
    /// Model-choice rules, first match wins.
    pub rules: Vec<RawRule>,
    /// Send a held call another backend of its model when the chosen one
    /// fails it retriably, default true.
    pub failover: Option<bool>,
    /// Hedge slow calls on another backend (on by default).
    pub hedge: RawHedge,
    /// Calls of one conversation to one backend (on by default).
    pub affinity: RawAffinity,
    /// Prompt-cache markers the filter puts on (none by default).
    pub prompt_cache: serde_json::Value,
    /// Model → the models a call refused for its context length, a spent
    /// quota or an unknown model moves on to.
    pub fallbacks: serde_json::Value,
}

/// `routing.hedge` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawHedge {
    /// Priorities whose calls are hedged, default all three; none: no hedging.
    pub priorities: Option<Vec<Priority>>,
    /// Shortest wait before a hedge, ms, default 250.
    pub min_delay_ms: Option<u64>,
    /// Most hedges per hedgeable call over the window, default 0.05; 0: no
    /// hedging.
    pub max_ratio: Option<f64>,
}

/// One backend of a model as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawBackend {
    /// Envoy cluster name.
    pub cluster: String,
    /// Base weight, default 1.
    pub weight: Option<u32>,
    /// Model name this backend knows the model by (the body is rewritten).
    pub model: Option<String>,
    /// `:authority` for calls and probes to this cluster.
    pub authority: Option<String>,
    /// Probe path, default `/v1/models`.
    pub health_path: Option<String>,
    /// Prometheus path of the model server's load metrics.
    pub metrics_path: Option<String>,
    /// Set `prompt_cache_key` from the affinity key, default false.
    pub prompt_cache_key: Option<bool>,
    /// The provider it is: a preset of the APIs it serves and their paths.
    pub provider: Option<String>,
    /// The APIs it serves (default: its preset's; none: every API, on the
    /// client's paths).
    pub apis: Option<Vec<String>>,
    /// API → its path, `{model}` where the model goes.
    pub paths: Option<BTreeMap<String, String>>,
}

/// One rule as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawRule {
    /// Conditions, all of which must hold; none means always.
    pub when: RawWhen,
    /// The model to use when the rule matches.
    pub model: String,
}

/// Conditions of a rule as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawWhen {
    /// Requested model name(s), e.g. `"auto"`.
    pub model: Option<OneOrMany>,
    /// Estimated prompt tokens at least this.
    pub min_prompt_tokens: Option<u64>,
    /// Estimated prompt tokens at most this.
    pub max_prompt_tokens: Option<u64>,
    /// Priority or priorities.
    pub priority: Option<OneOrMany>,
    /// Whether the request declares tools.
    pub tools: Option<bool>,
    /// Whether the request asks for a stream.
    pub stream: Option<bool>,
}

/// A string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum OneOrMany {
    /// A single value.
    One(String),
    /// Several values.
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// The compiled `routing` section.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// Model name → its backends, in configured order.
    pub models: BTreeMap<String, Vec<Backend>>,
    /// Every distinct cluster once, with what to probe on it.
    pub clusters: Vec<ClusterTarget>,
    /// Request header naming the chosen cluster (lowercase).
    pub cluster_header: String,
    /// Time between probes (and the probe lease length).
    pub probe_interval_ms: u64,
    /// Probe timeout.
    pub probe_timeout_ms: u64,
    /// Consecutive failed calls that eject a cluster.
    pub eject_after_failures: u32,
    /// First ejection.
    pub eject_ms: u64,
    /// Longest ejection.
    pub max_eject_ms: u64,
    /// Ramp back to full weight after an ejection; 0 means none.
    pub ramp_ms: u64,
    /// Half-life of the health averages, finite and positive.
    pub ewma_half_life_ms: f64,
    /// Model-choice rules, first match wins.
    pub rules: Vec<Rule>,
    /// A held call that its backend fails retriably goes to another backend
    /// of its model (see [`super::failover`]).
    pub failover: bool,
    /// Slow calls are hedged on another backend (see [`super::hedge`]);
    /// `None` when hedging is off.
    pub hedge: Option<HedgeConfig>,
    /// Calls of one conversation go to one backend (see [`super::affinity`]).
    pub affinity: AffinityConfig,
    /// The models whose calls get prompt-cache markers (see
    /// [`super::prompt_cache`]).
    pub prompt_cache: PromptCacheConfig,
    /// Each model's fallback chain by error class (see [`super::fallback`]).
    pub fallbacks: Chains,
}

/// Compiled `routing.hedge`.
#[derive(Debug, Clone, PartialEq)]
pub struct HedgeConfig {
    /// Priorities whose calls are hedged.
    pub priorities: Vec<Priority>,
    /// Shortest wait before a hedge, ms.
    pub min_delay_ms: u64,
    /// Most hedges per hedgeable call over the window, in `[0, 1]`.
    pub max_ratio: f64,
}

/// One backend of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// Envoy cluster name.
    pub cluster: String,
    /// Base weight, positive.
    pub weight: u32,
    /// Model name to write into the body for this backend.
    pub model: Option<String>,
    /// `:authority` to send to this cluster.
    pub authority: Option<String>,
    /// A chat or Responses call without a `prompt_cache_key` gets the
    /// affinity key as one (OpenAI-compatible servers that take the field).
    pub prompt_cache_key: bool,
    /// The provider it was declared as.
    pub provider: Option<&'static str>,
    /// The APIs it serves and how; `None`: every API, as the call came.
    pub speaks: Option<Vec<Serves>>,
}

/// How a backend takes the calls of one API (see
/// [`crate::dialect::provider`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serves {
    /// The API.
    pub api: Dialect,
    /// The path of a call, `{model}` where the model goes; `None`: the
    /// client's path.
    pub path: Option<String>,
    /// The path of a stream; `None` with a `path`: no stream goes there.
    pub stream_path: Option<String>,
    /// The API version it wants.
    pub version: Option<Version>,
}

impl Serves {
    /// The path of a call (a stream when `stream`): `None` for the
    /// client's, `Some(None)` when no such call goes there.
    pub fn path(&self, stream: bool) -> Option<Option<&str>> {
        match (&self.path, stream) {
            (None, _) => None,
            (Some(p), false) => Some(Some(p)),
            (Some(_), true) => Some(self.stream_path.as_deref()),
        }
    }
}

impl Backend {
    /// How it serves a call of `api` (a stream when `stream`): `Some(None)`
    /// when it was never told what it speaks (it takes the call as it
    /// came), `None` when it does not speak that shape.
    pub fn serving(&self, api: Dialect, stream: bool) -> Option<Option<&Serves>> {
        let Some(speaks) = &self.speaks else {
            return Some(None);
        };
        let s = speaks.iter().find(|s| s.api == api)?;
        match s.path(stream) {
            Some(None) => None,
            _ => Some(Some(s)),
        }
    }
}

/// What the elected worker probes on one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTarget {
    /// Envoy cluster name.
    pub cluster: String,
    /// `:authority` of the probe; the cluster name when absent.
    pub authority: Option<String>,
    /// Liveness path.
    pub health_path: String,
    /// Prometheus load metrics path.
    pub metrics_path: Option<String>,
}

/// A compiled model-choice rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Conditions, all of which must hold.
    pub when: When,
    /// Model chosen when they do; always a key of [`RoutingConfig::models`].
    pub model: String,
}

/// Compiled rule conditions; `None` means "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct When {
    /// Requested model names (aliases).
    pub models: Option<Vec<String>>,
    /// Inclusive lower bound of estimated prompt tokens.
    pub min_prompt_tokens: Option<u64>,
    /// Inclusive upper bound of estimated prompt tokens.
    pub max_prompt_tokens: Option<u64>,
    /// Priorities.
    pub priorities: Option<Vec<Priority>>,
    /// Tools declared or not.
    pub tools: Option<bool>,
    /// Stream asked or not.
    pub stream: Option<bool>,
}

impl Default for RoutingConfig {
    /// The empty section, as compiling `{}` gives it (the tests check):
    /// no model routed, every call passes untouched. A build without
    /// routing holds it without holding the section's compiler.
    fn default() -> Self {
        let ms = |s: u64| s.saturating_mul(1_000);
        Self {
            models: BTreeMap::new(),
            clusters: Vec::new(),
            cluster_header: CLUSTER_HEADER.default.to_string(),
            probe_interval_ms: ms(PROBE_INTERVAL_S.default),
            probe_timeout_ms: PROBE_TIMEOUT_MS.default,
            eject_after_failures: EJECT_AFTER_FAILURES.default,
            eject_ms: ms(EJECT_S.default),
            max_eject_ms: ms(MAX_EJECT_S.default.max(EJECT_S.default)),
            ramp_ms: ms(RAMP_S.default),
            ewma_half_life_ms: EWMA_HALF_LIFE_S.default * 1_000.0,
            rules: Vec::new(),
            failover: FAILOVER.default,
            hedge: Some(HedgeConfig {
                priorities: HEDGE_PRIORITIES.default.to_vec(),
                min_delay_ms: HEDGE_MIN_DELAY_MS.default,
                max_ratio: HEDGE_MAX_RATIO.default,
            }),
            affinity: AffinityConfig::default(),
            prompt_cache: PromptCacheConfig::default(),
            fallbacks: Chains::new(),
        }
    }
}

impl RoutingConfig {
    /// Adds the models the table names to `out`: its keys, what each backend
    /// is sent, the aliases its rules match, the models of its fallback
    /// chains.
    pub fn named_models<'a>(&'a self, out: &mut Vec<&'a str>) {
        for (model, backends) in &self.models {
            out.push(model);
            out.extend(backends.iter().filter_map(|b| b.model.as_deref()));
        }
        for rule in &self.rules {
            out.push(&rule.model);
            out.extend(rule.when.models.iter().flatten().map(String::as_str));
        }
        for (model, chain) in &self.fallbacks {
            out.push(model);
            out.extend(chain.to.iter().map(String::as_str));
        }
    }

    /// Compiles the section, one error per broken invariant, naming the field
    /// relative to the section (`models.gpt-4o[1].weight`) and the bad value.
    pub fn compile(raw: RawRoutingConfig) -> Result<Self, ConfigError> {
        let cluster_header = compile_cluster_header(raw.cluster_header)?;
        // Health: probes, ejection, averaging.
        let probe_interval_s = PROBE_INTERVAL_S.read(raw.probe_interval_s)?;
        let probe_timeout_ms = PROBE_TIMEOUT_MS.read(raw.probe_timeout_ms)?;
        let eject_after_failures = EJECT_AFTER_FAILURES.read(raw.eject_after_failures)?;
        let eject_s = EJECT_S.read(raw.eject_s)?;
        let max_eject_s = check::in_range(
            MAX_EJECT_S.name,
            raw.max_eject_s.unwrap_or(MAX_EJECT_S.default.max(eject_s)),
            eject_s..=MAX_EJECT_S_VALUE,
        )?;
        let ramp_s = RAMP_S.read(raw.ramp_s)?;
        let half_life_s = EWMA_HALF_LIFE_S.read(raw.ewma_half_life_s)?;
        // Hedging, then the model table and the rules that pick in it.
        let hedge = HedgeConfig::compile(raw.hedge).map_err(|e| e.within("hedge"))?;
        let affinity = AffinityConfig::compile(raw.affinity).map_err(|e| e.within("affinity"))?;
        let prompt_cache =
            PromptCacheConfig::compile(&raw.prompt_cache).map_err(|e| e.within("prompt_cache"))?;
        let (models, clusters) = compile_models(raw.models)?;
        let rules = compile_rules(raw.rules, &models)?;
        let fallbacks = fallback::compile(&raw.fallbacks, &|m| models.contains_key(m))
            .map_err(|e| e.within("fallbacks"))?;
        check_fallback_shapes(&models, &fallbacks)?;
        Ok(Self {
            models,
            clusters,
            cluster_header,
            // The bounds above keep these products small.
            probe_interval_ms: probe_interval_s.saturating_mul(1_000),
            probe_timeout_ms,
            eject_after_failures,
            eject_ms: eject_s.saturating_mul(1_000),
            max_eject_ms: max_eject_s.saturating_mul(1_000),
            ramp_ms: ramp_s.saturating_mul(1_000),
            ewma_half_life_ms: half_life_s * 1_000.0,
            rules,
            failover: FAILOVER.or(raw.failover),
            hedge,
            affinity,
            prompt_cache,
            fallbacks,
        })
    }

    /// The backends of a model, `None` when the model is not routed.
    pub fn backends(&self, model: &str) -> Option<&[Backend]> {
        self.models.get(model).map(Vec::as_slice)
    }
}

impl HedgeConfig {
    /// Compiles `routing.hedge`: priorities (all three by default), the
    /// shortest delay and the cap; `None` (no hedging) when it names no
    /// priority or caps hedges at 0. Errors name fields relative to it.
    pub fn compile(raw: RawHedge) -> Result<Option<Self>, ConfigError> {
        let hedge = Self {
            min_delay_ms: HEDGE_MIN_DELAY_MS.read(raw.min_delay_ms)?,
            max_ratio: HEDGE_MAX_RATIO.read(raw.max_ratio)?,
            priorities: HEDGE_PRIORITIES.or(raw.priorities),
        };
        Ok((!hedge.priorities.is_empty() && hedge.max_ratio > 0.0).then_some(hedge))
    }
}

/// `cluster_header`: a lowercase header name.
fn compile_cluster_header(raw: Option<String>) -> Result<String, ConfigError> {
    let header = CLUSTER_HEADER.or_string(raw);
    if !check::is_header_name(&header) {
        return Err(ConfigError::new(
            CLUSTER_HEADER.name,
            format!("{header:?} is not a lowercase HTTP header name"),
        ));
    }
    Ok(header)
}

type Models = BTreeMap<String, Vec<Backend>>;

/// Every API a model whose backends all declare theirs is called in, some
/// backend of each model of its fallback chain speaks too: a call moved on
/// leaves in the shape it came in.
fn check_fallback_shapes(models: &Models, chains: &Chains) -> Result<(), ConfigError> {
    let speaks = |model: &str, api: Dialect| {
        models.get(model).is_some_and(|bs| {
            bs.iter().any(|b| {
                b.speaks
                    .as_ref()
                    .is_none_or(|s| s.iter().any(|s| s.api == api))
            })
        })
    };
    for (model, chain) in chains {
        let Some(backends) = models.get(model) else {
            continue;
        };
        let declared = backends.iter().filter_map(|b| b.speaks.as_ref()).flatten();
        for api in declared.map(|s| s.api) {
            if let Some(to) = chain.to.iter().find(|to| !speaks(to, api)) {
                return Err(ConfigError::new(
                    format!("fallbacks.{model}.to"),
                    format!(
                        "{to:?} has no backend that speaks {}, as {model:?} does",
                        api.api()
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn compile_models(
    raw: BTreeMap<String, Vec<RawBackend>>,
) -> Result<(Models, Vec<ClusterTarget>), ConfigError> {
    let mut probes = Probes::default();
    let mut models = BTreeMap::new();
    for (model, backends) in raw {
        let at = format!("models.{model}");
        if !check::is_name(&model) {
            return Err(ConfigError::new(
                at,
                format!("{model:?} is not a model name"),
            ));
        }
        if backends.is_empty() {
            return Err(ConfigError::new(at, "lists no backend"));
        }
        let mut out: Vec<Backend> = Vec::with_capacity(backends.len());
        for (i, b) in backends.into_iter().enumerate() {
            let backend = compile_backend(&format!("{at}[{i}]"), b, &out, &mut probes)?;
            out.push(backend);
        }
        models.insert(model, out);
    }
    // Calls to a cluster carry the same authority as its probes.
    for b in models.values_mut().flatten() {
        b.authority = probes.authority(&b.cluster);
    }
    Ok((models, probes.into_targets()))
}

/// One backend of a model, `siblings` being those listed before it; its probe
/// settings go to `probes`. The authority is filled in once every listing of
/// its cluster is known.
fn compile_backend(
    at: &str,
    b: RawBackend,
    siblings: &[Backend],
    probes: &mut Probes,
) -> Result<Backend, ConfigError> {
    check_cluster(&format!("{at}.cluster"), &b.cluster, siblings)?;
    let weight = WEIGHT.read(b.weight).map_err(|e| e.within(at))?;
    if let Some(m) = b.model.as_ref().filter(|m| !check::is_name(m)) {
        return Err(ConfigError::new(
            format!("{at}.model"),
            format!("{m:?} is not a model name"),
        ));
    }
    if let Some(a) = b.authority.as_ref().filter(|a| !check::is_authority(a)) {
        return Err(ConfigError::new(
            format!("{at}.authority"),
            format!("{a:?} is not a host[:port]"),
        ));
    }
    for (field, path) in [
        ("health_path", &b.health_path),
        ("metrics_path", &b.metrics_path),
    ] {
        if let Some(p) = path.as_ref().filter(|p| !check::is_path(p)) {
            return Err(ConfigError::new(
                format!("{at}.{field}"),
                format!("{p:?} is not an absolute path"),
            ));
        }
    }
    probes.merge(at, &b)?;
    let (provider, speaks) = compile_speaks(at, b.provider, b.apis, b.paths)?;
    Ok(Backend {
        cluster: b.cluster,
        weight,
        model: b.model,
        authority: None,
        prompt_cache_key: PROMPT_CACHE_KEY.or(b.prompt_cache_key),
        provider,
        speaks,
    })
}

/// What a backend speaks: its preset's APIs (or `apis`), each on its
/// preset's path or the one `paths` gives; nothing declared: every API.
fn compile_speaks(
    at: &str,
    provider: Option<String>,
    apis: Option<Vec<String>>,
    paths: Option<BTreeMap<String, String>>,
) -> Result<(Option<&'static str>, Option<Vec<Serves>>), ConfigError> {
    let err =
        |field: &str, message: &'static str| ConfigError::new(format!("{at}.{field}"), message);
    let preset = match provider.as_deref() {
        None => None,
        Some(name) => {
            Some(provider::preset(name).ok_or_else(|| err("provider", provider::UNKNOWN))?)
        }
    };
    let paths = paths.unwrap_or_default();
    let apis: Vec<String> = match (apis, preset) {
        (Some(apis), _) => apis,
        (None, Some(p)) => p
            .endpoints
            .iter()
            .map(|e| e.api.api().to_string())
            .collect(),
        (None, None) if paths.is_empty() => return Ok((None, None)),
        (None, None) => paths.keys().cloned().collect(),
    };
    let mut speaks: Vec<Serves> = Vec::with_capacity(apis.len());
    for name in &apis {
        let api = Dialect::named(name)
            .filter(|d| *d != Dialect::Other && !speaks.iter().any(|s| s.api == *d))
            .ok_or_else(|| err("apis", "lists an unknown API, `other` or an API twice"))?;
        let endpoint = preset.and_then(|p| p.endpoint(api));
        let path = match (paths.get(name), endpoint) {
            (Some(p), _) => Some(p.as_str()),
            (None, Some(e)) => Some(e.path),
            (None, None) if preset.is_some() => {
                return Err(err(
                    "apis",
                    "names an API its preset does not serve: give its path under `paths`",
                ))
            }
            (None, None) => None,
        };
        let field = || match paths.contains_key(name) {
            true => format!("paths.{name}"),
            false => "provider".to_string(),
        };
        let streams = endpoint.map_or(Streams::Same, |e| e.streams);
        let stream_path = match (path, streams) {
            (Some(p), Streams::Same) => Some(p.to_string()),
            (Some(p), Streams::Verb(from, to)) => {
                let head = p.strip_suffix(from).ok_or_else(|| {
                    err(
                        &field(),
                        "does not end with the preset's verb (`:rawPredict`, `:generateContent`)",
                    )
                })?;
                Some([head, to].concat())
            }
            _ => None,
        };
        if let Some(p) = path {
            if p.replacen(provider::MODEL, "", 1).contains(['{', '}']) || !check::is_path(p) {
                return Err(err(&field(), "is no absolute path with no placeholder but `{model}` (Vertex's: write yours under `paths`)"));
            }
        }
        speaks.push(Serves {
            api,
            path: path.map(str::to_string),
            stream_path,
            version: endpoint.and_then(|e| e.version),
        });
    }
    if let Some(k) = paths.keys().find(|k| !apis.contains(k)) {
        return Err(err(
            &format!("paths.{k}"),
            "names an API the backend does not serve",
        ));
    }
    Ok((preset.map(|p| p.name), Some(speaks)))
}

fn check_cluster(field: &str, cluster: &str, siblings: &[Backend]) -> Result<(), ConfigError> {
    if cluster.is_empty() {
        return Err(ConfigError::new(field, "is required"));
    }
    if !check::is_cluster(cluster) {
        return Err(ConfigError::new(
            field,
            format!(
                "{cluster:?} is not a cluster name ([A-Za-z0-9_.|-], at most {})",
                check::MAX_CLUSTER_LEN
            ),
        ));
    }
    if siblings.iter().any(|o| o.cluster == cluster) {
        return Err(ConfigError::new(
            field,
            format!("{cluster:?} is listed twice for this model"),
        ));
    }
    Ok(())
}

/// Probe settings of one cluster as merged from all its listings; `None`
/// fields were not given anywhere yet.
#[derive(Default)]
struct Merged {
    authority: Option<String>,
    health_path: Option<String>,
    metrics_path: Option<String>,
}

/// The probe settings of every cluster, in the order clusters were first
/// listed. A cluster may serve several models; it is probed once and its
/// health is shared, so its probe settings must agree wherever they are given.
#[derive(Default)]
struct Probes {
    order: Vec<String>,
    merged: BTreeMap<String, Merged>,
}

impl Probes {
    /// Adds the settings of one listing of a cluster, refusing one that
    /// contradicts another listing.
    fn merge(&mut self, at: &str, b: &RawBackend) -> Result<(), ConfigError> {
        if !self.merged.contains_key(&b.cluster) {
            self.order.push(b.cluster.clone());
        }
        let m = self.merged.entry(b.cluster.clone()).or_default();
        for (field, mine, theirs) in [
            ("authority", &b.authority, &mut m.authority),
            ("health_path", &b.health_path, &mut m.health_path),
            ("metrics_path", &b.metrics_path, &mut m.metrics_path),
        ] {
            match (mine, theirs.as_ref()) {
                (Some(a), Some(b)) if a != b => {
                    return Err(ConfigError::new(
                        format!("{at}.{field}"),
                        format!("{a:?} differs from {b:?} given for the same cluster elsewhere"),
                    ))
                }
                (Some(a), None) => *theirs = Some(a.clone()),
                _ => {}
            }
        }
        Ok(())
    }

    fn authority(&self, cluster: &str) -> Option<String> {
        self.merged.get(cluster).and_then(|m| m.authority.clone())
    }

    fn into_targets(mut self) -> Vec<ClusterTarget> {
        self.order
            .into_iter()
            .map(|cluster| {
                let m = self.merged.remove(&cluster).unwrap_or_default();
                ClusterTarget {
                    cluster,
                    authority: m.authority,
                    health_path: HEALTH_PATH.or_string(m.health_path),
                    metrics_path: m.metrics_path,
                }
            })
            .collect()
    }
}

fn compile_rules(raw: Vec<RawRule>, models: &Models) -> Result<Vec<Rule>, ConfigError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, r)| compile_rule(&format!("rules[{i}]"), r, models))
        .collect()
}

fn compile_rule(at: &str, r: RawRule, models: &Models) -> Result<Rule, ConfigError> {
    if r.model.is_empty() {
        return Err(ConfigError::new(format!("{at}.model"), "is required"));
    }
    // A chosen model must be routable, or the rule would silently send
    // calls for a name nobody serves.
    if !models.contains_key(&r.model) {
        return Err(ConfigError::new(
            format!("{at}.model"),
            format!("{:?} is not a model of routing.models", r.model),
        ));
    }
    Ok(Rule {
        when: compile_when(&format!("{at}.when"), r.when)?,
        model: r.model,
    })
}

fn compile_when(at: &str, w: RawWhen) -> Result<When, ConfigError> {
    let models = match w.model {
        None => None,
        Some(m) => {
            let field = format!("{at}.model");
            let names = non_empty(&field, m)?;
            if let Some(bad) = names.iter().find(|n| !check::is_name(n)) {
                return Err(ConfigError::new(
                    field,
                    format!("{bad:?} is not a model name"),
                ));
            }
            Some(names)
        }
    };
    let priorities = match w.priority {
        None => None,
        Some(p) => {
            let field = format!("{at}.priority");
            let parsed = non_empty(&field, p)?
                .into_iter()
                .map(Priority::try_from)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| ConfigError::new(field, m))?;
            Some(parsed)
        }
    };
    if let (Some(min), Some(max)) = (w.min_prompt_tokens, w.max_prompt_tokens) {
        if max < min {
            return Err(ConfigError::new(
                format!("{at}.max_prompt_tokens"),
                format!("{max} is below min_prompt_tokens {min}"),
            ));
        }
    }
    Ok(When {
        models,
        min_prompt_tokens: w.min_prompt_tokens,
        max_prompt_tokens: w.max_prompt_tokens,
        priorities,
        tools: w.tools,
        stream: w.stream,
    })
}

/// The values of a condition; an empty list is refused, as it would never match.
fn non_empty(field: &str, values: OneOrMany) -> Result<Vec<String>, ConfigError> {
    let values = values.into_vec();
    if values.is_empty() {
        return Err(ConfigError::new(field, "an empty list never matches"));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<RoutingConfig, ConfigError> {
        let raw: RawRoutingConfig = serde_json::from_str(json).unwrap();
        RoutingConfig::compile(raw).map_err(|e| e.within("routing"))
    }

    /// The Claude of three clouds, the Vertex paths written in full.
    const CLAUDE: &str = r#"{"models": {
      "claude": [
        {"cluster": "anthropic", "provider": "anthropic"},
        {"cluster": "bedrock", "provider": "bedrock", "model": "anthropic.claude-sonnet-4-5-v1:0"},
        {"cluster": "vertex", "provider": "vertex", "apis": ["messages"],
         "paths": {"messages": "/v1/projects/p/locations/l/publishers/anthropic/models/{model}:rawPredict"}}
      ],
      "gpt": [{"cluster": "openai", "provider": "openai"}, {"cluster": "self"}]
    }}"#;

    #[test]
    fn a_backend_speaks_its_preset_or_what_it_says() {
        let c = parse(CLAUDE).unwrap();
        let b = c.backends("claude").unwrap();
        assert_eq!(b[0].provider, Some("anthropic"));
        let m = b[0].serving(Dialect::Messages, true).unwrap().unwrap();
        assert_eq!(m.path(true), Some(Some("/v1/messages")));
        assert_eq!(
            m.version,
            Some(Version::Header("anthropic-version", "2023-06-01"))
        );
        assert!(b[0].serving(Dialect::Chat, false).is_none());
        // Bedrock's InvokeModel: no stream in Messages' shape.
        let m = b[1].serving(Dialect::Messages, false).unwrap().unwrap();
        assert_eq!(m.path(false), Some(Some("/model/{model}/invoke")));
        assert!(b[1].serving(Dialect::Messages, true).is_none());
        assert!(b[1].serving(Dialect::Chat, true).is_some());
        // Vertex: the operator's path, its stream by the verb; only Messages.
        let m = b[2].serving(Dialect::Messages, true).unwrap().unwrap();
        assert_eq!(
            m.path(true),
            Some(Some(
                "/v1/projects/p/locations/l/publishers/anthropic/models/{model}:streamRawPredict"
            ))
        );
        assert!(b[2].serving(Dialect::Gemini, false).is_none());
        // Nothing declared: every API, as it came.
        let gpt = c.backends("gpt").unwrap();
        assert_eq!(gpt[1].serving(Dialect::Messages, true), Some(None));
        assert!(gpt[0].serving(Dialect::Messages, false).is_none());
    }

    #[test]
    fn what_a_backend_cannot_speak_is_refused_by_field() {
        let one = |b: &str| {
            parse(&format!(r#"{{"models": {{"m": [{b}]}}}}"#))
                .unwrap_err()
                .field
        };
        for (backend, field) in [
            (
                r#"{"cluster": "a", "provider": "aws"}"#,
                "routing.models.m[0].provider",
            ),
            (
                r#"{"cluster": "a", "provider": "vertex"}"#,
                "routing.models.m[0].provider",
            ),
            (
                r#"{"cluster": "a", "provider": "anthropic", "apis": ["chat"]}"#,
                "routing.models.m[0].apis",
            ),
            (
                r#"{"cluster": "a", "apis": ["messages", "messages"]}"#,
                "routing.models.m[0].apis",
            ),
            (
                r#"{"cluster": "a", "apis": ["other"]}"#,
                "routing.models.m[0].apis",
            ),
            (
                r#"{"cluster": "a", "provider": "openai", "paths": {"messages": "/m"}}"#,
                "routing.models.m[0].paths.messages",
            ),
            (
                r#"{"cluster": "a", "paths": {"chat": "v1/chat"}}"#,
                "routing.models.m[0].paths.chat",
            ),
            (
                r#"{"cluster": "a", "paths": {"chat": "/{deployment}/chat"}}"#,
                "routing.models.m[0].paths.chat",
            ),
            (
                r#"{"cluster": "a", "provider": "vertex", "apis": ["messages"], "paths": {"messages": "/x/{model}:predict"}}"#,
                "routing.models.m[0].paths.messages",
            ),
        ] {
            assert_eq!(one(backend), field, "{backend}");
        }
        // A chain moves a Messages call only to a model that speaks it.
        let chain = CLAUDE.replacen(
            r#""models""#,
            r#""fallbacks": {"claude": {"to": ["gpt"]}}, "models""#,
            1,
        );
        let gpt_only = chain.replace(r#", {"cluster": "self"}"#, "");
        let e = parse(&gpt_only).unwrap_err();
        assert_eq!(e.field, "routing.fallbacks.claude.to");
        assert!(e.to_string().contains("messages"), "{e}");
        // A backend of any shape in the chain's model takes it.
        assert!(parse(&chain).is_ok());
        // Azure's dated deployment path, the model in it.
        let azure = r#"{"cluster": "a", "provider": "azure_openai", "apis": ["chat"],
            "paths": {"chat": "/openai/deployments/{model}/chat/completions?api-version=2024-10-21"}}"#;
        let c = parse(&format!(r#"{{"models": {{"m": [{azure}]}}}}"#)).unwrap();
        let s = c.backends("m").unwrap()[0]
            .serving(Dialect::Chat, true)
            .unwrap()
            .unwrap();
        assert_eq!(s.path(true), s.path(false));
    }

    #[test]
    fn empty_section_routes_nothing() {
        let c = parse("{}").unwrap();
        assert_eq!(c, RoutingConfig::default());
        assert!(c.models.is_empty() && c.clusters.is_empty());
        assert_eq!(c.cluster_header, "x-llm-cluster");
        assert_eq!(c.probe_interval_ms, 5_000);
        assert_eq!(c.probe_timeout_ms, 2_000);
        assert_eq!(c.eject_after_failures, 3);
        assert_eq!(c.eject_ms, 10_000);
        assert_eq!(c.max_eject_ms, 300_000);
        assert_eq!(c.ramp_ms, 20_000);
        assert_eq!(c.ewma_half_life_ms, 10_000.0);
        assert_eq!(c.backends("gpt-4o"), None);
    }

    #[test]
    fn reads_every_field() {
        let c = parse(
            r#"{
              "models": {
                "gpt-4o": [
                  {"cluster": "openai", "weight": 3, "authority": "api.openai.com"},
                  {"cluster": "azure-east", "model": "gpt-4o-2024-08-06",
                   "health_path": "/health", "metrics_path": "/metrics"}
                ],
                "gpt-4o-mini": [{"cluster": "openai"}]
              },
              "cluster_header": "x-route-to",
              "probe_interval_s": 2, "probe_timeout_ms": 500,
              "eject_after_failures": 5, "eject_s": 4, "max_eject_s": 60,
              "ramp_s": 0, "ewma_half_life_s": 2.5,
              "rules": [
                {"when": {"model": ["auto", "smart"], "min_prompt_tokens": 8000,
                          "priority": "p0", "tools": true, "stream": false},
                 "model": "gpt-4o"},
                {"when": {"model": "auto"}, "model": "gpt-4o-mini"}
              ]
            }"#,
        )
        .unwrap();
        let b = c.backends("gpt-4o").unwrap();
        assert_eq!(
            b[0],
            Backend {
                cluster: "openai".into(),
                weight: 3,
                model: None,
                authority: Some("api.openai.com".into()),
                prompt_cache_key: false,
                provider: None,
                speaks: None,
            }
        );
        assert_eq!(b[1].weight, 1);
        assert_eq!(b[1].model.as_deref(), Some("gpt-4o-2024-08-06"));
        // The authority given once applies to every listing of the cluster.
        assert_eq!(
            c.backends("gpt-4o-mini").unwrap()[0].authority.as_deref(),
            Some("api.openai.com")
        );
        assert_eq!(c.clusters.len(), 2);
        let azure = c
            .clusters
            .iter()
            .find(|t| t.cluster == "azure-east")
            .unwrap();
        assert_eq!(azure.health_path, "/health");
        assert_eq!(azure.metrics_path.as_deref(), Some("/metrics"));
        let openai = c.clusters.iter().find(|t| t.cluster == "openai").unwrap();
        assert_eq!(openai.health_path, DEFAULT_HEALTH_PATH);
        assert_eq!(c.cluster_header, "x-route-to");
        assert_eq!(
            (
                c.probe_interval_ms,
                c.probe_timeout_ms,
                c.eject_after_failures
            ),
            (2_000, 500, 5)
        );
        assert_eq!((c.eject_ms, c.max_eject_ms, c.ramp_ms), (4_000, 60_000, 0));
        assert_eq!(c.ewma_half_life_ms, 2_500.0);
        assert_eq!(c.rules.len(), 2);
        let w = &c.rules[0].when;
        assert_eq!(
            w.models.as_deref(),
            Some(&["auto".to_string(), "smart".to_string()][..])
        );
        assert_eq!(w.priorities.as_deref(), Some(&[Priority::P0][..]));
        assert_eq!(
            (w.min_prompt_tokens, w.max_prompt_tokens),
            (Some(8000), None)
        );
        assert_eq!((w.tools, w.stream), (Some(true), Some(false)));
        assert_eq!(
            c.rules[1].when.models.as_deref(),
            Some(&["auto".to_string()][..])
        );
    }

    #[test]
    fn istio_cluster_names_are_accepted() {
        let c =
            parse(r#"{"models":{"m":[{"cluster":"outbound|8000||vllm.ns.svc.cluster.local"}]}}"#)
                .unwrap();
        assert_eq!(
            c.clusters[0].cluster,
            "outbound|8000||vllm.ns.svc.cluster.local"
        );
    }

    #[test]
    fn long_eject_raises_the_default_cap() {
        let c = parse(r#"{"eject_s": 600}"#).unwrap();
        assert_eq!((c.eject_ms, c.max_eject_ms), (600_000, 600_000));
    }

    #[test]
    fn errors_name_the_field_and_value() {
        for (doc, field, needle) in [
            (
                r#"{"models":{"gpt-4o":[{"cluster":"a"},{"cluster":"b","weight":0}]}}"#,
                "routing.models.gpt-4o[1].weight",
                "0",
            ),
            (
                r#"{"models":{"m":[{"weight":2}]}}"#,
                "routing.models.m[0].cluster",
                "required",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a b"}]}}"#,
                "routing.models.m[0].cluster",
                "\"a b\"",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a"},{"cluster":"a"}]}}"#,
                "routing.models.m[1].cluster",
                "twice",
            ),
            (r#"{"models":{"m":[]}}"#, "routing.models.m", "no backend"),
            (
                r#"{"models":{"":[{"cluster":"a"}]}}"#,
                "routing.models.",
                "model name",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a","model":""}]}}"#,
                "routing.models.m[0].model",
                "\"\"",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a","authority":"x/y"}]}}"#,
                "routing.models.m[0].authority",
                "x/y",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a","health_path":"health"}]}}"#,
                "routing.models.m[0].health_path",
                "health",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a","metrics_path":"/a b"}]}}"#,
                "routing.models.m[0].metrics_path",
                "/a b",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a","health_path":"/x"}],"n":[{"cluster":"a","health_path":"/y"}]}}"#,
                "routing.models.n[0].health_path",
                "/y",
            ),
            (
                r#"{"cluster_header":"X-Cluster"}"#,
                "routing.cluster_header",
                "X-Cluster",
            ),
            (
                r#"{"cluster_header":":authority"}"#,
                "routing.cluster_header",
                ":authority",
            ),
            (r#"{"cluster_header":""}"#, "routing.cluster_header", "\"\""),
            (r#"{"probe_interval_s":0}"#, "routing.probe_interval_s", "0"),
            (r#"{"probe_timeout_ms":0}"#, "routing.probe_timeout_ms", "0"),
            (
                r#"{"eject_after_failures":0}"#,
                "routing.eject_after_failures",
                "0",
            ),
            (r#"{"eject_s":0}"#, "routing.eject_s", "0"),
            (
                r#"{"eject_s":20,"max_eject_s":10}"#,
                "routing.max_eject_s",
                "10",
            ),
            (r#"{"ramp_s":99999}"#, "routing.ramp_s", "99999"),
            (r#"{"ewma_half_life_s":0}"#, "routing.ewma_half_life_s", "0"),
            (
                r#"{"ewma_half_life_s":-1.5}"#,
                "routing.ewma_half_life_s",
                "-1.5",
            ),
            (
                r#"{"rules":[{"when":{},"model":"nope"}]}"#,
                "routing.rules[0].model",
                "nope",
            ),
            (
                r#"{"rules":[{"when":{}}]}"#,
                "routing.rules[0].model",
                "required",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a"}]},"rules":[{"when":{"priority":["P1","P9"]},"model":"m"}]}"#,
                "routing.rules[0].when.priority",
                "P9",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a"}]},"rules":[{"when":{"model":[]},"model":"m"}]}"#,
                "routing.rules[0].when.model",
                "empty",
            ),
            (
                r#"{"models":{"m":[{"cluster":"a"}]},"rules":[{"when":{"min_prompt_tokens":10,"max_prompt_tokens":5},"model":"m"}]}"#,
                "routing.rules[0].when.max_prompt_tokens",
                "5",
            ),
        ] {
            let e = parse(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
            assert!(e.to_string().contains(needle), "{doc}: {e}");
        }
    }

    #[test]
    fn raw_section_is_strict() {
        for doc in [
            r#"{"bogus":1}"#,
            r#"{"models":{"m":[{"cluster":"a","wieght":1}]}}"#,
            r#"{"rules":[{"when":{"modle":"auto"},"model":"m"}]}"#,
            r#"{"rules":[{"when":{"model":3},"model":"m"}]}"#,
            r#"{"models":{"m":[{"cluster":"a","weight":-1}]}}"#,
        ] {
            assert!(
                serde_json::from_str::<RawRoutingConfig>(doc).is_err(),
                "{doc}"
            );
        }
        let e = serde_json::from_str::<RawRoutingConfig>(
            r#"{"rules":[{"when":{"model":3},"model":"m"}]}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("a string or a list of strings"),
            "{e}"
        );
    }
}
