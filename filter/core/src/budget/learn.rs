//! What the budget breaker learns from a finished call: how much of its
//! caller's budget the backend ate, and the window's new tier and pressure.

use super::breaker::Tier;
use super::breaker::{self, Sample};
use super::{BudgetConfig, StreamingMode};
use crate::host::{Metrics, SharedStore};
use crate::metrics::{self, internal_error};
use crate::priority::Priority;
use crate::summary::{End, Try};

/// Whether the backend failed the caller, as the breaker counts it; `None`
/// when the call teaches the breaker nothing (answered locally, or the client
/// left: that says nothing about the backend's pressure).
pub fn failed(end: End) -> Option<bool> {
    match end {
        End::Local(_) | End::Abandoned | End::Outlasted | End::Cut(_) => None,
        // Refused at once for want of the mesh's credential: the backend's
        // pressure is not known. Counted as a failure, a credential outage
        // would shed and then open the circuit, and keep it open a window
        // after the credential is back.
        End::NoCredential(_) => None,
        End::TimedOut(_) => Some(true),
        // A 5xx (Envoy's own 503 on a reset included) ate the caller's wait;
        // a 4xx, 429 included, was answered.
        End::Answered(s) | End::Reset(s) => Some(!(100..500).contains(&s)),
    }
}

/// The budget a call used, ms. A stream's budget is spent waiting for its
/// headers (see `budget.streaming`); the stream itself may run long.
pub fn used_ms(t: &Try<'_>, cfg: &BudgetConfig) -> u64 {
    let until = match (t.streamed, cfg.streaming) {
        (true, StreamingMode::UntilHeaders) => t.response_headers_ms,
        _ => None,
    };
    until.unwrap_or(t.ended_ms).saturating_sub(t.started_ms)
}

/// The breaker sample of a try, `None` when it teaches nothing.
pub fn sample_of(t: &Try<'_>, cfg: &BudgetConfig) -> Option<Sample> {
    let failed = failed(t.end)?;
    let retries =
        breaker::retries_made(t.attempts, t.planned_retries, failed).saturating_add(t.failovers);
    Some(Sample::new(used_ms(t, cfg), t.budget_ms, failed, retries))
}

/// A try of a call of `priority` that went upstream under a breaker ended:
/// the budget it used is observed and its breaker window learns from it.
pub fn ended(
    store: &dyn SharedStore,
    cfg: &BudgetConfig,
    m: &mut dyn Metrics,
    priority: Priority,
    t: &Try<'_>,
) {
    let Some(name) = t.breaker else {
        return;
    };
    let Some(sample) = sample_of(t, cfg) else {
        return;
    };
    observe_used(
        m,
        priority,
        breaker::used_permille(used_ms(t, cfg), t.budget_ms),
    );
    match breaker::record(store, name, t.ended_ms, sample, cfg) {
        Ok(state) => set_breaker_gauges(
            m,
            name,
            state.tier(t.ended_ms, cfg),
            state.pressure(t.ended_ms, cfg),
        ),
        Err(_) => internal_error(m, "breaker_record"),
    }
}

/// Publishes a backend's breaker tier (0 pass, 1 shed, 2 reject) and pressure.
fn set_breaker_gauges(m: &mut dyn Metrics, cluster: &str, tier: Tier, pressure: f64) {
    let labels = [(metrics::LLM_CLUSTER, cluster)];
    m.gauge_with(metrics::BUDGET_BREAKER_TIER, &labels, tier.gauge());
    let pressure = breaker::permille(pressure);
    m.gauge_with(metrics::BUDGET_BREAKER_PRESSURE, &labels, pressure);
}

/// Records how much of its budget a completed call used, in per-mille.
fn observe_used(m: &mut dyn Metrics, priority: Priority, used_permille: u32) {
    let labels = [("priority", priority.as_str())];
    m.histogram_with(metrics::BUDGET_USED, &labels, u64::from(used_permille));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{MemoryMetrics, MemoryStore};

    #[test]
    fn breaker_gauges_and_budget_used_are_labelled() {
        let mut m = MemoryMetrics::default();
        set_breaker_gauges(&mut m, "openai", Tier::Reject, 0.95);
        assert_eq!(
            m.gauges["llm_filter_budget_breaker_tierllm_cluster=.=openai;.;"],
            2
        );
        assert_eq!(
            m.gauges["llm_filter_budget_breaker_pressure_permillellm_cluster=.=openai;.;"],
            950
        );
        observe_used(&mut m, Priority::P1, 420);
        assert_eq!(
            m.histograms["llm_filter_budget_used_permillepriority=.=P1;.;"],
            [420]
        );
    }

    #[test]
    fn every_end_maps_to_one_verdict() {
        for (end, want) in [
            (End::Local(200), None),
            (End::Local(503), None),
            (End::Abandoned, None),
            (End::Cut(200), None),
            (End::Answered(200), Some(false)),
            (End::Answered(429), Some(false)),
            (End::Answered(404), Some(false)),
            (End::Answered(502), Some(true)),
            (End::Answered(499), Some(false)),
            (End::Answered(0), Some(true)),
            (End::NoCredential(503), None),
            (End::TimedOut(504), Some(true)),
            (End::Reset(503), Some(true)),
        ] {
            assert_eq!(failed(end), want, "{end:?}");
        }
    }

    #[test]
    fn a_stream_spends_its_budget_until_its_headers() {
        let cfg = BudgetConfig::default();
        let call = Try {
            streamed: true,
            started_ms: 100,
            response_headers_ms: Some(300),
            ended_ms: 5_000,
            ..Try::ended(End::Answered(200))
        };
        let want = match cfg.streaming {
            StreamingMode::UntilHeaders => 200,
            _ => 4_900,
        };
        assert_eq!(used_ms(&call, &cfg), want);
        let plain = Try {
            streamed: false,
            ..call
        };
        assert_eq!(used_ms(&plain, &cfg), 4_900);
    }

    #[test]
    fn only_calls_under_a_breaker_that_teach_something_are_recorded() {
        let cfg = BudgetConfig::default();
        let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
        for call in [
            Try::ended(End::Answered(200)),
            Try {
                breaker: Some("b"),
                ..Try::ended(End::Abandoned)
            },
        ] {
            ended(&store, &cfg, &mut m, Priority::P1, &call);
        }
        assert!(store.is_empty());
        let call = Try {
            breaker: Some("b"),
            budget_ms: 1_000,
            ended_ms: 250,
            ..Try::ended(End::Answered(200))
        };
        ended(&store, &cfg, &mut m, Priority::P1, &call);
        assert_eq!(
            m.histograms["llm_filter_budget_used_permillepriority=.=P1;.;"],
            [250]
        );
        assert!(m
            .gauges
            .contains_key("llm_filter_budget_breaker_tierllm_cluster=.=b;.;"));
        assert_eq!(store.len(), 1);
    }
}
