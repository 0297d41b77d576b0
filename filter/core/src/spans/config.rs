//! `tracing.otlp`: where the filter exports a span per LLM call, how it
//! batches them, how many it may hold, and which new traces it samples.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::service::{Defaults, Service};

/// Default `batch_size`: spans per export.
pub const DEFAULT_BATCH_SIZE: u32 = 128;
/// Largest `batch_size`.
const MAX_BATCH_SIZE: u32 = 2_048;
/// Default `interval_ms`: a span waits at most this long for its batch.
pub const DEFAULT_INTERVAL_MS: u64 = 2_000;
/// Default `max_queue`: spans a worker holds; beyond, new ones are dropped.
pub const DEFAULT_MAX_QUEUE: u32 = 2_048;
/// Largest `max_queue`.
const MAX_MAX_QUEUE: u32 = 65_536;
/// Default wait for the collector's answer, ms.
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;
/// Default `service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "llm-filter";

/// `tracing.otlp` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawOtlp {
    /// The Envoy cluster of the collector (OTLP/HTTP).
    pub cluster: Option<String>,
    /// `:authority`, default the cluster name.
    pub authority: Option<String>,
    /// Path, default `/v1/traces`.
    pub path: Option<String>,
    /// Extra request headers (e.g. a credential).
    pub headers: Option<BTreeMap<String, String>>,
    /// Wait for the collector's answer, ms.
    pub timeout_ms: Option<u64>,
    /// Spans per export.
    pub batch_size: Option<u32>,
    /// Longest a span waits for its batch, ms.
    pub interval_ms: Option<u64>,
    /// Spans a worker holds at most.
    pub max_queue: Option<u32>,
    /// Share of new traces (no sampled parent) whose spans are exported.
    pub sample_ratio: Option<f64>,
    /// The resource's `service.name`.
    pub service_name: Option<String>,
}

/// The compiled `tracing.otlp`.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The collector.
    pub service: Service,
    /// Spans per export.
    pub batch_size: u32,
    /// Longest a span waits for its batch, ms.
    pub interval_ms: u64,
    /// Spans a worker holds at most.
    pub max_queue: u32,
    /// Share of new traces sampled.
    pub sample_ratio: f64,
    /// The resource's `service.name`.
    pub service_name: String,
}

impl OtlpConfig {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawOtlp) -> Result<Self, ConfigError> {
        let service = Service::compile(
            crate::raw_service!(raw),
            Defaults {
                path: "/v1/traces",
                timeout_ms: DEFAULT_TIMEOUT_MS,
                max_timeout_ms: 60_000,
            },
        )?;
        let batch_size = check::field("batch_size", raw.batch_size, DEFAULT_BATCH_SIZE)
            .in_range(1..=MAX_BATCH_SIZE)?;
        let max_queue = check::field("max_queue", raw.max_queue, DEFAULT_MAX_QUEUE)
            .in_range(1..=MAX_MAX_QUEUE)?;
        if max_queue < batch_size {
            return Err(ConfigError::new(
                "max_queue",
                format!("{max_queue} holds less than one batch ({batch_size})"),
            ));
        }
        let service_name = raw
            .service_name
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
        if !check::is_name(&service_name) {
            return Err(ConfigError::new(
                "service_name",
                "must be 1 to 256 characters without control characters",
            ));
        }
        Ok(Self {
            service,
            batch_size,
            interval_ms: check::field("interval_ms", raw.interval_ms, DEFAULT_INTERVAL_MS)
                .in_range(100..=60_000)?,
            max_queue,
            sample_ratio: check::field("sample_ratio", raw.sample_ratio, 1.0).fraction()?,
            service_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<OtlpConfig, ConfigError> {
        ConfigError::from_json(json.as_bytes()).and_then(OtlpConfig::compile)
    }

    #[test]
    fn defaults_and_errors() {
        let c = parse(r#"{"cluster":"otel"}"#).unwrap();
        assert_eq!(c.service.path, "/v1/traces");
        assert_eq!(
            (c.batch_size, c.max_queue, c.interval_ms),
            (128, 2048, 2000)
        );
        assert_eq!(
            (c.sample_ratio, c.service_name.as_str()),
            (1.0, "llm-filter")
        );
        for (doc, field) in [
            (r#"{}"#, "cluster"),
            (r#"{"cluster":"o","batch_size":0}"#, "batch_size"),
            (
                r#"{"cluster":"o","batch_size":64,"max_queue":32}"#,
                "max_queue",
            ),
            (r#"{"cluster":"o","sample_ratio":1.5}"#, "sample_ratio"),
            (r#"{"cluster":"o","interval_ms":10}"#, "interval_ms"),
            (r#"{"cluster":"o","service_name":""}"#, "service_name"),
        ] {
            assert_eq!(parse(doc).unwrap_err().field, field, "{doc}");
        }
    }
}
