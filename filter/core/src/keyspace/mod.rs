//! Every family of keys the filter writes in shared data, named once: its
//! key (with the version of its encoding), how many keys a configuration
//! lets it hold, and who counts them. Shared data never evicts and is shared
//! by every plugin on a proxy, so a key nobody bounds or counts is a leak; the
//! owners build their keys from here, the census counts what [`census::plan`] lists,
//! and the scenario tests' store notes a key no family names ([`is_named`]).
//!
//! Every key is `llm_filter.<area>.v<version>.<name>`: the version moves when
//! a family's encoding does, so the workers of two filter versions (during a
//! configuration update) never read each other's bytes; a family left behind
//! by an older version stays in shared data, unread and uncounted, until the
//! proxy restarts (docs/design.md lists what changed).

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
}

/// A family: its key is `llm_filter.<area>.v<version>.<name>`.
macro_rules! family {
    ($area:literal, $version:literal, $name:literal, $rest:expr, $what:literal, $bound:literal) => {
        Family {
            area: $area,
            version: $version,
            key: concat!("llm_filter.", $area, ".v", $version, ".", $name),
            rest: $rest,
            #[cfg(not(target_arch = "wasm32"))]
            what: $what,
            #[cfg(not(target_arch = "wasm32"))]
            bound: $bound,
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
    "`cache.max_entries` (none with `cache.mode: shard`)"
);
/// The coalescing marker of each cache slot.
pub const CACHE_INFLIGHT: Family = family!(
    "cache",
    1,
    "inflight.",
    Some("<i>"),
    "coalescing marker of slot `i`",
    "`cache.max_entries` (none with `cache.mode: shard`)"
);
/// The cache's entry and byte totals.
pub const CACHE_STATS: Family = family!(
    "cache",
    1,
    "stats",
    None,
    "the cache's entry and byte totals",
    "1"
);
/// The slot count the cache's table is laid out with.
pub const CACHE_LAYOUT: Family = family!(
    "cache",
    1,
    "layout",
    None,
    "the slot count the table is laid out with",
    "1"
);
/// The semantic index's group slots.
pub const SEMANTIC_GROUP: Family = family!(
    "semantic",
    1,
    "group.",
    Some("<i>"),
    "semantic index group slot",
    "`cache.semantic.max_contexts`"
);
/// The semantic index's totals.
pub const SEMANTIC_STATS: Family = family!(
    "semantic",
    1,
    "stats",
    None,
    "the index's vector and byte totals",
    "1 (with `cache.semantic`)"
);
/// Which worker sends the health probes.
pub const PROBE_LEASE: Family = family!(
    "routing",
    1,
    "probe_lease",
    None,
    "which worker sends the probes",
    "1"
);
/// Each routed cluster's health (and the weights it gives).
pub const HEALTH: Family = family!(
    "routing",
    4,
    "health.",
    Some("<cluster>"),
    "health of a routed cluster",
    "clusters in `routing.models`"
);
/// Each routed cluster's budget breaker window.
pub const BREAKER: Family = family!(
    "budget", 1, "breaker.", Some("<cluster>"),
    "budget breaker window of a cluster, and `default` for unrouted calls (names over 128 bytes are hashed)",
    "clusters in `routing.models` + 1"
);
/// Each routed model's hedge window.
pub const HEDGE: Family = family!(
    "routing",
    1,
    "hedge.",
    Some("<model>"),
    "hedge window of a model",
    "models in `routing.models`, with `routing.hedge` set"
);
/// The backend that produced a stored Responses answer, by id.
pub const RESPONSE: Family = family!(
    "routing", 1, "response.", Some("<slot>"),
    "the backend that produced a stored Responses response, by id ([the APIs](apis.md#calls-that-continue-state))",
    "4096 slots (with `routing.models`)"
);
/// Load signals of a model.
pub const LOAD_MODEL: Family = family!(
    "load", 1, "model.", Some("<model>"),
    "[load signals](load.md) of a model",
    "one per model the configuration names (names) and per routed cluster, 64 others together, the two overflow records `model.other` and `cluster.other`, and the index"
);
/// Load signals of a cluster.
pub const LOAD_CLUSTER: Family = family!(
    "load",
    1,
    "cluster.",
    Some("<cluster>"),
    "[load signals](load.md) of a cluster",
    "with the model records"
);
/// The index of the load records.
pub const LOAD_INDEX: Family = family!(
    "load",
    1,
    "index",
    None,
    "the load records that exist (names as stat labels write them: at most 128 characters)",
    "with the model records"
);
/// The alerts Alertmanager reports active.
pub const ALERTS: Family = family!(
    "degrade",
    2,
    "alerts",
    None,
    "the [active alerts](degrade.md#the-alertmanager-loop)",
    "1"
);
/// The load readings pulled from Prometheus.
pub const MESH: Family = family!(
    "degrade",
    1,
    "mesh",
    None,
    "the mesh-wide [load readings](degrade.md) pulled from Prometheus",
    "1 (with `degrade.prometheus`)"
);
/// Which worker pulls Alertmanager's alerts.
pub const ALERTMANAGER_LEASE: Family = family!(
    "degrade",
    1,
    "alertmanager_lease",
    None,
    "which worker pulls Alertmanager's alerts",
    "1 (with `degrade.alertmanager`)"
);
/// Which worker pulls Prometheus's readings.
pub const PROMETHEUS_LEASE: Family = family!(
    "degrade",
    1,
    "prometheus_lease",
    None,
    "which worker pulls Prometheus's readings",
    "1 (with `degrade.prometheus`)"
);
/// The prompt estimate's learnt ratios.
pub const CALIBRATION: Family = family!(
    "tokens",
    1,
    "calibration",
    None,
    "the prompt estimate's learnt ratios, per model",
    "1"
);
/// The counts of each limits rule, by record.
pub const LIMITS: Family = family!(
    "limits",
    1,
    "",
    Some("<rule>.<slot>"),
    "the [limits](limits.md) counts of a rule's keys (tenants, users, models)",
    "`limits.max_keys` per rule in `limits.rules`"
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

/// What the keys of `rule`'s records start with; the slot follows.
pub fn limits_prefix(rule: &str) -> String {
    LIMITS.at(format_args!("{rule}."))
}

pub mod census;
#[cfg(test)]
mod tests;
