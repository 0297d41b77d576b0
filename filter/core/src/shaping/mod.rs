//! Request shaping: the mesh lowers what a call asks for — fewer output
//! tokens, fewer old turns of the conversation — most for the least
//! important traffic. Each change is an edit of the held body's document
//! (its bytes and parsed tree together), touching only the bytes it changes,
//! so the walk and the load-driven degrade apply the same edits with
//! different limits.
//!
//! Only a chat completions body that is strict JSON, one object, and names no
//! key twice is shaped; anything else passes untouched.

pub mod config;
mod history;

use crate::dialect::Dialect;
use crate::json::{Document, Json};

pub use config::{Limits, RawShapingConfig, ShapingConfig};

use crate::dialect::request::{whole_number, TokenField};
pub use history::keep_turns;

/// Response header telling the client what shaping changed
/// (`max_tokens,history`).
pub const HEADER: &str = "x-llm-shaped";

/// One kind of change shaping makes to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// The output token limit was lowered or set.
    MaxTokens,
    /// Old turns of the conversation were left out.
    History,
}

impl What {
    /// Every kind, in the order the header lists them.
    pub const ALL: [What; 2] = [What::MaxTokens, What::History];

    /// The header and metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxTokens => "max_tokens",
            Self::History => "history",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The set of changes made to one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes(u8);

impl Changes {
    /// Adds a change.
    pub fn add(&mut self, what: What) {
        self.0 |= what.bit();
    }

    /// The change was made.
    pub fn has(self, what: What) -> bool {
        self.0 & what.bit() != 0
    }

    /// Nothing was changed.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The changes made, in header order.
    pub fn iter(self) -> impl Iterator<Item = What> {
        What::ALL.into_iter().filter(move |w| self.has(*w))
    }

    /// The `x-llm-shaped` value; `None` when nothing changed.
    pub fn header(self) -> Option<String> {
        let names: Vec<&str> = self.iter().map(What::as_str).collect();
        (!names.is_empty()).then(|| names.join(","))
    }
}

/// Shapes a body of `dialect` under `limits`, in place: history first (a
/// chat or Anthropic `messages` list, a Responses `input` list, Gemini's
/// `contents`), then the output token limit where the dialect keeps it
/// (`field`, the configured one, where it lets the operator choose).
/// Returns what changed (nothing when the body is not one shaping
/// understands).
pub fn shape(doc: &mut Document, dialect: Dialect, limits: &Limits, field: TokenField) -> Changes {
    let mut changes = Changes::default();
    if !limits.any() || !doc.tree().is_some_and(understood) {
        return changes;
    }
    if (limits.history_turns.is_some() || limits.prompt_tokens.is_some())
        && trim_turns(doc, dialect, limits.history_turns, limits.prompt_tokens)
    {
        changes.add(What::History);
    }
    if let Some(cap) = limits.max_tokens {
        if dialect.request().cap_output(doc, cap, field) {
            changes.add(What::MaxTokens);
        }
    }
    changes
}

/// A request object that names no key twice, anywhere (readers resolve
/// repeats differently, so such a body is never rewritten), and whose token
/// limits, when given, are whole numbers or `null`.
fn understood(tree: &Json) -> bool {
    let limit_ok = |f: TokenField| match tree.get(f.as_str()) {
        None | Some(Json::Null) => true,
        Some(Json::Number(n)) => whole_number(n).is_some(),
        Some(_) => false,
    };
    matches!(tree, Json::Object(_))
        && limit_ok(TokenField::MaxTokens)
        && limit_ok(TokenField::MaxCompletionTokens)
        && limit_ok(TokenField::MaxOutputTokens)
        && !tree.repeats_a_key()
}

/// Leaves out of a body of `dialect` the items of its conversation
/// [`history::keep_turns`] does not keep, each kept one byte for byte.
/// False, and nothing changed, when nothing is left out or the body is not
/// understood.
pub fn trim_turns(
    doc: &mut Document,
    dialect: Dialect,
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> bool {
    let Some(field) = dialect.request().turns_field() else {
        return false;
    };
    let Some(Json::Array(messages)) = doc.tree().and_then(|t| t.get(field)) else {
        return false;
    };
    let Some(keep) = history::keep_turns(dialect, messages, max_turns, max_prompt_tokens) else {
        return false;
    };
    let Some(items) = doc.items(field) else {
        return false;
    };
    if items.len() != keep.len() {
        return false;
    }
    let mut new = Vec::with_capacity(doc.value_bytes(field).map_or(0, <[u8]>::len));
    new.push(b'[');
    for (item, _) in items.iter().zip(&keep).filter(|(_, k)| **k) {
        if new.len() > 1 {
            new.push(b',');
        }
        new.extend_from_slice(item);
    }
    new.push(b']');
    let kept: Vec<Json> = messages
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(m, _)| m.clone())
        .collect();
    doc.set(field, &new, Json::Array(kept))
}

#[cfg(test)]
mod tests;
