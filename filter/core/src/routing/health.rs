//! Passive and active health of each cluster, shared by every worker through
//! shared data so that one worker's failures move every worker's traffic.
//! Records are small fixed-size bincode values updated by compare-and-swap.

use serde::{Deserialize, Serialize};

use super::config::RoutingConfig;
use super::ewma::{unit_weight, MAX_SAMPLE_MS, TAIL_SHARE};
pub use super::ewma::{Ewma, Histogram};
use super::outcome::Verdict;
pub use super::outcome::{CallResult, CallSample};
use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::{SharedStore, StoreError};

/// Prefix of the per-cluster health keys; the cluster name follows. The
/// version changes with the record's layout, so workers of two filter versions
/// (during a configuration update) never read each other's records.
pub const KEY_PREFIX: &str = crate::keyspace::HEALTH.key;

/// Successes a new error average starts from (see [`observe_error`]).
const ERROR_PRIOR: f64 = 4.0;
/// An in-flight count untouched this long is a leak (a worker restarted with
/// calls open) and is reset.
const IN_FLIGHT_STALE_MS: u64 = 600_000;
/// In-flight counts beyond this are leaks too.
const MAX_IN_FLIGHT: u32 = 1 << 20;
/// Longest doubling applied to the ejection time.
const MAX_EJECT_DOUBLINGS: u32 = 16;

/// The shared-data key of a cluster's health.
pub fn key(cluster: &str) -> String {
    let mut k = String::with_capacity(KEY_PREFIX.len() + cluster.len());
    k.push_str(KEY_PREFIX);
    k.push_str(cluster);
    k
}

/// Folds a call's result (1 failed, 0 not) into the error average. Without
/// evidence a cluster counts as healthy: a new average starts as if
/// [`ERROR_PRIOR`] calls had succeeded, so one failure on a fresh or returning
/// cluster costs it about 60% of its weight rather than all but 2%.
fn observe_error(slot: &mut Option<Ewma>, failed: f64, now_ms: u64, half_life_ms: f64) {
    if slot.is_none() {
        *slot = Some(Ewma {
            value: 0.0,
            at_ms: now_ms,
            weight: ERROR_PRIOR,
        });
    }
    Ewma::observe(slot, failed, now_ms, half_life_ms);
}

/// Load signals a model server exports (see [`super::probe::parse_load`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Requests queued and not yet running, `>= 0`.
    pub waiting: Option<f64>,
    /// KV-cache usage as a fraction in `[0, 1]`.
    pub kv_usage: Option<f64>,
}

impl Load {
    fn sanitized(self) -> Self {
        Self {
            waiting: self
                .waiting
                .filter(|w| w.is_finite())
                .map(|w| w.clamp(0.0, 1e9)),
            kv_usage: self
                .kv_usage
                .filter(|u| u.is_finite())
                .map(|u| u.clamp(0.0, 1.0)),
        }
    }
}

/// The last active probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRecord {
    /// The cluster answered like a live server.
    pub ok: bool,
    /// When the answer (or timeout) came.
    pub at_ms: u64,
    /// How long it took.
    pub latency_ms: u64,
}

/// Everything known about one cluster. Fixed size: no collection grows in
/// shared data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// Latency of successful calls, ms.
    pub latency: Option<Ewma>,
    /// Time to first byte of successful calls, ms.
    pub ttft: Option<Ewma>,
    /// Share of calls that failed (5xx, 429, reset, timeout), in `[0, 1]`.
    pub errors: Option<Ewma>,
    /// Latencies of successful non-streamed calls (to the end), ms: their
    /// typical and tail latency.
    pub calls: Option<Histogram>,
    /// Times to the first byte of successful streams, ms: their typical and
    /// tail latency.
    pub streams: Option<Histogram>,
    /// The same non-streamed calls paced: each one's time to the end as if
    /// its answer had been [`REFERENCE_TOKENS`] long (see [`paced_ms`]), so a
    /// backend that gets long answers is not judged slower than one that
    /// gets short ones at the same speed. What the weights judge them by.
    pub paced: Option<Histogram>,
    /// Failed calls in a row, across workers.
    pub consecutive_failures: u32,
    /// Calls dispatched and not yet completed.
    pub in_flight: u32,
    /// Last change of `in_flight`, to heal leaks.
    pub in_flight_at_ms: u64,
    /// Ejected (weight 0) while now is before this.
    pub ejected_until_ms: u64,
    /// Ejections in a row without a healthy spell, doubling the next one.
    pub ejections: u32,
    /// Start of the ramp back to full weight after an ejection.
    pub recovering_since_ms: Option<u64>,
    /// Last active probe.
    pub probe: Option<ProbeRecord>,
    /// Last load signals read from the model server.
    pub load: Option<Load>,
    /// When `load` was read.
    pub load_at_ms: u64,
}

impl Health {
    /// True while the cluster is ejected.
    pub fn is_ejected(&self, now_ms: u64) -> bool {
        now_ms < self.ejected_until_ms
    }

    /// The typical latency, ms: the time to the first byte for streams, to
    /// the end for other calls; `None` before anything was measured. Each
    /// kind is read from its own histogram; the averages, which mix kinds,
    /// stand in before it has any sample.
    pub fn typical_ms(&self, streaming: bool) -> Option<u64> {
        let (kind, average) = if streaming {
            (self.streams, self.ttft)
        } else {
            (self.calls, self.latency)
        };
        let ms = kind
            .and_then(|k| k.mean())
            .or_else(|| average.map(|e| e.value))?;
        ms.is_finite().then_some(ms as u64)
    }

    /// Calls in flight at `now_ms`: 0 when the count is a leak (see
    /// [`Self::heal_in_flight`]), so a stale count weighs nothing before the
    /// next write resets it.
    pub fn in_flight_at(&self, now_ms: u64) -> u32 {
        if Self::leaked(self.in_flight, self.in_flight_at_ms, now_ms) {
            0
        } else {
            self.in_flight
        }
    }

    /// An in-flight count untouched for long, or absurdly large, is a leak.
    fn leaked(in_flight: u32, at_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(at_ms) > IN_FLIGHT_STALE_MS || in_flight > MAX_IN_FLIGHT
    }

    /// Decodes a stored record; `None` for anything that is not one. Floats
    /// that are not finite (a foreign or corrupt value) are dropped, so no NaN
    /// ever reaches the weights.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut h: Health = codec::decode(bytes)?;
        for slot in [&mut h.latency, &mut h.ttft, &mut h.errors] {
            if slot.is_some_and(|e| !e.value.is_finite()) {
                *slot = None;
            }
        }
        if let Some(e) = h.errors.as_mut() {
            e.value = e.value.clamp(0.0, 1.0);
        }
        for e in [&mut h.latency, &mut h.ttft].into_iter().flatten() {
            e.value = e.value.clamp(0.0, MAX_SAMPLE_MS);
        }
        for e in [&mut h.latency, &mut h.ttft, &mut h.errors]
            .into_iter()
            .flatten()
        {
            e.weight = unit_weight(e.weight);
        }
        h.calls = h.calls.and_then(Histogram::sanitized);
        h.streams = h.streams.and_then(Histogram::sanitized);
        h.paced = h.paced.and_then(Histogram::sanitized);
        h.load = h.load.map(Load::sanitized);
        Some(h)
    }

    /// Encodes the record for shared data.
    pub fn encode(&self) -> Option<Vec<u8>> {
        codec::encode(self)
    }

    fn eject_ms(config: &RoutingConfig, ejections: u32) -> u64 {
        let doublings = ejections.saturating_sub(1).min(MAX_EJECT_DOUBLINGS);
        config
            .eject_ms
            .saturating_mul(1u64 << doublings)
            .min(config.max_eject_ms)
    }

    /// Ejects now, for longer each time the cluster failed again without a
    /// healthy spell in between.
    fn eject(&mut self, config: &RoutingConfig, now_ms: u64) {
        self.ejections = self.ejections.saturating_add(1);
        self.ejected_until_ms = now_ms.saturating_add(Self::eject_ms(config, self.ejections));
        self.recovering_since_ms = Some(self.ejected_until_ms);
        self.consecutive_failures = 0;
        // The ejection and the ramp after it already answer the errors that
        // caused it; kept, they would hold the cluster down a second time.
        self.errors = None;
    }

    /// Forgets past ejections once the cluster has been back, ramped up and
    /// healthy for as long again as its last ejection.
    fn forgive(&mut self, config: &RoutingConfig, now_ms: u64) {
        if self.is_ejected(now_ms) {
            return;
        }
        if let Some(since) = self.recovering_since_ms {
            if now_ms >= since.saturating_add(config.ramp_ms) {
                self.recovering_since_ms = None;
            }
        }
        if self.ejections > 0 {
            let healthy_after = self
                .ejected_until_ms
                .saturating_add(config.ramp_ms)
                .saturating_add(Self::eject_ms(config, self.ejections));
            if now_ms >= healthy_after {
                self.ejections = 0;
            }
        }
    }

    /// Resets an in-flight count nobody touched for long: the completions of
    /// those calls were lost with a restarted worker.
    fn heal_in_flight(&mut self, now_ms: u64) {
        if Self::leaked(self.in_flight, self.in_flight_at_ms, now_ms) {
            self.in_flight = 0;
        }
    }
}

/// The result of recording something.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recorded {
    /// This record ejected the cluster (count it once: extensions of a
    /// running ejection are not new ejections).
    pub ejected: bool,
    /// The record as written.
    pub health: Health,
}

/// The health of a cluster; `None` when nothing was recorded yet (or the
/// record is unreadable), which weighs as perfectly healthy.
pub fn read<S: SharedStore + ?Sized>(store: &S, cluster: &str) -> Option<Health> {
    store
        .get(&key(cluster))
        .ok()?
        .value
        .as_deref()
        .and_then(Health::decode)
}

/// Read-modify-write under compare-and-swap. A missing key is created
/// unconditionally (Envoy offers no create-if-absent); two workers creating the
/// same record at once lose one sample, which health tolerates.
fn update<S, T, F>(store: &S, cluster: &str, mut f: F) -> Result<(Health, T), StoreError>
where
    S: SharedStore + ?Sized,
    F: FnMut(&mut Health) -> T,
{
    let u = cas::update(
        store,
        &key(cluster),
        Unguarded::Overwrite,
        |bytes| bytes.and_then(Health::decode).unwrap_or_default(),
        Health::encode,
        |h| Change::Write(f(h)),
    )?;
    Ok((u.value, u.out))
}

/// A call was dispatched to `cluster`.
pub fn record_start<S: SharedStore + ?Sized>(
    store: &S,
    cluster: &str,
    now_ms: u64,
) -> Result<Recorded, StoreError> {
    move_in_flight(store, cluster, now_ms, true)
}

/// A call to `cluster` completed (call once per [`record_start`]). Successes
/// feed the latency averages; failures count toward ejection.
pub fn record_outcome<S: SharedStore + ?Sized>(
    store: &S,
    config: &RoutingConfig,
    cluster: &str,
    outcome: &CallSample,
    now_ms: u64,
) -> Result<Recorded, StoreError> {
    let half_life = config.ewma_half_life_ms;
    let (health, ejected) = update(store, cluster, |h| {
        h.heal_in_flight(now_ms);
        h.in_flight = h.in_flight.saturating_sub(1);
        h.in_flight_at_ms = now_ms;
        match outcome.result.verdict() {
            Verdict::Slow => {
                // It was at least this slow, and, outlasted past its hedge
                // delay, most likely one of its slow calls: it counts as
                // slow as those have been, or the hedges that cut its tail
                // would teach it a tail as short as the hedge delay.
                let tail = h
                    .calls
                    .and_then(|c| c.tail_mean(TAIL_SHARE))
                    .filter(|t| t.is_finite())
                    .map_or(0, |t| t as u64);
                let outlasted = CallSample {
                    latency_ms: outcome.latency_ms.max(tail),
                    ..*outcome
                };
                observe_speed(h, &outlasted, now_ms, half_life);
                false
            }
            Verdict::Success => {
                // Only successes measure speed: a refused connection fails
                // fast and would make a dead backend look like the best one.
                observe_speed(h, outcome, now_ms, half_life);
                observe_error(&mut h.errors, 0.0, now_ms, half_life);
                h.consecutive_failures = 0;
                h.forgive(config, now_ms);
                false
            }
            Verdict::Refused => {
                observe_error(&mut h.errors, 0.0, now_ms, half_life);
                h.consecutive_failures = 0;
                false
            }
            Verdict::Unknown => false,
            Verdict::Failure => {
                // Failures while ejected come from calls already under way or
                // from the all-ejected fallback. The ejection answers them: they
                // must neither stack ejections nor refill the error average the
                // ejection cleared, which would hold the cluster at the error
                // floor long after its ramp.
                if h.is_ejected(now_ms) {
                    return false;
                }
                observe_error(&mut h.errors, 1.0, now_ms, half_life);
                h.consecutive_failures = h.consecutive_failures.saturating_add(1);
                if h.consecutive_failures >= config.eject_after_failures {
                    h.eject(config, now_ms);
                    true
                } else {
                    false
                }
            }
        }
    })?;
    Ok(Recorded { ejected, health })
}

/// Output tokens that stand for the fixed part of a call's time (queue,
/// prefill, network): a backend whose fixed part is this many tokens' worth
/// of decoding is paced exactly, whatever its answers' lengths.
pub const FIXED_TOKENS: f64 = 32.0;
/// The answer length every non-streamed call is paced to.
pub const REFERENCE_TOKENS: f64 = 256.0;

/// A non-streamed call's time to the end as if its answer had been
/// [`REFERENCE_TOKENS`] long: time per output token plus a fixed part,
///
/// ```text
/// paced = latency × (FIXED_TOKENS + REFERENCE_TOKENS) / (FIXED_TOKENS + output_tokens)
/// ```
///
/// A backend taking `a + b × n` ms for `n` tokens is paced to
/// `b × (FIXED + REF)` for every `n` when `a = b × FIXED`, and within the
/// ratio of `a` to `b × FIXED` otherwise. Without a token count (no usage,
/// embeddings) the latency stands as it is.
pub fn paced_ms(latency_ms: f64, output_tokens: Option<u64>) -> f64 {
    match output_tokens {
        Some(n) if n > 0 => {
            latency_ms * (FIXED_TOKENS + REFERENCE_TOKENS) / (FIXED_TOKENS + n as f64)
        }
        _ => latency_ms,
    }
}

/// Folds a call's speed into the averages and the histogram of its kind.
fn observe_speed(h: &mut Health, outcome: &CallSample, now_ms: u64, half_life: f64) {
    let latency = outcome.latency_ms as f64;
    Ewma::observe(&mut h.latency, latency, now_ms, half_life);
    if let Some(t) = outcome.ttft_ms {
        Ewma::observe(&mut h.ttft, t as f64, now_ms, half_life);
    }
    match (outcome.streamed, outcome.ttft_ms) {
        (false, _) => {
            Histogram::observe(&mut h.calls, latency, now_ms, half_life);
            let paced = paced_ms(latency, outcome.output_tokens);
            Histogram::observe(&mut h.paced, paced, now_ms, half_life);
        }
        (true, Some(t)) => Histogram::observe(&mut h.streams, t as f64, now_ms, half_life),
        // A stream that sent no byte says nothing of its speed.
        (true, None) => {}
    }
}

/// A call counted by [`record_start`] was answered locally and never sent
/// (breaker, budget): it leaves the in-flight count and teaches nothing.
pub fn record_unsent<S: SharedStore + ?Sized>(
    store: &S,
    cluster: &str,
    now_ms: u64,
) -> Result<Recorded, StoreError> {
    move_in_flight(store, cluster, now_ms, false)
}

/// One more (`up`) or one fewer call in flight to `cluster`.
fn move_in_flight<S: SharedStore + ?Sized>(
    store: &S,
    cluster: &str,
    now_ms: u64,
    up: bool,
) -> Result<Recorded, StoreError> {
    let (health, ()) = update(store, cluster, |h| {
        h.heal_in_flight(now_ms);
        h.in_flight = if up {
            h.in_flight.saturating_add(1)
        } else {
            h.in_flight.saturating_sub(1)
        };
        h.in_flight_at_ms = now_ms;
    })?;
    Ok(Recorded {
        ejected: false,
        health,
    })
}

/// An active probe of `cluster` finished. A failed probe ejects the cluster at
/// once (a live server always answers its health path) and keeps an ejected
/// one out; `load` is stored when given.
pub fn record_probe<S: SharedStore + ?Sized>(
    store: &S,
    config: &RoutingConfig,
    cluster: &str,
    ok: bool,
    latency_ms: u64,
    load: Option<Load>,
    now_ms: u64,
) -> Result<Recorded, StoreError> {
    let (health, ejected) = update(store, cluster, |h| {
        h.probe = Some(ProbeRecord {
            ok,
            at_ms: now_ms,
            latency_ms,
        });
        if let Some(l) = load {
            h.load = Some(l.sanitized());
            h.load_at_ms = now_ms;
        }
        if ok {
            h.forgive(config, now_ms);
            false
        } else if h.is_ejected(now_ms) {
            // Still down: hold it out for another ejection period, without
            // doubling, which is kept for clusters that flap.
            let until = now_ms.saturating_add(Health::eject_ms(config, h.ejections.max(1)));
            h.ejected_until_ms = h.ejected_until_ms.max(until);
            h.recovering_since_ms = Some(h.ejected_until_ms);
            false
        } else {
            h.eject(config, now_ms);
            true
        }
    })?;
    Ok(Recorded { ejected, health })
}

/// Load signals read from a cluster's metrics path.
pub fn record_load<S: SharedStore + ?Sized>(
    store: &S,
    cluster: &str,
    load: Load,
    now_ms: u64,
) -> Result<Recorded, StoreError> {
    let (health, ()) = update(store, cluster, |h| {
        h.load = Some(load.sanitized());
        h.load_at_ms = now_ms;
    })?;
    Ok(Recorded {
        ejected: false,
        health,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{MemoryStore, Versioned};
    use std::cell::Cell;

    fn config() -> RoutingConfig {
        RoutingConfig::default()
    }

    fn ok(latency_ms: u64) -> CallSample {
        CallSample {
            result: CallResult::Status(200),
            latency_ms,
            ttft_ms: Some(latency_ms / 2),
            streamed: false,
            output_tokens: None,
        }
    }

    fn stream(latency_ms: u64, ttft_ms: Option<u64>) -> CallSample {
        CallSample {
            result: CallResult::Status(200),
            latency_ms,
            ttft_ms,
            streamed: true,
            output_tokens: None,
        }
    }

    fn fail(result: CallResult) -> CallSample {
        CallSample {
            result,
            latency_ms: 1,
            ttft_ms: None,
            streamed: false,
            output_tokens: None,
        }
    }

    #[test]
    fn key_carries_prefix_and_cluster() {
        assert_eq!(key("openai"), "llm_filter.routing.v4.health.openai");
    }

    #[test]
    fn istio_cluster_names_keep_health_of_their_own() {
        // Istio names clusters `direction|port|subset|host`: dots and pipes,
        // and names that differ only after a dot or a pipe.
        let (a, b) = ("outbound|80||api.openai.com", "outbound|80||api.openai.co");
        assert_eq!(
            key(a),
            "llm_filter.routing.v4.health.outbound|80||api.openai.com"
        );
        let s = MemoryStore::new();
        let c = config();
        record_start(&s, a, 1_000).unwrap();
        record_outcome(&s, &c, a, &ok(200), 1_200).unwrap();
        record_start(&s, b, 1_000).unwrap();
        assert_eq!(read(&s, a).unwrap().in_flight, 0);
        assert_eq!(read(&s, a).unwrap().latency.unwrap().value, 200.0);
        assert_eq!(read(&s, b).unwrap().in_flight, 1);
        assert!(read(&s, b).unwrap().latency.is_none());
    }

    #[test]
    fn outcomes_feed_averages_and_counters() {
        let s = MemoryStore::new();
        let c = config();
        assert_eq!(read(&s, "a"), None);
        record_start(&s, "a", 1_000).unwrap();
        let r = record_outcome(&s, &c, "a", &ok(200), 1_200).unwrap();
        assert!(!r.ejected);
        let h = read(&s, "a").unwrap();
        assert_eq!(h, r.health);
        assert_eq!(h.latency.unwrap().value, 200.0);
        assert_eq!(h.ttft.unwrap().value, 100.0);
        assert_eq!(h.errors.unwrap().value, 0.0);
        assert_eq!(h.in_flight, 0);

        // A 4xx is neither an error nor a latency sample.
        record_outcome(&s, &c, "a", &fail(CallResult::Status(400)), 1_300).unwrap();
        let h = read(&s, "a").unwrap();
        assert_eq!(h.latency.unwrap().value, 200.0);
        assert_eq!(h.errors.unwrap().value, 0.0);

        // Every failure kind raises the error rate and leaves latency alone.
        for (i, r) in [
            CallResult::Status(503),
            CallResult::Status(429),
            CallResult::Reset,
            CallResult::Timeout,
        ]
        .into_iter()
        .enumerate()
        {
            let s = MemoryStore::new();
            record_outcome(&s, &c, "b", &ok(100), 0).unwrap();
            record_outcome(&s, &c, "b", &fail(r), 10_000).unwrap();
            let h = read(&s, "b").unwrap();
            // The success and its prior (5 samples), a half-life old, weigh
            // 2.5 against the failure's 1.
            assert!((h.errors.unwrap().value - 1.0 / 3.5).abs() < 1e-9, "{i}");
            assert_eq!(h.latency.unwrap().value, 100.0);
            assert_eq!(h.consecutive_failures, 1);
        }
    }

    #[test]
    fn streams_learn_their_first_byte_apart_from_other_calls() {
        let s = MemoryStore::new();
        let c = config();
        // A steady 200 ms for whole calls; streams answer their first byte in
        // 50 ms but run for 8 s.
        for t in 0..10 {
            record_outcome(&s, &c, "a", &ok(200), t).unwrap();
            record_outcome(&s, &c, "a", &stream(8_000, Some(50)), t).unwrap();
        }
        // A stream that sent nothing teaches no speed.
        record_outcome(&s, &c, "a", &stream(3, None), 10).unwrap();
        let h = read(&s, "a").unwrap();
        let (calls, streams) = (h.calls.unwrap(), h.streams.unwrap());
        assert_eq!(
            (calls.mean(), calls.tail_mean(0.1)),
            (Some(200.0), Some(200.0))
        );
        assert_eq!(
            (streams.mean(), streams.tail_mean(0.1)),
            (Some(50.0), Some(50.0))
        );
        assert!((calls.total() - 10.0).abs() < 1e-2, "{calls:?}");
        assert!((streams.total() - 10.0).abs() < 1e-2, "{streams:?}");
        // A stream whose first byte is slow now and then: only the stream tail moves.
        for t in 0..10 {
            let ttft = if t == 9 { 4_000 } else { 50 };
            record_outcome(&s, &c, "a", &stream(8_000, Some(ttft)), 20 + t).unwrap();
        }
        let h = read(&s, "a").unwrap();
        assert_eq!(h.calls.unwrap().tail_mean(0.1), Some(200.0));
        let tail = h.streams.unwrap().tail_mean(0.1).unwrap();
        assert!((1_990.0..2_030.0).contains(&tail), "{tail}");
        // Failures feed neither.
        record_outcome(&s, &c, "a", &fail(CallResult::Status(503)), 40).unwrap();
        assert_eq!(read(&s, "a").unwrap().calls, h.calls);
    }

    #[test]
    fn in_flight_never_underflows_and_heals() {
        let s = MemoryStore::new();
        let c = config();
        record_outcome(&s, &c, "a", &ok(1), 0).unwrap();
        assert_eq!(read(&s, "a").unwrap().in_flight, 0);
        for t in 0..3 {
            record_start(&s, "a", t).unwrap();
        }
        assert_eq!(read(&s, "a").unwrap().in_flight, 3);
        // Nobody completed those calls for ten minutes: a leak, weighing
        // nothing at once and reset by the next write.
        let h = read(&s, "a").unwrap();
        assert_eq!(h.in_flight_at(2 + IN_FLIGHT_STALE_MS), 3);
        assert_eq!(h.in_flight_at(2 + IN_FLIGHT_STALE_MS + 1), 0);
        let r = record_start(&s, "a", 2 + IN_FLIGHT_STALE_MS + 1).unwrap();
        assert_eq!(r.health.in_flight, 1);
        let h = Health {
            in_flight: MAX_IN_FLIGHT + 1,
            ..Health::default()
        };
        assert_eq!(h.in_flight_at(0), 0);
    }

    #[test]
    fn consecutive_failures_eject_with_growing_time() {
        let s = MemoryStore::new();
        let c = config(); // 3 failures, 10 s doubling to 300 s, 20 s ramp
        let mut now = 1_000;
        let f = fail(CallResult::Status(502));
        assert!(!record_outcome(&s, &c, "a", &f, now).unwrap().ejected);
        assert!(!record_outcome(&s, &c, "a", &f, now).unwrap().ejected);
        let r = record_outcome(&s, &c, "a", &f, now).unwrap();
        assert!(r.ejected);
        assert_eq!(r.health.ejected_until_ms, now + 10_000);
        assert_eq!(r.health.recovering_since_ms, Some(now + 10_000));
        assert_eq!(r.health.consecutive_failures, 0);
        assert!(r.health.is_ejected(now + 9_999));
        assert!(!r.health.is_ejected(now + 10_000));

        // Failures of calls still under way do not stack another ejection,
        // nor refill the error average the ejection cleared.
        for _ in 0..5 {
            assert!(!record_outcome(&s, &c, "a", &f, now + 1).unwrap().ejected);
        }
        let h = read(&s, "a").unwrap();
        assert_eq!(h.ejected_until_ms, now + 10_000);
        assert_eq!(h.errors, None);
        assert_eq!(h.consecutive_failures, 0);

        // Back, fails again at once: ejected for twice as long, and so on up to the cap.
        let mut want = 20_000;
        for _ in 0..8 {
            now = read(&s, "a").unwrap().ejected_until_ms;
            let mut r = None;
            for _ in 0..3 {
                r = Some(record_outcome(&s, &c, "a", &f, now).unwrap());
            }
            let r = r.unwrap();
            assert!(r.ejected);
            assert_eq!(r.health.ejected_until_ms - now, want);
            want = (want * 2).min(300_000);
        }

        // A long healthy spell forgives past ejections.
        let h = read(&s, "a").unwrap();
        let later = h.ejected_until_ms + c.ramp_ms + c.max_eject_ms;
        let r = record_outcome(&s, &c, "a", &ok(10), later).unwrap();
        assert_eq!(r.health.ejections, 0);
        assert_eq!(r.health.recovering_since_ms, None);
        for _ in 0..3 {
            record_outcome(&s, &c, "a", &f, later + 1).unwrap();
        }
        assert_eq!(read(&s, "a").unwrap().ejected_until_ms, later + 1 + 10_000);
    }

    #[test]
    fn cancelled_and_unsent_calls_only_leave_the_in_flight_count() {
        let s = MemoryStore::new();
        let c = config();
        for t in 0..2 {
            record_start(&s, "a", t).unwrap();
        }
        for _ in 0..5 {
            let r = record_outcome(&s, &c, "a", &fail(CallResult::Cancelled), 10).unwrap();
            assert!(!r.ejected);
        }
        let h = read(&s, "a").unwrap();
        assert_eq!((h.in_flight, h.consecutive_failures), (0, 0));
        assert_eq!((h.latency, h.errors), (None, None));
        assert_eq!(CallResult::Cancelled.label(), "cancelled");
        record_start(&s, "a", 20).unwrap();
        let r = record_unsent(&s, "a", 30).unwrap();
        assert_eq!((r.health.in_flight, r.health.in_flight_at_ms), (0, 30));
        assert_eq!(record_unsent(&s, "a", 40).unwrap().health.in_flight, 0);
    }

    #[test]
    fn one_failure_on_a_fresh_cluster_costs_part_of_its_weight() {
        let s = MemoryStore::new();
        let c = config();
        let r = record_outcome(&s, &c, "a", &fail(CallResult::Status(503)), 0).unwrap();
        let e = r.health.errors.unwrap();
        assert!((e.value - 0.2).abs() < 1e-12, "{e:?}");
        let f = super::super::weight::error_factor(e.value);
        assert!((0.4..0.42).contains(&f), "{f}");
        // A few successes and it is almost whole again.
        for _ in 0..5 {
            record_outcome(&s, &c, "a", &ok(10), 0).unwrap();
        }
        let e = read(&s, "a").unwrap().errors.unwrap();
        assert!(e.value < 0.11, "{e:?}");
    }

    #[test]
    fn a_success_breaks_the_run() {
        let s = MemoryStore::new();
        let c = config();
        let f = fail(CallResult::Timeout);
        for _ in 0..10 {
            record_outcome(&s, &c, "a", &f, 0).unwrap();
            record_outcome(&s, &c, "a", &f, 0).unwrap();
            record_outcome(&s, &c, "a", &ok(5), 0).unwrap();
        }
        assert!(!read(&s, "a").unwrap().is_ejected(0));
    }

    #[test]
    fn failed_probe_ejects_and_holds_out() {
        let s = MemoryStore::new();
        let c = config();
        let r = record_probe(&s, &c, "a", false, 2_000, None, 1_000).unwrap();
        assert!(r.ejected);
        assert_eq!(r.health.ejected_until_ms, 11_000);
        assert_eq!(
            r.health.probe,
            Some(ProbeRecord {
                ok: false,
                at_ms: 1_000,
                latency_ms: 2_000
            })
        );
        // Still failing: held out from the last failure on, without doubling.
        let r = record_probe(&s, &c, "a", false, 2_000, None, 6_000).unwrap();
        assert!(!r.ejected);
        assert_eq!(r.health.ejected_until_ms, 16_000);
        assert_eq!(r.health.recovering_since_ms, Some(16_000));
        assert_eq!(r.health.ejections, 1);
        // Answering again does not cut the ejection short.
        let r = record_probe(&s, &c, "a", true, 5, None, 11_000).unwrap();
        assert!(r.health.is_ejected(11_000));
        assert!(!r.health.is_ejected(16_000));
    }

    #[test]
    fn probe_stores_load() {
        let s = MemoryStore::new();
        let c = config();
        let load = Load {
            waiting: Some(f64::INFINITY),
            kv_usage: Some(1.5),
        };
        let r = record_probe(&s, &c, "a", true, 5, Some(load), 7).unwrap();
        assert_eq!(
            r.health.load,
            Some(Load {
                waiting: None,
                kv_usage: Some(1.0)
            })
        );
        assert_eq!(r.health.load_at_ms, 7);
        let r = record_load(
            &s,
            "a",
            Load {
                waiting: Some(-3.0),
                kv_usage: None,
            },
            9,
        )
        .unwrap();
        assert_eq!(r.health.load.unwrap().waiting, Some(0.0));
        assert_eq!(r.health.load_at_ms, 9);
        assert!(r.health.probe.unwrap().ok);
    }

    #[test]
    fn unreadable_records_start_afresh() {
        let s = MemoryStore::new();
        s.set(&key("a"), b"\xff\xff garbage", None).unwrap();
        assert_eq!(read(&s, "a"), None);
        record_start(&s, "a", 0).unwrap();
        assert_eq!(read(&s, "a").unwrap().in_flight, 1);
        assert_eq!(Health::decode(b""), None);
    }

    #[test]
    fn decoding_drops_non_finite_floats() {
        let h = Health {
            latency: Some(Ewma::new(f64::NAN, 1)),
            ttft: Some(Ewma::new(f64::INFINITY, 1)),
            errors: Some(Ewma {
                value: 7.0,
                at_ms: 1,
                weight: f64::NAN,
            }),
            load: Some(Load {
                waiting: Some(f64::NAN),
                kv_usage: Some(-1.0),
            }),
            calls: Some(Histogram {
                counts: [f64::NAN; super::super::ewma::BUCKETS],
                ..Histogram::default()
            }),
            streams: Some(Histogram {
                sums: [-1.0; super::super::ewma::BUCKETS],
                ..Histogram::default()
            }),
            ..Health::default()
        };
        let d = Health::decode(&h.encode().unwrap()).unwrap();
        assert_eq!((d.calls, d.streams), (None, None));
        assert_eq!(d.latency, None);
        assert_eq!(d.ttft, None);
        assert_eq!(d.errors.unwrap().value, 1.0);
        assert_eq!(d.errors.unwrap().weight, 1.0);
        assert_eq!(
            d.load,
            Some(Load {
                waiting: None,
                kv_usage: Some(0.0)
            })
        );
    }

    /// A store where another worker writes between this worker's read and
    /// write, `races` times.
    struct Contended<'a> {
        inner: &'a MemoryStore,
        races: Cell<usize>,
    }

    impl SharedStore for Contended<'_> {
        fn get(&self, key: &str) -> Result<Versioned, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            if self.races.get() > 0 {
                self.races.set(self.races.get() - 1);
                record_start(self.inner, "a", 0)?;
            }
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn cas_retries_keep_every_update() {
        let inner = MemoryStore::new();
        record_start(&inner, "a", 0).unwrap();
        let s = Contended {
            inner: &inner,
            races: Cell::new(3),
        };
        record_start(&s, "a", 0).unwrap();
        assert_eq!(read(&inner, "a").unwrap().in_flight, 5);

        // Contention beyond the bound gives up with the expected error.
        let s = Contended {
            inner: &inner,
            races: Cell::new(100),
        };
        assert_eq!(record_start(&s, "a", 0), Err(StoreError::CasMismatch));
    }

    #[test]
    fn an_outlasted_call_counts_as_slow_as_the_slow_calls_were() {
        let (s, c) = (MemoryStore::new(), config());
        // No history: it was at least as slow as the hedge's win.
        let outlasted = |ms| CallSample {
            result: CallResult::Outlasted,
            ..ok(ms)
        };
        record_outcome(&s, &c, "fresh", &outlasted(600), 1_000).unwrap();
        let fresh = read(&s, "fresh").unwrap();
        assert_eq!(fresh.calls.and_then(|h| h.mean()), Some(600.0));
        // Nine calls in ten at 100 ms, the tenth at 3 s: a hedge that won
        // after 600 ms teaches the 3 s the slow ones took, not 600 ms.
        for i in 0..50 {
            let ms = if i % 10 == 9 { 3_000 } else { 100 };
            record_outcome(&s, &c, "tail", &ok(ms), 1_000).unwrap();
        }
        let before = read(&s, "tail").unwrap().calls.unwrap();
        record_outcome(&s, &c, "tail", &outlasted(600), 1_000).unwrap();
        let after = read(&s, "tail").unwrap().calls.unwrap();
        assert_eq!(after.total(), before.total() + 1.0);
        let tail = |h: &Histogram| h.tail_mean(TAIL_SHARE).unwrap();
        assert!(tail(&after) > 2_900.0, "{}", tail(&after));
        assert!(after.mean() > before.mean());
    }

    #[test]
    fn a_call_is_paced_per_output_token_plus_a_fixed_part() {
        // 2 ms a token and a fixed part of 32 tokens' worth: paced alike
        // whatever the answer's length.
        let speed = |n: u64| 64.0 + 2.0 * n as f64;
        for n in [1, 10, 256, 4_000] {
            let p = paced_ms(speed(n), Some(n));
            assert!((p - 576.0).abs() < 1e-9, "{n}: {p}");
        }
        assert_eq!(paced_ms(300.0, None), 300.0);
        assert_eq!(paced_ms(300.0, Some(0)), 300.0);
        assert_eq!(
            paced_ms(300.0, Some(u64::MAX)),
            300.0 * 288.0 / (32.0 + u64::MAX as f64)
        );
    }

    #[test]
    fn a_non_streamed_call_feeds_both_its_time_and_its_pace() {
        let s = MemoryStore::new();
        let c = RoutingConfig::default();
        let call = CallSample {
            result: CallResult::Status(200),
            latency_ms: 1_088,
            ttft_ms: Some(1_088),
            streamed: false,
            output_tokens: Some(512),
        };
        let h = record_outcome(&s, &c, "a", &call, 0).unwrap().health;
        assert_eq!(h.calls.and_then(|x| x.mean()), Some(1_088.0));
        assert_eq!(h.paced.and_then(|x| x.mean()), Some(576.0));
        // A stream is judged by its first byte alone.
        let stream = CallSample {
            streamed: true,
            ttft_ms: Some(40),
            ..call
        };
        let h = record_outcome(&s, &c, "b", &stream, 0).unwrap().health;
        assert!(h.paced.is_none() && h.calls.is_none());
        assert_eq!(h.streams.and_then(|x| x.mean()), Some(40.0));
    }
}
