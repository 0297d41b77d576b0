//! The reference in `docs/` kept true to the code: every metric the filter
//! defines is in `docs/metrics.md`, and every configuration field it accepts
//! is in `docs/configuration.md`. The fields are learnt from the parser
//! itself: each section refuses unknown fields, and serde's refusal lists the
//! ones it knows (``unknown field `x`, expected one of `a`, `b` ``), so feeding
//! every object an unknown field walks the whole accepted document. The
//! bounds a user can run into are stated with the numbers the code holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use llm_filter_core::config::Config;
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
        let mut field = path.to_vec();
        field.push(Step::Field(f));
        out.push(spelled(&field));
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
const SAME_FIELDS_AS: [(&str, &str); 3] = [
    ("ab.groups[].overrides.shaping", "shaping"),
    ("ab.groups[].overrides.degrade", "degrade"),
    ("ab.groups[].overrides.routing.models", "routing.models"),
];

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

/// Ranges of configuration fields, as their row states them and as the
/// parser holds them: the highest value stated is taken, one more refused.
#[test]
fn the_ranges_a_row_states_are_the_parsers() {
    // (field, as its row states the range, the document around it, its
    // highest value.)
    let ranges: [(&str, &str, Value, u64); 11] = [
        (
            "degrade.retry_after_s",
            "(1–3600;",
            json!({"degrade": {}}),
            3600,
        ),
        (
            "degrade.alertmanager.timeout_ms",
            "(1–60000,",
            json!({"degrade": {"alertmanager": {"cluster": "am", "interval_s": 3600}}}),
            60_000,
        ),
        (
            "degrade.prometheus.timeout_ms",
            "(1–60000,",
            json!({"degrade": {"prometheus": {"cluster": "p", "interval_s": 3600}}}),
            60_000,
        ),
        (
            "degrade.prometheus.stale_after_s",
            "at most 10800)",
            json!({"degrade": {"prometheus": {"cluster": "p"}}}),
            10_800,
        ),
        (
            "degrade.alert_ttl_s",
            "(1–86400)",
            json!({"degrade": {}}),
            86_400,
        ),
        (
            "limits.max_keys",
            "(1 to 1,048,576)",
            json!({"limits": {}}),
            1 << 20,
        ),
        (
            "limits.reserve_output_tokens",
            "(0 to 2²⁴)",
            json!({"limits": {}}),
            1 << 24,
        ),
        (
            "limits.tenant_labels",
            "0 to 1000)",
            json!({"limits": {}}),
            1_000,
        ),
        (
            "cache.stale_if_error_s",
            "(0 s to one year)",
            json!({"cache": {}}),
            365 * 24 * 3600,
        ),
        (
            "tracing.otlp.batch_size",
            "(1–2048)",
            json!({"tracing": {"otlp": {"cluster": "c"}}}),
            2_048,
        ),
        (
            "cache.max_entries",
            "(1 to 1,000,000)",
            json!({"cache": {}}),
            1_000_000,
        ),
    ];
    let page = doc("configuration.md");
    for (field, stated, base, highest) in ranges {
        let row = format!("| `{field}` |");
        let line = page.lines().find(|l| l.starts_with(&row));
        assert!(
            line.is_some_and(|l| l.contains(stated)),
            "{field}: its row does not say {stated:?}: {line:?}"
        );
        let (parents, leaf) = field.rsplit_once('.').unwrap();
        let with = |v: u64| {
            let mut d = base.clone();
            let mut at = &mut d;
            for p in parents.split('.') {
                at = at.as_object_mut().unwrap().entry(p).or_insert(json!({}));
            }
            at.as_object_mut()
                .unwrap()
                .insert(leaf.to_string(), json!(v));
            Config::parse(d.to_string().as_bytes())
        };
        assert!(
            with(highest).is_ok(),
            "{field}: {highest} refused: {:?}",
            with(highest).err()
        );
        assert!(with(highest + 1).is_err(), "{field}: {} taken", highest + 1);
    }
}

// ---------------------------------------------------------------- shared data

/// The key-family table of docs/design.md is the registry's: a row per
/// family, its key, what it holds, its bound and who counts it as the
/// registry states them, and no row the registry does not name.
#[test]
fn the_key_family_table_is_the_registrys() {
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
            f.counted.who()
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
