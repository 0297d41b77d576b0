//! The text values are found in, with its JSON escapes decoded: a prompt's
//! text is often JSON inside a string (a tool call's arguments, a tool-use
//! input written back), where `\nsk-…` is a newline before a key, not the
//! word `nsk-…`. Detectors run on the decoded text; what they find is
//! mapped back to the raw text, whose other bytes (formatting, escapes)
//! stay as they were. The decoded text is walked again to map its ranges
//! back, so no map of a byte per byte is held.

use std::borrow::Cow;

use super::Finding;

/// A run of the raw text and what it decodes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    /// Bytes of the raw text, from the segment's start.
    raw: usize,
    /// Bytes it decodes to: the same as `raw` for a literal run.
    decoded: usize,
    /// One escape, decoded to one character.
    escape: Option<char>,
}

/// The escape at the start of `raw` (which starts with `\`): the character
/// and its bytes; `None` for a backslash that escapes nothing JSON knows.
fn escape(raw: &[u8]) -> Option<(char, usize)> {
    let simple = match raw.get(1)? {
        b'n' => '\n',
        b't' => '\t',
        b'r' => '\r',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'u' => return unicode(raw),
        _ => return None,
    };
    Some((simple, 2))
}

/// Four hex digits after `\u` at the start of `raw`.
fn hex4(raw: &[u8]) -> Option<u32> {
    let digits = raw.get(2..6)?;
    digits.iter().try_fold(0u32, |n, d| {
        let v = char::from(*d).to_digit(16)?;
        n.checked_mul(16)?.checked_add(v)
    })
}

/// A `\uXXXX` escape, or a surrogate pair of two; a lone surrogate decodes
/// to U+FFFD.
fn unicode(raw: &[u8]) -> Option<(char, usize)> {
    let high = hex4(raw)?;
    if !(0xD800..0xDC00).contains(&high) {
        return Some((char::from_u32(high).unwrap_or('\u{FFFD}'), 6));
    }
    let low = raw
        .get(6..)
        .filter(|rest| rest.first() == Some(&b'\\') && rest.get(1) == Some(&b'u'))
        .and_then(hex4)
        .filter(|low| (0xDC00..0xE000).contains(low));
    match low {
        Some(low) => {
            let c = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
            Some((char::from_u32(c).unwrap_or('\u{FFFD}'), 12))
        }
        None => Some(('\u{FFFD}', 6)),
    }
}

/// The segment of `raw` starting at its first byte: a literal run to the
/// next backslash, or the escape there (a backslash escaping nothing is a
/// literal byte).
fn segment(raw: &str) -> Segment {
    let bytes = raw.as_bytes();
    if bytes.first() == Some(&b'\\') {
        return match escape(bytes) {
            Some((c, len)) => Segment {
                raw: len,
                decoded: c.len_utf8(),
                escape: Some(c),
            },
            None => Segment {
                raw: 1,
                decoded: 1,
                escape: None,
            },
        };
    }
    let len = raw.find('\\').unwrap_or(raw.len());
    Segment {
        raw: len,
        decoded: len,
        escape: None,
    }
}

/// Text as detectors read it (no `Debug`: it is a prompt's text).
pub(super) struct Decoded<'t> {
    raw: &'t str,
    text: Cow<'t, str>,
}

impl<'t> Decoded<'t> {
    /// `raw` decoded; borrowed when it has no backslash.
    pub(super) fn of(raw: &'t str) -> Self {
        if !raw.contains('\\') {
            return Self {
                raw,
                text: Cow::Borrowed(raw),
            };
        }
        let mut text = String::with_capacity(raw.len());
        let mut at = 0;
        while let Some(rest) = raw.get(at..).filter(|r| !r.is_empty()) {
            let s = segment(rest);
            match s.escape {
                Some(c) => text.push(c),
                None => text.push_str(rest.get(..s.raw).unwrap_or_default()),
            }
            at = at.saturating_add(s.raw.max(1));
        }
        Self {
            raw,
            text: Cow::Owned(text),
        }
    }

    /// The decoded text.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// The raw text holds a backslash: the decoded text may differ.
    pub(super) fn decodes(&self) -> bool {
        matches!(self.text, Cow::Owned(_))
    }

    /// The findings' ranges of the decoded text made ranges of the raw
    /// text: a range that starts or ends inside an escape covers it whole.
    /// The walk goes forward only: the starts are mapped in order, then the
    /// ends (the findings are left in the order of their ends).
    pub(super) fn map_back(&self, found: &mut [Finding]) {
        if !self.decodes() {
            return;
        }
        for up in [false, true] {
            super::heapsort(found, if up { by_end } else { by_start });
            let mut walk = Walk {
                raw: self.raw,
                raw_at: 0,
                decoded_at: 0,
                segment: segment(self.raw),
            };
            for f in found.iter_mut() {
                match up {
                    false => f.range.start = walk.raw_at(f.range.start, false),
                    true => f.range.end = walk.raw_at(f.range.end, true),
                }
            }
        }
    }
}

fn by_start(a: &Finding, b: &Finding) -> bool {
    a.range.start < b.range.start
}

fn by_end(a: &Finding, b: &Finding) -> bool {
    a.range.end < b.range.end
}

/// A walk over the segments, forward only.
struct Walk<'t> {
    raw: &'t str,
    /// Where the current segment starts, raw and decoded.
    raw_at: usize,
    decoded_at: usize,
    segment: Segment,
}

impl Walk<'_> {
    /// The raw offset of decoded offset `at` (not before the last asked):
    /// inside an escape, its start, or its end when `up`.
    fn raw_at(&mut self, at: usize, up: bool) -> usize {
        while at >= self.decoded_at.saturating_add(self.segment.decoded) {
            let next = self.raw_at.saturating_add(self.segment.raw);
            if next >= self.raw.len() || self.segment.raw == 0 {
                return self.raw.len();
            }
            self.raw_at = next;
            self.decoded_at = self.decoded_at.saturating_add(self.segment.decoded);
            self.segment = segment(self.raw.get(next..).unwrap_or_default());
        }
        let into = at.saturating_sub(self.decoded_at);
        match self.segment.escape {
            None => self.raw_at.saturating_add(into),
            Some(_) if into == 0 || !up => self.raw_at,
            Some(_) => self.raw_at.saturating_add(self.segment.raw),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use super::*;

    #[test]
    fn escapes_decode_as_json_reads_them() {
        for (raw, decoded) in [
            ("plain", "plain"),
            (
                r#"a\nb\tc\"d\\e\/f\rg\bh\fi"#,
                "a\nb\tc\"d\\e/f\rg\u{8}h\u{c}i",
            ),
            (r"\u00e9\u20ac", "é€"),
            (r"\ud83d\ude00!", "😀!"),
            // A lone surrogate, a backslash escaping nothing, a cut escape.
            (r"\ud800x", "\u{FFFD}x"),
            (r"\q\u12", r"\q\u12"),
            ("é\\", "é\\"),
        ] {
            assert_eq!(Decoded::of(raw).text(), decoded, "{raw}");
        }
    }

    fn raw_ranges(d: &Decoded<'_>, hits: &[Range<usize>]) -> Vec<Range<usize>> {
        // Each tagged with its place, to be put back in order.
        let mut found: Vec<Finding> = hits
            .iter()
            .enumerate()
            .map(|(k, r)| Finding {
                detector: crate::guard::Detector::Custom(k as u16),
                range: r.clone(),
            })
            .collect();
        d.map_back(&mut found);
        found.sort_by_key(|f| f.detector);
        found.into_iter().map(|f| f.range).collect()
    }

    #[test]
    fn decoded_ranges_map_back_to_the_raw_bytes_they_came_from() {
        let raw = r#"x\nsk-abc\u00e9\"z"#;
        let d = Decoded::of(raw);
        assert_eq!(d.text(), "x\nsk-abcé\"z");
        let map = |r: Range<usize>| raw_ranges(&d, &[r, 99..99]).swap_remove(0);
        // `sk-abc`, `é` (an escape of six bytes), `z` after `\"`, the end.
        let hits = [2..8, 8..10, 11..12];
        assert_eq!(raw_ranges(&d, &hits), [3..9, 9..15, 17..18]);
        assert_eq!(raw.get(map(1..2)), Some(r"\n"));
        // Inside an escape's character: the whole escape.
        assert_eq!(map(9..10), 9..15);
        assert_eq!(map(0..12), 0..raw.len());
        assert_eq!(raw_ranges(&Decoded::of("abc"), &[1..2, 2..3]), [1..2, 2..3]);
        // Overlapping and out of order: each mapped alone.
        assert_eq!(raw_ranges(&d, &[8..12, 2..9, 9..10]), [9..18, 3..15, 9..15]);
    }
}
