//! The window a streamed answer's text is checked through: a value can be
//! cut across events (`sk-proj-AB` then `CD…`, a card's groups, a
//! placeholder to restore), so the text of each event is held back from
//! where a value may still be under way, and what passes is checked with
//! what led into it. What is held is bounded ([`MAX_HELD`]): past it the
//! text passes, checked as far as it goes; a value longer than that is
//! masked in pieces, or blocked when its rule blocks.

use super::mask::{pending, Vault};
use super::policy::{Action, Guardrails, Verdict};
use super::{ceil_char, floor_char};

/// Most bytes of text held back from the client per text of a stream.
pub const MAX_HELD: usize = 4096;
/// Bytes of what passed kept to read what follows with (`api_key: ` before
/// its value, `Bearer ` before a token, a card's first groups).
const CONTEXT: usize = 256;

/// One text of a stream (a choice, a content block, an output part).
#[derive(Debug, Default)]
pub struct Window {
    /// What passed last, as the upstream wrote it.
    context: String,
    /// What is held back.
    held: String,
}

/// What one piece of text comes out as.
#[derive(Debug, PartialEq, Eq)]
pub enum Out {
    /// The text to pass now (maybe empty: all held).
    Pass(String),
    /// A rule that blocks found something: rule's index.
    Blocked(usize),
}

impl Window {
    /// Bytes held back.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Takes the next piece of the text (`last`: nothing more is to come
    /// for it, so nothing is held): what of it and of what was held passes
    /// now, checked, masked and restored, or the rule that blocks it.
    pub fn push(
        &mut self,
        rules: &Guardrails,
        vault: &mut Vault,
        verdict: &mut Verdict,
        text: &str,
        last: bool,
    ) -> Out {
        self.held.push_str(text);
        if self.held.is_empty() {
            return Out::Pass(String::new());
        }
        let seen = self.context.len();
        let mut whole = String::with_capacity(seen + self.held.len());
        whole.push_str(&self.context);
        whole.push_str(&self.held);
        let found = rules.answer_findings(&whole, seen, vault, verdict);
        if let Some(k) = verdict.blocked_by() {
            return Out::Blocked(k);
        }
        // Where to stop passing: before a value that may go on.
        let mut cut = match last {
            true => whole.len(),
            false => open_tail(&whole).min(pending(&whole)),
        };
        for (f, _) in found.iter().rev() {
            let open = f.range.end >= whole.len() && !last;
            if f.range.start < cut && (open || cut < f.range.end) {
                cut = f.range.start;
            }
        }
        // Never more than the bound held, never what already passed.
        cut = cut.max(whole.len().saturating_sub(MAX_HELD)).max(seen);
        cut = ceil_char(&whole, cut);
        let passed = whole.get(..cut).unwrap_or_default();
        // Only what is new passes: the context passed before.
        let new = passed.get(seen..).unwrap_or_default();
        let masks: Vec<_> = found
            .into_iter()
            .filter(|(f, a)| *a == Action::Mask && f.range.start < cut)
            .map(|(mut f, a)| {
                f.range.start = f.range.start.max(seen) - seen;
                f.range.end = f.range.end.min(cut) - seen;
                (f, a)
            })
            .filter(|(f, _)| f.range.start < f.range.end)
            .collect();
        let out = rules.answer_text(new, &masks, vault, true).into_owned();
        self.held = whole.get(cut..).unwrap_or_default().to_string();
        let keep = floor_char(passed, passed.len().saturating_sub(CONTEXT));
        let keep = ceil_char(passed, keep);
        self.context = passed.get(keep..).unwrap_or_default().to_string();
        Out::Pass(out)
    }
}

/// Where the value that may still go on at the end of `text` starts: a run
/// of characters a secret, an address, a number or a placeholder is made
/// of, with the single spaces that join a card's, an IBAN's or a phone
/// number's groups (a run before them of digits and capitals) and those
/// after a name's `:` or `=`.
fn open_tail(text: &str) -> usize {
    let b = text.as_bytes();
    let floor = b.len().saturating_sub(MAX_HELD);
    let mut at = b.len();
    loop {
        let end = at;
        while at > floor && b.get(at - 1).is_some_and(|c| in_value(*c)) {
            at -= 1;
        }
        let run = b.get(at..end).unwrap_or_default();
        let joined = at > floor + 1
            && b.get(at - 1) == Some(&b' ')
            && b.get(at - 2).is_some_and(|c| {
                c.is_ascii_digit() || c.is_ascii_uppercase() || *c == b':' || *c == b'='
            });
        // A space at the very end joins only when a group precedes it.
        if joined && (!run.is_empty() || end == b.len()) {
            at -= 1;
            continue;
        }
        return at;
    }
}

/// A byte a value may be made of: letters and digits, what keys, tokens
/// and addresses join their parts with, any byte of a non-ASCII character.
fn in_value(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || !c.is_ascii()
        || matches!(
            c,
            b'-' | b'_' | b'.' | b'+' | b'/' | b'=' | b'@' | b':' | b'~' | b'%' | b'(' | b')'
        )
}

#[cfg(test)]
mod tests;
