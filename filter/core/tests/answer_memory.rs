//! What reading a pulled answer or a posted webhook takes, measured: any
//! body within its size cap is decided (read or refused) allocating no more
//! than a bound set by the readers' item bounds, whatever the body is made
//! of. A tree of the whole body took some thirty times its bytes when made
//! of small items, and a VM's memory never shrinks back. The allocations are
//! counted per thread by a global allocator of this test binary alone (the
//! library forbids unsafe code), so tests running beside it do not count.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use llm_filter_core::admin::MAX_BODY_BYTES;
use llm_filter_core::degrade::alerts::{self, Report, MAX_WEBHOOK_ALERTS};
use llm_filter_core::degrade::sources::{alertmanager, prometheus, MAX_ANSWER_BYTES};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Counts the bytes each thread holds, and the most it held.
struct Counting;

thread_local! {
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = HELD.try_with(|h| {
        let now = h.get().saturating_add(n);
        h.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn shrank(n: usize) {
    let _ = HELD.try_with(|h| h.set(h.get().saturating_sub(n)));
}

// SAFETY: every call is passed to the system allocator unchanged; the
// counters are thread-local cells of plain integers, which neither allocate
// nor run destructors.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Both are held while the bytes move.
            grew(new_size);
            shrank(layout.size());
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// The most bytes `f` held at once beyond what was held before it, and
/// whether it read the body.
fn peak(f: impl FnOnce() -> bool) -> (usize, bool) {
    let before = HELD.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let read = f();
    (PEAK.with(Cell::get).saturating_sub(before), read)
}

/// What reading one alert takes besides its report: its labels (the bound's
/// and the four the rules read, each key and value at most 256 bytes), and a
/// label decoded from its escapes.
const ONE_ALERT: usize = 132 * (2 * 256 + 64) + 12 * 256;
/// Slack for the deserializer's own few hundred bytes.
const SLACK: usize = 16 << 10;

/// Most a list of `max` reports takes while it grows (the old and the new
/// buffer at the last doubling), besides their strings.
fn reports(max: usize) -> usize {
    3 * max.next_power_of_two() / 2 * std::mem::size_of::<Report>()
}

/// The bound on reading an Alertmanager answer of `len` bytes: its reports,
/// their strings (at most the answer's own bytes), one alert.
fn alertmanager_bound(len: usize) -> usize {
    reports(alertmanager::MAX_LISTED) + len + ONE_ALERT + SLACK
}

/// The bound on reading a webhook of `len` bytes.
fn webhook_bound(len: usize) -> usize {
    reports(MAX_WEBHOOK_ALERTS) + len + ONE_ALERT + SLACK
}

/// The bound on reading a Prometheus answer of `len` bytes: a sum per model
/// (a map entry, then a sorted list and the sort's buffer), the models' names
/// (at most the answer's own bytes, four times over for what the stat label
/// turns into `_`).
fn prometheus_bound(len: usize) -> usize {
    prometheus::MAX_SAMPLES * (64 + 3 * 32) + 4 * len + SLACK
}

/// A body of `head`, as many items as fit in `cap` bytes (the `i`th one
/// `item(i)`, comma-separated), and `tail`.
fn filled(head: &str, item: impl Fn(usize) -> String, tail: &str, cap: usize) -> Vec<u8> {
    let mut body = head.to_string();
    for i in 0.. {
        let next = item(i);
        if body.len() + next.len() + 1 + tail.len() > cap {
            break;
        }
        if i > 0 {
            body.push(',');
        }
        body.push_str(&next);
    }
    body.push_str(tail);
    body.into_bytes()
}

/// `item` every time.
fn each(item: &str) -> impl Fn(usize) -> String + '_ {
    move |_| item.to_string()
}

const VECTOR_HEAD: &str = r#"{"status":"success","data":{"resultType":"vector","result":["#;

fn alertmanager_peak(body: &[u8]) -> (usize, bool) {
    peak(|| alertmanager::parse(body, 0).is_ok())
}

fn prometheus_peak(body: &[u8]) -> (usize, bool) {
    peak(|| prometheus::parse(body, "model", &llm_filter_core::config::Names::default()).is_ok())
}

fn webhook_peak(body: &[u8]) -> (usize, bool) {
    peak(|| alerts::parse(body, 0).is_ok())
}

#[test]
fn a_body_of_small_items_at_the_cap_takes_little() {
    let cap = MAX_ANSWER_BYTES;
    let label = |i: usize| format!(r#""k{i}":"""#);
    let tiny_alert = r#"{"status":{"state":"active"},"fingerprint":"f"}"#;
    let sample = |i: usize| format!(r#"{{"metric":{{"model":"m{i}"}},"value":[0,"1"]}}"#);
    let am: [(&str, Vec<u8>); 7] = [
        ("zeros", filled("[", each("0"), "]", cap)),
        ("empty objects", filled("[", each("{}"), "]", cap)),
        (
            "alerts not in force",
            filled("[", each(r#"{"status":{}}"#), "]", cap),
        ),
        (
            "tiny alerts in force",
            filled("[", each(tiny_alert), "]", cap),
        ),
        (
            "one alert of many labels",
            filled(
                r#"[{"status":{"state":"active"},"labels":{"#,
                label,
                "}}]",
                cap,
            ),
        ),
        (
            "one alert of a long escaped label",
            filled(
                r#"[{"status":{"state":"active"},"labels":{"a":""#,
                each("\\n"),
                "\"}}]",
                cap,
            ),
        ),
        ("deep", "[".repeat(cap).into_bytes()),
    ];
    for (what, body) in &am {
        assert!(body.len() <= cap, "{what}");
        let (took, _) = alertmanager_peak(body);
        println!(
            "alertmanager, {what}: {} bytes read taking {took} bytes",
            body.len()
        );
        assert!(took <= alertmanager_bound(body.len()), "{what}: {took}");
    }
    // The measure can tell: a tree of the same answers takes many times it.
    for (what, body) in &am[..4] {
        let (tree, _) = peak(|| serde_json::from_slice::<serde_json::Value>(body).is_ok());
        println!("alertmanager, {what}, as a tree: {tree} bytes");
        assert!(tree > 4 * alertmanager_bound(body.len()), "{what}: {tree}");
    }
    let metric = r#"{"status":"success","data":{"resultType":"vector","result":[{"value":[0,"1"],"metric":{"#;
    let prom: [(&str, Vec<u8>); 6] = [
        ("zeros", filled(VECTOR_HEAD, each("0"), "]}}", cap)),
        (
            "samples of as many models",
            filled(VECTOR_HEAD, sample, "]}}", cap),
        ),
        (
            "unbelieved samples",
            filled(VECTOR_HEAD, each(r#"{"value":[0,"x"]}"#), "]}}", cap),
        ),
        (
            "one sample of many labels",
            filled(metric, label, "}}]}}", cap),
        ),
        (
            "a big data object",
            filled(
                r#"{"status":"success","data":{"x":["#,
                each("[]"),
                "]}}",
                cap,
            ),
        ),
        ("deep", "{\"a\":".repeat(cap / 5).into_bytes()),
    ];
    for (what, body) in &prom {
        assert!(body.len() <= cap, "{what}");
        let (took, _) = prometheus_peak(body);
        println!(
            "prometheus, {what}: {} bytes read taking {took} bytes",
            body.len()
        );
        assert!(took <= prometheus_bound(body.len()), "{what}: {took}");
    }
    let hook_cap = MAX_BODY_BYTES;
    let head = r#"{"version":"4","alerts":["#;
    let hooks: [(&str, Vec<u8>); 4] = [
        ("zeros", filled(head, each("0"), "]}", hook_cap)),
        (
            "resolved alerts",
            filled(head, each(r#"{"status":"resolved"}"#), "]}", hook_cap),
        ),
        (
            "firing alerts",
            filled(
                head,
                each(r#"{"status":"firing","fingerprint":"f"}"#),
                "]}",
                hook_cap,
            ),
        ),
        (
            "one alert of many labels",
            filled(
                r#"{"version":"4","alerts":[{"status":"firing","labels":{"#,
                label,
                "}}]}",
                hook_cap,
            ),
        ),
    ];
    for (what, body) in &hooks {
        let (took, _) = webhook_peak(body);
        println!(
            "webhook, {what}: {} bytes read taking {took} bytes",
            body.len()
        );
        assert!(took <= webhook_bound(body.len()), "{what}: {took}");
    }
}

/// Keys the readers look for, and a few they do not.
const KEYS: [&str; 16] = [
    "status",
    "labels",
    "fingerprint",
    "state",
    "silencedBy",
    "inhibitedBy",
    "metric",
    "value",
    "data",
    "result",
    "resultType",
    "version",
    "alerts",
    "model",
    "severity",
    "x",
];

/// Any small JSON value, its keys mostly ones the readers read.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("0".to_string()),
        Just("1e999".to_string()),
        prop::sample::select(vec![
            "active", "firing", "resolved", "success", "vector", "4", "", "m"
        ])
        .prop_map(|s| format!("\"{s}\"")),
        "[a-z\\\\\"]{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ];
    leaf.prop_recursive(5, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((prop::sample::select(KEYS.to_vec()), inner), 0..4).prop_map(
                |m| {
                    let members: Vec<String> =
                        m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", members.join(","))
                }
            ),
        ]
    })
}

/// A body up to the cap: an item repeated many times (the `i`th item's
/// strings numbered, so labels and models differ) inside one of the
/// readers' wrappers, or inside nothing.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let wrappers = vec![
        ("[", "]"),
        (VECTOR_HEAD, "]}}"),
        (r#"{"version":"4","alerts":["#, "]}"),
        (r#"[{"status":{"state":"active"},"labels":{"#, "}}]"),
        (
            r#"{"status":"success","data":{"resultType":"vector","result":[{"value":[0,"1"],"metric":{"#,
            "}}]}}",
        ),
        ("", ""),
    ];
    (
        prop::sample::select(wrappers),
        value(),
        0usize..MAX_ANSWER_BYTES,
        any::<bool>(),
    )
        .prop_map(|((head, tail), item, cap, member)| {
            let item = if member && head.ends_with('{') {
                format!("\"k{{}}\":{item}")
            } else {
                item
            };
            filled(
                head,
                |i| item.replace("{}", &i.to_string()),
                tail,
                cap.max(head.len() + tail.len()),
            )
        })
}

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any body within the cap, whatever it is made of, is read or refused
    /// by each reader taking no more than the reader's bound.
    #[test]
    fn any_body_within_the_cap_is_decided_within_the_bound(body in body()) {
        let (took, _) = alertmanager_peak(&body);
        prop_assert!(took <= alertmanager_bound(body.len()), "alertmanager took {}", took);
        let (took, _) = prometheus_peak(&body);
        prop_assert!(took <= prometheus_bound(body.len()), "prometheus took {}", took);
        if body.len() <= MAX_BODY_BYTES {
            let (took, _) = webhook_peak(&body);
            prop_assert!(took <= webhook_bound(body.len()), "webhook took {}", took);
        }
    }
}
