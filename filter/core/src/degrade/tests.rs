use super::*;
use crate::build;
use crate::host::{MemoryMetrics, MemoryStore};
use crate::summary::{CallSummary, End};
use crate::walk::fake::with_section;

fn config(json: &str) -> Config {
    Config::parse(json.as_bytes()).unwrap()
}

fn signals(rps: f64, tokens_per_s: f64, in_flight: u32) -> Signals {
    Signals {
        rps,
        tokens_per_s,
        in_flight,
    }
}

/// The alerts come by the admin endpoints' webhook (the `admin` feature).
#[cfg(feature = "admin")]
#[test]
fn the_level_is_the_highest_of_thresholds_and_alerts() {
    let c = config(
        r#"{"admin":{"token":"0123456789abcdef"},"degrade":{"thresholds":[
            {"signal":"in_flight","above":2,"level":1},
            {"model":"big","signal":"rps","above":0.5,"level":2},
            {"signal":"tokens_per_s","above":100,"level":3}]}}"#,
    );
    let cfg = &c.degrade;
    assert_eq!(
        threshold_level(cfg, "m", &signals(0.0, 0.0, 2)),
        0,
        "above, not at"
    );
    assert_eq!(threshold_level(cfg, "m", &signals(0.0, 0.0, 3)), 1);
    assert_eq!(
        threshold_level(cfg, "m", &signals(1.0, 0.0, 3)),
        1,
        "scoped to big"
    );
    assert_eq!(threshold_level(cfg, "big", &signals(1.0, 0.0, 3)), 2);
    assert_eq!(threshold_level(cfg, "m", &signals(0.0, 101.0, 0)), 3);
    assert_eq!(
        threshold_level(&DegradeConfig::default(), "m", &signals(1e9, 1e9, 99)),
        0,
        "none by default"
    );

    // Through shared data: in-flight calls raise the level, an alert raises it more.
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    assert_eq!(level(&store, &c, "m", 0), 0);
    for _ in 0..3 {
        load::started(&store, &mut m, &c.names, "m", 0);
    }
    assert_eq!(level(&store, &c, "m", 0), 1);
    let hook = br#"{"version":"4","alerts":[{"status":"firing","labels":{"severity":"critical","model":"m"}}]}"#;
    let reports = alerts::parse(hook, 0).unwrap();
    alerts::apply(&store, &c.degrade, &reports, 0).unwrap();
    assert_eq!(level(&store, &c, "m", 0), 3);
    let no_token = Config {
        admin: Default::default(),
        ..c.clone()
    };
    assert_eq!(
        level(&store, &no_token, "m", 0),
        1,
        "without a token no alert can arrive, and none is read"
    );
    assert_eq!(
        level(&store, &c, "other", 0),
        0,
        "the alert names its model"
    );
    for _ in 0..3 {
        let call = CallSummary {
            model: "m",
            ..CallSummary::ended(End::Answered(200))
        };
        load::ended(&store, &mut m, &c.names, &call, Some("m"));
    }
    assert_eq!(
        threshold_level(&c.degrade, "m", &load::read(&store, Scope::Model("m"), 0)),
        0
    );

    publish(&store, &c, &mut m, 0);
    assert_eq!(m.gauges["llm_filter_degrade_levelmodel=.=m;.;"], 3);
}

/// A chat completions call of `model`.
fn chat(model: &str) -> Target<'_> {
    Target {
        dialect: Dialect::Chat,
        path: "/v1/chat/completions",
        model,
    }
}

fn doc(body: &str) -> Document {
    Document::parse(body.as_bytes().to_vec())
}

#[test]
fn the_body_actions_edit_only_their_bytes() {
    let c =
        config(r#"{"degrade":{"fallback_model":{"gpt-4o":"gpt-4o-mini"},"max_tokens_cap":100}}"#);
    let cfg = &c.degrade;
    let body = r#"{"model":"gpt-4o","temperature":0.5,"max_tokens":4000,"messages":[]}"#;
    let s = signals(5.0, 0.0, 0);
    let all = cfg.actions(2, Priority::P1);
    let mut edited = doc(body);
    let e = edit(
        cfg,
        all,
        &mut edited,
        &chat("gpt-4o"),
        TokenField::MaxTokens,
        &s,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(edited.into_bytes()).unwrap(),
        r#"{"model":"gpt-4o-mini","temperature":0.17,"max_tokens":100,"messages":[]}"#
    );
    assert_eq!(
        e.applied,
        [
            Action::FallbackModel,
            Action::MaxTokens,
            Action::Temperature
        ]
    );
    assert_eq!(e.model.as_deref(), Some("gpt-4o-mini"));

    // Each on its own; a model without a fallback keeps its name.
    let e = edit(
        cfg,
        &[Action::MaxTokens],
        &mut doc(body),
        &chat("x"),
        TokenField::MaxTokens,
        &s,
    )
    .unwrap();
    assert_eq!(e.applied, [Action::MaxTokens]);
    assert!(edit(
        cfg,
        &[Action::FallbackModel],
        &mut doc(body),
        &chat("x"),
        TokenField::MaxTokens,
        &s,
    )
    .is_none());
    let small = r#"{"model":"x","max_completion_tokens":10,"temperature":0}"#;
    assert!(
        edit(
            cfg,
            all,
            &mut doc(small),
            &chat("x"),
            TokenField::MaxTokens,
            &s,
        )
        .is_none(),
        "nothing to lower"
    );
    // A body naming a key twice is never rewritten.
    let twice = r#"{"model":"gpt-4o","model":"gpt-4o","max_tokens":4000}"#;
    assert!(edit(
        cfg,
        all,
        &mut doc(twice),
        &chat("gpt-4o"),
        TokenField::MaxTokens,
        &s,
    )
    .is_none());
}

#[test]
fn a_gemini_call_is_switched_in_its_path_and_capped_in_its_config() {
    let c = config(
        r#"{"degrade":{"fallback_model":{"gemini-pro":"gemini-flash"},"max_tokens_cap":100}}"#,
    );
    let cfg = &c.degrade;
    let body = r#"{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"temperature":0.5,"maxOutputTokens":4000}}"#;
    let call = Target {
        dialect: Dialect::Gemini,
        path: "/v1beta/models/gemini-pro:streamGenerateContent?alt=sse",
        model: "gemini-pro",
    };
    let s = signals(5.0, 0.0, 0);
    let mut edited = doc(body);
    let all = cfg.actions(2, Priority::P1);
    let e = edit(cfg, all, &mut edited, &call, TokenField::MaxTokens, &s).unwrap();
    assert_eq!(
        String::from_utf8(edited.into_bytes()).unwrap(),
        r#"{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"temperature":0.17,"maxOutputTokens":100}}"#,
        "the body names no model"
    );
    assert_eq!(
        e.applied,
        [
            Action::FallbackModel,
            Action::MaxTokens,
            Action::Temperature
        ]
    );
    assert_eq!(e.model.as_deref(), Some("gemini-flash"));
    assert_eq!(
        e.path.as_deref(),
        Some("/v1beta/models/gemini-flash:streamGenerateContent?alt=sse")
    );
    // A fallback the path cannot take is no switch.
    let c = config(r#"{"degrade":{"fallback_model":{"gemini-pro":"a/b"}}}"#);
    assert!(edit(
        &c.degrade,
        &[Action::FallbackModel],
        &mut doc(body),
        &call,
        TokenField::MaxTokens,
        &s
    )
    .is_none());
}

#[test]
fn refusals_are_openai_shaped_503s_with_retry_after() {
    let cfg = DegradeConfig::default();
    assert!(refusal(&cfg, &[Action::MaxTokens]).is_none());
    let (action, r) = refusal(&cfg, &[Action::Shed]).unwrap();
    assert_eq!((action, r.status), (Action::Shed, 503));
    assert!(r.headers.contains(&("retry-after", "5".to_string())));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["code"], "llm_filter_degraded_shed");
    let (action, r) = refusal(&cfg, &[Action::Shed, Action::Reject]).unwrap();
    assert_eq!(action, Action::Reject);
    assert!(r.headers.contains(&("retry-after", "10".to_string())));

    let mut m = MemoryMetrics::default();
    count(&mut m, Action::Shed, Priority::P2);
    assert_eq!(
        m.counters["llm_filter_degraded_totalaction=.=shed;.;priority=.=P2;.;"],
        1
    );
}

#[test]
fn a_call_reads_each_source_once_and_none_it_does_not_use() {
    let key = |s: &MemoryStore| {
        (
            s.reads(alerts::KEY),
            s.reads(sources::mesh::KEY),
            s.reads(&Scope::Model("m").key()),
        )
    };
    let both = config(
        r#"{"degrade":{"alertmanager":{"cluster":"am"},"prometheus":{"cluster":"prom"},
            "thresholds":[{"signal":"rps","above":1,"level":1}]}}"#,
    );
    let store = MemoryStore::new();
    level(&store, &both, "m", 0);
    assert_eq!(key(&store), (1, 1, 1), "alerts, mesh load, local load");
    // Pulled alerts but no thresholds: the load is read only once a level is set.
    let alerts_only =
        config(r#"{"degrade":{"alertmanager":{"cluster":"am"},"prometheus":{"cluster":"prom"}}}"#);
    let store = MemoryStore::new();
    level(&store, &alerts_only, "m", 0);
    assert_eq!(key(&store), (1, 0, 0));
    // Neither source nor token nor thresholds: nothing is read.
    let store = MemoryStore::new();
    level(&store, &config("{}"), "m", 0);
    assert_eq!(key(&store), (0, 0, 0));
}

#[test]
fn thresholds_read_the_record_a_models_calls_count_in() {
    let c = config(&with_section(
        build::ROUTING,
        r#""routing":{"models":{"busy":[{"cluster":"a"}]}}"#,
        r#"{"degrade":{"thresholds":[
            {"model":"busy","signal":"in_flight","above":1,"level":2},
            {"signal":"in_flight","above":5,"level":1}]}}"#,
    ));
    let (store, mut m) = (MemoryStore::new(), MemoryMetrics::default());
    // Seventy made-up models in flight: the first 64 in records of their
    // own, the other six together in the overflow record.
    for i in 0..70 {
        load::started(&store, &mut m, &c.names, &format!("x{i}"), 0);
    }
    assert_eq!(level(&store, &c, "x0", 0), 0, "one in flight in its own");
    assert_eq!(level(&store, &c, "x69", 0), 1, "six in flight in `other`");
    assert_eq!(level(&store, &c, "never-seen", 0), 1);
    // The routed model still has a record, and its threshold acts.
    for _ in 0..2 {
        let joined = load::started(&store, &mut m, &c.names, "busy", 0);
        assert_eq!(joined.as_deref(), Some("busy"));
    }
    assert_eq!(level(&store, &c, "busy", 0), 2);
    publish(&store, &c, &mut m, 0);
    assert_eq!(m.gauges["llm_filter_degrade_levelmodel=.=busy;.;"], 2);
    assert_eq!(m.gauges["llm_filter_degrade_levelmodel=.=other;.;"], 1);
}
