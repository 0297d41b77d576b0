//! The error a refused configuration produces. A leaf that imports nothing of
//! the crate, so every section can return it without importing the document
//! that holds the section.

use std::fmt;

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
