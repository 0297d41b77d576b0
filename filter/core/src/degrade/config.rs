//! The `degrade` section: which alerts and which load thresholds raise which
//! level, and what each level does to the calls of each priority.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::read::{self, Read};
use crate::config::setting::{Bound, Item, List, Setting, Table};
use crate::load::Signal;
use crate::priority::Priority;

use super::sources::config::{
    AlertmanagerSource, PrometheusSource, RawAlertmanager, RawPrometheus,
};

/// `alert_ttl_s`: a firing alert not re-sent for this long expires, so a
/// lost "resolved" never degrades traffic for good. Keep it above the
/// Alertmanager route's `repeat_interval` plus `group_interval`; at most a
/// day.
const ALERT_TTL_S: Setting<u64> = Setting::range("alert_ttl_s", 900, 1, 86_400);
/// Highest degrade level.
pub const MAX_LEVEL: u8 = 3;
/// `qps_ref`: calls per second at which the temperature rule's load term
/// reaches its floor.
const QPS_REF: Setting<f64> = Setting {
    name: "qps_ref",
    default: 10.0,
    bound: Bound::PositiveReal,
};
/// `tokens_per_s_ref`: output tokens per second of the rule's token term.
const TOKENS_PER_S_REF: Setting<f64> = Setting {
    name: "tokens_per_s_ref",
    default: 1000.0,
    bound: Bound::PositiveReal,
};
/// `max_tokens_cap`: the cap of the `max_tokens` action.
const MAX_TOKENS_CAP: Setting<u64> = Setting {
    name: "max_tokens_cap",
    default: 256,
    bound: Bound::Positive("token count"),
};
/// `retry_after_s` of a shed call (a rejected one is told twice that); at
/// most an hour.
const RETRY_AFTER_S: Setting<u64> = Setting::range("retry_after_s", 5, 1, 3_600);

/// The section's settings, and its sources'.
pub const SETTINGS: Table = &[
    (
        "degrade",
        &[
            &ALERTS,
            &ALERT_TTL_S,
            &QPS_REF,
            &TOKENS_PER_S_REF,
            &MAX_TOKENS_CAP,
            &RETRY_AFTER_S,
        ],
    ),
    ("degrade.alertmanager", super::sources::config::ALERTMANAGER),
    ("degrade.prometheus", super::sources::config::PROMETHEUS),
];

crate::read_fields! {
    /// `degrade` as written.
    #[derive(Debug, Clone, Default)]
    pub struct RawDegradeConfig {
        /// Alert rules; the defaults when absent.
        pub alerts: Option<Vec<RawAlertRule>>,
        /// Life of a firing alert that is not re-sent, s.
        pub alert_ttl_s: Option<u64>,
        /// Levels the load signals raise.
        pub thresholds: Option<Vec<RawThreshold>>,
        /// Calls per second of the temperature rule.
        pub qps_ref: Option<f64>,
        /// Output tokens per second of the temperature rule.
        pub tokens_per_s_ref: Option<f64>,
        /// The cap of the `max_tokens` action.
        pub max_tokens_cap: Option<u64>,
        /// The cheaper model each model switches to (`fallback_model` action).
        pub fallback_model: Option<BTreeMap<String, String>>,
        /// `retry-after` of a shed call, s.
        pub retry_after_s: Option<u64>,
        /// Actions per level (`"1"`..`"3"`) and priority (`P1`, `P2`).
        pub levels: Option<BTreeMap<String, BTreeMap<String, Vec<Action>>>>,
        /// Alertmanager's API, read by every proxy.
        pub alertmanager: Option<RawAlertmanager>,
        /// Prometheus's API, asked every model's mesh-wide load.
        pub prometheus: Option<RawPrometheus>,
    }
}

crate::read_fields! {
    /// `ab.groups[].overrides.degrade` as written: what the levels do to the
    /// group's calls. The level itself — alerts, their life, the thresholds — is
    /// the model's, shared by every group, so those fields stay top-level.
    #[derive(Debug, Default)]
    pub struct RawDegradeOverride {
        /// Actions per level and priority; a level given replaces that level's
        /// top-level actions, the others are kept.
        pub levels: Option<BTreeMap<String, BTreeMap<String, Vec<Action>>>>,
        /// The cheaper model each model switches to; replaces the top-level map.
        pub fallback_model: Option<BTreeMap<String, String>>,
        /// The cap of the `max_tokens` action.
        pub max_tokens_cap: Option<u64>,
        /// `retry-after` of a shed call, s.
        pub retry_after_s: Option<u64>,
        /// Calls per second of the temperature rule.
        pub qps_ref: Option<f64>,
        /// Output tokens per second of the temperature rule.
        pub tokens_per_s_ref: Option<f64>,
        /// Not a group's: refused with a reason.
        pub alerts: Option<Value>,
        /// Not a group's: refused with a reason.
        pub alert_ttl_s: Option<Value>,
        /// Not a group's: refused with a reason.
        pub thresholds: Option<Value>,
        /// Not a group's: refused with a reason.
        pub alertmanager: Option<Value>,
        /// Not a group's: refused with a reason.
        pub prometheus: Option<Value>,
    }
}

impl RawDegradeConfig {
    /// This section with what `over` gives put in place of its own; errors
    /// (relative to `over`) for the fields that set the level, which only
    /// the top level has.
    pub fn overridden_by(&self, over: RawDegradeOverride) -> Result<Self, ConfigError> {
        for (field, given) in [
            ("alerts", over.alerts.is_some()),
            ("alert_ttl_s", over.alert_ttl_s.is_some()),
            ("thresholds", over.thresholds.is_some()),
            ("alertmanager", over.alertmanager.is_some()),
            ("prometheus", over.prometheus.is_some()),
        ] {
            if given {
                return Err(ConfigError::new(
                    field,
                    "the level of a model is shared by every group: set it in the top-level degrade",
                ));
            }
        }
        let mut out = self.clone();
        if let Some(levels) = over.levels {
            out.levels.get_or_insert_with(BTreeMap::new).extend(levels);
        }
        out.fallback_model = over.fallback_model.or(out.fallback_model);
        out.max_tokens_cap = over.max_tokens_cap.or(out.max_tokens_cap);
        out.retry_after_s = over.retry_after_s.or(out.retry_after_s);
        out.qps_ref = over.qps_ref.or(out.qps_ref);
        out.tokens_per_s_ref = over.tokens_per_s_ref.or(out.tokens_per_s_ref);
        Ok(out)
    }
}

crate::read_fields! {
    /// One entry of `degrade.thresholds`.
    #[derive(Debug, Clone, Default)]
    pub struct RawThreshold {
        /// The model it watches; every model when absent.
        pub model: Option<String>,
        /// The signal.
        pub signal: Option<Signal>,
        /// The level holds while the signal is above this.
        pub above: Option<f64>,
        /// The level, 1..=3.
        pub level: Option<u8>,
    }
}

/// A compiled threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The model it watches; `None`: every model.
    pub model: Option<String>,
    /// The signal.
    pub signal: Signal,
    /// The level holds while the signal is above this.
    pub above: f64,
    /// The level.
    pub level: u8,
}

/// What a level does to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Answer from the cache, even past expiry, when an entry is there.
    Cache,
    /// Refuse the call (503, `retry-after`).
    Shed,
    /// Refuse the call for longer (503, twice the `retry-after`).
    Reject,
    /// Switch to the model's `fallback_model`.
    FallbackModel,
    /// Cap the output tokens at `max_tokens_cap`.
    MaxTokens,
    /// Lower the temperature by the load (the rule in `degrade::temperature`).
    Temperature,
}

impl Read for Action {
    fn read(v: &Value) -> Result<Self, ConfigError> {
        read::variant(v, &Self::ALL, Self::as_str)
    }
}

impl Action {
    /// Every action, in the enum's order.
    pub const ALL: [Self; 6] = [
        Self::Cache,
        Self::Shed,
        Self::Reject,
        Self::FallbackModel,
        Self::MaxTokens,
        Self::Temperature,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cache => "cache",
            Self::Shed => "shed",
            Self::Reject => "reject",
            Self::FallbackModel => "fallback_model",
            Self::MaxTokens => "max_tokens",
            Self::Temperature => "temperature",
        }
    }
}

crate::read_fields! {
    /// One entry of `degrade.alerts`: every label given must equal the alert's.
    #[derive(Debug, Clone, Default)]
    pub struct RawAlertRule {
        /// The alert's `alertname`.
        pub alertname: Option<String>,
        /// The alert's `severity`.
        pub severity: Option<String>,
        /// The alert's `model` label.
        pub model: Option<String>,
        /// The alert's `llm_cluster` label.
        pub llm_cluster: Option<String>,
        /// The level an alert that matches raises, 1..=3.
        pub level: Option<u8>,
    }
}

/// A compiled alert rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRule {
    /// Labels an alert must carry with these values.
    pub matchers: Vec<(&'static str, String)>,
    /// The level it raises.
    pub level: u8,
}

impl AlertRule {
    /// The rule holds for an alert whose labels `label` reads.
    pub fn matches<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.matchers
            .iter()
            .all(|(name, want)| label(name) == Some(want.as_str()))
    }
}

/// The compiled `degrade` section.
#[derive(Debug, Clone, PartialEq)]
pub struct DegradeConfig {
    /// Alert rules, in order; an alert raises the highest level of the rules it matches.
    pub alerts: Vec<AlertRule>,
    /// Life of a firing alert that is not re-sent, ms.
    pub alert_ttl_ms: u64,
    /// Levels the load signals raise.
    pub thresholds: Vec<Threshold>,
    /// Calls per second of the temperature rule.
    pub qps_ref: f64,
    /// Output tokens per second of the temperature rule.
    pub tokens_per_s_ref: f64,
    /// The cap of the `max_tokens` action.
    pub max_tokens_cap: u64,
    /// The cheaper model of each model.
    pub fallback_model: BTreeMap<String, String>,
    /// `retry-after` of a shed call, s.
    pub retry_after_s: u64,
    /// Actions by level (index 0 is level 1) and priority (P0's always empty),
    /// in the order they are tried: refusals, the cache, then the body edits.
    pub actions: LevelActions,
    /// Alertmanager's API, when its alerts are pulled.
    pub alertmanager: Option<AlertmanagerSource>,
    /// Prometheus's API, when the load is read mesh-wide.
    pub prometheus: Option<PrometheusSource>,
}

#[cfg(test)]
impl Default for DegradeConfig {
    /// The empty section.
    fn default() -> Self {
        check::defaults(Self::compile)
    }
}

/// Level 1 caps P2; level 2 degrades P1 and sheds P2; level 3 answers P1
/// from the cache or degrades it, and rejects P2. P0 is never changed.
fn default_actions() -> LevelActions {
    use Action::*;
    let degrade = vec![FallbackModel, MaxTokens, Temperature];
    [
        [vec![], vec![], vec![MaxTokens]],
        [vec![], degrade.clone(), vec![Shed]],
        [
            vec![],
            vec![Cache, FallbackModel, MaxTokens, Temperature],
            vec![Reject],
        ],
    ]
}

impl DegradeConfig {
    /// Adds the models the section names to `out`: the thresholds', the
    /// fallback models on both sides, the alert rules' `model` matchers.
    pub fn named_models<'a>(&'a self, out: &mut Vec<&'a str>) {
        out.extend(self.thresholds.iter().filter_map(|t| t.model.as_deref()));
        for (from, to) in &self.fallback_model {
            out.push(from);
            out.push(to);
        }
        for rule in &self.alerts {
            out.extend(
                rule.matchers
                    .iter()
                    .filter(|(label, _)| *label == "model")
                    .map(|(_, v)| v.as_str()),
            );
        }
    }

    /// What `level` does to a call of priority `p`.
    pub fn actions(&self, level: u8, p: Priority) -> &[Action] {
        let Some(i) = usize::from(level).checked_sub(1) else {
            return &[];
        };
        self.actions
            .get(i)
            .and_then(|per| per.get(p.index()))
            .map_or(&[], Vec::as_slice)
    }
}

/// `alerts`: `severity="critical"` → level 3, `severity="warning"` → level
/// 1, for every model.
const ALERTS: List<DefaultAlert> = List::new(
    "alerts",
    &[
        DefaultAlert {
            label: "severity",
            value: "critical",
            level: 3,
        },
        DefaultAlert {
            label: "severity",
            value: "warning",
            level: 1,
        },
    ],
);

/// A rule of the default `alerts`: one label's value raises a level.
#[derive(Debug, Clone, Copy)]
struct DefaultAlert {
    label: &'static str,
    value: &'static str,
    level: u8,
}

impl From<DefaultAlert> for AlertRule {
    fn from(d: DefaultAlert) -> Self {
        Self {
            matchers: vec![(d.label, d.value.to_string())],
            level: d.level,
        }
    }
}

impl Item for DefaultAlert {
    fn json(self) -> serde_json::Value {
        serde_json::json!({ self.label: self.value, "level": self.level })
    }
}

impl DegradeConfig {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawDegradeConfig) -> Result<Self, ConfigError> {
        let alerts = match raw.alerts {
            None => ALERTS.or_into(None),
            Some(rules) => each("alerts", rules, compile_rule)?,
        };
        let ttl_s = ALERT_TTL_S.read(raw.alert_ttl_s)?;
        let thresholds = each(
            "thresholds",
            raw.thresholds.unwrap_or_default(),
            compile_threshold,
        )?;
        let qps_ref = QPS_REF.read(raw.qps_ref)?;
        let tokens_per_s_ref = TOKENS_PER_S_REF.read(raw.tokens_per_s_ref)?;
        let max_tokens_cap = MAX_TOKENS_CAP.read(raw.max_tokens_cap)?;
        let retry_after_s = RETRY_AFTER_S.read(raw.retry_after_s)?;
        let fallback_model = compile_fallback_models(raw.fallback_model.unwrap_or_default())?;
        let actions = compile_levels(raw.levels.unwrap_or_default(), &fallback_model)?;
        let alertmanager = raw
            .alertmanager
            .map(|a| AlertmanagerSource::compile(a).map_err(|e| e.within("alertmanager")))
            .transpose()?;
        let prometheus = raw
            .prometheus
            .map(|p| PrometheusSource::compile(p).map_err(|e| e.within("prometheus")))
            .transpose()?;
        Ok(Self {
            alerts,
            alert_ttl_ms: ttl_s * 1000,
            thresholds,
            qps_ref,
            tokens_per_s_ref,
            max_tokens_cap,
            fallback_model,
            retry_after_s,
            actions,
            alertmanager,
            prometheus,
        })
    }
}

/// Each item of the list `field` compiled, its errors named under
/// `field[i]`.
fn each<R, T>(
    field: &str,
    items: Vec<R>,
    compile: fn(R) -> Result<T, ConfigError>,
) -> Result<Vec<T>, ConfigError> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| compile(item).map_err(|e| e.within(&format!("{field}[{i}]"))))
        .collect()
}

/// `fallback_model`: each model's cheaper stand-in, never itself.
fn compile_fallback_models(
    fallback_model: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    for (model, fallback) in &fallback_model {
        if fallback.is_empty() || fallback == model {
            return Err(ConfigError::new(
                format!("fallback_model.{model}"),
                format!("{fallback:?} is not another model"),
            ));
        }
    }
    Ok(fallback_model)
}

/// Actions of each level (1–3), by priority (P0–P2).
type LevelActions = [[Vec<Action>; 3]; 3];

/// `levels`: the actions per level and priority over the defaults; a level
/// named replaces that level's table, P0 is never degraded.
fn compile_levels(
    levels: BTreeMap<String, BTreeMap<String, Vec<Action>>>,
    fallback_model: &BTreeMap<String, String>,
) -> Result<LevelActions, ConfigError> {
    let mut actions = default_actions();
    for (level, per) in levels {
        let field = format!("levels.{level}");
        let i = match level.as_str() {
            "1" => 0,
            "2" => 1,
            "3" => 2,
            _ => return Err(ConfigError::new(field, "levels are \"1\", \"2\" and \"3\"")),
        };
        let mut table: [Vec<Action>; 3] = Default::default();
        for (p, list) in per {
            let field = format!("{field}.{p}");
            let priority = Priority::parse(&p)
                .ok_or_else(|| ConfigError::new(&field, format!("{p:?} is not P1 or P2")))?;
            if priority == Priority::P0 {
                return Err(ConfigError::new(field, "P0 is never degraded"));
            }
            // Sorted and each once, in `ALL`'s order (the enum's): a filter,
            // not a sort, which would compile a sort for this type into the
            // module.
            let list: Vec<Action> = Action::ALL
                .into_iter()
                .filter(|a| list.contains(a))
                .collect();
            if list.contains(&Action::FallbackModel) && fallback_model.is_empty() {
                return Err(ConfigError::new(
                    field,
                    "`fallback_model` needs degrade.fallback_model",
                ));
            }
            if let Some(t) = table.get_mut(priority.index()) {
                *t = list;
            }
        }
        if let Some(slot) = actions.get_mut(i) {
            *slot = table;
        }
    }
    Ok(actions)
}

fn compile_threshold(raw: RawThreshold) -> Result<Threshold, ConfigError> {
    let signal = raw
        .signal
        .ok_or_else(|| ConfigError::new("signal", "missing: rps, tokens_per_s or in_flight"))?;
    let above = raw
        .above
        .ok_or_else(|| ConfigError::new("above", "missing: the value the level holds above"))?;
    if !above.is_finite() || above < 0.0 {
        return Err(ConfigError::new(
            "above",
            format!("{above} is not a number >= 0"),
        ));
    }
    let level = raw
        .level
        .ok_or_else(|| ConfigError::new("level", "missing: the level, 1..=3"))?;
    let level = check::in_range("level", level, 1..=MAX_LEVEL)?;
    Ok(Threshold {
        model: raw.model,
        signal,
        above,
        level,
    })
}

fn compile_rule(raw: RawAlertRule) -> Result<AlertRule, ConfigError> {
    let level = raw
        .level
        .ok_or_else(|| ConfigError::new("level", "missing: the level an alert raises, 1..=3"))?;
    let level = check::in_range("level", level, 1..=MAX_LEVEL)?;
    let mut matchers = Vec::new();
    for (name, value) in [
        ("alertname", raw.alertname),
        ("severity", raw.severity),
        ("model", raw.model),
        ("llm_cluster", raw.llm_cluster),
    ] {
        if let Some(v) = value {
            if v.is_empty() {
                return Err(ConfigError::new(
                    name,
                    "an empty label value matches nothing",
                ));
            }
            matchers.push((name, v));
        }
    }
    Ok(AlertRule { matchers, level })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<DegradeConfig, ConfigError> {
        DegradeConfig::compile(read::parse(json.as_bytes())?)
    }

    #[test]
    fn defaults_map_severities_for_every_model() {
        let c = parse("{}").unwrap();
        assert_eq!(c, DegradeConfig::default());
        assert_eq!(c.alert_ttl_ms, 900_000);
        let label = |want: &'static str| move |n: &str| (n == "severity").then_some(want);
        assert!(c.alerts[0].matches(label("critical")) && c.alerts[0].level == 3);
        assert!(c.alerts[1].matches(label("warning")) && c.alerts[1].level == 1);
        assert!(!c.alerts[0].matches(label("info")));
    }

    #[test]
    fn rules_compile_and_errors_name_the_field() {
        let c = parse(
            r#"{"alerts":[{"alertname":"LLMSlow","model":"gpt-4o","level":2}],"alert_ttl_s":60}"#,
        )
        .unwrap();
        assert_eq!(
            c.alerts,
            [AlertRule {
                matchers: vec![
                    ("alertname", "LLMSlow".to_string()),
                    ("model", "gpt-4o".to_string())
                ],
                level: 2
            }]
        );
        assert_eq!(c.alert_ttl_ms, 60_000);
        for (doc, field) in [
            (r#"{"alerts":[{"level":4}]}"#, "alerts[0].level"),
            (r#"{"alerts":[{"severity":"x"}]}"#, "alerts[0].level"),
            (
                r#"{"alerts":[{"level":1},{"severity":"","level":1}]}"#,
                "alerts[1].severity",
            ),
            (r#"{"alert_ttl_s":0}"#, "alert_ttl_s"),
        ] {
            assert_eq!(parse(doc).unwrap_err().field, field, "{doc}");
        }
        assert!(parse(r#"{"alerts":[{"level":1,"team":"x"}]}"#).is_err());
    }

    #[test]
    fn default_actions_spare_p0_and_escalate() {
        use Action::*;
        let c = parse("{}").unwrap();
        for level in 0..=3 {
            assert!(c.actions(level, Priority::P0).is_empty());
        }
        assert!(c.actions(0, Priority::P2).is_empty());
        assert!(c.actions(1, Priority::P1).is_empty());
        assert_eq!(c.actions(1, Priority::P2), [MaxTokens]);
        assert_eq!(
            c.actions(2, Priority::P1),
            [FallbackModel, MaxTokens, Temperature]
        );
        assert_eq!(c.actions(2, Priority::P2), [Shed]);
        assert_eq!(c.actions(3, Priority::P1)[0], Cache);
        assert_eq!(c.actions(3, Priority::P2), [Reject]);
        assert!(c.actions(4, Priority::P2).is_empty());
    }

    #[test]
    fn a_levels_list_compiles_sorted_and_each_once() {
        use Action::*;
        let c = parse(
            r#"{"fallback_model":{"a":"b"},"levels":{"2":{"P2":["temperature","shed","cache","shed","fallback_model","reject","max_tokens","temperature"]}}}"#,
        )
        .unwrap();
        assert_eq!(
            c.actions(2, Priority::P2),
            [Cache, Shed, Reject, FallbackModel, MaxTokens, Temperature]
        );
    }

    #[test]
    fn all_lists_every_action_in_order() {
        // A new action must be added here (the match) and to `ALL`, or a
        // level listing it would drop it.
        let listed = |a: Action| match a {
            Action::Cache
            | Action::Shed
            | Action::Reject
            | Action::FallbackModel
            | Action::MaxTokens
            | Action::Temperature => Action::ALL.contains(&a),
        };
        assert!(Action::ALL.into_iter().all(listed));
        assert_eq!(Action::ALL.len(), 6);
        assert!(Action::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn thresholds_and_levels_compile() {
        use Action::*;
        let c = parse(
            r#"{"thresholds":[{"signal":"in_flight","above":10,"level":2},{"model":"m","signal":"rps","above":0.5,"level":3}],
                "levels":{"1":{"P1":["temperature"],"p2":["shed","shed"]}},
                "fallback_model":{"gpt-4o":"gpt-4o-mini"},"qps_ref":5,"max_tokens_cap":64}"#,
        )
        .unwrap();
        assert_eq!(c.thresholds.len(), 2);
        assert_eq!(c.thresholds[1].signal, Signal::Rps);
        assert_eq!(c.actions(1, Priority::P1), [Temperature]);
        assert_eq!(c.actions(1, Priority::P2), [Shed]);
        assert_eq!(
            c.actions(2, Priority::P2),
            [Shed],
            "other levels keep their defaults"
        );
        assert_eq!((c.qps_ref, c.max_tokens_cap), (5.0, 64));
        for (doc, field) in [
            (
                r#"{"thresholds":[{"above":1,"level":1}]}"#,
                "thresholds[0].signal",
            ),
            (
                r#"{"thresholds":[{"signal":"rps","above":-1,"level":1}]}"#,
                "thresholds[0].above",
            ),
            (
                r#"{"thresholds":[{"signal":"rps","above":1,"level":0}]}"#,
                "thresholds[0].level",
            ),
            (r#"{"levels":{"4":{}}}"#, "levels.4"),
            (r#"{"levels":{"1":{"P0":["shed"]}}}"#, "levels.1.P0"),
            (
                r#"{"levels":{"1":{"P1":["fallback_model"]}}}"#,
                "levels.1.P1",
            ),
            (r#"{"fallback_model":{"a":"a"}}"#, "fallback_model.a"),
            (r#"{"qps_ref":0}"#, "qps_ref"),
            (r#"{"max_tokens_cap":0}"#, "max_tokens_cap"),
            (r#"{"retry_after_s":0}"#, "retry_after_s"),
        ] {
            assert_eq!(parse(doc).unwrap_err().field, field, "{doc}");
        }
        assert!(parse(r#"{"levels":{"1":{"P1":["nap"]}}}"#).is_err());
    }
}
