//! What routing learns from calls: a dispatched call joins its cluster's
//! in-flight count, and a finished one feeds the cluster's health (latency,
//! errors, ejection) and the per-cluster call metrics.

use super::health::{self, Health};
use super::outcome::{CallResult, CallSample};
use super::RoutingConfig;
use crate::host::{Metrics, SharedStore};
use crate::metrics::{self as names, internal_error};
use crate::summary::{End, Try};
use crate::usage::Usage;

/// How routing sees a call's end; `None` when the call never left (answered
/// locally after it was routed).
pub fn result_of(end: End) -> Option<CallResult> {
    match end {
        End::Local(_) => None,
        // A backend without its credential fails calls: load moves away.
        End::Answered(s) | End::NoCredential(s) => Some(CallResult::Status(s)),
        End::TimedOut(_) => Some(CallResult::Timeout),
        End::Reset(_) => Some(CallResult::Reset),
        // Who cut a started answer, the backend or the client, is not known.
        End::Abandoned | End::Cut(_) => Some(CallResult::Cancelled),
        End::Outlasted => Some(CallResult::Outlasted),
    }
}

/// A call was dispatched to `cluster`.
pub fn started(store: &dyn SharedStore, m: &mut dyn Metrics, cluster: &str, now_ms: u64) {
    if let Ok(r) = health::record_start(store, cluster, now_ms) {
        set_in_flight(m, cluster, &r.health);
    }
}

/// A routed try of a call of `model` (its label) ended: the cluster's health
/// learns from it, or, when the call was answered locally, it only leaves
/// the in-flight count.
pub fn ended(
    store: &dyn SharedStore,
    cfg: &RoutingConfig,
    m: &mut dyn Metrics,
    model: &str,
    t: &Try<'_>,
) {
    let Some(cluster) = t.cluster else {
        return;
    };
    let now_ms = t.ended_ms;
    let Some(result) = result_of(t.end) else {
        if let Ok(r) = health::record_unsent(store, cluster, now_ms) {
            set_in_flight(m, cluster, &r.health);
        }
        return;
    };
    let elapsed = t.elapsed_ms();
    m.counter(
        &names::name(
            names::ROUTING_CALLS,
            &[(names::LLM_CLUSTER, cluster), ("outcome", result.label())],
        ),
        1,
    );
    m.histogram(
        &names::name(names::ROUTING_LATENCY, &[(names::LLM_CLUSTER, cluster)]),
        elapsed,
    );
    if let Some(u) = t.usage {
        count_tokens(m, model, cluster, &u);
    }
    let outcome = CallSample {
        result,
        latency_ms: elapsed,
        ttft_ms: t.first_byte_after_ms(),
        streamed: t.streamed,
        output_tokens: t.usage.map(|u| u.completion_tokens).filter(|n| *n > 0),
    };
    match health::record_outcome(store, cfg, cluster, &outcome, now_ms) {
        Ok(r) => {
            if r.ejected {
                m.counter(
                    &names::name(names::ROUTING_EJECTIONS, &[(names::LLM_CLUSTER, cluster)]),
                    1,
                );
            }
            set_in_flight(m, cluster, &r.health);
        }
        Err(_) => internal_error(m, "routing_record"),
    }
}

/// The tokens a backend reported for a model: the input, the part of it the
/// provider's prompt cache held, the output.
fn count_tokens(m: &mut dyn Metrics, model: &str, cluster: &str, u: &Usage) {
    for (kind, n) in [
        ("input", u.prompt_tokens),
        ("cached_input", u.cached_tokens),
        ("cache_creation_input", u.cache_write_tokens),
        ("output", u.completion_tokens),
    ] {
        if n > 0 {
            let labels = [
                ("model", model),
                (names::LLM_CLUSTER, cluster),
                ("token_type", kind),
            ];
            m.counter(&names::name(names::ROUTING_TOKENS, &labels), n);
        }
    }
}

/// Calls in flight to `cluster` across workers, as the record just written says.
fn set_in_flight(m: &mut dyn Metrics, cluster: &str, h: &Health) {
    m.gauge(
        &names::name(names::ROUTING_IN_FLIGHT, &[(names::LLM_CLUSTER, cluster)]),
        i64::from(h.in_flight),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{MemoryMetrics, MemoryStore};

    #[test]
    fn every_end_maps_to_one_result() {
        for (end, want) in [
            (End::Local(200), None),
            (End::Local(503), None),
            (End::Answered(429), Some(CallResult::Status(429))),
            (End::NoCredential(503), Some(CallResult::Status(503))),
            (End::TimedOut(504), Some(CallResult::Timeout)),
            (End::Reset(503), Some(CallResult::Reset)),
            (End::Abandoned, Some(CallResult::Cancelled)),
            (End::Cut(200), Some(CallResult::Cancelled)),
        ] {
            assert_eq!(result_of(end), want, "{end:?}");
        }
    }

    #[test]
    fn a_local_answer_only_leaves_the_in_flight_count() {
        let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        let cfg = RoutingConfig::default();
        started(&store, &mut m, "a", 0);
        assert_eq!(
            m.gauges["llm_filter_routing_in_flightllm_cluster=.=a;.;"],
            1
        );
        let call = Try {
            cluster: Some("a"),
            ..Try::ended(End::Local(503))
        };
        ended(&store, &cfg, &mut m, "m", &call);
        assert_eq!(
            m.gauges["llm_filter_routing_in_flightllm_cluster=.=a;.;"],
            0
        );
        assert!(m.counters.is_empty());
    }

    #[test]
    fn a_finished_call_is_counted_and_learnt() {
        let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        let cfg = RoutingConfig::default();
        started(&store, &mut m, "a", 0);
        let call = Try {
            cluster: Some("a"),
            ended_ms: 40,
            ..Try::ended(End::Answered(200))
        };
        ended(&store, &cfg, &mut m, "m", &call);
        assert_eq!(
            m.counters["llm_filter_routing_calls_totalllm_cluster=.=a;.;outcome=.=success;.;"],
            1
        );
        assert_eq!(
            m.histograms["llm_filter_routing_call_duration_msllm_cluster=.=a;.;"],
            [40]
        );
        // No usage, no token counts.
        assert!(!m
            .counters
            .keys()
            .any(|k| k.starts_with(names::ROUTING_TOKENS)));
        let h = health::read(&store, "a").unwrap();
        assert_eq!(h.in_flight, 0);
        assert!(h.latency.is_some());
        assert!(h.calls.is_some() && h.streams.is_none());
        // A stream teaches the stream tail, by its first byte.
        started(&store, &mut m, "a", 50);
        let call = Try {
            cluster: Some("a"),
            started_ms: 50,
            first_byte_ms: Some(80),
            ended_ms: 900,
            streamed: true,
            ..Try::ended(End::Answered(200))
        };
        ended(&store, &cfg, &mut m, "m", &call);
        let streams = health::read(&store, "a").unwrap().streams.unwrap();
        assert_eq!(streams.mean(), Some(30.0));
    }

    #[test]
    fn a_backends_tokens_are_counted_by_model_and_cluster() {
        let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        let cfg = RoutingConfig::default();
        started(&store, &mut m, "a", 0);
        let call = Try {
            cluster: Some("a"),
            usage: Some(Usage {
                prompt_tokens: 100,
                completion_tokens: 7,
                cached_tokens: 64,
                ..Usage::default()
            }),
            ..Try::ended(End::Answered(200))
        };
        ended(&store, &cfg, &mut m, "m", &call);
        for (kind, n) in [("input", 100), ("cached_input", 64), ("output", 7)] {
            let name = format!(
                "llm_filter_routing_tokens_totalmodel=.=m;.;llm_cluster=.=a;.;token_type=.={kind};.;"
            );
            assert_eq!(m.counters[&name], n, "{name}");
        }
        // A cache that held nothing is not a series of zeros.
        started(&store, &mut m, "b", 0);
        let call = Try {
            cluster: Some("b"),
            usage: Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 1,
                cached_tokens: 0,
                ..Usage::default()
            }),
            ..Try::ended(End::Answered(200))
        };
        ended(&store, &cfg, &mut m, "m", &call);
        assert!(!m.counters.contains_key(
            "llm_filter_routing_tokens_totalmodel=.=m;.;llm_cluster=.=b;.;token_type=.=cached_input;.;"
        ));
    }
}
