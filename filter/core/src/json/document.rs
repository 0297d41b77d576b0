//! A held JSON request body that steps edit in place. The one parse gives the
//! tree and the byte ranges of the top-level members; an edit sets a member,
//! and the bytes (only that member's change), the tree and the ranges change
//! together. Every other byte reaches the backend exactly as the client sent
//! it, no number is ever rounded by a re-encoding, and no edit needs a new
//! parse of the body.

use std::ops::Range;

use super::{Json, Span};

/// A body as bytes, with its tree and its top-level members' spans when it is
/// strict JSON.
#[derive(Debug, Clone)]
pub struct Document {
    bytes: Vec<u8>,
    /// `None` when the body is not strict JSON, or once dropped.
    tree: Option<Json>,
    /// The top-level members when the body is an object (empty otherwise).
    spans: Vec<Span>,
    /// The body is a JSON object (its spans are its members, in order).
    object: bool,
}

impl Document {
    /// Parses `bytes` once; any bytes make a document, strict JSON or not.
    pub fn parse(bytes: Vec<u8>) -> Self {
        let (tree, spans) = match Json::parse_with_spans(&bytes) {
            Some((tree, spans)) => (Some(tree), spans),
            None => (None, Vec::new()),
        };
        let object = matches!(tree, Some(Json::Object(_)));
        Self {
            bytes,
            tree,
            spans,
            object,
        }
    }

    /// The bytes, with every edit.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes, with every edit.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The tree; `None` when the body is not strict JSON, or once dropped.
    pub fn tree(&self) -> Option<&Json> {
        self.tree.as_ref()
    }

    /// Frees the tree once nothing reads it; the members' spans stay, so the
    /// bytes can still be edited for another backend ([`Self::with_member`]).
    pub fn drop_tree(&mut self) {
        self.tree = None;
    }

    /// The index of the one top-level member `name`: `Some(None)` when
    /// absent, `None` when the body is no object or names `name` twice
    /// (readers disagree on which counts).
    fn find(&self, name: &str) -> Option<Option<usize>> {
        if !self.object {
            return None;
        }
        let mut found = None;
        for (i, s) in self.spans.iter().enumerate() {
            if s.name == name {
                if found.is_some() {
                    return None;
                }
                found = Some(i);
            }
        }
        Some(found)
    }

    /// Where the value of the one top-level member `name` sits.
    pub fn value_range(&self, name: &str) -> Option<Range<usize>> {
        Some(self.spans.get(self.find(name)??)?.value.clone())
    }

    /// The bytes of the value of the one top-level member `name`.
    pub fn value_bytes(&self, name: &str) -> Option<&[u8]> {
        self.bytes.get(self.value_range(name)?)
    }

    /// The bytes of each item of the array that is the value of the one
    /// top-level member `name`, as received (`None` once edited).
    pub fn items(&self, name: &str) -> Option<Vec<&[u8]>> {
        self.item_ranges(name)?
            .iter()
            .map(|r| self.bytes.get(r.clone()))
            .collect()
    }

    /// Where each item of the array that is the value of the one top-level
    /// member `name` sits, as received (`None` once edited).
    pub fn item_ranges(&self, name: &str) -> Option<&[Range<usize>]> {
        self.spans.get(self.find(name)??)?.items.as_deref()
    }

    /// Sets the one top-level member `name` to the JSON text `value` (whose
    /// tree is `parsed`): its value replaced, or the member added after the
    /// last one. False, and nothing changed, when the body is no object or
    /// names `name` twice.
    pub fn set(&mut self, name: &str, value: &[u8], parsed: Json) -> bool {
        let Some(found) = self.find(name) else {
            return false;
        };
        let done = match found {
            Some(i) => self.replace(i, value),
            None => self.append(name, value),
        };
        if done {
            self.set_in_tree(found, name, parsed);
        }
        done
    }

    /// Sets member `name` to the JSON text `value` like [`Self::set`], its
    /// tree parsed from that (short) text.
    pub fn set_text(&mut self, name: &str, value: &[u8]) -> bool {
        let Some(parsed) = Json::parse(value) else {
            return false;
        };
        self.set(name, value, parsed)
    }

    /// The bytes with the one top-level member `name` set to `value`, this
    /// document left as it is: `None` where [`Self::set`] would refuse.
    pub fn with_member(&self, name: &str, value: &[u8]) -> Option<Vec<u8>> {
        let mut copy = self.bytes_only();
        copy.set(name, value, Json::Null).then_some(copy.bytes)
    }

    /// The bytes without the one top-level member `name` (as they are when
    /// it is absent), this document left as it is: `None` when the body is
    /// no object or names it twice.
    pub fn without(&self, name: &str) -> Option<Vec<u8>> {
        let Some(i) = self.find(name)? else {
            return Some(self.bytes.clone());
        };
        let s = self.spans.get(i)?;
        // With the comma before it, or else the one after it.
        let cut = match (i.checked_sub(1), self.spans.get(i.saturating_add(1))) {
            (Some(before), _) => self.spans.get(before)?.value.end..s.value.end,
            (None, Some(next)) => s.key.start..next.key.start,
            (None, None) => s.key.start..s.value.end,
        };
        splice(&self.bytes, &cut, b"")
    }

    /// A copy of the bytes and the members' spans without the tree: what
    /// edits for one backend start from, this document left as it is.
    pub fn bytes_only(&self) -> Self {
        Self {
            bytes: self.bytes.clone(),
            tree: None,
            spans: self.spans.clone(),
            object: self.object,
        }
    }

    /// Replaces the value of member `i` with `value`, moving the spans after it.
    fn replace(&mut self, i: usize, value: &[u8]) -> bool {
        let Some(old) = self.spans.get(i).map(|s| s.value.clone()) else {
            return false;
        };
        let Some(bytes) = splice(&self.bytes, &old, value) else {
            return false;
        };
        self.bytes = bytes;
        let end = old.start.saturating_add(value.len());
        for s in self.spans.iter_mut().skip(i.saturating_add(1)) {
            s.key = moved(&s.key, old.end, end);
            s.value = moved(&s.value, old.end, end);
            if let Some(items) = s.items.as_mut() {
                for r in items.iter_mut() {
                    *r = moved(r, old.end, end);
                }
            }
        }
        if let Some(s) = self.spans.get_mut(i) {
            s.value = old.start..end;
            s.items = None;
        }
        true
    }

    /// Adds member `name` with `value` after the last member.
    fn append(&mut self, name: &str, value: &[u8]) -> bool {
        let Ok(quoted) = serde_json::to_string(name) else {
            return false;
        };
        let at = match self.spans.last() {
            Some(last) => last.value.end,
            // Right after the opening brace.
            None => match self.bytes.iter().position(|&b| b == b'{') {
                Some(brace) => brace.saturating_add(1),
                None => return false,
            },
        };
        let comma = usize::from(!self.spans.is_empty());
        let mut new = Vec::with_capacity(comma + quoted.len() + 1 + value.len());
        if comma == 1 {
            new.push(b',');
        }
        new.extend_from_slice(quoted.as_bytes());
        new.push(b':');
        new.extend_from_slice(value);
        let Some(bytes) = splice(&self.bytes, &(at..at), &new) else {
            return false;
        };
        self.bytes = bytes;
        let key_start = at.saturating_add(comma);
        let value_start = key_start.saturating_add(quoted.len()).saturating_add(1);
        self.spans.push(Span {
            name: name.to_string(),
            key: key_start..value_start.saturating_sub(1),
            value: value_start..value_start.saturating_add(value.len()),
            items: None,
        });
        true
    }

    /// The tree follows an edit of member `found` (or a new member).
    fn set_in_tree(&mut self, found: Option<usize>, name: &str, parsed: Json) {
        let Some(Json::Object(members)) = self.tree.as_mut() else {
            return;
        };
        match found.and_then(|i| members.get_mut(i)) {
            Some((_, v)) => *v = parsed,
            None => members.push((name.to_string(), parsed)),
        }
    }
}

/// `bytes` with `range` replaced by `new`; `None` when out of bounds.
fn splice(bytes: &[u8], range: &Range<usize>, new: &[u8]) -> Option<Vec<u8>> {
    let head = bytes.get(..range.start)?;
    let tail = bytes.get(range.end..)?;
    let mut out = Vec::with_capacity(
        head.len()
            .saturating_add(new.len())
            .saturating_add(tail.len()),
    );
    out.extend_from_slice(head);
    out.extend_from_slice(new);
    out.extend_from_slice(tail);
    Some(out)
}

/// A range after an edit that moved the byte at `from` to `to`.
fn moved(r: &Range<usize>, from: usize, to: usize) -> Range<usize> {
    let shift = |at: usize| {
        if to >= from {
            at.saturating_add(to - from)
        } else {
            at.saturating_sub(from - to)
        }
    };
    shift(r.start)..shift(r.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_left_out_with_its_comma() {
        let without = |b: &str| {
            Document::parse(b.as_bytes().to_vec())
                .without("model")
                .map(|v| String::from_utf8(v).unwrap())
        };
        for (body, want) in [
            (r#"{"model":"a","x":1}"#, Some(r#"{"x":1}"#)),
            (r#"{ "x":1 , "model" : "a" }"#, Some(r#"{ "x":1 }"#)),
            (r#"{"x":1,"model":"a","y":[2]}"#, Some(r#"{"x":1,"y":[2]}"#)),
            (r#"{"model":"a"}"#, Some("{}")),
            (r#"{"x":1}"#, Some(r#"{"x":1}"#)),
            (r#"{"model":"a","model":"b"}"#, None),
            ("[1]", None),
        ] {
            assert_eq!(without(body).as_deref(), want, "{body}");
            if let Some(w) = want {
                assert!(serde_json::from_str::<serde_json::Value>(w).is_ok());
            }
        }
    }

    fn doc(s: &str) -> Document {
        Document::parse(s.as_bytes().to_vec())
    }

    fn text(d: &Document) -> &str {
        std::str::from_utf8(d.bytes()).unwrap()
    }

    #[test]
    fn records_members_and_items() {
        let d = doc(r#" { "a" : [1, {"x":[2]} ,"]"], "b":{"c":"}"}, "d\u0065":null } "#);
        assert_eq!(d.value_bytes("a"), Some(&br#"[1, {"x":[2]} ,"]"]"#[..]));
        assert_eq!(d.value_bytes("b"), Some(&br#"{"c":"}"}"#[..]));
        // Keys are matched decoded.
        assert_eq!(d.value_bytes("de"), Some(&b"null"[..]));
        let items = d.items("a").unwrap();
        assert_eq!(items, vec![&b"1"[..], &br#"{"x":[2]}"#[..], &br#""]""#[..]]);
        assert_eq!(d.items("b"), None);
        assert_eq!(doc("[1,2]").value_bytes("a"), None);
        assert_eq!(doc(r#"{"a":}"#).tree(), None);
    }

    #[test]
    fn set_replaces_or_adds_and_keeps_the_rest() {
        let mut d = doc(r#"{"a": 1, "b" :[ 2 ], "c":3}"#);
        assert!(d.set_text("a", b"10"));
        assert_eq!(text(&d), r#"{"a": 10, "b" :[ 2 ], "c":3}"#);
        assert!(d.set_text("b", b"[]"));
        assert!(d.set_text("c", b"\"x\""));
        assert_eq!(text(&d), r#"{"a": 10, "b" :[], "c":"x"}"#);
        assert!(d.set_text("n", b"true"));
        assert_eq!(text(&d), r#"{"a": 10, "b" :[], "c":"x","n":true}"#);
        assert!(d.set_text("n", b"false"));
        assert_eq!(text(&d), r#"{"a": 10, "b" :[], "c":"x","n":false}"#);
        // The tree follows, equal to a new parse of the bytes.
        assert_eq!(d.tree(), Json::parse(d.bytes()).as_ref());
        let mut empty = doc(" { } ");
        assert!(empty.set_text("k", b"1"));
        assert_eq!(text(&empty), r#" {"k":1 } "#);
        assert_eq!(empty.tree(), Json::parse(empty.bytes()).as_ref());
    }

    #[test]
    fn refuses_what_it_cannot_edit_safely() {
        for body in [r#"{"a":1,"a":2}"#, "[1]", "1", r#"{"a":"#, ""] {
            let mut d = doc(body);
            assert!(!d.set_text("a", b"3"), "{body}");
            assert_eq!(text(&d), body);
            assert_eq!(d.with_member("a", b"3"), None, "{body}");
        }
        // A value that is no JSON text is refused too.
        assert!(!doc(r#"{"a":1}"#).set_text("a", b"tru"));
    }

    #[test]
    fn with_member_leaves_the_document_as_it_is() {
        let mut d = doc(r#"{"model":"a","x":[1]}"#);
        d.drop_tree();
        let other = d.with_member("model", br#""b""#).unwrap();
        assert_eq!(other, br#"{"model":"b","x":[1]}"#);
        assert_eq!(text(&d), r#"{"model":"a","x":[1]}"#);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// After any sequence of sets, the bytes parse to the tree kept,
            /// and every member not set keeps its bytes.
            #[test]
            fn edits_keep_bytes_tree_and_spans_in_step(
                edits in proptest::collection::vec((0usize..5, 0u32..1000, any::<bool>()), 0..8),
            ) {
                let names = ["model", "messages", "max_tokens", "n", "é"];
                let mut d = doc(r#"{ "model" : "m", "messages": [ {"role":"user"} ], "keep" : [1,2] }"#);
                for (i, v, text_value) in edits {
                    let name = names[i];
                    let value = if text_value { format!("\"v{v}\"") } else { v.to_string() };
                    prop_assert!(d.set_text(name, value.as_bytes()));
                }
                let reparsed = Json::parse(d.bytes());
                prop_assert_eq!(d.tree(), reparsed.as_ref());
                prop_assert_eq!(d.value_bytes("keep"), Some(&b"[1,2]"[..]));
                let fresh = Document::parse(d.bytes().to_vec());
                for name in names.iter().chain(&["keep"]) {
                    prop_assert_eq!(d.value_bytes(name), fresh.value_bytes(name));
                }
            }
        }
    }
}
