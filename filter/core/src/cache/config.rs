//! The `cache` section of the plugin configuration, parsed strictly and compiled
//! once into typed values, so the data path never checks a setting again and an
//! operator's mistake is named at load time.

use serde::Deserialize;

use super::semantic::config::{RawSemanticConfig, SemanticConfig};
use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{Empty, List, Named, Setting, Table};
use crate::dialect::Dialect;

/// Largest `cache.max_entries`: every slot may cost up to `max_entry_bytes` of
/// proxy memory, and shared data never evicts.
pub const MAX_ENTRIES: u32 = 1_000_000;
/// Largest `cache.max_entry_bytes`.
pub const MAX_ENTRY_BYTES: u32 = 16 * 1024 * 1024;
/// Smallest `cache.max_entry_bytes`: below this not even a short answer fits.
pub const MIN_ENTRY_BYTES: u32 = 1024;
/// Longest `cache.coalesce_wait_ms`.
pub const MAX_COALESCE_WAIT_MS: u64 = 600_000;
/// Longest `cache.ttl_s` and `cache.stale_if_error_s`: one year keeps the
/// millisecond arithmetic far from overflow.
pub const MAX_TTL_S: u64 = 365 * 24 * 3600;
/// Shared-data cost of one slot beyond its value: the slot and in-flight marker
/// keys, the marker value and Envoy's map nodes. An estimate, used only for the
/// worst-case footprint logged at start.
pub const SLOT_OVERHEAD_BYTES: u64 = 256;

/// `enabled`: on where the build has the cache. The sidecar build (no
/// `cache` feature, its section refused) keeps no table, holds no body for
/// it and tells no `x-cache` of its own: the next tier's reaches the client.
const ENABLED: Setting<bool> = Setting::any("enabled", cfg!(feature = "cache"));
/// `max_temperature`: only deterministic calls are cached unless the
/// operator says otherwise; 2 is the highest temperature OpenAI-compatible
/// APIs accept.
const MAX_TEMPERATURE: Setting<f64> =
    Setting::real("max_temperature", 0.0, (0.0, false), (2.0, false));
/// `deterministic_models`: none; a model's calls are cached by their
/// sampling parameters.
const DETERMINISTIC_MODELS: Empty = Empty::list("deterministic_models");
/// `dynamic_markers`: none.
const DYNAMIC_MARKERS: Empty = Empty::list("dynamic_markers");
/// `tenant_headers`: OpenAI's and Azure OpenAI's credentials.
const TENANT_HEADERS: List<&str> = List::new("tenant_headers", &["authorization", "api-key"]);
/// `ttl_s`.
const TTL_S: Setting<u64> = Setting::range("ttl_s", 3_600, 1, MAX_TTL_S);
/// `ttl_jitter`.
const TTL_JITTER: Setting<f64> = Setting::real("ttl_jitter", 0.1, (0.0, false), (1.0, true));
/// `stale_if_error_s`: off by default.
const STALE_IF_ERROR_S: Setting<u64> = Setting::range("stale_if_error_s", 0, 0, MAX_TTL_S);
/// `max_entries`.
const MAX_ENTRIES_SETTING: Setting<u32> = Setting::range("max_entries", 1_024, 1, MAX_ENTRIES);
/// `max_entry_bytes`.
const MAX_ENTRY_BYTES_SETTING: Setting<u32> = Setting::range(
    "max_entry_bytes",
    256 * 1024,
    MIN_ENTRY_BYTES,
    MAX_ENTRY_BYTES,
);
/// `coalesce`.
const COALESCE: Setting<bool> = Setting::any("coalesce", true);
/// `coalesce_wait_ms`.
const COALESCE_WAIT_MS: Setting<u64> =
    Setting::range("coalesce_wait_ms", 30_000, 1, MAX_COALESCE_WAIT_MS);
/// `scope`.
const SCOPE: Named<Scope> = Named {
    name: "scope",
    default: Scope::Tenant,
    spell: Scope::as_str,
};
/// `mode`.
const MODE: Named<Mode> = Named {
    name: "mode",
    default: Mode::Local,
    spell: Mode::as_str,
};
/// `shard_header`.
const SHARD_HEADER: Setting<&str> = Setting::any("shard_header", "x-llm-cache-key");

/// The section's settings, and its semantic cache's.
pub const SETTINGS: Table = &[
    (
        "cache",
        &[
            &ENABLED,
            &MAX_TEMPERATURE,
            &DETERMINISTIC_MODELS,
            &DYNAMIC_MARKERS,
            &SCOPE,
            &TENANT_HEADERS,
            &TTL_S,
            &TTL_JITTER,
            &STALE_IF_ERROR_S,
            &MAX_ENTRIES_SETTING,
            &MAX_ENTRY_BYTES_SETTING,
            &COALESCE,
            &COALESCE_WAIT_MS,
            &MODE,
            &SHARD_HEADER,
        ],
    ),
    ("cache.semantic", super::semantic::config::SETTINGS),
    (
        "cache.semantic.embeddings",
        super::semantic::config::EMBEDDINGS,
    ),
];
const MAX_MARKERS: usize = 256;
const MAX_DETERMINISTIC_MODELS: usize = 256;
const MAX_MARKER_LEN: usize = 1024;
const MAX_TENANT_HEADERS: usize = 16;
/// Headers HTTP, Envoy or the cache itself need, which the shard header
/// (removed from every request) must never be.
const RESERVED_HEADERS: [&str; 10] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "upgrade",
    "cache-control",
    "accept-encoding",
];

/// `cache` as written by the operator.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCacheConfig {
    /// Master switch, default true.
    pub enabled: Option<bool>,
    /// Highest `temperature` of a cacheable call, default 0.
    pub max_temperature: Option<f64>,
    /// Models whose calls are cacheable whatever their sampling parameters.
    pub deterministic_models: Option<Vec<String>>,
    /// Substrings of the prompt that make a call not cacheable (its answer
    /// depends on something outside the request, e.g. the current time).
    pub dynamic_markers: Option<Vec<String>>,
    /// `tenant` (default) or `global`.
    pub scope: Option<Scope>,
    /// Request headers whose values identify the tenant.
    pub tenant_headers: Option<Vec<String>>,
    /// Freshness in seconds, default 3600.
    pub ttl_s: Option<u64>,
    /// Fraction of `ttl_s` by which an entry may expire early, default 0.1.
    pub ttl_jitter: Option<f64>,
    /// How long after expiry an entry may still answer an upstream failure,
    /// default 0 (off).
    pub stale_if_error_s: Option<u64>,
    /// Number of slots, default 1024.
    pub max_entries: Option<u32>,
    /// Largest encoded entry, default 256 KiB.
    pub max_entry_bytes: Option<u32>,
    /// Let concurrent identical calls wait for the first, default true.
    pub coalesce: Option<bool>,
    /// Longest wait of a coalesced call, default 30000.
    pub coalesce_wait_ms: Option<u64>,
    /// The semantic cache, off unless present.
    pub semantic: Option<RawSemanticConfig>,
    /// `local` (default) or `shard`.
    pub mode: Option<Mode>,
    /// The request header carrying the key in `shard` mode, default
    /// `x-llm-cache-key`.
    pub shard_header: Option<String>,
}

/// Where the cache of a call lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(variant_identifier, rename_all = "snake_case")]
pub enum Mode {
    /// In this proxy's shared data: look up, coalesce, store.
    #[default]
    Local,
    /// In the replica of the next tier that owns the key: decide and key the
    /// call as `local` does, write the key into the shard header for the
    /// load balancer to hash on, and leave the rest to that replica.
    Shard,
}

impl Mode {
    /// The document's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Shard => "shard",
        }
    }
}

/// Whose answers a call may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(variant_identifier, rename_all = "snake_case")]
pub enum Scope {
    /// Only answers to calls with the same credential.
    #[default]
    Tenant,
    /// Any answer to the same request; only for deployments where every
    /// caller may see every other caller's answers.
    Global,
}

impl Scope {
    /// The document's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Global => "global",
        }
    }
}

/// The compiled `cache` section.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// Master switch.
    pub enabled: bool,
    /// Highest cacheable `temperature`.
    pub max_temperature: f64,
    /// Models whose calls are cacheable whatever their sampling parameters,
    /// as requests name them.
    pub deterministic_models: Vec<String>,
    /// Prompt substrings that make a call not cacheable.
    pub dynamic_markers: Vec<String>,
    /// Key scope.
    pub scope: Scope,
    /// Lowercase names of the tenant credential headers, in key order.
    pub tenant_headers: Vec<String>,
    /// Freshness in milliseconds.
    pub ttl_ms: u64,
    /// Fraction of the freshness by which an entry may expire early, in `[0, 1)`.
    pub ttl_jitter: f64,
    /// Stale-if-error window in milliseconds, 0 when off.
    pub stale_if_error_ms: u64,
    /// Number of slots.
    pub max_entries: u32,
    /// Largest encoded slot value in bytes.
    pub max_entry_bytes: u32,
    /// Coalescing switch.
    pub coalesce: bool,
    /// Longest wait of a coalesced call in milliseconds.
    pub coalesce_wait_ms: u64,
    /// The semantic cache, `None` when off.
    pub semantic: Option<SemanticConfig>,
    /// Local cache, or the key handed to the next tier.
    pub mode: Mode,
    /// Lowercase name of the shard header.
    pub shard_header: String,
}

/// When an entry was stored and when it expires, jitter applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Store time, ms since the epoch.
    pub stored_at_ms: u64,
    /// Expiry time, ms since the epoch.
    pub expires_at_ms: u64,
}

impl Default for CacheConfig {
    /// The empty section, each setting's default, built without compiling
    /// anything: a build without the cache never reads the section (it is
    /// refused) and so holds none of its compiler (`Config::try_from`).
    fn default() -> Self {
        Self {
            enabled: ENABLED.default,
            max_temperature: MAX_TEMPERATURE.default,
            deterministic_models: Vec::new(),
            dynamic_markers: Vec::new(),
            scope: SCOPE.default,
            tenant_headers: TENANT_HEADERS.or_into(None),
            ttl_ms: TTL_S.default.saturating_mul(1000),
            ttl_jitter: TTL_JITTER.default,
            stale_if_error_ms: STALE_IF_ERROR_S.default.saturating_mul(1000),
            max_entries: MAX_ENTRIES_SETTING.default,
            max_entry_bytes: MAX_ENTRY_BYTES_SETTING.default,
            coalesce: COALESCE.default,
            coalesce_wait_ms: COALESCE_WAIT_MS.default,
            semantic: None,
            mode: MODE.default,
            shard_header: SHARD_HEADER.default.to_string(),
        }
    }
}

impl CacheConfig {
    /// Compiles the section, checking every invariant; errors name the field
    /// relative to the section (`ttl_jitter`) and quote the bad value.
    pub fn compile(raw: RawCacheConfig) -> Result<Self, ConfigError> {
        // What is cacheable, and whose.
        let max_temperature = MAX_TEMPERATURE.read(raw.max_temperature)?;
        let deterministic_models =
            compile_models(DETERMINISTIC_MODELS.or(raw.deterministic_models))?;
        let dynamic_markers = compile_markers(DYNAMIC_MARKERS.or(raw.dynamic_markers))?;
        let scope = SCOPE.default_or(raw.scope);
        let tenant_headers = compile_tenant_headers(scope, raw.tenant_headers)?;
        // Freshness.
        let ttl_s = TTL_S.read(raw.ttl_s)?;
        let ttl_jitter = TTL_JITTER.read(raw.ttl_jitter)?;
        let stale_s = STALE_IF_ERROR_S.read(raw.stale_if_error_s)?;
        let semantic = raw
            .semantic
            .map(|s| SemanticConfig::compile(s).map_err(|e| e.within("semantic")))
            .transpose()?;
        let mode = MODE.default_or(raw.mode);
        if mode == Mode::Shard && semantic.is_some() {
            // A shard looks nothing up; the semantic cache belongs to the
            // replica that owns the key.
            return Err(ConfigError::new(
                "semantic",
                "is looked up where the key is owned; set it on the `local` tier, not with mode shard",
            ));
        }
        let shard_header = compile_shard_header(raw.shard_header, &tenant_headers)?;
        // Size and waiting.
        let max_entries = MAX_ENTRIES_SETTING.read(raw.max_entries)?;
        let max_entry_bytes = MAX_ENTRY_BYTES_SETTING.read(raw.max_entry_bytes)?;
        let coalesce_wait_ms = COALESCE_WAIT_MS.read(raw.coalesce_wait_ms)?;
        Ok(Self {
            enabled: ENABLED.or(raw.enabled),
            max_temperature,
            deterministic_models,
            dynamic_markers,
            scope,
            tenant_headers,
            ttl_ms: ttl_s.saturating_mul(1000),
            ttl_jitter,
            stale_if_error_ms: stale_s.saturating_mul(1000),
            max_entries,
            max_entry_bytes,
            coalesce: COALESCE.or(raw.coalesce),
            coalesce_wait_ms,
            semantic,
            mode,
            shard_header,
        })
    }

    /// The headers whose values tell the tenant of a call of `dialect`:
    /// `tenant_headers`, then the dialect's own credential header (Anthropic's
    /// `x-api-key`) unless listed, so two credentials of that dialect are
    /// two tenants whatever `tenant_headers` says.
    pub fn tenant_headers_of(&self, dialect: Dialect) -> impl Iterator<Item = &str> {
        let own = dialect
            .credential_header()
            .filter(|h| !self.tenant_headers.iter().any(|t| t == h));
        self.tenant_headers.iter().map(String::as_str).chain(own)
    }

    /// This proxy looks up and stores answers: on, in `local` mode (never
    /// in a build without the cache, which then holds no table's code).
    pub fn keeps_entries(&self) -> bool {
        crate::build::CACHE && self.enabled && self.mode == Mode::Local
    }

    /// The most shared data the cache can ever hold, in bytes: every slot full
    /// to `max_entry_bytes`, plus its keys and in-flight marker. Logged at start
    /// so operators can size the proxy.
    pub fn worst_case_bytes(&self) -> u64 {
        u64::from(self.max_entries)
            .saturating_mul(u64::from(self.max_entry_bytes).saturating_add(SLOT_OVERHEAD_BYTES))
    }

    /// The store and expiry times of an entry stored at `now_ms`. `unit_random`
    /// is a uniform draw in `[0, 1)`; the freshness is shortened by up to
    /// `ttl_jitter` of itself so entries stored together do not all expire
    /// together, and never lengthened, so `ttl_s` stays a promise.
    pub fn stamp(&self, now_ms: u64, unit_random: f64) -> Stamp {
        let r = if unit_random.is_finite() {
            unit_random.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let cut = (self.ttl_ms as f64 * self.ttl_jitter * r) as u64;
        // At least one millisecond of freshness, whatever the draw.
        let ttl = self.ttl_ms.saturating_sub(cut).max(1);
        Stamp {
            stored_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(ttl),
        }
    }
}

/// `dynamic_markers`: a bounded list of non-empty, bounded substrings.
fn compile_markers(markers: Vec<String>) -> Result<Vec<String>, ConfigError> {
    check::at_most("dynamic_markers", &markers, MAX_MARKERS, "markers")?;
    for (i, m) in markers.iter().enumerate() {
        // An empty marker would match every prompt and silently disable the cache.
        if m.is_empty() || m.len() > MAX_MARKER_LEN {
            return Err(ConfigError::new(
                format!("dynamic_markers[{i}]"),
                format!("{m:?} must be 1 to {MAX_MARKER_LEN} bytes"),
            ));
        }
    }
    Ok(markers)
}

/// `deterministic_models`: a bounded list of model names, each once.
fn compile_models(models: Vec<String>) -> Result<Vec<String>, ConfigError> {
    let field = "deterministic_models";
    check::at_most(field, &models, MAX_DETERMINISTIC_MODELS, "models")?;
    for (i, m) in models.iter().enumerate() {
        if !check::is_name(m) {
            return Err(ConfigError::new(
                format!("{field}[{i}]"),
                format!("{m:?} is not a model name"),
            ));
        }
        if models.get(..i).is_some_and(|before| before.contains(m)) {
            return Err(ConfigError::new(
                format!("{field}[{i}]"),
                format!("{m:?} is listed twice"),
            ));
        }
    }
    Ok(models)
}

/// `tenant_headers` in lowercase, never empty when the scope is the tenant.
fn compile_tenant_headers(
    scope: Scope,
    names: Option<Vec<String>>,
) -> Result<Vec<String>, ConfigError> {
    let headers = match names {
        None => TENANT_HEADERS.or_into(None),
        Some(names) => compile_headers(names)?,
    };
    if scope == Scope::Tenant && headers.is_empty() {
        // Without a credential every caller would share one tenant: that is
        // `global`, and it must be asked for by name.
        return Err(ConfigError::new(
            "tenant_headers",
            "[] leaves no credential to tell tenants apart; set scope to global instead",
        ));
    }
    Ok(headers)
}

/// `shard_header`: a header name, lowercase, that is no credential (the
/// filter removes it from every request).
fn compile_shard_header(name: Option<String>, tenant: &[String]) -> Result<String, ConfigError> {
    let Some(name) = name else {
        return Ok(SHARD_HEADER.default.to_string());
    };
    if !check::is_token(&name) {
        return Err(ConfigError::new(
            "shard_header",
            format!("{name:?} is not a header name"),
        ));
    }
    let name = name.to_ascii_lowercase();
    if tenant.contains(&name) || Dialect::is_credential_header(&name) {
        return Err(ConfigError::new(
            "shard_header",
            format!("{name:?} is a tenant header; the filter removes the shard header"),
        ));
    }
    if RESERVED_HEADERS.contains(&name.as_str()) || name.starts_with("x-envoy-") {
        return Err(ConfigError::new(
            "shard_header",
            format!("{name:?} carries the request itself; the filter removes the shard header"),
        ));
    }
    Ok(name)
}

fn compile_headers(names: Vec<String>) -> Result<Vec<String>, ConfigError> {
    check::at_most("tenant_headers", &names, MAX_TENANT_HEADERS, "headers")?;
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for (i, name) in names.into_iter().enumerate() {
        if !check::is_token(&name) {
            return Err(ConfigError::new(
                format!("tenant_headers[{i}]"),
                format!("{name:?} is not a header name"),
            ));
        }
        // Envoy hands header names to the filter in lowercase.
        let name = name.to_ascii_lowercase();
        if out.contains(&name) {
            return Err(ConfigError::new(
                format!("tenant_headers[{i}]"),
                format!("{name:?} is listed twice"),
            ));
        }
        out.push(name);
    }
    Ok(out)
}

#[cfg(all(test, feature = "cache"))]
mod tests {
    use super::*;

    #[test]
    fn the_empty_section_is_what_an_empty_document_compiles_to() {
        assert_eq!(
            CacheConfig::default(),
            check::defaults(CacheConfig::compile)
        );
    }

    fn parse(json: &str) -> Result<CacheConfig, ConfigError> {
        ConfigError::from_json(json.as_bytes())
            .and_then(CacheConfig::compile)
            .map_err(|e| e.within("cache"))
    }

    #[test]
    fn empty_section_gives_the_defaults() {
        let c = parse("{}").unwrap();
        assert_eq!(c, CacheConfig::default());
        assert!(c.enabled && c.coalesce);
        assert_eq!(c.scope, Scope::Tenant);
        assert_eq!(c.tenant_headers, ["authorization", "api-key"]);
        assert_eq!(c.ttl_ms, 3_600_000);
        assert_eq!(c.max_entry_bytes, 262_144);
        assert_eq!(
            (c.mode, c.shard_header.as_str()),
            (Mode::Local, "x-llm-cache-key")
        );
    }

    #[test]
    fn reads_every_field() {
        let c = parse(
            r#"{"enabled":false,"max_temperature":0.5,"dynamic_markers":["{{now}}"],
                "deterministic_models":["claude-haiku-4-5"],
                "scope":"global","tenant_headers":["X-Tenant"],"ttl_s":60,"ttl_jitter":0,
                "stale_if_error_s":300,"max_entries":8,"max_entry_bytes":4096,
                "coalesce":false,"coalesce_wait_ms":500,"mode":"shard",
                "shard_header":"X-Shard"}"#,
        )
        .unwrap();
        assert!(!c.enabled && !c.coalesce);
        assert_eq!(c.max_temperature, 0.5);
        assert_eq!(c.dynamic_markers, ["{{now}}"]);
        assert_eq!(c.deterministic_models, ["claude-haiku-4-5"]);
        assert_eq!(c.scope, Scope::Global);
        assert_eq!(c.tenant_headers, ["x-tenant"]);
        assert_eq!((c.ttl_ms, c.stale_if_error_ms), (60_000, 300_000));
        assert_eq!(c.ttl_jitter, 0.0);
        assert_eq!((c.max_entries, c.max_entry_bytes), (8, 4096));
        assert_eq!(c.coalesce_wait_ms, 500);
        assert_eq!((c.mode, c.shard_header.as_str()), (Mode::Shard, "x-shard"));
    }

    #[test]
    fn global_scope_may_drop_the_credential_headers() {
        assert!(parse(r#"{"scope":"global","tenant_headers":[]}"#).is_ok());
    }

    #[test]
    fn errors_name_the_field_and_value() {
        for (doc, field, needle) in [
            (r#"{"max_temperature":2.5}"#, "cache.max_temperature", "2.5"),
            (r#"{"max_temperature":-1}"#, "cache.max_temperature", "-1"),
            (
                r#"{"dynamic_markers":[""]}"#,
                "cache.dynamic_markers[0]",
                "\"\"",
            ),
            (
                r#"{"deterministic_models":[""]}"#,
                "cache.deterministic_models[0]",
                "not a model name",
            ),
            (
                r#"{"deterministic_models":["m","m"]}"#,
                "cache.deterministic_models[1]",
                "twice",
            ),
            (r#"{"scope":"world"}"#, "cache.scope", "world"),
            (r#"{"tenant_headers":[]}"#, "cache.tenant_headers", "[]"),
            (
                r#"{"tenant_headers":["a b"]}"#,
                "cache.tenant_headers[0]",
                "a b",
            ),
            (
                r#"{"tenant_headers":["a","A"]}"#,
                "cache.tenant_headers[1]",
                "twice",
            ),
            (r#"{"ttl_s":0}"#, "cache.ttl_s", "0"),
            (r#"{"ttl_s":99999999999}"#, "cache.ttl_s", "99999999999"),
            (r#"{"ttl_jitter":1}"#, "cache.ttl_jitter", "1"),
            (r#"{"ttl_jitter":-0.1}"#, "cache.ttl_jitter", "-0.1"),
            (
                r#"{"stale_if_error_s":99999999999}"#,
                "cache.stale_if_error_s",
                "99999999999",
            ),
            (r#"{"max_entries":0}"#, "cache.max_entries", "0"),
            (r#"{"max_entries":1000001}"#, "cache.max_entries", "1000001"),
            (r#"{"max_entry_bytes":100}"#, "cache.max_entry_bytes", "100"),
            (
                r#"{"max_entry_bytes":16777217}"#,
                "cache.max_entry_bytes",
                "16777217",
            ),
            (r#"{"coalesce_wait_ms":0}"#, "cache.coalesce_wait_ms", "0"),
            (
                r#"{"coalesce_wait_ms":600001}"#,
                "cache.coalesce_wait_ms",
                "600001",
            ),
            (r#"{"mode":"remote"}"#, "cache.mode", "remote"),
            (r#"{"shard_header":"a b"}"#, "cache.shard_header", "a b"),
            (
                r#"{"shard_header":"Content-Length"}"#,
                "cache.shard_header",
                "request itself",
            ),
            (
                r#"{"shard_header":"x-envoy-hash"}"#,
                "cache.shard_header",
                "request itself",
            ),
            (
                r#"{"shard_header":"Authorization"}"#,
                "cache.shard_header",
                "tenant header",
            ),
            (
                r#"{"shard_header":"X-Api-Key"}"#,
                "cache.shard_header",
                "tenant header",
            ),
            (
                r#"{"mode":"shard","semantic":{"embeddings":{"cluster":"e","model":"m"}}}"#,
                "cache.semantic",
                "shard",
            ),
        ] {
            let e = parse(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
            assert!(e.message.contains(needle), "{doc}: {e}");
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(serde_json::from_str::<RawCacheConfig>(r#"{"ttl":1}"#).is_err());
    }

    #[test]
    fn a_dialects_own_credential_joins_the_tenant_headers() {
        let c = CacheConfig::default();
        fn of(c: &CacheConfig, e: Dialect) -> Vec<&str> {
            c.tenant_headers_of(e).collect()
        }
        assert_eq!(of(&c, Dialect::Chat), ["authorization", "api-key"]);
        assert_eq!(
            of(&c, Dialect::Messages),
            ["authorization", "api-key", "x-api-key"]
        );
        let listed = parse(r#"{"tenant_headers":["x-api-key","x-tenant"]}"#).unwrap();
        assert_eq!(of(&listed, Dialect::Messages), ["x-api-key", "x-tenant"]);
    }

    #[test]
    fn worst_case_counts_every_slot() {
        let c = CacheConfig::default();
        assert_eq!(c.worst_case_bytes(), 1024 * (262_144 + SLOT_OVERHEAD_BYTES));
        let big = parse(r#"{"max_entries":1000000,"max_entry_bytes":16777216}"#).unwrap();
        assert_eq!(
            big.worst_case_bytes(),
            1_000_000 * (16_777_216 + SLOT_OVERHEAD_BYTES)
        );
    }

    #[test]
    fn jitter_only_shortens_the_freshness() {
        let c = CacheConfig::default();
        assert_eq!(c.stamp(1000, 0.0).expires_at_ms, 1000 + 3_600_000);
        let s = c.stamp(1000, 0.999_999);
        assert!(s.expires_at_ms > 1000 + 3_240_000 && s.expires_at_ms <= 1000 + 3_600_000);
        assert_eq!(c.stamp(1000, f64::NAN).expires_at_ms, 1000 + 3_600_000);
        assert_eq!(c.stamp(u64::MAX, 0.5).expires_at_ms, u64::MAX);
        assert_eq!(c.stamp(7, 0.3).stored_at_ms, 7);
    }
}
