//! The `shaping` section: how much each priority may ask for. A number given
//! once applies to P1 and P2 and leaves P0 untouched; P0 is shaped only when
//! the per-priority form names it.

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::per_priority::RawPerPriority;
use crate::config::setting::{Named, Setting, Table};
use crate::dialect::request::TokenField;
use crate::priority::Priority;

/// `max_tokens_field`.
const MAX_TOKENS_FIELD: Named<TokenField> = Named {
    name: "max_tokens_field",
    default: TokenField::MaxTokens,
    spell: TokenField::as_str,
};
/// `calibrate_estimate`.
const CALIBRATE_ESTIMATE: Setting<bool> = Setting::any("calibrate_estimate", true);

/// The section's settings.
pub const SETTINGS: Table = &[("shaping", &[&CALIBRATE_ESTIMATE, &MAX_TOKENS_FIELD])];

crate::read_fields! {
    /// `shaping` as written by the operator (also an A/B group's `overrides.shaping`).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct RawShapingConfig {
        /// Most output tokens a call may ask for; a call asking for none gets it.
        pub max_tokens_cap: Option<RawPerPriority>,
        /// Most conversation turns sent, the current one included.
        pub max_history_turns: Option<RawPerPriority>,
        /// Most estimated prompt tokens of the messages sent.
        pub max_prompt_tokens: Option<RawPerPriority>,
        /// The field set on a call that names no limit: `max_tokens` (default) or
        /// `max_completion_tokens`.
        pub max_tokens_field: Option<TokenField>,
        /// Learn each model's ratio of reported to estimated prompt tokens
        /// (default `true`).
        pub calibrate_estimate: Option<bool>,
    }
}

impl RawShapingConfig {
    /// This section with every field `over` gives put in place of its own.
    pub fn overridden_by(&self, over: &RawShapingConfig) -> RawShapingConfig {
        RawShapingConfig {
            max_tokens_cap: over.max_tokens_cap.or(self.max_tokens_cap),
            max_history_turns: over.max_history_turns.or(self.max_history_turns),
            max_prompt_tokens: over.max_prompt_tokens.or(self.max_prompt_tokens),
            max_tokens_field: over.max_tokens_field.or(self.max_tokens_field),
            calibrate_estimate: over.calibrate_estimate.or(self.calibrate_estimate),
        }
    }
}

/// What one priority's calls may ask for; `None` leaves that part alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most output tokens.
    pub max_tokens: Option<u64>,
    /// Most turns, the current one included.
    pub history_turns: Option<u64>,
    /// Most estimated prompt tokens of the messages.
    pub prompt_tokens: Option<u64>,
}

impl Limits {
    /// Any limit is set.
    pub fn any(&self) -> bool {
        self.max_tokens.is_some() || self.history_turns.is_some() || self.prompt_tokens.is_some()
    }
}

/// Compiled `shaping`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapingConfig {
    /// Limits by priority index.
    pub limits: [Limits; 3],
    /// The field set on a call that names no limit.
    pub field: TokenField,
    /// Calls whose prompt estimate was used teach their model's ratio.
    pub calibrate: bool,
}

impl Default for ShapingConfig {
    fn default() -> Self {
        Self {
            limits: Default::default(),
            field: MAX_TOKENS_FIELD.default,
            calibrate: CALIBRATE_ESTIMATE.default,
        }
    }
}

impl ShapingConfig {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawShapingConfig) -> Result<Self, ConfigError> {
        let mut limits = [Limits::default(); 3];
        for (p, l) in Priority::ALL.iter().zip(limits.iter_mut()) {
            l.max_tokens = per_priority("max_tokens_cap", raw.max_tokens_cap, *p, "token count")?;
            l.history_turns =
                per_priority("max_history_turns", raw.max_history_turns, *p, "turn count")?;
            l.prompt_tokens = per_priority(
                "max_prompt_tokens",
                raw.max_prompt_tokens,
                *p,
                "token count",
            )?;
        }
        Ok(Self {
            limits,
            field: MAX_TOKENS_FIELD.default_or(raw.max_tokens_field),
            calibrate: CALIBRATE_ESTIMATE.or(raw.calibrate_estimate),
        })
    }

    /// The limits of a call of priority `p`.
    pub fn limits(&self, p: Priority) -> Limits {
        self.limits.get(p.index()).copied().unwrap_or_default()
    }

    /// Some priority is shaped.
    pub fn enabled(&self) -> bool {
        self.limits.iter().any(Limits::any)
    }
}

/// The value of `field` for priority `p`: one number counts for P1 and P2
/// only (P0 is untouched unless named), a per-priority object for whom it names.
fn per_priority(
    field: &str,
    raw: Option<RawPerPriority>,
    p: Priority,
    what: &str,
) -> Result<Option<u64>, ConfigError> {
    let value = match raw {
        None => None,
        Some(RawPerPriority::All(_)) if p == Priority::P0 => None,
        Some(RawPerPriority::All(v)) => Some(check::positive(field, v, what)?),
        Some(r @ RawPerPriority::PerPriority(_)) => r
            .get(p)
            .map(|v| check::positive(&format!("{field}.{p}"), v, what))
            .transpose()?,
    };
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(doc: &str) -> Result<ShapingConfig, ConfigError> {
        ShapingConfig::compile(crate::config::read::parse::<RawShapingConfig>(
            doc.as_bytes(),
        )?)
    }

    #[test]
    fn empty_section_shapes_nothing() {
        let c = parse("{}").unwrap();
        assert!(!c.enabled());
        assert_eq!(c.field, TokenField::MaxTokens);
    }

    #[test]
    fn one_number_spares_p0_and_an_object_names_whom_it_shapes() {
        let c = parse(
            r#"{"max_tokens_cap":512,"max_history_turns":{"P0":20,"P2":4},
            "max_prompt_tokens":3000,"max_tokens_field":"max_completion_tokens"}"#,
        )
        .unwrap();
        assert!(c.enabled());
        assert_eq!(
            c.limits(Priority::P0),
            Limits {
                max_tokens: None,
                history_turns: Some(20),
                prompt_tokens: None
            }
        );
        assert_eq!(
            c.limits(Priority::P2),
            Limits {
                max_tokens: Some(512),
                history_turns: Some(4),
                prompt_tokens: Some(3000)
            }
        );
        assert_eq!(c.limits(Priority::P1).history_turns, None);
        assert_eq!(c.field, TokenField::MaxCompletionTokens);
    }

    #[test]
    fn errors_name_the_field() {
        for (doc, field) in [
            (r#"{"max_tokens_cap":0}"#, "max_tokens_cap"),
            (r#"{"max_tokens_cap":{"P2":0}}"#, "max_tokens_cap.P2"),
            (r#"{"max_tokens_cap":{"P3":1}}"#, "max_tokens_cap.P3"),
            (r#"{"max_history_turns":-1}"#, "max_history_turns"),
            (r#"{"max_prompt_tokens":"many"}"#, "max_prompt_tokens"),
            (r#"{"max_tokens_field":"tokens"}"#, "max_tokens_field"),
            (r#"{"max_tokens":1}"#, "max_tokens"),
        ] {
            let e = parse(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
        }
    }

    #[test]
    fn overrides_replace_only_what_they_give() {
        let base: RawShapingConfig =
            crate::config::read::parse(br#"{"max_tokens_cap":512,"max_history_turns":6}"#).unwrap();
        let over: RawShapingConfig =
            crate::config::read::parse(br#"{"max_tokens_cap":128}"#).unwrap();
        let c = ShapingConfig::compile(base.overridden_by(&over)).unwrap();
        assert_eq!(c.limits(Priority::P1).max_tokens, Some(128));
        assert_eq!(c.limits(Priority::P1).history_turns, Some(6));
    }
}
