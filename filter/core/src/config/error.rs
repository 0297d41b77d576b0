//! The error a refused configuration produces. A leaf that imports nothing of
//! the crate, so every section can return it without importing the document
//! that holds the section.

use std::fmt;

use serde::Deserialize;

/// A configuration the filter refuses, naming the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the offending field (`cache.ttl_s`), or `.` for the document.
    pub field: String,
    /// What is wrong with it, including the bad value.
    pub message: String,
}

impl ConfigError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error seen from the document: a section compiles with field
    /// paths relative to itself (`ttl_s`) and its caller names the section
    /// (`cache.ttl_s`).
    pub fn within(self, section: &str) -> Self {
        let field = match self.field.as_str() {
            "." => section.to_string(),
            field if field.starts_with('[') => format!("{section}{field}"),
            field => format!("{section}.{field}"),
        };
        Self { field, ..self }
    }

    /// The same error seen from the list whose item `i` it is about
    /// (`[2].name`); the list's caller names the list.
    pub fn at_index(self, i: usize) -> Self {
        let field = match self.field.as_str() {
            "." => format!("[{i}]"),
            field if field.starts_with('[') => format!("[{i}]{field}"),
            field => format!("[{i}].{field}"),
        };
        Self { field, ..self }
    }

    /// Deserialises a raw document or section, the error naming the path of
    /// the offending field (`.` when it is the document itself). The path is
    /// read back from where serde_json stopped (one scan of the text), so
    /// no deserializer is instantiated a second time to track it.
    pub fn from_json<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Result<T, Self> {
        serde_json::from_slice(json).map_err(|e| {
            let end = offset_of(json, e.line(), e.column());
            let message = e.to_string();
            // serde says what a whole object or array lacks once it has read
            // its closing bracket; any other error is the value's before it.
            let of_container = ["missing field", "invalid length"]
                .iter()
                .any(|m| message.starts_with(m));
            Self::new(path_at(json, end, of_container), message)
        })
    }
}

/// The byte offset serde_json's `line` and `column` point after: `column`
/// bytes into the 1-based `line` (a peeked byte counts as read).
fn offset_of(json: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line {
        match json
            .get(start..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        {
            Some(i) => start += i + 1,
            None => break,
        }
    }
    (start + column).min(json.len())
}

/// One open container of the scan: an object with the key read last, or an
/// array with the index of the element being read.
enum Frame {
    Object(Option<String>),
    Array(usize),
}

/// The dotted path (`routing.models.gpt-4o[0].weight`) of the value the
/// first `end` bytes of `json` stop in or right after: a key just read names
/// its field (an unknown one), a container just opened names the container
/// (a wrong type), and one just closed names itself when the error is
/// `of_container` (a missing field), else the value before its bracket.
/// `.` for the document.
fn path_at(json: &[u8], end: usize, of_container: bool) -> String {
    let text = json.get(..end).unwrap_or(json);
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    let mut last = 0u8;
    while let Some(&b) = text.get(i) {
        match b {
            b'"' => {
                let close = string_end(text, i + 1);
                if let Some(Frame::Object(key @ None)) = stack.last_mut() {
                    let raw = json.get(i..(close + 1).min(json.len())).unwrap_or_default();
                    *key = Some(serde_json::from_slice(raw).unwrap_or_default());
                }
                i = close;
            }
            b'{' => stack.push(Frame::Object(None)),
            b'[' => stack.push(Frame::Array(0)),
            b'}' | b']' if of_container || i + 1 < text.len() => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object(key)) => *key = None,
                Some(Frame::Array(n)) => *n += 1,
                None => {}
            },
            _ => {}
        }
        if !b.is_ascii_whitespace() {
            last = b;
        }
        i += 1;
    }
    // A container opened by the last byte read is the value in error, not
    // a place inside it.
    let open = usize::from(matches!(last, b'{' | b'['));
    let mut path = String::new();
    for frame in stack.iter().take(stack.len().saturating_sub(open)) {
        match frame {
            Frame::Object(Some(key)) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            Frame::Object(None) => {}
            Frame::Array(n) => {
                path.push('[');
                path.push_str(&n.to_string());
                path.push(']');
            }
        }
    }
    if path.is_empty() {
        ".".to_string()
    } else {
        path
    }
}

/// The index of the quote closing the string whose text starts at `from`,
/// or the text's length when it is cut.
fn string_end(text: &[u8], from: usize) -> usize {
    let mut i = from;
    while let Some(&b) = text.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return i,
            _ => i += 1,
        }
    }
    text.len()
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration at `{}`: {}",
            self.field, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_prefixes_the_section() {
        let e = ConfigError::new("models.m[0].weight", "0 is not a positive weight");
        assert_eq!(e.within("routing").field, "routing.models.m[0].weight");
        assert_eq!(ConfigError::new(".", "x").within("cache").field, "cache");
        let item = ConfigError::new("name", "x").at_index(2).within("groups");
        assert_eq!(item.field, "groups[2].name");
        let nested = ConfigError::new(".", "x")
            .at_index(1)
            .at_index(0)
            .within("l");
        assert_eq!(nested.field, "l[0][1]");
    }

    #[test]
    fn serde_errors_name_the_path() {
        let e = ConfigError::from_json::<std::collections::BTreeMap<String, u8>>(br#"{"a":300}"#)
            .unwrap_err();
        assert_eq!(e.field, "a");
        assert!(e.message.contains("300"), "{e}");
        let e = ConfigError::from_json::<u8>(b"{").unwrap_err();
        assert_eq!(e.field, ".");
        // An empty key names the document rather than nothing.
        let e = ConfigError::from_json::<std::collections::BTreeMap<String, u8>>(br#"{"":300}"#)
            .unwrap_err();
        assert_eq!(e.field, ".");
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        cache: Option<Cache>,
        list: Option<Vec<Cache>>,
        map: Option<std::collections::BTreeMap<String, Cache>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Cache {
        ttl_s: u32,
        #[serde(default, deserialize_with = "refuse")]
        name: Option<String>,
    }

    fn refuse<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let s = String::deserialize(d)?;
        Err(serde::de::Error::custom(format!("{s:?} refused")))
    }

    /// The path read back from where serde_json stopped, for each kind of
    /// refusal, at the end of an object and inside it, across lines, in
    /// arrays and maps, and with quotes and brackets inside strings.
    #[test]
    fn paths_are_read_back_from_the_position() {
        let cases = [
            (r#"{"cache":{"ttl":60}}"#, "cache.ttl"),
            (r#"{"cache":{"ttl_s":"x"}}"#, "cache.ttl_s"),
            (r#"{"cache":{"ttl_s":1,"name":"a"}}"#, "cache.name"),
            (r#"{"cache":{"name":"a","ttl_s":1}}"#, "cache.name"),
            (r#"{"cache":{"name":null}}"#, "cache.name"),
            (r#"{"cache":{}}"#, "cache"),
            (r#"{"map":[1]}"#, "map"),
            (r#"{"cache":"x"}"#, "cache"),
            (r#"{"cache":5}"#, "cache"),
            (r#"{"list":[{"ttl_s":1},{"ttl_s":-1}]}"#, "list[1].ttl_s"),
            (r#"{"list":[{"ttl_s":1},{}]}"#, "list[1]"),
            (r#"{"list":{}}"#, "list"),
            (r#"{"map":{"a]{\"":{"ttl_s":1},"b":{"x":1}}}"#, "map.b.x"),
            (r#"{"map":{"a\"b":{"ttl_s":"1"}}}"#, "map.a\"b.ttl_s"),
            ("{\n \"cache\": {\n  \"ttl_s\": true\n }\n}", "cache.ttl_s"),
            (r#"{"cache":{"ttl_s":1} , "zz":1}"#, "zz"),
            (r#"{"cache":{"ttl_s":1,}}"#, "cache"),
            ("[]", "."),
            (r#"{"cache":{"ttl_s":1}} x"#, "."),
            (r#"{"cache":{"ttl_s":1"#, "cache.ttl_s"),
        ];
        for (json, path) in cases {
            let Err(e) = ConfigError::from_json::<Doc>(json.as_bytes()) else {
                panic!("{json} parsed");
            };
            assert_eq!(e.field, path, "{json}: {e}");
        }
    }
}
