//! The `cache.semantic` section: off unless written, and every bound that
//! keeps its shared data finite (contexts, vectors per context, dimensions)
//! checked at load time.

use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::service::{Defaults, Service};
use crate::config::setting::{Row, Setting};

/// Most vectors per context group: a lookup scans all of one group.
pub const MAX_PER_CONTEXT: u32 = 4_096;
/// Most context group slots.
pub const MAX_CONTEXTS: u32 = 65_536;
/// Longest vector any setting allows.
pub const MAX_DIMENSIONS: u32 = 8_192;
/// Longest `max_text_bytes`.
pub const MAX_TEXT_BYTES: u32 = 1 << 20;
/// `threshold`: the least cosine similarity of a reworded repeat.
const THRESHOLD: Setting<f64> = Setting::real("threshold", 0.95, (0.0, true), (1.0, false));
/// `max_per_context`: vectors kept per context group.
const MAX_PER_CONTEXT_SETTING: Setting<u32> =
    Setting::range("max_per_context", 256, 1, MAX_PER_CONTEXT);
/// `max_contexts`: context group slots.
const MAX_CONTEXTS_SETTING: Setting<u32> = Setting::range("max_contexts", 64, 1, MAX_CONTEXTS);
/// `max_dimensions`: the longest vector kept (OpenAI's
/// `text-embedding-3-small`, 1536).
const MAX_DIMENSIONS_SETTING: Setting<u32> =
    Setting::range("max_dimensions", 1_536, 1, MAX_DIMENSIONS);
/// `max_text_bytes`: longer questions are left to the exact cache.
const MAX_TEXT_BYTES_SETTING: Setting<u32> =
    Setting::range("max_text_bytes", 8_192, 1, MAX_TEXT_BYTES);
/// `embeddings.path`.
const PATH: Setting<&str> = Setting::any("path", "/v1/embeddings");
/// `embeddings.timeout_ms`: a semantic lookup may slow a call by this much,
/// never more.
const TIMEOUT_MS: Setting<u64> = Setting::range("timeout_ms", 50, 1, 10_000);

/// The section's settings.
pub const SETTINGS: &[&dyn Row] = &[
    &THRESHOLD,
    &MAX_PER_CONTEXT_SETTING,
    &MAX_CONTEXTS_SETTING,
    &MAX_DIMENSIONS_SETTING,
    &MAX_TEXT_BYTES_SETTING,
];
/// The embeddings service's settings.
pub const EMBEDDINGS: &[&dyn Row] = &[&PATH, &crate::config::service::HEADERS, &TIMEOUT_MS];

/// `cache.semantic` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawSemanticConfig {
    /// Where embeddings come from (required).
    pub embeddings: Option<RawEmbeddingsConfig>,
    /// Least cosine similarity served, default 0.95.
    pub threshold: Option<f64>,
    /// Vectors kept per context group slot, default 256.
    pub max_per_context: Option<u32>,
    /// Context group slots, default 64.
    pub max_contexts: Option<u32>,
    /// Longest vector kept, default 1536.
    pub max_dimensions: Option<u32>,
    /// Longest question embedded, bytes, default 8192.
    pub max_text_bytes: Option<u32>,
}

/// `cache.semantic.embeddings` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawEmbeddingsConfig {
    /// The Envoy cluster serving an OpenAI-compatible embeddings endpoint.
    pub cluster: Option<String>,
    /// The `model` of the embeddings request.
    pub model: Option<String>,
    /// `:authority`, default the cluster name.
    pub authority: Option<String>,
    /// Path, default `/v1/embeddings`.
    pub path: Option<String>,
    /// Extra request headers (e.g. the service's credential).
    pub headers: Option<std::collections::BTreeMap<String, String>>,
    /// Wait for the answer, ms, default 50.
    pub timeout_ms: Option<u64>,
}

/// The compiled `cache.semantic` section.
#[derive(Debug, Clone, PartialEq)]
pub struct SemanticConfig {
    /// The embeddings service.
    pub embeddings: EmbeddingsConfig,
    /// Least cosine similarity served.
    pub threshold: f64,
    /// Vectors per context group slot.
    pub max_per_context: u32,
    /// Context group slots.
    pub max_contexts: u32,
    /// Longest vector kept.
    pub max_dimensions: u32,
    /// Longest question embedded, bytes.
    pub max_text_bytes: u32,
}

/// The compiled `cache.semantic.embeddings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingsConfig {
    /// Where the service is and how it is asked.
    pub service: Service,
    /// Model asked for.
    pub model: String,
}

impl SemanticConfig {
    /// Compiles the section; errors name the field relative to it.
    pub fn compile(raw: RawSemanticConfig) -> Result<Self, ConfigError> {
        let embeddings = raw.embeddings.ok_or_else(|| {
            ConfigError::new("embeddings", "is required: the cluster and model to ask")
        })?;
        let embeddings =
            EmbeddingsConfig::compile(embeddings).map_err(|e| e.within("embeddings"))?;
        Ok(Self {
            embeddings,
            threshold: THRESHOLD.read(raw.threshold)?,
            max_per_context: MAX_PER_CONTEXT_SETTING.read(raw.max_per_context)?,
            max_contexts: MAX_CONTEXTS_SETTING.read(raw.max_contexts)?,
            max_dimensions: MAX_DIMENSIONS_SETTING.read(raw.max_dimensions)?,
            max_text_bytes: MAX_TEXT_BYTES_SETTING.read(raw.max_text_bytes)?,
        })
    }
}

impl EmbeddingsConfig {
    fn compile(raw: RawEmbeddingsConfig) -> Result<Self, ConfigError> {
        let model = raw.model.filter(|m| !m.is_empty());
        let service = Service::compile(
            crate::raw_service!(raw),
            Defaults {
                path: PATH,
                timeout: TIMEOUT_MS,
            },
        )?;
        let model =
            model.ok_or_else(|| ConfigError::new("model", "is required: the embeddings model"))?;
        Ok(Self { service, model })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<SemanticConfig, ConfigError> {
        ConfigError::from_json(json.as_bytes())
            .and_then(SemanticConfig::compile)
            .map_err(|e| e.within("cache.semantic"))
    }

    const MIN: &str = r#"{"embeddings":{"cluster":"emb","model":"e5"}}"#;

    #[test]
    fn the_least_section_gives_the_defaults() {
        let c = parse(MIN).unwrap();
        assert_eq!(c.threshold, 0.95);
        assert_eq!((c.max_per_context, c.max_contexts), (256, 64));
        assert_eq!(c.max_dimensions, 1536);
        let e = &c.embeddings;
        assert_eq!(
            (e.service.cluster.as_str(), e.model.as_str()),
            ("emb", "e5")
        );
        assert_eq!(
            (e.service.authority.as_str(), e.service.path.as_str()),
            ("emb", "/v1/embeddings")
        );
        assert_eq!(e.service.timeout_ms, 50);
        assert!(e.service.headers.is_empty());
    }

    #[test]
    fn reads_every_field() {
        let c = parse(
            r#"{"embeddings":{"cluster":"emb","model":"m","authority":"emb.example",
                "path":"/embed?v=1","headers":{"Authorization":"Bearer k"},"timeout_ms":80},
                "threshold":0.9,"max_per_context":16,"max_contexts":4,"max_dimensions":384,
                "max_text_bytes":100}"#,
        )
        .unwrap();
        assert_eq!(c.threshold, 0.9);
        assert_eq!(
            (c.max_per_context, c.max_contexts, c.max_dimensions),
            (16, 4, 384)
        );
        assert_eq!(c.max_text_bytes, 100);
        assert_eq!(c.embeddings.service.authority, "emb.example");
        assert_eq!(c.embeddings.service.path, "/embed?v=1");
        assert_eq!(
            c.embeddings.service.headers,
            [("authorization".to_string(), "Bearer k".to_string())]
        );
        assert_eq!(c.embeddings.service.timeout_ms, 80);
    }

    #[test]
    fn errors_name_the_field() {
        for (doc, field) in [
            ("{}", "cache.semantic.embeddings"),
            (
                r#"{"embeddings":{"model":"m"}}"#,
                "cache.semantic.embeddings.cluster",
            ),
            (
                r#"{"embeddings":{"cluster":"c"}}"#,
                "cache.semantic.embeddings.model",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m","timeout_ms":0}}"#,
                "cache.semantic.embeddings.timeout_ms",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m","path":"v1"}}"#,
                "cache.semantic.embeddings.path",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m","authority":"a b"}}"#,
                "cache.semantic.embeddings.authority",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m","headers":{"content-length":"1"}}}"#,
                "cache.semantic.embeddings.headers.content-length",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m","headers":{"x":"a\nb"}}}"#,
                "cache.semantic.embeddings.headers.x",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m"},"threshold":0}"#,
                "cache.semantic.threshold",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m"},"threshold":1.5}"#,
                "cache.semantic.threshold",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m"},"max_per_context":0}"#,
                "cache.semantic.max_per_context",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m"},"max_contexts":65537}"#,
                "cache.semantic.max_contexts",
            ),
            (
                r#"{"embeddings":{"cluster":"c","model":"m"},"max_dimensions":9000}"#,
                "cache.semantic.max_dimensions",
            ),
        ] {
            let e = parse(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
        }
        assert!(serde_json::from_str::<RawSemanticConfig>(r#"{"dims":1}"#).is_err());
    }
}
