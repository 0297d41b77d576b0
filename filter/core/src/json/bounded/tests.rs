use std::fmt;

use proptest::prelude::*;
use serde::de::{MapAccess, SeqAccess, Visitor};

use super::*;
use crate::fuzz::{self, Doc};

/// Reads a list, keeping each item's text, at most `max` of them.
#[derive(Clone, Copy)]
struct Items(usize);

impl<'de> DeserializeSeed<'de> for Items {
    type Value = Vec<&'de str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Items {
    type Value = Vec<&'de str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        each_item(seq, self.0, "items", Raw, |raw| {
            if raw == "\"stop\"" {
                return Err("told to stop".to_string());
            }
            items.push(raw);
            Ok(())
        })?;
        Ok(items)
    }
}

/// Reads an object, keeping the text of each member named `a` or `b`, in
/// order; a member `b` of `"stop"` refuses it.
#[derive(Clone, Copy)]
struct Members;

impl<'de> DeserializeSeed<'de> for Members {
    type Value = Vec<(&'static str, &'de str)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Members {
    type Value = Vec<(&'static str, &'de str)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        each_member(map, &["a", "b"], |name, map| {
            let raw = map.next_value_seed(Raw)?;
            if name == "b" && raw == r#""stop""# {
                return Err(A::Error::custom("told to stop"));
            }
            members.push((name, raw));
            Ok(())
        })?;
        Ok(members)
    }
}

fn depth(doc: &Doc) -> usize {
    match doc {
        Doc::Arr(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Doc::Obj(members) => 1 + members.iter().map(|(_, v)| depth(v)).max().unwrap_or(0),
        _ => 0,
    }
}

#[test]
fn nesting_counts_brackets_outside_strings() {
    for (body, want) in [
        (&b""[..], 0),
        (b"1", 0),
        (b"[]", 1),
        (br#"{"a":[[1],{"b":{}}]}"#, 4),
        (br#"["[[[{{{", "\"[["]"#, 1),
        (br#"["\\", [2]]"#, 2),
        (b"]]]][", 1),
        (b"\"[[[", 0),
    ] {
        assert_eq!(nesting(body), want, "{}", String::from_utf8_lossy(body));
    }
    let deep = "[".repeat(100_000);
    assert_eq!(nesting(deep.as_bytes()), 100_000);
}

#[test]
fn read_refuses_deep_trailing_or_broken_bodies() {
    let at_bound = "[".repeat(MAX_DEPTH - 1) + &"]".repeat(MAX_DEPTH - 1);
    assert!(read(at_bound.as_bytes(), Raw).is_ok());
    let deep = format!("[{}]", "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH));
    let e = read(deep.as_bytes(), Raw).unwrap_err();
    assert!(e.contains("nested 129 deep"), "{e}");
    // Past the bound and unclosed: refused before a byte is parsed.
    let e = read("[".repeat(1 << 20).as_bytes(), Raw).unwrap_err();
    assert!(e.contains("at most 128"), "{e}");
    assert!(read(b"[1] 2", Raw).is_err());
    assert!(read(b"[1", Raw).is_err());
    assert!(read(b"\xff", Raw).is_err());
    assert_eq!(read(b" [1 , 2] \n", Raw).unwrap(), "[1 , 2]");
}

#[test]
fn text_is_borrowed_decoded_long_or_other() {
    assert_eq!(Text::of(r#""abc""#, 3), Text::Short(Cow::Borrowed("abc")));
    assert!(matches!(
        Text::of(r#""abc""#, 3),
        Text::Short(Cow::Borrowed(_))
    ));
    assert_eq!(Text::of(r#""abcd""#, 3), Text::Long);
    assert_eq!(Text::of(r#""""#, 0), Text::Short(Cow::Borrowed("")));
    // Escapes are decoded, and the bound is on the decoded bytes.
    let t = Text::of(r#""a\u00e9\"""#, 4);
    assert_eq!(t.short(), Some("aé\""));
    assert!(matches!(t, Text::Short(Cow::Owned(_))));
    assert_eq!(Text::of(r#""a\u00e9\"""#, 3), Text::Long);
    // Far past the bound: not decoded at all.
    let long = format!("\"{}\"", "\\n".repeat(100));
    assert_eq!(Text::of(&long, 10), Text::Long);
    assert_eq!(Text::of(r#""\ud83d\ude00""#, 4).short(), Some("😀"));
    for other in ["1", "null", "[]", r#"{"a":"b"}"#, "true"] {
        assert_eq!(Text::of(other, 100), Text::Other, "{other}");
    }
}

#[test]
fn names_match_whatever_the_spelling() {
    let names = ["status", "labels"];
    assert_eq!(name(r#""status""#, &names), Some("status"));
    assert_eq!(name(r#""st\u0061tus""#, &names), Some("status"));
    assert_eq!(name(r#""statuses""#, &names), None);
    assert_eq!(name(r#""stat""#, &names), None);
    assert_eq!(name("1", &names), None);
    assert_eq!(name(r#""x""#, &[]), None);
}

#[test]
fn empty_arrays_and_numbers_by_their_text() {
    for (raw, empty) in [
        ("[]", true),
        ("[ \n\t]", true),
        ("[1]", false),
        ("{}", false),
    ] {
        assert_eq!(is_empty_array(raw), empty, "{raw}");
    }
    for (raw, number) in [
        ("1", true),
        ("-0.5", true),
        ("\"1\"", false),
        ("null", false),
    ] {
        assert_eq!(is_number(raw), number, "{raw}");
    }
}

#[test]
fn items_are_refused_one_past_the_bound() {
    assert_eq!(read(b"[1,2,3]", Items(3)).unwrap(), ["1", "2", "3"]);
    assert_eq!(read(b"[]", Items(0)).unwrap(), Vec::<&str>::new());
    let e = read(b"[1,2,3,[4,[5]]]", Items(3)).unwrap_err();
    assert!(e.contains("more than 3 items"), "{e}");
    assert!(read(b"[1]", Items(0)).is_err());
    let e = read(br#"[1,"stop",3]"#, Items(3)).unwrap_err();
    assert!(e.contains("told to stop"), "{e}");
    assert!(read(b"{}", Items(3)).is_err());
}

#[test]
fn members_wanted_are_handed_over_the_rest_read_past() {
    let body = br#"{"x":[1,{"a":2}],"b":"one","\u0061":{"c":3},"ab":4,"a":5}"#;
    assert_eq!(
        read(body, Members).unwrap(),
        [("b", r#""one""#), ("a", r#"{"c":3}"#), ("a", "5")]
    );
    assert_eq!(read(b"{}", Members).unwrap(), []);
    let e = read(br#"{"a":1,"b":"stop","a":2}"#, Members).unwrap_err();
    assert!(e.contains("told to stop"), "{e}");
    for broken in [&b"[]"[..], br#"{"x":}"#, br#"{"a":1"#] {
        assert!(read(broken, Members).is_err());
    }
}

proptest! {
    #![proptest_config(fuzz::config(256))]

    /// Any spelling of any document: read whole in place, its text as
    /// written; nested as deep as it is.
    #[test]
    fn any_document_reads_in_place(doc in fuzz::doc(false), seed: u64) {
        let spelled = doc.spell(seed);
        prop_assert_eq!(nesting(spelled.as_bytes()), depth(&doc));
        prop_assert_eq!(read(spelled.as_bytes(), Raw).unwrap(), spelled.trim_matches([' ', '\t', '\n', '\r']));
        if let Doc::Str(s) = &doc {
            let raw = read(spelled.as_bytes(), Raw).unwrap();
            let text = Text::of(raw, s.len());
            prop_assert_eq!(text.short(), Some(s.as_str()));
            if !s.is_empty() {
                prop_assert_eq!(Text::of(raw, s.len() - 1), Text::Long);
            }
        }
    }

    /// Broken documents and noise are refused or read, never a panic; what
    /// is read is JSON serde_json reads too (bar numbers beyond `f64` and
    /// lone surrogates, which the JSON grammar allows: read in place, never
    /// as a value).
    #[test]
    fn any_bytes_are_read_or_refused(doc in fuzz::doc(false), seed: u64, noise in prop::collection::vec(any::<u8>(), 0..64)) {
        for bytes in [fuzz::mutated(&doc, seed), noise] {
            if let Ok(raw) = read(&bytes, Raw) {
                let value = serde_json::from_str::<serde_json::Value>(raw);
                prop_assert!(
                    value.as_ref().map_or_else(|e| {
                        let e = e.to_string();
                        e.contains("out of range") || e.contains("surrogate") || e.contains("hex escape")
                    }, |_| true),
                    "{}", raw
                );
            }
            let _ = read(&bytes, Items(3));
        }
    }
}
