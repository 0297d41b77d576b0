use super::*;
use crate::host::{MemoryMetrics, MemoryStore};

const T0: u64 = 1_764_547_200_000; // 2025-12-01T00:00:00Z

fn cfg(json: &str) -> LimitsConfig {
    LimitsConfig::compile(serde_json::from_str(json).unwrap()).unwrap()
}

fn ask<'a>(tenant: &'a str, prompt: u64, max_tokens: u64, now_ms: u64) -> Ask<'a> {
    Ask {
        priority: Priority::P1,
        model: Some("gpt-4o"),
        tenant: Some(tenant),
        tenant_label: tenant,
        user: None,
        prompt_tokens: prompt,
        max_tokens: Some(max_tokens),
        now_ms,
    }
}

fn admitted(d: Decision) -> Admitted {
    match d {
        Decision::Pass(a) => a,
        Decision::Refuse(r) => panic!("refused: {r:?}"),
    }
}

fn refused(d: Decision) -> Refused {
    match d {
        Decision::Refuse(r) => r,
        Decision::Pass(a) => panic!("passed: {a:?}"),
    }
}

fn charged(tokens: u64) -> Charge {
    Charge {
        requests: 1,
        tokens,
        cost: 0,
    }
}

#[test]
fn reservations_stop_at_the_limit_and_settling_gives_back() {
    let c = cfg(r#"{"rules":[{"name":"t","by":["tenant"],"tokens_per_minute":1000}]}"#);
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    // Each reserves 100 + 200: three fit in 1000, the fourth not.
    let mut held = Vec::new();
    for _ in 0..3 {
        let a = admitted(admit(&s, &c, &mut m, &ask("a", 100, 200, T0)));
        assert_eq!(a.tokens.unwrap().limit, 1000);
        held.push(a.held);
    }
    assert_eq!(
        admitted(admit(&s, &c, &mut m, &ask("a", 0, 50, T0)))
            .tokens
            .unwrap()
            .remaining,
        50
    );
    let r = refused(admit(&s, &c, &mut m, &ask("a", 100, 200, T0)));
    assert_eq!(
        (r.rule.as_str(), r.limit, r.max),
        ("t", "tokens_per_minute", 1000)
    );
    // 950 of 1000 used: 300 fit once 250 slid out, in the next minute.
    assert!(r.wait_ms.unwrap() > 60_000, "{r:?}");
    // Another tenant has its own count.
    admitted(admit(&s, &c, &mut m, &ask("b", 100, 200, T0)));
    // Two calls used 50 tokens each of their 300: 500 come back.
    settle(&s, &c, &mut m, &held[0], charged(50), T0 + 10);
    settle(&s, &c, &mut m, &held[1], charged(50), T0 + 10);
    let a = admitted(admit(&s, &c, &mut m, &ask("a", 100, 200, T0 + 20)));
    assert_eq!(
        a.tokens.unwrap().remaining,
        1000 - (50 + 50 + 300 + 50 + 300)
    );
    assert_eq!(
        m.counters["llm_filter_limits_calls_totalrule=.=t;.;result=.=rejected;.;"],
        1
    );
    assert_eq!(
        m.counters["llm_filter_limits_tokens_totalrule=.=t;.;tenant=.=a;.;"],
        100
    );
    assert_eq!(
        m.gauges
            ["llm_filter_limits_used_permillerule=.=t;.;tenant=.=a;.;limit=.=tokens_per_minute;.;"],
        750
    );
}

#[test]
fn concurrent_calls_never_pass_the_limit_by_more_than_their_reservations() {
    // 32 calls in flight at once against 10 requests a minute: each
    // reservation is checked and added in one compare-and-swap, so exactly
    // ten go, however they interleave.
    let c = cfg(
        r#"{"rules":[{"name":"r","by":["tenant"],"requests_per_minute":10,"tokens_per_minute":100000}]}"#,
    );
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let passed = (0..32)
        .filter(|i| {
            matches!(
                admit(&s, &c, &mut m, &ask("a", 10, 10, T0 + i)),
                Decision::Pass(_)
            )
        })
        .count();
    assert_eq!(passed, 10);
}

#[test]
fn a_request_larger_than_the_limit_never_fits() {
    let c = cfg(r#"{"rules":[{"name":"t","tokens_per_minute":100}]}"#);
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let r = refused(admit(&s, &c, &mut m, &ask("a", 90, 20, T0)));
    assert_eq!(r.wait_ms, None);
}

#[test]
fn over_a_degrading_rule_the_call_goes_cheaper_until_the_ceiling() {
    let c = cfg(
        r#"{"rules":[{"name":"d","by":["tenant"],"tokens_per_minute":1000,
            "degrade":{"max_tokens":50,"model":"gpt-4o-mini","until":1.2}}]}"#,
    );
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let a = admitted(admit(&s, &c, &mut m, &ask("a", 400, 500, T0)));
    assert_eq!(a.cheaper, None, "900 of 1000");
    // 900 + 600 > 1000, but 900 + 100 + 50 ≤ 1200: degraded.
    let a = admitted(admit(&s, &c, &mut m, &ask("a", 100, 500, T0)));
    let cheaper = a.cheaper.unwrap();
    assert_eq!(cheaper.max_tokens, Some(50));
    assert_eq!(cheaper.model.as_deref(), Some("gpt-4o-mini"));
    // 1050 + 150 = 1200 still fits; then nothing does.
    admitted(admit(&s, &c, &mut m, &ask("a", 100, 500, T0)));
    refused(admit(&s, &c, &mut m, &ask("a", 100, 500, T0)));
    assert_eq!(
        m.counters["llm_filter_limits_calls_totalrule=.=d;.;result=.=degraded;.;"],
        2
    );
}

#[test]
fn a_refusal_by_one_rule_gives_back_what_the_others_reserved() {
    let c = cfg(r#"{"rules":[{"name":"big","tokens_per_minute":1000},
                     {"name":"small","by":["user"],"requests_per_minute":1}]}"#);
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let user = |u: &'static str| Ask {
        user: Some(u),
        ..ask("a", 100, 100, T0)
    };
    admitted(admit(&s, &c, &mut m, &user("u1")));
    assert_eq!(refused(admit(&s, &c, &mut m, &user("u1"))).rule, "small");
    // The refused call's 200 went back to `big`: 1000 − 200 left after u2.
    let a = admitted(admit(&s, &c, &mut m, &user("u2")));
    assert_eq!(a.tokens.unwrap().remaining, 600);
}

#[test]
fn p0_and_other_models_are_exempt_unless_named() {
    let c = cfg(r#"{"rules":[{"name":"t","models":["gpt-4o"],"requests_per_minute":1}]}"#);
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    admitted(admit(&s, &c, &mut m, &ask("a", 1, 1, T0)));
    refused(admit(&s, &c, &mut m, &ask("a", 1, 1, T0)));
    let p0 = Ask {
        priority: Priority::P0,
        ..ask("a", 1, 1, T0)
    };
    assert!(admitted(admit(&s, &c, &mut m, &p0)).held.is_empty());
    let other = Ask {
        model: Some("gpt-4o-mini"),
        ..ask("a", 1, 1, T0)
    };
    assert!(admitted(admit(&s, &c, &mut m, &other)).held.is_empty());
}

#[test]
fn cost_is_reserved_at_the_price_and_settled_with_the_cached_share() {
    let c = cfg(
        r#"{"prices":{"gpt-4o":{"input":2,"cached_input":1,"output":10}},
            "rules":[{"name":"c","by":["tenant"],"models":["gpt-4o"],"cost_per_day":0.01}]}"#,
    );
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    // 1000 in + 500 out reserved: 0.002 + 0.005 = 0.007 of 0.01.
    let a = admitted(admit(&s, &c, &mut m, &ask("a", 1000, 500, T0)));
    refused(admit(&s, &c, &mut m, &ask("a", 1000, 500, T0)));
    let ended = Ended {
        usage: Some(Usage {
            prompt_tokens: 1000,
            completion_tokens: 100,
            cached_tokens: 800,
            ..Usage::default()
        }),
        answered: true,
        streamed: false,
        completed: true,
        events: 0,
        prompt_tokens: 1000,
        reserved_output: 500,
    };
    let ch = charge(&c, &mut m, Some("gpt-4o"), &ended);
    // 200 × 2 + 800 × 1 + 100 × 10 per million = 0.0022.
    assert_eq!(ch.cost, 2_200_000);
    settle(&s, &c, &mut m, &a.held, ch, T0 + 1);
    admitted(admit(&s, &c, &mut m, &ask("a", 1000, 500, T0 + 2)));
    assert_eq!(
        m.counters["llm_filter_limits_cost_micros_totalrule=.=c;.;tenant=.=a;.;"],
        2_200
    );
    // The next UTC day starts again.
    let day = 86_400_000;
    admitted(admit(&s, &c, &mut m, &ask("a", 1000, 500, T0 + day)));
}

#[test]
fn cost_is_settled_at_the_caches_write_rates_and_the_long_context() {
    // Anthropic's Sonnet 4.5: writes at 1.25 and 2 times the input, reads at
    // 0.1; all of a call past 200,000 prompt tokens at $6 / $22.50.
    let c = cfg(
        r#"{"prices":{"claude-sonnet-4-5*":{"input":3,"cached_input":0.3,"cache_write":3.75,"cache_write_1h":6,"output":15,
              "long_context":{"above":200000,"input":6,"cached_input":0.6,"cache_write":7.5,"cache_write_1h":12,"output":22.5}}},
            "rules":[{"name":"c","by":["tenant"],"models":["claude-sonnet-4-5-20250929"],"cost_per_day":100}]}"#,
    );
    let mut m = MemoryMetrics::default();
    let ended = |usage| Ended {
        usage: Some(usage),
        answered: true,
        streamed: false,
        completed: true,
        events: 0,
        prompt_tokens: 0,
        reserved_output: 0,
    };
    let written = Usage {
        prompt_tokens: 100_000,
        cached_tokens: 50_000,
        cache_write_tokens: 30_000,
        cache_write_1h_tokens: 10_000,
        completion_tokens: 1_000,
        ..Usage::default()
    };
    let model = Some("claude-sonnet-4-5-20250929");
    // 20K × 3 + 50K × 0.3 + 20K × 3.75 + 10K × 6 + 1K × 15 per million.
    let ch = charge(&c, &mut m, model, &ended(written));
    assert_eq!(ch.cost, 225_000_000);
    let long = Usage {
        prompt_tokens: 250_000,
        ..written
    };
    // 170K × 6 + 50K × 0.6 + 20K × 7.5 + 10K × 12 + 1K × 22.5.
    assert_eq!(charge(&c, &mut m, model, &ended(long)).cost, 1_342_500_000);
}

#[test]
fn a_charge_is_mended_where_the_usage_cannot_be_trusted() {
    let c = cfg(r#"{"rules":[{"name":"t","tokens_per_minute":100}]}"#);
    let mut m = MemoryMetrics::default();
    let base = Ended {
        usage: None,
        answered: true,
        streamed: false,
        completed: false,
        events: 0,
        prompt_tokens: 30,
        reserved_output: 70,
    };
    // No usage: the reservation.
    assert_eq!(charge(&c, &mut m, None, &base).tokens, 100);
    // A stream cut short: the prompt and a token per event.
    let cut = Ended {
        streamed: true,
        events: 12,
        ..base
    };
    assert_eq!(charge(&c, &mut m, None, &cut).tokens, 42);
    // No backend answered: the request only.
    let failed = Ended {
        answered: false,
        ..base
    };
    assert_eq!(
        charge(&c, &mut m, None, &failed),
        Charge {
            requests: 1,
            tokens: 0,
            cost: 0
        }
    );
    // A usage past belief is bounded.
    let lie = Ended {
        usage: Some(Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            cached_tokens: 0,
            ..Usage::default()
        }),
        ..base
    };
    assert_eq!(
        charge(&c, &mut m, None, &lie).tokens,
        2 * MAX_TOKENS_PER_CALL
    );
    for reason in ["usage_unknown", "stream_cut_short", "usage_clamped"] {
        let k = format!("llm_filter_limits_estimated_totalreason=.={reason};.;");
        assert_eq!(m.counters[&k], 1, "{reason}");
    }
}

#[test]
fn keys_past_the_records_share_one_and_stay_limited() {
    // One record per rule: the second tenant finds it held and counts with
    // the first — stricter, never looser.
    let c = cfg(r#"{"max_keys":1,"rules":[{"name":"t","by":["tenant"],"requests_per_minute":2}]}"#);
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    admitted(admit(&s, &c, &mut m, &ask("a", 1, 1, T0)));
    let b = admitted(admit(&s, &c, &mut m, &ask("b", 1, 1, T0)));
    assert!(!b.held[0].place.own);
    refused(admit(&s, &c, &mut m, &ask("c", 1, 1, T0)));
    assert_eq!(
        m.counters["llm_filter_limits_estimated_totalreason=.=record_shared;.;"],
        1
    );
    assert_eq!(s.len(), 1, "bounded by max_keys");
    // Once the minute slid out, the record is free for the next key.
    let later = T0 + 120_000;
    assert!(
        admitted(admit(&s, &c, &mut m, &ask("c", 1, 1, later))).held[0]
            .place
            .own
    );
}

#[test]
fn a_store_that_fails_lets_the_call_go_and_says_so() {
    struct Broken;
    impl SharedStore for Broken {
        fn get(&self, _: &str) -> Result<crate::host::Versioned, crate::host::StoreError> {
            Err(crate::host::StoreError::Host)
        }
        fn set(&self, _: &str, _: &[u8], _: Option<u32>) -> Result<(), crate::host::StoreError> {
            Err(crate::host::StoreError::Host)
        }
    }
    let c = cfg(r#"{"rules":[{"name":"t","requests_per_minute":1}]}"#);
    let mut m = MemoryMetrics::default();
    for _ in 0..3 {
        assert!(admitted(admit(&Broken, &c, &mut m, &ask("a", 1, 1, T0)))
            .held
            .is_empty());
    }
    assert_eq!(
        m.counters["llm_filter_limits_calls_totalrule=.=t;.;result=.=unenforced;.;"],
        3
    );
    assert_eq!(
        m.counters["llm_filter_internal_errors_totalreason=.=limits_store;.;"],
        3
    );
}

#[test]
fn a_move_keeps_shared_reservations_and_takes_the_new_models_own() {
    let c = cfg(r#"{"rules":[
        {"name":"all","by":["tenant"],"requests_per_minute":10},
        {"name":"per-model","by":["tenant","model"],"requests_per_minute":10},
        {"name":"big","by":["tenant"],"models":["big"],"requests_per_minute":1}]}"#);
    let (s, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    let small = admitted(admit(&s, &c, &mut m, &ask("a", 1, 1, T0)));
    assert_eq!(small.held.len(), 2);
    let to_big = Ask {
        model: Some("big"),
        ..ask("a", 1, 1, T0)
    };
    let Switch::Go { held, left_behind } = switch(&s, &c, &mut m, &to_big, &small.held) else {
        panic!("refused");
    };
    // `all` is the same count; `per-model` and `big` are counts of big.
    assert_eq!(held.len(), 3);
    assert_eq!(held.iter().filter(|h| small.held.contains(h)).count(), 1);
    assert_eq!(left_behind.len(), 1);
    assert_eq!(left_behind[0].rule, 1);
    // big's one call a minute is taken: the next move is refused and
    // reserves nothing.
    let again = admitted(admit(&s, &c, &mut m, &ask("a", 1, 1, T0)));
    match switch(&s, &c, &mut m, &to_big, &again.held) {
        Switch::Refuse(r) => {
            assert_eq!(r.rule, "big");
            assert_eq!(r.requests.map(|l| l.remaining), Some(0));
        }
        other => panic!("{other:?}"),
    }
    // A call asking for big itself meets the same spent count.
    assert_eq!(refused(admit(&s, &c, &mut m, &to_big)).rule, "big");
}
