//! Which side of a call a rule or a guardrail service reads: a leaf both
//! the rules and the service name, so neither imports the other for it.

/// Where a rule looks: the prompt on its way out, the answer on its way
/// back, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum On {
    /// The prompt only (the default: an answer is held and read only where
    /// a rule asks for it).
    #[default]
    Prompt,
    /// The answer only.
    Answer,
    /// Both.
    Both,
}

impl On {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "prompt" => Some(Self::Prompt),
            "answer" => Some(Self::Answer),
            "both" => Some(Self::Both),
            _ => None,
        }
    }

    /// The rule looks at `side`.
    pub fn covers(self, side: Side) -> bool {
        matches!(
            (self, side),
            (Self::Both, _) | (Self::Prompt, Side::Prompt) | (Self::Answer, Side::Answer)
        )
    }
}

/// What is read: the prompt or the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The request's prompt.
    Prompt,
    /// The upstream's answer.
    Answer,
}
