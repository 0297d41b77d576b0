//! `limits.prices` and `limits.catalog` as written, and their compilation
//! into [`Prices`]: each rate checked, each model's long-context rates
//! above their threshold, the operator's entries over the catalog's.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Price, Prices, Rates, Tier, NANOS_PER_TOKEN_PER_MILLION};
use crate::config::error::ConfigError;

/// Most models one price map names (`limits.prices`, `limits.catalog`).
pub const MAX_MODELS: usize = 256;
/// Longest model key.
pub const MAX_KEY_LEN: usize = 128;
/// Highest rate, per million tokens.
const MAX_RATE: f64 = 1e6;
/// The entry that prices every model without its own.
pub const ANY_MODEL: &str = "*";

/// One model's prices as written, per million tokens.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawPrice {
    /// Input tokens.
    pub input: Option<f64>,
    /// Input tokens read from the provider's prompt cache; default `input`.
    pub cached_input: Option<f64>,
    /// Input tokens written to the prompt cache for five minutes; default
    /// `input`.
    pub cache_write: Option<f64>,
    /// Input tokens written to the prompt cache for an hour; default
    /// `cache_write`.
    pub cache_write_1h: Option<f64>,
    /// Output tokens.
    pub output: Option<f64>,
    /// Reasoning tokens, when priced apart from the output; default `output`.
    pub reasoning: Option<f64>,
    /// The rates of a call whose prompt is more than its `above` tokens,
    /// for the whole call (its defaults its own).
    pub long_context: Option<Box<RawPrice>>,
    /// In `long_context`: the prompt tokens a call must be more than to
    /// pay its rates.
    pub above: Option<u64>,
}

/// The six rates as written, in [`Rates`]' order.
type Written = [Option<f64>; 6];

impl RawPrice {
    fn written(&self) -> Written {
        [
            self.input,
            self.cached_input,
            self.cache_write,
            self.cache_write_1h,
            self.output,
            self.reasoning,
        ]
    }
}

/// The fields of [`Written`], as errors name them.
const RATE_FIELDS: [&str; 6] = [
    "input",
    "cached_input",
    "cache_write",
    "cache_write_1h",
    "output",
    "reasoning",
];

/// Compiles the catalog of `as_of` (when given) and `limits.prices` over
/// it: an entry of `prices` replaces the catalog's entry of the same key.
pub fn compile(
    prices: BTreeMap<String, RawPrice>,
    catalog: BTreeMap<String, RawPrice>,
    as_of: Option<&str>,
) -> Result<Prices, ConfigError> {
    let mut out = Prices::default();
    if !catalog.is_empty() {
        let day = as_of.unwrap_or_default();
        let is_day = day.len() == 10
            && day.bytes().enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                _ => b.is_ascii_digit(),
            });
        if !is_day {
            return Err(ConfigError::new(
                "catalog_as_of",
                format!("{day:?} is not the catalog's date (YYYY-MM-DD)"),
            ));
        }
        add_all("catalog", catalog, &mut out)?;
    }
    let own: Vec<String> = prices
        .keys()
        .filter(|k| !k.ends_with('*'))
        .cloned()
        .collect();
    add_all("prices", prices, &mut out)?;
    out.own = own;
    Ok(out)
}

/// Adds every entry of one map, at most [`MAX_MODELS`], each key checked.
fn add_all(
    field: &str,
    raw: BTreeMap<String, RawPrice>,
    out: &mut Prices,
) -> Result<(), ConfigError> {
    if raw.len() > MAX_MODELS {
        return Err(ConfigError::new(
            field,
            format!("{} models, more than {MAX_MODELS}", raw.len()),
        ));
    }
    for (model, p) in raw {
        let key = format!("{field}.{model}");
        let stem = model.strip_suffix('*').unwrap_or(&model);
        let well_formed = !model.is_empty()
            && model.len() <= MAX_KEY_LEN
            && !model.chars().any(char::is_control)
            && !stem.contains('*');
        if !well_formed {
            return Err(ConfigError::new(
                key,
                format!("is not a model (1 to {MAX_KEY_LEN} bytes, `*` only at its end)"),
            ));
        }
        let price = compile_price(&key, &p)?;
        out.set(model, price);
    }
    Ok(())
}

/// A model's price: its rates, and its long context's above its threshold.
fn compile_price(field: &str, p: &RawPrice) -> Result<Price, ConfigError> {
    if p.above.is_some() {
        return Err(ConfigError::new(
            format!("{field}.above"),
            "only a `long_context` names `above`",
        ));
    }
    let base = compile_rates(field, p.written())?;
    let long = match &p.long_context {
        None => None,
        Some(l) => {
            let field = format!("{field}.long_context");
            let above = l.above.filter(|n| *n > 0 && l.long_context.is_none());
            let Some(above) = above else {
                return Err(ConfigError::new(
                    field,
                    "names `above` (at least 1 prompt token) and no `long_context` of its own",
                ));
            };
            let rates = compile_rates(&field, l.written())?;
            Some(Tier { above, rates })
        }
    };
    Ok(Price { base, long })
}

/// One set of rates, each defaulted and checked.
fn compile_rates(field: &str, w: Written) -> Result<Rates, ConfigError> {
    let [input, cached, write, write_1h, output, reasoning] = w;
    let (Some(input), Some(output)) = (input, output) else {
        return Err(ConfigError::new(
            field,
            "a price names `input` and `output`",
        ));
    };
    let write = write.unwrap_or(input);
    let all = [
        input,
        cached.unwrap_or(input),
        write,
        write_1h.unwrap_or(write),
        output,
        reasoning.unwrap_or(output),
    ];
    let mut per_token = [0.0; 6];
    for ((slot, rate), name) in per_token.iter_mut().zip(all).zip(RATE_FIELDS) {
        if !(rate.is_finite() && (0.0..=MAX_RATE).contains(&rate)) {
            return Err(ConfigError::new(
                format!("{field}.{name}"),
                format!("{rate} is not a price per million tokens in [0, 1000000]"),
            ));
        }
        *slot = rate * NANOS_PER_TOKEN_PER_MILLION;
    }
    let [input, cached_input, cache_write, cache_write_1h, output, reasoning] = per_token;
    Ok(Rates {
        input,
        cached_input,
        cache_write,
        cache_write_1h,
        output,
        reasoning,
    })
}
