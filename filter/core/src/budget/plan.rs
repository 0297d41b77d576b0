//! Turns what is left of a caller's budget into Envoy router headers: a total
//! timeout that ends the call at the budget, a per-try timeout from observed
//! latency, and only as many retries as fit in the budget and the retry budget.

use super::config::{BudgetConfig, StreamingMode};
use crate::host::Random;

/// Total timeout of the call, retries included; Envoy consumes it.
pub const UPSTREAM_RQ_TIMEOUT_MS: &str = "x-envoy-upstream-rq-timeout-ms";
/// Timeout of each try; Envoy ignores it once response headers went downstream.
pub const UPSTREAM_RQ_PER_TRY_TIMEOUT_MS: &str = "x-envoy-upstream-rq-per-try-timeout-ms";
/// Most retries of the call; only honoured when some retry condition is set.
pub const MAX_RETRIES: &str = "x-envoy-max-retries";
/// Retry conditions, OR-ed by Envoy into the route's own.
pub const RETRY_ON: &str = "x-envoy-retry-on";
/// Statuses retried under `retriable-status-codes`, added to the route's own.
pub const RETRIABLE_STATUS_CODES: &str = "x-envoy-retriable-status-codes";
/// Header identifying one logical call to providers that deduplicate.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The budget the next hop gets: the caller's own header, rewritten to what
/// one try may take (the per-try timeout, else what is left), which is what
/// Envoy tells the upstream in `x-envoy-expected-rq-timeout-ms` too. A
/// filter at the next hop (a gateway tier behind a sidecar) plans within
/// it rather than within the caller's whole budget; a provider ignores it.
pub const NEXT_HOP_BUDGET_MS: &str = super::parse::REQUEST_TIMEOUT_MS;

/// Every header a plan may set: the plan owns them all, so the ones it
/// leaves unset are removed rather than left to what the client sent.
pub const PLAN_HEADERS: [&str; 6] = [
    UPSTREAM_RQ_TIMEOUT_MS,
    UPSTREAM_RQ_PER_TRY_TIMEOUT_MS,
    MAX_RETRIES,
    RETRY_ON,
    RETRIABLE_STATUS_CODES,
    NEXT_HOP_BUDGET_MS,
];

/// Per-try timeout as a multiple of observed latency: room for an ordinary slow
/// answer, short enough that a stuck try leaves budget for another.
pub const PER_TRY_LATENCY_FACTOR: u64 = 3;

/// What the plan of one call is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanInput {
    /// Budget left at the moment the call is forwarded, in ms.
    pub remaining_ms: u64,
    /// The backend's observed latency (an EWMA) when known: of whole answers
    /// for unary calls, of time to response headers for streamed ones.
    pub observed_ms: Option<u64>,
    /// The client asked for a streamed answer.
    pub streaming: bool,
    /// The retry budget of the backend still allows retries
    /// ([`super::BreakerState::retries_allowed`]).
    pub retries_allowed: bool,
    /// Another backend takes the call if this one fails it (the filter's
    /// failover): Envoy makes no retries on this one, whose failures they
    /// would most likely repeat.
    pub retries_elsewhere: bool,
}

/// The budget is spent: the call is answered locally with a 504 instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted;

/// Timeouts and retries of one call, as Envoy will apply them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Total timeout in ms, at least 1 (0 would disable Envoy's timeout).
    pub total_ms: u64,
    /// Per-try timeout in ms, below `total_ms` when set (Envoy ignores one
    /// that is not).
    pub per_try_ms: Option<u64>,
    /// Retries Envoy may make.
    pub max_retries: u32,
    /// Retries were withheld because the retry budget is spent.
    pub retry_budget_spent: bool,
}

/// Plans a call from what is left of its budget.
///
/// Unary calls (and streams under [`StreamingMode::WholeStream`]): the total
/// timeout is the remaining budget, so the call ends at the budget whatever
/// happens. With a known latency each try gets `3 × latency` (at least
/// `min_per_try_ms`), and the retries are the further tries of that length
/// that fit. When no per-try timeout applies (latency unknown, or `3 ×
/// latency` fills the budget) a slow first answer may use the whole budget,
/// and the retries are counted in `min_per_try_ms` tries: they serve fast
/// failures (refused connection, reset, 503), inside the same total timeout.
///
/// Streams under [`StreamingMode::UntilHeaders`]: Envoy drops a per-try timeout
/// once the response has started downstream, so the per-try timeout bounds only
/// the wait for response headers, and the budget is spent there: tries of
/// `3 × latency` (or, unknown, the budget shared among the tries) that fit in
/// it. The total timeout is `max_ms`, so a healthy stream runs to its end.
pub fn plan(input: &PlanInput, cfg: &BudgetConfig) -> Result<Plan, Exhausted> {
    let remaining = input.remaining_ms;
    if remaining == 0 {
        return Err(Exhausted);
    }
    let retry_budget_spent = !input.retries_allowed && cfg.max_retries > 0;
    let retry_cap = if input.retries_allowed && !input.retries_elsewhere {
        cfg.max_retries
    } else {
        0
    };
    // A per-try timeout never above what is left; `min` after `max` (not
    // `clamp`) because `min_per_try_ms` may exceed a nearly spent budget.
    let from_latency = input.observed_ms.map(|ms| {
        ms.saturating_mul(PER_TRY_LATENCY_FACTOR)
            .max(cfg.min_per_try_ms)
            .min(remaining)
    });

    let bound_headers_only = input.streaming && cfg.streaming == StreamingMode::UntilHeaders;
    let (total_ms, per_try_ms, try_ms) = if bound_headers_only {
        let per_try = from_latency.unwrap_or_else(|| {
            let tries = u64::from(retry_cap).saturating_add(1);
            (remaining / tries).max(cfg.min_per_try_ms).min(remaining)
        });
        let total = cfg.max_ms.max(remaining);
        (total, (per_try < total).then_some(per_try), per_try)
    } else {
        let per_try = from_latency.filter(|ms| *ms < remaining);
        let try_ms = per_try.unwrap_or_else(|| cfg.min_per_try_ms.min(remaining));
        (remaining, per_try, try_ms)
    };

    let fit = (remaining / try_ms.max(1)).saturating_sub(1);
    let max_retries = u32::try_from(fit).unwrap_or(u32::MAX).min(retry_cap);
    Ok(Plan {
        total_ms,
        per_try_ms,
        max_retries,
        retry_budget_spent,
    })
}

impl Plan {
    /// The retries Envoy may actually make: none without a retry condition.
    pub fn retries(&self, cfg: &BudgetConfig) -> u32 {
        if cfg.retry_on.is_empty() {
            0
        } else {
            self.max_retries
        }
    }

    /// The request headers that carry the plan to Envoy's router, which
    /// consumes them, and the next hop's budget. `x-envoy-max-retries` is
    /// always set so a route's own `num_retries` cannot outgrow the budget;
    /// the retry conditions only when a retry is allowed.
    pub fn headers(&self, cfg: &BudgetConfig) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(PLAN_HEADERS.len());
        let total = self.total_ms.max(1).to_string();
        let per_try = self.per_try_ms.map(|ms| ms.max(1).to_string());
        let next_hop = per_try.clone().unwrap_or_else(|| total.clone());
        out.push((UPSTREAM_RQ_TIMEOUT_MS, total));
        if let Some(ms) = per_try {
            out.push((UPSTREAM_RQ_PER_TRY_TIMEOUT_MS, ms));
        }
        let retries = self.retries(cfg);
        out.push((MAX_RETRIES, retries.to_string()));
        if retries > 0 {
            out.push((RETRY_ON, cfg.retry_on.clone()));
            if !cfg.retriable_status_codes.is_empty() {
                out.push((RETRIABLE_STATUS_CODES, cfg.retriable_status_codes.clone()));
            }
        }
        out.push((NEXT_HOP_BUDGET_MS, next_hop));
        out
    }

    /// Every one of [`PLAN_HEADERS`] with its value, `None` for those to
    /// remove: a client's own per-try timeout or retry conditions do not
    /// survive a plan that has none.
    pub fn header_updates(&self, cfg: &BudgetConfig) -> Vec<(&'static str, Option<String>)> {
        let mut set = self.headers(cfg);
        PLAN_HEADERS
            .iter()
            .map(|name| {
                let value = set
                    .iter()
                    .position(|(h, _)| h == name)
                    .map(|i| set.swap_remove(i).1);
                (*name, value)
            })
            .collect()
    }
}

/// A fresh `idempotency-key`: 128 random bits as 32 lowercase hex digits. Set
/// once when the client sent none; Envoy replays the same request headers on
/// every retry, so all tries of the call carry the same key without any state.
pub fn idempotency_key(rng: &mut dyn Random) -> String {
    format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::SplitMix64;

    fn input(remaining_ms: u64, observed_ms: Option<u64>) -> PlanInput {
        PlanInput {
            remaining_ms,
            observed_ms,
            streaming: false,
            retries_allowed: true,
            retries_elsewhere: false,
        }
    }

    fn p(total_ms: u64, per_try_ms: Option<u64>, max_retries: u32) -> Plan {
        Plan {
            total_ms,
            per_try_ms,
            max_retries,
            retry_budget_spent: false,
        }
    }

    #[test]
    fn retries_go_elsewhere_when_another_backend_takes_them() {
        let cfg = BudgetConfig::default();
        let elsewhere = PlanInput {
            retries_elsewhere: true,
            ..input(30_000, Some(2_000))
        };
        // The per-try timeout stays, so a stuck try leaves budget to fail over.
        assert_eq!(plan(&elsewhere, &cfg), Ok(p(30_000, Some(6_000), 0)));
        let stream = PlanInput {
            streaming: true,
            ..elsewhere
        };
        assert_eq!(plan(&stream, &cfg).map(|p| p.max_retries), Ok(0));
    }

    #[test]
    fn unary_table() {
        let cfg = BudgetConfig::default(); // min 1000 ms per try, 2 retries, max 300 s
        for (remaining, observed, want) in [
            // 3 × 2 s = 6 s tries; 30 s fits 5, capped at 2 retries.
            (30_000, Some(2_000), p(30_000, Some(6_000), 2)),
            // 3 × 5 s = 15 s: one retry fits in 30 s.
            (30_000, Some(5_000), p(30_000, Some(15_000), 1)),
            // 3 × 12 s ≥ budget: one try may take it all; fast failures retried.
            (30_000, Some(12_000), p(30_000, None, 2)),
            // Fast backend: per-try floor of 1 s.
            (30_000, Some(10), p(30_000, Some(1_000), 2)),
            // Unknown latency: no per-try, fast failures retried.
            (30_000, None, p(30_000, None, 2)),
            (1_500, None, p(1_500, None, 0)),
            (2_000, None, p(2_000, None, 1)),
            // Budget smaller than the per-try floor.
            (400, Some(10), p(400, None, 0)),
            (400, None, p(400, None, 0)),
            (1, Some(0), p(1, None, 0)),
            (1, None, p(1, None, 0)),
            // Overflow-prone values saturate.
            (u64::MAX, Some(u64::MAX), p(u64::MAX, None, 2)),
            (u64::MAX, None, p(u64::MAX, None, 2)),
        ] {
            assert_eq!(
                plan(&input(remaining, observed), &cfg),
                Ok(want),
                "{remaining} {observed:?}"
            );
        }
        assert_eq!(plan(&input(0, Some(10)), &cfg), Err(Exhausted));
    }

    #[test]
    fn spent_retry_budget_allows_no_retry() {
        let cfg = BudgetConfig::default();
        let got = plan(
            &PlanInput {
                retries_allowed: false,
                retries_elsewhere: false,
                ..input(30_000, Some(2_000))
            },
            &cfg,
        )
        .unwrap();
        assert_eq!(
            got,
            Plan {
                retry_budget_spent: true,
                ..p(30_000, Some(6_000), 0)
            }
        );
        // With retries configured off there is no budget to speak of.
        let off = BudgetConfig {
            max_retries: 0,
            ..BudgetConfig::default()
        };
        let got = plan(
            &PlanInput {
                retries_allowed: false,
                retries_elsewhere: false,
                ..input(30_000, None)
            },
            &off,
        )
        .unwrap();
        assert_eq!(got, p(30_000, None, 0));
    }

    #[test]
    fn streams_are_bounded_until_headers_only() {
        let cfg = BudgetConfig::default();
        let s = |remaining, observed| PlanInput {
            streaming: true,
            ..input(remaining, observed)
        };
        for (remaining, observed, want) in [
            // Time to headers 500 ms: 1.5 s per try, stream may run to max_ms.
            (30_000, Some(500), p(300_000, Some(1_500), 2)),
            // Unknown: the budget is shared among three tries.
            (30_000, None, p(300_000, Some(10_000), 2)),
            (1_500, None, p(300_000, Some(1_000), 0)),
            // A budget at the ceiling: Envoy would ignore per-try == total.
            (300_000, Some(200_000), p(300_000, None, 0)),
        ] {
            assert_eq!(
                plan(&s(remaining, observed), &cfg),
                Ok(want),
                "{remaining} {observed:?}"
            );
        }

        let whole = BudgetConfig {
            streaming: StreamingMode::WholeStream,
            ..BudgetConfig::default()
        };
        assert_eq!(
            plan(&s(30_000, Some(500)), &whole),
            Ok(p(30_000, Some(1_500), 2))
        );
        assert_eq!(plan(&s(30_000, None), &whole), Ok(p(30_000, None, 2)));
    }

    /// Property test over random inputs and configurations: the plan never
    /// outlives the budget, per-try timeouts are ones Envoy honours, retries
    /// fit and respect both caps.
    #[test]
    fn plans_respect_the_budget() {
        let mut r = SplitMix64::new(42);
        for _ in 0..50_000 {
            let max_ms = 1 + r.next_u64() % 600_000;
            let cfg = BudgetConfig {
                max_ms,
                min_per_try_ms: 1 + r.next_u64() % max_ms,
                max_retries: (r.next_u64() % 11) as u32,
                streaming: if r.next_u64().is_multiple_of(2) {
                    StreamingMode::UntilHeaders
                } else {
                    StreamingMode::WholeStream
                },
                ..BudgetConfig::default()
            };
            let remaining = r.next_u64() % (max_ms + 2);
            let observed = match r.next_u64() % 4 {
                0 => None,
                1 => Some(u64::MAX - r.next_u64() % 10),
                _ => Some(r.next_u64() % (max_ms * 2)),
            };
            let inp = PlanInput {
                remaining_ms: remaining,
                observed_ms: observed,
                streaming: r.next_u64().is_multiple_of(2),
                retries_allowed: !r.next_u64().is_multiple_of(4),
                retries_elsewhere: false,
            };
            let Ok(got) = plan(&inp, &cfg) else {
                assert_eq!(remaining, 0);
                continue;
            };
            assert!(got.total_ms >= 1);
            assert!(got.max_retries <= cfg.max_retries);
            if !inp.retries_allowed {
                assert_eq!(got.max_retries, 0);
            }
            if let Some(t) = got.per_try_ms {
                assert!(t >= 1 && t < got.total_ms, "{inp:?} {got:?}");
                assert!(t <= remaining);
            }
            let headers_only = inp.streaming && cfg.streaming == StreamingMode::UntilHeaders;
            if headers_only {
                assert_eq!(got.total_ms, max_ms.max(remaining));
                // Every try's wait for headers fits in the budget.
                let t = got.per_try_ms.unwrap_or(remaining);
                assert!(
                    t * (u64::from(got.max_retries) + 1) <= remaining,
                    "{inp:?} {got:?}"
                );
            } else {
                assert_eq!(got.total_ms, remaining);
                if let Some(t) = got.per_try_ms {
                    assert!(t * (u64::from(got.max_retries) + 1) <= remaining);
                    assert!(t >= cfg.min_per_try_ms.min(remaining));
                }
            }
        }
    }

    #[test]
    fn headers_carry_the_plan() {
        let cfg = BudgetConfig::default();
        assert_eq!(
            p(30_000, Some(6_000), 2).headers(&cfg),
            [
                (UPSTREAM_RQ_TIMEOUT_MS, "30000".to_string()),
                (UPSTREAM_RQ_PER_TRY_TIMEOUT_MS, "6000".to_string()),
                (MAX_RETRIES, "2".to_string()),
                (
                    RETRY_ON,
                    "5xx,reset,connect-failure,retriable-status-codes".to_string()
                ),
                (RETRIABLE_STATUS_CODES, "429,503".to_string()),
                (NEXT_HOP_BUDGET_MS, "6000".to_string()),
            ]
        );
        assert_eq!(
            p(1_500, None, 0).headers(&cfg),
            [
                (UPSTREAM_RQ_TIMEOUT_MS, "1500".to_string()),
                (MAX_RETRIES, "0".to_string()),
                (NEXT_HOP_BUDGET_MS, "1500".to_string()),
            ]
        );
        let no_codes = BudgetConfig {
            retry_on: "connect-failure".into(),
            retriable_status_codes: String::new(),
            ..BudgetConfig::default()
        };
        assert_eq!(
            p(9_000, None, 1).headers(&no_codes),
            [
                (UPSTREAM_RQ_TIMEOUT_MS, "9000".to_string()),
                (MAX_RETRIES, "1".to_string()),
                (RETRY_ON, "connect-failure".to_string()),
                (NEXT_HOP_BUDGET_MS, "9000".to_string()),
            ]
        );
        let none = BudgetConfig {
            retry_on: String::new(),
            retriable_status_codes: String::new(),
            ..BudgetConfig::default()
        };
        assert_eq!(
            p(9_000, None, 2).headers(&none),
            [
                (UPSTREAM_RQ_TIMEOUT_MS, "9000".to_string()),
                (MAX_RETRIES, "0".to_string()),
                (NEXT_HOP_BUDGET_MS, "9000".to_string()),
            ]
        );
        assert_eq!(p(9_000, None, 2).retries(&cfg), 2);
        assert_eq!(p(9_000, None, 2).retries(&none), 0);
    }

    #[test]
    fn updates_set_the_plan_and_remove_the_rest() {
        let cfg = BudgetConfig::default();
        let full = p(30_000, Some(6_000), 2);
        let updates = full.header_updates(&cfg);
        assert_eq!(
            updates.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
            PLAN_HEADERS
        );
        let set: Vec<_> = updates.into_iter().map(|(h, v)| (h, v.unwrap())).collect();
        assert_eq!(set, full.headers(&cfg));
        assert_eq!(
            p(1_500, None, 0).header_updates(&cfg),
            [
                (UPSTREAM_RQ_TIMEOUT_MS, Some("1500".to_string())),
                (UPSTREAM_RQ_PER_TRY_TIMEOUT_MS, None),
                (MAX_RETRIES, Some("0".to_string())),
                (RETRY_ON, None),
                (RETRIABLE_STATUS_CODES, None),
                (NEXT_HOP_BUDGET_MS, Some("1500".to_string())),
            ]
        );
    }

    #[test]
    fn idempotency_keys_are_hex_and_distinct() {
        let mut r = SplitMix64::new(1);
        let a = idempotency_key(&mut r);
        let b = idempotency_key(&mut r);
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_ne!(a, b);
        struct Zero;
        impl Random for Zero {
            fn next_u64(&mut self) -> u64 {
                0
            }
        }
        assert_eq!(idempotency_key(&mut Zero), "0".repeat(32));
    }
}
