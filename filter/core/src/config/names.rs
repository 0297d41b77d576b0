//! The names the configuration gives: every model it routes, rewrites to,
//! falls back to, watches, limits, prices or caches, and every cluster it
//! routes to. The tables bounded first come, first served (a worker's model
//! labels, the load records, the learnt prompt ratios, the mesh-wide load
//! readings) always keep a place for these, so a client that names made-up
//! models cannot push out what the configuration acts on; the names it did
//! not give share what is left, and then one overflow entry.

use crate::degrade::DegradeConfig;
use crate::routing::RoutingConfig;
use crate::stat_name;

use super::Config;

/// The models and clusters a configuration names, compiled once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// Models as the configuration spells them, sorted, once each.
    models: Vec<String>,
    /// The same as stat labels write them ([`stat_name::label_value`]):
    /// what shared-data keys and Prometheus samples carry.
    model_labels: Vec<String>,
    /// Routed clusters as stat labels write them.
    cluster_labels: Vec<String>,
}

impl Names {
    /// Every model and cluster `config` names, its A/B groups' included.
    pub fn of(config: &Config) -> Self {
        let mut models: Vec<&str> = Vec::new();
        routing_models(&config.routing, &mut models);
        degrade_models(&config.degrade, &mut models);
        for g in &config.ab.groups {
            if let Some(r) = &g.routing {
                routing_models(r, &mut models);
            }
            if let Some(d) = &g.degrade {
                degrade_models(d, &mut models);
            }
        }
        for rule in &config.limits.rules {
            models.extend(rule.models.iter().flatten().map(String::as_str));
            models.extend(rule.degrade.iter().filter_map(|d| d.model.as_deref()));
        }
        // `*` prices every other model: it names none.
        models.extend(
            config
                .limits
                .prices
                .keys()
                .map(String::as_str)
                .filter(|m| *m != "*"),
        );
        models.extend(config.cache.deterministic_models.iter().map(String::as_str));
        let models = sorted(models.into_iter().map(str::to_string));
        let model_labels = sorted(models.iter().map(|m| stat_name::label_value(m)));
        let cluster_labels = sorted(
            config
                .routing
                .clusters
                .iter()
                .map(|c| stat_name::label_value(&c.cluster)),
        );
        Self {
            models,
            model_labels,
            cluster_labels,
        }
    }

    /// The configuration names `model`, exactly as a request names it.
    pub fn has_model(&self, model: &str) -> bool {
        self.models
            .binary_search_by(|m| m.as_str().cmp(model))
            .is_ok()
    }

    /// Some model the configuration names has the stat label `label`.
    pub fn has_model_label(&self, label: &str) -> bool {
        self.model_labels
            .binary_search_by(|m| m.as_str().cmp(label))
            .is_ok()
    }

    /// Some routed cluster has the stat label `label`.
    pub fn has_cluster_label(&self, label: &str) -> bool {
        self.cluster_labels
            .binary_search_by(|c| c.as_str().cmp(label))
            .is_ok()
    }

    /// The models, sorted.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// Distinct stat labels of the models.
    pub fn model_labels(&self) -> usize {
        self.model_labels.len()
    }

    /// Distinct stat labels of the clusters.
    pub fn cluster_labels(&self) -> usize {
        self.cluster_labels.len()
    }
}

/// The models a routing table names: its keys, what each backend is sent,
/// the aliases its rules match, the models of its fallback chains.
fn routing_models<'a>(r: &'a RoutingConfig, out: &mut Vec<&'a str>) {
    for (model, backends) in &r.models {
        out.push(model);
        out.extend(backends.iter().filter_map(|b| b.model.as_deref()));
    }
    for rule in &r.rules {
        out.push(&rule.model);
        out.extend(rule.when.models.iter().flatten().map(String::as_str));
    }
    for (model, chain) in &r.fallbacks {
        out.push(model);
        out.extend(chain.to.iter().map(String::as_str));
    }
}

/// The models a degrade section names: the thresholds', the fallback
/// models on both sides, the alert rules' `model` matchers.
fn degrade_models<'a>(d: &'a DegradeConfig, out: &mut Vec<&'a str>) {
    out.extend(d.thresholds.iter().filter_map(|t| t.model.as_deref()));
    for (from, to) in &d.fallback_model {
        out.push(from);
        out.push(to);
    }
    for rule in &d.alerts {
        out.extend(
            rule.matchers
                .iter()
                .filter(|(label, _)| *label == "model")
                .map(|(_, v)| v.as_str()),
        );
    }
}

fn sorted(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = names.collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_section_that_names_a_model_is_read() {
        let c = Config::parse(
            br#"{
              "routing": {
                "models": {"gpt-4o": [{"cluster": "east", "model": "gpt-4o-2024"}],
                           "small": [{"cluster": "cache.west"}]},
                "rules": [{"when": {"model": ["alias"]}, "model": "small"}],
                "fallbacks": {"gpt-4o": {"to": ["small"]}}
              },
              "degrade": {
                "thresholds": [{"model": "watched", "signal": "rps", "above": 1, "level": 1}],
                "fallback_model": {"big": "cheap"},
                "alerts": [{"model": "alerted", "level": 2}]
              },
              "limits": {
                "rules": [{"name": "r", "models": ["limited"], "requests_per_minute": 5,
                           "degrade": {"model": "limited-cheap"}}],
                "prices": {"priced": {"input": 1, "output": 2}, "*": {"input": 1, "output": 1}}
              },
              "cache": {"deterministic_models": ["embed model"]},
              "ab": {"groups": [
                {"name": "g", "percent": 50, "overrides": {
                  "routing": {"models": {"small": [{"cluster": "canary-c", "model": "canary"}]}},
                  "degrade": {"fallback_model": {"small": "tiny"}}}},
                {"name": "h", "percent": 50}]}
            }"#,
        )
        .unwrap();
        let n = &c.names;
        assert_eq!(
            n.models(),
            [
                "alerted",
                "alias",
                "big",
                "canary",
                "cheap",
                "embed model",
                "gpt-4o",
                "gpt-4o-2024",
                "limited",
                "limited-cheap",
                "priced",
                "small",
                "tiny",
                "watched"
            ]
        );
        assert!(n.has_model("gpt-4o") && !n.has_model("gpt-4"));
        // Labels are compared as shared data and Prometheus write them.
        assert!(n.has_model_label("embed_model") && !n.has_model("embed_model"));
        assert!(n.has_cluster_label("east") && n.has_cluster_label("canary-c"));
        assert!(n.has_cluster_label("cache_west") && !n.has_cluster_label("cache.west"));
        assert!(!n.has_cluster_label("made-up"));
    }

    #[test]
    fn an_empty_configuration_names_nothing() {
        let n = Config::parse(b"{}").unwrap().names;
        assert!(n.models().is_empty());
        assert!(!n.has_model("") && !n.has_model_label("other"));
    }
}
