//! The caller's budget, read from the headers callers already send. A bad or
//! missing header never fails a call: it falls back to the configured default,
//! because the budget is advice about the caller, not a contract with it.

use super::config::BudgetConfig;
use crate::priority::Priority;

/// Request header carrying the caller's total budget in milliseconds.
pub const REQUEST_TIMEOUT_MS: &str = "x-request-timeout-ms";
/// gRPC deadline header, honoured when the caller set no explicit budget.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";

/// A positive decimal number of milliseconds. Digits beyond `u64` mean "longer
/// than anything" and saturate (the ceiling applies later); anything else,
/// zero included, is not a budget.
pub fn request_timeout_ms(raw: &str) -> Option<u64> {
    let digits = raw.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms = digits.parse::<u64>().unwrap_or(u64::MAX);
    (ms > 0).then_some(ms)
}

/// A `grpc-timeout` value (`TimeoutValue TimeoutUnit`: one to eight digits and
/// one of `H M S m u n`) in milliseconds, sub-millisecond values rounded up so
/// a live deadline never reads as an exhausted one. Zero is not a timeout.
pub fn grpc_timeout_ms(raw: &str) -> Option<u64> {
    let raw = raw.trim();
    let (digits, unit) = raw.split_at_checked(raw.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value = digits.parse::<u64>().ok().filter(|v| *v > 0)?;
    match unit {
        "H" => value.checked_mul(3_600_000),
        "M" => value.checked_mul(60_000),
        "S" => value.checked_mul(1_000),
        "m" => Some(value),
        "u" => Some(value.div_ceil(1_000)),
        "n" => Some(value.div_ceil(1_000_000)),
        _ => None,
    }
}

/// The budget of a call in ms: the first valid of `x-request-timeout-ms` and
/// `grpc-timeout`, else the default for its priority, always within
/// `1..=max_ms`. Never fails.
pub fn budget_ms(
    request_timeout: Option<&str>,
    grpc_timeout: Option<&str>,
    priority: Priority,
    cfg: &BudgetConfig,
) -> u64 {
    request_timeout
        .and_then(request_timeout_ms)
        .or_else(|| grpc_timeout.and_then(grpc_timeout_ms))
        .unwrap_or_else(|| cfg.default_for(priority))
        .clamp(1, cfg.max_ms.max(1))
}

/// What is left of a budget that started at `started_ms`, at `now_ms`; zero
/// once spent, and a clock that went backwards costs nothing.
pub fn remaining_ms(budget_ms: u64, started_ms: u64, now_ms: u64) -> u64 {
    budget_ms.saturating_sub(now_ms.saturating_sub(started_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{Random, SplitMix64};

    #[test]
    fn request_timeout_table() {
        for (raw, want) in [
            ("1500", Some(1500)),
            (" 1500 ", Some(1500)),
            ("1", Some(1)),
            ("0", None),
            ("000", None),
            ("007", Some(7)),
            ("", None),
            (" ", None),
            ("-5", None),
            ("+5", None),
            ("1.5", None),
            ("1e3", None),
            ("15s", None),
            ("0x10", None),
            ("１２", None), // full-width digits
            ("18446744073709551615", Some(u64::MAX)),
            ("99999999999999999999999", Some(u64::MAX)),
        ] {
            assert_eq!(request_timeout_ms(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn grpc_timeout_table() {
        for (raw, want) in [
            ("1H", Some(3_600_000)),
            ("2M", Some(120_000)),
            ("30S", Some(30_000)),
            ("1500m", Some(1500)),
            ("1500u", Some(2)),
            ("1u", Some(1)),
            ("1000000n", Some(1)),
            ("1n", Some(1)),
            ("99999999H", Some(359_999_996_400_000)),
            ("99999999m", Some(99_999_999)),
            (" 5S ", Some(5_000)),
            ("123456789m", None), // nine digits
            ("0S", None),
            ("00000000m", None),
            ("5", None),
            ("S", None),
            ("", None),
            ("5s", None),
            ("5h", None),
            ("5X", None),
            ("-5S", None),
            ("5 S", None),
            ("5.0S", None),
            ("5é", None),
            ("é", None),
        ] {
            assert_eq!(grpc_timeout_ms(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn budget_precedence_and_ceiling() {
        let cfg = BudgetConfig {
            default_ms: [90_000, 60_000, 10_000],
            ..BudgetConfig::default()
        };
        let b = |rt, gt, p| budget_ms(rt, gt, p, &cfg);
        assert_eq!(b(Some("1500"), Some("3S"), Priority::P1), 1500);
        assert_eq!(b(Some("bad"), Some("3S"), Priority::P1), 3000);
        assert_eq!(b(Some("0"), Some("bad"), Priority::P1), 60_000);
        assert_eq!(b(None, None, Priority::P0), 90_000);
        assert_eq!(b(None, None, Priority::P2), 10_000);
        assert_eq!(b(Some("999999999"), None, Priority::P1), 300_000);
        assert_eq!(b(None, Some("1H"), Priority::P1), 300_000);
        assert_eq!(b(Some("18446744073709551615"), None, Priority::P1), 300_000);
    }

    #[test]
    fn budget_is_always_within_bounds() {
        let cfg = BudgetConfig::default();
        let mut r = SplitMix64::new(7);
        for _ in 0..10_000 {
            let n = r.next_u64() >> (r.next_u64() % 64);
            let units = ["H", "M", "S", "m", "u", "n", "x", ""];
            let unit = units[(r.next_u64() % units.len() as u64) as usize];
            let rt = n.to_string();
            let gt = format!("{}{unit}", n % 1_000_000_000);
            for p in Priority::ALL {
                let b = budget_ms(Some(&rt), Some(&gt), p, &cfg);
                assert!((1..=cfg.max_ms).contains(&b), "{rt} {gt} -> {b}");
                let b = budget_ms(None, Some(&gt), p, &cfg);
                assert!((1..=cfg.max_ms).contains(&b), "{gt} -> {b}");
            }
        }
    }

    #[test]
    fn remaining_saturates() {
        assert_eq!(remaining_ms(1000, 100, 600), 500);
        assert_eq!(remaining_ms(1000, 100, 1100), 0);
        assert_eq!(remaining_ms(1000, 100, u64::MAX), 0);
        assert_eq!(remaining_ms(1000, 600, 100), 1000);
        assert_eq!(remaining_ms(0, 0, 0), 0);
        assert_eq!(remaining_ms(u64::MAX, 0, 1), u64::MAX - 1);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Decimal digits read as their value, saturating past `u64`; zero
        /// and anything else is no budget.
        #[test]
        fn request_timeout_reads_digits_only(digits in "[0-9]{1,30}", pad in "[ \t]{0,2}", junk in "[^0-9\\s]") {
            let want = digits.parse::<u64>().unwrap_or(u64::MAX);
            prop_assert_eq!(request_timeout_ms(&format!("{pad}{digits}{pad}")), (want > 0).then_some(want));
            prop_assert_eq!(request_timeout_ms(&format!("{digits}{junk}")), None);
        }

        /// A grpc-timeout of up to eight digits and a unit is that long,
        /// sub-millisecond units rounded up; anything else is no timeout.
        #[test]
        fn grpc_timeout_scales_by_unit(value in 0u64..100_000_000, unit in prop::sample::select(vec!['H', 'M', 'S', 'm', 'u', 'n', 'x', 'h'])) {
            let got = grpc_timeout_ms(&format!("{value}{unit}"));
            let want = match unit {
                'H' => Some(value * 3_600_000),
                'M' => Some(value * 60_000),
                'S' => Some(value * 1_000),
                'm' => Some(value),
                'u' => Some(value.div_ceil(1_000)),
                'n' => Some(value.div_ceil(1_000_000)),
                _ => None,
            };
            prop_assert_eq!(got, want.filter(|_| value > 0));
        }

        /// Whatever the headers say, the budget is within `1..=max_ms`.
        #[test]
        fn any_headers_give_a_bounded_budget(rt in prop::option::of(".{0,24}"), gt in prop::option::of(".{0,12}"), max_ms in 0u64..1_000_000) {
            let cfg = BudgetConfig { max_ms, ..BudgetConfig::default() };
            for p in Priority::ALL {
                let b = budget_ms(rt.as_deref(), gt.as_deref(), p, &cfg);
                prop_assert!((1..=max_ms.max(1)).contains(&b));
            }
        }
    }
}
