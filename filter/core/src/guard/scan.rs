//! A text as the built-in detectors read it, byte by byte, and where their
//! findings go. The work is counted ([`Scan::steps`]: each byte the scan
//! stops at, each byte a run or a search reads, each turn of a loop without
//! a fixed bound), so a test can show the bound on hostile input by
//! counting rather than timing.
//!
//! A shape starts at a start boundary: the start of the text, after a
//! character that is not an ASCII letter or digit, or after an escape still
//! written out (`\n`, `\u0041`: JSON escaped twice).

use std::cell::Cell;
use std::ops::Range;

use super::detector::Detector;
use super::Finding;

/// Where findings go: at most `left` more.
pub(super) struct Sink<'o> {
    pub out: &'o mut Vec<Finding>,
    pub left: usize,
    /// A finding was refused: the scan stopped.
    pub full: bool,
}

impl Sink<'_> {
    /// Records a finding; false once the bound is reached (the scan stops).
    #[inline(never)]
    pub fn hit(&mut self, detector: Detector, range: Range<usize>) -> bool {
        if self.left == 0 {
            self.full = true;
            return false;
        }
        self.left -= 1;
        self.out.push(Finding { detector, range });
        true
    }
}

/// The text, read byte by byte (every built-in's bytes are ASCII).
pub(super) struct Scan<'t> {
    pub t: &'t str,
    pub b: &'t [u8],
    steps: Cell<usize>,
}

impl<'t> Scan<'t> {
    pub fn new(t: &'t str) -> Self {
        Self {
            t,
            b: t.as_bytes(),
            steps: Cell::new(0),
        }
    }

    /// The work done so far.
    pub fn steps(&self) -> usize {
        self.steps.get()
    }

    pub fn step(&self, n: usize) {
        self.steps.set(self.steps.get().saturating_add(n));
    }

    pub fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    pub fn starts(&self, i: usize, prefix: &str) -> bool {
        self.b
            .get(i..)
            .is_some_and(|rest| rest.starts_with(prefix.as_bytes()))
    }

    pub fn starts_any_case(&self, i: usize, word: &str) -> bool {
        self.b
            .get(i..i.saturating_add(word.len()))
            .is_some_and(|w| w.eq_ignore_ascii_case(word.as_bytes()))
    }

    /// The end of the run from `i` of bytes `f` takes.
    pub fn run(&self, i: usize, f: impl Fn(u8) -> bool) -> usize {
        self.run_max(i, f, usize::MAX)
    }

    /// [`Scan::run`], reading at most `max` bytes.
    pub fn run_max(&self, i: usize, f: impl Fn(u8) -> bool, max: usize) -> usize {
        let len = self.b.get(i..).map_or(0, |rest| {
            rest.iter().take(max).take_while(|b| f(**b)).count()
        });
        self.step(len.saturating_add(1));
        i.saturating_add(len)
    }

    /// Where `needle` is next, from `i`.
    pub fn find(&self, i: usize, needle: &str) -> Option<usize> {
        let rest = self.t.get(i..)?;
        let at = rest.find(needle);
        self.step(at.map_or(rest.len(), |a| a.saturating_add(needle.len())));
        Some(i.saturating_add(at?))
    }

    /// The byte at `i` is the letter of an escape still written out (`\n`).
    pub fn escaped(&self, i: usize) -> bool {
        i.checked_sub(1).is_some_and(|p| self.at(p) == b'\\') && b"ntrbf".contains(&self.at(i))
    }

    /// A shape may start at `i`.
    pub fn starts_here(&self, i: usize) -> bool {
        let Some(prev) = i.checked_sub(1).map(|p| self.at(p)) else {
            return true;
        };
        if !prev.is_ascii_alphanumeric() {
            return true;
        }
        // `\n`, `\t`…: an escape still written out.
        if self.escaped(i - 1) {
            return true;
        }
        // `\u0041`.
        i.checked_sub(6).is_some_and(|p| {
            self.at(p) == b'\\'
                && self.at(p + 1) == b'u'
                && self
                    .b
                    .get(p + 2..i)
                    .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        })
    }
}
