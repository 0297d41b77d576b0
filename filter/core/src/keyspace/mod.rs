//! Every family of keys the filter writes in shared data, named once: its
//! key (with the version of its encoding), how many keys a configuration
//! lets it hold, and who counts them. Shared data never evicts and is shared
//! by every plugin on a proxy, so a key nobody bounds or counts is a leak; the
//! owners build their keys from here, the census counts what [`plan`] lists,
//! and the scenario tests' store notes a key no family names ([`is_named`]).
//!
//! Every key is `llm_filter.<area>.v<version>.<name>`: the version moves when
//! a family's encoding does, so the workers of two filter versions (during a
//! configuration update) never read each other's bytes; a family left behind
//! by an older version stays in shared data, unread and uncounted, until the
//! proxy restarts (docs/design.md lists what changed).

use crate::budget::{breaker, DEFAULT_BREAKER};
use crate::cache::{semantic, Store, PREPARE_MAX_SLOTS};
use crate::config::Config;
use crate::host::footprint::{Footprint, Owner, Plan, Read};
use crate::host::{Metrics, SharedStore};
use crate::load;
use crate::metrics;
use crate::routing::stateful;

/// One family of keys.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The module that writes it.
    pub area: &'static str,
    /// The version of its encoding, in its key.
    pub version: u32,
    /// The key, or what each of its keys starts with when [`Family::rest`]
    /// says what follows.
    pub key: &'static str,
    /// What follows [`Family::key`] in each key, as the docs spell it
    /// (`<slot>`); `None`: the family is the one key.
    pub rest: Option<&'static str>,
    /// What the keys hold. Read only by the docs test: left out of the
    /// module, whose every byte every Envoy holds many times over.
    #[cfg(not(target_arch = "wasm32"))]
    pub what: &'static str,
    /// The most keys, in the configuration's words (checked against
    /// docs/design.md); not in the module either.
    #[cfg(not(target_arch = "wasm32"))]
    pub bound: &'static str,
    /// Who counts them.
    pub counted: Counted,
}

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
}

impl Family {
    /// The key `rest` names in the family.
    pub fn at(&self, rest: impl std::fmt::Display) -> String {
        format!("{}{rest}", self.key)
    }

    /// `key` is one of the family's.
    pub fn holds(&self, key: &str) -> bool {
        match self.rest {
            None => key == self.key,
            Some(_) => key.len() > self.key.len() && key.starts_with(self.key),
        }
    }

    /// The key as the docs spell it: `llm_filter.cache.v1.slot.<i>`.
    pub fn pattern(&self) -> String {
        format!("{}{}", self.key, self.rest.unwrap_or(""))
    }

    /// The most keys `config` lets the family hold.
    pub fn max_keys(&self, config: &Config) -> u64 {
        match self.counted {
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

/// A family: its key is `llm_filter.<area>.v<version>.<name>`.
macro_rules! family {
    ($area:literal, $version:literal, $name:literal, $rest:expr, $what:literal, $bound:literal, $counted:expr) => {
        Family {
            area: $area,
            version: $version,
            key: concat!("llm_filter.", $area, ".v", $version, ".", $name),
            rest: $rest,
            #[cfg(not(target_arch = "wasm32"))]
            what: $what,
            #[cfg(not(target_arch = "wasm32"))]
            bound: $bound,
            counted: $counted,
        }
    };
}

/// Cache entries, one per slot.
pub const CACHE_SLOT: Family = family!(
    "cache",
    1,
    "slot.",
    Some("<i>"),
    "one per cache slot",
    "`cache.max_entries` (none with `cache.mode: shard`)",
    Counted::Owner {
        bound: cache_slots,
        count: count_cache_slots
    }
);
/// The coalescing marker of each cache slot.
pub const CACHE_INFLIGHT: Family = family!(
    "cache",
    1,
    "inflight.",
    Some("<i>"),
    "coalescing marker of slot `i`",
    "`cache.max_entries` (none with `cache.mode: shard`)",
    Counted::Read(read_markers)
);
/// The cache's entry and byte totals.
pub const CACHE_STATS: Family = family!(
    "cache",
    1,
    "stats",
    None,
    "the cache's entry and byte totals",
    "1",
    Counted::One(always)
);
/// The slot count the cache's table is laid out with.
pub const CACHE_LAYOUT: Family = family!(
    "cache",
    1,
    "layout",
    None,
    "the slot count the table is laid out with",
    "1",
    Counted::One(always)
);
/// The semantic index's group slots.
pub const SEMANTIC_GROUP: Family = family!(
    "semantic",
    1,
    "group.",
    Some("<i>"),
    "semantic index group slot",
    "`cache.semantic.max_contexts`",
    Counted::Owner {
        bound: semantic_groups,
        count: count_semantic_groups
    }
);
/// The semantic index's totals.
pub const SEMANTIC_STATS: Family = family!(
    "semantic",
    1,
    "stats",
    None,
    "the index's vector and byte totals",
    "1 (with `cache.semantic`)",
    Counted::One(semantic_on)
);
/// Which worker sends the health probes.
pub const PROBE_LEASE: Family = family!(
    "routing",
    1,
    "probe_lease",
    None,
    "which worker sends the probes",
    "1",
    Counted::One(always)
);
/// Each routed cluster's health (and the weights it gives).
pub const HEALTH: Family = family!(
    "routing",
    4,
    "health.",
    Some("<cluster>"),
    "health of a routed cluster",
    "clusters in `routing.models`",
    Counted::Read(read_health)
);
/// Each routed cluster's budget breaker window.
pub const BREAKER: Family = family!(
    "budget", 1, "breaker.", Some("<cluster>"),
    "budget breaker window of a cluster, and `default` for unrouted calls (names over 128 bytes are hashed)",
    "clusters in `routing.models` + 1",
    Counted::Read(read_breakers)
);
/// Each routed model's hedge window.
pub const HEDGE: Family = family!(
    "routing",
    1,
    "hedge.",
    Some("<model>"),
    "hedge window of a model",
    "models in `routing.models`, with `routing.hedge` set",
    Counted::Read(read_hedges)
);
/// The backend that produced a stored Responses answer, by id.
pub const RESPONSE: Family = family!(
    "routing", 1, "response.", Some("<slot>"),
    "the backend that produced a stored Responses response, by id ([the APIs](apis.md#calls-that-continue-state))",
    "4096 slots (with `routing.models`)",
    Counted::Read(read_responses)
);
/// Load signals of a model.
pub const LOAD_MODEL: Family = family!(
    "load", 1, "model.", Some("<model>"),
    "[load signals](load.md) of a model",
    "one per model the configuration names (names) and per routed cluster, 64 others together, the two overflow records `model.other` and `cluster.other`, and the index",
    Counted::Owner { bound: load_records, count: count_load_records }
);
/// Load signals of a cluster.
pub const LOAD_CLUSTER: Family = family!(
    "load",
    1,
    "cluster.",
    Some("<cluster>"),
    "[load signals](load.md) of a cluster",
    "with the model records",
    Counted::With(LOAD_MODEL.key)
);
/// The index of the load records.
pub const LOAD_INDEX: Family = family!(
    "load",
    1,
    "index",
    None,
    "the load records that exist (names as stat labels write them: at most 128 characters)",
    "with the model records",
    Counted::With(LOAD_MODEL.key)
);
/// The alerts Alertmanager reports active.
pub const ALERTS: Family = family!(
    "degrade",
    2,
    "alerts",
    None,
    "the [active alerts](degrade.md#the-alertmanager-loop)",
    "1",
    Counted::One(always)
);
/// The load readings pulled from Prometheus.
pub const MESH: Family = family!(
    "degrade",
    1,
    "mesh",
    None,
    "the mesh-wide [load readings](degrade.md) pulled from Prometheus",
    "1 (with `degrade.prometheus`)",
    Counted::One(prometheus_on)
);
/// Which worker pulls Alertmanager's alerts.
pub const ALERTMANAGER_LEASE: Family = family!(
    "degrade",
    1,
    "alertmanager_lease",
    None,
    "which worker pulls Alertmanager's alerts",
    "1 (with `degrade.alertmanager`)",
    Counted::One(alertmanager_on)
);
/// Which worker pulls Prometheus's readings.
pub const PROMETHEUS_LEASE: Family = family!(
    "degrade",
    1,
    "prometheus_lease",
    None,
    "which worker pulls Prometheus's readings",
    "1 (with `degrade.prometheus`)",
    Counted::One(prometheus_on)
);
/// The prompt estimate's learnt ratios.
pub const CALIBRATION: Family = family!(
    "tokens",
    1,
    "calibration",
    None,
    "the prompt estimate's learnt ratios, per model",
    "1",
    Counted::One(always)
);
/// The counts of each limits rule, by record.
pub const LIMITS: Family = family!(
    "limits",
    1,
    "",
    Some("<rule>.<slot>"),
    "the [limits](limits.md) counts of a rule's keys (tenants, users, models)",
    "`limits.max_keys` per rule in `limits.rules`",
    Counted::Read(read_limits)
);

/// Every family, in the order docs/design.md lists them.
pub const FAMILIES: [&Family; 20] = [
    &CACHE_SLOT,
    &CACHE_INFLIGHT,
    &CACHE_STATS,
    &CACHE_LAYOUT,
    &SEMANTIC_GROUP,
    &SEMANTIC_STATS,
    &PROBE_LEASE,
    &HEALTH,
    &BREAKER,
    &HEDGE,
    &RESPONSE,
    &LOAD_MODEL,
    &LOAD_CLUSTER,
    &LOAD_INDEX,
    &ALERTS,
    &MESH,
    &ALERTMANAGER_LEASE,
    &PROMETHEUS_LEASE,
    &CALIBRATION,
    &LIMITS,
];

/// The family `key` belongs to.
pub fn family_of(key: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.holds(key))
}

/// `key` belongs to a family of the registry: what a test store asks of
/// every key written.
pub fn is_named(key: &str) -> bool {
    family_of(key).is_some()
}

/// What the census counts for `config`: the keys of the families it reads,
/// and the owners of the others.
pub fn plan(config: &Config) -> Plan<Config> {
    let mut plan = Plan::default();
    for family in FAMILIES {
        match family.counted {
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
    FAMILIES
        .iter()
        .fold(0u64, |n, f| n.saturating_add(f.max_keys(config)))
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

/// What the keys of `rule`'s records start with; the slot follows.
pub fn limits_prefix(rule: &str) -> String {
    LIMITS.at(format_args!("{rule}."))
}

#[cfg(test)]
mod tests;
