//! Timeout budgets: the total time a caller can wait drives every decision about
//! its call — the Envoy timeouts and retries planned for it, and a tiered breaker
//! that sheds low-priority traffic first as backends eat their callers' budgets.

pub mod admission;
pub mod breaker;
pub mod config;
pub mod learn;
pub mod parse;
pub mod plan;
pub mod reply;

pub use admission::{admit, breaker_sheds, Admission, Ask, DEFAULT_BREAKER};
pub use breaker::{Admit, BreakerState, Sample, Tier};
pub use config::{BudgetConfig, RawBudgetConfig, StreamingMode};
pub use plan::{Exhausted, Plan, PlanInput};
pub use reply::{LocalReply, ReplyKind};

use crate::host::Metrics;
use crate::metrics::{self, name};
use crate::priority::Priority;

/// Why a call was not forwarded, as it appears in metric labels and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The backend's budget pressure put the breaker in the shed tier.
    Pressure,
    /// The backend's budget pressure put the breaker in the reject tier.
    CircuitOpen,
    /// The caller's budget was spent before the call could be forwarded.
    BudgetExhausted,
}

impl Reason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pressure => "pressure",
            Self::CircuitOpen => "circuit_open",
            Self::BudgetExhausted => "budget_exhausted",
        }
    }
}

/// Counts a breaker refusal by `priority` and `reason`; a pass counts nothing.
pub fn count_admit(m: &mut dyn Metrics, admit: &Admit, priority: Priority) {
    let (metric, reason) = match admit {
        Admit::Pass => return,
        Admit::Shed { reason } => (metrics::BUDGET_SHED, reason),
        Admit::Reject { reason } => (metrics::BUDGET_REJECTED, reason),
    };
    m.counter(
        &name(
            metric,
            &[("priority", priority.as_str()), ("reason", reason.as_str())],
        ),
        1,
    );
}

/// Counts a call refused because its budget was spent before forwarding.
pub fn count_exhausted(m: &mut dyn Metrics, priority: Priority) {
    m.counter(
        &name(
            metrics::BUDGET_REJECTED,
            &[
                ("priority", priority.as_str()),
                ("reason", Reason::BudgetExhausted.as_str()),
            ],
        ),
        1,
    );
}

/// Records the retries a plan allows (and a plan denied retries by the retry
/// budget), by `cluster` (a bounded label value).
pub fn count_plan(m: &mut dyn Metrics, cluster: &str, plan: &Plan) {
    if plan.max_retries > 0 {
        m.counter(
            &name(metrics::BUDGET_RETRIES_PLANNED, &[("cluster", cluster)]),
            u64::from(plan.max_retries),
        );
    }
    if plan.retry_budget_spent {
        m.counter(
            &name(metrics::BUDGET_RETRY_BUDGET_SPENT, &[("cluster", cluster)]),
            1,
        );
    }
}

/// Publishes a backend's breaker tier (0 pass, 1 shed, 2 reject) and pressure.
pub fn set_breaker_gauges(m: &mut dyn Metrics, cluster: &str, tier: Tier, pressure: f64) {
    m.gauge(
        &name(metrics::BUDGET_BREAKER_TIER, &[("cluster", cluster)]),
        tier.gauge(),
    );
    m.gauge(
        &name(metrics::BUDGET_BREAKER_PRESSURE, &[("cluster", cluster)]),
        breaker::permille(pressure),
    );
}

/// Records how much of its budget a completed call used, in per-mille.
pub fn observe_used(m: &mut dyn Metrics, priority: Priority, used_permille: u32) {
    m.histogram(
        &name(metrics::BUDGET_USED, &[("priority", priority.as_str())]),
        u64::from(used_permille),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryMetrics;

    #[test]
    fn metrics_are_labelled() {
        let mut m = MemoryMetrics::default();
        count_admit(&mut m, &Admit::Pass, Priority::P2);
        assert!(m.counters.is_empty());
        count_admit(
            &mut m,
            &Admit::Shed {
                reason: Reason::Pressure,
            },
            Priority::P2,
        );
        count_admit(
            &mut m,
            &Admit::Reject {
                reason: Reason::CircuitOpen,
            },
            Priority::P1,
        );
        count_exhausted(&mut m, Priority::P0);
        assert_eq!(
            m.counters["llm_filter_budget_shed_total.priority.P2.reason.pressure"],
            1
        );
        assert_eq!(
            m.counters["llm_filter_budget_rejected_total.priority.P1.reason.circuit_open"],
            1
        );
        assert_eq!(
            m.counters["llm_filter_budget_rejected_total.priority.P0.reason.budget_exhausted"],
            1
        );

        let plan = Plan {
            total_ms: 1000,
            per_try_ms: None,
            max_retries: 2,
            retry_budget_spent: false,
        };
        count_plan(&mut m, "openai", &plan);
        count_plan(
            &mut m,
            "openai",
            &Plan {
                max_retries: 0,
                retry_budget_spent: true,
                ..plan
            },
        );
        assert_eq!(
            m.counters["llm_filter_budget_retries_planned_total.cluster.openai"],
            2
        );
        assert_eq!(
            m.counters["llm_filter_budget_retry_budget_spent_total.cluster.openai"],
            1
        );

        set_breaker_gauges(&mut m, "openai", Tier::Reject, 0.95);
        assert_eq!(m.gauges["llm_filter_budget_breaker_tier.cluster.openai"], 2);
        assert_eq!(
            m.gauges["llm_filter_budget_breaker_pressure_permille.cluster.openai"],
            950
        );
        observe_used(&mut m, Priority::P1, 420);
        assert_eq!(
            m.histograms["llm_filter_budget_used_permille.priority.P1"],
            [420]
        );
    }
}
