//! Token and cost limits per tenant, user and model (docs/limits.md).
//!
//! A call is charged twice: before it goes, a reservation of what it may
//! cost at most — one request, its prompt's estimated tokens plus its output
//! cap, and what those cost — checked against every limit of every rule
//! that applies and added in the same compare-and-swap; when it ends, the
//! reservation is settled with what the provider reported. So concurrent
//! calls cannot together pass a limit by more than the reservations still in
//! flight, and a call that costs less than it reserved gives the rest back.
//!
//! Over a limit the call is refused with a 429 in the caller's API shape and
//! a `retry-after` until the window has room, or, when the rule says so,
//! sent cheaper (a lower output cap, a cheaper model) up to a ceiling.
//!
//! Counts live in this proxy's shared data: a limit holds for the calls this
//! proxy sees. A limit that must hold across many proxies is enforced on the
//! egress gateway, with the tenant hashed onto one replica by Envoy's
//! consistent hashing (docs/limits.md).

pub mod config;
pub mod store;
pub mod window;

use sha2::{Digest, Sha256};

use config::Limit;
pub use config::{Dimension, LimitsConfig, Measure, Rule};
use store::{Decided, Place};

use crate::host::{Metrics, SharedStore};
use crate::metrics::{self as names, internal_error};
use crate::priority::Priority;
use crate::usage::Usage;

/// Most tokens one call's usage is believed to report per field: a usage
/// past it is taken as this (and counted), so one lying answer cannot
/// spend a year's budget or wrap a count.
pub const MAX_TOKENS_PER_CALL: u64 = 1 << 24;

/// The label of a count without a value for a dimension (no credential, no
/// user header, no model).
pub const NONE: &str = "none";

/// What a call is, as the limits see it.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Its priority.
    pub priority: Priority,
    /// Its model (degrade's, when degrade switched it).
    pub model: Option<&'a str>,
    /// Its tenant's id.
    pub tenant: Option<&'a str>,
    /// Its tenant as the spend metrics name it (bounded by the caller).
    pub tenant_label: &'a str,
    /// Its user.
    pub user: Option<&'a str>,
    /// The estimated tokens of its prompt.
    pub prompt_tokens: u64,
    /// The output cap it names.
    pub max_tokens: Option<u64>,
    /// Now, ms.
    pub now_ms: u64,
}

/// What a call reserved under one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The rule's index.
    pub rule: usize,
    /// The key's hash.
    pub hash: u64,
    /// Where its record is.
    pub place: Place,
    /// Per limit of the rule: the window the reservation went into and how much.
    pub reserved: Vec<(u64, u64)>,
    /// The tenant's label, for the spend metrics.
    pub tenant: String,
}

/// How a call over a rule's limit is sent cheaper.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cheaper {
    /// The output cap.
    pub max_tokens: Option<u64>,
    /// The model.
    pub model: Option<String>,
}

/// What is left of the tightest limit of one measure after the call's
/// reservation, for the caller's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// The limit.
    pub limit: u64,
    /// What is left of it.
    pub remaining: u64,
    /// Until it is all free again, ms.
    pub reset_ms: u64,
}

/// The limits passed the call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admitted {
    /// What it reserved, one per rule that applied.
    pub held: Vec<Held>,
    /// Over a rule that degrades: how to send it.
    pub cheaper: Option<Cheaper>,
    /// What is left of the tightest request limit.
    pub requests: Option<Left>,
    /// What is left of the tightest token limit.
    pub tokens: Option<Left>,
}

/// A call over a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The rule.
    pub rule: String,
    /// The limit's name (`tokens_per_minute`, …).
    pub limit: &'static str,
    /// What it counts.
    pub measure: Measure,
    /// The limit.
    pub max: u64,
    /// Until the call would fit, ms; `None`: it never fits (it alone is more
    /// than the limit).
    pub wait_ms: Option<u64>,
    /// What is left of the tightest request limit, the call not counted.
    pub requests: Option<Left>,
    /// What is left of the tightest token limit, the call not counted.
    pub tokens: Option<Left>,
}

/// The limits' decision on a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It goes (perhaps cheaper).
    Pass(Admitted),
    /// It is refused.
    Refuse(Refused),
}

/// What one call is charged in the end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    /// Requests: 1, or 0 when the call is given back whole.
    pub requests: u64,
    /// Input and output tokens.
    pub tokens: u64,
    /// Cost in nanos of the price unit.
    pub cost: u64,
}

/// The amounts a call needs of each measure.
#[derive(Debug, Clone, Copy)]
struct Need {
    requests: u64,
    tokens: u64,
    cost: u64,
}

impl Need {
    fn of(&self, m: Measure) -> u64 {
        match m {
            Measure::Requests => self.requests,
            Measure::Tokens => self.tokens,
            Measure::Cost => self.cost,
        }
    }
}

/// The cost of `usage` at `model`'s price, nanos (0 unpriced).
fn cost(cfg: &LimitsConfig, model: Option<&str>, usage: &Usage) -> u64 {
    cfg.price(model).map_or(0, |p| p.cost(usage))
}

/// A usage of `prompt` input and `output` tokens, nothing cached.
fn plain(prompt: u64, output: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: output,
        ..Usage::default()
    }
}

/// What the call reserves: one request, its prompt and output cap, their cost.
fn need(cfg: &LimitsConfig, model: Option<&str>, prompt: u64, max_tokens: Option<u64>) -> Need {
    let output = max_tokens.unwrap_or(cfg.reserve_output_tokens);
    Need {
        requests: 1,
        tokens: prompt.saturating_add(output),
        cost: cost(cfg, model, &plain(prompt, output)),
    }
}

/// The hash of `rule`'s key for the call `ask` says.
fn rule_key(rule: &Rule, ask: &Ask<'_>) -> u64 {
    let values: Vec<&str> = rule
        .by
        .iter()
        .map(|d| match d {
            Dimension::Tenant => ask.tenant.unwrap_or(NONE),
            Dimension::User => ask.user.unwrap_or(NONE),
            Dimension::Model => ask.model.unwrap_or(NONE),
        })
        .collect();
    key_hash(rule, &values)
}

/// The hash of a rule's key for a call: the values of its dimensions.
fn key_hash(rule: &Rule, values: &[&str]) -> u64 {
    let mut h = Sha256::new();
    h.update(rule.name.as_bytes());
    for v in values {
        h.update((v.len() as u64).to_le_bytes());
        h.update(v.as_bytes());
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(d.get(..8).unwrap_or(&[1; 8]));
    // 0 marks a free record.
    u64::from_le_bytes(b).max(1)
}

/// Checks the call against every rule that applies and reserves what it
/// needs under each. A rule whose record cannot be read or written lets the
/// call go unreserved (fail-open, counted).
pub fn admit(
    store: &dyn SharedStore,
    cfg: &LimitsConfig,
    metrics: &mut dyn Metrics,
    ask: &Ask<'_>,
) -> Decision {
    let mut out = Admitted::default();
    for (index, rule) in cfg.rules.iter().enumerate() {
        if !rule.applies(ask.priority, ask.model) {
            continue;
        }
        match reserve(store, cfg, rule, index, ask, out.cheaper.as_ref()) {
            Ok(Reserved::Held(held, cheaper, left)) => {
                let result = if cheaper.is_some() {
                    "degraded"
                } else {
                    "pass"
                };
                count(metrics, rule, result);
                if let Some(c) = cheaper {
                    let merged = out.cheaper.get_or_insert_with(Cheaper::default);
                    merged.max_tokens = match (merged.max_tokens, c.max_tokens) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    merged.model = merged.model.take().or(c.model);
                }
                for (l, used) in rule.limits.iter().zip(&left) {
                    used_gauge(metrics, rule, &held.tenant, l, used.limit - used.remaining);
                    let tight = match l.measure {
                        Measure::Requests => &mut out.requests,
                        Measure::Tokens => &mut out.tokens,
                        Measure::Cost => continue,
                    };
                    tighten(tight, *used);
                }
                if !held.place.own {
                    anomaly(metrics, "record_shared");
                }
                out.held.push(held);
            }
            Ok(Reserved::Over(mut refused)) => {
                count(metrics, rule, "rejected");
                // The caller hears the tightest of every rule, as an
                // answer would have told it.
                if let Some(l) = out.requests {
                    tighten(&mut refused.requests, l);
                }
                if let Some(l) = out.tokens {
                    tighten(&mut refused.tokens, l);
                }
                // What the rules before reserved is given back.
                release(store, cfg, metrics, &out.held, ask.now_ms);
                return Decision::Refuse(refused);
            }
            Err(()) => {
                count(metrics, rule, "unenforced");
                internal_error(metrics, "limits_store");
            }
        }
    }
    Decision::Pass(out)
}

/// Keeps in `tight` whichever of it and `left` has less left.
fn tighten(tight: &mut Option<Left>, left: Left) {
    if tight.is_none_or(|t| left.remaining < t.remaining) {
        *tight = Some(left);
    }
}

/// The limits' decision on a call moving to another model than the one it
/// was admitted as (a fallback chain's next).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switch {
    /// It goes there: what it holds now, and the reservations of the model
    /// it leaves that the new one's rules do not share (to settle as a call
    /// the backend refused: its request only).
    Go {
        /// Its reservations from here on.
        held: Vec<Held>,
        /// Those it no longer holds.
        left_behind: Vec<Held>,
    },
    /// A rule of the new model is spent and degrades: the call stays on the
    /// cheaper model it was on.
    Stay,
    /// A rule of the new model refuses it.
    Refuse(Refused),
}

/// Checks a call that holds `held` against the rules of the model `ask`
/// names before it goes there: a rule already held under the same key keeps
/// its reservation; every other rule that applies reserves now. A rule that
/// is over its limit ends the move: [`Switch::Stay`] when it degrades (the
/// call is kept on the model it was on; going to a cheaper model still is
/// no way to reach this one), else [`Switch::Refuse`]. What the move
/// reserved is given back either way.
pub fn switch(
    store: &dyn SharedStore,
    cfg: &LimitsConfig,
    metrics: &mut dyn Metrics,
    ask: &Ask<'_>,
    held: &[Held],
) -> Switch {
    let mut kept = Vec::new();
    let mut added: Vec<Held> = Vec::new();
    for (index, rule) in cfg.rules.iter().enumerate() {
        if !rule.applies(ask.priority, ask.model) {
            continue;
        }
        let hash = rule_key(rule, ask);
        if let Some(h) = held.iter().find(|h| h.rule == index && h.hash == hash) {
            kept.push(h.clone());
            continue;
        }
        let refused = match reserve(store, cfg, rule, index, ask, None) {
            Ok(Reserved::Held(h, None, _)) => {
                count(metrics, rule, "pass");
                added.push(h);
                continue;
            }
            // Only its degrade fits: the new model is over this rule's limit.
            Ok(Reserved::Held(h, Some(_), _)) => {
                added.push(h);
                None
            }
            Ok(Reserved::Over(r)) => Some(r),
            Err(()) => {
                count(metrics, rule, "unenforced");
                internal_error(metrics, "limits_store");
                continue;
            }
        };
        count(metrics, rule, "rejected");
        release(store, cfg, metrics, &added, ask.now_ms);
        return match refused {
            Some(r) if rule.degrade.is_none() => Switch::Refuse(r),
            _ => Switch::Stay,
        };
    }
    let left_behind = held.iter().filter(|h| !kept.contains(h)).cloned().collect();
    kept.extend(added);
    Switch::Go {
        held: kept,
        left_behind,
    }
}

enum Reserved {
    Held(Held, Option<Cheaper>, Vec<Left>),
    Over(Refused),
}

/// What a reservation took of a record: per limit the window and amount,
/// the degrade it went under, what is left.
type Taken = (Vec<(u64, u64)>, Option<Cheaper>, Vec<Left>);

/// The call's need under a rule, and its need sent cheaper by the rule's
/// degrade (with the ceiling factor and the edit).
fn needs(
    cfg: &LimitsConfig,
    rule: &Rule,
    ask: &Ask<'_>,
    already: Option<&Cheaper>,
) -> (Need, Option<(Need, f64, Cheaper)>) {
    // What an earlier rule's degrade already made of the call.
    let model = already.and_then(|c| c.model.as_deref()).or(ask.model);
    let cap = |own: Option<u64>| match (own, ask.max_tokens) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (c, m) => c.or(m),
    };
    let already_cap = already.and_then(|c| c.max_tokens);
    let normal = need(cfg, model, ask.prompt_tokens, cap(already_cap));
    let cheaper = rule.degrade.as_ref().map(|d| {
        let max_tokens = cap(d.max_tokens.or(already_cap));
        let c = Cheaper {
            max_tokens: d.max_tokens,
            model: d.model.clone(),
        };
        let n = need(
            cfg,
            d.model.as_deref().or(model),
            ask.prompt_tokens,
            max_tokens,
        );
        (n, d.until, c)
    });
    (normal, cheaper)
}

/// Checks a rolled record against the rule's limits and adds the need it
/// can take (the normal one, else the cheaper one under its ceiling);
/// `Err`: the limit the call waits longest for.
fn take(
    r: &mut store::Record,
    rule: &Rule,
    now: u64,
    normal: Need,
    cheaper: Option<&(Need, f64, Cheaper)>,
) -> Decided<Result<Taken, Option<Refused>>> {
    let limits = &rule.limits;
    let used: Vec<u64> = r
        .counts
        .iter()
        .zip(limits)
        .map(|(c, l)| c.used(l.span, now))
        .collect();
    let fits = |n: &Need, factor: f64| {
        used.iter().zip(limits).all(|(u, l)| {
            let ceiling = (l.max as f64 * factor) as u64;
            u.saturating_add(n.of(l.measure)) <= ceiling
        })
    };
    let (taken, degraded) = match cheaper {
        _ if fits(&normal, 1.0) => (normal, None),
        Some((n, until, c)) if fits(n, *until) => (*n, Some(c.clone())),
        _ => {
            let over = r
                .counts
                .iter()
                .zip(limits)
                .map(|(c, l)| (l, c.wait_ms(l.span, now, normal.of(l.measure), l.max)))
                .filter(|(_, w)| *w != Some(0))
                .max_by_key(|(_, w)| w.unwrap_or(u64::MAX));
            let mut requests = None;
            let mut tokens = None;
            for ((c, l), u) in r.counts.iter().zip(limits).zip(&used) {
                let tight = match l.measure {
                    Measure::Requests => &mut requests,
                    Measure::Tokens => &mut tokens,
                    Measure::Cost => continue,
                };
                let left = Left {
                    limit: l.max,
                    remaining: l.max.saturating_sub(*u),
                    // Until the one call more this measure needs fits.
                    reset_ms: c
                        .wait_ms(l.span, now, normal.of(l.measure), l.max)
                        .unwrap_or(0),
                };
                tighten(tight, left);
            }
            return Decided::Keep(Err(over.map(|(l, w)| Refused {
                rule: rule.name.clone(),
                limit: l.name,
                measure: l.measure,
                max: l.max,
                wait_ms: w,
                requests,
                tokens,
            })));
        }
    };
    let mut reserved = Vec::with_capacity(limits.len());
    let mut left = Vec::with_capacity(limits.len());
    for ((c, l), u) in r.counts.iter_mut().zip(limits).zip(&used) {
        let n = taken.of(l.measure);
        c.current = c.current.saturating_add(n);
        reserved.push((c.index, n));
        left.push(Left {
            limit: l.max,
            remaining: l.max.saturating_sub(u.saturating_add(n)),
            reset_ms: c.wait_ms(l.span, now, l.max, l.max).unwrap_or(0),
        });
    }
    Decided::Write(Ok((reserved, degraded, left)))
}

fn reserve(
    store: &dyn SharedStore,
    cfg: &LimitsConfig,
    rule: &Rule,
    index: usize,
    ask: &Ask<'_>,
    already: Option<&Cheaper>,
) -> Result<Reserved, ()> {
    let hash = rule_key(rule, ask);
    let (normal, cheaper) = needs(cfg, rule, ask, already);
    let slots = cfg.max_keys as u64;
    let changed = store::change(store, rule, slots, hash, ask.now_ms, |r| {
        take(r, rule, ask.now_ms, normal, cheaper.as_ref())
    });
    match changed {
        Ok((place, Ok((reserved, cheaper, left)))) => {
            let held = Held {
                rule: index,
                hash,
                place,
                reserved,
                tenant: ask.tenant_label.to_string(),
            };
            Ok(Reserved::Held(held, cheaper, left))
        }
        Ok((_, Err(Some(refused)))) => Ok(Reserved::Over(refused)),
        // Over, yet no limit says how: cannot be; fail open.
        Ok((_, Err(None))) | Err(_) => Err(()),
    }
}

/// Gives back every reservation (a call refused by a later rule, or by a
/// later step, without cost).
pub fn release(
    store: &dyn SharedStore,
    cfg: &LimitsConfig,
    metrics: &mut dyn Metrics,
    held: &[Held],
    now_ms: u64,
) {
    settle(store, cfg, metrics, held, Charge::default(), now_ms);
}

/// Settles each reservation with what the call was charged in the end.
pub fn settle(
    store: &dyn SharedStore,
    cfg: &LimitsConfig,
    metrics: &mut dyn Metrics,
    held: &[Held],
    charge: Charge,
    now_ms: u64,
) {
    for h in held {
        settle_one(store, cfg, metrics, h, charge, now_ms);
    }
}

fn settle_one(
    store: &dyn SharedStore,
    cfg: &LimitsConfig,
    metrics: &mut dyn Metrics,
    h: &Held,
    charge: Charge,
    now_ms: u64,
) {
    let Some(rule) = cfg.rules.get(h.rule) else {
        return;
    };
    let written = store::change_at(store, rule, &h.place, h.hash, now_ms, |r| {
        for ((c, l), (index, reserved)) in r.counts.iter_mut().zip(&rule.limits).zip(&h.reserved) {
            let actual = match l.measure {
                Measure::Requests => charge.requests,
                Measure::Tokens => charge.tokens,
                Measure::Cost => charge.cost,
            };
            if actual >= *reserved {
                // More than reserved counts now, wherever the window is.
                c.current = c.current.saturating_add(actual - reserved);
                continue;
            }
            let back = reserved - actual;
            // Less: given back to the window it was reserved in, while it counts.
            if c.index == *index {
                c.current = c.current.saturating_sub(back);
            } else if c.index == index + 1 {
                c.previous = c.previous.saturating_sub(back);
            }
        }
    });
    if written.is_err() {
        internal_error(metrics, "limits_store");
    }
    if charge.tokens > 0 || charge.cost > 0 {
        let tenant = if rule.by.contains(&Dimension::Tenant) {
            h.tenant.as_str()
        } else {
            names::OTHER
        };
        let labels = [("rule", rule.name.as_str()), ("tenant", tenant)];
        metrics.counter_with(names::LIMITS_TOKENS, &labels, charge.tokens);
        metrics.counter_with(names::LIMITS_COST, &labels, charge.cost / 1_000);
    }
}

/// What a call is charged when it ends: the reported usage (bounded), the
/// reservation when an answer came without one, the produced output when a
/// stream was cut short, nothing when no backend answered it (`answered`:
/// a 2xx came from a backend). `events`: the stream's data events.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    /// The usage the answer reported.
    pub usage: Option<Usage>,
    /// A backend answered 2xx.
    pub answered: bool,
    /// The answer was a stream.
    pub streamed: bool,
    /// The stream ended as its grammar says a stream ends.
    pub completed: bool,
    /// Data events the stream delivered.
    pub events: u64,
    /// The prompt tokens estimated for the reservation.
    pub prompt_tokens: u64,
    /// The output tokens reserved.
    pub reserved_output: u64,
}

/// The charge of a call that ended as `ended` says, with its model's price;
/// counts the usage it had to mend.
pub fn charge(
    cfg: &LimitsConfig,
    metrics: &mut dyn Metrics,
    model: Option<&str>,
    ended: &Ended,
) -> Charge {
    if !ended.answered {
        return Charge {
            requests: 1,
            ..Charge::default()
        };
    }
    let usage = match ended.usage {
        Some(u) => {
            let bounded = bounded(u);
            if bounded != u {
                anomaly(metrics, "usage_clamped");
            }
            bounded
        }
        None if ended.streamed && !ended.completed => {
            // Cut short: about a token per event was produced.
            anomaly(metrics, "stream_cut_short");
            plain(ended.prompt_tokens, ended.events.min(ended.reserved_output))
        }
        None => {
            anomaly(metrics, "usage_unknown");
            plain(ended.prompt_tokens, ended.reserved_output)
        }
    };
    Charge {
        requests: 1,
        tokens: usage.prompt_tokens.saturating_add(usage.completion_tokens),
        cost: cost(cfg, model, &usage),
    }
}

/// `u` with each count at most [`MAX_TOKENS_PER_CALL`].
fn bounded(u: Usage) -> Usage {
    let b = |n: u64| n.min(MAX_TOKENS_PER_CALL);
    Usage {
        prompt_tokens: b(u.prompt_tokens),
        completion_tokens: b(u.completion_tokens),
        cached_tokens: b(u.cached_tokens),
        cache_write_tokens: b(u.cache_write_tokens),
        cache_write_1h_tokens: b(u.cache_write_1h_tokens),
        reasoning_tokens: b(u.reasoning_tokens),
    }
}

fn anomaly(metrics: &mut dyn Metrics, reason: &str) {
    metrics.counter_with(names::LIMITS_ESTIMATED, &[("reason", reason)], 1);
}

fn count(metrics: &mut dyn Metrics, rule: &Rule, result: &str) {
    metrics.counter_with(
        names::LIMITS_CALLS,
        &[("rule", rule.name.as_str()), ("result", result)],
        1,
    );
}

fn used_gauge(metrics: &mut dyn Metrics, rule: &Rule, tenant: &str, l: &Limit, used: u64) {
    if !rule.by.contains(&Dimension::Tenant) {
        return;
    }
    let permille = (u128::from(used) * 1000 / u128::from(l.max.max(1))).min(1_000_000);
    metrics.gauge_with(
        names::LIMITS_USED,
        &[
            ("rule", rule.name.as_str()),
            ("tenant", tenant),
            ("limit", l.name),
        ],
        permille as i64,
    );
}

#[cfg(test)]
mod tests;
