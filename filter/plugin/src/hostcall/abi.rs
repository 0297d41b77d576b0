//! The ABI imports the checked calls make, with the status as a plain `u32`
//! (the SDK's `Status` enum lacks most codes, and reading an unknown one into
//! it is undefined); natively, a stand-in that answers what a test chose.

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "env")]
extern "C" {
    pub fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    pub fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    pub fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    pub fn proxy_set_buffer_bytes(
        buffer: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    pub fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    pub fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    pub fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    pub fn proxy_remove_header_map_value(map: u32, key: *const u8, key_size: usize) -> u32;
    pub fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    pub fn proxy_set_property(
        path: *const u8,
        path_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    pub fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    pub fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    pub fn proxy_continue_stream(stream: u32) -> u32;
    #[cfg(feature = "guardrails")]
    pub fn proxy_close_stream(stream: u32) -> u32;
    #[allow(clippy::too_many_arguments)]
    pub fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    pub fn proxy_set_effective_context(context_id: u32) -> u32;
    pub fn proxy_call_foreign_function(
        name: *const u8,
        name_size: usize,
        args: *const u8,
        args_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    pub fn proxy_define_metric(kind: u32, name: *const u8, size: usize, id: *mut u32) -> u32;
    pub fn proxy_record_metric(id: u32, value: u64) -> u32;
    pub fn proxy_increment_metric(id: u32, delta: i64) -> u32;
}

/// A stand-in host for native builds and tests: every import answers the
/// status a test chose and returns no data.
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
mod stand_in {
    use std::cell::Cell;

    thread_local! {
        static STATUS: Cell<u32> = const { Cell::new(crate::hostcall::status::INTERNAL_FAILURE) };
    }

    /// Makes every import answer `status`.
    #[cfg(test)]
    pub fn answer(status: u32) {
        STATUS.with(|s| s.set(status));
    }

    fn status() -> u32 {
        STATUS.with(Cell::get)
    }

    pub unsafe fn proxy_log(_: u32, _: *const u8, _: usize) -> u32 {
        status()
    }
    pub unsafe fn proxy_get_current_time_nanoseconds(_: *mut u64) -> u32 {
        status()
    }
    pub unsafe fn proxy_set_tick_period_milliseconds(_: u32) -> u32 {
        status()
    }
    pub unsafe fn proxy_get_buffer_bytes(
        _: u32,
        _: usize,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_set_buffer_bytes(
        _: u32,
        _: usize,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_get_header_map_pairs(_: u32, _: *mut *mut u8, _: *mut usize) -> u32 {
        status()
    }
    pub unsafe fn proxy_get_header_map_value(
        _: u32,
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_replace_header_map_value(
        _: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_remove_header_map_value(_: u32, _: *const u8, _: usize) -> u32 {
        status()
    }
    pub unsafe fn proxy_get_property(
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_get_shared_data(
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
        _: *mut u32,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_set_shared_data(
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: u32,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_set_property(_: *const u8, _: usize, _: *const u8, _: usize) -> u32 {
        status()
    }
    pub unsafe fn proxy_continue_stream(_: u32) -> u32 {
        status()
    }
    #[cfg(feature = "guardrails")]
    pub unsafe fn proxy_close_stream(_: u32) -> u32 {
        status()
    }
    pub unsafe fn proxy_send_local_response(
        _: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: i32,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_set_effective_context(_: u32) -> u32 {
        status()
    }
    pub unsafe fn proxy_call_foreign_function(
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        status()
    }
    pub unsafe fn proxy_define_metric(_: u32, _: *const u8, _: usize, _: *mut u32) -> u32 {
        status()
    }
    pub unsafe fn proxy_record_metric(_: u32, _: u64) -> u32 {
        status()
    }
    pub unsafe fn proxy_increment_metric(_: u32, _: i64) -> u32 {
        status()
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use stand_in::*;
