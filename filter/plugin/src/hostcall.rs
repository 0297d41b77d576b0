//! Every host call the filter makes, checked. The SDK's `hostcalls` panic on a
//! status they do not expect (and decode it into an enum that lacks most of
//! the ABI's codes), and a panic traps the VM with every request of its
//! worker. These call the ABI imports directly, read the status as a plain
//! number, parse what the host returns without trusting it, and turn a status
//! the SDK would have panicked on into an error that the caller fails open
//! on and that is counted as `llm_filter_internal_errors_total{reason="host_<call>"}`.
//!
//! Statuses the SDK returns as errors (a `NotFound` body, a CAS mismatch, an
//! unknown callout cluster) stay plain errors for the caller, as before.
//! The one call left to the SDK is `dispatch_http_call`: the SDK's dispatcher
//! must register the callout's token to route its answer back (it traps on
//! an answer it does not know), and only the SDK's own function registers it.
//!
//! The checked calls live here; the status codes in [`status`], the header-map
//! codec in `header_map`, the ABI imports in `abi` (a stand-in natively), and
//! a bench build's count of the crossings in `bench_census`.

use std::ptr::{null, null_mut};
use std::time::Duration;

use llm_filter_core::host::Metrics;
use llm_filter_core::metrics::{name, INTERNAL_ERRORS};
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};

mod abi;
#[cfg(feature = "hostcall-census")]
pub mod bench_census;
mod header_map;
pub mod status;
mod tally;
#[cfg(test)]
mod tests;

pub use header_map::{serialize_map, HeaderMap};
pub use status::Status;
use status::{BAD_ARGUMENT, CAS_MISMATCH, INTERNAL_FAILURE, MALFORMED, NOT_FOUND, OK};
use tally::Tally;

thread_local! {
    /// Host calls that failed with a status the SDK does not expect, until
    /// [`count_unexpected`] moves them into the stats.
    static UNEXPECTED: Tally = const { Tally::new() };
}

/// Runs one crossing into the host, which returns its status; a census
/// build times it for the [`check`] that follows.
#[inline(always)]
fn crossing(f: impl FnOnce() -> u32) -> u32 {
    #[cfg(feature = "hostcall-census")]
    return bench_census::crossing(f);
    #[cfg(not(feature = "hostcall-census"))]
    f()
}

/// `Ok` for [`OK`]; `Err(status)` otherwise, noting it when `status` is
/// neither OK nor one of the `expected` errors.
pub fn check(call: &'static str, status: u32, expected: &[u32]) -> Result<(), Status> {
    #[cfg(feature = "hostcall-census")]
    bench_census::count(call);
    if status == OK {
        return Ok(());
    }
    if !expected.contains(&status) {
        note(call);
    }
    Err(status)
}

fn note(call: &'static str) {
    UNEXPECTED.with(|u| u.add(call));
}

/// Moves the unexpected failures noted since the last time into
/// `llm_filter_internal_errors_total{reason="host_<call>"}`.
pub fn count_unexpected(m: &mut dyn Metrics) {
    for (call, n) in UNEXPECTED.with(Tally::take) {
        let reason = format!("host_{call}");
        m.counter(&name(INTERNAL_ERRORS, &[("reason", &reason)]), n);
    }
}

/// Bytes the host allocated (through the SDK's `proxy_on_memory_allocate`)
/// and handed over; `None` for a null pointer.
///
/// # Safety
/// `data` is null or was allocated by the module's allocator for `size` bytes.
unsafe fn take(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        None
    } else {
        // SAFETY: the host wrote `size` bytes into memory it asked this
        // module to allocate with exactly that capacity (the SDK does the same).
        Some(unsafe { Vec::from_raw_parts(data, size, size) })
    }
}

/// Writes a log line; a failure is only counted (there is nowhere else to say it).
pub fn log(level: LogLevel, message: &str) -> Result<(), Status> {
    // SAFETY: the pointer and length describe a live string.
    let s = unsafe { abi::proxy_log(level as u32, message.as_ptr(), message.len()) };
    check("log", s, &[])
}

/// Nanoseconds since the epoch by the host's clock.
pub fn current_time_ns() -> Result<u64, Status> {
    let mut t: u64 = 0;
    // SAFETY: `t` outlives the call.
    let s = unsafe { abi::proxy_get_current_time_nanoseconds(&mut t) };
    check("get_current_time", s, &[]).map(|()| t)
}

/// Asks for `on_tick` every `period` (0 stops it).
pub fn set_tick_period(period: Duration) -> Result<(), Status> {
    let ms = u32::try_from(period.as_millis()).unwrap_or(u32::MAX);
    // SAFETY: plain value.
    let s = unsafe { abi::proxy_set_tick_period_milliseconds(ms) };
    check("set_tick_period", s, &[])
}

/// Up to `max_size` bytes of a buffer from `start`; `None` when there is none.
pub fn get_buffer(
    buffer: BufferType,
    start: usize,
    max_size: usize,
) -> Result<Option<Vec<u8>>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the out-pointers outlive the call; what the host returns is
    // allocated by this module.
    let s = crossing(|| unsafe {
        abi::proxy_get_buffer_bytes(buffer as u32, start, max_size, &mut data, &mut size)
    });
    match check("get_buffer", s, &[NOT_FOUND]) {
        // SAFETY: see above.
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(NOT_FOUND) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces `size` bytes of a buffer from `start` with `value`.
pub fn set_buffer(
    buffer: BufferType,
    start: usize,
    size: usize,
    value: &[u8],
) -> Result<(), Status> {
    // SAFETY: the pointer and length describe a live slice.
    let s = crossing(|| unsafe {
        abi::proxy_set_buffer_bytes(buffer as u32, start, size, value.as_ptr(), value.len())
    });
    check("set_buffer", s, &[])
}

/// A header map as the host handed it over: one buffer, and where in it each
/// name and value lies. Reading it allocates nothing per header.
pub fn get_map(map: MapType) -> Result<HeaderMap, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: as in `get_buffer`.
    let s =
        crossing(|| unsafe { abi::proxy_get_header_map_pairs(map as u32, &mut data, &mut size) });
    check("get_map", s, &[])?;
    // SAFETY: as in `get_buffer`.
    let Some(bytes) = (unsafe { take(data, size) }) else {
        return Ok(HeaderMap::default());
    };
    HeaderMap::parse(bytes).ok_or_else(|| {
        note("get_map");
        MALFORMED
    })
}

/// One header's value; `None` when absent.
pub fn get_map_value(map: MapType, key: &str) -> Result<Option<Vec<u8>>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: as in `get_buffer`.
    let s = crossing(|| unsafe {
        abi::proxy_get_header_map_value(map as u32, key.as_ptr(), key.len(), &mut data, &mut size)
    });
    match check("get_map_value", s, &[NOT_FOUND]) {
        // SAFETY: as in `get_buffer`.
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(NOT_FOUND) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sets a header (replacing every value), or with `None` removes it.
pub fn set_map_value(map: MapType, key: &str, value: Option<&str>) -> Result<(), Status> {
    // SAFETY: the pointers and lengths describe live strings.
    let s = crossing(|| unsafe {
        match value {
            Some(v) => abi::proxy_replace_header_map_value(
                map as u32,
                key.as_ptr(),
                key.len(),
                v.as_ptr(),
                v.len(),
            ),
            None => abi::proxy_remove_header_map_value(map as u32, key.as_ptr(), key.len()),
        }
    });
    check("set_map_value", s, &[])
}

/// A property by path; `None` when the host has none.
pub fn get_property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let path = path.join("\0");
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: as in `get_buffer`.
    let s = crossing(|| unsafe {
        abi::proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size)
    });
    let expected = [NOT_FOUND, status::SERIALIZATION_FAILURE, INTERNAL_FAILURE];
    match check("get_property", s, &expected) {
        // SAFETY: as in `get_buffer`.
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(NOT_FOUND) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sets a property of the stream by path: Envoy keeps it as filter state
/// `wasm.<path>`, which its access loggers print.
pub fn set_property(path: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: both slices outlive the call, which copies them.
    let s = crossing(|| unsafe {
        abi::proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len())
    });
    check("set_property", s, &[])
}

/// A shared-data value and its CAS token (`None` for a token of 0); both
/// `None` for a key never written.
pub fn get_shared_data(key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
    let (mut data, mut size, mut cas) = (null_mut(), 0usize, 0u32);
    // SAFETY: as in `get_buffer`.
    let s = crossing(|| unsafe {
        abi::proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
    });
    match check("get_shared_data", s, &[NOT_FOUND]) {
        // SAFETY: as in `get_buffer`.
        Ok(()) => Ok((unsafe { take(data, size) }, Some(cas).filter(|c| *c != 0))),
        Err(NOT_FOUND) => Ok((None, None)),
        Err(e) => Err(e),
    }
}

/// Writes a shared-data value, conditionally on `cas` when given.
pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
    // SAFETY: the pointers and lengths describe live slices.
    let s = crossing(|| unsafe {
        abi::proxy_set_shared_data(
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            cas.unwrap_or(0),
        )
    });
    check("set_shared_data", s, &[CAS_MISMATCH])
}

/// Lets a paused request go on.
pub fn resume_http_request() -> Result<(), Status> {
    // SAFETY: plain value.
    let s = crossing(|| unsafe { abi::proxy_continue_stream(STREAM_HTTP_REQUEST) });
    check("resume_http_request", s, &[])
}

/// Lets a paused response go on.
pub fn resume_http_response() -> Result<(), Status> {
    // SAFETY: plain value.
    let s = crossing(|| unsafe { abi::proxy_continue_stream(STREAM_HTTP_RESPONSE) });
    check("resume_http_response", s, &[])
}

/// Resets the response: the client sees it end unfinished (an HTTP/1.1
/// connection closed before the body's end, an HTTP/2 stream reset).
#[cfg(feature = "guardrails")]
pub fn reset_http_response() -> Result<(), Status> {
    // SAFETY: plain value.
    let s = crossing(|| unsafe { abi::proxy_close_stream(STREAM_HTTP_RESPONSE) });
    check("reset_http_response", s, &[])
}

const STREAM_HTTP_REQUEST: u32 = 0;
const STREAM_HTTP_RESPONSE: u32 = 1;
/// `grpc_status` of a plain HTTP local reply.
const NO_GRPC_STATUS: i32 = -1;

/// Answers the stream locally.
pub fn send_http_response(
    status: u32,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(), Status> {
    let Some(headers) = serialize_map(headers) else {
        note("send_http_response");
        return Err(BAD_ARGUMENT);
    };
    // SAFETY: the pointers and lengths describe live slices.
    let s = crossing(|| unsafe {
        abi::proxy_send_local_response(
            status,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            NO_GRPC_STATUS,
        )
    });
    check("send_http_response", s, &[])
}

/// Sends an HTTP callout through the SDK, which registers its token for the
/// answer (see the module's note). The SDK panics on a status other than
/// OK, `BadArgument` and `InternalFailure`; Envoy's `http_call` returns no
/// other, except for memory it cannot read, which valid slices rule out.
pub fn dispatch_http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<u32, Status> {
    let mut token = 0;
    let s = crossing(|| {
        match proxy_wasm::hostcalls::dispatch_http_call(
            cluster,
            headers.to_vec(),
            body,
            vec![],
            timeout,
        ) {
            Ok(t) => {
                token = t;
                OK
            }
            Err(s) => s as u32,
        }
    });
    check("dispatch_http_call", s, &[BAD_ARGUMENT, INTERNAL_FAILURE]).map(|()| token)
}

/// Makes `context_id` the context later calls act on; `BadArgument` when it
/// is gone.
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    // SAFETY: plain value.
    let s = crossing(|| unsafe { abi::proxy_set_effective_context(context_id) });
    check("set_effective_context", s, &[BAD_ARGUMENT])
}

/// Calls a host extension by name.
pub fn call_foreign_function(
    function: &str,
    arguments: Option<&[u8]>,
) -> Result<Option<Vec<u8>>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    let (args, args_len) = arguments.map_or((null(), 0), |a| (a.as_ptr(), a.len()));
    // SAFETY: as in `get_buffer`.
    let s = crossing(|| unsafe {
        abi::proxy_call_foreign_function(
            function.as_ptr(),
            function.len(),
            args,
            args_len,
            &mut data,
            &mut size,
        )
    });
    let expected = [
        NOT_FOUND,
        BAD_ARGUMENT,
        status::SERIALIZATION_FAILURE,
        INTERNAL_FAILURE,
    ];
    check("call_foreign_function", s, &expected)?;
    // SAFETY: as in `get_buffer`.
    Ok(unsafe { take(data, size) })
}

/// Defines a stat, returning its id.
pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, Status> {
    let mut id: u32 = 0;
    // SAFETY: the pointer and length describe a live string; `id` outlives the call.
    let s = crossing(|| unsafe {
        abi::proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id)
    });
    check("define_metric", s, &[]).map(|()| id)
}

/// Adds `delta` to a counter or gauge.
pub fn increment_metric(id: u32, delta: i64) -> Result<(), Status> {
    // SAFETY: plain values.
    let s = crossing(|| unsafe { abi::proxy_increment_metric(id, delta) });
    check("increment_metric", s, &[NOT_FOUND, BAD_ARGUMENT])
}

/// Sets a gauge or records a histogram sample.
pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    // SAFETY: plain values.
    let s = crossing(|| unsafe { abi::proxy_record_metric(id, value) });
    check("record_metric", s, &[NOT_FOUND])
}
