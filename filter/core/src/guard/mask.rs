//! Masking: what was found replaced by a placeholder that names what it
//! was (`[EMAIL_1]`), the same value by the same placeholder throughout a
//! call so the model still sees one address used twice, and the values kept
//! in the call's [`Vault`] so an answer can have them back. The vault is
//! bounded: past it, a value is still masked, by a placeholder without a
//! number (`[EMAIL]`) that nothing restores; nothing is let through. A
//! value is put back only when the rule that masked it says so (`restore`).

use std::borrow::Cow;
use std::fmt;
use std::fmt::Write as _;
use std::ops::Range;

use super::{ceil_char, covered, floor_char, Detector, Detectors, Finding};

/// Most values a call's vault keeps.
pub const MAX_VALUES: usize = 256;
/// Most bytes of the values a call's vault keeps, and of one value.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
const MAX_ONE_VALUE: usize = 8 << 10;
/// Longest placeholder, bytes: `[`, a label, `_`, a number, `]`.
pub const MAX_PLACEHOLDER: usize = 80;

/// The values masked in one call, by placeholder, and the rules that
/// apply to the call.
#[derive(Clone)]
pub struct Vault {
    /// Value `n` stands behind `[LABEL_n+1]`, kept with its placeholder
    /// and whether an answer may have it back.
    values: Vec<(String, String, bool)>,
    bytes: usize,
    /// The rules that apply to the call, a bit each (all by default).
    scope: u32,
}

impl Default for Vault {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            bytes: 0,
            scope: u32::MAX,
        }
    }
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
    /// The rules that apply to the call (see
    /// [`super::policy::Guardrails::applying`]).
    pub fn scope(&self) -> u32 {
        self.scope
    }

    /// Only the rules of `scope` (a bit each) apply to the call.
    pub fn limit_to(&mut self, scope: u32) {
        self.scope = scope;
    }

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

    /// A value kept is to be put back in the answer.
    pub fn restores(&self) -> bool {
        self.values.iter().any(|(_, _, keep)| *keep)
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
        self.mask_as(text, findings, detectors, &|_| true, false)
    }

    /// [`Vault::mask`], each new value kept as `restorable` says of what
    /// found it; with `restore`, the text between the findings has this
    /// vault's placeholders put back ([`Vault::restore`]) while the
    /// placeholders written here stay.
    pub fn mask_as<'t>(
        &mut self,
        text: &'t str,
        findings: &[Finding],
        detectors: &Detectors,
        restorable: &dyn Fn(Detector) -> bool,
        restore: bool,
    ) -> Cow<'t, str> {
        let spans = covered(findings);
        if spans.is_empty() && !restore {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        let gap = |v: &Self, out: &mut String, from: usize, to: usize| {
            let t = text.get(from..to).unwrap_or_default();
            match restore {
                true => out.push_str(&v.restore(t, t.len().saturating_add(MAX_VALUE_BYTES))),
                false => out.push_str(t),
            }
        };
        for (detector, r) in spans {
            let from = floor_char(text, r.start).max(copied);
            let to = ceil_char(text, r.end).max(from);
            gap(self, &mut out, copied, from);
            let value = text.get(from..to).unwrap_or_default();
            let keep = restorable(detector);
            self.placeholder(value, detectors.label(detector), keep, &mut out);
            copied = to;
        }
        gap(self, &mut out, copied, text.len());
        match out == text {
            true => Cow::Borrowed(text),
            false => Cow::Owned(out),
        }
    }

    /// Writes the placeholder of `value` to `out`, taken before or new
    /// (kept `restorable` or not).
    fn placeholder(
        &mut self,
        value: &str,
        label: impl fmt::Display,
        restorable: bool,
        out: &mut String,
    ) {
        if let Some((p, _, _)) = self.values.iter().find(|(_, v, _)| v == value) {
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
            self.values.push((p, value.to_string(), restorable));
        }
    }

    /// The value behind the placeholder at the start of `text`, and the
    /// placeholder's length; only one an answer may have back.
    fn behind(&self, text: &[u8]) -> Option<(&str, usize)> {
        self.issued(text)
            .filter(|(_, _, keep)| *keep)
            .map(|(v, n, _)| (v, n))
    }

    /// The stretches of `text` that are placeholders this vault wrote: an
    /// answer's rules do not read them (a glob of the operator's could
    /// match one).
    pub fn placeholders(&self, text: &str) -> Vec<Range<usize>> {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        if self.values.is_empty() {
            return out;
        }
        let mut at = 0;
        while let Some(k) = bytes
            .get(at..)
            .and_then(|b| b.iter().position(|c| *c == b'['))
        {
            at += k;
            match self.issued(bytes.get(at..).unwrap_or_default()) {
                Some((_, n, _)) => {
                    out.push(at..at + n);
                    at += n;
                }
                None => at += 1,
            }
        }
        out
    }

    /// The entry of the placeholder at the start of `text`: its value, its
    /// length and whether it is restored.
    fn issued(&self, text: &[u8]) -> Option<(&str, usize, bool)> {
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
        let (placeholder, value, keep) = self.values.get(n.checked_sub(1)?)?;
        (placeholder.as_bytes() == p).then_some((value.as_str(), len, *keep))
    }

    /// `text` (an answer) with each placeholder this vault gave a value it
    /// may put back put back to its value, as long as the text stays within `max_len` bytes (a
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
