//! Load-driven degrade: a level 0–3 per model, the highest of what the
//! operators' alerts say (`alerts`: pushed by webhook or pulled from
//! Alertmanager, see `sources`) and what the thresholds on the live load
//! signals say (`degrade.thresholds`; none by default), the local window or
//! Prometheus's mesh-wide readings. Each level lowers
//! what calls of the lower priorities ask for, by the actions configured per
//! level and priority: refuse, answer from the cache, switch to a cheaper
//! model, cap the output tokens, lower the temperature. P0 is never changed.

pub mod alerts;
pub mod config;
pub mod sources;
pub mod temperature;

pub use crate::load::Signal;
pub use config::{Action, DegradeConfig, RawDegradeConfig};

use crate::budget::reply::{self, LocalReply};
use crate::config::Config;
use crate::dialect::answer::ReplyKind;
use crate::dialect::request::TokenField;
use crate::host::{Metrics, SharedStore};
use crate::json::{Document, Json};
use crate::load::{self, Scope, Signals};
use crate::metrics::{self as names};
use crate::priority::Priority;
use crate::shaping;

/// Response header carrying the level a degraded call was served at.
pub const HEADER: &str = "x-llm-degraded";
/// Response header of an answer the cache gave in place of the backend
/// under the `cache` degrade action; its value is `cache`.
pub const DOWNGRADE_HEADER: &str = "x-downgrade";

/// The clusters routing may place `model` on.
pub fn clusters_of<'a>(config: &'a Config, model: &str) -> Vec<&'a str> {
    config
        .routing
        .models
        .get(model)
        .map(|backends| backends.iter().map(|b| b.cluster.as_str()).collect())
        .unwrap_or_default()
}

/// The level of `model` at `now_ms`: the highest of its alerts' and its
/// thresholds'.
pub fn level(store: &dyn SharedStore, config: &Config, model: &str, now_ms: u64) -> u8 {
    level_with(store, config, model, now_ms).0
}

/// The level of `model` at `now_ms` and the load signals it was read with.
pub fn level_with(
    store: &dyn SharedStore,
    config: &Config,
    model: &str,
    now_ms: u64,
) -> (u8, Signals) {
    // Alerts arrive through the admin endpoint, which needs a token, or by
    // pulling Alertmanager; without either (and without thresholds) no level
    // is ever set, and the shared data is not read.
    let by_alert = if config.admin.token.is_some() || config.degrade.alertmanager.is_some() {
        alert_level(store, config, model, now_ms)
    } else {
        0
    };
    if config.degrade.thresholds.is_empty() && by_alert == 0 {
        return (0, Signals::default());
    }
    let signals = signals(store, config, model, now_ms);
    let by_load = threshold_level(&config.degrade, model, &signals);
    (by_load.max(by_alert), signals)
}

/// The load signals of `model` at `now_ms`: this proxy's window (of the
/// record its calls count in: its own, or the one the models beyond the
/// bound share), raised to the mesh-wide readings of Prometheus while they
/// are fresh.
pub fn signals(store: &dyn SharedStore, config: &Config, model: &str, now_ms: u64) -> Signals {
    let local = load::read_model(store, &config.names, model, now_ms);
    match &config.degrade.prometheus {
        Some(source) => sources::mesh::signals(store, source, model, local, now_ms),
        None => local,
    }
}

/// The level the thresholds set for `model` with these signals.
pub fn threshold_level(cfg: &DegradeConfig, model: &str, s: &Signals) -> u8 {
    cfg.thresholds
        .iter()
        .filter(|t| t.model.as_deref().is_none_or(|m| m == model))
        .filter(|t| s.get(t.signal) > t.above)
        .map(|t| t.level)
        .max()
        .unwrap_or(0)
}

/// The level the active alerts raise for `model` at `now_ms`.
pub fn alert_level(store: &dyn SharedStore, config: &Config, model: &str, now_ms: u64) -> u8 {
    let active = alerts::active(store, &config.degrade, now_ms);
    if active.is_empty() {
        return 0;
    }
    alerts::level(&active, &config.degrade, model, &clusters_of(config, model))
}

/// The refusal among `actions`, if any: `reject` before `shed`.
pub fn refusal(cfg: &DegradeConfig, actions: &[Action]) -> Option<(Action, LocalReply)> {
    let (action, retry_after_s) = if actions.contains(&Action::Reject) {
        (Action::Reject, cfg.retry_after_s.saturating_mul(2))
    } else if actions.contains(&Action::Shed) {
        (Action::Shed, cfg.retry_after_s)
    } else {
        return None;
    };
    let kind = if action == Action::Reject {
        ReplyKind::DegradeReject
    } else {
        ReplyKind::DegradeShed
    };
    Some((action, reply::local_reply(kind, Some(retry_after_s))))
}

/// What the body actions did to a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    /// The actions that changed it, in order.
    pub applied: Vec<Action>,
    /// The model it now asks for, when switched.
    pub model: Option<String>,
}

/// Applies the body actions among `actions` to the body of a call of
/// `model`, in place: the fallback model, the output token cap (shaping's, in
/// the call's token field, `None` for a dialect without one), the temperature by `signals`. `None` when none
/// changed anything, or the body is not one object naming each key once.
pub fn edit(
    cfg: &DegradeConfig,
    actions: &[Action],
    doc: &mut Document,
    model: &str,
    field: Option<TokenField>,
    signals: &Signals,
) -> Option<Edited> {
    let tree = doc.tree()?;
    if !matches!(tree, Json::Object(_)) || tree.repeats_a_key() {
        return None;
    }
    let mut applied = Vec::new();
    let mut switched = None;
    for action in actions {
        let changed = match action {
            Action::FallbackModel => cfg.fallback_model.get(model).is_some_and(|fallback| {
                let set = switch_model(doc, fallback);
                if set {
                    switched = Some(fallback.clone());
                }
                set
            }),
            // A dialect without an output cap skips it.
            Action::MaxTokens => {
                field.is_some_and(|f| shaping::cap_max_tokens(doc, cfg.max_tokens_cap, f))
            }
            // The temperature is the client's: the actions before never change it.
            Action::Temperature => temperature::lower(doc, cfg, signals),
            Action::Cache | Action::Shed | Action::Reject => false,
        };
        if changed {
            applied.push(*action);
        }
    }
    (!applied.is_empty()).then_some(Edited {
        applied,
        model: switched,
    })
}

/// Sets the body's top-level `model` to `model`; false when it names none.
pub fn switch_model(doc: &mut Document, model: &str) -> bool {
    let Ok(quoted) = serde_json::to_string(model) else {
        return false;
    };
    doc.set("model", quoted.as_bytes(), Json::String(model.to_string()))
}

/// Counts an action taken on a call of priority `p`.
pub fn count(m: &mut dyn Metrics, action: Action, p: Priority) {
    m.counter(
        &names::name(
            names::DEGRADED,
            &[("action", action.as_str()), ("priority", p.as_str())],
        ),
        1,
    );
}

/// Sets the level gauge of `model`.
pub fn set_level_gauge(m: &mut dyn Metrics, model: &str, level: u8) {
    m.gauge(
        &names::name(names::DEGRADE_LEVEL, &[("model", model)]),
        i64::from(level),
    );
}

/// Sets the level gauge of every model the filter measures or routes.
pub fn publish(store: &dyn SharedStore, config: &Config, m: &mut dyn Metrics, now_ms: u64) {
    let mut models: Vec<String> = config.routing.models.keys().cloned().collect();
    for key in load::index(store) {
        if let Some(Scope::Model(model)) = Scope::of_key(&key) {
            models.push(model.to_string());
        }
    }
    for model in crate::config::names::sorted(models) {
        let level = level(store, config, &model, now_ms);
        set_level_gauge(m, &model, level);
    }
}

#[cfg(test)]
mod tests;
