//! Timeout budgets: plan Envoy timeouts and retries from the caller's budget, break circuits in tiers.
