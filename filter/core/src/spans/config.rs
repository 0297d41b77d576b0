//! `tracing.otlp`: where the filter exports a span per LLM call, how it
//! batches them, how many it may hold, and which new traces it samples.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::service::{Defaults, Service};
use crate::config::setting::{Setting, Table};
use crate::guard::glob::{self, MAX_PATTERNS};
use crate::guard::Detectors;

/// `path` of the exports.
const PATH: Setting<&str> = Setting::any("path", "/v1/traces");
/// `timeout_ms`: the wait for the collector's answer.
const TIMEOUT_MS: Setting<u64> = Setting::range("timeout_ms", 5_000, 1, 60_000);
/// `batch_size`: spans per export.
const BATCH_SIZE: Setting<u32> = Setting::range("batch_size", 128, 1, 2_048);
/// `interval_ms`: a span waits at most this long for its batch.
const INTERVAL_MS: Setting<u64> = Setting::range("interval_ms", 2_000, 100, 60_000);
/// `max_queue`: spans a worker holds; beyond, new ones are dropped.
const MAX_QUEUE: Setting<u32> = Setting::range("max_queue", 2_048, 1, 65_536);
/// `sample_ratio`: share of new traces sampled.
const SAMPLE_RATIO: Setting<f64> = Setting::fraction("sample_ratio", 1.0);
/// `service_name`.
const SERVICE_NAME: Setting<&str> = Setting::any("service_name", "llm-filter");
/// `max_queue_bytes`: the bytes of the spans a worker holds.
const MAX_QUEUE_BYTES: Setting<usize> =
    Setting::range("max_queue_bytes", 4 << 20, 64 << 10, 64 << 20);
/// `tracing.capture.prompt`.
const PROMPT: Setting<bool> = Setting::any("prompt", false);
/// `tracing.capture.completion`.
const COMPLETION: Setting<bool> = Setting::any("completion", false);
/// `tracing.capture.max_bytes`: the longest captured attribute.
const MAX_BYTES: Setting<usize> = Setting::range("max_bytes", 4_096, 64, 65_536);
/// `tracing.capture.redact_builtins`.
const REDACT_BUILTINS: Setting<bool> = Setting::any("redact_builtins", true);

/// The settings of the export and of the capture.
pub const SETTINGS: Table = &[
    (
        "tracing.otlp",
        &[
            &PATH,
            &crate::config::service::HEADERS,
            &TIMEOUT_MS,
            &BATCH_SIZE,
            &INTERVAL_MS,
            &MAX_QUEUE,
            &SAMPLE_RATIO,
            &SERVICE_NAME,
            &MAX_QUEUE_BYTES,
        ],
    ),
    (
        "tracing.capture",
        &[&PROMPT, &COMPLETION, &MAX_BYTES, &REDACT_BUILTINS],
    ),
];
/// A span's bytes besides what it captured, at most: its ids, names and
/// attributes (strings cut at 256 bytes).
pub const SPAN_BYTES_WITHOUT_CAPTURE: usize = 8 << 10;

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
    /// Bytes of the spans a worker holds at most.
    pub max_queue_bytes: Option<usize>,
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
    /// Bytes of the spans a worker holds at most.
    pub max_queue_bytes: usize,
}

impl OtlpConfig {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawOtlp) -> Result<Self, ConfigError> {
        let service = Service::compile(
            crate::raw_service!(raw),
            Defaults {
                path: PATH,
                timeout: TIMEOUT_MS,
            },
        )?;
        let batch_size = BATCH_SIZE.read(raw.batch_size)?;
        let max_queue = MAX_QUEUE.read(raw.max_queue)?;
        if max_queue < batch_size {
            return Err(ConfigError::new(
                "max_queue",
                format!("{max_queue} holds less than one batch ({batch_size})"),
            ));
        }
        let service_name = SERVICE_NAME.or_string(raw.service_name);
        if !check::is_name(&service_name) {
            return Err(ConfigError::new(
                "service_name",
                "must be 1 to 256 characters without control characters",
            ));
        }
        Ok(Self {
            service,
            batch_size,
            interval_ms: INTERVAL_MS.read(raw.interval_ms)?,
            max_queue,
            sample_ratio: SAMPLE_RATIO.read(raw.sample_ratio)?,
            service_name,
            max_queue_bytes: MAX_QUEUE_BYTES.read(raw.max_queue_bytes)?,
        })
    }
}

/// `tracing.capture` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCapture {
    /// Capture the prompt (system instructions and input messages).
    pub prompt: Option<bool>,
    /// Capture the completion (output messages).
    pub completion: Option<bool>,
    /// Longest captured attribute, bytes.
    pub max_bytes: Option<usize>,
    /// Glob patterns of words replaced by `[REDACTED]`.
    pub redact: Option<Vec<String>>,
    /// Redact e-mail addresses, API keys, tokens, private keys,
    /// credentials, payment card numbers and IBANs by their shape, default
    /// true.
    pub redact_builtins: Option<bool>,
}

/// The compiled `tracing.capture`: off unless asked.
#[derive(Debug, Clone)]
pub struct CaptureConfig {
    /// Capture the prompt.
    pub prompt: bool,
    /// Capture the completion.
    pub completion: bool,
    /// Longest captured attribute, bytes.
    pub max_bytes: usize,
    /// Glob patterns (`*`, `?`) of words replaced by `[REDACTED]`.
    pub redact: Vec<String>,
    /// Redact e-mail addresses, API keys, tokens, private keys,
    /// credentials, payment card numbers and IBANs by their shape.
    pub redact_builtins: bool,
    /// The detectors of the guardrails' rules that block or mask
    /// ([`crate::guard::policy::Guardrails::withheld`]): what they find is
    /// redacted too, whatever the settings above.
    pub guarded: Option<Detectors>,
}

/// Two captures are the same by their settings: `guarded` is built from
/// the guardrails, which are compared on their own.
impl PartialEq for CaptureConfig {
    fn eq(&self, other: &Self) -> bool {
        self.prompt == other.prompt
            && self.completion == other.completion
            && self.max_bytes == other.max_bytes
            && self.redact == other.redact
            && self.redact_builtins == other.redact_builtins
    }
}

impl Eq for CaptureConfig {}

impl Default for CaptureConfig {
    /// Nothing captured.
    fn default() -> Self {
        Self {
            prompt: false,
            completion: false,
            max_bytes: MAX_BYTES.default,
            redact: Vec::new(),
            redact_builtins: REDACT_BUILTINS.default,
            guarded: None,
        }
    }
}

impl CaptureConfig {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawCapture) -> Result<Self, ConfigError> {
        let redact = raw.redact.unwrap_or_default();
        check::at_most("redact", &redact, MAX_PATTERNS, "patterns")?;
        for (i, p) in redact.iter().enumerate() {
            if let Some(message) = glob::invalid(p) {
                return Err(ConfigError::new(format!("redact[{i}]"), message));
            }
        }
        Ok(Self {
            prompt: PROMPT.or(raw.prompt),
            completion: COMPLETION.or(raw.completion),
            max_bytes: MAX_BYTES.read(raw.max_bytes)?,
            redact,
            redact_builtins: REDACT_BUILTINS.or(raw.redact_builtins),
            guarded: None,
        })
    }

    /// Anything is captured.
    pub fn any(&self) -> bool {
        self.prompt || self.completion
    }

    /// The most a span's captures add to it: three attributes (system
    /// instructions, input and output messages) of at most `max_bytes`.
    pub fn span_bytes(&self) -> usize {
        if self.any() {
            self.max_bytes.saturating_mul(3)
        } else {
            0
        }
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
            (
                r#"{"cluster":"o","max_queue_bytes":1024}"#,
                "max_queue_bytes",
            ),
        ] {
            assert_eq!(parse(doc).unwrap_err().field, field, "{doc}");
        }
        assert_eq!(c.max_queue_bytes, 4 << 20);
    }

    fn capture(json: &str) -> Result<CaptureConfig, ConfigError> {
        ConfigError::from_json(json.as_bytes()).and_then(CaptureConfig::compile)
    }

    #[test]
    fn capture_is_off_by_default_and_checked() {
        let c = capture("{}").unwrap();
        assert_eq!(c, CaptureConfig::default());
        assert!(!c.any() && c.redact_builtins && c.span_bytes() == 0);
        let on = capture(r#"{"prompt":true,"max_bytes":100,"redact":["sk-*"]}"#).unwrap();
        assert!(on.any() && !on.completion);
        assert_eq!((on.max_bytes, on.span_bytes()), (100, 300));
        let long = format!(r#"{{"redact":["{}"]}}"#, "a".repeat(200));
        let many = format!(r#"{{"redact":[{}]}}"#, vec![r#""a*""#; 33].join(","));
        for (doc, field) in [
            (r#"{"max_bytes":0}"#, "max_bytes"),
            (r#"{"max_bytes":100000}"#, "max_bytes"),
            (r#"{"redact":["x","**"]}"#, "redact[1]"),
            (r#"{"redact":["a b"]}"#, "redact[0]"),
            (long.as_str(), "redact[0]"),
            (many.as_str(), "redact"),
            (r#"{"prompt":1}"#, "prompt"),
            (r#"{"headers":true}"#, "headers"),
        ] {
            assert_eq!(capture(doc).unwrap_err().field, field, "{doc}");
        }
    }
}
