//! Redaction of captured text (`tracing.capture.redact`) by the guardrails'
//! detectors ([`crate::guard`]), which read the text as written and with its
//! JSON escapes decoded: `\nsk-…` is a newline before a key. The built-ins
//! are the secrets, e-mail addresses and the personal data a checksum
//! validates ([`crate::guard::Set::CAPTURE`]); a glob pattern (`*` any run,
//! `?` one character, anchored at both ends) matches whole words. What
//! matches is replaced by [`REDACTED`] in the raw text, whose other bytes
//! stay as they were; and a text is cut for the capture only where no word
//! is cut in half.

use std::borrow::Cow;

use crate::guard::glob::separates;
use crate::guard::{ceil_char, covered, floor_char, sort_findings, Budget, Detectors, View};

/// What a redacted word becomes.
pub const REDACTED: &str = "[REDACTED]";

/// The rules captured text is redacted by.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// Glob patterns.
    pub globs: &'a [String],
    /// The built-in rules apply.
    pub builtins: bool,
    /// The guardrails' detectors of what they withhold.
    pub guarded: Option<&'a Detectors>,
}

/// `text` with what a rule matches, in the text as written or decoded,
/// replaced by [`REDACTED`]; borrowed when nothing matched. As written too:
/// a text that is no JSON may hold a backslash that only looks like an
/// escape (`C:\token=…`). Capture bounds the text it hands here, so the
/// scan is not bounded again: every finding in it is redacted.
pub fn redact<'t>(text: &'t str, rules: &Rules<'_>) -> Cow<'t, str> {
    redact_counted(text, rules, &mut Budget::unbounded())
}

/// [`redact`], its scans' work counted in `spent` ([`Budget::steps`]).
fn redact_counted<'t>(text: &'t str, rules: &Rules<'_>, spent: &mut Budget) -> Cow<'t, str> {
    let mut found = Vec::new();
    View::capture(rules.globs, rules.builtins).scan(text, spent, &mut found);
    if let Some(d) = rules.guarded {
        d.scan(text, spent, &mut found);
        sort_findings(&mut found);
    }
    if found.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (_, r) in covered(&found) {
        let from = floor_char(text, r.start).max(copied);
        out.push_str(text.get(copied..from).unwrap_or_default());
        out.push_str(REDACTED);
        copied = ceil_char(text, r.end);
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    Cow::Owned(out)
}

/// The byte at which `text` may be cut at `at` or before without leaving
/// part of a word behind (a key or an address cut in half is no longer one
/// a rule knows): the end of the last whole word, on a character boundary.
pub fn word_boundary(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    let mut end = at;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let next_separates = text
        .get(end..)
        .and_then(|t| t.chars().next())
        .is_none_or(separates);
    if next_separates {
        return end;
    }
    // Back to the separator before the word cut through.
    text.get(..end)
        .and_then(|head| head.char_indices().rev().find(|(_, c)| separates(*c)))
        .map_or(0, |(i, _)| i)
}

/// The end of the last whole word of `text` when the text it was cut from
/// went on: all of it when it ends at a separator, else up to the
/// separator before its last word (that word may be the head of a secret no
/// rule knows until it is whole).
pub fn whole_words(text: &str) -> usize {
    match text.char_indices().next_back() {
        None => 0,
        Some((_, c)) if separates(c) => text.len(),
        Some(_) => text
            .char_indices()
            .rev()
            .find(|(_, c)| separates(*c))
            .map_or(0, |(i, _)| i),
    }
}

#[cfg(test)]
pub(crate) mod tests;
