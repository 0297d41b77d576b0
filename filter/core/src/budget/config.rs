//! The `budget` section of the plugin configuration, parsed strictly and compiled
//! once into checked values, so the data path never meets an inverted tier, a
//! ratio outside `[0, 1]` or a retry condition Envoy would silently ignore.

use std::ops::RangeInclusive;

use serde_json::Value;

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::read::{self, Read};
use crate::config::setting::{Bound, List, Named, Setting, Table};
use crate::priority::Priority;

/// Buckets of the breaker's sliding window: fine enough that old calls age out
/// smoothly, small enough that one window is a couple of hundred bytes.
pub const BUCKETS: usize = 10;

/// Retry conditions Envoy's `x-envoy-retry-on` understands (router
/// `parseRetryOn`); anything else Envoy drops without a word, so it is refused here.
pub const RETRY_ON_VALUES: [&str; 11] = [
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
];

/// `enabled`.
const ENABLED: Setting<bool> = Setting::any("enabled", true);
/// `default_ms` of each priority not given (or `max_ms` when lower).
const DEFAULT_MS: Setting<u64> = Setting {
    name: "default_ms",
    default: 60_000,
    bound: Bound::Stated("1 to `max_ms`"),
};
/// `max_ms`.
const MAX_MS: Setting<u64> = Setting {
    name: "max_ms",
    default: 300_000,
    bound: Bound::Positive("number of ms"),
};
/// `min_per_try_ms`.
const MIN_PER_TRY_MS: Setting<u64> = Setting {
    name: "min_per_try_ms",
    default: 1_000,
    bound: Bound::Stated("1 to `max_ms`"),
};
/// `retry_ratio`.
const RETRY_RATIO: Setting<f64> = Setting::fraction("retry_ratio", 0.2);
/// `max_retries`.
const MAX_RETRIES: Setting<u32> = Setting::range("max_retries", 2, 0, 10);
/// `retry_on`.
const RETRY_ON: Setting<&str> = Setting::any(
    "retry_on",
    "5xx,reset,connect-failure,retriable-status-codes",
);
// 503 is already covered by `5xx`; it is listed so the default stays right when
// an operator narrows `retry_on` to `gateway-error` or drops `5xx`.
/// `retriable_status_codes`.
const RETRIABLE_STATUS_CODES: List<u16> = List::new("retriable_status_codes", &[429, 503]);
const ERROR_STATUSES: RangeInclusive<u16> = 400..=599;
/// `window_s`.
const WINDOW_S: Setting<u64> = Setting::range("window_s", 30, 1, 3_600);
/// `shed_at`.
const SHED_AT: Setting<f64> = Setting::real("shed_at", 0.7, (0.0, true), (1.0, true));
/// `reject_at`.
const REJECT_AT: Setting<f64> = Setting {
    name: "reject_at",
    default: 0.9,
    bound: Bound::Stated("(`shed_at`, 1]"),
};
/// `shed_fraction`.
const SHED_FRACTION: Setting<f64> = Setting::fraction("shed_fraction", 0.2);
/// `probe_fraction`.
const PROBE_FRACTION: Setting<f64> = Setting::fraction("probe_fraction", 0.05);
/// `min_calls`.
const MIN_CALLS: Setting<u32> = Setting {
    name: "min_calls",
    default: 10,
    bound: Bound::Positive("count"),
};
/// `streaming`.
const STREAMING: Named<StreamingMode> = Named {
    name: "streaming",
    default: StreamingMode::UntilHeaders,
    spell: StreamingMode::as_str,
};

/// The section's settings.
pub const SETTINGS: Table = &[(
    "budget",
    &[
        &ENABLED,
        &DEFAULT_MS,
        &MAX_MS,
        &MIN_PER_TRY_MS,
        &RETRY_RATIO,
        &MAX_RETRIES,
        &RETRY_ON,
        &RETRIABLE_STATUS_CODES,
        &WINDOW_S,
        &SHED_AT,
        &REJECT_AT,
        &SHED_FRACTION,
        &PROBE_FRACTION,
        &MIN_CALLS,
        &STREAMING,
    ],
)];

crate::read_fields! {
    /// `budget` as written by the operator.
    #[derive(Debug, Default)]
    pub struct RawBudgetConfig {
        /// Budgets, plans and the breaker on or off; default true.
        pub enabled: Option<bool>,
        /// Budget of a call that names none: one number of ms, or
        /// `{"P0": ms, "P1": ms, "P2": ms}`; default 60000.
        pub default_ms: Option<RawDefaultMs>,
        /// Ceiling of any budget, the caller's included; default 300000.
        pub max_ms: Option<u64>,
        /// Shortest per-try timeout ever planned; default 1000.
        pub min_per_try_ms: Option<u64>,
        /// Retries allowed per call in the window, in `[0, 1]`; default 0.2.
        pub retry_ratio: Option<f64>,
        /// Most retries of one call; default 2.
        pub max_retries: Option<u32>,
        /// Envoy retry conditions, comma-separated as in `x-envoy-retry-on`.
        pub retry_on: Option<String>,
        /// Statuses retried under `retriable-status-codes`; default `[429, 503]`.
        pub retriable_status_codes: Option<Vec<u16>>,
        /// Length of the breaker's sliding window in seconds; default 30.
        pub window_s: Option<u64>,
        /// Pressure from which P2 and a share of P1 are shed; default 0.7.
        pub shed_at: Option<f64>,
        /// Pressure from which P1 and P2 are rejected; default 0.9.
        pub reject_at: Option<f64>,
        /// Share of P1 shed in the shed tier; default 0.2.
        pub shed_fraction: Option<f64>,
        /// Share of refused traffic let through as half-open probes; default 0.05.
        pub probe_fraction: Option<f64>,
        /// Calls the window must hold before the breaker may leave pass; default 10.
        pub min_calls: Option<u32>,
        /// `until_headers` (default) or `whole_stream`; see [`StreamingMode`].
        pub streaming: Option<StreamingMode>,
    }
}

/// `budget.default_ms` as written: one budget for every priority, or one each.
pub use crate::config::per_priority::RawPerPriority as RawDefaultMs;

/// How far a streamed answer is held to the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamingMode {
    /// The budget bounds the wait for the response to start (Envoy's per-try
    /// timeout stops applying once response headers went downstream); the
    /// stream itself may run up to `max_ms`, so a healthy long generation is
    /// never cut. Stalls are left to the route's `idle_timeout`.
    #[default]
    UntilHeaders,
    /// Streams are held to the whole budget like any call: the caller said
    /// that is all the time it has, stream or not.
    WholeStream,
}

impl Read for StreamingMode {
    fn read(v: &Value) -> Result<Self, ConfigError> {
        read::variant(v, &[Self::UntilHeaders, Self::WholeStream], Self::as_str)
    }
}

impl StreamingMode {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UntilHeaders => "until_headers",
            Self::WholeStream => "whole_stream",
        }
    }
}

/// The compiled `budget` section.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetConfig {
    /// Budgets, plans and the breaker are applied.
    pub enabled: bool,
    /// Default budget by [`Priority::index`], each in `1..=max_ms`.
    pub default_ms: [u64; 3],
    /// Ceiling of any budget, at least 1.
    pub max_ms: u64,
    /// Shortest per-try timeout planned, in `1..=max_ms`.
    pub min_per_try_ms: u64,
    /// Retries allowed per call over the window, in `[0, 1]`.
    pub retry_ratio: f64,
    /// Most retries of one call.
    pub max_retries: u32,
    /// Normalised `x-envoy-retry-on` value (no spaces, no duplicates); may be empty.
    pub retry_on: String,
    /// Normalised `x-envoy-retriable-status-codes` value; may be empty.
    pub retriable_status_codes: String,
    /// Length of the breaker window in ms.
    pub window_ms: u64,
    /// Length of one of the [`BUCKETS`] buckets in ms.
    pub bucket_ms: u64,
    /// Pressure at which the shed tier starts, in `(0, 1)`.
    pub shed_at: f64,
    /// Pressure at which the reject tier starts, in `(shed_at, 1]`.
    pub reject_at: f64,
    /// Share of P1 shed in the shed tier, in `[0, 1]`.
    pub shed_fraction: f64,
    /// Share of refused calls let through as probes, in `[0, 1]`.
    pub probe_fraction: f64,
    /// Calls the window must hold before its pressure counts.
    pub min_calls: u32,
    /// Budget handling of streamed answers.
    pub streaming: StreamingMode,
}

#[cfg(test)]
impl Default for BudgetConfig {
    /// The empty section.
    fn default() -> Self {
        check::defaults(Self::compile)
    }
}

impl BudgetConfig {
    /// Compiles the section, one error per broken invariant, naming the field
    /// relative to the section (`shed_at`) and the bad value.
    pub fn compile(raw: RawBudgetConfig) -> Result<Self, ConfigError> {
        // Budgets.
        let max_ms = MAX_MS.read(raw.max_ms)?;
        let default_ms = default_ms(raw.default_ms, max_ms)?;
        let min_per_try_ms = up_to_max_ms(
            MIN_PER_TRY_MS.name,
            MIN_PER_TRY_MS.or(raw.min_per_try_ms),
            max_ms,
        )?;
        // Retries.
        let retry_ratio = RETRY_RATIO.read(raw.retry_ratio)?;
        let max_retries = MAX_RETRIES.read(raw.max_retries)?;
        let (retry_on, retriable_status_codes) =
            retry_conditions(raw.retry_on.as_deref(), raw.retriable_status_codes)?;
        // The breaker.
        let (window_ms, bucket_ms) = window_ms(WINDOW_S.read(raw.window_s)?);
        let shed_at = SHED_AT.read(raw.shed_at)?;
        let reject_at = above_shed_at(REJECT_AT.name, REJECT_AT.or(raw.reject_at), shed_at)?;
        let shed_fraction = SHED_FRACTION.read(raw.shed_fraction)?;
        let probe_fraction = PROBE_FRACTION.read(raw.probe_fraction)?;
        let min_calls = MIN_CALLS.read(raw.min_calls)?;
        Ok(Self {
            enabled: ENABLED.or(raw.enabled),
            default_ms,
            max_ms,
            min_per_try_ms,
            retry_ratio,
            max_retries,
            retry_on,
            retriable_status_codes,
            window_ms,
            bucket_ms,
            shed_at,
            reject_at,
            shed_fraction,
            probe_fraction,
            min_calls,
            streaming: STREAMING.default_or(raw.streaming),
        })
    }

    /// The budget of a call of `priority` that names none.
    pub fn default_for(&self, priority: Priority) -> u64 {
        self.default_ms
            .get(priority.index())
            .copied()
            .unwrap_or(self.max_ms)
    }
}

/// `default_ms`, one budget or one per priority, each within `max_ms`.
fn default_ms(raw: Option<RawDefaultMs>, max_ms: u64) -> Result<[u64; 3], ConfigError> {
    // A small ceiling pulls the built-in default down with it.
    let builtin = DEFAULT_MS.default.min(max_ms);
    match raw {
        None => Ok([builtin; 3]),
        Some(RawDefaultMs::All(ms)) => Ok([up_to_max_ms("default_ms", ms, max_ms)?; 3]),
        Some(RawDefaultMs::PerPriority(per)) => {
            let mut out = [builtin; 3];
            for (p, (slot, given)) in Priority::ALL.iter().zip(out.iter_mut().zip(per)) {
                if let Some(ms) = given {
                    *slot = up_to_max_ms(&format!("default_ms.{p}"), ms, max_ms)?;
                }
            }
            Ok(out)
        }
    }
}

/// A budget no longer than the ceiling, the message naming it.
fn up_to_max_ms(field: &str, ms: u64, max_ms: u64) -> Result<u64, ConfigError> {
    if ms == 0 || ms > max_ms {
        return Err(ConfigError::new(
            field,
            format!("{ms} is not in 1..=budget.max_ms ({max_ms})"),
        ));
    }
    Ok(ms)
}

/// `retry_on` and `retriable_status_codes`, both normalised for their Envoy
/// headers.
fn retry_conditions(
    retry_on: Option<&str>,
    codes: Option<Vec<u16>>,
) -> Result<(String, String), ConfigError> {
    let retry_on = normalise_retry_on(retry_on.unwrap_or(RETRY_ON.default))?;
    let codes = RETRIABLE_STATUS_CODES.or(codes);
    let distinct = distinct_error_statuses(&codes)?;
    // Envoy only looks at the codes under this condition; refusing the
    // mismatch beats a retry policy that quietly does less than it says.
    if !distinct.is_empty() && !retry_on.split(',').any(|v| v == "retriable-status-codes") {
        return Err(ConfigError::new(
            "retriable_status_codes",
            format!(
                "{codes:?} are only retried when budget.retry_on contains \
                 retriable-status-codes (it is {retry_on:?})"
            ),
        ));
    }
    Ok((retry_on, join_codes(&distinct)))
}

fn normalise_retry_on(raw: &str) -> Result<String, ConfigError> {
    let mut out: Vec<&str> = Vec::new();
    for token in raw.split(',').map(str::trim) {
        if token.is_empty() {
            continue;
        }
        if !RETRY_ON_VALUES.contains(&token) {
            return Err(ConfigError::new(
                "retry_on",
                format!(
                    "{token:?} is not an Envoy retry condition ({})",
                    RETRY_ON_VALUES.join(", ")
                ),
            ));
        }
        if !out.contains(&token) {
            out.push(token);
        }
    }
    Ok(out.join(","))
}

/// The codes in order, each once, every one an error status.
fn distinct_error_statuses(codes: &[u16]) -> Result<Vec<u16>, ConfigError> {
    let mut seen = Vec::with_capacity(codes.len());
    for (i, &code) in codes.iter().enumerate() {
        if !ERROR_STATUSES.contains(&code) {
            return Err(ConfigError::new(
                format!("retriable_status_codes[{i}]"),
                format!(
                    "{code} is not an error status ({}..={})",
                    ERROR_STATUSES.start(),
                    ERROR_STATUSES.end()
                ),
            ));
        }
        if !seen.contains(&code) {
            seen.push(code);
        }
    }
    Ok(seen)
}

/// The `x-envoy-retriable-status-codes` value of `codes`.
fn join_codes(codes: &[u16]) -> String {
    codes
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The breaker window and one of its [`BUCKETS`] buckets, in ms.
fn window_ms(window_s: u64) -> (u64, u64) {
    let window_ms = window_s.saturating_mul(1000);
    (window_ms, (window_ms / BUCKETS as u64).max(1))
}

/// The reject tier: a pressure in `[0, 1]` above where shedding starts.
fn above_shed_at(field: &str, reject_at: f64, shed_at: f64) -> Result<f64, ConfigError> {
    let reject_at = check::fraction(field, reject_at)?;
    if reject_at <= shed_at {
        return Err(ConfigError::new(
            field,
            format!("{reject_at} is not above budget.shed_at ({shed_at})"),
        ));
    }
    Ok(reject_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<BudgetConfig, ConfigError> {
        read::parse(json.as_bytes())
            .and_then(BudgetConfig::compile)
            .map_err(|e| e.within("budget"))
    }

    #[test]
    fn empty_section_is_useful() {
        let c = parse("{}").unwrap();
        assert_eq!(c, BudgetConfig::default());
        assert!(c.enabled);
        assert_eq!(c.default_ms, [60_000; 3]);
        assert_eq!(c.max_ms, 300_000);
        assert_eq!(c.min_per_try_ms, 1_000);
        assert_eq!(c.retry_ratio, 0.2);
        assert_eq!(c.max_retries, 2);
        assert_eq!(
            c.retry_on,
            "5xx,reset,connect-failure,retriable-status-codes"
        );
        assert_eq!(c.retriable_status_codes, "429,503");
        assert_eq!(c.window_ms, 30_000);
        assert_eq!(c.bucket_ms, 3_000);
        assert_eq!((c.shed_at, c.reject_at), (0.7, 0.9));
        assert_eq!((c.shed_fraction, c.probe_fraction), (0.2, 0.05));
        assert_eq!(c.min_calls, 10);
        assert_eq!(c.streaming, StreamingMode::UntilHeaders);
    }

    #[test]
    fn reads_every_field() {
        let c = parse(
            r#"{"enabled":false,"default_ms":{"P0":120000,"P2":5000},"max_ms":200000,
                "min_per_try_ms":500,"retry_ratio":0.1,"max_retries":3,
                "retry_on":" gateway-error , reset,reset ,retriable-status-codes",
                "retriable_status_codes":[429,429,500],"window_s":10,"shed_at":0.5,
                "reject_at":1,"shed_fraction":0.5,"probe_fraction":0,"min_calls":3,
                "streaming":"whole_stream"}"#,
        )
        .unwrap();
        assert!(!c.enabled);
        assert_eq!(c.default_ms, [120_000, 60_000, 5_000]);
        assert_eq!(c.default_for(Priority::P2), 5_000);
        assert_eq!(c.max_ms, 200_000);
        assert_eq!(c.min_per_try_ms, 500);
        assert_eq!(c.retry_ratio, 0.1);
        assert_eq!(c.max_retries, 3);
        assert_eq!(c.retry_on, "gateway-error,reset,retriable-status-codes");
        assert_eq!(c.retriable_status_codes, "429,500");
        assert_eq!((c.window_ms, c.bucket_ms), (10_000, 1_000));
        assert_eq!((c.shed_at, c.reject_at), (0.5, 1.0));
        assert_eq!((c.shed_fraction, c.probe_fraction), (0.5, 0.0));
        assert_eq!(c.min_calls, 3);
        assert_eq!(c.streaming, StreamingMode::WholeStream);

        let c = parse(r#"{"default_ms":1500}"#).unwrap();
        assert_eq!(c.default_ms, [1_500; 3]);
        // A small ceiling pulls the built-in default down with it.
        let c = parse(r#"{"max_ms":1000}"#).unwrap();
        assert_eq!(c.default_ms, [1_000; 3]);
        // No retry conditions at all is a valid choice: no retries.
        let c = parse(r#"{"retry_on":"","retriable_status_codes":[]}"#).unwrap();
        assert_eq!(
            (c.retry_on.as_str(), c.retriable_status_codes.as_str()),
            ("", "")
        );
    }

    #[test]
    fn errors_name_the_field_and_value() {
        for (doc, field, needle) in [
            (r#"{"bogus":1}"#, "budget.bogus", "unknown field"),
            (r#"{"max_ms":0}"#, "budget.max_ms", "0"),
            (r#"{"max_ms":-1}"#, "budget.max_ms", "-1"),
            (r#"{"default_ms":0}"#, "budget.default_ms", "0"),
            (r#"{"default_ms":-5}"#, "budget.default_ms", "-5"),
            (r#"{"default_ms":1.5}"#, "budget.default_ms", "1.5"),
            (r#"{"default_ms":"fast"}"#, "budget.default_ms", "fast"),
            (r#"{"default_ms":400000}"#, "budget.default_ms", "400000"),
            (
                r#"{"default_ms":{"P3":1}}"#,
                "budget.default_ms.P3",
                "unknown field",
            ),
            (r#"{"default_ms":{"P1":"x"}}"#, "budget.default_ms.P1", "x"),
            (r#"{"default_ms":{"P2":0}}"#, "budget.default_ms.P2", "0"),
            (r#"{"min_per_try_ms":0}"#, "budget.min_per_try_ms", "0"),
            (
                r#"{"max_ms":500,"default_ms":500}"#,
                "budget.min_per_try_ms",
                "1000",
            ),
            (r#"{"retry_ratio":1.5}"#, "budget.retry_ratio", "1.5"),
            (r#"{"retry_ratio":-0.1}"#, "budget.retry_ratio", "-0.1"),
            (r#"{"max_retries":11}"#, "budget.max_retries", "11"),
            (
                r#"{"retry_on":"5xx,timeout"}"#,
                "budget.retry_on",
                "timeout",
            ),
            (
                r#"{"retriable_status_codes":[200]}"#,
                "budget.retriable_status_codes[0]",
                "200",
            ),
            (
                r#"{"retriable_status_codes":[70000]}"#,
                "budget.retriable_status_codes[0]",
                "70000",
            ),
            (
                r#"{"retry_on":"5xx"}"#,
                "budget.retriable_status_codes",
                "retriable-status-codes",
            ),
            (r#"{"window_s":0}"#, "budget.window_s", "0"),
            (r#"{"window_s":86400}"#, "budget.window_s", "86400"),
            (r#"{"shed_at":0}"#, "budget.shed_at", "0"),
            (r#"{"shed_at":1}"#, "budget.shed_at", "1"),
            (r#"{"shed_at":0.95}"#, "budget.reject_at", "0.9"),
            (r#"{"reject_at":1.2}"#, "budget.reject_at", "1.2"),
            (r#"{"shed_fraction":2}"#, "budget.shed_fraction", "2"),
            (r#"{"probe_fraction":-1}"#, "budget.probe_fraction", "-1"),
            (r#"{"min_calls":0}"#, "budget.min_calls", "0"),
            (r#"{"streaming":"never"}"#, "budget.streaming", "never"),
            (r#"{"enabled":"yes"}"#, "budget.enabled", "yes"),
        ] {
            let e = parse(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
            assert!(e.to_string().contains(needle), "{doc}: {e}");
        }
    }

    #[test]
    fn every_envoy_retry_condition_is_accepted() {
        for v in RETRY_ON_VALUES {
            let doc = format!(r#"{{"retry_on":"{v}","retriable_status_codes":[]}}"#);
            assert_eq!(parse(&doc).unwrap().retry_on, v);
        }
    }
}
