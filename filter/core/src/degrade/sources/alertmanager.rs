//! Alertmanager's answer to `GET /api/v2/alerts`: the alerts it holds, read
//! into the reports of the ones in force. The pull asks for active alerts
//! only; an alert that says it is suppressed (silenced, inhibited) or not yet
//! processed is left out all the same, whatever the server did with the query.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::degrade::alerts::{self, Report, Source};

/// Most alerts one answer may list; a longer answer is refused whole.
pub const MAX_LISTED: usize = 10_000;

/// Reads an answer at `now_ms` into the reports of the alerts in force (each
/// [`Report::Firing`], or [`Report::Dropped`] when a label is too long); the
/// error says why it is not an answer.
pub fn parse(body: &[u8], now_ms: u64) -> Result<Vec<Report>, String> {
    let listed: Value =
        serde_json::from_slice(body).map_err(|e| format!("not Alertmanager's alert list: {e}"))?;
    let listed = listed.as_array().ok_or("not a list of alerts")?;
    if listed.len() > MAX_LISTED {
        return Err(format!("{} alerts, at most {MAX_LISTED}", listed.len()));
    }
    let mut reports = Vec::new();
    for alert in listed {
        let status = alert.get("status").ok_or("an alert without a status")?;
        let labels = match alert.get("labels") {
            None => BTreeMap::new(),
            Some(Value::Object(labels)) => labels
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect::<Option<BTreeMap<String, String>>>()
                .ok_or("a label value that is not a string")?,
            Some(_) => return Err("labels that are not an object".to_string()),
        };
        if !in_force(status) {
            continue;
        }
        let given = alert
            .get("fingerprint")
            .and_then(Value::as_str)
            .map(str::to_string);
        let fingerprint = alerts::fingerprint(given, &labels);
        reports.push(alerts::firing_report(
            &labels,
            fingerprint,
            Source::Pulled,
            now_ms,
        ));
    }
    Ok(reports)
}

/// Active, and neither silenced nor inhibited.
fn in_force(status: &Value) -> bool {
    let none = |field: &str| {
        status
            .get(field)
            .is_none_or(|v| v.as_array().is_some_and(Vec::is_empty))
    };
    status.get("state").and_then(Value::as_str) == Some("active")
        && none("silencedBy")
        && none("inhibitedBy")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(fp: &str, state: &str, silenced: &str, labels: &str) -> String {
        format!(
            r#"{{"annotations":{{}},"endsAt":"2026-12-01T16:00:00Z","fingerprint":"{fp}","receivers":[{{"name":"llm"}}],
               "startsAt":"2026-12-01T15:00:00Z","status":{{"inhibitedBy":[],"silencedBy":[{silenced}],"state":"{state}"}},
               "updatedAt":"2026-12-01T15:00:00Z","generatorURL":"","labels":{{{labels}}}}}"#
        )
    }

    #[test]
    fn only_the_alerts_in_force_are_read() {
        let body = format!(
            "[{}]",
            [
                listed(
                    "a1",
                    "active",
                    "",
                    r#""alertname":"LLMDown","severity":"critical""#
                ),
                listed("a2", "suppressed", r#""s1""#, r#""severity":"critical""#),
                listed("a3", "unprocessed", "", r#""severity":"critical""#),
                listed("a4", "active", r#""s2""#, r#""severity":"critical""#),
            ]
            .join(",")
        );
        let reports = parse(body.as_bytes(), 7).unwrap();
        assert_eq!(reports.len(), 1);
        let Report::Firing(a) = &reports[0] else {
            panic!("{reports:?}")
        };
        assert_eq!((a.fingerprint.as_str(), a.seen_ms), ("a1", 7));
        assert_eq!(a.alertname.as_deref(), Some("LLMDown"));
        assert_eq!(a.source, Source::Pulled);
        assert_eq!(parse(b"[]", 0).unwrap(), []);
    }

    #[test]
    fn anything_but_a_list_of_alerts_is_refused() {
        for body in [
            &b"{}"[..],
            b"<html>",
            br#"[{"labels":{}}]"#,
            br#"[{"labels":{"a":1},"status":{"state":"active"}}]"#,
        ] {
            assert!(parse(body, 0).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }
}
