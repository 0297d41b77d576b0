//! What a call costs at its model's list prices, and what the provider's
//! prompt cache saved on it (docs/limits.md#prices). The limits count cost
//! with it; the call's end counts the cache's savings and the span states
//! both. Prices come from `limits.prices` over `limits.catalog`
//! ([`config`]).

pub mod config;

use crate::host::Metrics;
use crate::metrics;
use crate::usage::Usage;

/// Nanos of the price unit a price per million tokens is per token.
const NANOS_PER_TOKEN_PER_MILLION: f64 = 1e3;

/// The rates of one tier of a model's prices, in billionths of the unit per
/// token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Per input token neither read from nor written to the prompt cache.
    pub input: f64,
    /// Per input token read from the prompt cache.
    pub cached_input: f64,
    /// Per input token written to the prompt cache for five minutes.
    pub cache_write: f64,
    /// Per input token written to the prompt cache for an hour.
    pub cache_write_1h: f64,
    /// Per output token.
    pub output: f64,
    /// Per reasoning token (a part of the output).
    pub reasoning: f64,
}

/// The rates a call pays past a size of prompt: a provider's long-context
/// price, which applies to the whole call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tier {
    /// The rates apply to calls of more prompt tokens than this.
    pub above: u64,
    /// The rates.
    pub rates: Rates,
}

/// One model's prices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// The rates of calls up to its long context.
    pub base: Rates,
    /// Its long-context rates, when it has them.
    pub long: Option<Tier>,
}

/// What the prompt cache did to a call's cost, in nanos: each part is a
/// counter, so the net saving is `saved − premium`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheEffect {
    /// The cache reads at the cached rate rather than the input rate.
    pub saved: u64,
    /// What the cache writes cost above the input rate.
    pub premium: u64,
}

/// The split of a usage the rates apply to, each part bounded by its whole.
struct Parts {
    plain: f64,
    read: f64,
    write: f64,
    write_1h: f64,
    output: f64,
    reasoning: f64,
}

impl Parts {
    fn of(u: &Usage) -> Self {
        let read = u.cached_tokens.min(u.prompt_tokens);
        let written = u.cache_write_tokens.min(u.prompt_tokens - read);
        let hour = u.cache_write_1h_tokens.min(written);
        let reasoning = u.reasoning_tokens.min(u.completion_tokens);
        Self {
            plain: (u.prompt_tokens - read - written) as f64,
            read: read as f64,
            write: (written - hour) as f64,
            write_1h: hour as f64,
            output: (u.completion_tokens - reasoning) as f64,
            reasoning: reasoning as f64,
        }
    }
}

/// Nanos as a whole count, rounded up (a price never rounds to free).
fn nanos(x: f64) -> u64 {
    x.ceil().clamp(0.0, u64::MAX as f64) as u64
}

impl Price {
    /// The rates a call of `prompt_tokens` pays: the long context's above
    /// its threshold, else the base.
    pub fn rates(&self, prompt_tokens: u64) -> &Rates {
        match &self.long {
            Some(t) if prompt_tokens > t.above => &t.rates,
            _ => &self.base,
        }
    }

    /// The cost of a call that used `u`, nanos.
    pub fn cost(&self, u: &Usage) -> u64 {
        let r = self.rates(u.prompt_tokens);
        let p = Parts::of(u);
        nanos(
            p.plain * r.input
                + p.read * r.cached_input
                + p.write * r.cache_write
                + p.write_1h * r.cache_write_1h
                + p.output * r.output
                + p.reasoning * r.reasoning,
        )
    }

    /// What the prompt cache saved and cost on a call that used `u`, against
    /// the same call at the input rate.
    pub fn cache_effect(&self, u: &Usage) -> CacheEffect {
        let r = self.rates(u.prompt_tokens);
        let p = Parts::of(u);
        let above = |rate: f64| (rate - r.input).max(0.0);
        CacheEffect {
            saved: nanos(p.read * (r.input - r.cached_input).max(0.0)),
            premium: nanos(p.write * above(r.cache_write) + p.write_1h * above(r.cache_write_1h)),
        }
    }
}

/// Every model's prices: by exact name, by a name's beginning (a key ending
/// in `*`, the longest that fits), else the `*` entry. A list, read whole
/// at each lookup: at most a few hundred short keys, read at a call's
/// admission and end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    /// Each key as written and its price, one per key.
    entries: Vec<(String, Price)>,
    /// The exact names `limits.prices` itself wrote (not the catalog's).
    own: Vec<String>,
}

/// How well `key` names `model`: the exact name best (`usize::MAX`), else a
/// beginning ending in `*` by its length (`*` alone fits every model, at 0);
/// `None` when it does not.
pub fn fit(key: &str, model: Option<&str>) -> Option<usize> {
    match key.strip_suffix('*') {
        Some(prefix) => (prefix.is_empty() || model.is_some_and(|m| m.starts_with(prefix)))
            .then_some(prefix.len()),
        None => (model == Some(key)).then_some(usize::MAX),
    }
}

impl Prices {
    /// The price of `model`.
    pub fn get(&self, model: Option<&str>) -> Option<&Price> {
        let mut best: Option<(usize, &Price)> = None;
        for (key, price) in &self.entries {
            if let Some(n) = fit(key, model).filter(|n| best.is_none_or(|(b, _)| *n > b)) {
                best = Some((n, price));
            }
        }
        best.map(|(_, p)| p)
    }

    /// Takes `price` for `key`, in place of an earlier one.
    fn set(&mut self, key: String, price: Price) {
        self.entries.retain(|(k, _)| *k != key);
        self.entries.push((key, price));
    }

    /// Every model is priced (a `*` entry).
    pub fn prices_every_model(&self) -> bool {
        self.entries.iter().any(|(k, _)| k == config::ANY_MODEL)
    }

    /// The models `limits.prices` names by their exact name: the
    /// configuration's names (a catalog's are not).
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.own.iter().map(String::as_str)
    }
}

/// Counts what the prompt cache did on a call to `model` (its label
/// `label`): its savings and its writes' premium, millionths of the unit.
pub fn count_cache_effect(
    m: &mut dyn Metrics,
    prices: &Prices,
    model: Option<&str>,
    label: &str,
    usage: Option<&Usage>,
) {
    let (Some(price), Some(u)) = (prices.get(model), usage) else {
        return;
    };
    let effect = price.cache_effect(u);
    for (name, n) in [
        (metrics::PROMPT_CACHE_SAVED, effect.saved),
        (metrics::PROMPT_CACHE_PREMIUM, effect.premium),
    ] {
        if n >= 1_000 {
            m.counter_with(name, &[("model", label)], n / 1_000);
        }
    }
}

#[cfg(test)]
mod tests;
