//! The filter's own footprint in shared data, counted. Shared data never
//! evicts, so every key family is bounded by configuration; this lists the
//! families in one place and counts their keys and bytes at a low rate, a
//! few keys per timer tick, for the `llm_filter_shared_data_keys` and
//! `llm_filter_shared_data_bytes` gauges.
//!
//! The load records are read at the end of a count, through their index.
//! Every other key is read except the cache slots and the semantic index's
//! group slots, whose values may be large: their bytes come from each one's
//! own totals, and their count is the table size when the table was created
//! at start (up to [`PREPARE_MAX_SLOTS`] for the cache, always for the
//! index), else the occupied slots.

use super::{Metrics, SharedStore};
use crate::budget::{breaker, DEFAULT_BREAKER};
use crate::cache::store::{marker_key, LAYOUT_KEY, STATS_KEY};
use crate::cache::{semantic, Store, PREPARE_MAX_SLOTS};
use crate::config::Config;
use crate::degrade::{alerts, sources};
use crate::load;
use crate::metrics;
use crate::routing::{health, hedge, probe, stateful};
use crate::tokens;

/// Keys read per [`Census::step`]: one timer tick's share of the work.
pub const KEYS_PER_STEP: u32 = 64;
/// Least time between the starts of two counts.
pub const INTERVAL_MS: u64 = 10_000;

/// The keys of the families that are read, in order: the small ones by name,
/// then the cache's in-flight markers by slot, then the table of Responses
/// ids by slot.
#[derive(Debug, Clone, Default)]
struct Keys {
    named: Vec<String>,
    markers: u32,
    responses: u32,
}

impl Keys {
    fn len(&self) -> u32 {
        u32::try_from(self.named.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.markers)
            .saturating_add(self.responses)
    }

    fn get(&self, i: u32) -> Option<String> {
        let named = u32::try_from(self.named.len()).unwrap_or(u32::MAX);
        if i < named {
            return self.named.get(usize::try_from(i).ok()?).cloned();
        }
        let i = i - named;
        if i < self.markers {
            Some(marker_key(i))
        } else {
            Some(stateful::slot_key(i - self.markers))
        }
    }
}

/// Every key a configuration can make the filter write, but the cache slots
/// and the load records: the cache totals, layout and in-flight markers, the
/// probe lease, the active alerts, the prompt estimate's calibration, the degrade sources' leases and the
/// mesh-wide load readings, each routed
/// cluster's health and budget breaker (and the breaker of unrouted calls),
/// each routed model's hedge window, the table of Responses ids.
fn keys(config: &Config) -> Keys {
    let mut named = vec![
        STATS_KEY.to_string(),
        LAYOUT_KEY.to_string(),
        probe::LEASE_KEY.to_string(),
        alerts::KEY.to_string(),
        tokens::calibration::KEY.to_string(),
    ];
    if config.degrade.alertmanager.is_some() {
        named.push(sources::ALERTMANAGER_LEASE_KEY.to_string());
    }
    if config.degrade.prometheus.is_some() {
        named.push(sources::PROMETHEUS_LEASE_KEY.to_string());
        named.push(sources::mesh::KEY.to_string());
    }
    if semantic_on(config) {
        named.push(semantic::store::STATS_KEY.to_string());
    }
    for c in &config.routing.clusters {
        named.push(health::key(&c.cluster));
        named.push(breaker::key(&c.cluster));
    }
    named.push(breaker::key(DEFAULT_BREAKER));
    if config.routing.hedge.is_some() {
        for model in config.routing.models.keys() {
            named.push(format!("{}{model}", hedge::KEY_PREFIX));
        }
    }
    named.sort();
    named.dedup();
    let markers = if config.cache.keeps_entries() {
        config.cache.max_entries
    } else {
        0
    };
    // Routed Responses answers fill the table of the backends holding them.
    let responses = if config.routing.models.is_empty() {
        0
    } else {
        stateful::SLOTS
    };
    Keys {
        named,
        markers,
        responses,
    }
}

/// Keys and bytes counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Keys present.
    pub keys: u64,
    /// Bytes of their values (keys themselves not included).
    pub bytes: u64,
}

impl Footprint {
    /// Sets the gauges; every worker sets the same ones from the same data.
    pub fn set_gauges(&self, m: &mut dyn Metrics) {
        m.gauge(
            metrics::SHARED_DATA_KEYS,
            i64::try_from(self.keys).unwrap_or(i64::MAX),
        );
        m.gauge(
            metrics::SHARED_DATA_BYTES,
            i64::try_from(self.bytes).unwrap_or(i64::MAX),
        );
    }
}

/// A count in progress, a few keys at a time.
#[derive(Debug, Clone, Default)]
pub struct Census {
    keys: Keys,
    next: u32,
    counted: Footprint,
    started_ms: Option<u64>,
}

impl Census {
    /// A census of what `config` can write.
    pub fn new(config: &Config) -> Self {
        Self {
            keys: keys(config),
            ..Self::default()
        }
    }

    /// Reads up to `budget` keys; returns the footprint when a count ends.
    /// A new count starts [`INTERVAL_MS`] after the last one started.
    pub fn step<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        config: &Config,
        now_ms: u64,
        budget: u32,
    ) -> Option<Footprint> {
        match self.started_ms {
            Some(at) if self.next == 0 && now_ms.saturating_sub(at) < INTERVAL_MS => return None,
            Some(_) if self.next > 0 => {}
            _ => {
                self.started_ms = Some(now_ms);
                self.counted = Footprint::default();
            }
        }
        let end = self.next.saturating_add(budget).min(self.keys.len());
        for i in self.next..end {
            let value = self
                .keys
                .get(i)
                .and_then(|k| store.get(&k).ok())
                .and_then(|v| v.value);
            if let Some(v) = value {
                self.counted.keys += 1;
                self.counted.bytes += v.len() as u64;
            }
        }
        self.next = end;
        if end < self.keys.len() {
            return None;
        }
        self.next = 0;
        let slots = slots(store, config);
        let (load_keys, load_bytes) = load::footprint(store);
        Some(Footprint {
            keys: self.counted.keys + slots.keys + load_keys,
            bytes: self.counted.bytes + slots.bytes + load_bytes,
        })
    }
}

/// The cache slots, from the cache's totals (see the module's note), and
/// the semantic index's group slots, all created at start, from its own.
fn slots<S: SharedStore + ?Sized>(store: &S, config: &Config) -> Footprint {
    let cfg = &config.cache;
    if !cfg.keeps_entries() {
        return Footprint::default();
    }
    let totals = Store::new(store, cfg).totals().unwrap_or_default();
    let keys = if cfg.max_entries <= PREPARE_MAX_SLOTS {
        u64::from(cfg.max_entries)
    } else {
        totals.entries
    };
    let mut out = Footprint {
        keys,
        bytes: totals.bytes,
    };
    if let Some(sem) = cfg.semantic.as_ref().filter(|_| semantic_on(config)) {
        let totals = semantic::Index::new(store, sem)
            .totals()
            .unwrap_or_default();
        out.keys += u64::from(sem.max_contexts);
        out.bytes += totals.bytes;
    }
    out
}

/// The semantic index is configured (and with it its keys).
fn semantic_on(config: &Config) -> bool {
    config.cache.keeps_entries() && config.cache.semantic.is_some()
}

/// The most keys `config` lets the filter hold in shared data: the bound the
/// gauge `llm_filter_shared_data_keys` stays under.
pub fn max_keys(config: &Config) -> u64 {
    let mut slots = if config.cache.keeps_entries() {
        u64::from(config.cache.max_entries)
    } else {
        0
    };
    if let Some(sem) = config
        .cache
        .semantic
        .as_ref()
        .filter(|_| semantic_on(config))
    {
        slots += u64::from(sem.max_contexts);
    }
    u64::from(keys(config).len()) + slots + load::max_keys(&config.names)
}

#[cfg(test)]
mod tests;
