//! The configurations users deploy: the demo and provider bootstraps pass
//! `envoy --mode validate`, and every place that carries the `stats_tags` rules
//! carries the same ones as `envoy/envoy.yaml`, which the harness also uses
//! (the Istio bootstrap override: module `istio`).

use llm_filter_e2e::{
    skip_without_envoy, stats_config_yaml, stats_tag_rules, validate_config, workspace_root,
};

fn read(path: &str) -> String {
    let full = workspace_root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

#[test]
fn stats_tags_have_one_set_of_rules() {
    let demo = stats_tag_rules(&read("envoy/envoy.yaml"));
    for label in ["priority", "model", "outcome", "token_type"] {
        assert!(
            demo.iter().any(|(name, _)| name == label),
            "envoy/envoy.yaml has no `{label}` rule: {demo:?}"
        );
    }
    // examples/istio/stats-tags.yaml carries them as JSON: e2e `istio` checks it.
    assert_eq!(
        stats_tag_rules(&read("envoy/provider.yaml")),
        demo,
        "envoy/provider.yaml differs from envoy/envoy.yaml"
    );
    // What the end-to-end tests run with is the demo's block itself.
    assert_eq!(stats_tag_rules(&stats_config_yaml()), demo);
}

#[test]
fn deployed_bootstraps_validate() {
    if skip_without_envoy("deployed_bootstraps_validate") {
        return;
    }
    // Both name the module by its path relative to the workspace root, where
    // `make build` puts it and from where the validation runs.
    let module = "target/wasm32-wasip1/release/llm_filter.wasm";
    assert!(
        workspace_root().join(module).is_file(),
        "{module} is missing: build it with `make build`"
    );
    let provider = read("envoy/provider.yaml")
        .replace("PROVIDER_HOST", "provider.invalid")
        .replace("PROVIDER_PORT", "443");
    for (path, yaml) in [
        ("envoy/envoy.yaml", read("envoy/envoy.yaml")),
        ("envoy/provider.yaml", provider),
    ] {
        assert!(yaml.contains(module), "{path} does not load {module}");
        validate_config(&yaml).unwrap_or_else(|e| panic!("{path}: {e:#}"));
    }
}
