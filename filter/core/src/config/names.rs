//! The names the configuration gives: every model it routes, rewrites to,
//! falls back to, watches, limits, prices or caches, and every cluster it
//! routes to. The tables bounded first come, first served (a worker's model
//! labels, the load records, the learnt prompt ratios, the mesh-wide load
//! readings) always keep a place for these, so a client that names made-up
//! models cannot push out what the configuration acts on; the names it did
//! not give share what is left, and then one overflow entry.

use crate::stat_name;

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
    /// The set of `models` and routed `clusters` (each as often as it
    /// comes: kept once).
    pub fn new<'a>(
        models: impl IntoIterator<Item = &'a str>,
        clusters: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let models = sorted(models.into_iter().map(str::to_string));
        let model_labels = sorted(models.iter().map(|m| stat_name::label_value(m)));
        let cluster_labels = sorted(clusters.into_iter().map(stat_name::label_value));
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

/// `names` sorted, each once. Sorted as `&str`s, whose sort the module holds
/// anyway (the JSON reader's check for repeated keys), rather than compiling
/// one more sort for `String`s into it: the names are few and copied once.
pub fn sorted(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let names: Vec<String> = names.into_iter().collect();
    let mut refs: Vec<&str> = names.iter().map(String::as_str).collect();
    refs.sort_unstable();
    refs.dedup();
    refs.into_iter().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kept_once_and_compared_as_labels_too() {
        let n = Names::new(["b", "embed model", "a", "b"], ["cache.west", "east"]);
        assert_eq!(n.models(), ["a", "b", "embed model"]);
        assert!(n.has_model("a") && !n.has_model("c"));
        // Labels are compared as shared data and Prometheus write them.
        assert!(n.has_model_label("embed_model") && !n.has_model("embed_model"));
        assert!(n.has_cluster_label("cache_west") && !n.has_cluster_label("cache.west"));
        assert_eq!((n.model_labels(), n.cluster_labels()), (3, 2));
        let none = Names::default();
        assert!(none.models().is_empty() && !none.has_model_label("other"));
    }
}
