//! The host adapter: Envoy's shared data, clock, randomness and stats behind
//! the core's traits, through the checked calls of [`crate::hostcall`].

use std::collections::HashMap;

use llm_filter_core::host::{Metrics, SharedStore, StoreError, Versioned};
use proxy_wasm::types::{MapType, MetricType};

use crate::hostcall::{self, status::CAS_MISMATCH};

/// Milliseconds since the epoch by Envoy's clock (0 if the host cannot tell).
pub fn now_ms() -> u64 {
    hostcall::current_time_ns().map_or(0, |ns| ns / 1_000_000)
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
    match hostcall::get_map_value(map, name) {
        Ok(Some(v)) => Some(String::from_utf8_lossy(&v).into_owned()),
        _ => None,
    }
}

/// Every header of a map, in order, values read lossily.
pub fn headers(map: MapType) -> Vec<(String, String)> {
    hostcall::get_map(map)
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
    hostcall::set_map_value(map, name, value).is_ok()
}

/// Envoy shared data.
#[derive(Debug, Default, Clone, Copy)]
pub struct EnvoyStore;

impl SharedStore for EnvoyStore {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        match hostcall::get_shared_data(key) {
            Ok((value, cas)) => Ok(Versioned { value, cas }),
            Err(_) => Err(StoreError::Host),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcall::set_shared_data(key, value, cas) {
            Ok(()) => Ok(()),
            Err(CAS_MISMATCH) => Err(StoreError::CasMismatch),
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
        let id = hostcall::define_metric(kind, name).ok();
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
            let _ = hostcall::increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn gauge(&mut self, name: &str, value: i64) {
        if let Some(id) = self.id(MetricType::Gauge, name) {
            let _ = hostcall::record_metric(id, u64::try_from(value).unwrap_or(0));
        }
    }

    fn gauge_add(&mut self, name: &str, delta: i64) {
        if let Some(id) = self.id(MetricType::Gauge, name) {
            let _ = hostcall::increment_metric(id, delta);
        }
    }

    fn histogram(&mut self, name: &str, value: u64) {
        if let Some(id) = self.id(MetricType::Histogram, name) {
            let _ = hostcall::record_metric(id, value);
        }
    }
}
