//! The host adapter: Envoy's shared data, clock, randomness and stats behind
//! the core's traits, using the `hostcalls` that return errors instead of the
//! `Context` helpers that unwrap.

use std::collections::HashMap;
use std::time::UNIX_EPOCH;

use llm_filter_core::host::{Metrics, SharedStore, StoreError, Versioned};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{MapType, MetricType, Status};

/// Milliseconds since the epoch by Envoy's clock (0 if the host cannot tell).
pub fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// 64 bits from the host's entropy (WASI `random_get`), to seed a generator.
pub fn entropy() -> u64 {
    let mut buf = [0u8; 8];
    match getrandom::getrandom(&mut buf) {
        Ok(()) => u64::from_le_bytes(buf),
        // Still distinct per VM and start: better than a constant.
        Err(_) => now_ms() ^ 0x9E37_79B9_7F4A_7C15,
    }
}

/// One header as text; header values that are not UTF-8 are read lossily
/// (the SDK's string getter would panic on them).
pub fn header(map: MapType, name: &str) -> Option<String> {
    match hostcalls::get_map_value_bytes(map, name) {
        Ok(Some(v)) => Some(String::from_utf8_lossy(&v).into_owned()),
        _ => None,
    }
}

/// Every header of a map, in order, values read lossily.
pub fn headers(map: MapType) -> Vec<(String, String)> {
    hostcalls::get_map_bytes(map)
        .map(|pairs| {
            pairs
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Sets (or with `None` removes) a header; reports whether the host accepted it.
pub fn set_header(map: MapType, name: &str, value: Option<&str>) -> bool {
    hostcalls::set_map_value(map, name, value).is_ok()
}

/// Envoy shared data.
#[derive(Debug, Default, Clone, Copy)]
pub struct EnvoyStore;

impl SharedStore for EnvoyStore {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        match hostcalls::get_shared_data(key) {
            Ok((value, cas)) => Ok(Versioned { value, cas }),
            Err(_) => Err(StoreError::Host),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(_) => Err(StoreError::Host),
        }
    }
}

/// Envoy stats, defined on first use and remembered by name.
#[derive(Debug, Default)]
pub struct EnvoyMetrics {
    ids: HashMap<String, Option<u32>>,
}

impl EnvoyMetrics {
    fn id(&mut self, kind: MetricType, name: &str) -> Option<u32> {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = hostcalls::define_metric(kind, name).ok();
        if id.is_none() {
            log::warn!("cannot define metric {name}");
        }
        self.ids.insert(name.to_string(), id);
        id
    }
}

impl Metrics for EnvoyMetrics {
    fn counter(&mut self, name: &str, delta: u64) {
        if let Some(id) = self.id(MetricType::Counter, name) {
            let _ = hostcalls::increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn gauge(&mut self, name: &str, value: i64) {
        if let Some(id) = self.id(MetricType::Gauge, name) {
            let _ = hostcalls::record_metric(id, u64::try_from(value).unwrap_or(0));
        }
    }

    fn gauge_add(&mut self, name: &str, delta: i64) {
        if let Some(id) = self.id(MetricType::Gauge, name) {
            let _ = hostcalls::increment_metric(id, delta);
        }
    }

    fn histogram(&mut self, name: &str, value: u64) {
        if let Some(id) = self.id(MetricType::Histogram, name) {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}
