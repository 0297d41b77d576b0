//! Redaction of captured text (`tracing.capture.redact`) without a regex
//! engine, which would cost the module more than all of this: the text is
//! read as words (runs of characters between whitespace and the
//! punctuation that quotes or joins them: `"'`()<>[]{},;=|\`), and a word
//! that a glob pattern (`*` any run, `?` one character, anchored at both
//! ends) or a built-in rule matches is replaced by [`REDACTED`]. Built-ins:
//! e-mail addresses, API keys by their well-known prefixes, JSON web
//! tokens, and the word after `Bearer` or `Basic`.
//!
//! Matching is linear in the text for patterns with one `*`, and at worst
//! the word's length times the pattern's (at most 128 bytes) with more.

use std::borrow::Cow;

/// What a redacted word becomes.
pub const REDACTED: &str = "[REDACTED]";

/// Prefixes of API keys and tokens, each followed by at least
/// [`KEY_MIN_TAIL`] characters: OpenAI and Anthropic (`sk-`, `sk-ant-`),
/// Stripe, GitHub, GitLab, Slack, Hugging Face, AWS access key ids, Google.
const KEY_PREFIXES: [&str; 14] = [
    "sk-",
    "sk_",
    "pk_live_",
    "rk_live_",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "hf_",
    "AKIA",
    "AIza",
];
/// Characters after a key's prefix for it to be a key (`sk-` alone is a word).
const KEY_MIN_TAIL: usize = 8;

/// The words before a credential.
const SCHEMES: [&str; 2] = ["bearer", "basic"];

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

    fn matches(&self, word: &str) -> bool {
        (self.builtins && (is_email(word) || is_key(word)))
            || self
                .globs
                .iter()
                .any(|g| glob(g.as_bytes(), word.as_bytes()))
    }
}

/// A character that ends a word.
fn separates(c: char) -> bool {
    c.is_whitespace() || "\"'`()<>[]{},;=|\\".contains(c)
}

/// `text` with each word a rule matches replaced by [`REDACTED`]; borrowed
/// when nothing matched.
pub fn redact<'t>(text: &'t str, rules: &Rules<'_>) -> Cow<'t, str> {
    if rules.none() {
        return Cow::Borrowed(text);
    }
    let mut out: Option<String> = None;
    // Bytes of `text` already in `out`.
    let mut copied = 0;
    let mut after_scheme = false;
    let mut start = None;
    let mut on_word = |from: usize, to: usize, out: &mut Option<String>, copied: &mut usize| {
        let word = text.get(from..to).unwrap_or_default();
        let hit = (rules.builtins && after_scheme) || rules.matches(word);
        after_scheme = rules.builtins && SCHEMES.iter().any(|s| word.eq_ignore_ascii_case(s));
        if hit {
            let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
            o.push_str(text.get(*copied..from).unwrap_or_default());
            o.push_str(REDACTED);
            *copied = to;
        }
    };
    for (i, c) in text.char_indices() {
        match (start, separates(c)) {
            (None, false) => start = Some(i),
            (Some(s), true) => {
                on_word(s, i, &mut out, &mut copied);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        on_word(s, text.len(), &mut out, &mut copied);
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut o) => {
            o.push_str(text.get(copied..).unwrap_or_default());
            Cow::Owned(o)
        }
    }
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

/// An e-mail address: a local part, `@`, and a domain with a dot inside.
fn is_email(word: &str) -> bool {
    let Some((local, domain)) = word.split_once('@') else {
        return false;
    };
    let domain = domain.trim_end_matches(['.', ':', '!', '?']);
    !local.is_empty()
        && domain
            .split_once('.')
            .is_some_and(|(host, tld)| !host.is_empty() && !tld.is_empty())
}

/// An API key by its prefix, or a JSON web token (`eyJ…` in three parts).
fn is_key(word: &str) -> bool {
    let long_after = |p: &str| {
        word.strip_prefix(p)
            .is_some_and(|tail| tail.len() >= KEY_MIN_TAIL)
    };
    KEY_PREFIXES.iter().any(|p| long_after(p))
        || (word.starts_with("eyJ") && word.split('.').filter(|p| !p.is_empty()).count() == 3)
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
mod tests {
    use super::*;

    fn rules(globs: &[&str], builtins: bool) -> Vec<String> {
        let _ = builtins;
        globs.iter().map(|g| g.to_string()).collect()
    }

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
            assert_eq!(glob(p.as_bytes(), w.as_bytes()), hit, "{p} {w}");
        }
    }

    #[test]
    fn words_a_rule_matches_are_replaced_and_the_rest_kept() {
        let globs = rules(&["secret-*"], false);
        let r = Rules {
            globs: &globs,
            builtins: true,
        };
        assert_eq!(
            redact("mail bob@example.com, key \"sk-abcdefgh1234\" ok", &r),
            "mail [REDACTED], key \"[REDACTED]\" ok"
        );
        assert_eq!(
            redact("Authorization: Bearer abc.def and secret-42", &r),
            "Authorization: Bearer [REDACTED] and [REDACTED]"
        );
        assert_eq!(redact("api_key=AKIAABCDEFGHIJ", &r), "api_key=[REDACTED]");
        assert_eq!(redact("jwt eyJa.eyJb.sig end", &r), "jwt [REDACTED] end");
        // A short prefix alone, an `@` without a domain: words, not secrets.
        assert!(matches!(redact("sk- @home a@b", &r), Cow::Borrowed(_)));
        let none = Rules {
            globs: &[],
            builtins: false,
        };
        assert!(matches!(redact("bob@example.com", &none), Cow::Borrowed(_)));
        // Non-ASCII text around a match.
        assert_eq!(redact("é secret-x ü", &r), "é [REDACTED] ü");
    }

    #[test]
    fn a_cut_never_leaves_half_a_word() {
        let t = "send to bob@example.com now";
        assert_eq!(word_boundary(t, 100), t.len());
        assert_eq!(word_boundary(t, 7), 7);
        // Inside the address: back to before it.
        assert_eq!(word_boundary(t, 15), 7);
        assert_eq!(word_boundary("oneword", 3), 0);
        // On a character boundary.
        assert_eq!(word_boundary("aé b", 2), 0);
        assert_eq!(word_boundary("é éé", 3), 2);
    }
}
