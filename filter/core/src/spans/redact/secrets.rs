//! The built-in rules: secrets found by their own shape wherever they start,
//! not as whole words, so a key joined to its name (`api_key:sk-…`) or after
//! an escape (`\nsk-…` in JSON inside a string) is found as well. One pass
//! over the text, each rule tried where its first byte is, so the cost stays
//! linear in the text.
//!
//! A shape starts at a start boundary: the start of the text, after a
//! character that is not an ASCII letter or digit, or after an escape still
//! written out (`\n`, `\u0041`: JSON escaped twice).

use std::ops::Range;

/// Characters after a key's prefix for it to be a key (`sk-` alone is a word).
const KEY_MIN_TAIL: usize = 8;
/// Characters of an AWS access key id after `AKIA` or `ASIA`.
const AWS_TAIL: usize = 16;
/// Prefixes of API keys and tokens: OpenAI and Anthropic (`sk-`, `sk-ant-`,
/// `sk-proj-`), Stripe, GitHub, GitLab, Slack, Hugging Face, Google (API
/// keys, OAuth access tokens); AWS access key ids apart ([`AWS_PREFIXES`]).
const KEY_PREFIXES: [&str; 19] = [
    "sk-",
    "sk_",
    "pk_live_",
    "rk_live_",
    "ghp_",
    "gho_",
    "ghs_",
    "ghu_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxs-",
    "xapp-",
    "hf_",
    "AIza",
    "ya29.",
];
const AWS_PREFIXES: [&str; 2] = ["AKIA", "ASIA"];
/// The words before a credential, any case.
const SCHEMES: [&str; 2] = ["bearer", "basic"];
/// Names whose value is a credential, by how the name ends once lowercased
/// without `_`, `-` and `.` (`api_key`, `x-api-key`, `OPENAI_API_KEY`,
/// `access_token`, `client_secret`, `aws_secret_access_key`, `password`).
const NAMES: [&str; 12] = [
    "apikey",
    "token",
    "secret",
    "secretkey",
    "accesskey",
    "privatekey",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "credentials",
    "authorization",
];
/// The longest of [`NAMES`].
const NAME_MAX: usize = 13;
/// Bytes looked back over for a name before `:` or `=`.
const NAME_LOOKBACK: usize = 64;
/// Quotes and spaces between a name, its `:` or `=`, and its value.
const FILLER_MAX: usize = 8;
/// Bytes of a PEM block's label (`RSA PRIVATE KEY`).
const PEM_LABEL_MAX: usize = 64;

/// A character of a key after its prefix, and of a JWT's parts.
fn key_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// A character of a credential written after a scheme or a name.
fn in_value(b: u8) -> bool {
    !b.is_ascii_whitespace() && !b"\"'`,;&<>()[]{}|\\".contains(&b)
}

fn upper_or_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

/// The text, read byte by byte (every rule's bytes are ASCII).
struct Scan<'t> {
    t: &'t str,
    b: &'t [u8],
}

impl Scan<'_> {
    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    fn starts(&self, i: usize, prefix: &str) -> bool {
        self.b
            .get(i..)
            .is_some_and(|rest| rest.starts_with(prefix.as_bytes()))
    }

    fn starts_any_case(&self, i: usize, word: &str) -> bool {
        self.b
            .get(i..i.saturating_add(word.len()))
            .is_some_and(|w| w.eq_ignore_ascii_case(word.as_bytes()))
    }

    /// The end of the run from `i` of bytes `f` takes.
    fn run(&self, i: usize, f: impl Fn(u8) -> bool) -> usize {
        let len = self
            .b
            .get(i..)
            .map_or(0, |rest| rest.iter().take_while(|b| f(**b)).count());
        i.saturating_add(len)
    }

    /// Where `needle` is next, from `i`.
    fn find(&self, i: usize, needle: &str) -> Option<usize> {
        let at = self.t.get(i..)?.find(needle)?;
        Some(i.saturating_add(at))
    }

    /// The byte at `i` is the letter of an escape still written out (`\n`).
    fn escaped(&self, i: usize) -> bool {
        i.checked_sub(1).is_some_and(|p| self.at(p) == b'\\') && b"ntrbf".contains(&self.at(i))
    }

    /// A shape may start at `i`.
    fn starts_here(&self, i: usize) -> bool {
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

    /// A shape that starts at `i` and is taken whole: its end.
    fn shape(&self, i: usize) -> Option<usize> {
        match self.at(i) {
            b'-' => self.pem(i),
            b'e' => self.jwt(i),
            _ => self.key(i),
        }
    }

    /// An API key by its prefix.
    fn key(&self, i: usize) -> Option<usize> {
        if let Some(p) = AWS_PREFIXES.iter().find(|p| self.starts(i, p)) {
            let from = i.saturating_add(p.len());
            let end = self.run(from, upper_or_digit);
            return (end.saturating_sub(from) >= AWS_TAIL).then_some(end);
        }
        let p = KEY_PREFIXES.iter().find(|p| self.starts(i, p))?;
        let from = i.saturating_add(p.len());
        let end = self.run(from, key_char);
        (end.saturating_sub(from) >= KEY_MIN_TAIL).then_some(end)
    }

    /// A JSON web token: `eyJ…`, a dot, a payload, a dot, a signature
    /// (empty for `alg: none`). The end of its first part when it is none.
    fn jwt(&self, i: usize) -> Option<usize> {
        if !self.starts(i, "eyJ") {
            return None;
        }
        let one = self.run(i, key_char);
        if self.at(one) != b'.' {
            return None;
        }
        let two = self.run(one.saturating_add(1), key_char);
        if two == one.saturating_add(1) || self.at(two) != b'.' {
            return None;
        }
        Some(self.run(two.saturating_add(1), key_char))
    }

    /// A PEM private key block, to its END line or, without one, to the end.
    fn pem(&self, i: usize) -> Option<usize> {
        const BEGIN: &str = "-----BEGIN ";
        if !self.starts(i, BEGIN) {
            return None;
        }
        let label = i.saturating_add(BEGIN.len());
        let end = self.run(label, |b| b.is_ascii_uppercase() || b == b' ');
        let name = self.b.get(label..end)?;
        let private = name.windows(11).any(|w| w == b"PRIVATE KEY");
        if !private || end.saturating_sub(label) > PEM_LABEL_MAX || !self.starts(end, "-----") {
            return None;
        }
        let whole = self.b.len();
        let Some(end_line) = self.find(end, "-----END ") else {
            return Some(whole);
        };
        let closing = self.find(end_line.saturating_add(9), "-----");
        Some(closing.map_or(whole, |c| c.saturating_add(5)))
    }

    /// The credential after `Bearer` or `Basic` (any case) at `i` and a
    /// space: its range.
    fn scheme(&self, i: usize) -> Option<Range<usize>> {
        let word = SCHEMES.iter().find(|s| self.starts_any_case(i, s))?;
        let after = i.saturating_add(word.len());
        let from = self.spaces(after);
        if from == after || from.saturating_sub(after) > FILLER_MAX {
            return None;
        }
        let end = self.run(from, in_value);
        (end > from).then_some(from..end)
    }

    /// The value joined by `:` or `=` at `j` to a credential's name: its
    /// range. A quoted value runs to its quote or the end of its line.
    fn named(&self, j: usize) -> Option<Range<usize>> {
        // Back over quotes and spaces, then the name.
        let mut at = j;
        let floor = j.saturating_sub(FILLER_MAX);
        while at > floor && b" \t\"'\\".contains(&self.at(at - 1)) {
            at -= 1;
        }
        let mut letters = [0u8; NAME_MAX];
        let mut n = 0;
        let floor = at.saturating_sub(NAME_LOOKBACK);
        while at > floor && n < NAME_MAX {
            let b = self.at(at - 1);
            if b.is_ascii_alphanumeric() {
                if let Some(slot) = letters.get_mut(NAME_MAX - 1 - n) {
                    *slot = b.to_ascii_lowercase();
                }
                n += 1;
            } else if !b"_-.".contains(&b) {
                break;
            }
            at -= 1;
        }
        let name = letters.get(NAME_MAX - n..)?;
        if !NAMES.iter().any(|w| name.ends_with(w.as_bytes())) {
            return None;
        }
        // Forward over spaces and an opening quote, escaped (`\"`) when the
        // text is JSON escaped twice or more.
        let from = j.saturating_add(1);
        let spaces = self.spaces(from);
        let slashes = self.run(spaces, |b| b == b'\\');
        let quote = Some(self.at(slashes)).filter(|q| b"\"'`".contains(q));
        let escaped = slashes > spaces && quote.is_some();
        let start = match quote {
            Some(_) => slashes.saturating_add(1),
            None => spaces,
        };
        if start.saturating_sub(from) > FILLER_MAX {
            return None;
        }
        let end = match quote {
            Some(q) => {
                let line = self.b.get(start..).unwrap_or_default();
                let len = line
                    .iter()
                    .take_while(|b| **b != q && !b"\n\r".contains(b) && !(escaped && **b == b'\\'))
                    .count();
                start.saturating_add(len)
            }
            None => self.run(start, in_value),
        };
        let value = self.b.get(start..end)?;
        // `Authorization: Bearer …`: the scheme's rule takes the credential.
        let scheme = SCHEMES
            .iter()
            .any(|s| value.eq_ignore_ascii_case(s.as_bytes()));
        (end > start && !scheme).then_some(start..end)
    }

    /// The end of the spaces and tabs from `i`, written out as escapes
    /// (`\t`, `\\n`) too.
    fn spaces(&self, mut i: usize) -> usize {
        loop {
            match self.at(i) {
                b' ' | b'\t' => i = i.saturating_add(1),
                b'\\' => {
                    let letter = self.run(i, |b| b == b'\\');
                    if !b"tnr".contains(&self.at(letter)) {
                        return i;
                    }
                    i = letter.saturating_add(1);
                }
                _ => return i,
            }
        }
    }

    /// An e-mail address around the `@` at `i`, not before `floor`.
    fn email(&self, i: usize, floor: usize) -> Option<Range<usize>> {
        let local = |b: u8| b.is_ascii_alphanumeric() || b"._%+-".contains(&b);
        let mut start = i;
        while start > floor && local(self.at(start - 1)) && !self.escaped(start - 1) {
            start -= 1;
        }
        let from = i.saturating_add(1);
        let mut end = self.run(from, |b| {
            b.is_ascii_alphanumeric() || b == b'.' || b == b'-'
        });
        while end > from && b".-".contains(&self.at(end - 1)) {
            end -= 1;
        }
        let domain = self.b.get(from..end)?;
        let dot = domain.iter().position(|b| *b == b'.')?;
        (start < i && dot > 0 && dot + 1 < domain.len()).then_some(start..end)
    }
}

/// Adds the ranges of `text` the built-in rules match to `hits` (in order,
/// apart).
///
/// A key, a JSON web token and a PEM block are taken whole and the scan goes
/// on after them. What a rule finds by its context (the credential after a
/// scheme or a name, an e-mail address around its `@`) is scanned again, so
/// a secret that starts inside it (`private_key: -----BEGIN …`) is still
/// found whole; each byte is read a bounded number of times.
pub(super) fn find(text: &str, hits: &mut Vec<Range<usize>>) {
    let s = Scan {
        t: text,
        b: text.as_bytes(),
    };
    let mut i = 0;
    // Where the last shape taken whole ended: an address does not reach
    // back into it.
    let mut done = 0;
    // A JWT's first part that is no JWT: none starts inside it either.
    let mut no_jwt_until = 0;
    // The end of the last named value: a name inside it is not read again
    // (`token:token:token…` would be read to its end at each `:`).
    let mut named_until = 0;
    while i < s.b.len() {
        let b = s.at(i);
        let context = match b {
            b'@' => s.email(i, done).map(|r| (r, i.saturating_add(1))),
            b':' | b'=' if i >= named_until => s.named(i).map(|r| {
                named_until = r.end;
                (r.clone(), r.start)
            }),
            b'b' | b'B' if s.starts_here(i) => s.scheme(i).map(|r| (r.clone(), r.start)),
            _ => None,
        };
        if let Some((r, next)) = context {
            super::add(hits, r);
            i = next;
            continue;
        }
        let whole = if (b != b'e' || i >= no_jwt_until) && s.starts_here(i) {
            let end = s.shape(i);
            if b == b'e' && end.is_none() {
                no_jwt_until = s.run(i, key_char);
            }
            end
        } else {
            None
        };
        match whole {
            Some(end) if end > i => {
                super::add(hits, i..end);
                i = end;
                done = end;
            }
            _ => i += 1,
        }
    }
}
