//! Masking: what was found replaced by a placeholder that names what it
//! was (`[EMAIL_1]`), the same value by the same placeholder throughout a
//! call so the model still sees one address used twice, and the values kept
//! in the call's [`Vault`] so an answer can have them back. The vault is
//! bounded: past it, a value is still masked, by a placeholder without a
//! number (`[EMAIL]`) that nothing restores; nothing is let through.

use std::borrow::Cow;
use std::fmt;
use std::fmt::Write as _;

use super::{ceil_char, covered, floor_char, Detectors, Finding};

/// Most values a call's vault keeps.
pub const MAX_VALUES: usize = 256;
/// Most bytes of the values a call's vault keeps, and of one value.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
const MAX_ONE_VALUE: usize = 8 << 10;
/// Longest placeholder, bytes: `[`, a label, `_`, a number, `]`.
pub const MAX_PLACEHOLDER: usize = 80;

/// The values masked in one call, by placeholder.
#[derive(Default)]
pub struct Vault {
    /// Value `n` stands behind `[LABEL_n+1]`, kept with its placeholder.
    values: Vec<(String, String)>,
    bytes: usize,
}

/// Counts only: a vault's values never reach a log.
impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vault")
            .field("values", &self.values.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// A character of a placeholder's label or number.
fn in_placeholder(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'
}

impl Vault {
    /// An empty vault.
    pub fn new() -> Self {
        Self::default()
    }

    /// Values kept.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// No value kept.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with each finding (ranges of `text`, sorted by start, as
    /// [`Detectors::scan`] gives them) replaced by its placeholder; findings
    /// that overlap or touch are masked as one, named by the first.
    /// Borrowed when there is none.
    pub fn mask<'t>(
        &mut self,
        text: &'t str,
        findings: &[Finding],
        detectors: &Detectors,
    ) -> Cow<'t, str> {
        let spans = covered(findings);
        if spans.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        for (detector, r) in spans {
            let from = floor_char(text, r.start).max(copied);
            let to = ceil_char(text, r.end).max(from);
            out.push_str(text.get(copied..from).unwrap_or_default());
            let value = text.get(from..to).unwrap_or_default();
            self.placeholder(value, detectors.label(detector), &mut out);
            copied = to;
        }
        out.push_str(text.get(copied..).unwrap_or_default());
        Cow::Owned(out)
    }

    /// Writes the placeholder of `value` to `out`, taken before or new.
    fn placeholder(&mut self, value: &str, label: impl fmt::Display, out: &mut String) {
        if let Some((p, _)) = self.values.iter().find(|(_, v)| v == value) {
            out.push_str(p);
            return;
        }
        let start = out.len();
        let _ = write!(out, "[{label}");
        let room = self.values.len() < MAX_VALUES
            && value.len() <= MAX_ONE_VALUE
            && self.bytes.saturating_add(value.len()) <= MAX_VALUE_BYTES;
        if room {
            let _ = write!(out, "_{}", self.values.len() + 1);
        }
        out.push(']');
        if room {
            let p = out.get(start..).unwrap_or_default().to_string();
            self.bytes += value.len();
            self.values.push((p, value.to_string()));
        }
    }

    /// The value behind the placeholder at the start of `text`, and the
    /// placeholder's length.
    fn behind(&self, text: &[u8]) -> Option<(&str, usize)> {
        let len = 2 + text
            .get(1..)?
            .iter()
            .take(MAX_PLACEHOLDER)
            .take_while(|b| in_placeholder(**b))
            .count();
        let p = text.get(..len).filter(|p| p.ends_with(b"]"))?;
        // Its number: the digits before `]`.
        let n = p
            .iter()
            .rev()
            .skip(1)
            .take_while(|b| b.is_ascii_digit())
            .take(4)
            .enumerate()
            .fold(0usize, |n, (k, d)| {
                n + usize::from(d - b'0') * 10usize.pow(k as u32)
            });
        let (placeholder, value) = self.values.get(n.checked_sub(1)?)?;
        (placeholder.as_bytes() == p).then_some((value.as_str(), len))
    }

    /// `text` (an answer) with each placeholder this vault gave put back to
    /// its value, as long as the text stays within `max_len` bytes (a
    /// placeholder that would take it past stays as it is). A placeholder
    /// the caller wrote is put back as well: the values are the caller's
    /// own. Borrowed when there is none.
    pub fn restore<'t>(&self, text: &'t str, max_len: usize) -> Cow<'t, str> {
        if self.values.is_empty() {
            return Cow::Borrowed(text);
        }
        let bytes = text.as_bytes();
        let mut out = String::new();
        let mut copied = 0;
        let mut len = text.len();
        let mut at = 0;
        while let Some(k) = bytes
            .get(at..)
            .and_then(|b| b.iter().position(|c| *c == b'['))
        {
            at += k;
            let rest = bytes.get(at..).unwrap_or_default();
            match self.behind(rest) {
                Some((value, n)) if len - n + value.len() <= max_len => {
                    out.push_str(text.get(copied..at).unwrap_or_default());
                    out.push_str(value);
                    len = len - n + value.len();
                    at += n;
                    copied = at;
                }
                _ => at += 1,
            }
        }
        if copied == 0 {
            return Cow::Borrowed(text);
        }
        out.push_str(text.get(copied..).unwrap_or_default());
        Cow::Owned(out)
    }
}

/// Where a placeholder cut short at the end of `text` may start (a stream's
/// piece): bytes from there are to be held until the next piece comes;
/// `text.len()` when none.
pub fn pending(text: &str) -> usize {
    let bytes = text.as_bytes();
    let tail = bytes.len().saturating_sub(MAX_PLACEHOLDER + 1);
    let open = bytes
        .get(tail..)
        .and_then(|t| t.iter().rposition(|b| *b == b'['))
        .map(|k| tail + k);
    match open {
        Some(k)
            if bytes
                .get(k + 1..)
                .is_some_and(|t| t.iter().all(|b| in_placeholder(*b))) =>
        {
            k
        }
        _ => text.len(),
    }
}
