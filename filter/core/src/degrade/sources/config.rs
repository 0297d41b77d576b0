//! `degrade.alertmanager` and `degrade.prometheus`: the services a proxy
//! reads its alerts and its models' mesh-wide load from, and how often.

use std::collections::BTreeMap;

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::service::{query_escape, Defaults, Service, HEADERS};
use crate::config::setting::{Derived, Row, Setting};
use crate::load::Signal;

/// `alertmanager.path`.
const ALERTMANAGER_PATH: Setting<&str> = Setting::any("path", "/api/v2/alerts");
/// `prometheus.path`.
const PROMETHEUS_PATH: Setting<&str> = Setting::any("path", "/api/v1/query");
/// `interval_s` of Alertmanager's pull; at most an hour.
const ALERTMANAGER_INTERVAL_S: Setting<u64> = Setting::range("interval_s", 10, 1, 3_600);
/// `interval_s` of Prometheus's pull.
const PROMETHEUS_INTERVAL_S: Setting<u64> = Setting::range("interval_s", 15, 1, 3_600);
/// `timeout_ms`: the wait for a source's answer (never as long as the
/// interval either).
const TIMEOUT_MS: Setting<u64> = Setting::range("timeout_ms", 2_000, 1, 60_000);
/// `stale_after_s`: three intervals by default, at most three of the
/// longest.
const STALE_AFTER_S: Setting<u64> = Setting::range("stale_after_s", 0, 1, 3 * 3_600);
/// Its row: the default is derived.
const STALE_AFTER_S_ROW: Derived<u64> = Derived {
    setting: STALE_AFTER_S,
    default: "three intervals",
};
/// `model_label`.
const MODEL_LABEL: Setting<&str> = Setting::any("model_label", DEFAULT_MODEL_LABEL);

/// Alertmanager's settings.
pub const ALERTMANAGER: &[&dyn Row] = &[
    &ALERTMANAGER_PATH,
    &HEADERS,
    &TIMEOUT_MS,
    &ALERTMANAGER_INTERVAL_S,
];
/// Prometheus's settings.
pub const PROMETHEUS: &[&dyn Row] = &[
    &PROMETHEUS_PATH,
    &HEADERS,
    &TIMEOUT_MS,
    &PROMETHEUS_INTERVAL_S,
    &STALE_AFTER_S_ROW,
    &MODEL_LABEL,
];
/// Most `filters` of Alertmanager's pull.
const MAX_FILTERS: usize = 16;
/// Longest filter, receiver or query, bytes.
const MAX_EXPRESSION_BYTES: usize = 4_096;
/// Default label naming the model in a query's answer.
pub const DEFAULT_MODEL_LABEL: &str = "model";
/// Mesh-wide calls per second of each model: the sum of every proxy's own
/// window (`llm_filter_load_rps_milli`, calls that went upstream), so the
/// mesh value means what the local one means, summed.
pub const DEFAULT_RPS_QUERY: &str = "sum by (model) (llm_filter_load_rps_milli) / 1000";
/// Mesh-wide output tokens per second of each model, likewise.
pub const DEFAULT_TOKENS_QUERY: &str = "sum by (model) (llm_filter_load_tokens_per_s)";
/// Mesh-wide calls in flight of each model, likewise.
pub const DEFAULT_IN_FLIGHT_QUERY: &str = "sum by (model) (llm_filter_load_in_flight)";

crate::read_fields! {
    /// `degrade.alertmanager` as written.
    #[derive(Debug, Default, Clone)]
    pub struct RawAlertmanager {
        /// The Envoy cluster that reaches Alertmanager's API.
        pub cluster: Option<String>,
        /// `:authority`, default the cluster name.
        pub authority: Option<String>,
        /// Path, default `/api/v2/alerts`.
        pub path: Option<String>,
        /// Extra request headers (e.g. a credential).
        pub headers: Option<BTreeMap<String, String>>,
        /// Wait for the answer, ms.
        pub timeout_ms: Option<u64>,
        /// How often each proxy reads it, s.
        pub interval_s: Option<u64>,
        /// Alertmanager label matchers (`filter=`) the alerts must match.
        pub filters: Option<Vec<String>>,
        /// Only the alerts routed to receivers this regex matches (`receiver=`).
        pub receiver: Option<String>,
    }
}

crate::read_fields! {
    /// `degrade.prometheus` as written.
    #[derive(Debug, Default, Clone)]
    pub struct RawPrometheus {
        /// The Envoy cluster that reaches Prometheus's HTTP API.
        pub cluster: Option<String>,
        /// `:authority`, default the cluster name.
        pub authority: Option<String>,
        /// Path, default `/api/v1/query`.
        pub path: Option<String>,
        /// Extra request headers.
        pub headers: Option<BTreeMap<String, String>>,
        /// Wait for each answer, ms.
        pub timeout_ms: Option<u64>,
        /// How often each proxy asks, s.
        pub interval_s: Option<u64>,
        /// A reading older than this is not used, s; default three intervals.
        pub stale_after_s: Option<u64>,
        /// The label naming the model in the answers.
        pub model_label: Option<String>,
        /// The query of each signal (`rps`, `tokens_per_s`, `in_flight`); an
        /// empty one leaves that signal local.
        pub queries: Option<BTreeMap<String, String>>,
    }
}

/// The compiled `degrade.alertmanager`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertmanagerSource {
    /// Where it is.
    pub service: Service,
    /// How often each proxy reads it, ms.
    pub interval_ms: u64,
    /// The `:path` with its query: active alerts only, neither silenced nor
    /// inhibited, matching the filters and the receiver.
    pub path_and_query: String,
}

/// The compiled `degrade.prometheus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSource {
    /// Where it is.
    pub service: Service,
    /// How often each proxy asks, ms.
    pub interval_ms: u64,
    /// A reading older than this is not used, ms.
    pub stale_after_ms: u64,
    /// The label naming the model.
    pub model_label: String,
    /// Each signal read mesh-wide, with the `:path` and query that asks it.
    pub queries: Vec<(Signal, String)>,
}

/// The interval and the wait of a source: the wait shorter than the interval,
/// so one pull ends before the next is due.
fn interval_and_timeout(
    interval_s: Option<u64>,
    interval: Setting<u64>,
    timeout_ms: u64,
) -> Result<u64, ConfigError> {
    let interval_ms = interval.read(interval_s)? * 1000;
    if timeout_ms >= interval_ms {
        return Err(ConfigError::new(
            "timeout_ms",
            format!("{timeout_ms} is not shorter than the interval ({interval_ms} ms)"),
        ));
    }
    Ok(interval_ms)
}

/// A Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`, at most 128 bytes.
fn is_prometheus_label(s: &str) -> bool {
    s.len() <= 128
        && s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn expression(field: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() || s.len() > MAX_EXPRESSION_BYTES || s.chars().any(char::is_control) {
        return Err(ConfigError::new(
            field,
            format!("must be 1 to {MAX_EXPRESSION_BYTES} bytes without control characters"),
        ));
    }
    Ok(())
}

impl AlertmanagerSource {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawAlertmanager) -> Result<Self, ConfigError> {
        let service = Service::compile(
            crate::raw_service!(raw),
            Defaults {
                path: ALERTMANAGER_PATH,
                timeout: TIMEOUT_MS,
            },
        )?;
        let interval_ms =
            interval_and_timeout(raw.interval_s, ALERTMANAGER_INTERVAL_S, service.timeout_ms)?;
        let filters = raw.filters.unwrap_or_default();
        check::at_most("filters", &filters, MAX_FILTERS, "filters")?;
        let mut query =
            String::from("active=true&silenced=false&inhibited=false&unprocessed=false");
        for (i, f) in filters.iter().enumerate() {
            expression(&format!("filters[{i}]"), f)?;
            query.push_str("&filter=");
            query.push_str(&query_escape(f));
        }
        if let Some(r) = &raw.receiver {
            expression("receiver", r)?;
            query.push_str("&receiver=");
            query.push_str(&query_escape(r));
        }
        let sep = if service.path.contains('?') { '&' } else { '?' };
        let path_and_query = format!("{}{sep}{query}", service.path);
        Ok(Self {
            service,
            interval_ms,
            path_and_query,
        })
    }
}

/// `stale_after_s`, three intervals unless written, never shorter than one.
fn stale_after_ms(written: Option<u64>, interval_ms: u64) -> Result<u64, ConfigError> {
    let stale_after_s = written.unwrap_or(interval_ms * 3 / 1000);
    let stale_after_ms = STALE_AFTER_S.check(stale_after_s)? * 1000;
    if stale_after_ms < interval_ms {
        return Err(ConfigError::new(
            "stale_after_s",
            "is shorter than the interval: every reading would be stale before the next",
        ));
    }
    Ok(stale_after_ms)
}

/// `queries`: each signal's query (its default unless written, none when
/// written empty) as the `:path` that asks it; at least one.
fn compile_queries(
    mut written: BTreeMap<String, String>,
    path: &str,
) -> Result<Vec<(Signal, String)>, ConfigError> {
    let mut queries = Vec::with_capacity(3);
    for (signal, default) in [
        (Signal::Rps, DEFAULT_RPS_QUERY),
        (Signal::TokensPerS, DEFAULT_TOKENS_QUERY),
        (Signal::InFlight, DEFAULT_IN_FLIGHT_QUERY),
    ] {
        let query = written
            .remove(signal.as_str())
            .unwrap_or_else(|| default.to_string());
        if query.is_empty() {
            continue;
        }
        expression(&format!("queries.{}", signal.as_str()), &query)?;
        let sep = if path.contains('?') { '&' } else { '?' };
        queries.push((signal, format!("{path}{sep}query={}", query_escape(&query))));
    }
    if let Some(other) = written.keys().next() {
        return Err(ConfigError::new(
            format!("queries.{other}"),
            "is not a signal: rps, tokens_per_s or in_flight",
        ));
    }
    if queries.is_empty() {
        return Err(ConfigError::new(
            "queries",
            "every query is empty: nothing would be read",
        ));
    }
    Ok(queries)
}

impl PrometheusSource {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawPrometheus) -> Result<Self, ConfigError> {
        let service = Service::compile(
            crate::raw_service!(raw),
            Defaults {
                path: PROMETHEUS_PATH,
                timeout: TIMEOUT_MS,
            },
        )?;
        let interval_ms =
            interval_and_timeout(raw.interval_s, PROMETHEUS_INTERVAL_S, service.timeout_ms)?;
        let stale_after_ms = stale_after_ms(raw.stale_after_s, interval_ms)?;
        let model_label = MODEL_LABEL.or_string(raw.model_label);
        if !is_prometheus_label(&model_label) {
            return Err(ConfigError::new(
                "model_label",
                format!("{model_label:?} is not a Prometheus label name"),
            ));
        }
        let queries = compile_queries(raw.queries.unwrap_or_default(), &service.path)?;
        Ok(Self {
            service,
            interval_ms,
            stale_after_ms,
            model_label,
            queries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn am(json: &str) -> Result<AlertmanagerSource, ConfigError> {
        crate::config::read::parse(json.as_bytes()).and_then(AlertmanagerSource::compile)
    }

    fn prom(json: &str) -> Result<PrometheusSource, ConfigError> {
        crate::config::read::parse(json.as_bytes()).and_then(PrometheusSource::compile)
    }

    #[test]
    fn alertmanager_defaults_ask_for_the_active_alerts() {
        let a = am(r#"{"cluster":"am"}"#).unwrap();
        assert_eq!(a.interval_ms, 10_000);
        assert_eq!(a.service.timeout_ms, 2_000);
        assert_eq!(
            a.path_and_query,
            "/api/v2/alerts?active=true&silenced=false&inhibited=false&unprocessed=false"
        );
        let a = am(r#"{"cluster":"am","filters":["team=\"llm\""],"receiver":"llm-.*"}"#).unwrap();
        assert!(a
            .path_and_query
            .ends_with("&filter=team%3D%22llm%22&receiver=llm-.%2A"));
        for (doc, field) in [
            (r#"{}"#, "cluster"),
            (r#"{"cluster":"am","interval_s":0}"#, "interval_s"),
            (
                r#"{"cluster":"am","interval_s":2,"timeout_ms":2000}"#,
                "timeout_ms",
            ),
            (r#"{"cluster":"am","filters":[""]}"#, "filters[0]"),
            (r#"{"cluster":"am","receiver":"a\nb"}"#, "receiver"),
        ] {
            assert_eq!(am(doc).unwrap_err().field, field, "{doc}");
        }
    }

    #[test]
    fn prometheus_defaults_read_the_filters_own_metrics() {
        let p = prom(r#"{"cluster":"prom"}"#).unwrap();
        assert_eq!((p.interval_ms, p.stale_after_ms), (15_000, 45_000));
        assert_eq!(p.model_label, "model");
        let signals: Vec<Signal> = p.queries.iter().map(|(s, _)| *s).collect();
        assert_eq!(signals, [Signal::Rps, Signal::TokensPerS, Signal::InFlight]);
        assert!(p.queries[0]
            .1
            .starts_with("/api/v1/query?query=sum%20by%20%28model%29%20%28llm_filter_load_rps_milli%29%20%2F%201000"));
        let p = prom(
            r#"{"cluster":"prom","queries":{"rps":"llm:rps","in_flight":""},"interval_s":5,"stale_after_s":60}"#,
        )
        .unwrap();
        assert_eq!(p.queries.len(), 2);
        assert_eq!(
            p.queries[0],
            (Signal::Rps, "/api/v1/query?query=llm%3Arps".to_string())
        );
        assert_eq!(p.stale_after_ms, 60_000);
        for (doc, field) in [
            (r#"{"cluster":"p","stale_after_s":5}"#, "stale_after_s"),
            (r#"{"cluster":"p","model_label":"a-b"}"#, "model_label"),
            (
                r#"{"cluster":"p","queries":{"rps":"","tokens_per_s":"","in_flight":""}}"#,
                "queries",
            ),
        ] {
            assert_eq!(prom(doc).unwrap_err().field, field, "{doc}");
        }
        assert_eq!(
            prom(r#"{"cluster":"p","queries":{"qps":"x"}}"#)
                .unwrap_err()
                .field,
            "queries.qps"
        );
    }
}
