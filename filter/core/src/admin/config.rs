//! The `admin` section: where the filter's own endpoints live and the token
//! that opens them. A leaf of the config, apart from the endpoints themselves.

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{Setting, Table};

/// Default `admin.path_prefix`.
pub const DEFAULT_PREFIX: &str = PATH_PREFIX.default;
/// `path_prefix`.
const PATH_PREFIX: Setting<&str> = Setting::any("path_prefix", "/llm-filter");

/// The section's settings.
pub const SETTINGS: Table = &[("admin", &[&PATH_PREFIX])];
/// Shortest `admin.token`: a guessable token protects nothing.
const MIN_TOKEN_LEN: usize = 16;

crate::read_fields! {
    /// `admin` as written.
    #[derive(Debug, Default)]
    pub struct RawAdminConfig {
        /// Where the endpoints live.
        pub path_prefix: Option<String>,
        /// The bearer token; none: the endpoints answer 404.
        pub token: Option<String>,
    }
}

/// The compiled `admin` section.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Where the endpoints live, without a trailing `/`.
    pub path_prefix: String,
    /// The bearer token.
    pub token: Option<String>,
}

impl std::fmt::Debug for AdminConfig {
    // The token never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("path_prefix", &self.path_prefix)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Default for AdminConfig {
    /// The empty section: no token, so no endpoint answers.
    fn default() -> Self {
        Self {
            path_prefix: DEFAULT_PREFIX.to_string(),
            token: None,
        }
    }
}

impl AdminConfig {
    /// What follows the filter's own prefix in `path` (`""` or `/…`, query
    /// and fragment cut), `None` for a path outside it.
    pub fn own_rest<'p>(&self, path: &'p str) -> Option<&'p str> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let rest = path.strip_prefix(self.path_prefix.as_str())?;
        (rest.is_empty() || rest.starts_with('/')).then_some(rest)
    }

    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawAdminConfig) -> Result<Self, ConfigError> {
        let prefix = PATH_PREFIX.or_string(raw.path_prefix);
        let prefix = prefix.trim_end_matches('/').to_string();
        if !check::is_path_without_query(&prefix) {
            return Err(ConfigError::new(
                "path_prefix",
                format!("{prefix:?} is not an absolute path without query, other than /"),
            ));
        }
        if let Some(t) = &raw.token {
            if t.len() < MIN_TOKEN_LEN || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError::new(
                    "token",
                    format!("must be at least {MIN_TOKEN_LEN} visible ASCII characters"),
                ));
            }
        }
        Ok(Self {
            path_prefix: prefix,
            token: raw.token,
        })
    }
}
