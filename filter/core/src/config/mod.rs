//! The plugin configuration: one JSON document, parsed strictly (unknown fields
//! refused) and compiled into typed values once, so the data path never meets
//! a half-valid setting and an operator's typo is named at load time.

pub mod check;
pub mod error;
pub mod names;
pub mod per_priority;
pub mod read;
pub mod service;
pub mod setting;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::ab::{self, AbConfig, RawAbConfig};
use crate::admin::config::{AdminConfig, RawAdminConfig};
use crate::budget::config::{BudgetConfig, RawBudgetConfig};
use crate::build::{AB, ADMIN, CACHE, CREDENTIALS, GUARDRAILS, LIMITS, ROUTING, SPANS};
use crate::cache::config::{CacheConfig, RawCacheConfig};
use crate::credentials::{CredentialsConfig, RawCredentialsConfig};
use crate::degrade::config::{DegradeConfig, RawDegradeConfig};
use crate::dialect::{Dialect, LlmPath, DEFAULT_PATHS};
use crate::guard::policy::{Guardrails, RawGuardrails};
use crate::identity::config::{RawTenant, TenantConfig};
use crate::json::Json;
use crate::limits::config::{LimitsConfig, RawLimitsConfig};
use crate::priority::Priority;
use crate::routing::config::{RawRoutingConfig, RoutingConfig};
use crate::shaping::{RawShapingConfig, ShapingConfig};
use crate::spans::config::{CaptureConfig, OtlpConfig, RawCapture, RawOtlp};

pub use error::ConfigError;
pub use names::Names;
use read::Read;
use setting::{List, Named, Setting};

/// Default bound of a request body the filter holds to decide on it: Envoy's
/// default per-connection buffer limit, past which holding it earns a 413.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// `max_body_bytes`: 1 B to 64 MiB.
const MAX_BODY_BYTES: Setting<usize> =
    Setting::range("max_body_bytes", DEFAULT_MAX_BODY_BYTES, 1, 64 << 20);
/// `llm_paths`: the paths of every dialect but `other`.
const LLM_PATHS: List<&str> = List::new("llm_paths", &DEFAULT_PATHS);
/// `priority.default`.
const DEFAULT_PRIORITY: Setting<Priority> = Setting::any("default", Priority::P1);
/// `priority.trust_client`: the client's `x-request-priority` is honoured
/// unless told otherwise.
const TRUST_CLIENT: Setting<bool> = Setting::any("trust_client", true);
/// `tracing.mode`.
const TRACING_MODE: Named<TracingMode> = Named {
    name: "mode",
    default: TracingMode::Always,
    spell: TracingMode::as_str,
};
/// `access_log.enabled`.
const ACCESS_LOG: Setting<bool> = Setting::any("enabled", false);

/// The document's own settings, by the path of the object that holds them.
pub const SETTINGS: setting::Table = &[
    ("", &[&LLM_PATHS, &MAX_BODY_BYTES]),
    ("priority", &[&DEFAULT_PRIORITY, &TRUST_CLIENT]),
    ("tracing", &[&TRACING_MODE]),
    ("access_log", &[&ACCESS_LOG]),
];

/// Every section's tables.
pub const SECTIONS: &[setting::Table] = &[
    SETTINGS,
    crate::spans::config::SETTINGS,
    crate::routing::config::SETTINGS,
    crate::budget::config::SETTINGS,
    crate::cache::config::SETTINGS,
    crate::degrade::config::SETTINGS,
    crate::admin::config::SETTINGS,
    crate::credentials::SETTINGS,
    crate::guard::policy::SETTINGS,
    crate::shaping::config::SETTINGS,
    crate::limits::config::SETTINGS,
    crate::identity::config::SETTINGS,
    crate::ab::SETTINGS,
];

/// The document as written by the operator.
#[derive(Debug, Default)]
pub struct RawConfig {
    /// Paths of LLM calls (POST), each of the dialect its ending names.
    pub llm_paths: Option<Vec<String>>,
    /// The dialect of paths whose ending does not name it; each is an LLM
    /// path too.
    pub llm_apis: Option<BTreeMap<String, String>>,
    /// Priority section.
    pub priority: RawPriority,
    /// Tracing section.
    pub tracing: RawTracing,
    /// The access-log record of each call.
    pub access_log: RawAccessLog,
    /// Largest request body held to decide on it.
    pub max_body_bytes: Option<usize>,
    /// Routing section.
    pub routing: RawRoutingConfig,
    /// Budget section.
    pub budget: RawBudgetConfig,
    /// Cache section.
    pub cache: RawCacheConfig,
    /// Degrade section.
    pub degrade: RawDegradeConfig,
    /// Admin endpoints section.
    pub admin: RawAdminConfig,
    /// Shaping section.
    pub shaping: RawShapingConfig,
    /// A/B groups section.
    pub ab: RawAbConfig,
    /// Limits section.
    pub limits: RawLimitsConfig,
    /// Who a call's tenant is.
    pub tenant: RawTenant,
    /// Which backends the mesh puts the provider's credential on.
    pub credentials: RawCredentialsConfig,
    /// What is looked for in a prompt, and done with what is found.
    pub guardrails: RawGuardrails,
}

/// The document's members.
const FIELDS: &[&str] = &[
    "llm_paths",
    "llm_apis",
    "priority",
    "tracing",
    "access_log",
    "max_body_bytes",
    "routing",
    "budget",
    "cache",
    "degrade",
    "admin",
    "shaping",
    "ab",
    "limits",
    "tenant",
    "credentials",
    "guardrails",
];

impl Read for RawConfig {
    fn read(doc: &Value) -> Result<Self, ConfigError> {
        let mut raw = Self::default();
        for (name, v) in read::fields(doc, FIELDS)? {
            let at = |e: ConfigError| e.within(name);
            match name {
                "llm_paths" => raw.llm_paths = Read::read(v).map_err(at)?,
                "llm_apis" => raw.llm_apis = Read::read(v).map_err(at)?,
                "priority" => raw.priority = Read::read(v).map_err(at)?,
                "tracing" => raw.tracing = Read::read(v).map_err(at)?,
                "access_log" => raw.access_log = Read::read(v).map_err(at)?,
                "max_body_bytes" => raw.max_body_bytes = Read::read(v).map_err(at)?,
                "budget" => raw.budget = Read::read(v).map_err(at)?,
                "degrade" => raw.degrade = Read::read(v).map_err(at)?,
                "shaping" => raw.shaping = Read::read(v).map_err(at)?,
                "tenant" => raw.tenant = Read::read(v).map_err(at)?,
                // A build without a section's feature never reads it
                // (`build` refused a document naming it), so its reader is
                // not in the module. The sections of the gateway tier's
                // features keep their derived readers, handed the
                // section's text (serde's words and paths, as before).
                "routing" if ROUTING => raw.routing = read::derived(v).map_err(at)?,
                "cache" if CACHE => raw.cache = read::derived(v).map_err(at)?,
                "ab" if AB => raw.ab = read::derived(v).map_err(at)?,
                "admin" if ADMIN => raw.admin = Read::read(v).map_err(at)?,
                "limits" if LIMITS => raw.limits = read::derived(v).map_err(at)?,
                "credentials" if CREDENTIALS => raw.credentials = read::derived(v).map_err(at)?,
                "guardrails" if GUARDRAILS => raw.guardrails = read::derived(v).map_err(at)?,
                _ => {}
            }
        }
        Ok(raw)
    }
}

crate::read_fields! {
    /// `priority` as written.
    #[derive(Debug, Default)]
    pub struct RawPriority {
        /// `P0` | `P1` | `P2` in any case, default `P1`.
        pub default: Option<Priority>,
        /// Honour the client's `x-request-priority`, default true.
        pub trust_client: Option<bool>,
    }
}

/// `tracing` as written.
#[derive(Debug, Default)]
pub struct RawTracing {
    /// `always` (default) | `off`.
    pub mode: Option<TracingMode>,
    /// Where the span of each LLM call is exported (OTLP/HTTP).
    pub otlp: Option<RawOtlp>,
    /// What of the prompt and completion the span and the record capture.
    pub capture: RawCapture,
}

impl Read for RawTracing {
    fn read(section: &Value) -> Result<Self, ConfigError> {
        let mut raw = Self::default();
        for (name, v) in read::fields(section, &["mode", "otlp", "capture"])? {
            let at = |e: ConfigError| e.within(name);
            match name {
                "mode" => raw.mode = Read::read(v).map_err(at)?,
                // Read by the build that exports spans only, as above.
                "otlp" if SPANS => raw.otlp = read::derived(v).map_err(at)?,
                "capture" if SPANS => raw.capture = read::derived(v).map_err(at)?,
                _ => {}
            }
        }
        Ok(raw)
    }
}

crate::read_fields! {
    /// `access_log` as written.
    #[derive(Debug, Default)]
    pub struct RawAccessLog {
        /// Put each call's record in Envoy's filter state, default false.
        pub enabled: Option<bool>,
    }
}

/// The compiled configuration every HTTP context shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Paths of LLM calls, each with its dialect.
    pub llm_paths: Vec<LlmPath>,
    /// Priority policy.
    pub priority: PriorityConfig,
    /// Tracing policy.
    pub tracing: TracingMode,
    /// Where the span of each LLM call is exported; `None`: nowhere.
    pub otlp: Option<OtlpConfig>,
    /// What of the prompt and completion the span and the record capture
    /// (nothing unless asked).
    pub capture: CaptureConfig,
    /// Each LLM call's record goes to Envoy's filter state for its access
    /// loggers (`spans::record`).
    pub access_log: bool,
    /// Largest request body held to decide on it; larger or unsized bodies
    /// stream through and skip the body-based features.
    pub max_body_bytes: usize,
    /// Model routing.
    pub routing: RoutingConfig,
    /// Timeout budgets and the breaker.
    pub budget: BudgetConfig,
    /// The response cache.
    pub cache: CacheConfig,
    /// Load-driven degrade.
    pub degrade: DegradeConfig,
    /// The filter's own endpoints.
    pub admin: AdminConfig,
    /// Request shaping.
    pub shaping: ShapingConfig,
    /// A/B groups.
    pub ab: AbConfig,
    /// Request, token and cost limits.
    pub limits: LimitsConfig,
    /// Who a call's tenant is, for every feature that tells tenants apart.
    pub tenant: TenantConfig,
    /// Which backends the mesh puts the provider's credential on.
    pub credentials: CredentialsConfig,
    /// What is looked for in a prompt, and done with what is found.
    pub guardrails: Guardrails,
    /// The models and clusters the sections above name, compiled from them.
    pub names: Names,
}

/// Compiled `priority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityConfig {
    /// Priority of calls without a valid (or trusted) header.
    pub default: Priority,
    /// Honour the client's header.
    pub trust_client: bool,
}

/// Who writes `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TracingMode {
    /// The filter continues or starts the trace on every LLM call.
    #[default]
    Always,
    /// The filter leaves trace headers alone (Envoy's tracer owns them).
    Off,
}

#[cfg(test)]
impl Default for Config {
    /// The empty document, as [`Config::parse`] compiles `{}`.
    fn default() -> Self {
        check::defaults(|raw: RawConfig| Self::try_from(raw))
    }
}

#[cfg(test)]
impl Default for PriorityConfig {
    /// The empty section.
    fn default() -> Self {
        check::defaults(Self::compile)
    }
}

impl PriorityConfig {
    /// Compiles the section; every value serde accepts is valid.
    pub fn compile(raw: RawPriority) -> Result<Self, ConfigError> {
        Ok(Self {
            default: DEFAULT_PRIORITY.or(raw.default),
            trust_client: TRUST_CLIENT.or(raw.trust_client),
        })
    }
}

impl Read for TracingMode {
    fn read(v: &Value) -> Result<Self, ConfigError> {
        read::variant(v, &[Self::Always, Self::Off], Self::as_str)
    }
}

impl TracingMode {
    /// Compiles `tracing.mode`; every value serde accepts is valid.
    pub fn compile(mode: Option<TracingMode>) -> Self {
        TRACING_MODE.default_or(mode)
    }

    /// The document's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "always",
            Self::Off => "off",
        }
    }
}

impl Config {
    /// Parses and compiles a JSON document; empty input means `{}`.
    pub fn parse(json: &[u8]) -> Result<Self, ConfigError> {
        let json = json.trim_ascii();
        let json = if json.is_empty() { &b"{}"[..] } else { json };
        if json.first() != Some(&b'{') {
            return Err(ConfigError::new(
                ".",
                "the configuration must be a JSON object",
            ));
        }
        // One tree, which the build's check and every section read.
        let doc: Value = ConfigError::from_json(json)?;
        // The tree keeps the last of a key written twice; the document
        // means one thing to every reader or is refused.
        if let Some(path) = Json::parse(json).and_then(|j| j.repeated_key()) {
            return Err(ConfigError::new(
                path,
                "the key is written twice in its object (one of the two would be ignored)",
            ));
        }
        crate::build::check(&doc)?;
        Self::try_from(RawConfig::read(&doc)?)
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    /// Compiles a parsed document, checking every invariant; each section
    /// names its fields relative to itself and is prefixed here.
    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let llm_paths = apart((raw.llm_paths, raw.llm_apis), |(p, a)| compile_paths(p, a))?;
        let max_body_bytes = MAX_BODY_BYTES.read(raw.max_body_bytes)?;
        let cache =
            section(CACHE, raw.cache, CacheConfig::compile).map_err(|e| e.within("cache"))?;
        // Groups compile their overrides against the sections as written.
        let base = ab::Base {
            routing: &raw.routing,
            shaping: &raw.shaping,
            cache: cache.enabled,
            degrade: &raw.degrade,
        };
        let ab =
            section(AB, raw.ab, |r| AbConfig::compile(r, &base)).map_err(|e| e.within("ab"))?;
        let mut routing = section(ROUTING, raw.routing, RoutingConfig::compile)
            .map_err(|e| e.within("routing"))?;
        probe_group_clusters(&mut routing, &ab);
        let otlp = raw
            .tracing
            .otlp
            .filter(|_| SPANS)
            .map(|o| apart(o, OtlpConfig::compile).map_err(|e| e.within("tracing.otlp")))
            .transpose()?;
        let access_log = ACCESS_LOG.or(raw.access_log.enabled);
        let mut config = Self {
            llm_paths,
            max_body_bytes,
            routing,
            ab,
            budget: apart(raw.budget, BudgetConfig::compile).map_err(|e| e.within("budget"))?,
            cache,
            shaping: apart(raw.shaping, ShapingConfig::compile).map_err(|e| e.within("shaping"))?,
            degrade: apart(raw.degrade, DegradeConfig::compile).map_err(|e| e.within("degrade"))?,
            admin: section(ADMIN, raw.admin, AdminConfig::compile)
                .map_err(|e| e.within("admin"))?,
            priority: apart(raw.priority, PriorityConfig::compile)
                .map_err(|e| e.within("priority"))?,
            capture: section(SPANS, raw.tracing.capture, |c| {
                compile_capture(c, otlp.as_ref(), access_log)
            })?,
            otlp,
            tracing: TracingMode::compile(raw.tracing.mode),
            access_log,
            limits: section(LIMITS, raw.limits, LimitsConfig::compile)
                .map_err(|e| e.within("limits"))?,
            tenant: apart(raw.tenant, TenantConfig::compile).map_err(|e| e.within("tenant"))?,
            credentials: section(CREDENTIALS, raw.credentials, CredentialsConfig::compile)
                .map_err(|e| e.within("credentials"))?,
            guardrails: section(GUARDRAILS, raw.guardrails, Guardrails::compile)
                .map_err(|e| e.within("guardrails"))?,
            names: Names::default(),
        };
        // Only a build that captures redacts what it captures.
        if SPANS && config.capture.any() {
            config.capture.guarded = config.guardrails.withheld();
        }
        config.names = apart(&config, |c| Ok(names_of(c)))?;
        Ok(config)
    }
}

/// Section `raw` compiled by `compile` when the build has its feature
/// (`has`). Without it the section is never read (`crate::build` refuses a
/// document that names it), so it is the empty section, its `Default`, and
/// its compiler is not in the module.
fn section<R, T: Default>(
    has: bool,
    raw: R,
    compile: impl FnOnce(R) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    match has {
        true => apart(raw, compile),
        false => Ok(T::default()),
    }
}

/// `compile(raw)` as a function of its own in the module: no section's
/// compiler is inlined into the document's. V8 compiles every function of
/// the module with TurboFan when a VM loads and Envoy's allocator keeps
/// what the largest took, so a function of 31 KB costs every proxy about
/// 2 MiB more than its parts would (`make build` refuses a function over
/// `WASM_MAX_FUNCTION_BYTES`; docs/bench.md, "What a function costs").
#[inline(never)]
fn apart<R, T>(
    raw: R,
    compile: impl FnOnce(R) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    compile(raw)
}

/// A cluster only a group routes to is probed like every other.
fn probe_group_clusters(routing: &mut RoutingConfig, ab: &AbConfig) {
    for target in ab
        .groups
        .iter()
        .filter_map(|g| g.routing.as_ref())
        .flat_map(|r| &r.clusters)
    {
        if !routing.clusters.iter().any(|c| c.cluster == target.cluster) {
            routing.clusters.push(target.clone());
        }
    }
}

/// Every model and cluster `config` names, its A/B groups' included: each
/// section says which models it names.
fn names_of(config: &Config) -> Names {
    let mut models: Vec<&str> = Vec::new();
    config.routing.named_models(&mut models);
    config.degrade.named_models(&mut models);
    for g in &config.ab.groups {
        if let Some(r) = &g.routing {
            r.named_models(&mut models);
        }
        if let Some(d) = &g.degrade {
            d.named_models(&mut models);
        }
    }
    for rule in &config.limits.rules {
        models.extend(rule.models.iter().flatten().map(String::as_str));
        models.extend(rule.degrade.iter().filter_map(|d| d.model.as_deref()));
    }
    // `*` and a prefix price models they do not name, and a catalog's
    // models are named by no one here.
    models.extend(config.limits.prices.named());
    models.extend(config.cache.deterministic_models.iter().map(String::as_str));
    let clusters = config.routing.clusters.iter().map(|c| c.cluster.as_str());
    Names::new(models, clusters)
}

/// `tracing.capture`, which needs somewhere to put what it captures, and
/// spans that the queue can hold.
fn compile_capture(
    raw: RawCapture,
    otlp: Option<&OtlpConfig>,
    access_log: bool,
) -> Result<CaptureConfig, ConfigError> {
    let capture = CaptureConfig::compile(raw).map_err(|e| e.within("tracing.capture"))?;
    if !capture.any() {
        return Ok(capture);
    }
    if otlp.is_none() && !access_log {
        let field = if capture.prompt {
            "prompt"
        } else {
            "completion"
        };
        return Err(ConfigError::new(
            format!("tracing.capture.{field}"),
            "captures for nothing: set `tracing.otlp` or `access_log.enabled`",
        ));
    }
    let span = crate::spans::config::SPAN_BYTES_WITHOUT_CAPTURE + capture.span_bytes();
    if let Some(o) = otlp.filter(|o| o.max_queue_bytes < span) {
        return Err(ConfigError::new(
            "tracing.otlp.max_queue_bytes",
            format!(
                "{} holds no span that captures {} bytes thrice (at least {span})",
                o.max_queue_bytes, capture.max_bytes
            ),
        ));
    }
    Ok(capture)
}

fn default_paths() -> Vec<LlmPath> {
    LLM_PATHS.default.iter().map(|p| LlmPath::new(p)).collect()
}

/// `llm_paths` (the default ones when absent), then the paths `llm_apis`
/// names the dialect of, added when not listed.
fn compile_paths(
    paths: Option<Vec<String>>,
    apis: Option<BTreeMap<String, String>>,
) -> Result<Vec<LlmPath>, ConfigError> {
    let mut out = match paths {
        None => default_paths(),
        Some(paths) => {
            for (i, p) in paths.iter().enumerate() {
                path_ok(format!("llm_paths[{i}]"), p)?;
            }
            paths.iter().map(|p| LlmPath::new(p)).collect()
        }
    };
    for (path, name) in apis.unwrap_or_default() {
        let api = compile_api(&path, &name)?;
        match out.iter_mut().find(|p| p.pattern == path) {
            Some(p) => p.api = api,
            None => out.push(LlmPath { pattern: path, api }),
        }
    }
    Ok(out)
}

/// A path the filter matches: absolute, without query.
fn path_ok(field: String, p: &str) -> Result<(), ConfigError> {
    if check::is_path_without_query(p) {
        return Ok(());
    }
    Err(ConfigError::new(
        field,
        format!("{p:?} is not an absolute path without query"),
    ))
}

/// One entry of `llm_apis`: a path and the dialect it names.
fn compile_api(path: &str, name: &str) -> Result<Dialect, ConfigError> {
    let field = format!("llm_apis.{path}");
    path_ok(field.clone(), path)?;
    Dialect::named(name).ok_or_else(|| {
        ConfigError::new(
            field,
            format!(
                "{name:?} is not one of {}",
                Dialect::names()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The empty value a build without the section's feature holds in
    /// place of compiling it is what compiling the empty section gives.
    #[test]
    fn a_section_left_out_is_what_its_empty_section_compiles_to() {
        use crate::routing::affinity::AffinityConfig;
        assert_eq!(
            RoutingConfig::default(),
            check::defaults(RoutingConfig::compile)
        );
        assert_eq!(
            AffinityConfig::default(),
            check::defaults(AffinityConfig::compile)
        );
        assert_eq!(
            LimitsConfig::default(),
            check::defaults(LimitsConfig::compile)
        );
        assert_eq!(Guardrails::default(), check::defaults(Guardrails::compile));
        let base = ab::Base {
            routing: &RawRoutingConfig::default(),
            shaping: &RawShapingConfig::default(),
            cache: true,
            degrade: &RawDegradeConfig::default(),
        };
        assert_eq!(
            AbConfig::default(),
            check::defaults(|r| AbConfig::compile(r, &base))
        );
        assert_eq!(
            AdminConfig::default(),
            check::defaults(AdminConfig::compile)
        );
        assert_eq!(
            CredentialsConfig::default(),
            check::defaults(CredentialsConfig::compile)
        );
        assert_eq!(
            CaptureConfig::default(),
            check::defaults(|c| compile_capture(c, None, false))
        );
        assert_eq!(
            Config::parse(b"{}").unwrap().otlp,
            None,
            "no exporter unless written"
        );
    }

    #[cfg(feature = "full")]
    #[test]
    fn every_section_that_names_a_model_is_read() {
        let c = Config::parse(
            br#"{
              "routing": {
                "models": {"gpt-4o": [{"cluster": "east", "model": "gpt-4o-2024"}],
                           "small": [{"cluster": "cache.west"}]},
                "rules": [{"when": {"model": ["alias"]}, "model": "small"}],
                "fallbacks": {"gpt-4o": {"to": ["small"]}}
              },
              "degrade": {
                "thresholds": [{"model": "watched", "signal": "rps", "above": 1, "level": 1}],
                "fallback_model": {"big": "cheap"},
                "alerts": [{"model": "alerted", "level": 2}]
              },
              "limits": {
                "rules": [{"name": "r", "models": ["limited"], "requests_per_minute": 5,
                           "degrade": {"model": "limited-cheap"}}],
                "prices": {"priced": {"input": 1, "output": 2}, "*": {"input": 1, "output": 1}}
              },
              "cache": {"deterministic_models": ["embed model"]},
              "ab": {"groups": [
                {"name": "g", "percent": 50, "overrides": {
                  "routing": {"models": {"small": [{"cluster": "canary-c", "model": "canary"}]}},
                  "degrade": {"fallback_model": {"small": "tiny"}}}},
                {"name": "h", "percent": 50}]}
            }"#,
        )
        .unwrap();
        let n = &c.names;
        assert_eq!(
            n.models(),
            [
                "alerted",
                "alias",
                "big",
                "canary",
                "cheap",
                "embed model",
                "gpt-4o",
                "gpt-4o-2024",
                "limited",
                "limited-cheap",
                "priced",
                "small",
                "tiny",
                "watched"
            ]
        );
        assert!(n.has_model("gpt-4o") && !n.has_model("gpt-4"));
        assert!(n.has_model_label("embed_model") && !n.has_model("embed_model"));
        assert!(n.has_cluster_label("east") && n.has_cluster_label("canary-c"));
        assert!(n.has_cluster_label("cache_west") && !n.has_cluster_label("cache.west"));
        assert!(!n.has_cluster_label("made-up"));
        let n = Config::parse(b"{}").unwrap().names;
        assert!(n.models().is_empty());
        assert!(!n.has_model("") && !n.has_model_label("other"));
    }

    #[test]
    fn empty_document_is_useful() {
        for doc in ["", "{}", "  {}\n"] {
            let c = Config::parse(doc.as_bytes()).unwrap();
            let paths: Vec<&str> = c.llm_paths.iter().map(|p| p.pattern.as_str()).collect();
            assert_eq!(paths, DEFAULT_PATHS);
            assert_eq!(c.priority.default, Priority::P1);
            assert!(c.priority.trust_client);
            assert_eq!(c.tracing, TracingMode::Always);
        }
        assert_eq!(Config::default(), Config::parse(b"{}").unwrap());
        assert_eq!(Config::parse(b"{}").unwrap().cache, CacheConfig::default());
        #[cfg(feature = "cache")]
        {
            let off = Config::parse(br#"{"cache":{"enabled":false,"max_entries":8}}"#).unwrap();
            assert!(!off.cache.enabled);
            assert_eq!(off.cache.max_entries, 8);
        }
    }

    #[test]
    fn reads_every_field() {
        let c = Config::parse(
            br#"{"llm_paths":["/chat"],"priority":{"default":"p2","trust_client":false},"tracing":{"mode":"off"}}"#,
        )
        .unwrap();
        assert_eq!(c.llm_paths, [LlmPath::new("/chat")]);
        let mapped = Config::parse(
            br#"{"llm_paths":["/v1/messages","/gw/*/chat","/openai/deployments/*/chat/completions"],
                 "llm_apis":{"/gw/*/chat":"responses","/claude/*":"messages"}}"#,
        )
        .unwrap();
        let apis: Vec<(&str, Dialect)> = mapped
            .llm_paths
            .iter()
            .map(|p| (p.pattern.as_str(), p.api))
            .collect();
        assert_eq!(
            apis,
            [
                ("/v1/messages", Dialect::Messages),
                ("/gw/*/chat", Dialect::Responses),
                ("/openai/deployments/*/chat/completions", Dialect::Chat),
                ("/claude/*", Dialect::Messages),
            ]
        );
        // Alone, it adds to the default paths.
        let added = Config::parse(br#"{"llm_apis":{"/claude/*":"messages"}}"#).unwrap();
        assert_eq!(added.llm_paths.len(), DEFAULT_PATHS.len() + 1);
        assert_eq!(c.priority.default, Priority::P2);
        assert!(!c.priority.trust_client);
        assert_eq!(c.tracing, TracingMode::Off);
    }

    #[test]
    fn a_key_written_twice_is_refused_by_its_path() {
        for (doc, field) in [
            (
                r#"{"priority":{"default":"P0","default":"P2"}}"#,
                "priority.default",
            ),
            (r#"{"tracing":{"mode":"off"},"tracing":{}}"#, "tracing"),
            (
                r#"{"degrade":{"thresholds":[{"signal":"rps","above":1,"level":1,"above":9}]}}"#,
                "degrade.thresholds[0].above",
            ),
        ] {
            let e = Config::parse(doc.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{doc}");
            assert!(e.message.contains("written twice"), "{doc}: {e}");
        }
        // Keys repeated in different objects are not repeats.
        assert!(
            Config::parse(br#"{"priority":{"default":"P0"},"tracing":{"mode":"off"}}"#).is_ok()
        );
    }

    #[test]
    fn errors_name_the_field_and_value() {
        for (doc, field, needle) in [
            (r#"{"bogus":1}"#, "bogus", "unknown field"),
            (
                r#"{"priority":{"defualt":"P1"}}"#,
                "priority.defualt",
                "unknown field",
            ),
            (r#"{"priority":{"default":"P7"}}"#, "priority.default", "P7"),
            (
                r#"{"priority":{"trust_client":"yes"}}"#,
                "priority.trust_client",
                "yes",
            ),
            (
                r#"{"tracing":{"mode":"sometimes"}}"#,
                "tracing.mode",
                "sometimes",
            ),
            (r#"{"tracing":{"mode":"OFF"}}"#, "tracing.mode", "OFF"),
            (
                r#"{"tracing":{"mode":{"off":null}}}"#,
                "tracing.mode",
                "variant identifier",
            ),
            (r#"{"priority":{"default":""}}"#, "priority.default", "\"\""),
            (r#"{"llm_paths":["v1/chat"]}"#, "llm_paths[0]", "v1/chat"),
            (r#"{"llm_paths":"x"}"#, "llm_paths", "x"),
            (
                r#"{"llm_apis":{"/x":"anthropic"}}"#,
                "llm_apis./x",
                "anthropic",
            ),
            (r#"{"llm_apis":{"x":"chat"}}"#, "llm_apis.x", "\"x\""),
            (r#"{"cache":{"ttl_s":0}}"#, "cache.ttl_s", "0"),
            (r#"{"cache":{"ttl":60}}"#, "cache.ttl", "unknown field"),
            (r#"{"cache":{"enabled":"yes"}}"#, "cache.enabled", "yes"),
            (
                r#"{"cache":{"scope":"world"}}"#,
                "cache.scope",
                "`tenant` or `global`",
            ),
            ("[1]", ".", "JSON object"),
            ("{", ".", "EOF"),
        ] {
            // A build without the cache refuses its section whole.
            let (field, needle) = match doc.starts_with(r#"{"cache""#) && !CACHE {
                true => ("cache", "is not in the sidecar build"),
                false => (field, needle),
            };
            let e = Config::parse(doc.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
            assert!(e.to_string().contains(needle), "{doc}: {e}");
        }
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;
    use crate::fuzz;

    /// Every section in use, as the pages of docs/ show them.
    const FULL: &str = r#"{
      "llm_paths": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"],
      "priority": { "default": "P1", "trust_client": true },
      "tracing": { "mode": "always" },
      "max_body_bytes": 1048576,
      "cache": { "ttl_s": 3600, "max_entries": 4096, "max_entry_bytes": 262144,
                 "dynamic_markers": ["{{now}}"], "stale_if_error_s": 600 },
      "routing": {
        "models": {
          "gpt-4o": [
            { "cluster": "openai", "weight": 3, "authority": "api.openai.com" },
            { "cluster": "azure-east", "weight": 1, "model": "gpt-4o-2024-08-06" }
          ],
          "llama-8b": [{ "cluster": "vllm-small", "metrics_path": "/metrics" }]
        },
        "probe_interval_s": 5,
        "rules": [
          { "when": { "model": "auto", "min_prompt_tokens": 8000 }, "model": "gpt-4o" },
          { "when": { "model": "auto" }, "model": "llama-8b" }
        ]
      },
      "budget": { "default_ms": { "P0": 120000, "P1": 60000, "P2": 20000 }, "max_ms": 300000,
                  "retry_ratio": 0.2, "window_s": 30, "shed_at": 0.7, "reject_at": 0.9 },
      "degrade": { "alerts": [{ "severity": "critical", "level": 3 },
                              { "alertname": "LLMSlow", "model": "gpt-4o", "level": 2 }],
                   "alert_ttl_s": 900 },
      "admin": { "path_prefix": "/llm-filter", "token": "a-long-random-token-0123" },
      "shaping": { "max_tokens_cap": { "P1": 1024, "P2": 512 }, "max_history_turns": 8,
                   "max_prompt_tokens": 3000, "max_tokens_field": "max_tokens" },
      "ab": { "user_header": "x-user-id", "groups": [
        { "name": "control", "percent": 90 },
        { "name": "small", "percent": 10, "overrides": {
          "routing": { "models": { "gpt-4o": [{ "cluster": "vllm-small", "model": "llama-8b" }] } },
          "shaping": { "max_tokens_cap": 256 }, "cache": { "enabled": false } } }
      ] }
    }"#;

    /// The place `at` (counted over every value, depth first) of a document.
    fn nth<'a>(v: &'a mut Value, at: &mut usize) -> Option<&'a mut Value> {
        if *at == 0 {
            return Some(v);
        }
        *at -= 1;
        match v {
            Value::Array(items) => items.iter_mut().find_map(|i| nth(i, at)),
            Value::Object(m) => m.values_mut().find_map(|i| nth(i, at)),
            _ => None,
        }
    }

    /// [`FULL`] less the sections this build refuses (`build`): the whole
    /// of it in the full build.
    fn full() -> Value {
        let mut doc: Value = serde_json::from_str(FULL).unwrap();
        while let Err(e) = crate::build::check(&doc) {
            let section = e.field.split(['.', '[']).next().unwrap().to_string();
            assert!(
                doc.as_object_mut().unwrap().remove(&section).is_some(),
                "{e}"
            );
        }
        doc
    }

    #[test]
    fn the_full_document_is_valid() {
        let doc = full();
        Config::parse(&serde_json::to_vec(&doc).unwrap()).unwrap();
        let whole: Value = serde_json::from_str(FULL).unwrap();
        assert_eq!(
            doc == whole,
            cfg!(feature = "full"),
            "read whole by the full build"
        );
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Any value anywhere in a valid document compiles or is refused with
        /// an error naming a field; never a panic.
        #[test]
        fn any_value_anywhere_compiles_or_names_a_field(doc in fuzz::doc(false), at in 0usize..80, seed: u64) {
            let mut full = full();
            let replacement = serde_json::from_str(&doc.spell(seed)).unwrap_or(Value::Null);
            let mut at = at;
            if let Some(slot) = nth(&mut full, &mut at) {
                *slot = replacement;
            }
            let bytes = serde_json::to_vec(&full).unwrap();
            if let Err(e) = Config::parse(&bytes) {
                prop_assert!(!e.field.is_empty() && !e.message.is_empty());
                prop_assert!(e.to_string().contains(&e.field));
            }
        }

        /// An unknown field in the document or any section is refused, and
        /// the error says which.
        #[test]
        fn unknown_fields_are_refused(section in prop::sample::select(vec!["", "priority", "tracing", "cache", "routing", "budget", "shaping", "ab", "degrade", "admin"]), name in "zz_[a-z_]{0,12}") {
            let mut full = full();
            // A section the build refuses whole is not in its document.
            prop_assume!(section.is_empty() || full.get(section).is_some());
            let obj = if section.is_empty() { &mut full } else { &mut full[section] };
            obj.as_object_mut().unwrap().insert(name.clone(), Value::from(1));
            let e = Config::parse(&serde_json::to_vec(&full).unwrap());
            prop_assert!(e.as_ref().is_err_and(|e| e.field.ends_with(&name) && e.message.contains(&name)), "{:?}", e);
        }

        /// Broken documents are refused, never a panic.
        #[test]
        fn broken_documents_are_refused(doc in fuzz::doc(false), seed: u64) {
            let _ = Config::parse(&fuzz::mutated(&doc, seed));
        }
    }
}
