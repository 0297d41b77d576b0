//! Model choice by request traits (`routing.rules`, tried in order; the first
//! rule whose conditions all hold picks the model): `"model": "auto"` or any
//! alias becomes a concrete model by estimated prompt size, priority,
//! tools and streaming, as the call's dialect read them from the request body
//! the walk parsed once ([`Features`]).

use crate::dialect::features::Features;
use crate::priority::Priority;
use crate::routing::config::{Rule, When};
use crate::tokens::Ratio;

impl Features {
    /// These features with the prompt estimate as a model of `ratio` counts
    /// it: what the rules compare.
    pub fn calibrated(&self, ratio: Ratio) -> Features {
        Features {
            prompt_tokens: ratio.apply(self.prompt_tokens),
            ..self.clone()
        }
    }
}

impl When {
    /// Whether every condition holds for a call.
    pub fn matches(&self, requested: &str, f: &Features, priority: Priority) -> bool {
        self.models
            .as_ref()
            .is_none_or(|m| m.iter().any(|n| n == requested))
            && self
                .min_prompt_tokens
                .is_none_or(|min| f.prompt_tokens >= min)
            && self
                .max_prompt_tokens
                .is_none_or(|max| f.prompt_tokens <= max)
            && self
                .priorities
                .as_ref()
                .is_none_or(|p| p.contains(&priority))
            && self.tools.is_none_or(|t| t == f.tools)
            && self.stream.is_none_or(|s| s == f.stream)
    }
}

/// Some rule looks at the prompt's size: the prompt estimate is to be
/// calibrated for them.
pub fn weigh_prompts(rules: &[Rule]) -> bool {
    rules
        .iter()
        .any(|r| r.when.min_prompt_tokens.is_some() || r.when.max_prompt_tokens.is_some())
}

/// The model the first matching rule picks for a call that asked for
/// `requested`; `None` when no rule matches (keep the requested model).
pub fn choose_model(
    rules: &[Rule],
    requested: &str,
    features: &Features,
    priority: Priority,
) -> Option<String> {
    rules
        .iter()
        .find(|r| r.when.matches(requested, features, priority))
        .map(|r| r.model.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(when: When, model: &str) -> Rule {
        Rule {
            when,
            model: model.into(),
        }
    }

    #[test]
    fn first_matching_rule_wins() {
        let auto = Some(vec!["auto".to_string(), "smart".to_string()]);
        let rules = [
            rule(
                When {
                    models: auto.clone(),
                    min_prompt_tokens: Some(8_000),
                    ..When::default()
                },
                "big",
            ),
            rule(
                When {
                    models: auto.clone(),
                    priorities: Some(vec![Priority::P0]),
                    ..When::default()
                },
                "best",
            ),
            rule(
                When {
                    models: auto.clone(),
                    tools: Some(true),
                    stream: Some(false),
                    max_prompt_tokens: Some(100),
                    ..When::default()
                },
                "tooly",
            ),
            rule(
                When {
                    models: auto,
                    ..When::default()
                },
                "small",
            ),
        ];
        let feat = |prompt_tokens, tools, stream| Features {
            model: None,
            prompt_tokens,
            tools,
            stream,
            measured: true,
        };
        let p1 = Priority::P1;
        for (requested, features, priority, want) in [
            ("auto", feat(9_000, false, false), p1, Some("big")),
            ("smart", feat(8_000, false, false), p1, Some("big")),
            (
                "auto",
                feat(7_999, false, false),
                Priority::P0,
                Some("best"),
            ),
            ("auto", feat(100, true, false), p1, Some("tooly")),
            ("auto", feat(101, true, false), p1, Some("small")),
            ("auto", feat(10, true, true), p1, Some("small")),
            ("auto", feat(0, false, false), Priority::P2, Some("small")),
            ("gpt-4o", feat(9_000, true, false), Priority::P0, None),
            ("AUTO", feat(0, false, false), p1, None),
        ] {
            assert_eq!(
                choose_model(&rules, requested, &features, priority).as_deref(),
                want,
                "{requested} {features:?} {priority}"
            );
        }
        assert_eq!(choose_model(&[], "auto", &Features::default(), p1), None);
    }

    #[test]
    fn empty_condition_matches_everything() {
        let rules = [rule(When::default(), "m")];
        assert_eq!(
            choose_model(&rules, "anything", &Features::default(), Priority::P2).as_deref(),
            Some("m")
        );
    }
}
