//! Edits a JSON request body in place. The body is scanned for the byte
//! ranges of its top-level members (and of an array's items), and a change
//! replaces only its own bytes: every other byte reaches the backend exactly
//! as the client sent it, and no number is ever rounded by a re-encoding.

use std::ops::Range;

/// One top-level member: its key (quotes included) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The key's bytes, quotes included.
    pub key: Range<usize>,
    /// The value's bytes.
    pub value: Range<usize>,
}

/// The members of a body that is one JSON object (whitespace around it
/// allowed), in document order; `None` for anything else or malformed text.
pub fn members(body: &[u8]) -> Option<Vec<Member>> {
    let mut s = Scanner { b: body, i: 0 };
    s.blank();
    s.eat(b'{')?;
    let mut out = Vec::new();
    s.blank();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            s.blank();
            let key = s.string()?;
            s.blank();
            s.eat(b':')?;
            s.blank();
            let start = s.i;
            s.value()?;
            out.push(Member {
                key,
                value: start..s.i,
            });
            s.blank();
            match s.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    s.blank();
    (s.i == body.len()).then_some(out)
}

/// The one member named `name` (escapes in the key honoured): `Ok(None)` when
/// absent, `Err(())` when named twice (readers disagree on which counts).
#[allow(clippy::result_unit_err)]
pub fn find<'m>(body: &[u8], members: &'m [Member], name: &str) -> Result<Option<&'m Member>, ()> {
    let mut found = None;
    for m in members {
        if body.get(m.key.clone()).is_some_and(|k| key_is(k, name)) {
            if found.is_some() {
                return Err(());
            }
            found = Some(m);
        }
    }
    Ok(found)
}

/// A key (quotes included) that decodes to `name`.
fn key_is(raw: &[u8], name: &str) -> bool {
    let plain = raw.len() == name.len() + 2
        && raw.get(1..raw.len() - 1) == Some(name.as_bytes())
        && raw.first() == Some(&b'"');
    if plain {
        return true;
    }
    raw.contains(&b'\\') && serde_json::from_slice::<String>(raw).is_ok_and(|k| k == name)
}

/// The byte ranges of the items of the array at `array` in `body`; `None`
/// when that range is not one well-formed array.
pub fn items(body: &[u8], array: Range<usize>) -> Option<Vec<Range<usize>>> {
    let end = array.end;
    let mut s = Scanner {
        b: body.get(..end)?,
        i: array.start,
    };
    s.eat(b'[')?;
    let mut out = Vec::new();
    s.blank();
    if s.peek() == Some(b']') {
        s.i += 1;
    } else {
        loop {
            s.blank();
            let start = s.i;
            s.value()?;
            out.push(start..s.i);
            s.blank();
            match s.next()? {
                b',' => continue,
                b']' => break,
                _ => return None,
            }
        }
    }
    (s.i == end).then_some(out)
}

/// The body with the one top-level member `name` set to the JSON text
/// `value`: its value replaced, or the member added after the last one.
/// `None` when the body is not one object or names `name` twice.
pub fn set_member(body: &[u8], name: &str, value: &[u8]) -> Option<Vec<u8>> {
    let members = members(body)?;
    match find(body, &members, name).ok()? {
        Some(m) => splice(body, &[(m.value.clone(), value.to_vec())]),
        None => {
            let quoted = serde_json::to_string(name).ok()?;
            let mut new = Vec::with_capacity(quoted.len() + value.len() + 2);
            let at = match members.last() {
                Some(last) => {
                    new.push(b',');
                    last.value.end
                }
                // Right after the opening brace.
                None => body.iter().position(|&b| b == b'{')?.checked_add(1)?,
            };
            new.extend_from_slice(quoted.as_bytes());
            new.push(b':');
            new.extend_from_slice(value);
            splice(body, &[(at..at, new)])
        }
    }
}

/// The body with each range replaced by its bytes; `None` when the ranges
/// overlap, are out of order or out of bounds.
pub fn splice(body: &[u8], edits: &[(Range<usize>, Vec<u8>)]) -> Option<Vec<u8>> {
    let added: usize = edits.iter().map(|(_, b)| b.len()).sum();
    let mut out = Vec::with_capacity(body.len().saturating_add(added));
    let mut at = 0;
    for (range, bytes) in edits {
        out.extend_from_slice(body.get(at..range.start)?);
        out.extend_from_slice(bytes);
        if range.end < range.start {
            return None;
        }
        at = range.end;
    }
    out.extend_from_slice(body.get(at..)?);
    Some(out)
}

/// A cursor over JSON text that checks structure but not every token:
/// enough to find members without building the document.
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    fn blank(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// A string at the cursor; its range including the quotes.
    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.i;
        self.eat(b'"')?;
        loop {
            match self.next()? {
                b'"' => return Some(start..self.i),
                b'\\' => {
                    self.next()?;
                }
                c if c < 0x20 => return None,
                _ => {}
            }
        }
    }

    /// Any value at the cursor. Nesting is tracked with an explicit stack, so
    /// depth costs memory, never call stack.
    fn value(&mut self) -> Option<()> {
        let mut open: Vec<u8> = Vec::new();
        loop {
            match self.peek()? {
                b'"' => {
                    self.string()?;
                }
                b'{' => {
                    open.push(b'}');
                    self.i += 1;
                }
                b'[' => {
                    open.push(b']');
                    self.i += 1;
                }
                c @ (b'}' | b']') => {
                    if open.pop()? != c {
                        return None;
                    }
                    self.i += 1;
                }
                b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' if !open.is_empty() => self.i += 1,
                _ => {
                    // A scalar: up to the next delimiter.
                    let start = self.i;
                    while self.peek().is_some_and(|c| {
                        !matches!(
                            c,
                            b',' | b'}'
                                | b']'
                                | b':'
                                | b' '
                                | b'\t'
                                | b'\n'
                                | b'\r'
                                | b'"'
                                | b'{'
                                | b'['
                        )
                    }) {
                        self.i += 1;
                    }
                    if self.i == start {
                        return None;
                    }
                }
            }
            if open.is_empty() {
                return Some(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(b: Option<Vec<u8>>) -> Option<String> {
        b.map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn finds_members_and_items() {
        let body = br#" { "a" : [1, {"b":2} ,"]"], "c":null }"#;
        let m = members(body).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(&body[m[0].key.clone()], br#""a""#);
        assert_eq!(&body[m[0].value.clone()], br#"[1, {"b":2} ,"]"]"#);
        assert_eq!(&body[m[1].value.clone()], b"null");
        let items = items(body, m[0].value.clone()).unwrap();
        let got: Vec<&[u8]> = items.iter().map(|r| &body[r.clone()]).collect();
        assert_eq!(got, [&b"1"[..], br#"{"b":2}"#, br#""]""#]);
        assert_eq!(items_of("[]"), Some(vec![]));
        assert_eq!(items_of("[ ]"), Some(vec![]));
        assert_eq!(items_of("[1,]"), None);
        assert_eq!(items_of("{}"), None);
        assert_eq!(members(b"{}"), Some(vec![]));
        for bad in ["", "[]", "{", r#"{"a":1} x"#, r#"{"a":1,}"#, r#"{a:1}"#] {
            assert_eq!(members(bad.as_bytes()), None, "{bad}");
        }
    }

    fn items_of(s: &str) -> Option<Vec<Range<usize>>> {
        items(s.as_bytes(), 0..s.len())
    }

    #[test]
    fn find_honours_escapes_and_refuses_repeats() {
        let body = br#"{"mod\u0065l":"a","x":1}"#;
        let m = members(body).unwrap();
        assert_eq!(find(body, &m, "model").unwrap().unwrap().value, 14..17);
        assert_eq!(find(body, &m, "y"), Ok(None));
        let twice = br#"{"x":1,"x":2}"#;
        assert_eq!(find(twice, &members(twice).unwrap(), "x"), Err(()));
    }

    #[test]
    fn set_member_replaces_or_adds() {
        let set = |b: &str, v: &str| text(set_member(b.as_bytes(), "max_tokens", v.as_bytes()));
        assert_eq!(
            set(r#"{"max_tokens": 2048 ,"a":1}"#, "512").as_deref(),
            Some(r#"{"max_tokens": 512 ,"a":1}"#)
        );
        assert_eq!(
            set("{\"a\":1 \n}", "512").as_deref(),
            Some("{\"a\":1,\"max_tokens\":512 \n}")
        );
        assert_eq!(set(" { } ", "5").as_deref(), Some(r#" {"max_tokens":5 } "#));
        assert_eq!(set(r#"{"max_tokens":1,"max_tokens":2}"#, "5"), None);
        assert_eq!(set("[1]", "5"), None);
    }

    #[test]
    fn splice_refuses_bad_ranges() {
        assert_eq!(
            text(splice(b"abcd", &[(1..2, b"X".to_vec())])).as_deref(),
            Some("aXcd")
        );
        assert_eq!(splice(b"abcd", &[(2..3, vec![]), (1..2, vec![])]), None);
        assert_eq!(splice(b"abcd", &[(3..9, vec![])]), None);
    }
}
