//! The census's side of the key registry: how each family of the registry
//! ([`super`]) is counted and how many keys a configuration lets it hold.
//! It stands apart from the names so that the owners, which build their keys
//! from the registry, and the census, which reads their configuration and
//! totals, depend one way: the owners on the names, the census on the owners.

use super::{
    limits_prefix, Family, ALERTMANAGER_LEASE, ALERTS, BREAKER, CACHE_INFLIGHT, CACHE_LAYOUT,
    CACHE_SLOT, CACHE_STATS, CALIBRATION, HEALTH, HEDGE, LIMITS, LOAD_CLUSTER, LOAD_INDEX,
    LOAD_MODEL, MESH, PROBE_LEASE, PROMETHEUS_LEASE, RESPONSE, SEMANTIC_GROUP, SEMANTIC_STATS,
};
use crate::budget::{breaker, DEFAULT_BREAKER};
use crate::cache::{semantic, Store, PREPARE_MAX_SLOTS};
use crate::config::Config;
use crate::host::footprint::{Footprint, Owner, Plan, Read};
use crate::host::{Metrics, SharedStore};
use crate::load;
use crate::metrics;
use crate::routing::stateful;

/// How the census counts a family.
#[derive(Debug, Clone, Copy)]
pub enum Counted {
    /// The family's one key is read, when the configuration can write it.
    One(fn(&Config) -> bool),
    /// Every key the configuration can make the filter write is read.
    Read(fn(&Config) -> Vec<Read>),
    /// The owner counts its keys from what it keeps (totals, an index):
    /// `bound` keys at most, `count` at the end of each count.
    Owner {
        /// The most keys.
        bound: fn(&Config) -> u64,
        /// Keys and bytes present; `None` when the family is off.
        count: Owner<Config>,
    },
    /// Counted, and bounded, with the family of that key.
    With(&'static str),
}

impl Counted {
    /// Who counts, in the docs' words.
    pub fn who(&self) -> &'static str {
        match self {
            Counted::One(_) | Counted::Read(_) => "read",
            Counted::Owner { .. } => "its owner's totals",
            Counted::With(_) => "with the family above",
        }
    }

    /// The most keys `config` lets the family hold.
    pub fn max_keys(&self, config: &Config) -> u64 {
        match *self {
            Counted::One(on) => u64::from(on(config)),
            Counted::Read(reads) => reads(config).iter().fold(0u64, |n, r| {
                n.saturating_add(match r {
                    Read::Key(_) => 1,
                    Read::Slots { count, .. } => u64::from(*count),
                })
            }),
            Counted::Owner { bound, .. } => bound(config),
            Counted::With(_) => 0,
        }
    }
}

/// How the census counts each family, in the registry's order.
pub const COUNTED: [(&Family, Counted); 20] = [
    (
        &CACHE_SLOT,
        Counted::Owner {
            bound: cache_slots,
            count: count_cache_slots,
        },
    ),
    (&CACHE_INFLIGHT, Counted::Read(read_markers)),
    (&CACHE_STATS, Counted::One(always)),
    (&CACHE_LAYOUT, Counted::One(always)),
    (
        &SEMANTIC_GROUP,
        Counted::Owner {
            bound: semantic_groups,
            count: count_semantic_groups,
        },
    ),
    (&SEMANTIC_STATS, Counted::One(semantic_on)),
    (&PROBE_LEASE, Counted::One(always)),
    (&HEALTH, Counted::Read(read_health)),
    (&BREAKER, Counted::Read(read_breakers)),
    (&HEDGE, Counted::Read(read_hedges)),
    (&RESPONSE, Counted::Read(read_responses)),
    (
        &LOAD_MODEL,
        Counted::Owner {
            bound: load_records,
            count: count_load_records,
        },
    ),
    (&LOAD_CLUSTER, Counted::With(LOAD_MODEL.key)),
    (&LOAD_INDEX, Counted::With(LOAD_MODEL.key)),
    (&ALERTS, Counted::One(always)),
    (&MESH, Counted::One(prometheus_on)),
    (&ALERTMANAGER_LEASE, Counted::One(alertmanager_on)),
    (&PROMETHEUS_LEASE, Counted::One(prometheus_on)),
    (&CALIBRATION, Counted::One(always)),
    (&LIMITS, Counted::Read(read_limits)),
];

/// How the census counts `family`; `None` for a family the registry does
/// not name.
pub fn counted(family: &Family) -> Option<Counted> {
    COUNTED
        .iter()
        .find(|(f, _)| f.key == family.key)
        .map(|(_, c)| *c)
}

/// What the census counts for `config`: the keys of the families it reads,
/// and the owners of the others.
pub fn plan(config: &Config) -> Plan<Config> {
    let mut plan = Plan::default();
    for (family, counted) in &COUNTED {
        match *counted {
            Counted::One(on) => {
                if on(config) {
                    plan.reads.push(Read::Key(family.key.to_string()));
                }
            }
            Counted::Read(reads) => plan.reads.extend(reads(config)),
            Counted::Owner { count, .. } => plan.owners.push(count),
            Counted::With(_) => {}
        }
    }
    plan
}

/// The most keys `config` lets the filter hold in shared data: the bound the
/// gauge `llm_filter_shared_data_keys` stays under.
pub fn max_keys(config: &Config) -> u64 {
    COUNTED
        .iter()
        .fold(0u64, |n, (_, c)| n.saturating_add(c.max_keys(config)))
}

/// Sets the footprint's gauges; every worker sets the same ones from the
/// same data.
pub fn publish(footprint: &Footprint, m: &mut dyn Metrics) {
    m.gauge(
        metrics::SHARED_DATA_KEYS,
        i64::try_from(footprint.keys).unwrap_or(i64::MAX),
    );
    m.gauge(
        metrics::SHARED_DATA_BYTES,
        i64::try_from(footprint.bytes).unwrap_or(i64::MAX),
    );
}

// ------------------------------------------------ the bounds, by family

fn always(_: &Config) -> bool {
    true
}

fn read_markers(config: &Config) -> Vec<Read> {
    vec![Read::Slots {
        prefix: CACHE_INFLIGHT.key.to_string(),
        count: cache_slots_u32(config),
    }]
}

fn cache_slots_u32(config: &Config) -> u32 {
    if config.cache.keeps_entries() {
        config.cache.max_entries
    } else {
        0
    }
}

fn cache_slots(config: &Config) -> u64 {
    u64::from(cache_slots_u32(config))
}

/// The cache slots, from the cache's totals: not read, their values may be
/// large. Their count is the table size when the table was created at start
/// (up to [`PREPARE_MAX_SLOTS`]), else the occupied slots.
fn count_cache_slots(store: &dyn SharedStore, config: &Config) -> Option<Footprint> {
    let cfg = &config.cache;
    if !cfg.keeps_entries() {
        return None;
    }
    let totals = Store::new(store, cfg).totals().unwrap_or_default();
    let keys = if cfg.max_entries <= PREPARE_MAX_SLOTS {
        u64::from(cfg.max_entries)
    } else {
        totals.entries
    };
    Some(Footprint {
        keys,
        bytes: totals.bytes,
    })
}

/// The semantic index is configured (and with it its keys).
fn semantic_on(config: &Config) -> bool {
    config.cache.keeps_entries() && config.cache.semantic.is_some()
}

fn semantic_groups(config: &Config) -> u64 {
    match &config.cache.semantic {
        Some(sem) if semantic_on(config) => u64::from(sem.max_contexts),
        _ => 0,
    }
}

/// The index's group slots, all created at start, from its own totals.
fn count_semantic_groups(store: &dyn SharedStore, config: &Config) -> Option<Footprint> {
    let sem = config
        .cache
        .semantic
        .as_ref()
        .filter(|_| semantic_on(config))?;
    let totals = semantic::Index::new(store, sem)
        .totals()
        .unwrap_or_default();
    Some(Footprint {
        keys: u64::from(sem.max_contexts),
        bytes: totals.bytes,
    })
}

fn read_health(config: &Config) -> Vec<Read> {
    config
        .routing
        .clusters
        .iter()
        .map(|c| Read::Key(HEALTH.at(&c.cluster)))
        .collect()
}

fn read_breakers(config: &Config) -> Vec<Read> {
    let mut keys: Vec<String> = config
        .routing
        .clusters
        .iter()
        .map(|c| breaker::key(&c.cluster))
        .collect();
    keys.push(breaker::key(DEFAULT_BREAKER));
    crate::config::names::sorted(keys)
        .into_iter()
        .map(Read::Key)
        .collect()
}

fn read_hedges(config: &Config) -> Vec<Read> {
    if config.routing.hedge.is_none() {
        return Vec::new();
    }
    config
        .routing
        .models
        .keys()
        .map(|m| Read::Key(HEDGE.at(m)))
        .collect()
}

/// Routed Responses answers fill the table of the backends holding them.
fn read_responses(config: &Config) -> Vec<Read> {
    if config.routing.models.is_empty() {
        return Vec::new();
    }
    vec![Read::Slots {
        prefix: RESPONSE.key.to_string(),
        count: stateful::SLOTS,
    }]
}

fn load_records(config: &Config) -> u64 {
    load::max_keys(&config.names)
}

/// The load records, read at the end of a count through their index.
fn count_load_records(store: &dyn SharedStore, _: &Config) -> Option<Footprint> {
    let (keys, bytes) = load::footprint(store);
    Some(Footprint { keys, bytes })
}

fn alertmanager_on(config: &Config) -> bool {
    config.degrade.alertmanager.is_some()
}

fn prometheus_on(config: &Config) -> bool {
    config.degrade.prometheus.is_some()
}

/// Every record of every rule: a rule keeps `limits.max_keys` of them.
fn read_limits(config: &Config) -> Vec<Read> {
    let count = u32::try_from(config.limits.max_keys).unwrap_or(u32::MAX);
    config
        .limits
        .rules
        .iter()
        .map(|r| Read::Slots {
            prefix: limits_prefix(&r.name),
            count,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::FAMILIES;

    #[test]
    fn every_family_is_counted_once_in_the_registrys_order() {
        let counted: Vec<&str> = COUNTED.iter().map(|(f, _)| f.key).collect();
        let named: Vec<&str> = FAMILIES.iter().map(|f| f.key).collect();
        assert_eq!(counted, named);
    }
}
