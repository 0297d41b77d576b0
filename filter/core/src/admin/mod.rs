//! The filter's own endpoints under `admin.path_prefix`, answered locally on
//! any route and never forwarded: `POST <prefix>/alerts` takes Alertmanager's
//! webhook, `GET <prefix>/state` shows the degrade levels and active alerts.
//! Both need `authorization: Bearer <admin.token>`; without a token configured
//! the paths answer 404, so nothing can change the filter's state.

pub mod config;

pub use config::{AdminConfig, RawAdminConfig, DEFAULT_PREFIX};

/// Largest webhook body accepted (a bound the pages state in every build).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

#[cfg_attr(not(feature = "admin"), path = "endpoints_off.rs")]
mod endpoints;

pub use endpoints::*;
