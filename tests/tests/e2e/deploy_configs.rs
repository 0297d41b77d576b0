//! The configurations users deploy: the demo and provider bootstraps pass
//! `envoy --mode validate`, and every place that carries the `stats_tags` rules
//! carries the same ones as `envoy/envoy.yaml`, which the harness also uses
//! (the Istio bootstrap override: module `istio`).

use llm_filter_core::metrics;
use llm_filter_e2e::{
    provider_bootstrap, provider_bootstrap_from, skip_without_envoy, stats_config_yaml,
    stats_tag_rules, validate_config, workspace_root,
};

fn read(path: &str) -> String {
    let full = workspace_root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

#[test]
fn stats_tags_have_one_set_of_rules() {
    // The demo carries one rule per label the filter writes, each with the
    // regex that reads back the filter's own encoding (metrics.rs).
    let demo = stats_tag_rules(&read("envoy/envoy.yaml"));
    let expected: Vec<(String, String)> = metrics::LABELS
        .iter()
        .map(|label| (label.to_string(), metrics::tag_regex(label)))
        .collect();
    assert_eq!(demo, expected, "envoy/envoy.yaml against metrics::LABELS");
    for path in rule_carriers() {
        assert_eq!(
            stats_tag_rules(&read(&path)),
            demo,
            "{path} differs from envoy/envoy.yaml"
        );
    }
    // examples/istio/stats-tags.yaml carries them as JSON: e2e `istio` checks it.
    // What the end-to-end tests run with is the demo's block itself.
    assert_eq!(stats_tag_rules(&stats_config_yaml()), demo);
}

/// Every other file that carries `stats_tags` rules: the other bootstraps of
/// `envoy/` and any example under `examples/`. An `applyTo: BOOTSTRAP` EnvoyFilter is
/// left out: no supported Istio applies one, so its rules reach no proxy.
fn rule_carriers() -> Vec<String> {
    let mut paths: Vec<String> = SHIPPED
        .iter()
        .filter(|p| **p != "envoy/envoy.yaml")
        .map(|p| p.to_string())
        .collect();
    let mut dirs = vec![workspace_root().join("examples")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.contains("tag_name:") && !text.contains("applyTo: BOOTSTRAP") {
                let rel = path.strip_prefix(workspace_root()).unwrap_or(&path);
                paths.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    paths
}

/// Every bootstrap under `envoy/`; the test below fails on one left out.
const SHIPPED: [&str; 6] = [
    "envoy/affinity-pool.yaml",
    "envoy/envoy.yaml",
    "envoy/provider.yaml",
    "envoy/shard-front.yaml",
    "envoy/shard-gateway.yaml",
    "envoy/tracing-off.yaml",
];

/// The files that take the provider placeholders, rendered by
/// scripts/provider-config.sh.
const RENDERED: [&str; 2] = ["envoy/provider.yaml", "envoy/shard-gateway.yaml"];

#[test]
fn deployed_bootstraps_validate() {
    if skip_without_envoy("deployed_bootstraps_validate") {
        return;
    }
    // Both name the module by its path relative to the workspace root, where
    // `make build` puts it and from where the validation runs.
    let module = "target/llm_filter.wasm";
    assert!(
        workspace_root().join(module).is_file(),
        "{module} is missing: build it with `make build`"
    );
    let mut on_disk: Vec<String> = std::fs::read_dir(workspace_root().join("envoy"))
        .unwrap()
        .flatten()
        .map(|e| format!("envoy/{}", e.file_name().to_string_lossy()))
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    assert_eq!(
        on_disk, SHIPPED,
        "every bootstrap under envoy/ is validated"
    );
    assert_eq!(
        provider_bootstrap("provider.invalid", 443, None).unwrap(),
        provider_bootstrap_from("envoy/provider.yaml", "provider.invalid", 443, None).unwrap()
    );
    for path in SHIPPED {
        // As `make run PROVIDER_HOST=…` renders it, against the system CA bundle.
        let yaml = if RENDERED.contains(&path) {
            let yaml = provider_bootstrap_from(path, "provider.invalid", 443, None)
                .unwrap_or_else(|e| panic!("render {path}: {e:#}"));
            assert!(!yaml
                .lines()
                .any(|l| !l.trim_start().starts_with('#') && l.contains("PROVIDER_")));
            yaml
        } else {
            read(path)
        };
        assert!(yaml.contains(module), "{path} does not load {module}");
        validate_config(&yaml).unwrap_or_else(|e| panic!("{path}: {e:#}"));
    }
}
