//! The plugin configuration: one JSON document, parsed strictly (unknown fields
//! refused) and compiled into typed values once, so the data path never meets
//! a half-valid setting and an operator's typo is named at load time.

pub mod check;
pub mod error;

use serde::Deserialize;

use crate::budget::config::{BudgetConfig, RawBudgetConfig};
use crate::cache::config::{CacheConfig, RawCacheConfig};
use crate::classify::DEFAULT_PATHS;
use crate::priority::Priority;
use crate::routing::config::{RawRoutingConfig, RoutingConfig};

pub use error::ConfigError;

/// Default bound of a request body the filter holds to decide on it: Envoy's
/// default per-connection buffer limit, past which holding it earns a 413.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// Largest `max_body_bytes`.
const MAX_MAX_BODY_BYTES: usize = 64 << 20;
/// Whether the client's `x-request-priority` is honoured unless told otherwise.
const DEFAULT_TRUST_CLIENT: bool = true;

/// The document as written by the operator.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    /// Paths of LLM calls (POST).
    pub llm_paths: Option<Vec<String>>,
    /// Priority section.
    pub priority: RawPriority,
    /// Tracing section.
    pub tracing: RawTracing,
    /// Largest request body held to decide on it.
    pub max_body_bytes: Option<usize>,
    /// Routing section.
    pub routing: RawRoutingConfig,
    /// Budget section.
    pub budget: RawBudgetConfig,
    /// Cache section.
    pub cache: RawCacheConfig,
}

/// `priority` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawPriority {
    /// `P0` | `P1` | `P2` in any case, default `P1`.
    pub default: Option<Priority>,
    /// Honour the client's `x-request-priority`, default true.
    pub trust_client: Option<bool>,
}

/// `tracing` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTracing {
    /// `always` (default) | `off`.
    pub mode: Option<TracingMode>,
}

/// The compiled configuration every HTTP context shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Paths of LLM calls.
    pub llm_paths: Vec<String>,
    /// Priority policy.
    pub priority: PriorityConfig,
    /// Tracing policy.
    pub tracing: TracingMode,
    /// Largest request body held to decide on it; larger or unsized bodies
    /// stream through and skip the body-based features.
    pub max_body_bytes: usize,
    /// Model routing.
    pub routing: RoutingConfig,
    /// Timeout budgets and the breaker.
    pub budget: BudgetConfig,
    /// The response cache.
    pub cache: CacheConfig,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(variant_identifier, rename_all = "snake_case")]
pub enum TracingMode {
    /// The filter continues or starts the trace on every LLM call.
    #[default]
    Always,
    /// The filter leaves trace headers alone (Envoy's tracer owns them).
    Off,
}

impl Default for Config {
    /// The empty document, as [`Config::parse`] compiles `{}`.
    fn default() -> Self {
        Self {
            llm_paths: default_paths(),
            priority: PriorityConfig::default(),
            tracing: TracingMode::default(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            routing: RoutingConfig::default(),
            budget: BudgetConfig::default(),
            cache: CacheConfig::default(),
        }
    }
}

impl Default for PriorityConfig {
    fn default() -> Self {
        Self {
            default: Priority::default(),
            trust_client: DEFAULT_TRUST_CLIENT,
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
        let raw: RawConfig = ConfigError::from_json(json)?;
        Self::try_from(raw)
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    /// Compiles a parsed document, checking every invariant; each section
    /// names its fields relative to itself and is prefixed here.
    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let llm_paths = match raw.llm_paths {
            None => default_paths(),
            Some(paths) => compile_paths(paths)?,
        };
        let max_body_bytes = raw.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        let max_body_bytes =
            check::in_range("max_body_bytes", max_body_bytes, 1..=MAX_MAX_BODY_BYTES)?;
        Ok(Self {
            llm_paths,
            max_body_bytes,
            routing: RoutingConfig::compile(raw.routing).map_err(|e| e.within("routing"))?,
            budget: BudgetConfig::compile(raw.budget).map_err(|e| e.within("budget"))?,
            cache: CacheConfig::compile(raw.cache).map_err(|e| e.within("cache"))?,
            priority: PriorityConfig {
                default: raw.priority.default.unwrap_or_default(),
                trust_client: raw.priority.trust_client.unwrap_or(DEFAULT_TRUST_CLIENT),
            },
            tracing: raw.tracing.mode.unwrap_or_default(),
        })
    }
}

fn default_paths() -> Vec<String> {
    DEFAULT_PATHS.iter().map(|p| p.to_string()).collect()
}

fn compile_paths(paths: Vec<String>) -> Result<Vec<String>, ConfigError> {
    for (i, p) in paths.iter().enumerate() {
        if !p.starts_with('/') || p.contains(['?', '#']) {
            return Err(ConfigError::new(
                format!("llm_paths[{i}]"),
                format!("{p:?} is not an absolute path without query"),
            ));
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_document_is_useful() {
        for doc in ["", "{}", "  {}\n"] {
            let c = Config::parse(doc.as_bytes()).unwrap();
            assert_eq!(c.llm_paths, DEFAULT_PATHS);
            assert_eq!(c.priority.default, Priority::P1);
            assert!(c.priority.trust_client);
            assert_eq!(c.tracing, TracingMode::Always);
        }
        assert_eq!(Config::default(), Config::parse(b"{}").unwrap());
        assert_eq!(Config::parse(b"{}").unwrap().cache, CacheConfig::default());
        let off = Config::parse(br#"{"cache":{"enabled":false,"max_entries":8}}"#).unwrap();
        assert!(!off.cache.enabled);
        assert_eq!(off.cache.max_entries, 8);
    }

    #[test]
    fn reads_every_field() {
        let c = Config::parse(
            br#"{"llm_paths":["/chat"],"priority":{"default":"p2","trust_client":false},"tracing":{"mode":"off"}}"#,
        )
        .unwrap();
        assert_eq!(c.llm_paths, ["/chat"]);
        assert_eq!(c.priority.default, Priority::P2);
        assert!(!c.priority.trust_client);
        assert_eq!(c.tracing, TracingMode::Off);
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
            let e = Config::parse(doc.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
            assert!(e.to_string().contains(needle), "{doc}: {e}");
        }
    }
}
