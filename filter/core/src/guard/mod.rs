//! Guardrails' detectors: what in a prompt or an answer is a secret or
//! personal data, found without a regex engine (which would cost the module
//! more than all of this) in time linear in the text and within a budget
//! per call. One engine serves the guardrails and capture's redaction
//! (`tracing.capture.redact`).
//!
//! **What is found.** Each built-in detector has a stable name
//! ([`DetectorId::name`]):
//! - secrets, by their own shape wherever they start (after any character
//!   but an ASCII letter or digit, or an escape still written out): API keys
//!   by their prefix and at least 8 of `A-Za-z0-9_-` (`openai_key` `sk-`,
//!   `sk-proj-`; `anthropic_key` `sk-ant-`; `stripe_key` `sk_`, `pk_live_`,
//!   `rk_live_`; `github_token` `ghp_` `gho_` `ghs_` `ghu_` `ghr_`
//!   `github_pat_`; `gitlab_token` `glpat-`; `slack_token` `xox?-`,
//!   `xapp-`; `huggingface_token` `hf_`; `google_api_key` `AIza`;
//!   `google_oauth_token` `ya29.`), `aws_access_key_id` (`AKIA`/`ASIA` and
//!   16 of `A-Z0-9`), `jwt` (`eyJ…` in three dot-separated parts),
//!   `private_key` (a PEM `… PRIVATE KEY` block to its END line, or to the
//!   end), `bearer_token` and `basic_auth` (the credential after the word
//!   and a space), `named_credential` (a value joined by `:` or `=` to a
//!   name such as `api_key`, `x-api-key`, `token`, `client_secret`,
//!   `password`);
//! - personal data, validated where it has a checksum: `email`;
//!   `credit_card` (13 to 19 digits, alone or in groups joined by spaces or
//!   dashes, of a known issuer's prefix and length, Luhn-valid); `iban` (a
//!   country's length and mod-97 check digits, compact or in groups of
//!   four); `us_ssn` (`AAA-GG-SSSS`, no area 000, 666 or 900+, no group 00,
//!   no serial 0000); `phone` (`+` and 9 to 15 digits; `(415) 555-2671`,
//!   `415-555-2671`; a national number after its trunk `0` in groups:
//!   `020 7946 0958`); `ipv4` (octets 0 to 255 without leading zeros) and
//!   `ipv6` (groups of hex digits, one `::`, an IPv4 tail).
//!
//! An operator adds rules ([`Custom`]): glob patterns over whole words
//! (`*` any run, `?` one character) and deny-lists of words and phrases,
//! case-insensitive, found in one pass ([`words`]).
//!
//! **What is not.** A secret with no shape of its own and no name before
//! it; a phone number written as a plain run of digits, or in a national
//! format not above; a number inside another (no card is read out of a
//! longer run of digits, no address out of `1.2.3.4.5`). A dotted quad is
//! an address whatever the prose around it says (`release 1.2.3.4` holds
//! one) but right after the word `version` or a `v` (`Version=4.0.0.0`,
//! `v1.2.3.4`); with `::`, an IPv6 address has a group of three or four
//! digits, an IPv4 tail or is `::1`, so Python's slices (`xs[1::2]`) are
//! none; an e-mail address's top-level domain has a letter (`react@18.3.1`
//! is none); a .NET `PublicKeyToken=` names no credential. The false
//! positives left on a corpus of clean prompts: `tests/corpus.rs`.
//! Names, street addresses and free-form personal data need a model: a
//! guardrail service, not this.
//!
//! **Text read.** A text is read as written and with its JSON escapes
//! decoded ([`decoded`]): `{"q":"line\nsk-…"}` holds a newline before a
//! key. Every finding is a range of the text as given (a range found in
//! the decoded text that starts or ends in an escape covers it whole); a
//! finding holds ranges only, never the value, so nothing found reaches a
//! log through one.
//!
//! **Bounds.** Every detector is tried where its first byte may be and
//! reads a bounded stretch or a run the scan then steps over, so a scan is
//! linear in the text (glob patterns add at most a word's length times a
//! pattern's per pattern). A [`Budget`] bounds the bytes read and the
//! findings made over a call: past it the scan stops and says so
//! ([`Budget::truncated`]), and nothing is allocated beyond what it allows
//! (the decoded text, at most the bytes read; the findings).

use std::fmt;
use std::ops::Range;

use crate::config::check;
use crate::config::error::ConfigError;

pub mod action;
mod builtins;
mod decoded;
mod detector;
pub mod glob;
pub mod mask;
mod personal;
pub mod policy;
mod scan;
mod secrets;
pub mod service;
pub mod side;
pub mod window;
pub mod words;

pub use action::Action;
use decoded::Decoded;
pub use detector::{Detector, DetectorId, Set};
pub use mask::Vault;
use scan::{Scan, Sink};

use crate::json::Json;

/// Most operator rules.
pub const MAX_RULES: usize = 32;
/// Longest rule name.
const MAX_NAME: usize = 64;

/// A value found: what found it and where it is in the text scanned. Its
/// bytes are the caller's to read there; a finding never carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The detector or rule.
    pub detector: Detector,
    /// Bytes of the text scanned.
    pub range: Range<usize>,
}

/// What a call may spend on scanning: bytes read and findings made; and
/// what it spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    bytes: usize,
    findings: usize,
    steps: usize,
    truncated: bool,
}

impl Budget {
    /// At most `bytes` read (a text that decodes is read twice, as written
    /// and decoded) and `findings` made.
    pub const fn new(bytes: usize, findings: usize) -> Self {
        Self {
            bytes,
            findings,
            steps: 0,
            truncated: false,
        }
    }

    /// No bound: for a caller that bounds the text itself (capture reads a
    /// window of each text) and must have every finding in it.
    pub const fn unbounded() -> Self {
        Self::new(usize::MAX, usize::MAX)
    }

    /// A scan stopped short: a text was longer than the bytes left, or the
    /// findings ran out. What was not read was not looked at.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Bytes left to read.
    pub fn bytes_left(&self) -> usize {
        self.bytes
    }

    /// The work done so far: bytes the scan stopped at and runs of bytes
    /// read, turns of loops without a fixed bound, deny-list automaton and
    /// glob pattern steps. Linear in the bytes read (the tests hold it
    /// under a bound per byte).
    pub fn steps(&self) -> usize {
        self.steps
    }
}

/// An operator's rule, as the configuration gives it.
#[derive(Debug, Clone, Copy)]
pub struct Custom<'a> {
    /// Its name: the placeholder's label, the metric's and span's rule.
    pub name: &'a str,
    /// Glob patterns of whole words.
    pub globs: &'a [String],
    /// Words and phrases, any case.
    pub words: &'a [String],
}

/// The detectors a configuration asks for, built once.
#[derive(Clone)]
pub struct Detectors {
    builtins: Set,
    names: Vec<String>,
    globs: Vec<String>,
    glob_rules: Vec<u16>,
    words: Option<words::Words>,
}

/// Counts only: a deny-list may name what is not to be said.
impl fmt::Debug for Detectors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Detectors")
            .field("builtins", &self.builtins)
            .field("rules", &self.names)
            .field("globs", &self.globs.len())
            .field("words", &self.words.as_ref().map_or(0, words::Words::len))
            .finish()
    }
}

impl Detectors {
    /// The built-ins of `builtins` and the operator's `rules` (a finding of
    /// rule `k` is [`Detector::Custom`]`(k)`), checked: at most
    /// [`MAX_RULES`] rules of distinct names (no built-in's), at most
    /// [`glob::MAX_PATTERNS`] patterns and [`words::MAX_WORDS`] words in
    /// all. Errors name fields as `rules[k].…`; a word is never echoed.
    pub fn new(builtins: Set, rules: &[Custom<'_>]) -> Result<Self, ConfigError> {
        check::at_most("rules", rules, MAX_RULES, "rules")?;
        let mut d = Self {
            builtins,
            names: Vec::with_capacity(rules.len()),
            globs: Vec::new(),
            glob_rules: Vec::new(),
            words: None,
        };
        let mut words: Vec<(&str, u16)> = Vec::new();
        let mut word_bytes = 0usize;
        for (k, rule) in rules.iter().enumerate() {
            let bad = |field: String, message: &str| {
                Err(ConfigError::new(format!("rules[{k}].{field}"), message))
            };
            let taken = d.names.iter().any(|n| n == rule.name)
                || DetectorId::from_name(rule.name).is_some();
            if !check::is_label(rule.name, MAX_NAME) || taken {
                return bad(
                    "name".into(),
                    "a rule's name is 1 to 64 of `A-Za-z0-9_-`, its own and no built-in detector's",
                );
            }
            d.names.push(rule.name.to_string());
            for (j, p) in rule.globs.iter().enumerate() {
                if let Some(message) = glob::invalid(p) {
                    return bad(format!("globs[{j}]"), &message);
                }
                d.globs.push(p.clone());
                d.glob_rules.push(k as u16);
            }
            for (j, w) in rule.words.iter().enumerate() {
                let w = w.trim();
                if w.is_empty()
                    || w.len() > words::MAX_WORD_BYTES
                    || w.chars().any(char::is_control)
                {
                    return bad(
                        format!("words[{j}]"),
                        "a word or phrase is 1 to 128 bytes without a control character",
                    );
                }
                word_bytes += w.len();
                words.push((w, k as u16));
            }
        }
        check::at_most("rules[].globs", &d.globs, glob::MAX_PATTERNS, "patterns")?;
        check::at_most("rules[].words", &words, words::MAX_WORDS, "words")?;
        if word_bytes > words::MAX_TOTAL_BYTES {
            return Err(ConfigError::new(
                "rules[].words",
                "more than 16 KiB of words",
            ));
        }
        if !words.is_empty() {
            d.words = Some(words::Words::new(words));
        }
        Ok(d)
    }

    /// The built-in detectors on.
    pub fn builtins(&self) -> Set {
        self.builtins
    }

    /// The stable name of a detector, or the name of a rule.
    pub fn name(&self, detector: Detector) -> &str {
        match detector {
            Detector::Builtin(id) => id.name(),
            Detector::Custom(k) => self
                .names
                .get(usize::from(k))
                .map_or("custom", String::as_str),
        }
    }

    /// Adds what the detectors find in `text` to `out`: ranges of `text`,
    /// sorted by start (a longer one first), possibly overlapping (one
    /// value may be two things; the text as written and decoded may give a
    /// detector two ranges of one value), a finding made in both readings
    /// once. Reads at most what `budget` has left, and takes what it reads
    /// and finds from it.
    pub fn scan(&self, text: &str, budget: &mut Budget, out: &mut Vec<Finding>) {
        self.view().scan(text, budget, out);
    }

    fn view(&self) -> View<'_> {
        View {
            builtins: self.builtins,
            globs: &self.globs,
            glob_rules: &self.glob_rules,
            words: self.words.as_ref(),
        }
    }

    /// The label of a placeholder for what `detector` found: its name in
    /// capitals.
    fn label(&self, detector: Detector) -> Label<'_> {
        Label(self.name(detector))
    }
}

/// A name as a placeholder's label: `credit_card` → `CREDIT_CARD`.
struct Label<'a>(&'a str);

impl fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        self.0.chars().try_for_each(|c| {
            f.write_char(match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' => c.to_ascii_uppercase(),
                _ => '_',
            })
        })
    }
}

/// What one scan looks for, borrowed: capture's rules (read from its own
/// section) and a built [`Detectors`] scan alike.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    builtins: Set,
    globs: &'a [String],
    /// Each glob's rule; rule 0 for those past its end.
    glob_rules: &'a [u16],
    words: Option<&'a words::Words>,
}

impl<'a> View<'a> {
    /// Capture's rules: its glob patterns and, when `builtins`, the
    /// built-ins of [`Set::CAPTURE`].
    pub(crate) fn capture(globs: &'a [String], builtins: bool) -> Self {
        Self {
            builtins: if builtins { Set::CAPTURE } else { Set::NONE },
            globs,
            glob_rules: &[],
            words: None,
        }
    }

    /// See [`Detectors::scan`].
    pub(crate) fn scan(&self, text: &str, budget: &mut Budget, out: &mut Vec<Finding>) {
        let none = self.builtins.is_empty() && self.globs.is_empty() && self.words.is_none();
        if none || text.is_empty() {
            return;
        }
        // What the budget allows of the text: read twice when it decodes.
        let mut read = text
            .get(..floor_char(text, budget.bytes))
            .unwrap_or_default();
        if read.contains('\\') && read.len() > budget.bytes / 2 {
            read = read
                .get(..floor_char(read, budget.bytes / 2))
                .unwrap_or_default();
        }
        budget.truncated |= read.len() < text.len();
        let view = Decoded::of(read);
        let times = if view.decodes() { 2 } else { 1 };
        budget.bytes = budget.bytes.saturating_sub(read.len() * times);
        let mut mine = Vec::new();
        let mut sink = Sink {
            out: &mut mine,
            left: budget.findings,
            full: false,
        };
        let mut steps = self.pass(view.text(), &mut sink);
        view.map_back(sink.out);
        if view.decodes() && !sink.full {
            steps += self.pass(read, &mut sink);
        }
        budget.truncated |= sink.full;
        budget.steps = budget.steps.saturating_add(steps);
        sort_findings(&mut mine);
        mine.dedup();
        budget.findings = budget.findings.saturating_sub(mine.len());
        out.append(&mut mine);
    }

    /// One view of the text: every detector over it.
    fn pass(&self, text: &str, sink: &mut Sink<'_>) -> usize {
        let mut steps = 0;
        if !self.builtins.is_empty() {
            let s = Scan::new(text);
            builtins::pass(&s, self.builtins, sink);
            steps += s.steps();
        }
        if !sink.full && !self.globs.is_empty() {
            steps += glob::words(text, self.globs, self.glob_rules, sink);
        }
        if let Some(words) = self.words.filter(|_| !sink.full) {
            steps += words.find(text, sink);
        }
        steps
    }
}

/// Sorts findings by start, a longer one first.
pub(crate) fn sort_findings(v: &mut [Finding]) {
    heapsort(v, |a, b| {
        (a.range.start, b.range.end, a.detector) < (b.range.start, a.range.end, b.detector)
    });
}

/// Sorts `v` by `less`: a heapsort, without allocating, and a fraction of
/// the code the standard library's sorts put in the module for each type.
#[inline(never)]
fn heapsort<T>(v: &mut [T], less: fn(&T, &T) -> bool) {
    let lt = |v: &[T], a: usize, b: usize| match (v.get(a), v.get(b)) {
        (Some(x), Some(y)) => less(x, y),
        _ => false,
    };
    let sift = |v: &mut [T], mut root: usize, end: usize| loop {
        let mut child = 2 * root + 1;
        if child >= end {
            break;
        }
        if child + 1 < end && lt(v, child, child + 1) {
            child += 1;
        }
        if !lt(v, root, child) {
            break;
        }
        v.swap(root, child);
        root = child;
    };
    for root in (0..v.len() / 2).rev() {
        sift(v, root, v.len());
    }
    for end in (1..v.len()).rev() {
        v.swap(0, end);
        sift(v, 0, end);
    }
}

/// `at`, or the character boundary before it.
pub(crate) fn floor_char(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// `at`, or the character boundary after it.
pub(crate) fn ceil_char(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// The stretches `findings` (sorted by start) cover, each named by the
/// first finding in it: findings that overlap or touch are one stretch.
pub(crate) fn covered(findings: &[Finding]) -> Vec<(Detector, Range<usize>)> {
    let mut out: Vec<(Detector, Range<usize>)> = Vec::new();
    for f in findings {
        match out.last_mut() {
            Some((_, last)) if f.range.start <= last.end => {
                last.end = last.end.max(f.range.end);
            }
            _ => out.push((f.detector, f.range.clone())),
        }
    }
    out
}

/// The string at `at` in `value`.
pub(crate) fn string_at<'a>(value: &'a mut Json, at: &[usize]) -> Option<&'a mut String> {
    let mut v = value;
    for &i in at {
        v = match v {
            Json::Array(items) => items.get_mut(i)?,
            Json::Object(members) => &mut members.get_mut(i)?.1,
            _ => return None,
        };
    }
    match v {
        Json::String(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests;
