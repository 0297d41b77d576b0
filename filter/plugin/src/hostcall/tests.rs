use std::time::Duration;

use llm_filter_core::host::MemoryMetrics;
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};

use super::status::*;
use super::*;

fn parse_map(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    HeaderMap::parse(bytes.to_vec()).map(|m| {
        m.iter()
            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.to_vec()))
            .collect()
    })
}

/// Every status of the ABI, and codes no version defines.
const STATUSES: [u32; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 999, u32::MAX];

/// Every checked call once, as (name, status it failed with, if it did).
fn every_call() -> Vec<(&'static str, Option<u32>)> {
    let map = MapType::HttpRequestHeaders;
    vec![
        ("log", log(LogLevel::Info, "x").err()),
        ("get_current_time", current_time_ns().err()),
        (
            "set_tick_period",
            set_tick_period(Duration::from_millis(25)).err(),
        ),
        (
            "get_buffer",
            get_buffer(BufferType::HttpRequestBody, 0, 10).err(),
        ),
        (
            "set_buffer",
            set_buffer(BufferType::HttpRequestBody, 0, 1, b"x").err(),
        ),
        ("get_map", get_map(map).err()),
        ("get_map_value", get_map_value(map, "a").err()),
        ("set_map_value", set_map_value(map, "a", Some("b")).err()),
        ("set_map_value", set_map_value(map, "a", None).err()),
        ("get_property", get_property(&["response", "code"]).err()),
        ("set_property", set_property("llm_filter.call", b"{}").err()),
        ("get_shared_data", get_shared_data("k").err()),
        ("set_shared_data", set_shared_data("k", b"v", Some(3)).err()),
        ("resume_http_request", resume_http_request().err()),
        ("resume_http_response", resume_http_response().err()),
        (
            "send_http_response",
            send_http_response(503, &[("a", "b")], b"{}").err(),
        ),
        ("set_effective_context", set_effective_context(7).err()),
        (
            "call_foreign_function",
            call_foreign_function("clear_route_cache", None).err(),
        ),
        (
            "define_metric",
            define_metric(MetricType::Counter, "m").err(),
        ),
        ("increment_metric", increment_metric(1, 1).err()),
        ("record_metric", record_metric(1, 1).err()),
    ]
}

/// The statuses the SDK returns as errors instead of panicking on, by call;
/// `NOT_FOUND` of the getters reads as "nothing", not as an error.
fn sdk_expected(call: &str) -> &'static [u32] {
    match call {
        "get_buffer" | "get_map_value" | "get_shared_data" => &[NOT_FOUND],
        "get_property" => &[NOT_FOUND, SERIALIZATION_FAILURE, INTERNAL_FAILURE],
        "set_shared_data" => &[CAS_MISMATCH],
        "set_effective_context" => &[BAD_ARGUMENT],
        "call_foreign_function" => &[
            NOT_FOUND,
            BAD_ARGUMENT,
            SERIALIZATION_FAILURE,
            INTERNAL_FAILURE,
        ],
        "increment_metric" => &[NOT_FOUND, BAD_ARGUMENT],
        "record_metric" => &[NOT_FOUND],
        _ => &[],
    }
}

fn noted() -> MemoryMetrics {
    let mut m = MemoryMetrics::default();
    count_unexpected(&mut m);
    m
}

fn counted(m: &MemoryMetrics, call: &str) -> u64 {
    let name = format!("llm_filter_internal_errors_totalreason=.=host_{call};.;");
    m.counters.get(&name).copied().unwrap_or(0)
}

#[test]
fn no_status_panics_and_only_those_the_sdk_would_panic_on_are_counted() {
    for status in STATUSES {
        abi::answer(status);
        let _ = noted();
        let calls = every_call();
        let m = noted();
        for (call, err) in &calls {
            let getter = [
                "get_buffer",
                "get_map_value",
                "get_shared_data",
                "get_property",
            ];
            let nothing = status == NOT_FOUND && getter.contains(call);
            if status == OK || nothing {
                assert_eq!(*err, None, "{call} with status {status}");
            } else {
                assert_eq!(*err, Some(status), "{call} with status {status}");
            }
        }
        for (call, _) in &calls {
            let times = calls.iter().filter(|(c, _)| c == call).count() as u64;
            let unexpected = status != OK && !sdk_expected(call).contains(&status);
            let want = if unexpected { times } else { 0 };
            assert_eq!(counted(&m, call), want, "{call} with status {status}");
        }
    }
}

#[test]
fn counted_errors_are_handed_over_once() {
    abi::answer(12);
    let _ = noted();
    let _ = resume_http_request();
    let _ = resume_http_request();
    assert_eq!(counted(&noted(), "resume_http_request"), 2);
    assert_eq!(counted(&noted(), "resume_http_request"), 0);
}

#[test]
fn ok_without_data_is_nothing() {
    abi::answer(OK);
    assert_eq!(get_buffer(BufferType::HttpRequestBody, 0, 10), Ok(None));
    assert_eq!(
        get_map(MapType::HttpRequestHeaders),
        Ok(HeaderMap::default())
    );
    assert_eq!(get_shared_data("k"), Ok((None, None)));
    assert_eq!(get_property(&["a"]), Ok(None));
}

#[test]
fn maps_round_trip() {
    let pairs = [(":status", "200"), ("x-empty", ""), ("", "v"), ("k", "é")];
    let bytes = serialize_map(&pairs).unwrap();
    let back = parse_map(&bytes).unwrap();
    let want: Vec<(String, Vec<u8>)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    assert_eq!(back, want);
    assert_eq!(parse_map(&serialize_map(&[]).unwrap()), Some(Vec::new()));
    assert_eq!(parse_map(b""), Some(Vec::new()));
}

#[test]
fn malformed_maps_are_refused_not_trusted() {
    let good = serialize_map(&[("name", "value"), ("a", "b")]).unwrap();
    // Every truncation is refused.
    for cut in 1..good.len() - 1 {
        assert_eq!(parse_map(&good[..cut]), None, "cut at {cut}");
    }
    // A count far beyond the bytes, lengths past the end, lengths that overflow.
    assert_eq!(parse_map(&u32::MAX.to_le_bytes()), None);
    let mut long = good.clone();
    long[4..8].copy_from_slice(&1000u32.to_le_bytes());
    assert_eq!(parse_map(&long), None);
    let mut huge = good.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(parse_map(&huge), None);
    assert_eq!(parse_map(&[1, 0]), None);
}

#[test]
fn names_that_are_not_utf8_are_read_lossily() {
    let mut bytes = serialize_map(&[("ab", "v")]).unwrap();
    let at = 4 + 8;
    bytes[at] = 0xff;
    let pairs = parse_map(&bytes).unwrap();
    assert_eq!(pairs[0].0, "\u{fffd}b");
}
