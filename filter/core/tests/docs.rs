//! The reference in `docs/` kept true to the code: every metric the filter
//! defines is in `docs/metrics.md`, and every configuration field it accepts
//! is in `docs/configuration.md`. The fields are learnt from the parser
//! itself: each section refuses unknown fields, and serde's refusal lists the
//! ones it knows (``unknown field `x`, expected one of `a`, `b` ``), so feeding
//! every object an unknown field walks the whole accepted document. The
//! bounds a user can run into are stated with the numbers the code holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

#[cfg(feature = "full")]
use llm_filter_core::config::setting::Bound;
use llm_filter_core::config::setting::Row;
use llm_filter_core::config::Config;
use llm_filter_core::config::SECTIONS;
use llm_filter_core::metrics;
use serde_json::{json, Map, Value};

/// A field no section has.
const PROBE: &str = "zz_probe";
/// The key a map-valued field is probed with.
const MAP_KEY: &str = "zz_key";

fn doc(name: &str) -> String {
    let path = format!("{}/../../docs/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `` `code` `` span of a page, a `<placeholder>` spelled `<>`.
fn code_spans(page: &str) -> BTreeSet<String> {
    let mut spans = BTreeSet::new();
    for (i, span) in page.split('`').enumerate() {
        if i % 2 == 1 {
            spans.insert(without_placeholders(span));
        }
    }
    spans
}

/// The `` `code` `` spans of the first cell of every table row of a page:
/// what the page's tables are about, one row each.
fn row_keys(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix('|'))
        .filter_map(|l| l.split('|').next())
        .flat_map(code_spans)
        .collect()
}

fn without_placeholders(s: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in s.chars() {
        match c {
            '<' => {
                inside = true;
                out.push('<');
            }
            '>' if inside => {
                inside = false;
                out.push('>');
            }
            _ if inside => {}
            _ => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------- metrics

/// The names of the `pub const NAME: &str = "llm_filter_…"` (or `gen_ai_…`)
/// lines of `metrics.rs`: what the file defines, read from its source.
fn metric_constants_in_source() -> BTreeSet<String> {
    let src = include_str!("../src/metrics.rs");
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter_map(|l| l.split_once(": &str = \""))
        .filter(|(_, value)| value.starts_with("llm_filter_") || value.starts_with("gen_ai_"))
        .map(|(_, value)| value.trim_end_matches("\";").to_string())
        .collect()
}

#[test]
fn the_list_of_all_metrics_is_complete() {
    let listed: BTreeSet<String> = metrics::ALL.iter().map(|m| m.to_string()).collect();
    assert_eq!(listed.len(), metrics::ALL.len(), "a metric listed twice");
    assert_eq!(
        listed,
        metric_constants_in_source(),
        "metrics::ALL and the metric constants of metrics.rs differ"
    );
}

#[test]
fn every_metric_has_a_row_in_the_metrics_page() {
    let rows = row_keys(&doc("metrics.md"));
    let missing: Vec<&str> = metrics::ALL
        .iter()
        .copied()
        .filter(|m| !rows.contains(*m))
        .collect();
    assert!(missing.is_empty(), "no row in docs/metrics.md: {missing:?}");
}

#[test]
fn every_label_has_a_stats_tags_rule_in_the_metrics_page() {
    let page = doc("metrics.md");
    let spans = code_spans(&page);
    for label in metrics::LABELS {
        assert!(
            spans.contains(label),
            "label {label} not in docs/metrics.md"
        );
    }
}

// ---------------------------------------------------------- configuration

/// One step of a path into the document.
#[derive(Clone, Debug)]
enum Step {
    Field(String),
    Item,
    Key,
}

/// The document with `leaf` at `path`, every other value absent (so default).
fn document(path: &[Step], leaf: Value) -> Value {
    match path.split_first() {
        None => leaf,
        Some((Step::Field(f), rest)) => {
            let mut m = Map::new();
            m.insert(f.clone(), document(rest, leaf));
            Value::Object(m)
        }
        Some((Step::Item, rest)) => Value::Array(vec![document(rest, leaf)]),
        Some((Step::Key, rest)) => {
            let mut m = Map::new();
            m.insert(MAP_KEY.to_string(), document(rest, leaf));
            Value::Object(m)
        }
    }
}

/// The error path serde_path_to_error gives `path` with `tail` after it.
fn error_path(path: &[Step], tail: &str) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Step::Field(f) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(f);
            }
            Step::Item => out.push_str("[0]"),
            Step::Key => {
                out.push('.');
                out.push_str(MAP_KEY);
            }
        }
    }
    if out.is_empty() {
        tail.to_string()
    } else {
        format!("{out}.{tail}")
    }
}

/// The fields the object at `path` accepts, when it is an object that
/// refuses unknown fields: what serde lists in its refusal of [`PROBE`].
fn fields_at(path: &[Step]) -> Option<Vec<String>> {
    let probe = document(path, json!({ PROBE: 0 }));
    let e = Config::parse(probe.to_string().as_bytes()).err()?;
    let unknown = format!("unknown field `{PROBE}`");
    if e.field != error_path(path, PROBE) || !e.message.starts_with(&unknown) {
        return None;
    }
    let listed = e.message.get(unknown.len()..).unwrap_or_default();
    let listed = listed.split(" at line ").next().unwrap_or_default();
    let fields: Vec<String> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    // A per-priority setting (`{"P1": 1024}`) is a value, not a section.
    (fields != ["P0", "P1", "P2"]).then_some(fields)
}

/// The page's spelling of a path: `routing.models.<>[].cluster`.
fn spelled(path: &[Step]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Step::Field(f) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(f);
            }
            Step::Item => out.push_str("[]"),
            Step::Key => out.push_str(".<>"),
        }
    }
    out
}

/// Every field path the parser accepts below `path`, depth first in the
/// order of the raw structs, descending into objects, lists of objects and
/// maps of (lists of) objects.
fn walk(path: &[Step], out: &mut Vec<String>) {
    let Some(fields) = fields_at(path) else {
        return;
    };
    for f in fields {
        // A field of the same name further up: the same object again (a
        // price's `long_context` is a price), walked once.
        let again = path.iter().any(|s| matches!(s, Step::Field(g) if *g == f));
        let mut field = path.to_vec();
        field.push(Step::Field(f));
        out.push(spelled(&field));
        if again {
            continue;
        }
        for shape in [
            vec![],
            vec![Step::Item],
            vec![Step::Key],
            vec![Step::Key, Step::Item],
        ] {
            let mut inner = field.clone();
            inner.extend(shape);
            if fields_at(&inner).is_some() {
                walk(&inner, out);
                break;
            }
        }
    }
}

fn accepted_fields() -> Vec<String> {
    let mut out = Vec::new();
    walk(&[], &mut out);
    out
}

/// Sections the page documents by naming the section they take the fields
/// of (an A/B group's overrides): the test checks they take no field the
/// other lacks, so the page's "any `shaping` field" stays true.
const SAME_FIELDS_AS: [(&str, &str); 5] = [
    ("ab.groups[].overrides.shaping", "shaping"),
    ("ab.groups[].overrides.degrade", "degrade"),
    ("ab.groups[].overrides.routing.models", "routing.models"),
    ("limits.prices.<>.long_context", "limits.prices.<>"),
    ("limits.catalog", "limits.prices"),
];

/// The full build's: the page is the reference of the full build, whose
/// sections the sidecar build refuses (`build`).
#[cfg(feature = "full")]
#[test]
fn the_walk_finds_the_sections() {
    let fields = accepted_fields();
    for f in [
        "llm_paths",
        "cache.ttl_s",
        "cache.semantic.embeddings.cluster",
        "routing.models.<>[].cluster",
        "routing.rules[].when.model",
        "routing.hedge.max_ratio",
        "degrade.alerts[].severity",
        "ab.groups[].overrides.cache.enabled",
        "shaping.max_tokens_cap",
    ] {
        assert!(fields.iter().any(|g| g == f), "{f} not in {fields:?}");
    }
    // A per-priority value is not walked into.
    assert!(!fields.iter().any(|g| g.ends_with(".P0")), "{fields:?}");
}

#[test]
fn every_configuration_field_has_a_row_in_the_configuration_page() {
    let rows = row_keys(&doc("configuration.md"));
    let fields = accepted_fields();
    let mut missing = Vec::new();
    for f in &fields {
        let by_alias = SAME_FIELDS_AS.iter().find_map(|(alias, of)| {
            f.strip_prefix(alias)
                .filter(|rest| rest.starts_with('.'))
                .map(|rest| format!("{of}{rest}"))
        });
        match by_alias {
            Some(original) => assert!(
                fields.contains(&original),
                "{f} has no counterpart {original}: document it on its own"
            ),
            None if !rows.contains(f) => missing.push(f.as_str()),
            None => {}
        }
    }
    assert!(
        missing.is_empty(),
        "no row in docs/configuration.md: {missing:?}"
    );
}

// ---------------------------------------------------------------- bounds

/// `n` as the pages write a count: `1,024`, `10,000`.
fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `n` bytes as the pages write a size: `256 KiB`, `4 MiB`.
fn size(n: usize) -> String {
    match n {
        n if n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        n if n.is_multiple_of(1 << 10) => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// A page's text with its lines joined, so a phrase wrapped across lines
/// is found.
fn prose(name: &str) -> String {
    doc(name).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The bounds a caller, an operator's Alertmanager or Prometheus can run
/// into, each stated on the page where a reader looks for it, in the words
/// it is stated in, with the number the code holds: a changed constant
/// fails here until its page says so.
#[test]
fn the_bounds_a_user_can_hit_are_stated_as_the_code_holds_them() {
    use llm_filter_core::degrade::alerts::MAX_WEBHOOK_ALERTS;
    use llm_filter_core::degrade::alerts::{MAX_ALERTS, MAX_LABELS, MAX_LABEL_LEN};
    use llm_filter_core::degrade::sources::{alertmanager, prometheus, MAX_ANSWER_BYTES};
    use llm_filter_core::{admin, json, routing, sse};
    let stated = [
        (
            "degrade.md",
            format!(
                "one over {} or one of more than {} alerts gets a 400",
                size(admin::MAX_BODY_BYTES),
                count(MAX_WEBHOOK_ALERTS)
            ),
        ),
        (
            "degrade.md",
            format!("nested deeper than {}", json::MAX_DEPTH),
        ),
        ("degrade.md", format!("reads at most {MAX_LABELS} labels")),
        (
            "degrade.md",
            format!("each of at most {MAX_LABEL_LEN} bytes"),
        ),
        (
            "degrade.md",
            format!("a `fingerprint` (of at most {MAX_LABEL_LEN} bytes)"),
        ),
        (
            "degrade.md",
            format!("(at most {MAX_ALERTS}; further ones are counted"),
        ),
        (
            "degrade.md",
            format!(
                "one over {}, one listing more than {} alerts",
                size(MAX_ANSWER_BYTES),
                count(alertmanager::MAX_LISTED)
            ),
        ),
        (
            "degrade.md",
            format!(
                "one of more than {} samples is refused whole",
                count(prometheus::MAX_SAMPLES)
            ),
        ),
        (
            "degrade.md",
            format!("names and at most {} others", prometheus::MAX_MODELS),
        ),
        (
            "degrade.md",
            format!(
                "whose model is longer than {} bytes",
                prometheus::MAX_MODEL_LEN
            ),
        ),
        (
            "admin.md",
            format!(
                "a body over {} or of more than {} alerts gets a 400",
                size(admin::MAX_BODY_BYTES),
                count(MAX_WEBHOOK_ALERTS)
            ),
        ),
        (
            "metrics.md",
            format!("over {}, or a list past its bound", size(MAX_ANSWER_BYTES)),
        ),
        (
            "load.md",
            format!(
                "at most one event's bytes, up to {}",
                size(sse::MAX_HELD_EVENT)
            ),
        ),
        ("load.md", format!("An event over {}", size(sse::MAX_EVENT))),
        (
            "limits.md",
            format!("a stream event over {} is not read", size(sse::MAX_EVENT)),
        ),
        (
            "tracing.md",
            format!(
                "the text deltas of its first {} choices",
                sse::transcript::MAX_CHOICES
            ),
        ),
        (
            "apis.md",
            format!(
                "nor is an id longer than {} bytes",
                routing::stateful::MAX_ID_BYTES
            ),
        ),
        (
            "routing.md",
            format!(
                "A metrics page longer than {} is left unread",
                size(routing::probe::MAX_METRICS_BYTES)
            ),
        ),
        (
            "routing.md",
            format!(
                "of either, the first {} bytes count",
                count(routing::affinity::MAX_KEY_BYTES)
            ),
        ),
        (
            "cache.md",
            format!("nesting deeper than {}", json::MAX_DEPTH),
        ),
    ];
    let mut missing = Vec::new();
    for (page, phrase) in &stated {
        if !prose(page).contains(phrase.as_str()) {
            missing.push(format!("{page}: {phrase:?}"));
        }
    }
    assert!(
        missing.is_empty(),
        "bounds not stated as the code holds them:\n{}",
        missing.join("\n")
    );
}

// ---------------------------------------------------------------- settings

/// The cells of a table row, `\|` inside a cell kept as `|`.
fn cells(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in line
        .trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .chars()
    {
        match c {
            '|' if !escaped => out.push(String::new()),
            '\\' if !escaped => escaped = true,
            _ => {
                if escaped && c != '|' {
                    out.last_mut().unwrap().push('\\');
                }
                escaped = false;
                out.last_mut().unwrap().push(c);
            }
        }
    }
    out.iter().map(|c| c.trim().to_string()).collect()
}

/// The rows of the configuration page by the field they are about (the
/// first cell's code span, placeholders spelled `<>`): `[field, default,
/// range, meaning]`.
fn configuration_rows() -> BTreeMap<String, Vec<String>> {
    let page = doc("configuration.md");
    let mut rows = BTreeMap::new();
    for line in page.lines().filter(|l| l.starts_with("| `")) {
        let cells = cells(line);
        let key = cells.first().and_then(|c| code_spans(c).into_iter().next());
        assert_eq!(
            cells.len(),
            4,
            "not field | default | range | meaning: {line}"
        );
        rows.insert(key.unwrap(), cells);
    }
    rows
}

/// The ways the page may write a whole number: `3600`, `3,600`, and a
/// multiple of 1024 as a size (`64 KiB`, `16 MiB`).
#[cfg(feature = "full")]
fn spellings(n: &str) -> Vec<String> {
    let mut out = vec![n.to_string()];
    if let Ok(v) = n.parse::<usize>() {
        out.push(count(v));
        if v >= 1024 && v.is_multiple_of(1024) {
            out.push(size(v));
        }
    }
    out
}

/// What a setting's range cell may say: `1 to 3,600`, `[0, 1)`,
/// `at least 1`, `above 0`, or the words a dependent bound is stated in;
/// empty for a setting every value of its type is valid for.
#[cfg(feature = "full")]
fn range_cells(bound: &Bound<String>) -> Vec<String> {
    match bound {
        Bound::Any => vec![String::new()],
        Bound::Range(lo, hi) => {
            let mut out = Vec::new();
            for a in spellings(lo) {
                for b in spellings(hi) {
                    out.push(format!("{a} to {b}"));
                }
            }
            out
        }
        Bound::Positive(_) => vec!["at least 1".to_string()],
        Bound::Real(lo, lo_open, hi, hi_open) => {
            let open = if *lo_open { '(' } else { '[' };
            let close = if *hi_open { ')' } else { ']' };
            vec![format!("{open}{lo}, {hi}{close}")]
        }
        Bound::PositiveReal => vec!["above 0".to_string()],
        Bound::Stated(words) => vec![words.to_string()],
    }
}

/// Every setting of the code's tables, by its path in the document.
fn settings() -> Vec<(String, &'static dyn Row)> {
    let mut out = Vec::new();
    for table in SECTIONS {
        for (at, rows) in *table {
            for row in *rows {
                let path = if at.is_empty() {
                    row.name().to_string()
                } else {
                    format!("{at}.{}", row.name())
                };
                out.push((path, *row));
            }
        }
    }
    out
}

/// A default the page states is the code's: the same text, or for a list
/// or a map the same JSON however it is spaced.
#[cfg(feature = "full")]
fn same_default(stated: &str, code: &str) -> bool {
    if code.starts_with(['[', '{']) {
        let json = |s: &str| serde_json::from_str::<Value>(s).ok();
        return json(code).is_some() && json(stated) == json(code);
    }
    stated == code
}

/// The code's table of settings and the page agree: each setting has a row,
/// whose default cell starts with the default and whose range cell states
/// the range the section refuses outside of.
/// The full build's: the page is the reference of the full build, whose
/// sections the sidecar build refuses (`build`).
#[cfg(feature = "full")]
#[test]
fn every_setting_has_its_default_and_range_on_its_row() {
    let rows = configuration_rows();
    let mut wrong = Vec::new();
    for (path, setting) in settings() {
        let Some(row) = rows.get(&path) else {
            wrong.push(format!("{path}: no row"));
            continue;
        };
        let default = row.get(1).map(|c| c.as_str()).unwrap_or_default();
        // The first code span, or the words of a default derived from others.
        let stated = default.split('`').nth(1).unwrap_or(default);
        if !same_default(stated, &setting.default_text()) {
            wrong.push(format!(
                "{path}: default `{}`, the row says {default:?}",
                setting.default_text()
            ));
        }
        let bound = setting.bound_text();
        let range = row.get(2).map(|c| c.as_str()).unwrap_or_default();
        let allowed = range_cells(&bound);
        if bound != Bound::Any && !allowed.iter().any(|a| a == range) {
            wrong.push(format!(
                "{path}: range {:?}, the row says {range:?}",
                allowed.first().unwrap()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md differs from the code's settings:\n{}",
        wrong.join("\n")
    );
}

/// A range the page states is a setting's: no row states a bound the code's
/// tables do not hold.
#[test]
fn every_range_the_page_states_is_a_settings() {
    let settings: BTreeSet<String> = settings().into_iter().map(|(path, _)| path).collect();
    let stray: Vec<String> = configuration_rows()
        .into_iter()
        .filter(|(field, row)| {
            row.get(2).is_some_and(|r| !r.is_empty()) && !settings.contains(field)
        })
        .map(|(field, _)| field)
        .collect();
    assert!(stray.is_empty(), "a range no setting holds: {stray:?}");
    let fields = accepted_fields();
    eprintln!(
        "{} settings in the tables, of {} fields the parser accepts",
        settings.len(),
        fields.len()
    );
}

/// What a setting needs around it to be read: the required fields of the
/// object that holds it, and settings its bound depends on kept out of the
/// way (a long interval for a timeout that must be shorter).
const AROUND: [(&str, &str); 10] = [
    ("tracing.otlp", r#"{"cluster":"c"}"#),
    (
        "degrade.alertmanager",
        r#"{"cluster":"a","interval_s":3600}"#,
    ),
    ("degrade.prometheus", r#"{"cluster":"p","interval_s":3600}"#),
    (
        "cache.semantic",
        r#"{"embeddings":{"cluster":"e","model":"m"}}"#,
    ),
    (
        "cache.semantic.embeddings",
        r#"{"cluster":"e","model":"m"}"#,
    ),
    ("routing.models.<>[]", r#"{"cluster":"c"}"#),
    ("limits.rules[]", r#"{"name":"r","requests_per_minute":1}"#),
    ("limits.rules[].degrade", r#"{"max_tokens":1}"#),
    ("ab.groups[]", r#"{"name":"g"}"#),
    (
        "guardrails.service",
        r#"{"preset":"azure_content_safety","cluster":"s"}"#,
    ),
];

/// The document with `value` at `path` (`a.<>[].b`: a map's key `m`, a
/// list's first element), each object on the way holding what it needs.
fn document_with(path: &str, value: Value) -> Value {
    let (at, leaf) = path.rsplit_once('.').unwrap_or(("", path));
    let mut object: Value = AROUND
        .iter()
        .find(|(p, _)| *p == at)
        .map_or(json!({}), |(_, v)| serde_json::from_str(v).unwrap());
    object
        .as_object_mut()
        .unwrap()
        .insert(leaf.to_string(), value);
    if at.is_empty() {
        return object;
    }
    let (at, list) = match at.strip_suffix("[]") {
        Some(at) => (at, true),
        None => (at, false),
    };
    let object = if list { json!([object]) } else { object };
    match at.strip_suffix(".<>") {
        Some(at) => document_with(at, json!({ "m": object })),
        None => document_with(at, object),
    }
}

/// The error path of `path` as the parser names it.
fn error_path_of(path: &str) -> String {
    path.replace(".<>", ".m").replace("[]", "[0]")
}

/// Each setting's bound is the parser's: its ends are taken, a value past
/// either is refused naming the field. A section that declared a range and
/// checked another would fail here.
/// The full build's: the page is the reference of the full build, whose
/// sections the sidecar build refuses (`build`).
#[cfg(feature = "full")]
#[test]
fn the_parser_holds_each_setting_to_its_bound() {
    let mut wrong = Vec::new();
    for (path, setting) in settings() {
        let parse = |v: Value| Config::parse(document_with(&path, v).to_string().as_bytes());
        let mut taken = Vec::new();
        let mut refused = Vec::new();
        match setting.bound_text() {
            Bound::Range(lo, hi) => {
                let (lo, hi): (u64, u64) = (lo.parse().unwrap(), hi.parse().unwrap());
                taken.push(json!(hi));
                refused.push(json!(hi + 1));
                if let Some(below) = lo.checked_sub(1) {
                    refused.push(json!(below));
                }
            }
            Bound::Positive(_) => refused.push(json!(0)),
            Bound::PositiveReal => refused.extend([json!(0.0), json!(-1.0)]),
            Bound::Real(lo, lo_open, hi, hi_open) => {
                let (lo, hi): (f64, f64) = (lo.parse().unwrap(), hi.parse().unwrap());
                for (end, open, step) in [(lo, lo_open, -0.5), (hi, hi_open, 0.5)] {
                    if open {
                        refused.push(json!(end))
                    } else {
                        taken.push(json!(end))
                    }
                    refused.push(json!(end + step));
                }
            }
            Bound::Any | Bound::Stated(_) => {}
        }
        let field = error_path_of(&path);
        for v in taken {
            if let Err(e) = parse(v.clone()) {
                wrong.push(format!("{path}: {v} refused: {e}"));
            }
        }
        for v in refused {
            match parse(v.clone()) {
                Ok(_) => wrong.push(format!("{path}: {v} taken")),
                Err(e) if e.field != field => {
                    wrong.push(format!("{path}: {v} refused at {}: {e}", e.field))
                }
                Err(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The probes above reach every object a setting lives in.
#[test]
fn a_setting_document_is_read_where_the_setting_is() {
    assert_eq!(
        document_with("routing.models.<>[].weight", json!(2)),
        json!({"routing": {"models": {"m": [{"cluster": "c", "weight": 2}]}}})
    );
    assert_eq!(
        document_with("limits.rules[].degrade.until", json!(2)),
        json!({"limits": {"rules": [{"name": "r", "requests_per_minute": 1,
            "degrade": {"max_tokens": 1, "until": 2}}]}})
    );
    assert_eq!(
        error_path_of("routing.models.<>[].weight"),
        "routing.models.m[0].weight"
    );
    assert!(settings().len() > 10, "{}", settings().len());
}

// ---------------------------------------------------------------- shared data

/// The key-family table of docs/design.md is the registry's: a row per
/// family, its key, what it holds, its bound and who counts it as the
/// registry states them, and no row the registry does not name.
#[test]
fn the_key_family_table_is_the_registrys() {
    use llm_filter_core::keyspace::census::counted;
    use llm_filter_core::keyspace::FAMILIES;
    let page = doc("design.md");
    let section = page
        .split("## Shared data")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Shared data section");
    let rows: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("| `llm_filter."))
        .collect();
    let mut wrong = Vec::new();
    for f in FAMILIES {
        let row = format!(
            "| `{}` | {} | {} | {} |",
            f.pattern(),
            f.what,
            f.bound,
            counted(f).map_or("", |c| c.who())
        );
        if !rows.iter().any(|r| r.starts_with(&row)) {
            wrong.push(format!("no row {row}"));
        }
    }
    for r in &rows {
        let named = FAMILIES
            .iter()
            .any(|f| r.starts_with(&format!("| `{}` |", f.pattern())));
        if !named {
            wrong.push(format!("a row of no family: {r}"));
        }
    }
    assert_eq!(rows.len(), FAMILIES.len(), "one row per family");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
