//! A/B groups: each user is put in one group by a stable hash of their key, so
//! a variant (another model table entry, other shaping caps, the cache off,
//! other degrade actions) can be tried on a share of users and compared per
//! group in the metrics.
//!
//! The rule: FNV-1a 32-bit of the user key, modulo 100, picks the
//! first group whose cumulative `percent` exceeds it. The key is the
//! `ab.user_header` request header, else the body's `user`; a call without a
//! key goes to the first group.

use serde::Deserialize;
use serde_json::Value;

use crate::build;
use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::read::Read;
use crate::config::setting::{Empty, Setting, Table};
use crate::degrade::config::{DegradeConfig, RawDegradeConfig, RawDegradeOverride};
use crate::routing::config::{RawBackend, RawRoutingConfig, RoutingConfig};
use crate::shaping::{RawShapingConfig, ShapingConfig};

/// Header naming the user, unless `ab.user_header` says otherwise.
pub const DEFAULT_USER_HEADER: &str = USER_HEADER.default;
/// `user_header`.
const USER_HEADER: Setting<&str> = Setting::any("user_header", "x-user-id");
/// A group's `percent`.
const PERCENT: Setting<u8> = Setting::range("percent", 0, 0, 100);
/// The section's settings.
pub const SETTINGS: Table = &[
    ("ab", &[&Empty::list("groups"), &USER_HEADER]),
    ("ab.groups[]", &[&PERCENT]),
];
/// Header carrying the call's group upstream and back to the client.
pub const GROUP_HEADER: &str = "x-user-group";
/// The baggage member carrying the group to every later hop.
pub const BAGGAGE_KEY: &str = "user_group";
/// Most groups: each is a label value on the request metrics.
pub const MAX_GROUPS: usize = 16;
/// Longest group name.
const MAX_NAME_LEN: usize = 32;

/// `ab` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawAbConfig {
    /// Request header naming the user, default `x-user-id`.
    pub user_header: Option<String>,
    /// The groups, in order; their percents sum to 100.
    pub groups: Vec<RawGroup>,
}

/// One group as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawGroup {
    /// Name: a label value and a header value, `[A-Za-z0-9_-]`, 1 to 32 bytes.
    pub name: String,
    /// Share of users, 0 to 100.
    pub percent: u8,
    /// What this group does differently.
    pub overrides: RawOverrides,
}

/// `overrides` of a group as written: each part replaces the top-level one
/// for the group's calls.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawOverrides {
    // A part whose feature the build leaves out is not read (`build`
    // refuses a document that names it): its parser is not in the module.
    /// Routing: entries of the model table that replace the top-level ones.
    #[cfg_attr(not(feature = "routing"), serde(skip))]
    pub routing: Option<RawRoutingOverride>,
    /// Shaping fields that replace the top-level ones (read as the
    /// top-level section is, [`RawShapingConfig`]).
    pub shaping: Option<Value>,
    /// The response cache on or off.
    #[cfg_attr(not(feature = "cache"), serde(skip))]
    pub cache: Option<RawCacheOverride>,
    /// What the degrade levels do to the group's calls (the levels
    /// themselves stay the model's, shared by every group), a
    /// [`RawDegradeOverride`].
    pub degrade: Option<Value>,
}

/// `overrides.routing` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawRoutingOverride {
    /// Model name → backends, replacing that model's top-level entry.
    pub models: std::collections::BTreeMap<String, Vec<RawBackend>>,
}

/// `overrides.cache` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCacheOverride {
    /// The cache on or off for the group.
    pub enabled: Option<bool>,
}

/// Compiled `ab`.
#[derive(Debug, Clone, PartialEq)]
pub struct AbConfig {
    /// Request header naming the user.
    pub user_header: String,
    /// The groups; none when A/B is off.
    pub groups: Vec<Group>,
}

impl Default for AbConfig {
    /// The empty section: no groups, A/B off.
    fn default() -> Self {
        Self {
            user_header: USER_HEADER.default.to_string(),
            groups: Vec::new(),
        }
    }
}

/// One compiled group.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Its name.
    pub name: String,
    /// Its share of users, percent.
    pub percent: u8,
    /// The routing of its calls, when its model table differs.
    pub routing: Option<RoutingConfig>,
    /// The shaping of its calls, when it differs.
    pub shaping: Option<ShapingConfig>,
    /// The cache on or off for its calls, when it differs.
    pub cache: Option<bool>,
    /// The degrade actions of its calls, when they differ; only the
    /// per-level actions and their parameters of it are read, the level
    /// comes from the top-level section.
    pub degrade: Option<DegradeConfig>,
}

/// What a group's overrides are compiled against: the top-level sections
/// as written, and whether the top-level cache is on.
pub struct Base<'a> {
    /// `routing` as written.
    pub routing: &'a RawRoutingConfig,
    /// `shaping` as written.
    pub shaping: &'a RawShapingConfig,
    /// `cache.enabled` as compiled.
    pub cache: bool,
    /// `degrade` as written.
    pub degrade: &'a RawDegradeConfig,
}

impl AbConfig {
    /// Compiles the section; errors name fields relative to it. The one
    /// section that also takes what it is compiled against: a group's
    /// overrides are compiled over the top-level sections in `base`.
    pub fn compile(raw: RawAbConfig, base: &Base<'_>) -> Result<Self, ConfigError> {
        let user_header = USER_HEADER.or_string(raw.user_header);
        if !check::is_header_name(&user_header) {
            return Err(ConfigError::new(
                USER_HEADER.name,
                format!("{user_header:?} is not a lowercase HTTP header name"),
            ));
        }
        check::at_most("groups", &raw.groups, MAX_GROUPS, "groups")?;
        let mut groups: Vec<Group> = Vec::with_capacity(raw.groups.len());
        for (i, g) in raw.groups.into_iter().enumerate() {
            let at = format!("groups[{i}]");
            if !check::is_label(&g.name, MAX_NAME_LEN) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("{:?} is not 1 to {MAX_NAME_LEN} of [A-Za-z0-9_-]", g.name),
                ));
            }
            if groups.iter().any(|o| o.name == g.name) {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format!("{:?} names two groups", g.name),
                ));
            }
            let percent = PERCENT.check(g.percent).map_err(|e| e.within(&at))?;
            groups.push(compile_group(g, percent, base).map_err(|e| e.within(&at))?);
        }
        let total: u32 = groups.iter().map(|g| u32::from(g.percent)).sum();
        if !groups.is_empty() && total != 100 {
            return Err(ConfigError::new(
                "groups",
                format!("the percents sum to {total}, not 100"),
            ));
        }
        Ok(Self {
            user_header,
            groups,
        })
    }

    /// The index of the group of a user with `key` (`None` key: the first
    /// group); `None` when A/B is off.
    pub fn assign(&self, key: Option<&str>) -> Option<usize> {
        if self.groups.is_empty() {
            return None;
        }
        let Some(key) = key else {
            return Some(0);
        };
        let bucket = fnv1a32(key.as_bytes()) % 100;
        let mut upto = 0u32;
        for (i, g) in self.groups.iter().enumerate() {
            upto += u32::from(g.percent);
            if bucket < upto {
                return Some(i);
            }
        }
        // Unreachable with percents summing to 100.
        Some(0)
    }

    /// Some group overrides routing or shaping, which read the body.
    pub fn needs_body(&self) -> bool {
        self.groups
            .iter()
            .any(|g| g.routing.is_some() || g.shaping.is_some())
    }
}

fn compile_group(g: RawGroup, percent: u8, base: &Base<'_>) -> Result<Group, ConfigError> {
    // Never written in a build without routing: nor is its compiler in it.
    let routing = match g.overrides.routing.filter(|_| build::ROUTING) {
        None => None,
        Some(over) => {
            if let Some(m) = over
                .models
                .keys()
                .find(|m| !base.routing.models.contains_key(*m))
            {
                return Err(ConfigError::new(
                    format!("overrides.routing.models.{m}"),
                    format!("{m:?} is not in the top-level routing.models, whose entry it would replace"),
                ));
            }
            let mut raw = base.routing.clone();
            raw.models.extend(over.models);
            Some(RoutingConfig::compile(raw).map_err(|e| e.within("overrides.routing"))?)
        }
    };
    let shaping = match g.overrides.shaping {
        None => None,
        Some(over) => Some(
            RawShapingConfig::read(&over)
                .and_then(|over| ShapingConfig::compile(base.shaping.overridden_by(&over)))
                .map_err(|e| e.within("overrides.shaping"))?,
        ),
    };
    let cache = g.overrides.cache.and_then(|c| c.enabled);
    if cache == Some(true) && !base.cache {
        // The cache's shared table is laid out only when it is on.
        return Err(ConfigError::new(
            "overrides.cache.enabled",
            "a group cannot turn on a cache that is off at the top level: \
             turn it on there and off in the other groups",
        ));
    }
    let degrade = match g.overrides.degrade {
        None => None,
        Some(over) => Some(
            RawDegradeOverride::read(&over)
                .and_then(|over| base.degrade.overridden_by(over))
                .and_then(DegradeConfig::compile)
                .map_err(|e| e.within("overrides.degrade"))?,
        ),
    };
    Ok(Group {
        name: g.name,
        percent,
        routing,
        shaping,
        cache,
        degrade,
    })
}

/// FNV-1a, 32 bits.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u32::from(*b)).wrapping_mul(PRIME))
}

#[cfg(all(test, feature = "ab"))]
mod tests {
    use super::*;

    fn parse(doc: &str) -> Result<AbConfig, ConfigError> {
        let raw: RawAbConfig = ConfigError::from_json(doc.as_bytes())?;
        let routing: RawRoutingConfig = serde_json::from_str(
            r#"{"models":{"gpt-4o":[{"cluster":"a"}],"small":[{"cluster":"s"}]}}"#,
        )
        .unwrap();
        let shaping = RawShapingConfig::default();
        let degrade: RawDegradeConfig = crate::config::read::parse(
            br#"{"levels":{"1":{"P2":["temperature"]}},"max_tokens_cap":100}"#,
        )
        .unwrap();
        AbConfig::compile(
            raw,
            &Base {
                routing: &routing,
                shaping: &shaping,
                cache: false,
                degrade: &degrade,
            },
        )
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn users_spread_by_percent_and_stay_put() {
        let c =
            parse(r#"{"groups":[{"name":"a","percent":70},{"name":"b","percent":30}]}"#).unwrap();
        let mut counts = [0u32; 2];
        for u in 0..10_000 {
            let key = format!("user-{u}");
            let g = c.assign(Some(&key)).unwrap();
            assert_eq!(c.assign(Some(&key)), Some(g));
            counts[g] += 1;
        }
        assert!((6_700..7_300).contains(&counts[0]), "{counts:?}");
        assert_eq!(c.assign(None), Some(0));
        // By the rule: bucket = fnv % 100, then cumulative percents.
        let bucket = fnv1a32(b"alice") % 100;
        assert_eq!(c.assign(Some("alice")), Some(usize::from(bucket >= 70)));
        assert_eq!(AbConfig::default().assign(Some("x")), None);
    }

    #[test]
    fn overrides_compile_against_the_top_level() {
        let c = parse(
            r#"{"user_header":"x-tenant-user","groups":[{"name":"control","percent":50},
            {"name":"b","percent":50,"overrides":{"routing":{"models":{"gpt-4o":[{"cluster":"b"}]}},
             "shaping":{"max_tokens_cap":128},"cache":{"enabled":false}}}]}"#,
        )
        .unwrap();
        assert_eq!(c.user_header, "x-tenant-user");
        let b = &c.groups[1];
        let routing = b.routing.as_ref().unwrap();
        assert_eq!(routing.backends("gpt-4o").unwrap()[0].cluster, "b");
        assert_eq!(routing.backends("small").unwrap()[0].cluster, "s");
        assert_eq!(
            b.shaping
                .as_ref()
                .unwrap()
                .limits(crate::priority::Priority::P2)
                .max_tokens,
            Some(128)
        );
        assert_eq!(b.cache, Some(false));
        assert!(c.needs_body());
        assert_eq!(c.groups[0].routing, None);
    }

    #[test]
    fn degrade_overrides_replace_the_levels_they_name() {
        use crate::degrade::Action;
        use crate::priority::Priority;
        let c = parse(
            r#"{"groups":[{"name":"control","percent":50},
            {"name":"b","percent":50,"overrides":{"degrade":{
              "levels":{"2":{"P1":["max_tokens"],"P2":["max_tokens","temperature"]}},
              "fallback_model":{"gpt-4o":"small"},"max_tokens_cap":32,"retry_after_s":9}}}]}"#,
        )
        .unwrap();
        assert_eq!(c.groups[0].degrade, None);
        let d = c.groups[1].degrade.as_ref().unwrap();
        assert_eq!(d.actions(2, Priority::P1), [Action::MaxTokens]);
        assert_eq!(
            d.actions(2, Priority::P2),
            [Action::MaxTokens, Action::Temperature]
        );
        // Level 1 is the top level's (temperature for P2), level 3 the default.
        assert_eq!(d.actions(1, Priority::P2), [Action::Temperature]);
        assert_eq!(d.actions(3, Priority::P2), [Action::Reject]);
        assert_eq!((d.max_tokens_cap, d.retry_after_s), (32, 9));
        assert_eq!(d.fallback_model["gpt-4o"], "small");
        // An override of the cap alone keeps the top-level levels.
        let c = parse(
            r#"{"groups":[{"name":"a","percent":100,"overrides":{"degrade":{"max_tokens_cap":8}}}]}"#,
        )
        .unwrap();
        let d = c.groups[0].degrade.as_ref().unwrap();
        assert_eq!(d.actions(1, Priority::P2), [Action::Temperature]);
        assert_eq!(d.max_tokens_cap, 8);
    }

    #[test]
    fn degrade_overrides_leave_the_level_global() {
        for (over, field) in [
            (
                r#"{"thresholds":[]}"#,
                "groups[0].overrides.degrade.thresholds",
            ),
            (r#"{"alerts":[]}"#, "groups[0].overrides.degrade.alerts"),
            (
                r#"{"alert_ttl_s":5}"#,
                "groups[0].overrides.degrade.alert_ttl_s",
            ),
            (
                r#"{"levels":{"4":{}}}"#,
                "groups[0].overrides.degrade.levels.4",
            ),
            (
                r#"{"levels":{"1":{"P0":["shed"]}}}"#,
                "groups[0].overrides.degrade.levels.1.P0",
            ),
            (
                r#"{"levels":{"1":{"P1":["fallback_model"]}}}"#,
                "groups[0].overrides.degrade.levels.1.P1",
            ),
            (
                r#"{"max_tokens_cap":0}"#,
                "groups[0].overrides.degrade.max_tokens_cap",
            ),
            (r#"{"nap":1}"#, "groups[0].overrides.degrade.nap"),
        ] {
            let doc = format!(
                r#"{{"groups":[{{"name":"a","percent":100,"overrides":{{"degrade":{over}}}}}]}}"#
            );
            let e = parse(&doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
        }
        let e = parse(
            r#"{"groups":[{"name":"a","percent":100,"overrides":{"degrade":{"thresholds":[]}}}]}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("shared by every group"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        for (doc, field) in [
            (r#"{"groups":[{"name":"a","percent":60}]}"#, "groups"),
            (
                r#"{"groups":[{"name":"a","percent":50},{"name":"a","percent":50}]}"#,
                "groups[1].name",
            ),
            (
                r#"{"groups":[{"name":"a b","percent":100}]}"#,
                "groups[0].name",
            ),
            (
                r#"{"groups":[{"name":"","percent":100}]}"#,
                "groups[0].name",
            ),
            (
                r#"{"groups":[{"name":"a","percent":101}]}"#,
                "groups[0].percent",
            ),
            (
                r#"{"groups":[{"name":"a","percent":100,"x":1}]}"#,
                "groups[0].x",
            ),
            (
                r#"{"groups":[{"name":"a","percent":100,"overrides":{"shaping":{"max_tokens_cap":0}}}]}"#,
                "groups[0].overrides.shaping.max_tokens_cap",
            ),
            (
                r#"{"groups":[{"name":"a","percent":100,"overrides":{"routing":{"models":{"m":[]}}}}]}"#,
                "groups[0].overrides.routing.models.m",
            ),
            (
                r#"{"groups":[{"name":"a","percent":100,"overrides":{"cache":{"ttl_s":1}}}]}"#,
                "groups[0].overrides.cache.ttl_s",
            ),
            (r#"{"user_header":"X-User"}"#, "user_header"),
            (
                r#"{"groups":[{"name":"a","percent":100,"overrides":{"cache":{"enabled":true}}}]}"#,
                "groups[0].overrides.cache.enabled",
            ),
            (
                r#"{"groups":[{"name":"a","percent":100,"overrides":{"routing":{"models":{"new":[{"cluster":"x"}]}}}}]}"#,
                "groups[0].overrides.routing.models.new",
            ),
        ] {
            let e = parse(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
        }
    }
}
