//! Load-driven degrade: a level 0–3 per model, the highest of what the
//! operators' alerts say (`alerts`) and, later in the walk, what the load
//! thresholds say; each level lowers what calls of the lower priorities ask for.

pub mod alerts;
pub mod config;

pub use config::{DegradeConfig, RawDegradeConfig};

use crate::config::Config;
use crate::host::SharedStore;

/// The clusters routing may place `model` on.
pub fn clusters_of<'a>(config: &'a Config, model: &str) -> Vec<&'a str> {
    config
        .routing
        .models
        .get(model)
        .map(|backends| backends.iter().map(|b| b.cluster.as_str()).collect())
        .unwrap_or_default()
}

/// The level of `model` at `now_ms`.
pub fn level(store: &dyn SharedStore, config: &Config, model: &str, now_ms: u64) -> u8 {
    alert_level(store, config, model, now_ms)
}

/// The level the active alerts raise for `model` at `now_ms`.
pub fn alert_level(store: &dyn SharedStore, config: &Config, model: &str, now_ms: u64) -> u8 {
    let active = alerts::active(store, &config.degrade, now_ms);
    if active.is_empty() {
        return 0;
    }
    alerts::level(&active, &config.degrade, model, &clusters_of(config, model))
}
