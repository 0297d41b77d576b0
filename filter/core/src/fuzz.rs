//! Shared pieces of the property tests of every parser: the case budget (a
//! fast one under `cargo test`, `PROPTEST_CASES` under `make fuzz`), and JSON
//! documents with a known meaning that can be spelled many ways, so a property
//! can say "every spelling reads the same" rather than only "no panic".

use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::host::{Random, SplitMix64};

/// The runner configuration of one property: `fast` cases unless
/// `PROPTEST_CASES` asks for more. Failures are reported, not persisted: a
/// case worth keeping becomes a named unit test.
pub(crate) fn config(fast: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(fast);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// A number by its exact value: `digits` × 10^`exp`, `digits` without leading
/// or trailing zeros (empty for zero).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Num {
    pub negative: bool,
    pub digits: String,
    pub exp: i64,
}

impl Num {
    /// The one spelling the canonical form must give.
    pub(crate) fn canonical(&self) -> String {
        if self.digits.is_empty() {
            return "0".into();
        }
        let sign = if self.negative { "-" } else { "" };
        match self.exp {
            0 => format!("{sign}{}", self.digits),
            e => format!("{sign}{}e{e}", self.digits),
        }
    }

    /// One of the many JSON spellings of the value, chosen by `rng`.
    fn spell(&self, rng: &mut SplitMix64) -> String {
        let mut out = String::new();
        if self.digits.is_empty() {
            // Zero: any sign, any fraction of zeros, any exponent.
            if pick(rng, 3) == 0 {
                out.push('-');
            }
            out.push('0');
            if pick(rng, 2) == 0 {
                out.push('.');
                out.push_str(&"0".repeat(1 + pick(rng, 3) as usize));
            }
            if pick(rng, 2) == 0 {
                let e = pick(rng, 40) as i64 - 20;
                exponent(rng, e, &mut out);
            }
            return out;
        }
        if self.negative {
            out.push('-');
        }
        let pad = pick(rng, 4) as usize;
        let digits = format!("{}{}", self.digits, "0".repeat(pad));
        let mut exp = self.exp - pad as i64;
        // Digits before the point: none (`0.`), some, or all.
        let int_len = pick(rng, digits.len() as u64 + 1) as usize;
        let (int, frac) = digits.split_at(int_len);
        let frac = if int.is_empty() {
            out.push('0');
            format!("{}{frac}", "0".repeat(pick(rng, 3) as usize))
        } else {
            out.push_str(int);
            frac.to_string()
        };
        exp += frac.len() as i64;
        if !frac.is_empty() {
            out.push('.');
            out.push_str(&frac);
        }
        if exp != 0 || pick(rng, 4) == 0 {
            exponent(rng, exp, &mut out);
        }
        out
    }
}

fn exponent(rng: &mut SplitMix64, exp: i64, out: &mut String) {
    out.push(if pick(rng, 2) == 0 { 'e' } else { 'E' });
    if exp < 0 {
        out.push('-');
    } else if pick(rng, 2) == 0 {
        out.push('+');
    }
    out.push_str(&"0".repeat(pick(rng, 3) as usize));
    out.push_str(&exp.unsigned_abs().to_string());
}

/// A JSON document by its meaning.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Doc {
    Null,
    Bool(bool),
    Num(Num),
    Str(String),
    Arr(Vec<Doc>),
    /// Members in order; keys may repeat only where a strategy says so.
    Obj(Vec<(String, Doc)>),
}

impl Doc {
    /// The canonical form [`crate::json::Json::write`] must give, written
    /// independently of it.
    pub(crate) fn canonical(&self) -> String {
        let mut out = String::new();
        self.canonical_into(&mut out);
        out
    }

    fn canonical_into(&self, out: &mut String) {
        match self {
            Doc::Null => out.push_str("null"),
            Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Doc::Num(n) => out.push_str(&n.canonical()),
            Doc::Str(s) => canonical_string(s, out),
            Doc::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.canonical_into(out);
                }
                out.push(']');
            }
            Doc::Obj(members) => {
                let mut sorted: Vec<_> = members.iter().collect();
                sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                out.push('{');
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical_string(k, out);
                    out.push(':');
                    v.canonical_into(out);
                }
                out.push('}');
            }
        }
    }

    /// One spelling of the document chosen by `seed`: whitespace, member
    /// order (where keys are unique), number spelling and string escapes all
    /// vary; the meaning does not.
    pub(crate) fn spell(&self, seed: u64) -> String {
        let mut rng = SplitMix64::new(seed);
        let mut out = String::new();
        self.spell_into(&mut rng, &mut out);
        ws(&mut rng, &mut out);
        out
    }

    fn spell_into(&self, rng: &mut SplitMix64, out: &mut String) {
        ws(rng, out);
        match self {
            Doc::Null => out.push_str("null"),
            Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Doc::Num(n) => out.push_str(&n.spell(rng)),
            Doc::Str(s) => spell_string(s, rng, out),
            Doc::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        ws(rng, out);
                        out.push(',');
                    }
                    item.spell_into(rng, out);
                    ws(rng, out);
                }
                if items.is_empty() {
                    ws(rng, out);
                }
                out.push(']');
            }
            Doc::Obj(members) => {
                let mut order: Vec<&(String, Doc)> = members.iter().collect();
                let unique = {
                    let mut keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
                    keys.sort_unstable();
                    keys.windows(2).all(|w| w[0] != w[1])
                };
                if unique {
                    // Fisher–Yates: any order means the same object.
                    for i in (1..order.len()).rev() {
                        let j = pick(rng, i as u64 + 1) as usize;
                        order.swap(i, j);
                    }
                }
                out.push('{');
                for (i, (k, v)) in order.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    ws(rng, out);
                    spell_string(k, rng, out);
                    ws(rng, out);
                    out.push(':');
                    v.spell_into(rng, out);
                    ws(rng, out);
                }
                if members.is_empty() {
                    ws(rng, out);
                }
                out.push('}');
            }
        }
    }
}

fn pick(rng: &mut SplitMix64, n: u64) -> u64 {
    rng.next_u64() % n.max(1)
}

fn ws(rng: &mut SplitMix64, out: &mut String) {
    for _ in 0..pick(rng, 4).saturating_sub(1) {
        out.push([' ', '\t', '\n', '\r'][pick(rng, 4) as usize]);
    }
}

fn canonical_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn spell_string(s: &str, rng: &mut SplitMix64, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must = matches!(c, '"' | '\\') || (c as u32) < 0x20;
        match pick(rng, 3) {
            0 if !must => out.push(c),
            1 => match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '/' => out.push_str("\\/"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c => unicode_escape(c, rng, out),
            },
            _ => unicode_escape(c, rng, out),
        }
    }
    out.push('"');
}

fn unicode_escape(c: char, rng: &mut SplitMix64, out: &mut String) {
    let mut units = [0u16; 2];
    for u in c.encode_utf16(&mut units) {
        if pick(rng, 2) == 0 {
            out.push_str(&format!("\\u{:04x}", u));
        } else {
            out.push_str(&format!("\\u{:04X}", u));
        }
    }
}

/// Characters that stress a JSON string: escapes, controls, NUL, the slash,
/// non-ASCII in every UTF-8 length, line separators; and any other char.
pub(crate) fn text() -> impl Strategy<Value = String> {
    let special = prop::sample::select(vec![
        '"', '\\', '/', '\n', '\r', '\t', '\u{0}', '\u{8}', '\u{c}', '\u{1f}', '\u{7f}', 'é', '€',
        '😀', '\u{2028}', '\u{feff}', ' ', 'a', 'Z', '0',
    ]);
    prop::collection::vec(prop_oneof![3 => special, 1 => any::<char>()], 0..10)
        .prop_map(|cs| cs.into_iter().collect())
}

/// Keys from a small alphabet, so objects often share them.
pub(crate) fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[abm]{0,2}", 1 => text()]
}

/// Numbers by value: zero, small integers, long digit strings past `f64`,
/// fractions and huge or tiny exponents.
pub(crate) fn num() -> impl Strategy<Value = Num> {
    (
        any::<bool>(),
        "[1-9]([0-9]{0,30}[1-9])?",
        -400i64..400,
        0..4u8,
    )
        .prop_map(|(negative, digits, exp, kind)| match kind {
            0 => Num {
                negative: false,
                digits: String::new(),
                exp: 0,
            },
            1 => Num {
                negative,
                digits: digits.chars().take(3).collect::<String>(),
                exp: 0,
            },
            _ => Num {
                negative,
                digits,
                exp,
            },
        })
        .prop_map(|mut n| {
            // `take(3)` may leave trailing zeros: move them into the exponent.
            while n.digits.ends_with('0') {
                n.digits.pop();
                n.exp += 1;
            }
            n
        })
}

/// Any document up to a small depth; object keys unique when `unique`.
pub(crate) fn doc(unique: bool) -> impl Strategy<Value = Doc> {
    let leaf = prop_oneof![
        Just(Doc::Null),
        any::<bool>().prop_map(Doc::Bool),
        num().prop_map(Doc::Num),
        text().prop_map(Doc::Str),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Doc::Arr),
            prop::collection::vec((key(), inner), 0..6).prop_map(move |mut m| {
                if unique {
                    let mut seen = std::collections::HashSet::new();
                    m.retain(|(k, _)| seen.insert(k.clone()));
                }
                Doc::Obj(m)
            }),
        ]
    })
}

/// A document broken in a few random places: bytes inserted, removed or
/// replaced. Mostly-valid input reaches deeper into a parser than noise.
pub(crate) fn mutated(doc: &Doc, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut bytes = doc.spell(seed).into_bytes();
    const NOISE: &[u8] = b"{}[]\",:\\u0-+.eE \n\x00\xff\xc3\xa9\xed\xa0\x80truefalsenull9";
    for _ in 0..=pick(&mut rng, 3) {
        let at = pick(&mut rng, bytes.len() as u64 + 1) as usize;
        let b = NOISE[pick(&mut rng, NOISE.len() as u64) as usize];
        match pick(&mut rng, 3) {
            0 => bytes.insert(at, b),
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ if at < bytes.len() => bytes[at] = b,
            _ => bytes.push(b),
        }
    }
    bytes
}
