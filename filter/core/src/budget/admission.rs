//! The budget's decision at the start of a call: may it go upstream under its
//! breaker, and with which Envoy timeouts and retries.

use super::breaker::Reason;
use super::breaker::{self, BreakerState};
use super::plan::{self, Exhausted, PlanInput};
use super::reply::{self, LocalReply};
use super::{Admit, BudgetConfig, Plan, Tier};
use crate::dialect::answer::ReplyKind;
use crate::host::{Metrics, Random, SharedStore};
use crate::metrics::{self, internal_error, name};
use crate::priority::Priority;

/// Breaker name of calls that routing did not place on a cluster.
pub const DEFAULT_BREAKER: &str = "default";

/// What the budget needs to know of a call about to go upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The breaker the call goes under (its cluster, or [`DEFAULT_BREAKER`]).
    pub breaker: &'a str,
    /// The call's priority.
    pub priority: Priority,
    /// The call streams (or may: the body was not read).
    pub streaming: bool,
    /// The cluster's typical latency (time to first byte for streams), ms.
    pub observed_ms: Option<u64>,
    /// What is left of the caller's budget, ms.
    pub remaining_ms: u64,
    /// Another backend takes the call if this one fails it.
    pub failover: bool,
    /// Now, ms since the epoch.
    pub now_ms: u64,
}

/// The budget's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The call must not go upstream: answer it with this reply.
    Refused(LocalReply),
    /// The call goes upstream with these router headers set (`Some`) or
    /// removed (`None`).
    Planned {
        /// Router header updates.
        headers: Vec<(&'static str, Option<String>)>,
        /// Retries the plan lets Envoy make.
        retries: u32,
    },
}

/// Breaker admission, then the Envoy timeout and retry plan; every refusal
/// and plan is counted here. `read`: the breaker's window as the call read it
/// already in this callback (routing weighing its cluster), or `None` to read
/// it now.
pub fn admit(
    store: &dyn SharedStore,
    cfg: &BudgetConfig,
    m: &mut dyn Metrics,
    rng: &mut dyn Random,
    ask: &Ask<'_>,
    read: Option<BreakerState>,
) -> Admission {
    let state = read.unwrap_or_else(|| {
        breaker::load(store, ask.breaker, cfg).unwrap_or_else(|_| {
            internal_error(m, "breaker_load");
            BreakerState::new(cfg)
        })
    });
    let admit = breaker::admit(&state, ask.priority, ask.now_ms, rng.next_f64(), cfg);
    if admit != Admit::Pass {
        count_admit(m, &admit, ask.priority);
        let retry_after = breaker::retry_after_s(&admit, cfg, rng.next_f64());
        if let Some(r) = reply::for_admit(&admit, retry_after) {
            return Admission::Refused(r);
        }
    }
    let input = PlanInput {
        remaining_ms: ask.remaining_ms,
        observed_ms: ask.observed_ms,
        streaming: ask.streaming,
        retries_allowed: state.retries_allowed(ask.now_ms, cfg),
        retries_elsewhere: ask.failover,
    };
    match plan::plan(&input, cfg) {
        Ok(plan) => {
            count_plan(m, ask.breaker, &plan);
            Admission::Planned {
                headers: plan.header_updates(cfg),
                retries: plan.retries(cfg),
            }
        }
        Err(Exhausted) => {
            count_exhausted(m, ask.priority);
            Admission::Refused(reply::local_reply(ReplyKind::BudgetExhausted, None))
        }
    }
}

/// True when the breaker of `cluster` would shed or reject calls now (budget
/// on), so routing can steer calls to a backend that would take them.
pub fn breaker_sheds(
    store: &dyn SharedStore,
    cfg: &BudgetConfig,
    cluster: &str,
    now_ms: u64,
) -> bool {
    breaker_window(store, cfg, cluster).is_some_and(|s| sheds(&s, cfg, now_ms))
}

/// The window of `cluster`'s breaker, for [`breaker_sheds`] and then
/// [`admit`]; `None` with budgets off or when it cannot be read.
pub fn breaker_window(
    store: &dyn SharedStore,
    cfg: &BudgetConfig,
    cluster: &str,
) -> Option<BreakerState> {
    if !cfg.enabled {
        return None;
    }
    breaker::load(store, cluster, cfg).ok()
}

/// True when a breaker with this window sheds or rejects calls now.
pub fn sheds(state: &BreakerState, cfg: &BudgetConfig, now_ms: u64) -> bool {
    state.tier(now_ms, cfg) != Tier::Pass
}

/// True when the retry budget of `breaker` lets a call be tried once more
/// (always with budgets off): a failover to another backend is a retry.
pub fn retry_allowed(
    store: &dyn SharedStore,
    cfg: &BudgetConfig,
    breaker: &str,
    now_ms: u64,
) -> bool {
    !cfg.enabled
        || breaker::load(store, breaker, cfg).map_or(true, |s| s.retries_allowed(now_ms, cfg))
}

/// Counts a breaker refusal by `priority` and `reason`; a pass counts nothing.
fn count_admit(m: &mut dyn Metrics, admit: &Admit, priority: Priority) {
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
fn count_exhausted(m: &mut dyn Metrics, priority: Priority) {
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
fn count_plan(m: &mut dyn Metrics, cluster: &str, plan: &Plan) {
    let labels = [(metrics::LLM_CLUSTER, cluster)];
    if plan.max_retries > 0 {
        let retries = u64::from(plan.max_retries);
        m.counter_with(metrics::BUDGET_RETRIES_PLANNED, &labels, retries);
    }
    if plan.retry_budget_spent {
        m.counter_with(metrics::BUDGET_RETRY_BUDGET_SPENT, &labels, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryMetrics;

    #[test]
    fn refusals_and_plans_are_counted_with_labels() {
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
            m.counters["llm_filter_budget_shed_totalpriority=.=P2;.;reason=.=pressure;.;"],
            1
        );
        assert_eq!(
            m.counters["llm_filter_budget_rejected_totalpriority=.=P1;.;reason=.=circuit_open;.;"],
            1
        );
        assert_eq!(
            m.counters
                ["llm_filter_budget_rejected_totalpriority=.=P0;.;reason=.=budget_exhausted;.;"],
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
            m.counters["llm_filter_budget_retries_planned_totalllm_cluster=.=openai;.;"],
            2
        );
        assert_eq!(
            m.counters["llm_filter_budget_retry_budget_spent_totalllm_cluster=.=openai;.;"],
            1
        );
    }
}
