//! Which build this is: the full module, or the sidecar module that leaves
//! the gateway tier's features out (filter/core/Cargo.toml). A configuration
//! naming a part this build does not have is refused at load, naming the
//! field and the build, never silently ignored.

use serde_json::Value;

use crate::config::ConfigError;

/// The build's name, as the messages and the state say it.
pub const NAME: &str = if cfg!(feature = "full") {
    "full"
} else {
    "sidecar"
};

/// The build has the response cache.
pub const CACHE: bool = cfg!(feature = "cache");
/// The build has routing.
pub const ROUTING: bool = cfg!(feature = "routing");
/// The build has limits.
pub const LIMITS: bool = cfg!(feature = "limits");
/// The build has the guardrails.
pub const GUARDRAILS: bool = cfg!(feature = "guardrails");
/// The build has mesh credentials.
pub const CREDENTIALS: bool = cfg!(feature = "credentials");
/// The build exports spans.
pub const SPANS: bool = cfg!(feature = "spans");
/// The build has A/B groups.
pub const AB: bool = cfg!(feature = "ab");
/// The build has the admin endpoints.
pub const ADMIN: bool = cfg!(feature = "admin");

/// Every part of the document a feature owns, and whether this build has
/// it: a dotted path, where `[]` is every element of an array and `*` every
/// member of an object.
const PARTS: &[(&str, bool)] = &[
    ("cache", CACHE),
    ("routing", ROUTING),
    ("limits", LIMITS),
    ("guardrails", GUARDRAILS),
    ("credentials", CREDENTIALS),
    ("tracing.otlp", SPANS),
    ("tracing.capture", SPANS),
    ("admin", ADMIN),
    ("ab.groups.[].overrides.routing", ROUTING),
    ("ab.groups.[].overrides.cache", CACHE),
    // After its parts: a group overriding a part is refused at the part.
    ("ab", AB),
];

/// Every degrade action a feature owns (the action's spelling), where the
/// actions are listed, and whether this build has it.
const ACTIONS: &[(&str, bool)] = &[("cache", CACHE)];
const ACTION_LISTS: &[&str] = &[
    "degrade.levels.*.*.[]",
    "ab.groups.[].overrides.degrade.levels.*.*.[]",
];

/// This build has every part: nothing to check (known at compile time, so
/// the full build carries no checking code).
const COMPLETE: bool = has_all(PARTS) && has_all(ACTIONS);

const fn has_all(parts: &[(&str, bool)]) -> bool {
    match parts {
        [] => true,
        [(_, has), rest @ ..] => *has && has_all(rest),
    }
}

/// The parts of the document `top` names that this build does not have:
/// the first one refused.
pub fn check(top: &Value) -> Result<(), ConfigError> {
    if COMPLETE {
        return Ok(());
    }
    for &(path, has) in PARTS {
        if let Some(at) = (!has).then(|| found(top, path)).flatten() {
            return Err(missing(&at, &format!("`{}`", last_key(path))));
        }
    }
    for &(action, _) in ACTIONS.iter().filter(|(_, has)| !has) {
        for list in ACTION_LISTS {
            let mut hits = Vec::new();
            walk(top, list, String::new(), &mut hits);
            if let Some((at, _)) = hits.into_iter().find(|(_, v)| v.as_str() == Some(action)) {
                return Err(missing(&at, &format!("the `{action}` action")));
            }
        }
    }
    Ok(())
}

/// The refusal of what `what` names at `path`.
fn missing(path: &str, what: &str) -> ConfigError {
    ConfigError::new(
        path,
        format!("{what} is not in the {NAME} build of the module; use the full build"),
    )
}

fn last_key(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// The first place (its concrete path) where `top` has a value other than
/// `null` at the pattern `path`.
fn found(top: &Value, path: &str) -> Option<String> {
    let mut hits = Vec::new();
    walk(top, path, String::new(), &mut hits);
    hits.into_iter()
        .find(|(_, v)| !v.is_null())
        .map(|(at, _)| at)
}

/// Every value at the pattern `path` under `at` (whose path is `here`).
fn walk<'v>(at: &'v Value, path: &str, here: String, out: &mut Vec<(String, &'v Value)>) {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None if path.is_empty() => {
            out.push((here, at));
            return;
        }
        None => (path, None),
    };
    let join = |key: &str| match here.is_empty() {
        true => key.to_string(),
        false => format!("{here}.{key}"),
    };
    let next: Vec<(String, &Value)> = match (head, at) {
        ("[]", Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("{here}[{i}]"), v))
            .collect(),
        ("*", Value::Object(m)) => m.iter().map(|(k, v)| (join(k), v)).collect(),
        (key, Value::Object(m)) => m.get(key).map(|v| (join(key), v)).into_iter().collect(),
        _ => Vec::new(),
    };
    for (path_here, v) in next {
        walk(v, rest.unwrap_or(""), path_here, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(doc: &str, path: &str) -> Option<String> {
        found(&serde_json::from_str(doc).unwrap(), path)
    }

    #[test]
    fn a_part_is_named_by_any_value_but_null_wherever_the_pattern_reaches() {
        let doc = r#"{"cache":{},"tracing":{"otlp":null,"mode":"off"},
            "ab":{"groups":[{"name":"a"},{"name":"b","overrides":{"cache":{"enabled":false}}}]}}"#;
        assert_eq!(at(doc, "cache").as_deref(), Some("cache"));
        assert_eq!(at(doc, "routing"), None);
        assert_eq!(at(doc, "tracing.otlp"), None);
        assert_eq!(at(doc, "tracing.mode").as_deref(), Some("tracing.mode"));
        assert_eq!(at(doc, "tracing.mode.x"), None);
        assert_eq!(
            at(doc, "ab.groups.[].overrides.cache").as_deref(),
            Some("ab.groups[1].overrides.cache")
        );
        assert_eq!(at(doc, "ab.groups.[].overrides.routing"), None);
    }

    #[test]
    fn the_refusal_names_the_field_and_the_build() {
        let e = missing("cache", "`cache`");
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
                doc = match key {
                    "[]" => format!("[{doc}]"),
                    key => format!(r#"{{"{key}":{doc}}}"#),
                };
            }
            let parsed = crate::config::Config::parse(doc.as_bytes());
            let refused = parsed
                .as_ref()
                .err()
                .filter(|e| e.message.contains("is not in the"));
            if has {
                // Read as the section reads it (an empty one may lack a
                // required field), never refused as absent.
                assert!(refused.is_none(), "{path}");
            } else {
                let e = refused.unwrap_or_else(|| panic!("{path}: {parsed:?}"));
                assert_eq!(e.field, path.replace(".[]", "[0]"));
                assert!(
                    e.message.contains("not in the sidecar build"),
                    "{}",
                    e.message
                );
            }
        }
        assert!(check(&serde_json::json!({})).is_ok());
        assert!(check(&serde_json::json!({"budget": {}})).is_ok());
    }

    /// A degrade action whose feature the build leaves out is refused where
    /// it is listed; the others load.
    #[test]
    fn a_degrade_action_the_build_leaves_out_is_refused() {
        let doc = br#"{"degrade":{"levels":{"2":{"P2":["shed"],"P1":["max_tokens","cache"]}}}}"#;
        match check(&serde_json::from_slice(doc).unwrap()) {
            Ok(()) => assert!(ACTIONS.iter().all(|&(_, has)| has)),
            Err(e) => {
                assert_eq!(e.field, "degrade.levels.2.P1[1]");
                assert!(e
                    .message
                    .starts_with("the `cache` action is not in the sidecar build"));
            }
        }
        let fine = br#"{"degrade":{"levels":{"2":{"P2":["shed"]}}}}"#;
        assert!(check(&serde_json::from_slice(fine).unwrap()).is_ok());
    }
}
