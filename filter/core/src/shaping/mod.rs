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

use crate::dialect::request::TokenField;
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

/// Shapes a body of `endpoint` under `limits`, in place: history first (a
/// chat or Anthropic `messages` list, a Responses `input` list, Gemini's
/// `contents`), then the output token limit where the dialect keeps it
/// (`field`, the configured one, where it lets the operator choose).
/// Returns what changed (nothing when the body is not one shaping
/// understands).
pub fn shape(doc: &mut Document, endpoint: Dialect, limits: &Limits, field: TokenField) -> Changes {
    let mut changes = Changes::default();
    if !limits.any() || !doc.tree().is_some_and(understood) {
        return changes;
    }
    if (limits.history_turns.is_some() || limits.prompt_tokens.is_some())
        && trim_turns(doc, endpoint, limits.history_turns, limits.prompt_tokens)
    {
        changes.add(What::History);
    }
    if let Some(cap) = limits.max_tokens {
        if endpoint.request().cap_output(doc, cap, field) {
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

/// Lowers the body's output token limit to at most `cap`: `max_tokens` and
/// `max_completion_tokens` above it are lowered to it; a body that names
/// neither (or only as `null`) gets `cap` set, in the field it named as
/// `null` or else in `field`. False, and nothing changed, when nothing needed
/// to, or a limit is not a whole number, or the body is not one object naming
/// each field once.
pub fn cap_max_tokens(doc: &mut Document, cap: u64, field: TokenField) -> bool {
    let Some(Json::Object(_)) = doc.tree() else {
        return false;
    };
    let mut lower = Vec::new();
    let mut named = false;
    let mut null_field = None;
    for &f in field.family() {
        let Some(value) = doc.value_bytes(f.as_str()) else {
            if repeated(doc, f.as_str()) {
                return false;
            }
            continue;
        };
        match Json::parse(value) {
            Some(Json::Null) => null_field = null_field.or(Some(f)),
            Some(Json::Number(n)) => {
                named = true;
                match whole_number(&n) {
                    Some(v) if v > cap => lower.push(f),
                    Some(_) => {}
                    None => return false,
                }
            }
            _ => return false,
        }
    }
    let cap_text = cap.to_string();
    let number = Json::Number(cap_text.clone());
    if !named {
        let f = null_field.unwrap_or(field);
        return doc.set(f.as_str(), cap_text.as_bytes(), number);
    }
    let mut changed = false;
    for f in lower {
        changed |= doc.set(f.as_str(), cap_text.as_bytes(), number.clone());
    }
    changed
}

/// True when the object names `name` more than once.
fn repeated(doc: &Document, name: &str) -> bool {
    doc.tree()
        .is_some_and(|tree| tree.members(name).nth(1).is_some())
}

/// Leaves out of a body of `endpoint` the items of its conversation
/// [`history::keep_turns`] does not keep, each kept one byte for byte.
/// False, and nothing changed, when nothing is left out or the body is not
/// understood.
pub fn trim_turns(
    doc: &mut Document,
    endpoint: Dialect,
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> bool {
    let Some(field) = endpoint.request().turns_field() else {
        return false;
    };
    let Some(Json::Array(messages)) = doc.tree().and_then(|t| t.get(field)) else {
        return false;
    };
    let Some(keep) = history::keep_turns(endpoint, messages, max_turns, max_prompt_tokens) else {
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

/// A canonical JSON number (see [`crate::json`]) that is a whole number ≥ 0
/// and fits a `u64`.
fn whole_number(canonical: &str) -> Option<u64> {
    let (digits, exp) = match canonical.split_once('e') {
        Some((d, e)) => (d, e.parse::<u32>().ok()?),
        None => (canonical, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()?
        .checked_mul(10u64.checked_pow(exp)?)
}

#[cfg(test)]
mod tests;
