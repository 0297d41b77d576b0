//! `routing.prompt_cache`: the models whose calls get the provider's
//! prompt-cache markers put on by the filter when the client placed none
//! (Anthropic's `cache_control` breakpoints; where they go is the call's
//! dialect's to say, [`crate::dialect::request::Request::mark_cache`]). Opt
//! in per model: a key is a model's name, or the beginning of names when it
//! ends in `*`, matched as the price table matches them (the exact name,
//! else the longest beginning that fits).

use serde_json::Value;

use crate::config::error::ConfigError;
use crate::config::setting::{Row, Setting};
use crate::dialect::request::MarkAsk;
use crate::pricing;

/// `min_prefix_tokens`: Anthropic's smallest cacheable prefix for most of
/// its models (some take 2,048 or 4,096: a key of their own).
const MIN_PREFIX_TOKENS: Setting<u64> = Setting::range("min_prefix_tokens", 1_024, 1, 1_000_000);
/// `ttl`: Anthropic's default.
const TTL: Setting<&str> = Setting::any("ttl", "5m");
/// Most models named.
const MAX_MODELS: usize = 64;

/// The settings of a model's entry.
pub const SETTINGS: &[&dyn Row] = &[&MIN_PREFIX_TOKENS, &TTL];

/// The compiled `routing.prompt_cache`: each key as written and how its
/// calls are marked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptCacheConfig {
    models: Vec<(String, MarkAsk)>,
}

impl PromptCacheConfig {
    /// Compiles `routing.prompt_cache` (read as a JSON value rather than
    /// derived, which keeps the module smaller): model →
    /// `{"min_prefix_tokens": n, "ttl": "5m" | "1h"}`; errors name fields
    /// relative to it.
    pub fn compile(raw: &Value) -> Result<Self, ConfigError> {
        let mut out = Self::default();
        if raw.is_null() {
            return Ok(out);
        }
        let map = raw
            .as_object()
            .ok_or_else(|| ConfigError::new(".", "is not an object of model → markers"))?;
        if map.len() > MAX_MODELS {
            return Err(ConfigError::new(".", "names over 64 models"));
        }
        for (model, entry) in map {
            let ask = compile_entry(entry).map_err(|e| e.within(model))?;
            out.models.push((model.clone(), ask));
        }
        Ok(out)
    }

    /// How a call to `model` is marked; `None`: it is not.
    pub fn for_model(&self, model: &str) -> Option<MarkAsk> {
        let fit = |(key, _): &&(String, MarkAsk)| pricing::fit(key, Some(model));
        self.models
            .iter()
            .max_by_key(fit)
            .filter(|e| fit(e).is_some())
            .map(|(_, ask)| *ask)
    }
}

fn compile_entry(raw: &Value) -> Result<MarkAsk, ConfigError> {
    let m = raw
        .as_object()
        .ok_or_else(|| ConfigError::new(".", "is not an object"))?;
    if let Some(unknown) = m
        .keys()
        .find(|k| *k != MIN_PREFIX_TOKENS.name && *k != TTL.name)
    {
        return Err(ConfigError::new(unknown.as_str(), "unknown field"));
    }
    let min = match m.get(MIN_PREFIX_TOKENS.name) {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| ConfigError::new(MIN_PREFIX_TOKENS.name, "is not a whole number"))?,
        ),
    };
    let hour = match m.get(TTL.name).filter(|v| !v.is_null()).map(Value::as_str) {
        None | Some(Some("5m")) => false,
        Some(Some("1h")) => true,
        Some(_) => return Err(ConfigError::new(TTL.name, "is not one of 5m, 1h")),
    };
    Ok(MarkAsk {
        min_tokens: MIN_PREFIX_TOKENS.read(min)?,
        hour,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(s: &str) -> Result<PromptCacheConfig, ConfigError> {
        PromptCacheConfig::compile(&serde_json::from_str(s).unwrap())
    }

    #[test]
    fn the_exact_name_then_the_longest_beginning_decides() {
        let c = compile(
            r#"{"claude-haiku-4-5*":{"min_prefix_tokens":4096,"ttl":"1h"},"claude-opus-4-5":{"min_prefix_tokens":4096,"ttl":"1h"},
                "claude-*":{}}"#,
        )
        .unwrap();
        let big = MarkAsk {
            min_tokens: 4096,
            hour: true,
        };
        assert_eq!(c.for_model("claude-haiku-4-5-20251001"), Some(big));
        assert_eq!(c.for_model("claude-opus-4-5"), Some(big));
        let default = MarkAsk {
            min_tokens: 1024,
            hour: false,
        };
        assert_eq!(c.for_model("claude-opus-4-5x"), Some(default));
        assert_eq!(c.for_model("claude-sonnet-4-5"), Some(default));
        assert_eq!(c.for_model("gpt-4o"), None);
        assert_eq!(compile("{}").unwrap().for_model("claude-x"), None);
        assert_eq!(compile("null").unwrap().for_model("claude-x"), None);
        let every = compile(r#"{"*":{"ttl":null}}"#).unwrap();
        assert_eq!(every.for_model("x"), Some(default));
    }

    #[test]
    fn refuses_what_cannot_be_meant() {
        for (body, field) in [
            (r#"{"a":{"ttl":"2h"}}"#, "a.ttl"),
            (r#"{"a":{"min_prefix_tokens":0}}"#, "a.min_prefix_tokens"),
            (r#"{"a":{"min_prefix_tokens":"1"}}"#, "a.min_prefix_tokens"),
            (r#"{"a":{"model":"a"}}"#, "a.model"),
            (r#"{"a":[]}"#, "a"),
            (r#"[]"#, "."),
        ] {
            assert_eq!(compile(body).unwrap_err().field, field, "{body}");
        }
    }
}
