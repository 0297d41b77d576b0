//! The secrets, found by their own shape wherever they start, not as whole
//! words, so a key joined to its name (`api_key:sk-…`) or after an escape
//! (`\nsk-…` in JSON inside a string) is found as well.

use std::ops::Range;

use super::detector::DetectorId as D;
use super::scan::Scan;

/// Characters after a key's prefix for it to be a key (`sk-` alone is a word).
const KEY_MIN_TAIL: usize = 8;
/// Characters of an AWS access key id after `AKIA` or `ASIA`.
const AWS_TAIL: usize = 16;
/// Prefixes of API keys and tokens, and whose they are (an `sk-` key is
/// Anthropic's when it goes on with `ant-`); Slack's `xox?-` apart
/// ([`Scan::key`]).
const KEY_PREFIXES: [(&str, D); 17] = [
    ("sk-", D::OpenaiKey),
    ("sk_", D::StripeKey),
    ("pk_live_", D::StripeKey),
    ("rk_live_", D::StripeKey),
    ("ghp_", D::GithubToken),
    ("gho_", D::GithubToken),
    ("ghs_", D::GithubToken),
    ("ghu_", D::GithubToken),
    ("ghr_", D::GithubToken),
    ("github_pat_", D::GithubToken),
    ("glpat-", D::GitlabToken),
    ("xapp-", D::SlackToken),
    ("hf_", D::HuggingfaceToken),
    ("AIza", D::GoogleApiKey),
    ("ya29.", D::GoogleOauthToken),
    ("AKIA", D::AwsAccessKeyId),
    ("ASIA", D::AwsAccessKeyId),
];
/// The words before a credential, any case.
const SCHEMES: [(&str, D); 2] = [("bearer", D::BearerToken), ("basic", D::BasicAuth)];
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
/// Names that end as one of [`NAMES`] does and name no credential: a .NET
/// assembly's `PublicKeyToken`, a digest of its public key.
const NOT_NAMES: [&str; 1] = ["publickeytoken"];
/// The longest of [`NAMES`] and [`NOT_NAMES`].
const NAME_MAX: usize = 14;
/// Bytes looked back over for a name before `:` or `=`.
const NAME_LOOKBACK: usize = 64;
/// Quotes and spaces between a name, its `:` or `=`, and its value.
const FILLER_MAX: usize = 8;
/// Words prose puts after `Bearer` or `Basic` (`a Bearer token`, `Basic
/// authentication`), any case, a `.`, `?`, `!` or `:` after them: no
/// credential.
const PROSE: [&str; 7] = [
    "auth",
    "authentication",
    "authorization",
    "token",
    "tokens",
    "credentials",
    "scheme",
];
/// Bytes of a PEM block's label (`RSA PRIVATE KEY`).
const PEM_LABEL_MAX: usize = 64;

/// A character of a key after its prefix, and of a JWT's parts.
pub(super) fn key_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// A character of a credential written after a scheme or a name.
fn in_value(b: u8) -> bool {
    !b.is_ascii_whitespace() && !b"\"'`,;&<>()[]{}|\\".contains(&b)
}

fn upper_or_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

impl Scan<'_> {
    /// A secret taken whole that starts at `i`: its detector and end.
    pub(super) fn secret(&self, i: usize) -> Option<(D, usize)> {
        match self.at(i) {
            b'-' => self.pem(i).map(|end| (D::PrivateKey, end)),
            b'e' => self.jwt(i).map(|end| (D::Jwt, end)),
            _ => self.key(i),
        }
    }

    /// An API key by its prefix.
    fn key(&self, i: usize) -> Option<(D, usize)> {
        // The first bytes of the prefixes.
        if !b"sprgxhAy".contains(&self.at(i)) {
            return None;
        }
        // Slack: `xox` and a letter (`xoxb-`, `xoxp-`, `xoxe-`…).
        let slack =
            self.starts(i, "xox") && self.at(i + 3).is_ascii_lowercase() && self.at(i + 4) == b'-';
        let (prefix, id) = match slack {
            true => (5, D::SlackToken),
            false => KEY_PREFIXES
                .iter()
                .find(|(p, _)| self.starts(i, p))
                .map(|(p, id)| (p.len(), *id))?,
        };
        let id = match id {
            D::OpenaiKey if self.starts(i, "sk-ant-") => D::AnthropicKey,
            id => id,
        };
        let from = i.saturating_add(prefix);
        let (end, tail) = match id {
            D::AwsAccessKeyId => (self.run(from, upper_or_digit), AWS_TAIL),
            _ => (self.run(from, key_char), KEY_MIN_TAIL),
        };
        (end.saturating_sub(from) >= tail).then_some((id, end))
    }

    /// A JSON web token: `eyJ…`, a dot, a payload, a dot, a signature
    /// (empty for `alg: none`).
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
        if end.saturating_sub(label) > PEM_LABEL_MAX || !self.starts(end, "-----") {
            return None;
        }
        let name = self.b.get(label..end)?;
        if !name.windows(11).any(|w| w == b"PRIVATE KEY") {
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
    /// space: its detector and range.
    pub(super) fn scheme(&self, i: usize) -> Option<(D, Range<usize>)> {
        let (word, id) = SCHEMES.iter().find(|(s, _)| self.starts_any_case(i, s))?;
        let after = i.saturating_add(word.len());
        let from = self.spaces(after);
        if from == after || from.saturating_sub(after) > FILLER_MAX {
            return None;
        }
        let end = self.run(from, in_value);
        let value = self.b.get(from..end)?;
        let word = value
            .strip_suffix(b".")
            .or_else(|| value.strip_suffix(b"?"))
            .or_else(|| value.strip_suffix(b"!"))
            .or_else(|| value.strip_suffix(b":"))
            .unwrap_or(value);
        let prose = PROSE
            .iter()
            .any(|w| word.eq_ignore_ascii_case(w.as_bytes()));
        (end > from && !prose).then_some((*id, from..end))
    }

    /// The value joined by `:` or `=` at `j` to a credential's name: its
    /// range. A quoted value runs to its quote or the end of its line.
    pub(super) fn named(&self, j: usize) -> Option<Range<usize>> {
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
        let ends = |w: &&str| name.ends_with(w.as_bytes());
        if !NAMES.iter().any(ends) || NOT_NAMES.iter().any(ends) {
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
                self.step(len.saturating_add(1));
                start.saturating_add(len)
            }
            None => self.run(start, in_value),
        };
        let value = self.b.get(start..end)?;
        // `Authorization: Bearer …`: the scheme's detector takes the credential.
        let scheme = SCHEMES
            .iter()
            .any(|(s, _)| value.eq_ignore_ascii_case(s.as_bytes()));
        (end > start && !scheme).then_some(start..end)
    }

    /// The end of the spaces and tabs from `i`, written out as escapes
    /// (`\t`, `\\n`) too.
    fn spaces(&self, mut i: usize) -> usize {
        loop {
            self.step(1);
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
}
