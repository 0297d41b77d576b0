//! Reading a section by hand over the document's one JSON tree, the way the
//! guardrails read their rules. A serde derive compiles a reader per struct
//! for every way it is reached; here a struct's reader is one match over
//! its field names ([`read_fields!`]) and every field of a type shares one
//! [`Read`], so a section costs the module a few hundred bytes rather than
//! kilobytes. Refusals keep serde's words (`unknown field`, `invalid
//! type`) and name the path relative to the value read, prefixed by each
//! caller as with every section ([`ConfigError::within`]).

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::ConfigError;

/// A value of the document read into `Self`, refused naming the path
/// relative to it (`.` for the value itself).
pub trait Read: Sized {
    /// Reads `v`.
    fn read(v: &Value) -> Result<Self, ConfigError>;
}

/// A JSON document read whole, then into `T` (tests read a section alone).
#[cfg(test)]
pub fn parse<T: Read>(json: &[u8]) -> Result<T, ConfigError> {
    T::read(&ConfigError::from_json::<Value>(json)?)
}

/// The members of the object `v` (none when `null`), each named in
/// `known`; any other is refused as serde refuses an unknown field.
pub fn fields<'v>(
    v: &'v Value,
    known: &[&str],
) -> Result<impl Iterator<Item = (&'v str, &'v Value)>, ConfigError> {
    let members = match v {
        Value::Object(m) => Some(m),
        Value::Null => None,
        other => return Err(invalid(other, "a section (an object)")),
    };
    if let Some(name) = members
        .into_iter()
        .flat_map(|m| m.keys())
        .find(|k| !known.contains(&k.as_str()))
    {
        // An empty key names the object rather than nothing.
        let field = if name.is_empty() { "." } else { name.as_str() };
        return Err(ConfigError::new(
            field,
            format!("unknown field `{name}`, expected {}", one_of(known)),
        ));
    }
    Ok(members
        .into_iter()
        .flat_map(|m| m.iter())
        .map(|(k, v)| (k.as_str(), v)))
}

/// serde's list of what was expected: `` `a` ``, `` `a` or `b` ``,
/// `` one of `a`, `b`, `c` ``.
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [] => "no fields".to_string(),
        [one] => one.clone(),
        [a, b] => format!("{a} or {b}"),
        all => format!("one of {}", all.join(", ")),
    }
}

/// The refusal of `v` where `expected` was, in serde's words.
pub fn invalid(v: &Value, expected: &str) -> ConfigError {
    let seen = match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) if n.is_f64() => format!("floating point `{n}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".to_string(),
        Value::Object(_) => "map".to_string(),
    };
    ConfigError::new(".", format!("invalid type: {seen}, expected {expected}"))
}

/// One of an enum's `all` values by its document spelling (`name`).
pub fn variant<T: Copy>(
    v: &Value,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T, ConfigError> {
    let Value::String(s) = v else {
        return Err(invalid(v, "variant identifier"));
    };
    all.iter().copied().find(|&t| name(t) == s).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|&t| name(t)).collect();
        ConfigError::new(
            ".",
            format!("unknown variant `{s}`, expected {}", one_of(&names)),
        )
    })
}

/// A section or value given whole to serde: the parts of the document
/// the full build alone reads keep their derived readers. The path is
/// read back from the value's text, relative to it. Each section's reader
/// is a function of its own (`config::apart` says why).
#[inline(never)]
pub fn derived<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ConfigError> {
    let text = serde_json::to_vec(v).map_err(|e| ConfigError::new(".", e.to_string()))?;
    ConfigError::from_json(&text)
}

impl Read for Value {
    #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
        Ok(v.clone())
    }
}

impl Read for bool {
    #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
        v.as_bool().ok_or_else(|| invalid(v, "a boolean"))
    }
}

impl Read for String {
    #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| invalid(v, "a string"))
    }
}

impl Read for f64 {
    #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
        v.as_f64().ok_or_else(|| invalid(v, "f64"))
    }
}

/// A whole number of `bits` bits, unsigned, in serde's words when not.
fn whole(v: &Value, max: u64, name: &str) -> Result<u64, ConfigError> {
    match v {
        Value::Number(n) if n.is_u64() => n.as_u64().filter(|&n| n <= max).ok_or_else(|| {
            ConfigError::new(
                ".",
                format!("invalid value: integer `{n}`, expected {name}"),
            )
        }),
        Value::Number(n) if n.is_i64() => Err(ConfigError::new(
            ".",
            format!("invalid value: integer `{n}`, expected {name}"),
        )),
        other => Err(invalid(other, name)),
    }
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl Read for $t {
            #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
                let n = whole(v, <$t>::MAX as u64, stringify!($t))?;
                <$t>::try_from(n).map_err(|_| invalid(v, stringify!($t)))
            }
        }
    )*};
}
unsigned!(u8, u16, u32, u64, usize);

impl<T: Read> Read for Option<T> {
    /// `null` is absent.
    #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
        match v {
            Value::Null => Ok(None),
            v => T::read(v).map(Some),
        }
    }
}

impl<T: Read> Read for Vec<T> {
    #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
        let Value::Array(items) = v else {
            return Err(invalid(v, "a sequence"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| T::read(item).map_err(|e| e.at_index(i)))
            .collect()
    }
}

impl<T: Read> Read for BTreeMap<String, T> {
    #[inline(never)]
    fn read(v: &Value) -> Result<Self, ConfigError> {
        let Value::Object(members) = v else {
            return Err(invalid(v, "a map"));
        };
        // Inserted in the tree's order, already sorted: no sort is compiled.
        let mut out = BTreeMap::new();
        for (k, item) in members {
            out.insert(k.clone(), T::read(item).map_err(|e| e.within(k))?);
        }
        Ok(out)
    }
}

/// A raw struct of optional fields as declared, and its [`Read`]: each
/// field read by its own type's reader, every other member refused. The
/// fields declared are the members the document may give, and an absent or
/// `null` section is the struct's `Default`.
#[macro_export]
macro_rules! read_fields {
    (
        $(#[$meta:meta])*
        $vis:vis struct $raw:ident {
            $($(#[$field_meta:meta])* $field_vis:vis $field:ident: $ty:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $raw {
            $($(#[$field_meta])* $field_vis $field: $ty),*
        }

        impl $crate::config::read::Read for $raw {
            #[inline(never)]
            fn read(v: &serde_json::Value) -> Result<Self, $crate::config::ConfigError> {
                let mut out = Self::default();
                for (name, v) in $crate::config::read::fields(v, &[$(stringify!($field)),*])? {
                    match name {
                        $(stringify!($field) => {
                            out.$field = $crate::config::read::Read::read(v)
                                .map_err(|e| e.within(name))?;
                        })*
                        _ => {}
                    }
                }
                Ok(out)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    read_fields! {
        #[derive(Debug, Default, PartialEq)]
        struct Raw {
            n: Option<u8>,
            list: Option<Vec<u16>>,
            map: Option<BTreeMap<String, Vec<Option<bool>>>>,
            s: Option<String>,
            x: Option<f64>,
        }
    }

    fn err(json: &str) -> (String, String) {
        let e = parse::<Raw>(json.as_bytes()).unwrap_err();
        (e.field, e.message)
    }

    #[test]
    fn fields_are_read_by_their_types_and_null_is_absent() {
        let r: Raw =
            parse(br#"{"n":3,"list":[1,2],"map":{"a":[true,null]},"s":"y","x":1}"#).unwrap();
        assert_eq!(r.n, Some(3));
        assert_eq!(r.list, Some(vec![1, 2]));
        assert_eq!(r.map.unwrap()["a"], [Some(true), None]);
        assert_eq!((r.s.as_deref(), r.x), (Some("y"), Some(1.0)));
        assert_eq!(parse::<Raw>(b"null").unwrap(), Raw::default());
        assert_eq!(parse::<Raw>(br#"{"n":null}"#).unwrap(), Raw::default());
    }

    #[test]
    fn refusals_name_the_path_in_serdes_words() {
        for (json, field, message) in [
            (
                r#"{"zz":1}"#,
                "zz",
                "unknown field `zz`, expected one of `n`, `list`, `map`, `s`, `x`",
            ),
            (
                r#"{"n":300}"#,
                "n",
                "invalid value: integer `300`, expected u8",
            ),
            (
                r#"{"n":-1}"#,
                "n",
                "invalid value: integer `-1`, expected u8",
            ),
            (
                r#"{"n":1.5}"#,
                "n",
                "invalid type: floating point `1.5`, expected u8",
            ),
            (
                r#"{"s":5}"#,
                "s",
                "invalid type: integer `5`, expected a string",
            ),
            (
                r#"{"x":"1"}"#,
                "x",
                "invalid type: string \"1\", expected f64",
            ),
            (
                r#"{"list":[1,"a"]}"#,
                "list[1]",
                "invalid type: string \"a\", expected u16",
            ),
            (
                r#"{"list":{}}"#,
                "list",
                "invalid type: map, expected a sequence",
            ),
            (
                r#"{"map":{"k":[true,1]}}"#,
                "map.k[1]",
                "invalid type: integer `1`, expected a boolean",
            ),
            (
                "[]",
                ".",
                "invalid type: sequence, expected a section (an object)",
            ),
        ] {
            assert_eq!(
                err(json),
                (field.to_string(), message.to_string()),
                "{json}"
            );
        }
    }

    #[test]
    fn a_variant_is_one_of_its_spellings() {
        let names = |b: bool| if b { "on" } else { "off" };
        assert_eq!(variant(&Value::from("on"), &[true, false], names), Ok(true));
        let e = variant(&Value::from("ON"), &[true, false], names).unwrap_err();
        assert_eq!(e.message, "unknown variant `ON`, expected `on` or `off`");
        let e = variant(&serde_json::json!({"on": null}), &[true], names).unwrap_err();
        assert_eq!(e.message, "invalid type: map, expected variant identifier");
    }

    #[test]
    fn a_derived_reader_names_the_path_relative_to_its_value() {
        let v = serde_json::json!({"a": {"b": "x"}});
        let e = derived::<BTreeMap<String, BTreeMap<String, u8>>>(&v).unwrap_err();
        assert_eq!(e.field, "a.b");
    }
}
