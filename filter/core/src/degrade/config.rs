//! The `degrade` section: which alerts raise which level, how long a firing
//! alert lasts without being re-sent.

use serde::Deserialize;

use crate::config::{check, ConfigError};

/// Default `alert_ttl_s`: a firing alert not re-sent for this long expires,
/// so a lost "resolved" never degrades traffic for good. Keep it above the
/// Alertmanager route's `repeat_interval` plus `group_interval`.
pub const DEFAULT_ALERT_TTL_S: u64 = 900;
/// Longest `alert_ttl_s`: a day.
const MAX_ALERT_TTL_S: u64 = 86_400;
/// Highest degrade level.
pub const MAX_LEVEL: u8 = 3;

/// `degrade` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawDegradeConfig {
    /// Alert rules; the defaults when absent.
    pub alerts: Option<Vec<RawAlertRule>>,
    /// Life of a firing alert that is not re-sent, s.
    pub alert_ttl_s: Option<u64>,
}

/// One entry of `degrade.alerts`: every label given must equal the alert's.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
}

impl Default for DegradeConfig {
    fn default() -> Self {
        Self {
            alerts: default_alerts(),
            alert_ttl_ms: DEFAULT_ALERT_TTL_S * 1000,
        }
    }
}

/// `severity="critical"` → level 3, `severity="warning"` → level 1, for every model.
fn default_alerts() -> Vec<AlertRule> {
    vec![
        AlertRule {
            matchers: vec![("severity", "critical".to_string())],
            level: 3,
        },
        AlertRule {
            matchers: vec![("severity", "warning".to_string())],
            level: 1,
        },
    ]
}

impl DegradeConfig {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawDegradeConfig) -> Result<Self, ConfigError> {
        let alerts = match raw.alerts {
            None => default_alerts(),
            Some(rules) => rules
                .into_iter()
                .enumerate()
                .map(|(i, r)| compile_rule(r).map_err(|e| e.within(&format!("alerts[{i}]"))))
                .collect::<Result<_, _>>()?,
        };
        let ttl_s = raw.alert_ttl_s.unwrap_or(DEFAULT_ALERT_TTL_S);
        let ttl_s = check::in_range("alert_ttl_s", ttl_s, 1..=MAX_ALERT_TTL_S)?;
        Ok(Self {
            alerts,
            alert_ttl_ms: ttl_s * 1000,
        })
    }
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
        DegradeConfig::compile(ConfigError::from_json(json.as_bytes())?)
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
}
