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
            field => format!("{section}.{field}"),
        };
        Self { field, ..self }
    }

    /// Deserialises a raw document or section, the error naming the path of
    /// the offending field (`.` when it is the document itself).
    pub fn from_json<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Result<T, Self> {
        let de = &mut serde_json::Deserializer::from_slice(json);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = match e.path().to_string() {
                // `?` for no path; empty for an unknown key that is itself empty.
                p if p == "?" || p.is_empty() => ".".to_string(),
                p => p,
            };
            Self::new(path, e.into_inner().to_string())
        })
    }
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
}
