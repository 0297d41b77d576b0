//! Redaction of captured text (`tracing.capture.redact`) without a regex
//! engine, which would cost the module more than all of this. Captured text
//! is often JSON inside a string (tool-call arguments, a tool-use input
//! written back), so rules read it decoded ([`decoded`]) as well as written:
//! `\nsk-…` is a newline before a key. The built-in rules ([`secrets`]) find a secret by
//! its own shape wherever it starts (e-mail addresses, API keys by their
//! prefixes, JSON web tokens, PEM private keys, the credential after
//! `Bearer` or `Basic` or joined to a credential's name by `:` or `=`); a
//! glob pattern (`*` any run, `?` one character, anchored at both ends)
//! matches whole words, runs of characters between whitespace, the
//! punctuation that quotes or joins them (`"'`()<>[]{},;:=|\`) and escapes.
//! What matches is replaced by [`REDACTED`] in the raw text, whose other
//! bytes stay as they were.
//!
//! The built-ins are linear in the text; a glob with one `*` is too, and at
//! worst the word's length times the pattern's (at most 128 bytes) with more.

use std::borrow::Cow;
use std::ops::Range;

mod decoded;
mod secrets;

use decoded::Decoded;

/// What a redacted word becomes.
pub const REDACTED: &str = "[REDACTED]";

/// The rules captured text is redacted by.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// Glob patterns.
    pub globs: &'a [String],
    /// The built-in rules apply.
    pub builtins: bool,
}

impl Rules<'_> {
    /// No rule at all.
    fn none(&self) -> bool {
        self.globs.is_empty() && !self.builtins
    }
}

/// A character that ends a word.
fn separates(c: char) -> bool {
    c.is_whitespace() || "\"'`()<>[]{},;:=|\\".contains(c)
}

/// The ranges of the words of `text` a glob matches: a word ends at a
/// separator, and an escape still written out (`\n`, `\u00e9`) separates
/// too.
fn globbed(text: &str, globs: &[String], hits: &mut Vec<Range<usize>>) {
    let mut on_word = |from: usize, to: usize| {
        let word = text.get(from..to).unwrap_or_default().as_bytes();
        if globs.iter().any(|g| glob(g.as_bytes(), word)) {
            hits.push(from..to);
        }
    };
    let bytes = text.as_bytes();
    let mut start = None;
    // Bytes of an escape's letters still to pass.
    let mut escape: usize = 0;
    for (i, c) in text.char_indices() {
        let sep = escape > 0 || separates(c);
        escape = match (escape, c) {
            (0, '\\') => match bytes.get(i + 1) {
                Some(b'n' | b't' | b'r' | b'b' | b'f') => 1,
                Some(b'u') => 5,
                _ => 0,
            },
            (n, _) => n.saturating_sub(1),
        };
        match (start, sep) {
            (None, false) => start = Some(i),
            (Some(s), true) => {
                on_word(s, i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        on_word(s, text.len());
    }
}

/// Adds `r` to `hits`, ranges in order, apart: `r` ends after every range
/// there starts, so it comes last or is made one with those it overlaps or
/// touches.
pub(super) fn add(hits: &mut Vec<Range<usize>>, mut r: Range<usize>) {
    while let Some(last) = hits.last() {
        if r.start > last.end {
            break;
        }
        r = r.start.min(last.start)..r.end.max(last.end);
        hits.pop();
    }
    hits.push(r);
}

/// The ranges of `a` and `b` (each in order, apart) in order, apart.
fn union(a: Vec<Range<usize>>, b: Vec<Range<usize>>) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(a.len().saturating_add(b.len()));
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if y.start < x.start => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(r) => add(&mut out, r),
            None => return out,
        }
    }
}

/// What the rules match in `text`, in order, apart.
fn found(text: &str, rules: &Rules<'_>) -> Vec<Range<usize>> {
    let mut builtins = Vec::new();
    if rules.builtins {
        secrets::find(text, &mut builtins);
    }
    let mut words = Vec::new();
    if !rules.globs.is_empty() {
        globbed(text, rules.globs, &mut words);
    }
    union(builtins, words)
}

/// `text` with what a rule matches, in the text as written or decoded,
/// replaced by [`REDACTED`]; borrowed when nothing matched. As written too:
/// a text that is no JSON may hold a backslash that only looks like an
/// escape (`C:\token=…`).
pub fn redact<'t>(text: &'t str, rules: &Rules<'_>) -> Cow<'t, str> {
    if rules.none() {
        return Cow::Borrowed(text);
    }
    let view = Decoded::of(text);
    let mut hits = found(view.text(), rules);
    if view.decodes() {
        hits = union(view.raw_ranges(&hits), found(text, rules));
    }
    if hits.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for r in hits {
        let from = floor_char(text, r.start).max(copied);
        out.push_str(text.get(copied..from).unwrap_or_default());
        out.push_str(REDACTED);
        copied = ceil_char(text, r.end);
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    Cow::Owned(out)
}

/// `at`, or the character boundary before it.
fn floor_char(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// `at`, or the character boundary after it.
fn ceil_char(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
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

/// A glob pattern (`*` any run, `?` one character) matches all of `word`:
/// the iterative matcher that backs up to the last `*` only.
fn glob(pattern: &[u8], word: &[u8]) -> bool {
    let (mut p, mut w) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while w < word.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, w));
                p += 1;
            }
            Some(&c) if c == b'?' || Some(&c) == word.get(w) => {
                // `?` takes one character, however many bytes it has.
                let width = if c == b'?' { char_width(word, w) } else { 1 };
                p += 1;
                w += width;
            }
            _ => match star {
                Some((sp, sw)) => {
                    p = sp + 1;
                    w = sw + 1;
                    star = Some((sp, sw + 1));
                }
                None => return false,
            },
        }
    }
    pattern
        .get(p..)
        .unwrap_or_default()
        .iter()
        .all(|c| *c == b'*')
}

/// Bytes of the UTF-8 character at `at`.
fn char_width(bytes: &[u8], at: usize) -> usize {
    match bytes.get(at) {
        Some(b) if *b >= 0xF0 => 4,
        Some(b) if *b >= 0xE0 => 3,
        Some(b) if *b >= 0xC0 => 2,
        _ => 1,
    }
}

#[cfg(test)]
pub(crate) mod tests;
