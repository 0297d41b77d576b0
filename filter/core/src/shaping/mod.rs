//! Request shaping: the mesh lowers what a call asks for — fewer output
//! tokens, fewer old turns of the conversation — most for the least
//! important traffic. Each change is a pure function of the body bytes (and
//! its parsed tree), touching only the bytes it changes, so the walk and the
//! load-driven degrade apply the same edits with different limits.
//!
//! Only a chat completions body that is strict JSON, one object, and names no
//! key twice is shaped; anything else passes untouched.

pub mod config;
mod history;

use crate::json::Json;
use crate::json_splice;

pub use config::{Limits, RawShapingConfig, ShapingConfig, TokenField};
pub use history::keep_history;

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

/// A reshaped request body and what changed in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaped {
    /// The body to send.
    pub body: Vec<u8>,
    /// What changed.
    pub changes: Changes,
}

/// Shapes a chat completions body under `limits`: history first, then the
/// output token limit. `None` when nothing changed or the body is not one
/// shaping understands (`tree` is the body's parse).
pub fn shape(body: &[u8], tree: &Json, limits: &Limits, field: TokenField) -> Option<Shaped> {
    if !limits.any() || !understood(tree) {
        return None;
    }
    let mut changes = Changes::default();
    let mut out: Option<Vec<u8>> = None;
    if limits.history_turns.is_some() || limits.prompt_tokens.is_some() {
        if let Some(b) = trim_history(body, tree, limits.history_turns, limits.prompt_tokens) {
            out = Some(b);
            changes.add(What::History);
        }
    }
    if let Some(cap) = limits.max_tokens {
        if let Some(b) = cap_max_tokens(out.as_deref().unwrap_or(body), cap, field) {
            out = Some(b);
            changes.add(What::MaxTokens);
        }
    }
    out.map(|body| Shaped { body, changes })
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
        && !tree.repeats_a_key()
}

/// The body with its output token limit at most `cap`: `max_tokens` and
/// `max_completion_tokens` above it are lowered to it; a body that names
/// neither (or only as `null`) gets `cap` set, in the field it named as
/// `null` or else in `field`. `None` when nothing changed, or a limit is not
/// a whole number, or the body is not one object naming each field once.
pub fn cap_max_tokens(body: &[u8], cap: u64, field: TokenField) -> Option<Vec<u8>> {
    let members = json_splice::members(body)?;
    let mut edits = Vec::new();
    let mut named = false;
    let mut null_field = None;
    for f in [TokenField::MaxTokens, TokenField::MaxCompletionTokens] {
        let Some(m) = json_splice::find(body, &members, f.as_str()).ok()? else {
            continue;
        };
        match Json::parse(body.get(m.value.clone())?)? {
            Json::Null => null_field = null_field.or(Some(f)),
            Json::Number(n) => {
                named = true;
                if whole_number(&n)? > cap {
                    edits.push((m.value.clone(), cap.to_string().into_bytes()));
                }
            }
            _ => return None,
        }
    }
    if !named {
        let f = null_field.unwrap_or(field);
        return json_splice::set_member(body, f.as_str(), cap.to_string().as_bytes());
    }
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|(r, _)| r.start);
    json_splice::splice(body, &edits)
}

/// The body with only the messages [`keep_history`] keeps, each kept message
/// byte for byte; `None` when nothing is left out or the body is not
/// understood.
pub fn trim_history(
    body: &[u8],
    tree: &Json,
    max_turns: Option<u64>,
    max_prompt_tokens: Option<u64>,
) -> Option<Vec<u8>> {
    let Some(Json::Array(messages)) = tree.get("messages") else {
        return None;
    };
    let keep = keep_history(messages, max_turns, max_prompt_tokens)?;
    let members = json_splice::members(body)?;
    let array = json_splice::find(body, &members, "messages").ok()??;
    let items = json_splice::items(body, array.value.clone())?;
    if items.len() != keep.len() {
        return None;
    }
    let mut new = Vec::with_capacity(array.value.len());
    new.push(b'[');
    for (item, _) in items.iter().zip(&keep).filter(|(_, k)| **k) {
        if new.len() > 1 {
            new.push(b',');
        }
        new.extend_from_slice(body.get(item.clone())?);
    }
    new.push(b']');
    json_splice::splice(body, &[(array.value.clone(), new)])
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
