//! Loading the plugin configuration in the real Envoy: `{}` and every documented
//! field load; an unknown field or an invalid value makes Envoy refuse the
//! configuration, with a log line naming the field and the bad value. Which
//! values are refused is the core's unit tests' job; these prove the refusal
//! reaches Envoy.

use llm_filter_e2e::{
    chat_body, post_json, sidecar_wasm_path, skip_without_envoy, unique, wasm_path, EnvoyBuilder,
    MockConfig, MockUpstream,
};
use serde_json::json;

#[tokio::test]
async fn valid_configs_load_and_serve() {
    if skip_without_envoy("valid_configs_load_and_serve") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("cfg"));
    let configs = [
        json!({}),
        json!({
            "llm_paths": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"],
            "priority": {"default": "P1", "trust_client": true},
            "tracing": {"mode": "always"},
        }),
        json!({
            "llm_paths": ["/v1/chat/completions"],
            "priority": {"default": "p2", "trust_client": false},
            "tracing": {"mode": "off"},
        }),
    ];
    for config in configs {
        let envoy = EnvoyBuilder::new()
            .plugin_config(&config)
            .upstream("mock", mock.port())
            .start()
            .unwrap_or_else(|e| panic!("{config} must load: {e:#}"));
        let response = post_json(
            &envoy.url("/v1/chat/completions"),
            &chat_body("gpt-4o", "configured"),
            &[],
        )
        .await
        .unwrap();
        assert_eq!(response.status, 200, "{config}: {}", response.text());
        let seen = mock.last_request().expect("upstream saw the call");
        assert!(
            seen.header("x-request-priority").is_some(),
            "{config}: the filter is active"
        );
    }

    // `llm_paths` decides what is an LLM call.
    let envoy = EnvoyBuilder::new()
        .plugin_config(json!({"llm_paths": ["/v1/completions"]}))
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with custom llm_paths");
    for (path, tagged) in [
        ("/v1/chat/completions", false),
        ("/v1/completions", true),
        ("/v1/completions?stream=0", true),
    ] {
        mock.clear();
        let body = json!({"model": "gpt-4o", "prompt": unique("p"), "messages": []});
        let response = post_json(&envoy.url(path), &body, &[]).await.unwrap();
        assert_eq!(response.header("x-trace-id").is_some(), tagged, "{path}");
        let seen = mock.last_request().expect("upstream saw the call");
        assert_eq!(
            seen.header("x-request-priority").is_some(),
            tagged,
            "{path}"
        );
    }
}

#[test]
fn invalid_configs_are_refused_naming_field_and_value() {
    if skip_without_envoy("invalid_configs_are_refused_naming_field_and_value") {
        return;
    }
    // (configuration, field, bad value) — both must be named in Envoy's log.
    // The refusal table itself is unit-tested in the core
    // (`config::tests::errors_name_the_field_and_value`); here one unknown field
    // and one bad value prove Envoy refuses what the core refuses, plus what the
    // core's table does not list.
    let cases = [
        (
            r#"{"tracing": {"mode": "off", "sampler": 1}}"#,
            "tracing.sampler",
            "sampler",
        ),
        (
            r#"{"priority": {"default": "P7"}}"#,
            "priority.default",
            "P7",
        ),
        (r#"{"tracing": {"mode": "OFF"}}"#, "tracing.mode", "OFF"),
        (
            r#"{"ab": {"groups": [{"name": "a", "percent": 60}]}}"#,
            "ab.groups",
            "sum to 60",
        ),
        (
            r#"{"shaping": {"max_tokens_cap": {"P1": 0}}}"#,
            "shaping.max_tokens_cap.P1",
            "0 is not",
        ),
        // A key written twice: one reader keeps the first, another the last.
        (
            r#"{"priority": {"default": "P0", "default": "P2"}}"#,
            "priority.default",
            "written twice",
        ),
    ];
    for (config, field, value) in cases {
        let error = match EnvoyBuilder::new()
            .plugin_config(config)
            .upstream("unused", 9)
            .start()
        {
            Ok(envoy) => panic!(
                "{config}: envoy accepted the configuration\n{}",
                envoy.log_tail(20)
            ),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            error.contains("envoy exited"),
            "{config}: envoy did not refuse to start: {error}"
        );
        // The filter's own line names the field and the value.
        let line = error
            .lines()
            .find(|l| l.contains("invalid configuration"))
            .unwrap_or_else(|| panic!("{config}: no configuration error logged:\n{error}"));
        assert!(
            line.contains(field),
            "{config}: field {field:?} not in {line}"
        );
        assert!(
            line.contains(value),
            "{config}: value {value:?} not in {line}"
        );
    }
}

/// The sidecar build refuses a configuration naming a part it does not
/// have — naming the field and the build — rather than running without it;
/// the full build loads the same document.
#[test]
fn a_part_the_sidecar_build_leaves_out_is_refused_naming_the_build() {
    if skip_without_envoy("a_part_the_sidecar_build_leaves_out_is_refused_naming_the_build") {
        return;
    }
    let sidecar = sidecar_wasm_path();
    assert!(
        sidecar.is_file(),
        "no sidecar module at {} (make build)",
        sidecar.display()
    );
    // (configuration, the field named, what is not in the build)
    let cases = [
        (json!({"cache": {"enabled": true}}), "cache", "`cache`"),
        (json!({"routing": {}}), "routing", "`routing`"),
        (json!({"limits": {}}), "limits", "`limits`"),
        (json!({"guardrails": {}}), "guardrails", "`guardrails`"),
        (json!({"credentials": {}}), "credentials", "`credentials`"),
        (json!({"admin": {"token": "t0ken"}}), "admin", "`admin`"),
        (
            json!({"ab": {"groups": [{"name": "a"}, {"name": "b"}]}}),
            "ab",
            "`ab`",
        ),
        (
            json!({"tracing": {"otlp": {"cluster": "otlp"}}}),
            "tracing.otlp",
            "`otlp`",
        ),
        (
            json!({"degrade": {"levels": {"2": {"P2": ["shed"], "P1": ["cache"]}}}}),
            "degrade.levels.2.P1[0]",
            "the `cache` action",
        ),
    ];
    for (config, field, what) in &cases {
        let error = match EnvoyBuilder::new()
            .wasm_path(&sidecar)
            .plugin_config(config)
            .upstream("unused", 9)
            .start()
        {
            Ok(envoy) => panic!(
                "{config}: the sidecar build accepted it\n{}",
                envoy.log_tail(20)
            ),
            Err(e) => format!("{e:#}"),
        };
        let line = error
            .lines()
            .find(|l| l.contains("invalid configuration"))
            .unwrap_or_else(|| panic!("{config}: no configuration error logged:\n{error}"));
        let want = format!(
            "at `{field}`: {what} is not in the sidecar build of the module; use the full build"
        );
        assert!(line.contains(&want), "{config}: {want:?} not in {line}");
        assert!(
            !error.contains("t0ken"),
            "the admin token in the log: {error}"
        );
    }
    // The full build loads what the sidecar build refuses.
    let (config, _, _) = &cases[0];
    EnvoyBuilder::new()
        .wasm_path(wasm_path())
        .plugin_config(config)
        .upstream("unused", 9)
        .start()
        .unwrap_or_else(|e| panic!("{config}: the full build must load it: {e:#}"));
}

/// The sidecar build with `{}` keeps no cache of its own: no table in
/// shared data, and no `x-cache` of its own on an answer, so the one the
/// gateway tier tells (its HIT) reaches the client unchanged (e2e
/// `istiod::topology` runs it in front of the gateway).
#[tokio::test]
async fn the_sidecar_build_tells_no_x_cache_of_its_own() {
    if skip_without_envoy("the_sidecar_build_tells_no_x_cache_of_its_own") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("cfg"));
    let envoy = EnvoyBuilder::new()
        .wasm_path(sidecar_wasm_path())
        .plugin_config(json!({}))
        .upstream("mock", mock.port())
        .start()
        .expect("the sidecar build with {}");
    let body = json!({"model": "gpt-4o-mini", "temperature": 0,
        "messages": [{"role": "user", "content": unique("cacheable")}]});
    for _ in 0..2 {
        let r = post_json(&envoy.url("/v1/chat/completions"), &body, &[])
            .await
            .expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-cache"), None, "{:?}", r.headers);
        assert!(r.header("x-trace-id").is_some(), "{:?}", r.headers);
    }
    assert_eq!(mock.count("POST", "/v1/chat/completions"), 2);
    let log = envoy.log_contents();
    assert!(!log.contains("response cache of"), "{log}");
}
