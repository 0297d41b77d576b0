//! What a guardrail does with a call where it finds something (a rule's
//! or the guardrail service's `action`).

/// What a rule does with a call where it finds something, least strict
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Counted, and named in the span and the record.
    Log,
    /// Each value replaced by its placeholder before the call leaves.
    Mask,
    /// The call is refused.
    Block,
}

impl Action {
    /// The name in the configuration and the metric's `action` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Mask => "mask",
            Self::Block => "block",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
        [Self::Log, Self::Mask, Self::Block]
            .into_iter()
            .find(|a| a.as_str() == s)
    }
}
