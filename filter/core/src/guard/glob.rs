//! An operator's glob patterns (`*` any run, `?` one character, anchored at
//! both ends) over the words of a text: runs of characters between
//! whitespace, the punctuation that quotes or joins them
//! (``"'`()<>[]{},;:=|\``) and escapes still written out.

use super::detector::Detector;
use super::scan::Sink;

/// Longest pattern, bytes; with at most [`MAX_PATTERNS`] of them, a word
/// costs at most its length times this per pattern.
pub const MAX_PATTERN_BYTES: usize = 128;
/// Most patterns.
pub const MAX_PATTERNS: usize = 32;

/// What is wrong with `p` as a pattern, if anything.
pub fn invalid(p: &str) -> Option<String> {
    if p.len() > MAX_PATTERN_BYTES {
        Some(format!("is longer than {MAX_PATTERN_BYTES} bytes"))
    } else if p.chars().all(|c| c == '*' || c == '?') {
        Some(format!("{p:?} names no character of a word"))
    } else if p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some(format!(
            "{p:?} holds a space or control character: a pattern matches one word"
        ))
    } else {
        None
    }
}

/// A character that ends a word.
pub fn separates(c: char) -> bool {
    c.is_whitespace() || "\"'`()<>[]{},;:=|\\".contains(c)
}

/// Adds the words of `text` a pattern matches to `sink`, once for each
/// rule whose patterns match (`rules`: each pattern's rule, in order;
/// rule 0 for a pattern past its end). Returns the steps taken.
pub(super) fn words(text: &str, patterns: &[String], rules: &[u16], sink: &mut Sink<'_>) -> usize {
    let mut steps = 0usize;
    // The rules whose patterns match the word `from..to`; false once the
    // sink is full.
    let mut on_word = |from: usize, to: usize, steps: &mut usize| {
        let word = text.get(from..to).unwrap_or_default().as_bytes();
        let mut last = None;
        for (k, p) in patterns.iter().enumerate() {
            let rule = rules.get(k).copied().unwrap_or(0);
            if last != Some(rule) && glob(p.as_bytes(), word, steps) {
                last = Some(rule);
                if !sink.hit(Detector::Custom(rule), from..to) {
                    return false;
                }
            }
        }
        true
    };
    let bytes = text.as_bytes();
    let mut start = None;
    // Bytes of an escape's letters still to pass.
    let mut escape: usize = 0;
    for (i, c) in text.char_indices() {
        steps += 1;
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
                if !on_word(s, i, &mut steps) {
                    return steps;
                }
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        on_word(s, text.len(), &mut steps);
    }
    steps
}

/// A glob pattern (`*` any run, `?` one character) matches all of `word`:
/// the iterative matcher that backs up to the last `*` only, at most the
/// word's length times the pattern's steps (counted in `steps`).
pub(crate) fn glob(pattern: &[u8], word: &[u8], steps: &mut usize) -> bool {
    let (mut p, mut w) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while w < word.len() {
        *steps += 1;
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
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_words() {
        for (p, w, hit) in [
            ("sk-*", "sk-abc", true),
            ("sk-*", "ask-abc", false),
            ("*@*.*", "bob@example.com", true),
            ("*@*.*", "bob@example", false),
            ("a?c", "abc", true),
            ("a?c", "aéc", true),
            ("a?c", "ac", false),
            ("*x*y*", "aaxbbybb", true),
            ("*x*y*", "aaybbxbb", false),
            ("tok_*_end", "tok_1_2_end", true),
            ("abc", "abcd", false),
            ("**", "", true),
        ] {
            assert_eq!(glob(p.as_bytes(), w.as_bytes(), &mut 0), hit, "{p} {w}");
        }
    }
}
