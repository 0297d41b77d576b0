//! The held request body, parsed once into a tree every concern reads
//! (routing features, the cache key), with a canonical form for the cache key:
//! two bodies that mean the same request (key order, whitespace, `1` vs `1.0`,
//! `\u0041` vs `A`) give the same bytes. serde_json cannot do this exactly (it
//! rounds big numbers to `f64`), so this is a small strict parser of its own.
//! The same parse records where each top-level member sits in the bytes, so
//! edits splice only their own bytes ([`document`]). An answer the filter
//! pulls and a webhook posted to it are never made a tree: they are read with
//! bounds that hold while they are read ([`bounded`]).

use std::ops::Range;

pub mod bounded;
pub mod document;

pub use document::Document;

/// A parsed JSON value with numbers and strings already in canonical form.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// The canonical spelling of the number: `1`, `1.0` and `10e-1` are all
    /// `1`, and big numbers stay exact.
    Number(String),
    /// The decoded string.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// Members in document order; duplicates are kept.
    Object(Vec<(String, Json)>),
}

/// Deeper documents are refused: recursion is bounded so a hostile body
/// cannot exhaust the wasm stack. serde_json uses the same limit.
pub const MAX_DEPTH: usize = 128;

impl Json {
    /// Parses a complete JSON document, `None` when it is not strict JSON
    /// (invalid UTF-8, lone surrogates, trailing bytes, too deep).
    pub fn parse(bytes: &[u8]) -> Option<Json> {
        Parser::run(bytes, false).map(|(v, _)| v)
    }

    /// Parses a complete JSON document like [`Json::parse`], recording where
    /// each top-level member of an object sits (none for any other value).
    pub fn parse_with_spans(bytes: &[u8]) -> Option<(Json, Vec<Span>)> {
        Parser::run(bytes, true)
    }

    /// The member `name` of an object (the last one when repeated, as most
    /// JSON readers do).
    pub fn get(&self, name: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The member `name` of an object, to change (the last one when
    /// repeated, as [`Json::get`] reads it).
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Json> {
        match self {
            Json::Object(members) => members
                .iter_mut()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// Writes the canonical form: object members sorted by key bytes (stable,
    /// so repeated keys keep their order), no whitespace, canonical numbers and
    /// strings.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(true) => out.extend_from_slice(b"true"),
            Json::Bool(false) => out.extend_from_slice(b"false"),
            Json::Number(n) => out.extend_from_slice(n.as_bytes()),
            Json::String(s) => write_string(s, out),
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Json::Object(members) => write_object(members.iter().collect(), out),
        }
    }

    /// Writes the canonical form of an object without its members named in
    /// `skip`; nothing for any other value.
    pub fn write_without(&self, skip: &[&str], out: &mut Vec<u8>) {
        if let Json::Object(members) = self {
            let kept = members
                .iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .collect();
            write_object(kept, out);
        }
    }

    /// The values of every member `name` of an object, repeats included.
    pub fn members<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Json> + 'a {
        let all: &[(String, Json)] = match self {
            Json::Object(m) => m,
            _ => &[],
        };
        all.iter().filter(move |(k, _)| k == name).map(|(_, v)| v)
    }

    /// True when some object inside this value (itself included) names a key
    /// twice. Readers resolve repeats differently (the first wins, the last
    /// wins, or the request is refused), so such a body means different things
    /// to different readers.
    pub fn repeats_a_key(&self) -> bool {
        self.repeated_key().is_some()
    }

    /// The path (`a.b[2].c`) of the first key in document order that its
    /// object names twice, inside this value or itself; `None` when no
    /// object repeats one.
    pub fn repeated_key(&self) -> Option<String> {
        let within = |outer: &str, inner: String| match inner.starts_with('[') {
            true => format!("{outer}{inner}"),
            false => format!("{outer}.{inner}"),
        };
        match self {
            Json::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
                item.repeated_key()
                    .map(|inner| within(&format!("[{i}]"), inner))
            }),
            Json::Object(members) => {
                // The keys written more than once, sorted, then where the
                // first repeat stands in the document.
                let mut keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
                keys.sort_unstable();
                let mut repeated: Vec<&str> = keys
                    .windows(2)
                    .filter_map(|w| match w {
                        [a, b] if a == b => Some(*a),
                        _ => None,
                    })
                    .collect();
                repeated.dedup();
                let mut seen = vec![false; repeated.len()];
                let repeat = members.iter().position(|(k, _)| {
                    repeated
                        .binary_search(&k.as_str())
                        .is_ok_and(|i| seen.get_mut(i).is_some_and(|s| std::mem::replace(s, true)))
                });
                let before = repeat.unwrap_or(members.len());
                members
                    .iter()
                    .take(before)
                    .find_map(|(k, v)| v.repeated_key().map(|inner| within(k, inner)))
                    .or_else(|| repeat.and_then(|i| members.get(i)).map(|(k, _)| k.clone()))
            }
            _ => None,
        }
    }

    /// True when `f` holds for some string value (not key) inside this value.
    pub fn any_string<'a>(&'a self, f: &mut dyn FnMut(&'a str) -> bool) -> bool {
        match self {
            Json::String(s) => f(s),
            Json::Array(items) => items.iter().any(|i| i.any_string(f)),
            Json::Object(members) => members.iter().any(|(_, v)| v.any_string(f)),
            _ => false,
        }
    }
}

/// Members sorted by key bytes (stable, so repeated keys keep their order).
fn write_object(mut members: Vec<&(String, Json)>, out: &mut Vec<u8>) {
    members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push(b'{');
    for (i, (k, v)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(k, out);
        out.push(b':');
        v.write(out);
    }
    out.push(b'}');
}

/// Escapes only what JSON requires, one way each, so equal strings always
/// give equal bytes.
fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{08}' => out.extend_from_slice(b"\\b"),
            '\u{0c}' => out.extend_from_slice(b"\\f"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Where one top-level member of an object document sits in its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The decoded key.
    pub name: String,
    /// The key's bytes, quotes included.
    pub key: Range<usize>,
    /// The value's bytes.
    pub value: Range<usize>,
    /// The bytes of each item, when the value is an array (`None` for any
    /// other value, or once an edit replaced it).
    pub items: Option<Vec<Range<usize>>>,
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    /// The top-level members' spans, when recorded.
    spans: Option<Vec<Span>>,
    /// The items of the last array read at depth 1 (a top-level member's value).
    items: Vec<Range<usize>>,
}

impl<'a> Parser<'a> {
    fn run(bytes: &'a [u8], spans: bool) -> Option<(Json, Vec<Span>)> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut p = Parser {
            s: text.as_bytes(),
            text,
            pos: 0,
            spans: spans.then(Vec::new),
            items: Vec::new(),
        };
        let v = p.value(0)?;
        p.ws();
        (p.pos == p.s.len()).then(|| (v, p.spans.unwrap_or_default()))
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &[u8], v: Json) -> Option<Json> {
        let end = self.pos.checked_add(word.len())?;
        (self.s.get(self.pos..end)? == word).then(|| {
            self.pos = end;
            v
        })
    }

    fn value(&mut self, depth: usize) -> Option<Json> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match self.peek()? {
            b'n' => self.literal(b"null", Json::Null),
            b't' => self.literal(b"true", Json::Bool(true)),
            b'f' => self.literal(b"false", Json::Bool(false)),
            b'"' => self.string().map(Json::String),
            b'[' => self.array(depth),
            b'{' => self.object(depth),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An array at the cursor (`[`); the items of one at depth 1 (a
    /// top-level member's value) are recorded when spans are.
    fn array(&mut self, depth: usize) -> Option<Json> {
        self.pos += 1;
        let mut items = Vec::new();
        let record = depth == 1 && self.spans.is_some();
        if record {
            self.items.clear();
        }
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Some(Json::Array(items));
        }
        loop {
            self.ws();
            let start = self.pos;
            items.push(self.value(depth + 1)?);
            if record {
                self.items.push(start..self.pos);
            }
            self.ws();
            match self.bump()? {
                b',' => continue,
                b']' => return Some(Json::Array(items)),
                _ => return None,
            }
        }
    }

    /// An object at the cursor (`{`); the members of the top-level one are
    /// recorded when spans are.
    fn object(&mut self, depth: usize) -> Option<Json> {
        self.pos += 1;
        let mut members = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Some(Json::Object(members));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return None;
            }
            let key_start = self.pos;
            let k = self.string()?;
            let key = key_start..self.pos;
            self.ws();
            if self.bump()? != b':' {
                return None;
            }
            self.ws();
            let value_start = self.pos;
            let v = self.value(depth + 1)?;
            if depth == 0 {
                if let Some(spans) = self.spans.as_mut() {
                    let items =
                        matches!(v, Json::Array(_)).then(|| std::mem::take(&mut self.items));
                    spans.push(Span {
                        name: k.clone(),
                        key,
                        value: value_start..self.pos,
                        items,
                    });
                }
            }
            members.push((k, v));
            self.ws();
            match self.bump()? {
                b',' => continue,
                b'}' => return Some(Json::Object(members)),
                _ => return None,
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Option<Json> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let int_start = self.pos;
        let int_len = self.digits();
        // JSON forbids leading zeros (`01`) and an empty integer part.
        if int_len == 0 || (int_len > 1 && self.s.get(int_start) == Some(&b'0')) {
            return None;
        }
        let int = self.text.get(int_start..self.pos)?;
        let mut frac = "";
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let f_start = self.pos;
            if self.digits() == 0 {
                return None;
            }
            frac = self.text.get(f_start..self.pos)?;
        }
        let mut exp: Option<(bool, &str)> = None;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            let exp_negative = match self.peek() {
                Some(b'-') => {
                    self.pos += 1;
                    true
                }
                Some(b'+') => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let e_start = self.pos;
            if self.digits() == 0 {
                return None;
            }
            exp = Some((exp_negative, self.text.get(e_start..self.pos)?));
        }
        let literal = self.text.get(start..self.pos)?;
        Some(Json::Number(
            canonical_number(negative, int, frac, exp).unwrap_or_else(
                // An exponent too large to add up: the literal itself is still an
                // exact spelling of its value, so equal literals keep equal keys.
                || literal.to_string(),
            ),
        ))
    }

    fn hex4(&mut self) -> Option<u32> {
        let end = self.pos.checked_add(4)?;
        let hex = self.text.get(self.pos..end)?;
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.pos = end;
        u32::from_str_radix(hex, 16).ok()
    }

    fn string(&mut self) -> Option<String> {
        // Caller saw the opening quote.
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Stops only at ASCII bytes, so the run ends on a char boundary.
            out.push_str(self.text.get(run_start..self.pos)?);
            match self.bump()? {
                b'"' => return Some(out),
                b'\\' => {
                    let c = match self.bump()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{08}',
                        b'f' => '\u{0c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if self.bump()? != b'\\' || self.bump()? != b'u' {
                                    return None;
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return None;
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            // Lone low surrogates land here and are refused.
                            char::from_u32(code)?
                        }
                        _ => return None,
                    };
                    out.push(c);
                }
                // A raw control character inside a string.
                _ => return None,
            }
        }
    }
}

/// Exponent literals longer than this are not added up (see `number`).
const MAX_EXP_DIGITS: usize = 15;

/// The one spelling of a number's exact value: `0`, or an optional `-`, the
/// significant digits without leading or trailing zeros, and `e<exp>` when the
/// exponent is not zero. So `1`, `1.0`, `10e-1` and `0.1E1` all give `1`, and
/// `12345678901234567890123` stays exact. `None` when the exponent is too
/// large to add up.
fn canonical_number(
    negative: bool,
    int: &str,
    frac: &str,
    exp: Option<(bool, &str)>,
) -> Option<String> {
    let mut e: i64 = 0;
    if let Some((exp_negative, digits)) = exp {
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_EXP_DIGITS {
            return None;
        }
        let v: i64 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        e = if exp_negative { -v } else { v };
    }
    e = e.checked_sub(i64::try_from(frac.len()).ok()?)?;
    let all = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    if significant.is_empty() {
        // -0, 0.0, 0e5: all zero.
        return Some("0".to_string());
    }
    e = e.checked_add(i64::try_from(trimmed.len() - significant.len()).ok()?)?;
    let mut out = String::with_capacity(significant.len() + 8);
    if negative {
        out.push('-');
    }
    out.push_str(significant);
    if e != 0 {
        out.push('e');
        out.push_str(&e.to_string());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_is_named_by_its_path() {
        let path = |doc: &str| Json::parse(doc.as_bytes()).and_then(|j| j.repeated_key());
        assert_eq!(path(r#"{"a":1,"b":{"c":[1,{"d":2}]}}"#), None);
        assert_eq!(path(r#"{"a":1,"a":1}"#).as_deref(), Some("a"));
        assert_eq!(path(r#"{"a":{"b":1,"c":2,"b":3}}"#).as_deref(), Some("a.b"));
        assert_eq!(
            path(r#"{"m":{"x":[{"k":1},{"c":"a","c":"b"}]}}"#).as_deref(),
            Some("m.x[1].c")
        );
        assert_eq!(path(r#"[0,{"k":1,"k":2}]"#).as_deref(), Some("[1].k"));
        // The first in document order: inside a member before the repeat,
        // else the repeat, before anything after it.
        assert_eq!(
            path(r#"{"a":{"x":1,"x":2},"b":1,"b":2}"#).as_deref(),
            Some("a.x")
        );
        assert_eq!(
            path(r#"{"b":1,"b":2,"a":{"x":1,"x":2}}"#).as_deref(),
            Some("b")
        );
        assert_eq!(path(r#"{"z":1,"y":2,"z":3,"y":4}"#).as_deref(), Some("z"));
        // Same key in different objects is no repeat.
        assert_eq!(path(r#"{"a":{"k":1},"b":{"k":1}}"#), None);
        assert!(Json::parse(br#"{"a":{"k":1,"k":1}}"#).is_some_and(|j| j.repeats_a_key()));
    }

    fn canon(s: &str) -> String {
        let mut out = Vec::new();
        Json::parse(s.as_bytes()).unwrap().write(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn numbers_have_one_spelling() {
        for (a, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("0.0", "0"),
            ("0e0", "0"),
            ("0E-7", "0"),
            ("1", "1"),
            ("1.0", "1"),
            ("10e-1", "1"),
            ("0.1E1", "1"),
            ("1e+0", "1"),
            ("100", "1e2"),
            ("1e2", "1e2"),
            ("0.5", "5e-1"),
            ("5E-1", "5e-1"),
            ("-2.50", "-25e-1"),
            ("12345678901234567890123", "12345678901234567890123"),
            ("1.7976931348623157e309", "17976931348623157e293"),
            ("1e0000000000000000000001", "1e1"),
        ] {
            assert_eq!(canon(a), want, "{a}");
        }
        // Distinct values keep distinct spellings even past f64 precision.
        assert_ne!(canon("9007199254740993"), canon("9007199254740992"));
        // Exponents too large to add are kept verbatim.
        assert_eq!(canon("1e99999999999999999999"), "1e99999999999999999999");
    }

    #[test]
    fn strings_have_one_spelling() {
        assert_eq!(canon(r#""\u0041\/\u00e9\ud83d\ude00""#), "\"A/é😀\"");
        assert_eq!(canon("\"é😀\""), "\"é😀\"");
        assert_eq!(
            canon(r#""\u0001\b\f\n\r\t\"\\""#),
            r#""\u0001\b\f\n\r\t\"\\""#
        );
    }

    #[test]
    fn objects_are_sorted_and_whitespace_dropped() {
        assert_eq!(
            canon(" { \"b\" : [ 1 , {\"z\":null,\"a\":true} ] ,\n\"a\":false } "),
            r#"{"a":false,"b":[1,{"a":true,"z":null}]}"#
        );
        // Repeated keys keep their order, so distinct bodies stay distinct.
        assert_eq!(canon(r#"{"a":1,"a":2}"#), r#"{"a":1,"a":2}"#);
        assert_ne!(canon(r#"{"a":1,"a":2}"#), canon(r#"{"a":2,"a":1}"#));
        assert_eq!(
            Json::parse(br#"{"a":1,"a":2}"#).unwrap().get("a"),
            Some(&Json::Number("2".into()))
        );
    }

    #[test]
    fn refuses_what_is_not_strict_json() {
        for bad in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "1e",
            "-",
            "+1",
            "NaN",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"\\x\"",
            "\"a\nb\"",
            "{\"a\" 1}",
            "{1:2}",
            "[1] x",
            "tru",
            "\"\\u12\"",
            "nul",
        ] {
            assert!(Json::parse(bad.as_bytes()).is_none(), "{bad:?}");
        }
        assert!(Json::parse(&[b'"', 0xff, b'"']).is_none());
        let deep = "[".repeat(MAX_DEPTH + 2) + &"]".repeat(MAX_DEPTH + 2);
        assert!(Json::parse(deep.as_bytes()).is_none());
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(Json::parse(ok.as_bytes()).is_some());
    }

    #[test]
    fn canonical_form_is_a_fixed_point() {
        let doc = r#"{"model":"m","x":[1.50,-0,"\u00e9"],"t":2E3,"n":{"b":null,"a":[]}}"#;
        let once = canon(doc);
        assert_eq!(canon(&once), once);
        // And still JSON serde reads the same way.
        let a: serde_json::Value = serde_json::from_str(doc).unwrap();
        let b: serde_json::Value = serde_json::from_str(&once).unwrap();
        assert_eq!(a["model"], b["model"]);
        assert_eq!(a["x"][2], b["x"][2]);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;
    use crate::fuzz::{self, Doc};

    fn canon(bytes: &[u8]) -> Option<String> {
        let mut out = Vec::new();
        Json::parse(bytes)?.write(&mut out);
        Some(String::from_utf8(out).unwrap())
    }

    /// Same meaning as serde_json's reading, numbers compared as `f64`
    /// (serde_json rounds them; the last of repeated keys wins there).
    fn same(ours: &Json, theirs: &Value) -> bool {
        match (ours, theirs) {
            (Json::Null, Value::Null) => true,
            (Json::Bool(a), Value::Bool(b)) => a == b,
            (Json::Number(a), Value::Number(b)) => {
                let (a, b) = (a.parse::<f64>().unwrap(), b.as_f64().unwrap());
                a == b || (a - b).abs() <= a.abs().max(b.abs()) * 1e-15
            }
            (Json::String(a), Value::String(b)) => a == b,
            (Json::Array(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
            }
            (Json::Object(a), Value::Object(b)) => {
                let mut keys: Vec<&str> = a.iter().map(|(k, _)| k.as_str()).collect();
                keys.sort_unstable();
                keys.dedup();
                keys.len() == b.len()
                    && keys.iter().all(|k| {
                        let last = ours.get(k).unwrap();
                        b.get(*k).is_some_and(|v| same(last, v))
                    })
            }
            _ => false,
        }
    }

    /// The path of the first repeated key, reading the members of each
    /// object in order: the reference `Json::repeated_key` is held to.
    fn first_repeat(v: &Json) -> Option<String> {
        let join = |outer: String, inner: String| match inner.starts_with('[') {
            true => outer + &inner,
            false => outer + "." + &inner,
        };
        match v {
            Json::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, x)| first_repeat(x).map(|p| join(format!("[{i}]"), p))),
            Json::Object(m) => {
                let mut seen: Vec<&str> = Vec::new();
                for (k, x) in m {
                    if seen.contains(&k.as_str()) {
                        return Some(k.clone());
                    }
                    seen.push(k);
                    if let Some(p) = first_repeat(x) {
                        return Some(join(k.clone(), p));
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// A number serde_json refuses: beyond `f64`.
    fn huge(v: &Json) -> bool {
        match v {
            Json::Number(n) => n.parse::<f64>().map_or(true, f64::is_infinite),
            Json::Array(items) => items.iter().any(huge),
            Json::Object(m) => m.iter().any(|(_, v)| huge(v)),
            _ => false,
        }
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// Whitespace, member order, number spelling and string escapes never
        /// change the canonical form, and it is the one written independently.
        #[test]
        fn every_spelling_gives_the_one_canonical_form(doc in fuzz::doc(true), a: u64, b: u64) {
            let want = doc.canonical();
            prop_assert_eq!(canon(doc.spell(a).as_bytes()), Some(want.clone()));
            prop_assert_eq!(canon(doc.spell(b).as_bytes()), Some(want));
        }

        /// The canonical form reads back as itself, repeated keys included.
        #[test]
        fn canonical_form_is_idempotent(doc in fuzz::doc(false), seed: u64) {
            for bytes in [doc.spell(seed).into_bytes(), fuzz::mutated(&doc, seed)] {
                if let Some(once) = canon(&bytes) {
                    prop_assert_eq!(canon(once.as_bytes()), Some(once));
                }
            }
        }

        /// Strict where serde_json is strict, reading the same values, on
        /// valid and broken documents alike; only numbers beyond `f64` are
        /// ours alone (kept exact, where serde_json gives up).
        #[test]
        fn agrees_with_serde_json(doc in fuzz::doc(false), seed: u64) {
            let bytes = fuzz::mutated(&doc, seed);
            let ours = Json::parse(&bytes);
            let theirs = serde_json::from_slice::<Value>(&bytes).ok();
            match (&ours, &theirs) {
                (Some(o), Some(t)) => prop_assert!(same(o, t), "{:?} vs {:?}", o, t),
                (Some(o), None) => prop_assert!(huge(o), "only ours read {:?}", String::from_utf8_lossy(&bytes)),
                (None, Some(_)) => prop_assert!(false, "only serde_json read {:?}", String::from_utf8_lossy(&bytes)),
                (None, None) => {}
            }
        }

        /// Every spelling of a number gives its one canonical spelling, which
        /// rounds to the same `f64` as the literal (the value is kept exact).
        #[test]
        fn numbers_keep_their_exact_value(n in fuzz::num(), seed: u64) {
            let literal = Doc::Num(n.clone()).spell(seed);
            let c = canon(literal.as_bytes()).unwrap();
            prop_assert_eq!(&c, &n.canonical());
            prop_assert_eq!(literal.trim().parse::<f64>().unwrap(), c.parse::<f64>().unwrap());
        }

        /// The repeated key named is the first the text shows, by its path.
        #[test]
        fn the_repeated_key_named_is_the_first_in_the_text(doc in fuzz::doc(false), seed: u64) {
            let tree = Json::parse(doc.spell(seed).as_bytes()).unwrap();
            let want = first_repeat(&tree);
            prop_assert_eq!(tree.repeats_a_key(), want.is_some());
            prop_assert_eq!(tree.repeated_key(), want);
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn any_bytes_are_read_or_refused(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Some(c) = canon(&bytes) {
                prop_assert!(Json::parse(c.as_bytes()).is_some());
            }
        }
    }
}
