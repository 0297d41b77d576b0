//! The operators' alerts, as Alertmanager's webhook (version 4) reports them
//! or as its API lists them when pulled (`degrade.alertmanager`, see
//! [`super::sources`]), kept in shared data so every worker degrades at once:
//! a firing alert that a rule of `degrade.alerts` matches is kept until it is
//! resolved (for a pulled alert: until a pull no longer lists it) or, neither
//! re-sent nor re-read, expires after `degrade.alert_ttl_s`.
//!
//! A webhook is parsed and checked whole before anything changes, so a
//! malformed one changes nothing. Alerts are kept by labels, and their level
//! is computed when read, from the rules in force.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{
    DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde::{Deserialize, Serialize};

use super::config::{AlertRule, DegradeConfig};
use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::{SharedStore, StoreError};
use crate::json::bounded::{self, Raw, Text};

/// The shared-data key of the active alerts.
pub const KEY: &str = crate::keyspace::ALERTS.key;
/// Most alerts kept; a firing alert beyond it is dropped (and counted in the
/// webhook's answer) until one ends.
pub const MAX_ALERTS: usize = 64;
/// Longest label value kept; an alert with a longer one is dropped.
pub const MAX_LABEL_LEN: usize = 256;
/// Most alerts one webhook may carry; a webhook with more is refused whole.
pub const MAX_WEBHOOK_ALERTS: usize = 1024;
/// Most labels of an alert read. Past them only the ones the rules read
/// (`alertname`, `severity`, `model`, `llm_cluster`) are, and an alert that
/// came without a fingerprint is dropped: its labels cannot make one.
pub const MAX_LABELS: usize = 128;
/// The labels the rules and the scoping read.
const RULED_LABELS: [&str; 4] = ["alertname", "severity", "model", "llm_cluster"];

/// How an alert reached the filter (`webhook` or `pulled` in the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Pushed to the admin path by Alertmanager's webhook.
    Webhook,
    /// Read from Alertmanager's API by a pull.
    Pulled,
}

/// An alert the filter acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// Alertmanager's fingerprint (or one made of the labels).
    pub fingerprint: String,
    /// `alertname`.
    pub alertname: Option<String>,
    /// `severity`.
    pub severity: Option<String>,
    /// `model`: the alert is about that model only.
    pub model: Option<String>,
    /// `llm_cluster`: the alert is about the models routed to that cluster.
    pub llm_cluster: Option<String>,
    /// When it was last sent or read as firing, ms.
    pub seen_ms: u64,
    /// How it came.
    pub source: Source,
}

impl Alert {
    fn label(&self, name: &str) -> Option<&str> {
        match name {
            "alertname" => self.alertname.as_deref(),
            "severity" => self.severity.as_deref(),
            "model" => self.model.as_deref(),
            "llm_cluster" => self.llm_cluster.as_deref(),
            _ => None,
        }
    }

    /// The highest level of the rules it matches (0: none).
    pub fn level(&self, rules: &[AlertRule]) -> u8 {
        rules
            .iter()
            .filter(|r| r.matches(|n| self.label(n)))
            .map(|r| r.level)
            .max()
            .unwrap_or(0)
    }

    /// The alert is about `model`, which routing places on `clusters`.
    pub fn applies_to(&self, model: &str, clusters: &[&str]) -> bool {
        self.model.as_deref().is_none_or(|m| m == model)
            && self
                .llm_cluster
                .as_deref()
                .is_none_or(|c| clusters.contains(&c))
    }

    /// Still in force at `now_ms`.
    pub fn live(&self, cfg: &DegradeConfig, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.seen_ms) < cfg.alert_ttl_ms
    }
}

/// What one alert of a webhook says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Firing (its `seen_ms` is when the webhook came).
    Firing(Alert),
    /// Resolved: forget the alert of this fingerprint.
    Resolved(String),
    /// Not kept: a label the rules read too long, or an alert without a
    /// fingerprint whose labels were not all read.
    Dropped,
}

/// Parses a webhook body; the error says what is wrong. Read as it comes: at
/// most [`MAX_WEBHOOK_ALERTS`] alerts, their labels bounded as [`Listed`]
/// reads them, nothing else kept.
pub fn parse(body: &[u8], now_ms: u64) -> Result<Vec<Report>, String> {
    let hook = bounded::read(body, WebhookSeed { now_ms })
        .map_err(|e| format!("not an Alertmanager webhook: {e}"))?;
    match hook.version {
        Some(Text::Short(v)) if v == "4" => {}
        Some(Text::Short(v)) => return Err(format!("webhook version {v:?}, expected \"4\"")),
        Some(_) => return Err("a webhook version that is not \"4\"".to_string()),
        None => return Err("not an Alertmanager webhook: no version".to_string()),
    }
    hook.alerts
        .ok_or_else(|| "not an Alertmanager webhook: no alerts".to_string())
}

/// Longest webhook version read.
const MAX_VERSION_LEN: usize = 16;

/// A webhook as read: its version and the reports of its alerts.
struct Webhook<'de> {
    version: Option<Text<'de>>,
    alerts: Option<Vec<Report>>,
}

/// Reads a webhook object.
#[derive(Clone, Copy)]
struct WebhookSeed {
    now_ms: u64,
}

impl<'de> DeserializeSeed<'de> for WebhookSeed {
    type Value = Webhook<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for WebhookSeed {
    type Value = Webhook<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a webhook object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let mut hook = Webhook {
            version: None,
            alerts: None,
        };
        bounded::each_member(map, &["version", "alerts"], |name, map| {
            if name == "version" {
                hook.version = Some(Text::of(map.next_value_seed(Raw)?, MAX_VERSION_LEN));
            } else {
                let alerts = AlertList {
                    status: WebhookStatus,
                    max: MAX_WEBHOOK_ALERTS,
                    source: Source::Webhook,
                    now_ms: self.now_ms,
                };
                hook.alerts = Some(map.next_value_seed(alerts)?);
            }
            Ok(())
        })?;
        Ok(hook)
    }
}

/// Reads a webhook alert's status: firing (`true`) or resolved.
#[derive(Clone, Copy)]
struct WebhookStatus;

impl<'de> DeserializeSeed<'de> for WebhookStatus {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        match Text::of(Raw.deserialize(d)?, MAX_VERSION_LEN) {
            Text::Short(s) if s == "firing" => Ok(true),
            Text::Short(s) if s == "resolved" => Ok(false),
            Text::Short(other) => Err(D::Error::custom(format!("alert status {other:?}"))),
            Text::Long | Text::Other => Err(D::Error::custom("an alert status that is no status")),
        }
    }
}

/// Reads a list of alerts, a webhook's or a pull's, into their reports as
/// they come: at most `max` alerts, each in force or not as `status` reads
/// its status, the rest as [`Listed`] reads it. An alert not in force is
/// resolved when a webhook says so; a pull leaves it out, since a pulled
/// alert ends when a pull no longer lists it.
#[derive(Clone, Copy)]
pub(crate) struct AlertList<St> {
    /// Reads an alert's status: in force or not.
    pub status: St,
    /// Most alerts read; a list of more is refused.
    pub max: usize,
    /// Where the list came from.
    pub source: Source,
    /// When it came, ms.
    pub now_ms: u64,
}

impl<'de, St: DeserializeSeed<'de, Value = bool> + Copy> DeserializeSeed<'de> for AlertList<St> {
    type Value = Vec<Report>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, St: DeserializeSeed<'de, Value = bool> + Copy> Visitor<'de> for AlertList<St> {
    type Value = Vec<Report>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of alerts")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let mut reports = Vec::new();
        let item = AlertSeed(self.status);
        bounded::each_item(seq, self.max, "alerts", item, |(in_force, listed)| {
            if in_force {
                reports.push(listed.firing(self.source, self.now_ms));
            } else if let (Source::Webhook, Some(fingerprint)) = (self.source, listed.fingerprint())
            {
                reports.push(Report::Resolved(fingerprint));
            }
            Ok(())
        })?;
        Ok(reports)
    }
}

/// Reads one alert: in force or not, as its seed reads the status, and what
/// it carries.
#[derive(Clone, Copy)]
struct AlertSeed<St>(St);

impl<'de, St: DeserializeSeed<'de, Value = bool> + Copy> DeserializeSeed<'de> for AlertSeed<St> {
    type Value = (bool, Listed);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, St: DeserializeSeed<'de, Value = bool> + Copy> Visitor<'de> for AlertSeed<St> {
    type Value = (bool, Listed);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an alert object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut in_force, mut listed) = (None, Listed::default());
        while let Some(key) = map.next_key_seed(Raw)? {
            if bounded::name(key, &["status"]).is_some() {
                in_force = Some(map.next_value_seed(self.0)?);
            } else {
                listed.member(key, &mut map)?;
            }
        }
        let in_force = in_force.ok_or_else(|| A::Error::custom("an alert without a status"))?;
        Ok((in_force, listed))
    }
}

/// What an alert carries besides its status, as a webhook or a pull lists
/// it, read with bounds: at most [`MAX_LABELS`] labels (and past them the
/// ones the rules read), each of at most [`MAX_LABEL_LEN`] bytes; any other
/// member is left to the caller.
#[derive(Debug, Clone, Default)]
pub struct Listed {
    labels: BTreeMap<String, String>,
    /// `fingerprint`, when usable.
    given: Option<String>,
    unread: Unread,
}

/// Which labels of an alert were not read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Unread {
    /// None.
    #[default]
    None,
    /// Some the rules do not read (too long, or past [`MAX_LABELS`]).
    Other,
    /// One the rules read (too long).
    Ruled,
}

impl Listed {
    /// Reads the member of the map key `key` (as [`Raw`] reads it) when it is
    /// one of an alert's `labels` or `fingerprint`; any other is read past.
    pub fn member<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<(), A::Error> {
        match bounded::name(key, &["labels", "fingerprint"]) {
            Some("labels") => map.next_value_seed(LabelsSeed(self)),
            Some("fingerprint") => {
                let raw = map.next_value_seed(Raw)?;
                self.given = Text::of(raw, MAX_LABEL_LEN)
                    .short()
                    .filter(|f| !f.is_empty())
                    .map(str::to_string);
                Ok(())
            }
            _ => map.next_value::<IgnoredAny>().map(|_| ()),
        }
    }

    /// The fingerprint the alert is kept by: the one it came with, or one
    /// made of its labels; `None` when it has neither (a label not read).
    pub fn fingerprint(&self) -> Option<String> {
        match (&self.given, self.unread) {
            (Some(f), _) => Some(f.clone()),
            (None, Unread::None) => Some(fingerprint_of(&self.labels)),
            (None, _) => None,
        }
    }

    /// The report of the alert firing, from `source`, at `now_ms`.
    pub fn firing(self, source: Source, now_ms: u64) -> Report {
        match self.fingerprint() {
            Some(fp) if self.unread != Unread::Ruled => {
                firing_report(&self.labels, fp, source, now_ms)
            }
            _ => Report::Dropped,
        }
    }
}

/// Reads an alert's labels into a [`Listed`].
struct LabelsSeed<'a>(&'a mut Listed);

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of labels")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let listed = self.0;
        while let Some(raw_key) = map.next_key_seed(Raw)? {
            let value = Text::of(map.next_value_seed(Raw)?, MAX_LABEL_LEN);
            if value == Text::Other {
                return Err(A::Error::custom("a label value that is not a string"));
            }
            let ruled = bounded::name(raw_key, &RULED_LABELS).is_some();
            let room = ruled || listed.labels.len() < MAX_LABELS;
            match (Text::of(raw_key, MAX_LABEL_LEN).short(), value.short()) {
                (Some(k), Some(v)) if room => {
                    listed.labels.insert(k.to_string(), v.to_string());
                }
                _ if ruled => listed.unread = Unread::Ruled,
                _ => listed.unread = listed.unread.max(Unread::Other),
            }
        }
        Ok(())
    }
}

/// The report of a firing alert of `labels`: [`Report::Dropped`] when a
/// label it keeps is too long.
pub(crate) fn firing_report(
    labels: &BTreeMap<String, String>,
    fingerprint: String,
    source: Source,
    now_ms: u64,
) -> Report {
    let get = |name: &str| labels.get(name).cloned();
    let alert = Alert {
        fingerprint,
        alertname: get("alertname"),
        severity: get("severity"),
        model: get("model"),
        llm_cluster: get("llm_cluster"),
        seen_ms: now_ms,
        source,
    };
    let too_long = [
        &alert.alertname,
        &alert.severity,
        &alert.model,
        &alert.llm_cluster,
    ]
    .into_iter()
    .flatten()
    .any(|v| v.len() > MAX_LABEL_LEN);
    if too_long {
        Report::Dropped
    } else {
        Report::Firing(alert)
    }
}

/// FNV-1a 64 of the sorted labels, for an alert sent without a fingerprint.
pub(crate) fn fingerprint_of(labels: &BTreeMap<String, String>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in labels {
        for b in k.bytes().chain([0xff]).chain(v.bytes()).chain([0xfe]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// What applying a webhook did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Firing alerts kept (new or refreshed).
    pub firing: u32,
    /// Alerts forgotten because resolved.
    pub resolved: u32,
    /// Firing alerts no rule matches (not kept).
    pub ignored: u32,
    /// Firing alerts not kept: the table was full or a label too long.
    pub dropped: u32,
}

fn decode(bytes: Option<&[u8]>) -> Vec<Alert> {
    bytes
        .and_then(codec::decode::<Vec<Alert>>)
        .unwrap_or_default()
}

/// Applies a parsed webhook at `now_ms`: expired alerts go first, then each
/// report in order.
pub fn apply(
    store: &dyn SharedStore,
    cfg: &DegradeConfig,
    reports: &[Report],
    now_ms: u64,
) -> Result<Applied, StoreError> {
    apply_reports(store, cfg, reports, now_ms, Source::Webhook)
}

/// Applies what a pull of Alertmanager's API read at `now_ms`: the alerts it
/// lists replace the ones the last pull listed (an alert no longer listed
/// has ended: it counts as `resolved`); the webhook's stay, expired ones go.
pub fn apply_pulled(
    store: &dyn SharedStore,
    cfg: &DegradeConfig,
    reports: &[Report],
    now_ms: u64,
) -> Result<Applied, StoreError> {
    apply_reports(store, cfg, reports, now_ms, Source::Pulled)
}

/// Expired alerts go, then (for a pull) the pulled ones `reports` no longer
/// lists, then each report in order.
fn apply_reports(
    store: &dyn SharedStore,
    cfg: &DegradeConfig,
    reports: &[Report],
    now_ms: u64,
    from: Source,
) -> Result<Applied, StoreError> {
    let listed = |fp: &str| {
        reports
            .iter()
            .any(|r| matches!(r, Report::Firing(a) if a.fingerprint == fp))
    };
    let u = cas::update(
        store,
        KEY,
        Unguarded::Verify,
        decode,
        codec::encode,
        |alerts: &mut Vec<Alert>| {
            let mut out = Applied::default();
            alerts.retain(|a| a.live(cfg, now_ms));
            if from == Source::Pulled {
                out.resolved = forget(alerts, |a| {
                    a.source == Source::Pulled && !listed(&a.fingerprint)
                });
            }
            for r in reports {
                match r {
                    // Counted once, however many alerts shared the fingerprint.
                    Report::Resolved(fp) => {
                        out.resolved += forget(alerts, |a| &a.fingerprint == fp).min(1);
                    }
                    Report::Dropped => out.dropped += 1,
                    Report::Firing(alert) => keep(alerts, alert, cfg, &mut out),
                }
            }
            Change::Write(out)
        },
    )?;
    Ok(u.out)
}

/// Forgets the alerts `ended` says have ended; how many.
fn forget(alerts: &mut Vec<Alert>, ended: impl Fn(&Alert) -> bool) -> u32 {
    let before = alerts.len();
    alerts.retain(|a| !ended(a));
    u32::try_from(before.saturating_sub(alerts.len())).unwrap_or(u32::MAX)
}

/// Keeps a firing `alert` in `alerts` (in place of the one of its
/// fingerprint) when a rule matches it and there is room.
fn keep(alerts: &mut Vec<Alert>, alert: &Alert, cfg: &DegradeConfig, out: &mut Applied) {
    if alert.level(&cfg.alerts) == 0 {
        // A rule may have stopped matching it since.
        alerts.retain(|a| a.fingerprint != alert.fingerprint);
        out.ignored += 1;
        return;
    }
    if let Some(a) = alerts
        .iter_mut()
        .find(|a| a.fingerprint == alert.fingerprint)
    {
        *a = alert.clone();
    } else if alerts.len() < MAX_ALERTS {
        alerts.push(alert.clone());
    } else {
        out.dropped += 1;
        return;
    }
    out.firing += 1;
}

/// The alerts in force at `now_ms` (ones no rule matches any more left out).
pub fn active(store: &dyn SharedStore, cfg: &DegradeConfig, now_ms: u64) -> Vec<Alert> {
    let bytes = store.get(KEY).ok().and_then(|v| v.value);
    let mut alerts = decode(bytes.as_deref());
    alerts.retain(|a| a.live(cfg, now_ms) && a.level(&cfg.alerts) > 0);
    alerts
}

/// The level the alerts raise for `model`, routed to `clusters`.
pub fn level(alerts: &[Alert], cfg: &DegradeConfig, model: &str, clusters: &[&str]) -> u8 {
    alerts
        .iter()
        .filter(|a| a.applies_to(model, clusters))
        .map(|a| a.level(&cfg.alerts))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::degrade::config::RawDegradeConfig;
    use crate::host::MemoryStore;

    fn hook(alerts: &str) -> Vec<u8> {
        format!(r#"{{"version":"4","status":"firing","receiver":"llm-filter","groupLabels":{{}},"alerts":[{alerts}]}}"#).into_bytes()
    }

    fn alert(status: &str, fp: &str, labels: &str) -> String {
        format!(
            r#"{{"status":"{status}","labels":{{{labels}}},"annotations":{{}},"startsAt":"2026-01-01T00:00:00Z","endsAt":"0001-01-01T00:00:00Z","fingerprint":"{fp}"}}"#
        )
    }

    fn cfg(json: &str) -> DegradeConfig {
        let raw: RawDegradeConfig = crate::config::read::parse(json.as_bytes()).unwrap();
        DegradeConfig::compile(raw).unwrap()
    }

    fn send(store: &MemoryStore, cfg: &DegradeConfig, body: &[u8], now_ms: u64) -> Applied {
        let reports = parse(body, now_ms).unwrap();
        apply(store, cfg, &reports, now_ms).unwrap()
    }

    #[test]
    fn firing_sets_resolved_clears_and_silence_expires() {
        let (store, cfg) = (MemoryStore::new(), cfg(r#"{"alert_ttl_s":60}"#));
        let crit = alert(
            "firing",
            "a1",
            r#""alertname":"LLMDown","severity":"critical""#,
        );
        let applied = send(&store, &cfg, &hook(&crit), 0);
        assert_eq!(applied.firing, 1);
        let alerts = active(&store, &cfg, 1_000);
        assert_eq!(level(&alerts, &cfg, "gpt-4o", &[]), 3);
        assert_eq!(alerts[0].alertname.as_deref(), Some("LLMDown"));
        // Re-sent: still in force past the first ttl.
        send(&store, &cfg, &hook(&crit), 50_000);
        assert_eq!(level(&active(&store, &cfg, 100_000), &cfg, "m", &[]), 3);
        // Not re-sent: expired.
        assert!(active(&store, &cfg, 110_000).is_empty());
        // Resolved clears at once.
        send(&store, &cfg, &hook(&crit), 200_000);
        let resolved = alert("resolved", "a1", r#""severity":"critical""#);
        assert_eq!(send(&store, &cfg, &hook(&resolved), 201_000).resolved, 1);
        assert!(active(&store, &cfg, 201_000).is_empty());
    }

    #[test]
    fn scoping_by_model_and_cluster() {
        let (store, cfg) = (MemoryStore::new(), cfg("{}"));
        let body = hook(
            &[
                alert("firing", "w", r#""severity":"warning""#),
                alert("firing", "m", r#""severity":"critical","model":"gpt-4o""#),
                alert(
                    "firing",
                    "c",
                    r#""severity":"critical","llm_cluster":"east""#,
                ),
                alert("firing", "i", r#""severity":"info""#),
            ]
            .join(","),
        );
        let applied = send(&store, &cfg, &body, 0);
        assert_eq!((applied.firing, applied.ignored), (3, 1));
        let alerts = active(&store, &cfg, 0);
        assert_eq!(level(&alerts, &cfg, "gpt-4o", &[]), 3);
        assert_eq!(level(&alerts, &cfg, "llama", &["west"]), 1);
        assert_eq!(level(&alerts, &cfg, "llama", &["west", "east"]), 3);
    }

    #[test]
    fn custom_rules_and_the_highest_match() {
        let cfg = cfg(
            r#"{"alerts":[{"alertname":"LLMSlow","level":2},{"alertname":"LLMSlow","severity":"page","level":3}]}"#,
        );
        let store = MemoryStore::new();
        send(
            &store,
            &cfg,
            &hook(&alert(
                "firing",
                "x",
                r#""alertname":"LLMSlow","severity":"page""#,
            )),
            0,
        );
        assert_eq!(level(&active(&store, &cfg, 0), &cfg, "m", &[]), 3);
        // A default severity no longer matches anything.
        let other = hook(&alert("firing", "y", r#""severity":"critical""#));
        assert_eq!(send(&store, &cfg, &other, 0).ignored, 1);
    }

    #[test]
    fn the_table_is_bounded() {
        let (store, cfg) = (MemoryStore::new(), cfg("{}"));
        let many: Vec<String> = (0..MAX_ALERTS + 3)
            .map(|i| alert("firing", &format!("f{i}"), r#""severity":"warning""#))
            .collect();
        let applied = send(&store, &cfg, &hook(&many.join(",")), 0);
        assert_eq!((applied.firing, applied.dropped), (MAX_ALERTS as u32, 3));
        assert_eq!(active(&store, &cfg, 0).len(), MAX_ALERTS);
        let long = "x".repeat(MAX_LABEL_LEN + 1);
        let body = hook(&alert(
            "firing",
            "l",
            &format!(r#""severity":"warning","model":"{long}""#),
        ));
        assert_eq!(parse(&body, 0).unwrap(), [Report::Dropped]);
    }

    #[test]
    fn malformed_webhooks_are_refused_whole() {
        for body in [
            &b"{"[..],
            br#"{"version":"3","alerts":[]}"#,
            br#"{"alerts":[]}"#,
            br#"{"version":"4","alerts":[{"status":"firing","labels":{}},{"status":"maybe"}]}"#,
            br#"{"version":"4","alerts":[{"status":"firing","labels":{"a":1}}]}"#,
            br#"[]"#,
        ] {
            assert!(parse(body, 0).is_err(), "{}", String::from_utf8_lossy(body));
        }
        // Without a fingerprint the labels make one, the same each time.
        let a = parse(
            br#"{"version":"4","alerts":[{"status":"firing","labels":{"severity":"warning"}}]}"#,
            0,
        )
        .unwrap();
        let b = parse(
            br#"{"version":"4","alerts":[{"status":"resolved","labels":{"severity":"warning"}}]}"#,
            0,
        )
        .unwrap();
        let Report::Firing(fa) = &a[0] else { panic!() };
        assert_eq!(b[0], Report::Resolved(fa.fingerprint.clone()));
        assert_eq!(
            parse(br#"{"version":"5","alerts":[]}"#, 0).unwrap_err(),
            "webhook version \"5\", expected \"4\""
        );
        let long = format!(r#"{{"version":"{}","alerts":[]}}"#, "4".repeat(1 << 20));
        assert_eq!(
            parse(long.as_bytes(), 0).unwrap_err(),
            "a webhook version that is not \"4\""
        );
    }

    #[test]
    fn a_webhook_is_refused_on_its_first_alert_past_the_bound() {
        let one = alert("resolved", "r", "");
        let at = hook(&vec![one.as_str(); MAX_WEBHOOK_ALERTS].join(","));
        assert_eq!(parse(&at, 0).unwrap().len(), MAX_WEBHOOK_ALERTS);
        let past = hook(&vec![one.as_str(); MAX_WEBHOOK_ALERTS + 1].join(","));
        let e = parse(&past, 0).unwrap_err();
        assert!(e.contains("more than 1024 alerts"), "{e}");
    }

    #[test]
    fn an_alert_whose_labels_were_not_all_read_needs_its_fingerprint() {
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!(r#""l{i}":"v""#)).collect();
        let labels = format!(r#"{},"severity":"warning""#, many.join(","));
        let without = |status: &str| format!(r#"{{"status":"{status}","labels":{{{labels}}}}}"#);
        let body = hook(
            &[
                alert("firing", "f", &labels),
                without("firing"),
                without("resolved"),
                alert("resolved", "f", &labels),
            ]
            .join(","),
        );
        let reports = parse(&body, 0).unwrap();
        assert_eq!(reports.len(), 3, "nothing to resolve without a fingerprint");
        assert!(
            matches!(&reports[0], Report::Firing(a) if a.severity.as_deref() == Some("warning"))
        );
        assert_eq!(reports[1], Report::Dropped);
        assert_eq!(reports[2], Report::Resolved("f".to_string()));
    }
}
