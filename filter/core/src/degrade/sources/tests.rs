use super::*;
use crate::config::Config;
use crate::degrade;
use crate::host::{MemoryMetrics, MemoryStore};

const AM: &str =
    r#"{"degrade":{"alert_ttl_s":60,"alertmanager":{"cluster":"am","interval_s":10}}}"#;

fn config(json: &str) -> Config {
    Config::parse(json.as_bytes()).unwrap()
}

/// Alertmanager's list of `alerts` (fingerprint, severity), all active.
fn listed(alerts: &[(&str, &str)]) -> Vec<u8> {
    let items: Vec<String> = alerts
        .iter()
        .map(|(fp, severity)| {
            format!(
                r#"{{"labels":{{"alertname":"LLMLoad","severity":"{severity}"}},"fingerprint":"{fp}",
                   "status":{{"state":"active","silencedBy":[],"inhibitedBy":[]}}}}"#
            )
        })
        .collect();
    format!("[{}]", items.join(",")).into_bytes()
}

/// The due pull of `kind` at `now_ms`, taken by worker 1 (the lease is
/// created on the first tick and won on the next interval).
fn pull(c: &Config, store: &MemoryStore, kind: PullKind) -> Pull {
    let puller = Puller::new(1);
    assert!(
        puller.due(&c.degrade, store, 0).is_empty(),
        "the first tick creates the lease"
    );
    puller
        .due(&c.degrade, store, 1_000_000)
        .into_iter()
        .find(|p| p.kind == kind)
        .unwrap()
}

fn answered(body: &[u8]) -> ProbeEnd<'_> {
    ProbeEnd::Answered { status: 200, body }
}

fn counter(m: &MemoryMetrics, what: &str, result: &str) -> u64 {
    let name = names::name(names::DEGRADE_PULLS, &[("what", what), ("result", result)]);
    m.counters.get(&name).copied().unwrap_or(0)
}

#[test]
fn one_worker_pulls_each_source_per_interval() {
    let c = config(
        r#"{"degrade":{"alertmanager":{"cluster":"am","interval_s":10,"headers":{"authorization":"Bearer t"}},
            "prometheus":{"cluster":"prom","interval_s":20,"queries":{"in_flight":""}}}}"#,
    );
    let store = MemoryStore::new();
    let (one, two) = (Puller::new(1), Puller::new(2));
    assert!(one.due(&c.degrade, &store, 0).is_empty());
    assert!(two.due(&c.degrade, &store, 0).is_empty());
    let due = two.due(&c.degrade, &store, 20_000);
    let kinds: Vec<PullKind> = due.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        [
            PullKind::Alerts,
            PullKind::Load(Signal::Rps),
            PullKind::Load(Signal::TokensPerS)
        ]
    );
    let am = &due[0];
    assert_eq!((am.cluster.as_str(), am.timeout_ms), ("am", 2_000));
    assert!(am
        .headers
        .contains(&("authorization".to_string(), "Bearer t".to_string())));
    assert!(am
        .headers
        .iter()
        .any(|(k, v)| k == ":path" && v.starts_with("/api/v2/alerts?active=true")));
    assert!(
        one.due(&c.degrade, &store, 20_000).is_empty(),
        "the lease is two's"
    );
    // Alertmanager's interval ends first; Prometheus's lease still holds.
    let due = one.due(&c.degrade, &store, 30_000);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].kind, PullKind::Alerts);
    // Nothing configured: nothing due, no lease written.
    let none = config("{}");
    let empty = MemoryStore::new();
    assert!(one.due(&none.degrade, &empty, 0).is_empty());
    assert!(empty.is_empty());
}

#[test]
fn pulled_alerts_set_the_level_and_end_when_no_longer_listed() {
    let (c, store, mut m) = (config(AM), MemoryStore::new(), MemoryMetrics::default());
    let p = pull(&c, &store, PullKind::Alerts);
    let puller = Puller::new(1);
    let finish = |m: &mut MemoryMetrics, body: &[u8], now: u64| {
        puller.finish(&c, &store, m, &p, answered(body), now);
    };
    finish(&mut m, &listed(&[("a", "critical"), ("b", "info")]), 0);
    assert_eq!(
        degrade::level(&store, &c, "gpt-4o", 1),
        3,
        "no admin token needed"
    );
    assert_eq!(counter(&m, "alertmanager", "ok"), 1);
    let up = names::name(names::DEGRADE_SOURCE_UP, &[("what", "alertmanager")]);
    assert_eq!(m.gauges[&up], 1);
    // The critical alert ends, a warning fires: listed no more is resolved.
    finish(&mut m, &listed(&[("w", "warning")]), 10_000);
    assert_eq!(degrade::level(&store, &c, "gpt-4o", 10_000), 1);
    finish(&mut m, &listed(&[]), 20_000);
    assert_eq!(degrade::level(&store, &c, "gpt-4o", 20_000), 0);
}

#[test]
fn a_failed_pull_keeps_the_last_alerts_until_they_expire() {
    let (c, store, mut m) = (config(AM), MemoryStore::new(), MemoryMetrics::default());
    let p = pull(&c, &store, PullKind::Alerts);
    let puller = Puller::new(1);
    puller.finish(
        &c,
        &store,
        &mut m,
        &p,
        answered(&listed(&[("a", "critical")])),
        0,
    );
    // Small items past the bound: refused as they are read, not as a tree.
    let past = format!(
        "[{}]",
        vec![r#"{"status":{}}"#; alertmanager::MAX_LISTED + 1].join(",")
    );
    let failures: [(ProbeEnd<'_>, &str); 6] = [
        (answered(past.as_bytes()), "invalid"),
        (ProbeEnd::NoAnswer, "no_answer"),
        (ProbeEnd::NotSent, "not_sent"),
        (
            ProbeEnd::Answered {
                status: 503,
                body: b"[]",
            },
            "status",
        ),
        (answered(b"<html>oops</html>"), "invalid"),
        (answered(br#"{"alerts":[]}"#), "invalid"),
    ];
    for (i, (end, result)) in failures.into_iter().enumerate() {
        let now = 9_000 * (i as u64 + 1);
        puller.finish(&c, &store, &mut m, &p, end, now);
        assert!(counter(&m, "alertmanager", result) >= 1, "{result}");
        assert_eq!(
            degrade::level(&store, &c, "m", now),
            3,
            "{result}: the last alerts hold"
        );
    }
    let up = names::name(names::DEGRADE_SOURCE_UP, &[("what", "alertmanager")]);
    assert_eq!(m.gauges[&up], 0);
    // Neither re-read nor resolved: expired after alert_ttl_s.
    assert_eq!(degrade::level(&store, &c, "m", 59_999), 3);
    assert_eq!(degrade::level(&store, &c, "m", 60_000), 0);
}

/// The webhook is the admin endpoints' (the `admin` feature).
#[cfg(feature = "admin")]
#[test]
fn a_pull_leaves_the_webhooks_alerts_alone() {
    let json =
        r#"{"admin":{"token":"0123456789abcdef"},"degrade":{"alertmanager":{"cluster":"am"}}}"#;
    let (c, store, mut m) = (config(json), MemoryStore::new(), MemoryMetrics::default());
    let hook = br#"{"version":"4","alerts":[{"status":"firing","fingerprint":"h","labels":{"severity":"warning"}}]}"#;
    let reports = alerts::parse(hook, 0).unwrap();
    alerts::apply(&store, &c.degrade, &reports, 0).unwrap();
    let p = pull(&c, &store, PullKind::Alerts);
    let puller = Puller::new(1);
    puller.finish(
        &c,
        &store,
        &mut m,
        &p,
        answered(&listed(&[("a", "critical")])),
        1,
    );
    assert_eq!(degrade::level(&store, &c, "m", 2), 3);
    puller.finish(&c, &store, &mut m, &p, answered(&listed(&[])), 3);
    assert_eq!(
        degrade::level(&store, &c, "m", 4),
        1,
        "the webhook's warning stays"
    );
}

#[test]
fn the_mesh_load_drives_the_thresholds_and_falls_back_when_stale() {
    let json = r#"{"degrade":{
        "thresholds":[{"signal":"rps","above":5,"level":2},{"signal":"in_flight","above":50,"level":3}],
        "prometheus":{"cluster":"prom","interval_s":10,"stale_after_s":30}}}"#;
    let (c, store, mut m) = (config(json), MemoryStore::new(), MemoryMetrics::default());
    let rps = pull(&c, &store, PullKind::Load(Signal::Rps));
    let in_flight = Pull {
        kind: PullKind::Load(Signal::InFlight),
        ..rps.clone()
    };
    let puller = Puller::new(1);
    let vector = |samples: &str| {
        format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{samples}]}}}}"#)
            .into_bytes()
    };
    let body = vector(
        r#"{"metric":{"model":"gpt-4o"},"value":[1,"7.5"]},{"metric":{"model":"llama"},"value":[1,"NaN"]}"#,
    );
    puller.finish(&c, &store, &mut m, &rps, answered(&body), 1_000);
    assert_eq!(
        degrade::level(&store, &c, "gpt-4o", 2_000),
        2,
        "no local call, the mesh's"
    );
    assert_eq!(degrade::level(&store, &c, "llama", 2_000), 0);
    let dropped = names::name(names::DEGRADE_PULL_DROPPED, &[("what", "prometheus")]);
    assert_eq!(m.counters[&dropped], 1);
    let body = vector(r#"{"metric":{"model":"gpt-4o"},"value":[1,"80"]}"#);
    puller.finish(&c, &store, &mut m, &in_flight, answered(&body), 1_000);
    assert_eq!(degrade::level(&store, &c, "gpt-4o", 2_000), 3);
    // Garbage changes nothing; the readings hold until stale.
    puller.finish(&c, &store, &mut m, &rps, answered(b"{}"), 5_000);
    assert_eq!(counter(&m, "prometheus", "invalid"), 1);
    assert_eq!(degrade::level(&store, &c, "gpt-4o", 31_000), 3);
    assert_eq!(
        degrade::level(&store, &c, "gpt-4o", 31_001),
        0,
        "stale: the local window"
    );
    // The temperature rule reads the same signals.
    let s = degrade::signals(&store, &c, "gpt-4o", 2_000);
    assert_eq!((s.rps, s.in_flight), (7.5, 80));
}

#[test]
fn an_answer_past_the_bound_is_not_read() {
    let (c, store, mut m) = (config(AM), MemoryStore::new(), MemoryMetrics::default());
    let p = pull(&c, &store, PullKind::Alerts);
    let big = vec![b' '; MAX_ANSWER_BYTES + 1];
    Puller::new(1).finish(&c, &store, &mut m, &p, answered(&big), 0);
    assert_eq!(counter(&m, "alertmanager", "invalid"), 1);
}

mod props {
    use proptest::prelude::*;

    use super::super::{alertmanager, prometheus};
    use crate::degrade::alerts::{Report, MAX_LABEL_LEN};
    use crate::fuzz::{self, Doc};

    /// The readers as they were: a tree of the whole answer, its bounds
    /// checked after. Within the bounds the readers must agree with them.
    mod reference {
        use std::collections::BTreeMap;

        use serde_json::Value;

        use super::prometheus::{Reading, MAX_MODELS, MAX_VALUE};
        use crate::degrade::alerts::{self, Report, Source, MAX_LABEL_LEN};
        use crate::stat_name;

        pub fn alertmanager(body: &[u8], now_ms: u64) -> Option<Vec<Report>> {
            let listed: Value = serde_json::from_slice(body).ok()?;
            let mut reports = Vec::new();
            for alert in listed.as_array()? {
                let status = alert.get("status")?;
                let labels = match alert.get("labels") {
                    None => BTreeMap::new(),
                    Some(Value::Object(labels)) => labels
                        .iter()
                        .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                        .collect::<Option<BTreeMap<String, String>>>()?,
                    Some(_) => return None,
                };
                let none = |field: &str| {
                    status
                        .get(field)
                        .is_none_or(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))
                };
                let in_force = status.get("state").and_then(Value::as_str) == Some("active")
                    && none("silencedBy")
                    && none("inhibitedBy");
                if !in_force {
                    continue;
                }
                let fingerprint = alert
                    .get("fingerprint")
                    .and_then(Value::as_str)
                    .filter(|f| !f.is_empty() && f.len() <= MAX_LABEL_LEN)
                    .map_or_else(|| alerts::fingerprint_of(&labels), str::to_string);
                reports.push(alerts::firing_report(
                    &labels,
                    fingerprint,
                    Source::Pulled,
                    now_ms,
                ));
            }
            Some(reports)
        }

        pub fn prometheus(body: &[u8], model_label: &str) -> Option<Reading> {
            let answer: Value = serde_json::from_slice(body).ok()?;
            if answer.get("status")?.as_str()? != "success" {
                return None;
            }
            let data = answer.get("data")?;
            if data.get("resultType")?.as_str()? != "vector" {
                return None;
            }
            let mut reading = Reading::default();
            let mut values: BTreeMap<String, f64> = BTreeMap::new();
            for sample in data.get("result")?.as_array()? {
                let value = match sample.get("value")?.as_array()?.as_slice() {
                    [Value::Number(_), Value::String(v)] => v.parse::<f64>().ok(),
                    _ => return None,
                };
                let model = sample
                    .get("metric")
                    .and_then(|m| m.get(model_label))
                    .and_then(Value::as_str);
                let believed = value.filter(|v| v.is_finite() && (0.0..=MAX_VALUE).contains(v));
                let (Some(model), Some(value)) = (model, believed) else {
                    reading.dropped += 1;
                    continue;
                };
                let slot = values.entry(stat_name::label_value(model)).or_default();
                *slot = (*slot + value).min(MAX_VALUE);
            }
            let mut values: Vec<(String, f64)> = values.into_iter().collect();
            values.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            if values.len() > MAX_MODELS {
                reading.dropped += (values.len() - MAX_MODELS) as u32;
                values.truncate(MAX_MODELS);
            }
            reading.values = values;
            Some(reading)
        }
    }

    fn pick(words: &[&'static str]) -> impl Strategy<Value = String> {
        prop::sample::select(words.to_vec()).prop_map(str::to_string)
    }

    /// Members an answer may carry that no reader reads.
    fn extra() -> impl Strategy<Value = Vec<(String, Doc)>> {
        prop::collection::vec(
            (
                pick(&["annotations", "receivers", "updatedAt", "x"]),
                fuzz::doc(true),
            ),
            0..3,
        )
    }

    /// An object of `members` and `extra` ones, each key once.
    fn object(mut members: Vec<(String, Doc)>, extra: Vec<(String, Doc)>) -> Doc {
        for (k, v) in extra {
            if !members.iter().any(|(m, _)| *m == k) {
                members.push((k, v));
            }
        }
        Doc::Obj(members)
    }

    /// One alert as Alertmanager lists it, the readers' members and others
    /// in any order and spelling.
    fn alert() -> impl Strategy<Value = Doc> {
        let label = (
            prop_oneof![
                pick(&["alertname", "severity", "model", "llm_cluster", "team"]),
                fuzz::key()
            ],
            prop_oneof![
                pick(&["critical", "warning", "gpt-4o", "LLMDown", ""]),
                fuzz::text()
            ],
        );
        let held = || prop::collection::vec(fuzz::text().prop_map(Doc::Str), 0..2);
        let status = (
            pick(&["active", "suppressed", "unprocessed"]),
            held(),
            held(),
            any::<bool>(),
        )
            .prop_map(|(state, silenced, inhibited, null)| {
                let silenced = if null && silenced.is_empty() {
                    Doc::Null
                } else {
                    Doc::Arr(silenced)
                };
                Doc::Obj(vec![
                    ("state".into(), Doc::Str(state)),
                    ("silencedBy".into(), silenced),
                    ("inhibitedBy".into(), Doc::Arr(inhibited)),
                ])
            });
        let fingerprint = prop::option::of(prop_oneof![pick(&["", "a1", "b2"]), fuzz::text()]);
        (
            prop::collection::btree_map(label.0, label.1, 0..6),
            status,
            fingerprint,
            extra(),
        )
            .prop_map(|(labels, status, fingerprint, extra)| {
                let labels = labels.into_iter().map(|(k, v)| (k, Doc::Str(v))).collect();
                let mut members = vec![
                    ("labels".to_string(), Doc::Obj(labels)),
                    ("status".to_string(), status),
                ];
                if let Some(f) = fingerprint {
                    members.push(("fingerprint".into(), Doc::Str(f)));
                }
                object(members, extra)
            })
    }

    /// One sample of a vector, its model label present or not.
    fn sample() -> impl Strategy<Value = Doc> {
        let labels = prop::collection::btree_map(
            prop_oneof![pick(&["model", "job", "mo"]), fuzz::key()],
            prop_oneof![3 => pick(&["gpt-4o", "llama 3", ""]).prop_map(Doc::Str), 1 => fuzz::doc(true)],
            0..4,
        );
        (labels, fuzz::num(), value(), extra()).prop_map(|(labels, time, value, extra)| {
            let metric = Doc::Obj(labels.into_iter().collect());
            let pair = Doc::Arr(vec![Doc::Num(time), Doc::Str(value)]);
            object(
                vec![("metric".into(), metric), ("value".into(), pair)],
                extra,
            )
        })
    }

    fn vector_doc(samples: Vec<Doc>, extra: Vec<(String, Doc)>) -> Doc {
        let data = Doc::Obj(vec![
            ("resultType".into(), Doc::Str("vector".into())),
            ("result".into(), Doc::Arr(samples)),
        ]);
        object(
            vec![
                ("status".into(), Doc::Str("success".into())),
                ("data".into(), data),
            ],
            extra,
        )
    }

    fn quoted(s: &str) -> String {
        serde_json::to_string(s).unwrap_or_default()
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            (0.0f64..1e6).prop_map(|v| v.to_string()),
            (-1e12f64..1e12).prop_map(|v| format!("{v:e}")),
            prop::sample::select(vec!["NaN", "+Inf", "-Inf", "", "1e400", "0x10"])
                .prop_map(str::to_string),
            fuzz::text(),
        ]
    }

    fn vector(samples: &[(String, String)]) -> String {
        let items: Vec<String> = samples
            .iter()
            .map(|(m, v)| {
                format!(
                    r#"{{"metric":{{"model":{},"job":"envoy"}},"value":[1764600000.1,{}]}}"#,
                    quoted(m),
                    quoted(v)
                )
            })
            .collect();
        format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            items.join(",")
        )
    }

    fn listed(alerts: &[(String, String, bool)]) -> String {
        let items: Vec<String> = alerts
            .iter()
            .map(|(state, severity, silenced)| {
                format!(
                    r#"{{"labels":{{"severity":{}}},"status":{{"state":{},"silencedBy":[{}],"inhibitedBy":[]}}}}"#,
                    quoted(severity),
                    quoted(state),
                    if *silenced { r#""s""# } else { "" }
                )
            })
            .collect();
        format!("[{}]", items.join(","))
    }

    fn state() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("active".to_string()),
            Just("suppressed".to_string()),
            Just("unprocessed".to_string()),
            fuzz::text(),
        ]
    }

    /// What a reading keeps is always believable and bounded.
    fn bounded(r: &prometheus::Reading) -> bool {
        r.values.len() <= prometheus::MAX_MODELS
            && r.values
                .iter()
                .all(|(_, v)| v.is_finite() && (0.0..=prometheus::MAX_VALUE).contains(v))
            && r.values.windows(2).all(|w| w[0].1 >= w[1].1)
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Any vector answer: what is kept is bounded and in range, and a
        /// sample is either kept (summed into its model) or counted dropped.
        #[test]
        fn prometheus_answers_read_bounded(samples in prop::collection::vec((fuzz::text(), value()), 0..80)) {
            let r = prometheus::parse(vector(&samples).as_bytes(), "model", &crate::config::Names::default()).unwrap();
            prop_assert!(bounded(&r));
            let believed = samples.iter().filter(|(_, v)| {
                v.parse::<f64>().is_ok_and(|v| v.is_finite() && (0.0..=prometheus::MAX_VALUE).contains(&v))
            }).count();
            prop_assert!(r.dropped as usize >= samples.len() - believed);
        }

        /// Broken answers and arbitrary JSON: no panic, nothing unbounded.
        #[test]
        fn prometheus_garbage_never_panics(samples in prop::collection::vec((fuzz::text(), value()), 0..8), doc in fuzz::doc(false), seed: u64) {
            let mut broken = vector(&samples).into_bytes();
            let at = (seed as usize) % (broken.len() + 1);
            broken.truncate(at);
            for body in [broken, doc.spell(seed).into_bytes(), fuzz::mutated(&doc, seed)] {
                if let Ok(r) = prometheus::parse(&body, "model", &crate::config::Names::default()) {
                    prop_assert!(bounded(&r));
                }
            }
        }

        /// Any list: exactly the active, unsilenced alerts are read, none
        /// with a label past the bound.
        #[test]
        fn alertmanager_lists_read_the_alerts_in_force(alerts in prop::collection::vec((state(), fuzz::text(), any::<bool>()), 0..40)) {
            let reports = alertmanager::parse(listed(&alerts).as_bytes(), 0).unwrap();
            let in_force = alerts.iter().filter(|(s, _, silenced)| s == "active" && !silenced).count();
            prop_assert_eq!(reports.len(), in_force);
            for r in &reports {
                if let Report::Firing(a) = r {
                    prop_assert!(a.severity.as_ref().is_none_or(|s| s.len() <= MAX_LABEL_LEN));
                }
            }
        }

        /// Any list within the bounds, in any order and spelling, with
        /// members no reader reads: read as the whole tree was.
        #[test]
        fn alertmanager_lists_read_as_the_tree_did(alerts in prop::collection::vec(alert(), 0..12), seed: u64) {
            let body = Doc::Arr(alerts).spell(seed);
            let got = alertmanager::parse(body.as_bytes(), 7);
            prop_assert!(got.is_ok(), "{:?}: {}", got, body);
            // The tree refused numbers past `f64` wherever they were.
            if let Some(want) = reference::alertmanager(body.as_bytes(), 7) {
                prop_assert_eq!(got.ok(), Some(want));
            }
        }

        /// Any vector answer within the bounds, in any order and spelling,
        /// with labels and members no reader reads: read as the tree did.
        #[test]
        fn prometheus_answers_read_as_the_tree_did(samples in prop::collection::vec(sample(), 0..12), extra in extra(), seed: u64) {
            let body = vector_doc(samples, extra).spell(seed);
            let got = prometheus::parse(body.as_bytes(), "model", &crate::config::Names::default());
            prop_assert!(got.is_ok(), "{:?}: {}", got, body);
            if let Some(want) = reference::prometheus(body.as_bytes(), "model") {
                prop_assert_eq!(got.ok(), Some(want));
            }
        }

        /// Broken lists and arbitrary JSON: no panic.
        #[test]
        fn alertmanager_garbage_never_panics(doc in fuzz::doc(false), seed: u64) {
            let _ = alertmanager::parse(doc.spell(seed).as_bytes(), 0);
            let _ = alertmanager::parse(&fuzz::mutated(&doc, seed), 0);
        }
    }
}
