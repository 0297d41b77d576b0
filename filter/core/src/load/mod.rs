//! Live load signals, per model and per cluster, shared by every worker: calls
//! per second and output tokens per second over a sliding window, and calls in
//! flight. They feed the load-driven degrade and the `llm_filter_load_*` gauges.
//!
//! The window is [`BUCKETS`] fixed buckets of [`BUCKET_MS`] each, stamped with
//! the second they count, so a bucket from a lap ago is recognised and reset
//! (no timer clears them). Each record is one small bincode value updated by
//! compare-and-swap, listed once in an index when it is first created.
//!
//! The family is bounded by the configuration, not by what clients send: a
//! model or cluster the configuration names (`config::Names`) always has a
//! record of its own; of the names it does not give, the first
//! [`MAX_UNKNOWN`] get one each, and the later ones all count in one
//! overflow record, [`OVERFLOW`] (`other`, as their stat label says once a
//! worker's labels run out). So a client naming made-up models can never
//! take the place of a model a threshold watches.

use serde::{Deserialize, Serialize};

use crate::build::ROUTING;
use crate::config::Names;
use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::{Metrics, SharedStore, StoreError};
use crate::keyspace;
use crate::metrics::{self as names, internal_error};
use crate::summary::{CallSummary, End, Try};

/// The index of the records that exist.
pub const INDEX_KEY: &str = keyspace::LOAD_INDEX.key;
/// Most records of names the configuration does not give (models and
/// clusters together); the calls of the later ones count in [`OVERFLOW`].
pub const MAX_UNKNOWN: usize = 64;
/// The name of the record the calls of names beyond [`MAX_UNKNOWN`] share.
pub const OVERFLOW: &str = names::OTHER;
/// Buckets of the sliding window.
pub const BUCKETS: usize = 10;
/// Width of one bucket, ms.
pub const BUCKET_MS: u64 = 1000;
/// The window the rates are averaged over, s.
pub const WINDOW_S: f64 = (BUCKETS as u64 * BUCKET_MS) as f64 / 1000.0;
/// An in-flight count untouched this long is a leak (a worker restarted with
/// calls open) and counts as zero.
const IN_FLIGHT_STALE_MS: u64 = 600_000;
/// In-flight counts beyond this are leaks too.
const MAX_IN_FLIGHT: u32 = 1 << 20;

/// What a record measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Calls of a model (its bounded label).
    Model(&'a str),
    /// Tries sent to a cluster.
    Cluster(&'a str),
}

impl Scope<'_> {
    /// The record's shared-data key: the name as a stat label writes it
    /// (bounded, [`names::label_value`]), so the key is bounded too and names
    /// that share a label share a record.
    pub fn key(&self) -> String {
        let (family, name) = match self {
            Scope::Model(n) => (keyspace::LOAD_MODEL.key, n),
            Scope::Cluster(n) => (keyspace::LOAD_CLUSTER.key, n),
        };
        let mut k = String::with_capacity(family.len() + names::MAX_VALUE_LEN);
        k.push_str(family);
        names::push_value(&mut k, name);
        k
    }

    /// The scope a key names, for the index's readers.
    pub fn of_key(key: &str) -> Option<Scope<'_>> {
        if let Some(n) = key.strip_prefix(keyspace::LOAD_MODEL.key) {
            Some(Scope::Model(n))
        } else {
            key.strip_prefix(keyspace::LOAD_CLUSTER.key)
                .map(Scope::Cluster)
        }
    }

    /// The overflow record of the same kind.
    fn overflow(&self) -> Scope<'static> {
        match self {
            Scope::Model(_) => Scope::Model(OVERFLOW),
            Scope::Cluster(_) => Scope::Cluster(OVERFLOW),
        }
    }

    /// The name the scope was made with.
    fn name(&self) -> &str {
        match self {
            Scope::Model(n) | Scope::Cluster(n) => n,
        }
    }
}

/// The record behind `key` is outside the bound on unknown names: the
/// configuration names it, or it is the overflow record.
fn reserved(config_names: &Names, key: &str) -> bool {
    match Scope::of_key(key) {
        Some(Scope::Model(n)) => n == OVERFLOW || config_names.has_model_label(n),
        Some(Scope::Cluster(n)) => n == OVERFLOW || config_names.has_cluster_label(n),
        None => false,
    }
}

/// What a load signal is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// Calls per second.
    Rps,
    /// Output tokens per second.
    TokensPerS,
    /// Calls in flight.
    InFlight,
}

impl crate::config::read::Read for Signal {
    fn read(v: &serde_json::Value) -> Result<Self, crate::config::ConfigError> {
        let all = [Self::Rps, Self::TokensPerS, Self::InFlight];
        crate::config::read::variant(v, &all, Self::as_str)
    }
}

impl Signal {
    /// Its name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rps => "rps",
            Self::TokensPerS => "tokens_per_s",
            Self::InFlight => "in_flight",
        }
    }
}

/// One bucket of the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Bucket {
    /// The bucket's number since the epoch (`now_ms / BUCKET_MS`).
    at: u64,
    calls: u32,
    tokens: u64,
}

/// The shared record of one model or cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    in_flight: u32,
    in_flight_at_ms: u64,
    buckets: [Bucket; BUCKETS],
}

/// What a record says now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    /// Calls ended per second over the window.
    pub rps: f64,
    /// Output tokens per second over the window.
    pub tokens_per_s: f64,
    /// Calls in flight.
    pub in_flight: u32,
}

impl Signals {
    /// The value of `signal`.
    pub fn get(&self, signal: Signal) -> f64 {
        match signal {
            Signal::Rps => self.rps,
            Signal::TokensPerS => self.tokens_per_s,
            Signal::InFlight => f64::from(self.in_flight),
        }
    }
}

impl Record {
    /// Decodes a stored record; `None` for anything that is not one.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        codec::decode(bytes)
    }

    fn encode(&self) -> Option<Vec<u8>> {
        codec::encode(self)
    }

    /// Counts `calls` calls and `tokens` output tokens ending at `now_ms`.
    fn add(&mut self, now_ms: u64, calls: u32, tokens: u64) {
        let at = now_ms / BUCKET_MS;
        let i = usize::try_from(at % BUCKETS as u64).unwrap_or(0);
        if let Some(b) = self.buckets.get_mut(i) {
            if b.at != at {
                *b = Bucket {
                    at,
                    ..Bucket::default()
                };
            }
            b.calls = b.calls.saturating_add(calls);
            b.tokens = b.tokens.saturating_add(tokens);
        }
    }

    /// Moves the in-flight count by `delta` at `now_ms`.
    fn move_in_flight(&mut self, now_ms: u64, delta: i32) {
        let current = self.in_flight_at(now_ms);
        self.in_flight = current.saturating_add_signed(delta);
        self.in_flight_at_ms = now_ms;
    }

    fn in_flight_at(&self, now_ms: u64) -> u32 {
        if now_ms.saturating_sub(self.in_flight_at_ms) > IN_FLIGHT_STALE_MS
            || self.in_flight > MAX_IN_FLIGHT
        {
            0
        } else {
            self.in_flight
        }
    }

    /// The signals at `now_ms`: buckets of the last [`BUCKETS`] (the current
    /// one included) count, older or future ones do not.
    pub fn signals(&self, now_ms: u64) -> Signals {
        let at = now_ms / BUCKET_MS;
        let (mut calls, mut tokens) = (0u64, 0u64);
        for b in &self.buckets {
            if b.at <= at && at - b.at < BUCKETS as u64 {
                calls = calls.saturating_add(u64::from(b.calls));
                tokens = tokens.saturating_add(b.tokens);
            }
        }
        Signals {
            rps: calls as f64 / WINDOW_S,
            tokens_per_s: tokens as f64 / WINDOW_S,
            in_flight: self.in_flight_at(now_ms),
        }
    }
}

/// Reads the signals of `scope`; zero when it has no record.
pub fn read(store: &dyn SharedStore, scope: Scope<'_>, now_ms: u64) -> Signals {
    read_record(store, &scope.key())
        .map(|r| r.signals(now_ms))
        .unwrap_or_default()
}

fn read_record(store: &dyn SharedStore, key: &str) -> Option<Record> {
    store
        .get(key)
        .ok()
        .and_then(|v| v.value)
        .and_then(|b| Record::decode(&b))
}

/// Reads the signals of the record the calls of `model` count in: its own,
/// or, for a model the configuration does not name and that has none, the
/// overflow record its calls share with the other names beyond the bound.
pub fn read_model(
    store: &dyn SharedStore,
    config_names: &Names,
    model: &str,
    now_ms: u64,
) -> Signals {
    let own = Scope::Model(model);
    let key = own.key();
    if let Some(r) = read_record(store, &key) {
        return r.signals(now_ms);
    }
    if reserved(config_names, &key) {
        return Signals::default();
    }
    read(store, own.overflow(), now_ms)
}

/// Changes the record of `scope`, creating it when the index admits it, or
/// else the overflow record of its kind. The scope whose record changed;
/// `None` when the store refused even the overflow (a host fault).
fn update<'a>(
    store: &dyn SharedStore,
    config_names: &Names,
    scope: Scope<'a>,
    change: &mut dyn FnMut(&mut Record),
) -> Result<Option<Scope<'a>>, StoreError> {
    for scope in [scope, scope.overflow()] {
        let key = scope.key();
        if write(store, &key, false, change)? {
            return Ok(Some(scope));
        }
        if admit(store, config_names, &key)? {
            return Ok(write(store, &key, true, change)?.then_some(scope));
        }
    }
    Ok(None)
}

/// Changes the record at `key`, or creates it when `create`; false when it
/// is not there and not to be created.
fn write(
    store: &dyn SharedStore,
    key: &str,
    create: bool,
    change: &mut dyn FnMut(&mut Record),
) -> Result<bool, StoreError> {
    let u = cas::update(
        store,
        key,
        Unguarded::CreateEmpty,
        // A record to create reads as the empty one, which the update
        // writes first: two workers starting a model's first calls in the
        // same millisecond both count. One not to create reads as absent.
        |b| match b {
            Some(b) => Some(Record::decode(b).unwrap_or_default()),
            None => create.then(Record::default),
        },
        |r| r.as_ref().and_then(Record::encode),
        |r| match r {
            Some(r) => {
                change(r);
                Change::Write(true)
            }
            None => Change::Keep(false),
        },
    )?;
    Ok(u.out)
}

/// Adds `key` to the index: always when the configuration names it (or it
/// is the overflow record), else while fewer than [`MAX_UNKNOWN`] other
/// names are there. True when it is (now) there.
fn admit(store: &dyn SharedStore, config_names: &Names, key: &str) -> Result<bool, StoreError> {
    let reserved_key = reserved(config_names, key);
    let u = cas::update(
        store,
        INDEX_KEY,
        Unguarded::Verify,
        decode_index,
        codec::encode,
        |index: &mut Vec<String>| {
            if index.iter().any(|k| k == key) {
                return Change::Keep(true);
            }
            let unknown = || index.iter().filter(|k| !reserved(config_names, k)).count();
            if !reserved_key && unknown() >= MAX_UNKNOWN {
                return Change::Keep(false);
            }
            index.push(key.to_string());
            Change::Write(true)
        },
    )?;
    Ok(u.out)
}

fn decode_index(bytes: Option<&[u8]>) -> Vec<String> {
    bytes
        .and_then(codec::decode::<Vec<String>>)
        .unwrap_or_default()
}

/// The keys of the records that exist.
pub fn index(store: &dyn SharedStore) -> Vec<String> {
    decode_index(store.get(INDEX_KEY).ok().and_then(|v| v.value).as_deref())
}

/// A call of `model` went upstream: it joins the in-flight count of the
/// record its model counts in. The name of that record (the model's label,
/// or [`OVERFLOW`]), which [`ended`] must be told; `None` when not counted.
pub fn started(
    store: &dyn SharedStore,
    m: &mut dyn Metrics,
    config_names: &Names,
    model: &str,
    now_ms: u64,
) -> Option<String> {
    let scope = Scope::Model(model);
    match update(store, config_names, scope, &mut |r| {
        r.move_in_flight(now_ms, 1)
    }) {
        Ok(counted) => counted.map(|s| s.name().to_string()),
        Err(_) => {
            internal_error(m, "load_record");
            None
        }
    }
}

/// The output tokens a try reported.
fn tokens(t: &Try<'_>) -> u64 {
    t.usage.map_or(0, |u| u.completion_tokens)
}

/// Whether a call that ended went upstream, so the record counts it.
fn went_upstream(call: &CallSummary<'_>) -> bool {
    !call.end().is_local() && call.end() != End::Outlasted
}

/// A call ended: the record its model counts in counts it (unless the
/// filter answered it itself) and, when it was counted in flight
/// ([`started`] named the record), it leaves that record's in-flight count
/// — exactly once, whatever the end.
pub fn ended(
    store: &dyn SharedStore,
    m: &mut dyn Metrics,
    config_names: &Names,
    call: &CallSummary<'_>,
    started: Option<&str>,
) {
    let upstream = went_upstream(call);
    if !upstream && started.is_none() {
        return;
    }
    let now_ms = call.served.ended_ms;
    let tokens = tokens(&call.served);
    let scope = Scope::Model(started.unwrap_or(call.model));
    let result = update(store, config_names, scope, &mut |r| {
        if started.is_some() {
            r.move_in_flight(now_ms, -1);
        }
        if upstream {
            r.add(now_ms, 1, tokens);
        }
    });
    if result.is_err() {
        internal_error(m, "load_record");
    }
}

/// The calls a worker saw end that were never counted in flight (their
/// model was known only once the answer came: a body that streamed
/// through), counted by model and second, for [`flush`] to add to their
/// records once a timer tick instead of a read and a write of shared data
/// per call. Nothing on such a call's path reads the record: a call a
/// threshold or an alert may degrade holds its body and joins the
/// in-flight count, which is written at once; the `llm_filter_load_*`
/// gauges read the records once a second.
#[derive(Debug, Default)]
pub struct Pending(Vec<PendingEnd>);

/// Calls of one model that ended in one bucket, not yet in its record.
#[derive(Debug)]
struct PendingEnd {
    model: String,
    bucket: u64,
    calls: u32,
    tokens: u64,
}

/// Models and seconds a worker keeps between two flushes; a call past them
/// is written at once, as [`ended`] does.
const MAX_PENDING: usize = 32;

impl Pending {
    /// Keeps `call` for the next [`flush`] when it was never counted in
    /// flight (`started` is `None`) and there is room; false when the
    /// caller must write it now ([`ended`]).
    pub fn keep(&mut self, call: &CallSummary<'_>, started: Option<&str>) -> bool {
        if started.is_some() {
            return false;
        }
        if !went_upstream(call) {
            // Nothing to count: kept as nothing.
            return true;
        }
        let bucket = call.served.ended_ms / BUCKET_MS;
        let tokens = tokens(&call.served);
        let model = call.model;
        if let Some(e) = self
            .0
            .iter_mut()
            .find(|e| e.bucket == bucket && e.model == model)
        {
            e.calls = e.calls.saturating_add(1);
            e.tokens = e.tokens.saturating_add(tokens);
            return true;
        }
        if self.0.len() >= MAX_PENDING {
            return false;
        }
        self.0.push(PendingEnd {
            model: model.to_string(),
            bucket,
            calls: 1,
            tokens,
        });
        true
    }

    /// Nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Adds the calls `pending` kept to their records, as [`ended`] would have
/// one by one. Calls of a bucket a whole window old are dropped: their
/// bucket's slot may count a newer second by now.
pub fn flush(
    store: &dyn SharedStore,
    m: &mut dyn Metrics,
    config_names: &Names,
    pending: &mut Pending,
    now_ms: u64,
) {
    let current = now_ms / BUCKET_MS;
    for e in pending.0.drain(..) {
        if current.saturating_sub(e.bucket) >= BUCKETS as u64 {
            continue;
        }
        let at_ms = e.bucket.saturating_mul(BUCKET_MS);
        let scope = Scope::Model(&e.model);
        if update(store, config_names, scope, &mut |r| {
            r.add(at_ms, e.calls, e.tokens)
        })
        .is_err()
        {
            internal_error(m, "load_record");
        }
    }
}

/// One try of a call on a cluster ended: the cluster's record counts it.
/// Cluster in-flight counts are routing's (`llm_filter_routing_in_flight`).
pub fn tried(store: &dyn SharedStore, m: &mut dyn Metrics, config_names: &Names, t: &Try<'_>) {
    let Some(cluster) = t.cluster else {
        return;
    };
    if t.end.is_local() {
        return;
    }
    let (now_ms, tokens) = (t.ended_ms, tokens(t));
    let scope = Scope::Cluster(cluster);
    if update(store, config_names, scope, &mut |r| {
        r.add(now_ms, 1, tokens)
    })
    .is_err()
    {
        internal_error(m, "load_record");
    }
}

/// Sets the `llm_filter_load_*` gauges of every record from shared data.
/// A build that routes no call publishes none: the sidecar build sends its
/// calls on to a gateway tier whose replicas count the same calls, and the
/// mesh-wide sums `degrade.prometheus` reads would count each twice. Its
/// records still count its calls for its own thresholds.
pub fn publish(store: &dyn SharedStore, m: &mut dyn Metrics, now_ms: u64) {
    if !ROUTING {
        return;
    }
    for key in index(store) {
        let Some(scope) = Scope::of_key(&key) else {
            continue;
        };
        let s = read(store, scope, now_ms);
        let rps_milli = (s.rps * 1000.0).round() as i64;
        let tokens = s.tokens_per_s.round() as i64;
        match scope {
            Scope::Model(model) => {
                let l = [("model", model)];
                m.gauge(&names::name(names::LOAD_RPS, &l), rps_milli);
                m.gauge(&names::name(names::LOAD_TOKENS, &l), tokens);
                m.gauge(
                    &names::name(names::LOAD_IN_FLIGHT, &l),
                    i64::from(s.in_flight),
                );
            }
            Scope::Cluster(cluster) => {
                let l = [(names::LLM_CLUSTER, cluster)];
                m.gauge(&names::name(names::LOAD_CLUSTER_RPS, &l), rps_milli);
                m.gauge(&names::name(names::LOAD_CLUSTER_TOKENS, &l), tokens);
            }
        }
    }
}

/// Most keys of the family under `config_names`: a record for each model
/// and cluster the configuration names, [`MAX_UNKNOWN`] for the others, the
/// two overflow records, and the index.
pub fn max_keys(config_names: &Names) -> u64 {
    let reserved = config_names
        .model_labels()
        .saturating_add(config_names.cluster_labels());
    u64::try_from(reserved.saturating_add(MAX_UNKNOWN + 2 + 1)).unwrap_or(u64::MAX)
}

/// Keys and bytes of the family, for the census.
pub fn footprint<S: SharedStore + ?Sized>(store: &S) -> (u64, u64) {
    let (mut keys, mut bytes) = (0u64, 0u64);
    let index = store.get(INDEX_KEY).ok().and_then(|v| v.value);
    let names = decode_index(index.as_deref());
    if let Some(i) = index {
        keys += 1;
        bytes += i.len() as u64;
    }
    for key in names {
        if let Some(v) = store.get(&key).ok().and_then(|v| v.value) {
            keys += 1;
            bytes += v.len() as u64;
        }
    }
    (keys, bytes)
}

#[cfg(test)]
mod tests;
