//! Which build this is: the full module, or the sidecar module that leaves
//! the gateway tier's features out (filter/core/Cargo.toml). A configuration
//! naming a part this build does not have is refused at load, naming the
//! field and the build, never silently ignored.

use serde_json::{Map, Value};

use crate::config::ConfigError;

/// The build's name, as the messages and the state say it.
pub const NAME: &str = if cfg!(feature = "full") {
    "full"
} else {
    "sidecar"
};

/// Every part of the document a feature owns (its path), and whether this
/// build has it.
const PARTS: &[(&str, bool)] = &[
    ("cache", cfg!(feature = "cache")),
    ("routing", cfg!(feature = "routing")),
    ("limits", cfg!(feature = "limits")),
    ("guardrails", cfg!(feature = "guardrails")),
    ("credentials", cfg!(feature = "credentials")),
    ("tracing.otlp", cfg!(feature = "spans")),
    ("tracing.capture", cfg!(feature = "spans")),
];

/// The parts of the document `doc` names that this build does not have:
/// the first one refused.
pub fn check(doc: &[u8]) -> Result<(), ConfigError> {
    if PARTS.iter().all(|&(_, has)| has) {
        return Ok(());
    }
    // The document is parsed strictly afterwards; here only its shape.
    let Ok(top) = serde_json::from_slice::<Map<String, Value>>(doc) else {
        return Ok(());
    };
    match PARTS.iter().find(|&&(path, has)| !has && names(&top, path)) {
        Some(&(path, _)) => Err(missing(path)),
        None => Ok(()),
    }
}

/// The refusal of `path`.
fn missing(path: &str) -> ConfigError {
    ConfigError::new(
        path,
        format!("`{path}` is not in the {NAME} build of the module; use the full build"),
    )
}

/// True when `top` has a value (even `{}`, but not `null`) at the dotted `path`.
fn names(top: &Map<String, Value>, path: &str) -> bool {
    let mut keys = path.split('.');
    let mut at = keys.next().and_then(|k| top.get(k));
    for key in keys {
        at = at.and_then(|v| v.get(key));
    }
    at.is_some_and(|v| !v.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_named_by_any_value_but_null() {
        let top: Map<String, Value> =
            serde_json::from_str(r#"{"cache":{},"tracing":{"otlp":null,"mode":"off"}}"#).unwrap();
        assert!(names(&top, "cache"));
        assert!(!names(&top, "routing"));
        assert!(!names(&top, "tracing.otlp"));
        assert!(names(&top, "tracing.mode"));
        assert!(!names(&top, "tracing.mode.x"));
    }

    #[test]
    fn the_refusal_names_the_field_and_the_build() {
        let e = missing("cache");
        assert_eq!(e.field, "cache");
        assert!(
            e.message.contains(&format!("{NAME} build")),
            "{}",
            e.message
        );
    }

    /// Every part this build leaves out is refused when named, and only then.
    #[test]
    fn a_part_the_build_leaves_out_is_refused_at_load() {
        for &(path, has) in PARTS {
            let mut doc = String::from("{}");
            for key in path.rsplit('.') {
                doc = format!(r#"{{"{key}":{doc}}}"#);
            }
            let parsed = crate::config::Config::parse(doc.as_bytes());
            if has {
                // Read as the section reads it (an empty one may lack a
                // required field), never refused as absent.
                let refused = parsed.is_err_and(|e| e.message.contains("not in the"));
                assert!(!refused, "{path}");
            } else {
                let e = parsed.unwrap_err();
                assert_eq!(e.field, path);
                assert!(
                    e.message.contains("not in the sidecar build"),
                    "{}",
                    e.message
                );
            }
        }
        assert!(check(b"{}").is_ok());
        assert!(check(b"{\"budget\":{}}").is_ok());
    }
}
