//! The `limits` section: rules of requests, tokens and cost per window,
//! scoped by tenant, user and model, and the price table that turns tokens
//! into cost (compiled by [`crate::pricing::config`]).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::window::Span;
use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{Empty, List, Named, Setting, Table};
use crate::pricing::config::RawPrice;
use crate::pricing::{self, Price, Prices};
use crate::priority::Priority;

/// Most rules.
const MAX_RULES: usize = 16;
/// Longest rule name (it is a key part and a label value).
const MAX_NAME_LEN: usize = 64;
/// `max_keys`: keys (tenants, users, …) each rule counts at once.
const MAX_KEYS: Setting<usize> = Setting::range("max_keys", 4_096, 1, 1 << 20);
/// `reserve_output_tokens`: reserved for a call that names no cap.
const RESERVE_OUTPUT_TOKENS: Setting<u64> =
    Setting::range("reserve_output_tokens", 1_024, 0, 1 << 24);
/// `tenant_labels`: distinct tenant label values of the spend metrics, per
/// worker.
const TENANT_LABELS: Setting<usize> = Setting::range("tenant_labels", 20, 0, 1_000);
/// `user_header`.
const USER_HEADER: Setting<&str> = Setting::any("user_header", "x-user-id");
/// `shard_header`: the header a `shard` front names the tenant in.
const SHARD_HEADER: Setting<&str> = Setting::any("shard_header", "x-llm-tenant-key");
/// `mode`.
const MODE: Named<Mode> = Named {
    name: "mode",
    default: Mode::Local,
    spell: Mode::as_str,
};
/// A rule's `degrade.until`: degraded calls go until the count reaches this
/// many times the limit.
const UNTIL: Setting<f64> = Setting::real("until", 1.5, (1.0, false), (100.0, false));

/// The section's settings.
pub const SETTINGS: Table = &[
    (
        "limits",
        &[
            &RULES,
            &PRICES,
            &CATALOG,
            &USER_HEADER,
            &MAX_KEYS,
            &RESERVE_OUTPUT_TOKENS,
            &TENANT_LABELS,
            &MODE,
            &SHARD_HEADER,
        ],
    ),
    ("limits.rules[]", &[&Empty::list("by"), &PRIORITIES]),
    ("limits.rules[].degrade", &[&UNTIL]),
];

/// `rules`: none, the limits are off.
const RULES: Empty = Empty::list("rules");
/// `prices`: none; a cost limit needs the model's price.
const PRICES: Empty = Empty::map("prices");
/// `catalog`: none.
const CATALOG: Empty = Empty::map("catalog");
/// A rule's `priorities`: P0 is exempt unless named.
const PRIORITIES: List<Priority> = List::new("priorities", &[Priority::P1, Priority::P2]);

/// The limits that count calls or tokens: each field of a rule, what it
/// counts and over which window, in the order the rule's limits are kept.
const COUNTED: [(&str, Measure, Span); 5] = [
    ("requests_per_minute", Measure::Requests, Span::Minute),
    ("requests_per_hour", Measure::Requests, Span::Hour),
    ("tokens_per_minute", Measure::Tokens, Span::Minute),
    ("tokens_per_hour", Measure::Tokens, Span::Hour),
    ("tokens_per_day", Measure::Tokens, Span::Day),
];
/// The limits that count cost, after the counted ones.
const COSTS: [(&str, Span); 2] = [("cost_per_day", Span::Day), ("cost_per_month", Span::Month)];
/// The most a cost limit may be, in the price table's unit.
const MAX_COST: f64 = 1e9;
/// Cost is counted in billionths of the price table's unit.
pub const NANOS_PER_UNIT: f64 = 1e9;

/// `limits` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawLimitsConfig {
    /// The rules, each enforced on every call it applies to.
    pub rules: Option<Vec<RawRule>>,
    /// Price per million tokens, by model (`*`: every other model; a
    /// name ending in `*`: every model it begins), over the catalog's.
    pub prices: Option<BTreeMap<String, RawPrice>>,
    /// A catalog of list prices (`examples/prices.json`), as `prices`.
    pub catalog: Option<BTreeMap<String, RawPrice>>,
    /// The day the catalog's prices were read, `YYYY-MM-DD`.
    pub catalog_as_of: Option<String>,
    /// The header naming the user, default `x-user-id`.
    pub user_header: Option<String>,
    /// Keys each rule counts at once (shared-data records per rule).
    pub max_keys: Option<usize>,
    /// Output tokens reserved for a call that names no cap.
    pub reserve_output_tokens: Option<u64>,
    /// Distinct tenants the spend metrics name, per worker; the rest are `other`.
    pub tenant_labels: Option<usize>,
    /// `local` (default): enforce the rules here; `shard`: a front that
    /// only names each call's tenant, for the gateway replicas' hashing.
    pub mode: Option<Mode>,
    /// The request header a `shard` filter writes the tenant id into,
    /// default `x-llm-tenant-key`.
    pub shard_header: Option<String>,
}

/// Where the limits are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Here: every rule is checked and counted by this proxy.
    #[default]
    Local,
    /// On the gateway replicas behind this proxy: it writes each call's
    /// tenant id into `shard_header`, on which the route to the replicas
    /// hashes, so one replica holds a tenant's counts.
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

/// One rule as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawRule {
    /// Its name: a metric label and the rule's key in shared data.
    pub name: String,
    /// What one count is kept per: any of `tenant`, `user`, `model`; none:
    /// one count for every call the rule applies to.
    pub by: Vec<Dimension>,
    /// The models it applies to; absent: every model.
    pub models: Option<Vec<String>>,
    /// The priorities it applies to; default P1 and P2 (P0 is exempt unless named).
    pub priorities: Option<Vec<Priority>>,
    /// Requests per sliding minute.
    pub requests_per_minute: Option<u64>,
    /// Requests per sliding hour.
    pub requests_per_hour: Option<u64>,
    /// Tokens (input + output) per sliding minute.
    pub tokens_per_minute: Option<u64>,
    /// Tokens per sliding hour.
    pub tokens_per_hour: Option<u64>,
    /// Tokens per UTC day.
    pub tokens_per_day: Option<u64>,
    /// Cost per UTC day, in the price table's unit.
    pub cost_per_day: Option<f64>,
    /// Cost per UTC month.
    pub cost_per_month: Option<f64>,
    /// Over the limit, send the call cheaper instead of refusing it.
    pub degrade: Option<RawDegrade>,
}

/// A rule's degrade as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawDegrade {
    /// Cap the call's output tokens.
    pub max_tokens: Option<u64>,
    /// Send the call to this (cheaper) model.
    pub model: Option<String>,
    /// Degraded calls go until the count reaches this many times the
    /// limit, default 1.5; past it they are refused.
    pub until: Option<f64>,
}

/// What a count is kept per.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// The call's tenant.
    Tenant,
    /// The call's user.
    User,
    /// The call's model.
    Model,
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Calls.
    Requests,
    /// Input and output tokens.
    Tokens,
    /// Cost, in billionths of the price unit.
    Cost,
}

impl Measure {
    /// The word of the measure in a limit's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Cost => "cost",
        }
    }
}

/// One limit of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// What it counts.
    pub measure: Measure,
    /// Over which window.
    pub span: Span,
    /// Most in the window.
    pub max: u64,
    /// Its field's name, e.g. `tokens_per_minute` (and metric label).
    pub name: &'static str,
}

/// A rule's degrade.
#[derive(Debug, Clone, PartialEq)]
pub struct Degrade {
    /// Output token cap.
    pub max_tokens: Option<u64>,
    /// The cheaper model.
    pub model: Option<String>,
    /// Degraded calls go while the count stays within this many times the limit.
    pub until: f64,
}

/// A compiled rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Its name.
    pub name: String,
    /// What one count is kept per.
    pub by: Vec<Dimension>,
    /// The models it applies to; `None`: all.
    pub models: Option<Vec<String>>,
    /// The priorities it applies to.
    pub priorities: Vec<Priority>,
    /// Its limits, at least one.
    pub limits: Vec<Limit>,
    /// Over a limit, degrade instead of refusing.
    pub degrade: Option<Degrade>,
}

impl Rule {
    /// The rule applies to a call of `priority` to `model`.
    pub fn applies(&self, priority: Priority, model: Option<&str>) -> bool {
        self.priorities.contains(&priority)
            && self
                .models
                .as_ref()
                .is_none_or(|ms| model.is_some_and(|m| ms.iter().any(|x| x == m)))
    }
}

/// The compiled section.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsConfig {
    /// The rules; none: the section is off.
    pub rules: Vec<Rule>,
    /// Prices by model.
    pub prices: Prices,
    /// Where the rules are enforced.
    pub mode: Mode,
    /// The header a `shard` filter names the tenant in; every filter with
    /// limits removes it before the upstream.
    pub shard_header: String,
    /// The user header.
    pub user_header: String,
    /// Keys each rule counts at once.
    pub max_keys: usize,
    /// Output tokens reserved for a call that names no cap.
    pub reserve_output_tokens: u64,
    /// Distinct tenant label values, per worker.
    pub tenant_labels: usize,
}

impl Default for LimitsConfig {
    /// The empty section, as compiling `{}` gives it (the tests check): no
    /// rule, no price. A build without limits holds it without holding the
    /// section's compiler.
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            prices: Prices::default(),
            mode: MODE.default,
            shard_header: SHARD_HEADER.default.to_string(),
            user_header: USER_HEADER.default.to_string(),
            max_keys: MAX_KEYS.default,
            reserve_output_tokens: RESERVE_OUTPUT_TOKENS.default,
            tenant_labels: TENANT_LABELS.default,
        }
    }
}

impl LimitsConfig {
    /// The section has rules this proxy enforces.
    pub fn enabled(&self) -> bool {
        self.mode == Mode::Local && !self.rules.is_empty()
    }

    /// This proxy reads the shard header: it enforces rules (and drops the
    /// header a front wrote) or writes it.
    pub fn uses_shard_header(&self) -> bool {
        self.enabled() || self.mode == Mode::Shard
    }

    /// The price of `model`: its own, a prefix's, or the `*` entry.
    pub fn price(&self, model: Option<&str>) -> Option<&Price> {
        self.prices.get(model)
    }

    /// Compiles the section.
    pub fn compile(raw: RawLimitsConfig) -> Result<Self, ConfigError> {
        let prices = pricing::config::compile(
            PRICES.or(raw.prices),
            CATALOG.or(raw.catalog),
            raw.catalog_as_of.as_deref(),
        )?;
        let rules = compile_rules(RULES.or(raw.rules), &prices)?;
        let shard_header = compile_shard_header(raw.shard_header)?;
        Ok(Self {
            rules,
            prices,
            mode: MODE.default_or(raw.mode),
            shard_header,
            user_header: header(USER_HEADER.name, USER_HEADER.or_string(raw.user_header))?,
            max_keys: MAX_KEYS.read(raw.max_keys)?,
            reserve_output_tokens: RESERVE_OUTPUT_TOKENS.read(raw.reserve_output_tokens)?,
            tenant_labels: TENANT_LABELS.read(raw.tenant_labels)?,
        })
    }
}

/// `rules`: at most [`MAX_RULES`], each named once.
fn compile_rules(raw: Vec<RawRule>, prices: &Prices) -> Result<Vec<Rule>, ConfigError> {
    check::at_most("rules", &raw, MAX_RULES, "rules")?;
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let rule = compile_rule(r, prices).map_err(|e| e.within(&format!("rules[{i}]")))?;
        if rules.iter().any(|o| o.name == rule.name) {
            return Err(ConfigError::new(
                format!("rules[{i}].name"),
                format!("{:?} names another rule too", rule.name),
            ));
        }
        rules.push(rule);
    }
    Ok(rules)
}

/// `shard_header`: a header name that carries neither a credential nor a
/// pseudo-header, since every filter with limits removes it.
fn compile_shard_header(raw: Option<String>) -> Result<String, ConfigError> {
    let name = header(SHARD_HEADER.name, SHARD_HEADER.or_string(raw))?;
    if crate::identity::config::is_credential(&name) || name.starts_with(':') {
        return Err(ConfigError::new(
            SHARD_HEADER.name,
            format!("{name:?} carries the request itself; the filter removes the shard header"),
        ));
    }
    Ok(name)
}

fn header(field: &str, name: String) -> Result<String, ConfigError> {
    let name = name.to_ascii_lowercase();
    if check::is_header_name(&name) {
        Ok(name)
    } else {
        Err(ConfigError::new(
            field,
            format!("{name:?} is not a header name"),
        ))
    }
}

/// One rule; errors name fields relative to it.
fn compile_rule(r: RawRule, prices: &Prices) -> Result<Rule, ConfigError> {
    compile_name(&r.name)?;
    let by = compile_by(&r.by)?;
    let limits = compile_limits(&r)?;
    if let Some(models) = &r.models {
        if models.is_empty() || models.iter().any(String::is_empty) {
            return Err(ConfigError::new(
                "models",
                "lists no model, or an empty one",
            ));
        }
    }
    check_priced(&limits, r.models.as_deref(), prices)?;
    let degrade = r
        .degrade
        .map(|d| compile_degrade(d).map_err(|e| e.within("degrade")))
        .transpose()?;
    Ok(Rule {
        name: r.name,
        by,
        models: r.models,
        priorities: PRIORITIES.or(r.priorities),
        limits,
        degrade,
    })
}

/// A rule's `name`: a label value and a part of its keys.
fn compile_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        return Ok(());
    }
    Err(ConfigError::new(
        "name",
        format!("{name:?} is not a rule name (1..={MAX_NAME_LEN} of A-Z a-z 0-9 _ -)"),
    ))
}

/// A rule's `by`, each dimension once.
fn compile_by(raw: &[Dimension]) -> Result<Vec<Dimension>, ConfigError> {
    let mut by = Vec::with_capacity(raw.len());
    for &d in raw {
        if by.contains(&d) {
            return Err(ConfigError::new("by", format!("{d:?} is named twice")));
        }
        by.push(d);
    }
    Ok(by)
}

/// The limits a rule names, at least one: the counted ones in [`COUNTED`]'s
/// order, then the costs.
fn compile_limits(r: &RawRule) -> Result<Vec<Limit>, ConfigError> {
    let counts = [
        r.requests_per_minute,
        r.requests_per_hour,
        r.tokens_per_minute,
        r.tokens_per_hour,
        r.tokens_per_day,
    ];
    let mut limits = Vec::new();
    for ((name, measure, span), max) in COUNTED.into_iter().zip(counts) {
        if let Some(max) = max {
            let max = check::positive(name, max, "a limit")?;
            limits.push(Limit {
                measure,
                span,
                max,
                name,
            });
        }
    }
    for ((name, span), max) in COSTS.into_iter().zip([r.cost_per_day, r.cost_per_month]) {
        if let Some(max) = max {
            limits.push(cost_limit(name, span, max)?);
        }
    }
    if limits.is_empty() {
        return Err(ConfigError::new(
            "rule",
            "names no limit (requests_per_minute, tokens_per_minute, cost_per_day, …)",
        ));
    }
    Ok(limits)
}

/// A cost limit of `max` units, counted in nanos.
fn cost_limit(name: &'static str, span: Span, max: f64) -> Result<Limit, ConfigError> {
    if !(max.is_finite() && max > 0.0 && max <= MAX_COST) {
        return Err(ConfigError::new(
            name,
            format!("{max} is not a cost in (0, 1e9]"),
        ));
    }
    Ok(Limit {
        measure: Measure::Cost,
        span,
        max: (max * NANOS_PER_UNIT) as u64,
        name,
    })
}

/// A cost limit must be able to price every call it counts, or it would
/// silently stop applying to the unpriced ones.
fn check_priced(
    limits: &[Limit],
    models: Option<&[String]>,
    prices: &Prices,
) -> Result<(), ConfigError> {
    if !limits.iter().any(|l| l.measure == Measure::Cost) || prices.prices_every_model() {
        return Ok(());
    }
    let unpriced = match models {
        None => Some("every model (add a `*` price)".to_string()),
        Some(ms) => ms
            .iter()
            .find(|m| prices.get(Some(m)).is_none())
            .map(|m| format!("{m:?}")),
    };
    match unpriced {
        Some(m) => Err(ConfigError::new(
            "cost_per_day",
            format!("a cost limit needs a price for {m} in `limits.prices`"),
        )),
        None => Ok(()),
    }
}

/// A rule's `degrade`; errors name fields relative to it.
fn compile_degrade(d: RawDegrade) -> Result<Degrade, ConfigError> {
    if d.max_tokens.is_none() && d.model.is_none() {
        return Err(ConfigError::new(
            ".",
            "names neither `max_tokens` nor `model`",
        ));
    }
    if let Some(n) = d.max_tokens {
        check::positive("max_tokens", n, "a token cap")?;
    }
    if d.model.as_deref() == Some("") {
        return Err(ConfigError::new("model", "is empty"));
    }
    Ok(Degrade {
        max_tokens: d.max_tokens,
        model: d.model,
        until: UNTIL.read(d.until)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<LimitsConfig, ConfigError> {
        LimitsConfig::compile(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn empty_is_off() {
        let c = LimitsConfig::default();
        assert!(!c.enabled());
        assert_eq!(c.user_header, "x-user-id");
    }

    #[test]
    fn reads_a_rule_and_prices() {
        let c = parse(
            r#"{"prices":{"gpt-4o":{"input":2.5,"cached_input":1.25,"output":10}},
                "rules":[{"name":"team","by":["tenant","model"],"models":["gpt-4o"],
                  "tokens_per_minute":1000,"cost_per_day":5,
                  "degrade":{"max_tokens":64}}]}"#,
        )
        .unwrap();
        let r = &c.rules[0];
        assert_eq!(r.by, [Dimension::Tenant, Dimension::Model]);
        assert_eq!(r.limits.len(), 2);
        assert_eq!(r.limits[1].max, 5_000_000_000);
        assert_eq!(r.priorities, [Priority::P1, Priority::P2]);
        assert!(r.applies(Priority::P1, Some("gpt-4o")));
        assert!(!r.applies(Priority::P0, Some("gpt-4o")));
        assert!(!r.applies(Priority::P1, Some("gpt-4o-mini")));
        assert!(!r.applies(Priority::P1, None));
        let p = c.price(Some("gpt-4o")).unwrap();
        assert!(
            (p.base.output - 10_000.0).abs() < 1e-9,
            "10 per million is 10 000 nanos a token"
        );
        assert_eq!(c.price(Some("other")), None);
        assert_eq!(r.degrade.as_ref().unwrap().until, 1.5);
    }

    #[test]
    fn refuses_what_would_not_apply() {
        for (doc, field) in [
            (r#"{"rules":[{"name":"a"}]}"#, "rules[0].rule"),
            (
                r#"{"rules":[{"name":"","requests_per_minute":1}]}"#,
                "rules[0].name",
            ),
            (
                r#"{"rules":[{"name":"a b","requests_per_minute":1}]}"#,
                "rules[0].name",
            ),
            (
                r#"{"rules":[{"name":"a","requests_per_minute":0}]}"#,
                "rules[0].requests_per_minute",
            ),
            (
                r#"{"rules":[{"name":"a","cost_per_day":1}]}"#,
                "rules[0].cost_per_day",
            ),
            (
                r#"{"prices":{"m":{"input":1,"output":1}},"rules":[{"name":"a","models":["m","n"],"cost_per_day":1}]}"#,
                "rules[0].cost_per_day",
            ),
            (
                r#"{"rules":[{"name":"a","requests_per_minute":1},{"name":"a","requests_per_minute":2}]}"#,
                "rules[1].name",
            ),
            (
                r#"{"rules":[{"name":"a","by":["user","user"],"requests_per_minute":1}]}"#,
                "rules[0].by",
            ),
            (
                r#"{"rules":[{"name":"a","requests_per_minute":1,"degrade":{}}]}"#,
                "rules[0].degrade",
            ),
            (r#"{"prices":{"m":{"input":1}}}"#, "prices.m"),
            (
                r#"{"prices":{"m":{"input":-1,"output":1}}}"#,
                "prices.m.input",
            ),
            (r#"{"shard_header":"api-key"}"#, "shard_header"),
            (r#"{"shard_header":"bad header"}"#, "shard_header"),
        ] {
            let e = parse(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
        }
        let front =
            parse(r#"{"mode":"shard","rules":[{"name":"a","requests_per_minute":1}]}"#).unwrap();
        assert!(!front.enabled() && front.uses_shard_header());
        assert_eq!(front.shard_header, "x-llm-tenant-key");
        assert!(!parse("{}").unwrap().uses_shard_header());
        assert!(parse(
            r#"{"prices":{"*":{"input":1,"output":2}},"rules":[{"name":"a","cost_per_month":9}]}"#
        )
        .is_ok());
    }
}
