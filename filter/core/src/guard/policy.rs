//! The `guardrails` section and what it does with a prompt: each rule names
//! what it looks for (built-in detectors by name or by group, glob
//! patterns, words and phrases) and what is done with a call where it finds
//! something: `block` (refused in the caller's API shape, nothing sent,
//! nothing cached), `mask` (each value replaced by its placeholder before
//! the call leaves, the same value by the same placeholder within a call)
//! or `log` (counted and named in the span and the record). A value two
//! rules find falls under the stricter. The check reads the texts of the
//! fields the call's dialect keeps its prompt in, decoded, within a budget
//! of bytes: a prompt longer than the budget is not checked whole, which
//! [`Verdict::truncated`] says, and the walk treats as a body it could not
//! read.

use serde::Deserialize;
use serde_json::Value;

pub use super::action::Action;
use super::service::{GuardService, RawGuardService};
pub use super::side::{On, Side};
use super::{string_at, Budget, Custom, Detector, DetectorId, Detectors, Finding, Set, Vault};
use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{Named, Setting, Table};
use crate::json::Json;
use crate::pricing;
use crate::priority::Priority;

/// `unchecked`: what becomes of a call whose prompt could not be read whole.
const UNCHECKED: Named<Unchecked> = Named {
    name: "unchecked",
    default: Unchecked::Refuse,
    spell: Unchecked::as_str,
};
/// `max_scan_bytes`: the bytes of prompt text read per call.
const MAX_SCAN_BYTES: Setting<u64> = Setting::range("max_scan_bytes", 2 << 20, 1024, 64 << 20);

/// The section's settings.
pub const SETTINGS: Table = &[
    ("guardrails", &[&UNCHECKED, &MAX_SCAN_BYTES]),
    ("guardrails.service", super::service::SETTINGS),
];

/// Most models a rule names.
const MAX_MODELS: usize = 32;

/// Most findings a call's check makes before it stops (truncated).
const MAX_FINDINGS: usize = 4_096;

/// What becomes of a call whose prompt the rules could not read whole (the
/// body streams through unheld, is not JSON, or is longer than
/// `max_scan_bytes`), when a rule blocks or masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unchecked {
    /// Refused (413), as a call the rules would have refused.
    #[default]
    Refuse,
    /// Let through unchecked, and counted.
    Allow,
}

impl Unchecked {
    /// The name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::Allow => "allow",
        }
    }
}

/// A rule as written. Read from the JSON value by hand: a derived reader
/// of its own would cost the module more than this.
#[derive(Debug, Default)]
struct RawRule {
    name: String,
    detect: Vec<String>,
    globs: Vec<String>,
    words: Vec<String>,
    action: Option<String>,
    on: Option<String>,
    restore: bool,
    priorities: Vec<String>,
    models: Vec<String>,
}

impl RawRule {
    /// Rule `k` of `rules`, each field of the right type, no other.
    fn read(k: usize, value: &Value) -> Result<Self, ConfigError> {
        let at = |f: &str| format!("rules[{k}]{f}");
        let Value::Object(members) = value else {
            return Err(ConfigError::new(at(""), "is not an object"));
        };
        let mut r = Self::default();
        for (name, v) in members {
            let field = at(&format!(".{name}"));
            let list = |v: &Value| -> Result<Vec<String>, ConfigError> {
                match v {
                    Value::Null => Ok(Vec::new()),
                    Value::Array(items) => items
                        .iter()
                        .map(|i| i.as_str().map(str::to_string))
                        .collect::<Option<_>>()
                        .ok_or_else(|| ConfigError::new(&field, "is not a list of strings")),
                    _ => Err(ConfigError::new(&field, "is not a list of strings")),
                }
            };
            match name.as_str() {
                "name" | "action" | "on" => {
                    let s = v
                        .as_str()
                        .ok_or_else(|| ConfigError::new(&field, "is not a string"))?
                        .to_string();
                    match name.as_str() {
                        "name" => r.name = s,
                        "action" => r.action = Some(s),
                        _ => r.on = Some(s),
                    }
                }
                "restore" => {
                    r.restore = v
                        .as_bool()
                        .ok_or_else(|| ConfigError::new(&field, "is not a boolean"))?;
                }
                "detect" => r.detect = list(v)?,
                "priorities" => r.priorities = list(v)?,
                "models" => r.models = list(v)?,
                "globs" => r.globs = list(v)?,
                "words" => r.words = list(v)?,
                _ => return Err(ConfigError::new(field, "is no field of a rule")),
            }
        }
        Ok(r)
    }
}

/// `guardrails` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawGuardrails {
    /// The rules, a list of objects.
    pub rules: Option<Value>,
    /// `refuse` or `allow`.
    pub unchecked: Option<String>,
    /// Bytes of prompt text read per call.
    pub max_scan_bytes: Option<u64>,
    /// A guardrail service asked about each prompt, an object.
    pub service: Option<Value>,
}

/// A compiled rule.
#[derive(Clone, PartialEq)]
pub struct Rule {
    /// Its name.
    pub name: String,
    /// The built-in detectors it names.
    detect: Set,
    /// Its glob patterns and words, which the detectors were built from
    /// (kept to tell two configurations apart; never printed).
    custom: (Vec<String>, Vec<String>),
    /// What it does.
    pub action: Action,
    /// Where it looks.
    pub on: On,
    /// What it masked in the prompt is put back in the answer.
    pub restore: bool,
    /// The calls it applies to: by priority (none: all), and by model
    /// (exact names, or a prefix and `*`; none: all).
    priorities: Vec<Priority>,
    models: Vec<String>,
}

/// The compiled `guardrails` section; no rule: off.
#[derive(Debug, Clone)]
pub struct Guardrails {
    /// The rules, in the order written.
    pub rules: Vec<Rule>,
    /// Every rule's detectors, built once; `None` without rules.
    detectors: Option<Detectors>,
    /// The rule of each of the detectors' custom rules.
    custom_rule: Vec<usize>,
    /// What becomes of a call that could not be checked whole.
    pub unchecked: Unchecked,
    /// Bytes of prompt text read per call.
    pub max_scan_bytes: usize,
    /// The guardrail service asked about each prompt.
    pub service: Option<GuardService>,
}

impl Rule {
    /// Rule `k` as written, its name none of `before`'s.
    fn compile(k: usize, r: RawRule, before: &[Rule]) -> Result<Self, ConfigError> {
        let field = |f: &str| format!("rules[{k}].{f}");
        if !check::is_label(&r.name, 64) || before.iter().any(|o| o.name == r.name) {
            return Err(ConfigError::new(
                field("name"),
                "a rule's name is 1 to 64 of `A-Za-z0-9_-`, each rule's its own",
            ));
        }
        let mut detect = Set::NONE;
        for (j, name) in r.detect.iter().enumerate() {
            let group = match name.as_str() {
                "secrets" => Set::SECRETS,
                "personal" => Set::PERSONAL,
                n => match DetectorId::from_name(n) {
                    Some(id) => Set::NONE.with(id),
                    None => {
                        return Err(ConfigError::new(
                            field(&format!("detect[{j}]")),
                            format!("{n:?} is no built-in detector, `secrets` or `personal`"),
                        ))
                    }
                },
            };
            detect = group.iter().fold(detect, Set::with);
        }
        if detect.is_empty() && r.globs.is_empty() && r.words.is_empty() {
            return Err(ConfigError::new(
                field("detect"),
                "a rule names what it looks for: `detect`, `globs` or `words`",
            ));
        }
        let action = match r.action.as_deref() {
            None => Action::Block,
            Some(a) => Action::parse(a)
                .ok_or_else(|| ConfigError::new(field("action"), "is `block`, `mask` or `log`"))?,
        };
        let on = match r.on.as_deref() {
            None => On::Prompt,
            Some(o) => On::parse(o)
                .ok_or_else(|| ConfigError::new(field("on"), "is `prompt`, `answer` or `both`"))?,
        };
        let priorities = r
            .priorities
            .iter()
            .enumerate()
            .map(|(j, p)| {
                Priority::parse(p).filter(|_| p.len() == 2).ok_or_else(|| {
                    ConfigError::new(field(&format!("priorities[{j}]")), "is `P0`, `P1` or `P2`")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        check::at_most(&field("models"), &r.models, MAX_MODELS, "models")?;
        if let Some(j) = r.models.iter().position(|m| {
            let name = m.strip_suffix('*').unwrap_or(m);
            name.is_empty() || name.len() > 128 || name.contains('*')
        }) {
            return Err(ConfigError::new(
                field(&format!("models[{j}]")),
                "is a model's name, or a prefix of one and `*` (1 to 128 bytes)",
            ));
        }
        if r.restore && (action != Action::Mask || on == On::Answer) {
            return Err(ConfigError::new(
                field("restore"),
                "only a rule that masks the prompt restores",
            ));
        }
        Ok(Self {
            name: r.name,
            detect,
            custom: (r.globs, r.words),
            action,
            on,
            restore: r.restore,
            priorities,
            models: r.models,
        })
    }

    /// The rule applies to a call of `priority` asking for `model`.
    /// A model is named as a price or a prompt-cache entry names it
    /// ([`pricing::fit`]); no `*` alone is compiled, so a call without a
    /// model matches no rule that names models.
    fn applies(&self, priority: Priority, model: Option<&str>) -> bool {
        let named = || self.models.iter().any(|p| pricing::fit(p, model).is_some());
        (self.priorities.is_empty() || self.priorities.contains(&priority))
            && (self.models.is_empty() || named())
    }
}

/// Counts only: a deny-list may name what is not to be said.
impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("detect", &self.detect)
            .field("globs", &self.custom.0.len())
            .field("words", &self.custom.1.len())
            .field("action", &self.action)
            .field("on", &self.on)
            .field("restore", &self.restore)
            .field("priorities", &self.priorities)
            .field("models", &self.models)
            .finish()
    }
}

/// Two sections are the same when their rules and bounds are: the
/// detectors are built from the rules.
impl PartialEq for Guardrails {
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules
            && self.service == other.service
            && self.unchecked == other.unchecked
            && self.max_scan_bytes == other.max_scan_bytes
    }
}

impl Default for Guardrails {
    /// The empty section, as compiling `{}` gives it (the tests check): no
    /// rule. A build without guardrails holds it without holding the
    /// section's compiler.
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            detectors: None,
            custom_rule: Vec::new(),
            unchecked: UNCHECKED.default,
            max_scan_bytes: usize::try_from(MAX_SCAN_BYTES.default).unwrap_or(usize::MAX),
            service: None,
        }
    }
}

impl Guardrails {
    /// Compiles the section; errors name fields relative to it.
    pub fn compile(raw: RawGuardrails) -> Result<Self, ConfigError> {
        let written: Vec<RawRule> = match raw.rules {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(k, v)| RawRule::read(k, v))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(ConfigError::new("rules", "is not a list of rules")),
        };
        check::at_most("rules", &written, super::MAX_RULES, "rules")?;
        let mut rules: Vec<Rule> = Vec::with_capacity(written.len());
        for (k, r) in written.into_iter().enumerate() {
            let rule = Rule::compile(k, r, &rules)?;
            rules.push(rule);
        }
        let mut custom_rule = Vec::new();
        let mut customs = Vec::new();
        for (k, r) in rules.iter().enumerate() {
            let (globs, words) = &r.custom;
            if !globs.is_empty() || !words.is_empty() {
                custom_rule.push(k);
                customs.push(Custom {
                    name: &r.name,
                    globs,
                    words,
                });
            }
        }
        let builtins = rules
            .iter()
            .flat_map(|r| r.detect.iter())
            .fold(Set::NONE, Set::with);
        let detectors = match rules.is_empty() {
            true => None,
            false => Some(Detectors::new(builtins, &customs)?),
        };
        let unchecked = match raw.unchecked.as_deref() {
            None => UNCHECKED.default,
            Some("refuse") => Unchecked::Refuse,
            Some("allow") => Unchecked::Allow,
            Some(_) => return Err(ConfigError::new("unchecked", "is `refuse` or `allow`")),
        };
        let max_scan_bytes = MAX_SCAN_BYTES.read(raw.max_scan_bytes)?;
        let service = match raw.service {
            None | Some(Value::Null) => None,
            Some(s) => Some(
                RawGuardService::read(&s)
                    .and_then(GuardService::compile)
                    .map_err(|e| e.within("service"))?,
            ),
        };
        if let Some(s) = service
            .as_ref()
            .filter(|s| rules.iter().any(|r| r.name == s.name))
        {
            return Err(ConfigError::new(
                "service.name",
                format!(
                    "{:?} is a rule's name too; the service's is its own",
                    s.name
                ),
            ));
        }
        Ok(Self {
            rules,
            detectors,
            custom_rule,
            unchecked,
            max_scan_bytes: usize::try_from(max_scan_bytes).unwrap_or(usize::MAX),
            service,
        })
    }

    /// The detectors of every rule that blocks or masks, on either side:
    /// what a capture redacts besides its own rules, so no value these
    /// rules keep from the provider or the client (an answer's masked or
    /// refused text, a prompt's value restored in the answer, a prompt read
    /// past `max_scan_bytes`) is in a span or a record. `None` when no rule
    /// does.
    pub fn withheld(&self) -> Option<Detectors> {
        let strict = || self.rules.iter().filter(|r| r.action > Action::Log);
        let builtins = strict()
            .flat_map(|r| r.detect.iter())
            .fold(Set::NONE, Set::with);
        let customs: Vec<Custom<'_>> = strict()
            .filter(|r| !r.custom.0.is_empty() || !r.custom.1.is_empty())
            .map(|r| Custom {
                name: &r.name,
                globs: &r.custom.0,
                words: &r.custom.1,
            })
            .collect();
        if builtins.is_empty() && customs.is_empty() {
            return None;
        }
        Detectors::new(builtins, &customs).ok()
    }

    /// A rule or the service is configured.
    pub fn enabled(&self) -> bool {
        !self.rules.is_empty() || self.service.is_some()
    }

    /// A rule or the service looks at `side`.
    pub fn reads(&self, side: Side) -> bool {
        self.rules_read(side) || self.asks(side).is_some()
    }

    /// A rule looks at `side`.
    pub fn rules_read(&self, side: Side) -> bool {
        self.rules.iter().any(|r| r.on.covers(side))
    }

    /// The service, when it is asked about `side`.
    pub fn asks(&self, side: Side) -> Option<&GuardService> {
        self.service.as_ref().filter(|s| s.on.covers(side))
    }

    /// A rule of `side` (or the service asked about it) blocks or masks:
    /// what could not be checked falls under `unchecked`.
    pub fn enforces(&self, side: Side) -> bool {
        self.rules
            .iter()
            .any(|r| r.action > Action::Log && r.on.covers(side))
            || self.asks(side).is_some_and(|s| s.action > Action::Log)
    }

    /// The rules that apply to a call of `priority` asking for `model` (a
    /// bit each; all without scopes): what its [`Vault`] is limited to.
    pub fn applying(&self, priority: Priority, model: Option<&str>) -> u32 {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.applies(priority, model))
            .fold(0, |bits, (k, _)| bits | 1 << k)
    }

    /// The rule of `side` a finding of `detector` falls under, of the
    /// rules that apply to the call (`scope`, a bit each): the custom rule
    /// it is, or the strictest rule naming the built-in (the first written
    /// of equals).
    fn rule_of(&self, detector: Detector, side: Side, scope: u32) -> Option<usize> {
        let on = |k: usize, r: &Rule| r.on.covers(side) && scope >> k & 1 == 1;
        match detector {
            Detector::Custom(k) => self
                .custom_rule
                .get(usize::from(k))
                .copied()
                .filter(|k| self.rules.get(*k).is_some_and(|r| on(*k, r))),
            Detector::Builtin(id) => self
                .rules
                .iter()
                .enumerate()
                .filter(|(k, r)| r.detect.has(id) && on(*k, r))
                .max_by(|(i, a), (j, b)| a.action.cmp(&b.action).then(j.cmp(i)))
                .map(|(i, _)| i),
        }
    }

    /// A prompt's value `detector` found is put back in the answer.
    fn restores(&self, detector: Detector, scope: u32) -> bool {
        self.rule_of(detector, Side::Prompt, scope)
            .and_then(|k| self.rules.get(k))
            .is_some_and(|r| r.restore)
    }

    /// Checks one text of an answer (`text`), of which the first `seen`
    /// bytes were checked before (what a stream already passed, read again
    /// for what leads into the rest): fires the answer's rules on what is
    /// found past them in `verdict`, and returns what was found, each with
    /// its rule and action, placeholders of `vault` left out (re-reading
    /// masked text never finds its own placeholder).
    pub fn answer_findings(
        &self,
        text: &str,
        seen: usize,
        vault: &Vault,
        verdict: &mut Verdict,
    ) -> Vec<(Finding, Action)> {
        let mut out = Vec::new();
        let Some(detectors) = self
            .detectors
            .as_ref()
            .filter(|_| self.rules_read(Side::Answer))
        else {
            return out;
        };
        let mut budget = Budget::new(self.max_scan_bytes, MAX_FINDINGS);
        let mut found = Vec::new();
        detectors.scan(text, &mut budget, &mut found);
        verdict.truncated |= budget.truncated();
        let ours = vault.placeholders(text);
        for f in found {
            let theirs = ours
                .iter()
                .any(|p| f.range.start < p.end && p.start < f.range.end);
            let rule = self.rule_of(f.detector, Side::Answer, vault.scope());
            let Some((rule, action)) = rule.and_then(|k| Some((k, self.rules.get(k)?.action)))
            else {
                continue;
            };
            if theirs || f.range.end <= seen {
                continue;
            }
            verdict.fire(rule, action);
            out.push((f, action));
        }
        out
    }

    /// `text` as the client is to see it: what `found` (of
    /// [`Guardrails::answer_findings`]) masks replaced by placeholders, and,
    /// with `restore`, the prompt's values a rule restores put back.
    pub fn answer_text<'t>(
        &self,
        text: &'t str,
        found: &[(Finding, Action)],
        vault: &mut Vault,
        restore: bool,
    ) -> std::borrow::Cow<'t, str> {
        let masks: Vec<Finding> = found
            .iter()
            .filter(|(_, a)| *a == Action::Mask)
            .map(|(f, _)| f.clone())
            .collect();
        match &self.detectors {
            Some(d) => vault.mask_as(text, &masks, d, &|_| false, restore),
            None => std::borrow::Cow::Borrowed(text),
        }
    }

    /// Checks every string of `value` (a JSON answer's part, a stream's
    /// event) in place: what the answer's rules mask masked, and, with
    /// `restore`, the prompt's values put back; true when a string changed.
    pub fn check_answer(
        &self,
        value: &mut Json,
        vault: &mut Vault,
        verdict: &mut Verdict,
        restore: bool,
    ) -> bool {
        let mut changed = false;
        each_string_mut(value, &mut |s| {
            let found = self.answer_findings(s, 0, vault, verdict);
            if found.iter().any(|(_, a)| *a == Action::Block) {
                return;
            }
            if let std::borrow::Cow::Owned(to) = self.answer_text(s, &found, vault, restore) {
                *s = to;
                changed = true;
            }
        });
        changed
    }

    /// Puts the prompt's values back in every string of `value`, an
    /// answer's part [`Guardrails::check_answer`] checked without
    /// `restore`; true when a string changed.
    pub fn restore_answer(&self, value: &mut Json, vault: &mut Vault) -> bool {
        let mut changed = false;
        each_string_mut(value, &mut |s| {
            if let std::borrow::Cow::Owned(to) = self.answer_text(s, &[], vault, true) {
                *s = to;
                changed = true;
            }
        });
        changed
    }

    /// Checks the prompt of a request whose body is `tree`, kept in its
    /// dialect's `fields`: which rules fired, whether one blocks, and, when
    /// a rule masks, each field as it is to be sent (the masked values kept
    /// in `vault`). Nothing of what was found leaves this but ranges
    /// replaced by placeholders.
    pub fn check(&self, tree: &Json, fields: &[&'static str], vault: &mut Vault) -> Verdict {
        let mut verdict = Verdict::default();
        let Some(detectors) = &self.detectors else {
            return verdict;
        };
        let mut budget = Budget::new(self.max_scan_bytes, MAX_FINDINGS);
        let mut found = Vec::new();
        for field in fields {
            let Some(value) = tree.get(field) else {
                continue;
            };
            let mut masked: Option<Json> = None;
            let mut path = Vec::new();
            each_string(value, &mut path, &mut |at, text| {
                found.clear();
                detectors.scan(text, &mut budget, &mut found);
                let mut masks: Vec<Finding> = Vec::new();
                for f in &found {
                    let Some((rule, action)) = self
                        .rule_of(f.detector, Side::Prompt, vault.scope())
                        .and_then(|k| Some((k, self.rules.get(k)?.action)))
                    else {
                        continue;
                    };
                    verdict.fire(rule, action);
                    if action == Action::Mask {
                        masks.push(f.clone());
                    }
                }
                if !masks.is_empty() {
                    let scope = vault.scope();
                    let restores = |d| self.restores(d, scope);
                    let to = vault
                        .mask_as(text, &masks, detectors, &restores, false)
                        .into_owned();
                    let tree = masked.get_or_insert_with(|| value.clone());
                    if let Some(s) = string_at(tree, at) {
                        *s = to;
                    }
                }
            });
            if let Some(m) = masked {
                let mut bytes = Vec::new();
                m.write(&mut bytes);
                verdict.edits.push((field, bytes, m));
            }
        }
        verdict.truncated = budget.truncated();
        verdict
    }
}

/// What the check of one prompt found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Each rule that fired (its index), once, in the order first fired.
    pub fired: Vec<usize>,
    /// The strictest action of the rules that fired, and the first rule of it.
    pub strictest: Option<(Action, usize)>,
    /// Each field to send masked: its name, its bytes and its tree.
    pub edits: Vec<(&'static str, Vec<u8>, Json)>,
    /// The prompt was longer than the budget: what was past it was not read.
    pub truncated: bool,
}

impl Verdict {
    /// Rule `rule` of `action` found something.
    pub fn fire(&mut self, rule: usize, action: Action) {
        if !self.fired.contains(&rule) {
            self.fired.push(rule);
        }
        if self.strictest.is_none_or(|(a, _)| action > a) {
            self.strictest = Some((action, rule));
        }
    }

    /// The rule that blocks the call, if one does.
    pub fn blocked_by(&self) -> Option<usize> {
        self.strictest
            .filter(|(a, _)| *a == Action::Block)
            .map(|(_, r)| r)
    }
}

/// Where a string sits in a value: the index of each array item or object
/// member on the way down.
type At = [usize];

/// Calls `f` with every string of `value` (object keys aside) and where it
/// sits. The tree is as deep as the parser allowed ([`crate::json::MAX_DEPTH`]).
fn each_string<'a>(value: &'a Json, path: &mut Vec<usize>, f: &mut dyn FnMut(&At, &'a str)) {
    match value {
        Json::String(s) => f(path, s),
        Json::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i);
                each_string(v, path, f);
                path.pop();
            }
        }
        Json::Object(members) => {
            for (i, (_, v)) in members.iter().enumerate() {
                path.push(i);
                each_string(v, path, f);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Calls `f` with every string of `value` (object keys aside), to change.
fn each_string_mut(value: &mut Json, f: &mut dyn FnMut(&mut String)) {
    match value {
        Json::String(s) => f(s),
        Json::Array(items) => items.iter_mut().for_each(|v| each_string_mut(v, f)),
        Json::Object(members) => members.iter_mut().for_each(|(_, v)| each_string_mut(v, f)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled(json: &str) -> Result<Guardrails, ConfigError> {
        Guardrails::compile(ConfigError::from_json(json.as_bytes())?)
    }

    fn rules(json: &str) -> Guardrails {
        compiled(&format!(r#"{{"rules":{json}}}"#)).unwrap()
    }

    fn check(g: &Guardrails, body: &str, fields: &[&'static str]) -> (Verdict, Vault) {
        let mut vault = Vault::new();
        let tree = Json::parse(body.as_bytes()).unwrap();
        (g.check(&tree, fields, &mut vault), vault)
    }

    const KEY: &str = "sk-proj-PLANTED0123456789abcdef";

    #[test]
    fn a_secret_blocks_and_a_clean_prompt_passes() {
        let g = rules(r#"[{"name":"no-secrets","detect":["secrets"],"action":"block"}]"#);
        let body = format!(r#"{{"messages":[{{"role":"user","content":"use {KEY} please"}}]}}"#);
        let (v, _) = check(&g, &body, &["messages"]);
        assert_eq!(v.blocked_by(), Some(0));
        assert!(v.edits.is_empty());
        let (v, _) = check(
            &g,
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            &["messages"],
        );
        assert_eq!(v.blocked_by(), None);
        assert!(v.fired.is_empty());
    }

    #[test]
    fn a_rule_applies_to_its_priorities_and_models_only() {
        let g = rules(
            r#"[{"name":"p2-secrets","detect":["secrets"],"priorities":["P2"]},
                {"name":"gpt-pii","detect":["email"],"action":"mask","models":["gpt-4o*","o3"]}]"#,
        );
        let body =
            format!(r#"{{"messages":[{{"role":"user","content":"{KEY} to ann@example.com"}}]}}"#);
        let checked = |priority: Priority, model: &str| {
            let mut vault = Vault::new();
            vault.limit_to(g.applying(priority, Some(model)));
            let tree = Json::parse(body.as_bytes()).unwrap();
            g.check(&tree, &["messages"], &mut vault).fired
        };
        assert_eq!(checked(Priority::P2, "gpt-4o-mini"), vec![0, 1]);
        assert_eq!(checked(Priority::P1, "gpt-4o"), vec![1]);
        assert_eq!(checked(Priority::P1, "o3"), vec![1]);
        assert!(checked(Priority::P0, "claude-sonnet-4").is_empty());
        assert_eq!(
            g.applying(Priority::P1, None),
            0,
            "no model: no model's rule"
        );
        // Without scopes, every rule applies.
        assert_eq!(
            rules(r#"[{"name":"a","detect":["email"]}]"#).applying(Priority::P0, None),
            1
        );
        for (bad, field) in [
            (r#""priorities":["P3"]"#, "rules[0].priorities[0]"),
            (r#""priorities":["p2 "]"#, "rules[0].priorities[0]"),
            (r#""priorities":"P2""#, "rules[0].priorities"),
            (r#""models":[""]"#, "rules[0].models[0]"),
            (r#""models":["*"]"#, "rules[0].models[0]"),
            (r#""models":["gpt-*-mini"]"#, "rules[0].models[0]"),
        ] {
            let e = compiled(&format!(
                r#"{{"rules":[{{"name":"a","detect":["email"],{bad}}}]}}"#
            ))
            .unwrap_err();
            assert_eq!(e.field, field, "{bad}: {e}");
        }
    }

    #[test]
    fn only_the_dialects_fields_are_read() {
        let g = rules(r#"[{"name":"s","detect":["openai_key"]}]"#);
        let body = format!(r#"{{"user":"{KEY}","messages":[]}}"#);
        assert!(check(&g, &body, &["messages"]).0.fired.is_empty());
    }

    #[test]
    fn masking_replaces_each_value_by_one_placeholder_in_every_field() {
        let g = rules(r#"[{"name":"pii","detect":["email"],"action":"mask"}]"#);
        let body = r#"{"system":"write to ann@example.com","messages":[{"role":"user","content":[{"type":"text","text":"ann@example.com and bob@example.org"}]}]}"#;
        let (v, vault) = check(&g, body, &["system", "messages"]);
        assert_eq!(v.blocked_by(), None);
        assert_eq!(v.fired, vec![0]);
        assert_eq!(vault.len(), 2);
        let sent: Vec<String> = v
            .edits
            .iter()
            .map(|(f, b, _)| format!("{f}={}", String::from_utf8_lossy(b)))
            .collect();
        assert_eq!(
            sent,
            vec![
                r#"system="write to [EMAIL_1]""#.to_string(),
                r#"messages=[{"content":[{"text":"[EMAIL_1] and [EMAIL_2]","type":"text"}],"role":"user"}]"#
                    .to_string(),
            ]
        );
        assert!(!sent.concat().contains("example"));
    }

    #[test]
    fn the_stricter_rule_wins_and_log_only_counts() {
        let g = rules(
            r#"[{"name":"seen","detect":["personal"],"action":"log"},
                {"name":"cards","detect":["credit_card"],"action":"block"},
                {"name":"codename","words":["project falcon"],"action":"log"}]"#,
        );
        let (v, _) = check(
            &g,
            r#"{"input":"Project Falcon: bill 4111 1111 1111 1111"}"#,
            &["input"],
        );
        assert_eq!(v.blocked_by(), Some(1));
        let mut fired = v.fired.clone();
        fired.sort_unstable();
        assert_eq!(fired, vec![1, 2]);
        let (v, _) = check(&g, r#"{"input":"mail ann@example.com"}"#, &["input"]);
        assert_eq!((v.blocked_by(), v.fired, v.edits.len()), (None, vec![0], 0));
    }

    #[test]
    fn a_tool_calls_json_arguments_are_read_decoded() {
        let g = rules(r#"[{"name":"s","detect":["secrets"],"action":"mask"}]"#);
        let body = format!(
            r#"{{"messages":[{{"role":"assistant","tool_calls":[{{"function":{{"name":"f","arguments":"{{\"key\":\"{KEY}\"}}"}}}}]}}]}}"#
        );
        let (v, _) = check(&g, &body, &["messages"]);
        assert_eq!(v.fired, vec![0]);
        let sent = String::from_utf8_lossy(&v.edits[0].1).to_string();
        assert!(!sent.contains("PLANTED"), "{sent}");
    }

    #[test]
    fn a_prompt_past_the_budget_is_truncated() {
        let g = compiled(r#"{"rules":[{"name":"s","detect":["email"]}],"max_scan_bytes":1024}"#)
            .unwrap();
        let body = format!(r#"{{"input":"{}"}}"#, "a ".repeat(2000));
        assert!(check(&g, &body, &["input"]).0.truncated);
        assert!(!check(&g, r#"{"input":"short"}"#, &["input"]).0.truncated);
    }

    #[test]
    fn bad_rules_are_refused_by_field() {
        let bad = |json: &str| compiled(json).unwrap_err().to_string();
        assert!(bad(r#"{"rules":[{"name":"a"}]}"#).contains("rules[0].detect"));
        assert!(
            bad(r#"{"rules":[{"name":"a","detect":["emails"]}]}"#).contains("rules[0].detect[0]")
        );
        assert!(
            bad(r#"{"rules":[{"name":"a","detect":["email"],"action":"drop"}]}"#)
                .contains("rules[0].action")
        );
        assert!(bad(
            r#"{"rules":[{"name":"a","detect":["email"]},{"name":"a","detect":["jwt"]}]}"#
        )
        .contains("rules[1].name"));
        assert!(bad(r#"{"rules":[{"name":"","detect":["email"]}]}"#).contains("rules[0].name"));
        assert!(bad(r#"{"unchecked":"maybe"}"#).contains("unchecked"));
        assert!(bad(r#"{"max_scan_bytes":1}"#).contains("max_scan_bytes"));
        let secret_word = "hunter2-secret-word";
        let e = bad(&format!(
            r#"{{"rules":[{{"name":"w","words":["{secret_word}","x\u0001"]}}]}}"#
        ));
        assert!(!e.contains(secret_word), "{e}");
    }

    #[test]
    fn no_rule_is_off_and_a_log_rule_enforces_nothing() {
        let off = compiled("{}").unwrap();
        assert!(!off.enabled());
        let log = rules(r#"[{"name":"l","detect":["email"],"action":"log"}]"#);
        assert!(log.enabled() && !log.enforces(Side::Prompt));
        assert_eq!(log.unchecked, Unchecked::Refuse);
    }
}
