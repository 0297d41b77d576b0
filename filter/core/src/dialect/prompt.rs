//! A prompt as its dialect reads it out: its parts in the order they are
//! sent, each where its dialect keeps it, for every concern that reads a
//! prompt's text (the token estimate, capture, the semantic question). A
//! leaf of the dialect module: the request view and the estimate both read
//! it, and it reads neither.

use crate::json::Json;

/// One part of a prompt, where its dialect keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Said<'a> {
    /// Instructions given apart from the turns (Responses `instructions`,
    /// Messages `system`): a string or an array of blocks.
    System(&'a Json),
    /// A prompt that is no message: a completions `prompt` (`None` when the
    /// body has none), a Responses `input` string.
    Bare(Option<&'a Json>),
    /// One message or item of the conversation, in its dialect's shape
    /// (`role`, `content`, tool calls and results).
    Turn(&'a Json),
    /// One turn as a role and its list of parts (Gemini's `Content`): each
    /// part an object with its `text`, or a `functionCall` (`name`, `args`)
    /// or `functionResponse` (`name`, `response`); `None` when it has none.
    Parts {
        /// The turn's role (`user` when it names none, as the API reads it).
        role: &'a str,
        /// The parts.
        parts: Option<&'a Json>,
    },
}

/// The parts of a prompt, in the order they are sent: the system
/// instructions, a bare prompt, then the turns.
#[derive(Debug, Clone, Default)]
pub struct Prompt<'a> {
    system: Option<&'a Json>,
    bare: Option<Option<&'a Json>>,
    turns: std::slice::Iter<'a, Json>,
    /// The turns are role-and-parts contents (see [`Said::Parts`]).
    contents: bool,
}

impl<'a> Prompt<'a> {
    /// A prompt of these parts; `turns` is the list of messages or items
    /// (anything but an array has none).
    pub(super) fn new(
        system: Option<&'a Json>,
        bare: Option<Option<&'a Json>>,
        turns: Option<&'a Json>,
    ) -> Self {
        Self {
            system,
            bare,
            turns: items(turns).iter(),
            contents: false,
        }
    }

    /// A prompt of `system` (a list of parts) and `contents`, turns of a
    /// role and its parts (Gemini's).
    pub(super) fn of_contents(system: Option<&'a Json>, contents: Option<&'a Json>) -> Self {
        Self {
            contents: true,
            ..Self::new(system, None, contents)
        }
    }
}

impl<'a> Iterator for Prompt<'a> {
    type Item = Said<'a>;

    fn next(&mut self) -> Option<Said<'a>> {
        if let Some(s) = self.system.take() {
            return Some(Said::System(s));
        }
        if let Some(b) = self.bare.take() {
            return Some(Said::Bare(b));
        }
        let turn = self.turns.next()?;
        if !self.contents {
            return Some(Said::Turn(turn));
        }
        Some(Said::Parts {
            role: role(turn).unwrap_or("user"),
            parts: turn.get("parts"),
        })
    }
}

/// A value as a list of one, `null` and absence as none.
pub(crate) fn one(value: Option<&Json>) -> &[Json] {
    match value {
        None | Some(Json::Null) => &[],
        Some(v) => std::slice::from_ref(v),
    }
}

/// An array's items; none of anything else.
pub(crate) fn items(value: Option<&Json>) -> &[Json] {
    match value {
        Some(Json::Array(items)) => items,
        _ => &[],
    }
}

/// A string that is not empty.
pub(crate) fn non_empty_string(value: &Json) -> Option<&str> {
    match value {
        Json::String(s) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// A message's or item's `role`, when a string.
pub(crate) fn role(m: &Json) -> Option<&str> {
    match m.get("role") {
        Some(Json::String(r)) => Some(r),
        _ => None,
    }
}

/// The message's one string `role`; `None` when it is no object, or has no
/// role, or names it twice or not as a string.
pub(crate) fn only_role(message: &Json) -> Option<&str> {
    if !matches!(message, Json::Object(_)) {
        return None;
    }
    let mut roles = message.members("role");
    let role = match roles.next()? {
        Json::String(r) => r.as_str(),
        _ => return None,
    };
    roles.next().is_none().then_some(role)
}
