//! Alertmanager's answer to `GET /api/v2/alerts`: the alerts it holds, read
//! into the reports of the ones in force. The pull asks for active alerts
//! only; an alert that says it is suppressed (silenced, inhibited) or not yet
//! processed is left out all the same, whatever the server did with the query.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};

use crate::degrade::alerts::{AlertList, Report, Source};
use crate::json::bounded::{self, Raw, Text};

/// Most alerts one answer may list; a longer answer is refused whole, on the
/// first alert past the bound.
pub const MAX_LISTED: usize = 10_000;

/// Reads an answer at `now_ms` into the reports of the alerts in force (each
/// [`Report::Firing`], or [`Report::Dropped`] when a label is too long); the
/// error says why it is not an answer. Read as it comes: only the reports
/// are kept, so what reading takes is bounded by [`MAX_LISTED`], not by what
/// the answer is made of.
pub fn parse(body: &[u8], now_ms: u64) -> Result<Vec<Report>, String> {
    let list = AlertList {
        status: Status,
        max: MAX_LISTED,
        source: Source::Pulled,
        now_ms,
    };
    bounded::read(body, list).map_err(|e| format!("not Alertmanager's alert list: {e}"))
}

/// Reads an alert's status: in force when active, and neither silenced nor
/// inhibited (`silencedBy`, `inhibitedBy` absent, null or empty).
#[derive(Clone, Copy)]
struct Status;

/// Longest state read.
const MAX_STATE_LEN: usize = 16;

impl<'de> DeserializeSeed<'de> for Status {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Status {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an alert status object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let (mut active, mut held) = (false, false);
        while let Some(key) = map.next_key_seed(Raw)? {
            let raw = map.next_value_seed(Raw)?;
            match bounded::name(key, &["state", "silencedBy", "inhibitedBy"]) {
                Some("state") => {
                    active = Text::of(raw, MAX_STATE_LEN).short() == Some("active");
                }
                Some(_) => held |= !(raw == "null" || bounded::is_empty_array(raw)),
                None => {}
            }
        }
        Ok(active && !held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::degrade::alerts::{MAX_LABELS, MAX_LABEL_LEN};

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
            br#"[{"labels":[],"status":{"state":"active"}}]"#,
            br#"[{"status":"active"}]"#,
            br#"[{"status":{"state":"active"}}] []"#,
            b"[1]",
        ] {
            assert!(parse(body, 0).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn a_list_is_refused_on_its_first_alert_past_the_bound() {
        let not_in_force = r#"{"status":{}}"#;
        let at = format!("[{}]", vec![not_in_force; MAX_LISTED].join(","));
        assert_eq!(parse(at.as_bytes(), 0).unwrap(), []);
        // What follows the first alert past the bound is never looked at.
        let past = format!(
            "[{},{not_in_force} garbage",
            vec![not_in_force; MAX_LISTED].join(",")
        );
        let e = parse(past.as_bytes(), 0).unwrap_err();
        assert!(e.contains("more than 10000 alerts"), "{e}");
    }

    #[test]
    fn labels_are_read_within_their_bounds() {
        let active = r#""status":{"state":"active","silencedBy":null}"#;
        let many: Vec<String> = (0..MAX_LABELS + 5)
            .map(|i| format!(r#""l{i}":"v""#))
            .collect();
        let many = many.join(",");
        // Past the bound the labels the rules read still are; with a
        // fingerprint of its own the alert is kept, without one dropped.
        let body = format!(
            r#"[{{{active},"fingerprint":"f","labels":{{{many},"severity":"critical"}}}},
                {{{active},"labels":{{{many},"severity":"critical"}}}}]"#
        );
        let reports = parse(body.as_bytes(), 0).unwrap();
        let Report::Firing(a) = &reports[0] else {
            panic!("{reports:?}")
        };
        assert_eq!(
            (a.fingerprint.as_str(), a.severity.as_deref()),
            ("f", Some("critical"))
        );
        assert_eq!(reports[1], Report::Dropped);
        // A label too long: dropped when the rules read it, or when the
        // alert has no fingerprint its labels could stand in for.
        let long = "x".repeat(MAX_LABEL_LEN + 1);
        let body = format!(
            r#"[{{{active},"fingerprint":"f","labels":{{"note":"{long}","sev\u0065rity":"warning"}}}},
                {{{active},"labels":{{"note":"{long}"}}}},
                {{{active},"fingerprint":"g","labels":{{"model":"{long}"}}}},
                {{{active},"fingerprint":"{long}","labels":{{"model":"m"}}}}]"#
        );
        let reports = parse(body.as_bytes(), 0).unwrap();
        let Report::Firing(a) = &reports[0] else {
            panic!("{reports:?}")
        };
        assert_eq!(a.severity.as_deref(), Some("warning"));
        assert_eq!(reports[1..3], [Report::Dropped, Report::Dropped]);
        let Report::Firing(a) = &reports[3] else {
            panic!("{reports:?}")
        };
        assert_eq!(a.fingerprint.len(), 16, "made of the labels");
    }
}
