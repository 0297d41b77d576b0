//! The endpoints themselves: `POST <prefix>/alerts` and `GET <prefix>/state`.
//! A build without them (the sidecar build: the webhook reaches no sidecar,
//! which pulls its alerts) has `endpoints_off.rs` instead, and refuses an
//! `admin` section.

use serde::Serialize;

use crate::budget::reply::error_body;
use crate::config::Config;
use crate::degrade::{self, alerts};
use crate::host::{Metrics, SharedStore};
use crate::load::{self, Scope};
use crate::metrics::internal_error;
use crate::walk::{Env, Host, Step};

use super::MAX_BODY_BYTES;

/// Equal bytes, in time that depends on the lengths only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Which endpoint a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Alerts,
    State,
    Unknown,
}

/// One request to the admin endpoints.
#[derive(Debug)]
pub struct AdminCall {
    body: Vec<u8>,
    too_large: bool,
}

impl AdminCall {
    /// Takes a request under the prefix on its headers; `None`: not an admin
    /// path, the request is someone else's.
    pub fn start(
        env: &mut Env<'_>,
        host: &mut dyn Host,
        end_of_stream: bool,
    ) -> Option<(Self, Step)> {
        let cfg = &env.config.admin;
        let path = host.request_header(":path")?;
        let rest = cfg.own_rest(&path)?;
        let mut call = Self {
            body: Vec::new(),
            too_large: false,
        };
        let method = host.request_header(":method").unwrap_or_default();
        let endpoint = match (method.as_str(), rest) {
            ("POST", "/alerts") => Dialect::Alerts,
            ("GET", "/state") => Dialect::State,
            _ => Dialect::Unknown,
        };
        let Some(token) = cfg.token.as_deref() else {
            call.reply(env, host, 404, "not_found", "No such endpoint.");
            return Some((call, Step::Pause));
        };
        let given = host.request_header("authorization").unwrap_or_default();
        let bearer = given
            .strip_prefix("Bearer ")
            .or_else(|| given.strip_prefix("bearer "))
            .unwrap_or_default();
        if !constant_time_eq(bearer.trim().as_bytes(), token.as_bytes()) {
            call.reply(
                env,
                host,
                401,
                "unauthorized",
                "A valid bearer token is required.",
            );
            return Some((call, Step::Pause));
        }
        match endpoint {
            Dialect::Unknown => {
                call.reply(env, host, 404, "not_found", "No such endpoint.");
            }
            Dialect::State => {
                let body = state_json(env.store, env.config, env.now_ms);
                call.send(env, host, 200, &body);
            }
            Dialect::Alerts if end_of_stream => call.alerts(env, host),
            Dialect::Alerts => {
                let declared = host
                    .request_header("content-length")
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
                    call.too_large = true;
                    call.alerts(env, host);
                }
            }
        }
        Some((call, Step::Pause))
    }

    /// Request body callback of a webhook: held to its end, then applied.
    pub fn on_request_body(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Step {
        if !end_of_stream {
            if size > MAX_BODY_BYTES {
                self.too_large = true;
                self.alerts(env, host);
            }
            return Step::Pause;
        }
        if size > MAX_BODY_BYTES {
            self.too_large = true;
        } else {
            self.body = host.request_body(size).unwrap_or_default();
        }
        self.alerts(env, host);
        Step::Pause
    }

    /// Applies a webhook and answers it.
    fn alerts(&mut self, env: &mut Env<'_>, host: &mut dyn Host) {
        if self.too_large {
            let msg = format!("The webhook body is larger than {MAX_BODY_BYTES} bytes.");
            self.reply(env, host, 400, "invalid_request_error", &msg);
            return;
        }
        let reports = match alerts::parse(&self.body, env.now_ms) {
            Ok(r) => r,
            Err(e) => {
                self.reply(env, host, 400, "invalid_request_error", &e);
                return;
            }
        };
        match alerts::apply(env.store, &env.config.degrade, &reports, env.now_ms) {
            Ok(applied) => {
                log::info!(
                    "llm-filter: alerts webhook: {} firing, {} resolved, {} ignored, {} dropped",
                    applied.firing,
                    applied.resolved,
                    applied.ignored,
                    applied.dropped
                );
                let body = serde_json::to_vec(&applied).unwrap_or_default();
                self.send(env, host, 200, &body);
            }
            Err(_) => {
                internal_error(env.metrics, "degrade_alerts");
                self.reply(env, host, 503, "service_unavailable", "Try again.");
            }
        }
    }

    fn reply(&self, env: &mut Env<'_>, host: &mut dyn Host, status: u32, kind: &str, msg: &str) {
        let body = error_body(msg, kind, kind);
        self.send(env, host, status, &body);
    }

    fn send(&self, env: &mut Env<'_>, host: &mut dyn Host, status: u32, body: &[u8]) {
        let headers = [
            ("content-type", "application/json"),
            ("cache-control", "no-store"),
        ];
        if !host.send_local_reply(status, &headers, body) {
            local_reply_failed(env.metrics);
        }
    }
}

fn local_reply_failed(m: &mut dyn Metrics) {
    internal_error(m, "local_reply");
}

#[derive(Serialize)]
struct State<'a> {
    /// Level per model known to the filter; `*` for any other model.
    levels: std::collections::BTreeMap<String, u8>,
    alerts: Vec<AlertView<'a>>,
}

#[derive(Serialize)]
struct AlertView<'a> {
    fingerprint: &'a str,
    alertname: Option<&'a str>,
    severity: Option<&'a str>,
    model: Option<&'a str>,
    llm_cluster: Option<&'a str>,
    level: u8,
    expires_in_s: u64,
    source: alerts::Source,
}

/// The models the filter knows: routed ones, measured ones, ones an alert names.
fn known_models(store: &dyn SharedStore, config: &Config, active: &[alerts::Alert]) -> Vec<String> {
    let mut models: Vec<String> = config.routing.models.keys().cloned().collect();
    for key in load::index(store) {
        if let Some(Scope::Model(m)) = Scope::of_key(&key) {
            models.push(m.to_string());
        }
    }
    models.extend(active.iter().filter_map(|a| a.model.clone()));
    crate::config::names::sorted(models)
}

/// `GET <prefix>/state`: the levels now and the alerts in force.
pub fn state_json(store: &dyn SharedStore, config: &Config, now_ms: u64) -> Vec<u8> {
    let active = alerts::active(store, &config.degrade, now_ms);
    let mut levels = std::collections::BTreeMap::new();
    for model in known_models(store, config, &active) {
        let level = degrade::level(store, config, &model, now_ms);
        levels.insert(model, level);
    }
    levels.insert(
        "*".to_string(),
        alerts::level(&active, &config.degrade, "*", &[]),
    );
    let ttl = config.degrade.alert_ttl_ms;
    let state = State {
        levels,
        alerts: active
            .iter()
            .map(|a| AlertView {
                fingerprint: &a.fingerprint,
                alertname: a.alertname.as_deref(),
                severity: a.severity.as_deref(),
                model: a.model.as_deref(),
                llm_cluster: a.llm_cluster.as_deref(),
                level: a.level(&config.degrade.alerts),
                expires_in_s: (a.seen_ms.saturating_add(ttl)).saturating_sub(now_ms) / 1000,
                source: a.source,
            })
            .collect(),
    };
    serde_json::to_vec(&state).unwrap_or_default()
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
