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
use crate::dialect::request::{Switched, TokenField};
use crate::dialect::Dialect;
use crate::host::{Metrics, SharedStore};
use crate::json::{Document, Json};
use crate::load::{self, Scope, Signals};
use crate::metrics::{self as names};
use crate::priority::Priority;

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
    /// The `:path` the call now goes on, for a dialect naming the model
    /// there whose model was switched.
    pub path: Option<String>,
}

/// The call a body edit is for.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Its dialect: where the model, the output cap and the temperature are.
    pub dialect: Dialect,
    /// Its `:path`, which names the model for a dialect that keeps it there.
    pub path: &'a str,
    /// The model it asks for.
    pub model: &'a str,
}

/// Applies the body actions among `actions` to the body of a call, in
/// place: the fallback model (in the body, or in the path its dialect names
/// it in), the output token cap (shaping's, in the call's token field
/// `field` where the dialect lets the operator choose; skipped by one
/// without a cap), the temperature by `signals`. `None` when none changed
/// anything, or the body is not one object naming each key once.
pub fn edit(
    cfg: &DegradeConfig,
    actions: &[Action],
    doc: &mut Document,
    call: &Target<'_>,
    field: TokenField,
    signals: &Signals,
) -> Option<Edited> {
    let tree = doc.tree()?;
    if !matches!(tree, Json::Object(_)) || tree.repeats_a_key() {
        return None;
    }
    let api = call.dialect.request();
    let mut applied = Vec::new();
    let mut switched = None;
    let mut path = None;
    for action in actions {
        let changed = match action {
            Action::FallbackModel => cfg.fallback_model.get(call.model).is_some_and(|fallback| {
                let Some(to) = api.set_model(doc, call.path, fallback) else {
                    return false;
                };
                if let Switched::Path(p) = to {
                    path = Some(p);
                }
                switched = Some(fallback.clone());
                true
            }),
            Action::MaxTokens => api.cap_output(doc, cfg.max_tokens_cap, field),
            // The temperature is the client's: the actions before never change it.
            Action::Temperature => temperature::lower(doc, api, cfg, signals),
            Action::Cache | Action::Shed | Action::Reject => false,
        };
        if changed {
            applied.push(*action);
        }
    }
    (!applied.is_empty()).then_some(Edited {
        applied,
        model: switched,
        path,
    })
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
