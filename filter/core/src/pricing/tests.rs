//! The arithmetic against the providers' own worked numbers, and the
//! price table's loading rules.

use std::collections::BTreeMap;

use super::config::{compile, RawPrice, MAX_MODELS};
use super::*;

/// Nanos in one dollar (the catalog's unit).
const DOLLAR: f64 = 1e9;

fn prices(json: &str) -> Prices {
    compile(map(json), BTreeMap::new(), None).unwrap()
}

fn map(json: &str) -> BTreeMap<String, RawPrice> {
    serde_json::from_str(json).unwrap()
}

fn price(json: &str) -> Price {
    prices(&format!(r#"{{"m":{json}}}"#))
        .get(Some("m"))
        .copied()
        .unwrap()
}

fn usage(prompt: u64, output: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: output,
        ..Usage::default()
    }
}

/// `nanos` in dollars, to the nano.
fn dollars(nanos: u64) -> f64 {
    nanos as f64 / DOLLAR
}

fn assert_dollars(nanos: u64, want: f64, what: &str) {
    assert!(
        (dollars(nanos) - want).abs() < 1.5e-9,
        "{what}: {} dollars, want {want}",
        dollars(nanos)
    );
}

/// Claude Sonnet 4.5 as Anthropic's pricing page lists it, with the
/// long-context rates of its 1M-token window.
const SONNET_4_5: &str = r#"{"input": 3, "cache_write": 3.75, "cache_write_1h": 6, "cached_input": 0.3, "output": 15,
    "long_context": {"above": 200000, "input": 6, "cache_write": 7.5, "cache_write_1h": 12, "cached_input": 0.6, "output": 22.5}}"#;

/// Claude Sonnet 4.6: the same rates, and its 1M-token window at them
/// (since March 2026).
const SONNET_4_6: &str =
    r#"{"input": 3, "cache_write": 3.75, "cache_write_1h": 6, "cached_input": 0.3, "output": 15}"#;

#[test]
fn anthropics_cache_multipliers() {
    // Anthropic's pricing page: a 5-minute cache write costs 1.25 times the
    // base input price, a 1-hour write 2 times, a cache hit 0.1 times.
    let p = price(SONNET_4_6);
    let million = 1_000_000;
    let written = |hour: u64| Usage {
        prompt_tokens: million,
        cache_write_tokens: million,
        cache_write_1h_tokens: hour,
        ..Usage::default()
    };
    assert_dollars(p.cost(&usage(million, 0)), 3.0, "1M input");
    assert_dollars(p.cost(&written(0)), 3.75, "1M written for 5 minutes");
    assert_dollars(p.cost(&written(million)), 6.0, "1M written for an hour");
    let read = Usage {
        cached_tokens: million,
        ..usage(million, 0)
    };
    assert_dollars(p.cost(&read), 0.30, "1M read from the cache");
    // Anthropic's usage has no 5-minute/1-hour split on older answers: all
    // writes are then at the 5-minute rate.
    let mixed = Usage {
        prompt_tokens: 100_000,
        cache_write_tokens: 30_000,
        cache_write_1h_tokens: 10_000,
        cached_tokens: 50_000,
        completion_tokens: 1_000,
        ..Usage::default()
    };
    // 20k plain × 3 + 50k × 0.3 + 20k × 3.75 + 10k × 6 + 1k × 15, per million.
    assert_dollars(p.cost(&mixed), 0.06 + 0.015 + 0.075 + 0.06 + 0.015, "mixed");
}

#[test]
fn a_long_context_tier_prices_the_whole_call_above_its_threshold() {
    // Anthropic: a Sonnet 4/4.5 request of more than 200K input tokens
    // (reads and writes of the prompt cache included) is billed at $6 / $22.50
    // for all its tokens. 250K in and 2K out: $1.50 + $0.045.
    let p = price(SONNET_4_5);
    assert_dollars(p.cost(&usage(250_000, 2_000)), 1.545, "250K in");
    // 199,999 in: the base rates, $0.599997 + $0.03.
    assert_dollars(p.cost(&usage(199_999, 2_000)), 0.629_997, "199,999 in");
    // At the threshold exactly, the base rates; one more token, the tier's.
    assert_dollars(p.cost(&usage(200_000, 0)), 0.6, "200,000 in");
    assert_dollars(p.cost(&usage(200_001, 0)), 1.200_006, "200,001 in");
    // Cache reads count toward the threshold.
    let mostly_read = Usage {
        cached_tokens: 150_000,
        ..usage(210_000, 0)
    };
    assert_dollars(p.cost(&mostly_read), 0.36 + 0.09, "210K, 150K of it read");
    // Google's Gemini 2.5 Pro: $1.25 / $10 up to 200K prompt tokens, $2.50
    // / $15 above; the cached tokens at $0.125 / $0.25.
    let gemini = price(
        r#"{"input": 1.25, "cached_input": 0.125, "output": 10,
            "long_context": {"above": 200000, "input": 2.5, "cached_input": 0.25, "output": 15}}"#,
    );
    assert_dollars(gemini.cost(&usage(300_000, 1_000)), 0.765, "300K in");
    let cached = Usage {
        cached_tokens: 100_000,
        ..usage(100_000, 0)
    };
    assert_dollars(gemini.cost(&cached), 0.0125, "100K cached");
}

#[test]
fn openais_cached_input_and_reasoning() {
    // OpenAI's pricing page: GPT-4o at $2.50 input, $1.25 cached input, $10
    // output. 1,000 prompt tokens of which 300 cached, 500 output:
    // 700 × 2.50 + 300 × 1.25 + 500 × 10 per million = $0.007125.
    let p = price(r#"{"input": 2.5, "cached_input": 1.25, "output": 10}"#);
    let u = Usage {
        cached_tokens: 300,
        ..usage(1_000, 500)
    };
    assert_dollars(p.cost(&u), 0.007_125, "gpt-4o");
    // OpenAI bills reasoning tokens as output: without a `reasoning` price
    // they cost the output rate (o4-mini: $4.40).
    let o4 = price(r#"{"input": 1.1, "cached_input": 0.275, "output": 4.4}"#);
    let thinking = Usage {
        reasoning_tokens: 800,
        ..usage(0, 1_000)
    };
    assert_dollars(o4.cost(&thinking), 0.0044, "1,000 output, 800 reasoning");
    // A `reasoning` price applies to those tokens only.
    let apart = price(r#"{"input": 1, "output": 4, "reasoning": 10}"#);
    assert_dollars(
        apart.cost(&thinking),
        (200.0 * 4.0 + 800.0 * 10.0) / 1e6,
        "apart",
    );
}

#[test]
fn the_cache_saves_its_reads_discount_and_costs_its_writes_premium() {
    // saved = read × (input − cached_input); premium = written × (write −
    // input), each at the call's tier. Sonnet 4.5: 10K read save 10K × $2.70
    // per million; 2K written for 5 minutes cost 2K × $0.75 more, 1K for an
    // hour 1K × $3 more.
    let p = price(SONNET_4_5);
    let u = Usage {
        prompt_tokens: 20_000,
        cached_tokens: 10_000,
        cache_write_tokens: 3_000,
        cache_write_1h_tokens: 1_000,
        ..Usage::default()
    };
    let e = p.cache_effect(&u);
    assert_dollars(e.saved, 0.027, "saved");
    assert_dollars(e.premium, 0.0015 + 0.003, "premium");
    // With the cache, the call cost exactly what it would have without it,
    // less the saving, plus the premium.
    let without = p.cost(&usage(20_000, 0));
    assert_eq!(p.cost(&u), without - e.saved + e.premium);
    // OpenAI charges nothing more for writes: no premium, only savings.
    let openai = price(r#"{"input": 2.5, "cached_input": 1.25, "output": 10}"#);
    assert_eq!(openai.cache_effect(&u).premium, 0);
    assert_dollars(openai.cache_effect(&u).saved, 0.0125, "gpt-4o saved");
}

#[test]
fn counts_past_their_whole_are_bounded_by_it() {
    // A usage that says more cached or written than its input, or more
    // reasoning than its output, is priced as if they were the whole.
    let p = price(SONNET_4_5);
    let odd = Usage {
        prompt_tokens: 10,
        cached_tokens: 50,
        cache_write_tokens: 50,
        cache_write_1h_tokens: 99,
        completion_tokens: 1,
        reasoning_tokens: 7,
    };
    assert_eq!(
        p.cost(&odd),
        p.cost(&Usage {
            cached_tokens: 10,
            ..usage(10, 1)
        })
    );
    let max = Usage {
        prompt_tokens: u64::MAX,
        completion_tokens: u64::MAX,
        ..Usage::default()
    };
    assert_eq!(p.cost(&max), u64::MAX, "saturates");
}

#[test]
fn a_model_is_priced_by_name_then_longest_prefix_then_star() {
    let p = prices(
        r#"{"claude-sonnet-4-5*": {"input": 3, "output": 15},
            "claude-sonnet-4*": {"input": 2, "output": 2},
            "claude-sonnet-4-5-exact": {"input": 9, "output": 9},
            "*": {"input": 1, "output": 1}}"#,
    );
    let input = |m: Option<&str>| p.get(m).map(|p| p.base.input / 1_000.0);
    assert_eq!(input(Some("claude-sonnet-4-5-20250929")), Some(3.0));
    assert_eq!(input(Some("claude-sonnet-4-5@20250929")), Some(3.0));
    assert_eq!(input(Some("claude-sonnet-4-20250514")), Some(2.0));
    assert_eq!(input(Some("claude-sonnet-4-5-exact")), Some(9.0));
    assert_eq!(input(Some("gpt-4o")), Some(1.0));
    assert_eq!(input(None), Some(1.0));
    assert!(p.prices_every_model());
    // Only exact names are models the configuration names.
    assert_eq!(p.named().collect::<Vec<_>>(), ["claude-sonnet-4-5-exact"]);
    assert!(prices("{}").get(Some("m")).is_none());
}

#[test]
fn the_operators_prices_replace_the_catalogs() {
    let raw =
        map(r#"{"gpt-4o": {"input": 2, "output": 8}, "claude-*": {"input": 7, "output": 7}}"#);
    let catalog = map(
        r#"{"gpt-4o": {"input": 2.5, "cached_input": 1.25, "output": 10},
            "gpt-4.1": {"input": 2, "cached_input": 0.5, "output": 8},
            "claude-*": {"input": 1, "output": 1}}"#,
    );
    let p = compile(raw, catalog, Some("2026-12-03")).unwrap();
    let rates = |m: &str| p.get(Some(m)).unwrap().base;
    assert_eq!(rates("gpt-4o").input, 2_000.0, "the operator's, whole");
    assert_eq!(rates("gpt-4o").cached_input, 2_000.0, "not the catalog's");
    assert_eq!(rates("gpt-4.1").cached_input, 500.0, "the catalog's");
    assert_eq!(rates("claude-x").input, 7_000.0, "a prefix replaced too");
    assert_eq!(p.named().collect::<Vec<_>>(), ["gpt-4o"]);
}

#[test]
fn refuses_what_it_cannot_price_right() {
    let refused = |prices: &str, catalog: &str, as_of: Option<&str>| {
        compile(map(prices), map(catalog), as_of).unwrap_err().field
    };
    for (doc, field) in [
        (r#"{"m": {"input": 1}}"#, "prices.m"),
        (r#"{"m": {"input": 1, "output": -1}}"#, "prices.m.output"),
        (
            r#"{"m": {"input": 1, "output": 1, "cache_write": 2e6}}"#,
            "prices.m.cache_write",
        ),
        (r#"{"a*b": {"input": 1, "output": 1}}"#, "prices.a*b"),
        (r#"{"": {"input": 1, "output": 1}}"#, "prices."),
        (
            r#"{"m": {"input": 1, "output": 1, "above": 9}}"#,
            "prices.m.above",
        ),
        (
            r#"{"m": {"input": 1, "output": 1, "long_context": {"input": 2, "output": 2}}}"#,
            "prices.m.long_context",
        ),
        (
            r#"{"m": {"input": 1, "output": 1, "long_context": {"above": 0, "input": 2, "output": 2}}}"#,
            "prices.m.long_context",
        ),
        (
            r#"{"m": {"input": 1, "output": 1, "long_context": {"above": 9, "input": 2, "output": 2,
                "long_context": {"above": 99, "input": 3, "output": 3}}}}"#,
            "prices.m.long_context",
        ),
        (
            r#"{"m": {"input": 1, "output": 1, "long_context": {"above": 9, "input": 2}}}"#,
            "prices.m.long_context",
        ),
        (
            r#"{"m": {"input": 1, "output": 1, "long_context": {"above": 9, "input": 2, "output": 2, "reasoning": -3}}}"#,
            "prices.m.long_context.reasoning",
        ),
    ] {
        assert_eq!(refused(doc, "{}", None), field, "{doc}");
    }
    let many: Vec<String> = (0..=MAX_MODELS)
        .map(|i| format!(r#""m{i}": {{"input": 1, "output": 1}}"#))
        .collect();
    let many = format!("{{{}}}", many.join(","));
    assert_eq!(refused(&many, "{}", None), "prices");
    assert_eq!(refused("{}", &many, Some("2026-12-03")), "catalog");
    let one = r#"{"m": {"input": 1, "output": 1}}"#;
    for as_of in [
        None,
        Some("03/12/2026"),
        Some("2026-1-3"),
        Some("2026/12/03"),
    ] {
        assert_eq!(refused("{}", one, as_of), "catalog_as_of", "{as_of:?}");
    }
    assert_eq!(
        refused("{}", r#"{"m": {"output": 1}}"#, Some("2026-12-03")),
        "catalog.m"
    );
}

#[test]
fn the_shipped_catalog_loads_and_says_what_the_providers_list() {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Shipped {
        catalog_as_of: String,
        catalog: BTreeMap<String, RawPrice>,
    }
    let shipped: Shipped =
        serde_json::from_str(include_str!("../../../../examples/prices.json")).unwrap();
    let p = compile(
        BTreeMap::new(),
        shipped.catalog,
        Some(&shipped.catalog_as_of),
    )
    .unwrap();
    let rates = |m: &str, prompt: u64| {
        *p.get(Some(m))
            .unwrap_or_else(|| panic!("{m}"))
            .rates(prompt)
    };
    let per_million = |r: f64| r / 1_000.0;
    // Anthropic: a 5-minute write at 1.25 times the input, an hour's at 2,
    // a hit at 0.1.
    for m in [
        "claude-sonnet-4-5-20250929",
        "claude-haiku-4-5",
        "claude-opus-4-6",
    ] {
        let r = rates(m, 0);
        assert!((r.cache_write / r.input - 1.25).abs() < 1e-9, "{m}");
        assert!((r.cache_write_1h / r.input - 2.0).abs() < 1e-9, "{m}");
        assert!((r.cached_input / r.input - 0.1).abs() < 1e-9, "{m}");
    }
    assert_eq!(per_million(rates("claude-sonnet-4-5", 200_001).input), 6.0);
    assert_eq!(per_million(rates("claude-sonnet-4-6", 900_000).input), 3.0);
    assert_eq!(per_million(rates("gpt-4o", 0).cached_input), 1.25);
    assert_eq!(per_million(rates("gpt-5-mini", 0).output), 2.0);
    assert_eq!(per_million(rates("gemini-2.5-pro", 300_000).output), 15.0);
    // OpenAI charges no more for a write: its writes are at the input rate.
    let gpt = rates("gpt-4.1", 0);
    assert_eq!(gpt.cache_write, gpt.input);
    assert!(!p.prices_every_model(), "the catalog guesses no price");
    assert!(
        p.get(Some("gpt-4o-2024-05-13")).is_none(),
        "priced otherwise"
    );
}
