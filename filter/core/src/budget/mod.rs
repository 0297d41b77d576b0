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

pub use admission::{
    admit, breaker_sheds, breaker_window, retry_allowed, sheds, Admission, Ask, DEFAULT_BREAKER,
};
pub use breaker::{Admit, BreakerState, Reason, Sample, Tier};
pub use config::{BudgetConfig, RawBudgetConfig, StreamingMode};
pub use plan::{Exhausted, Plan, PlanInput};
pub use reply::LocalReply;
