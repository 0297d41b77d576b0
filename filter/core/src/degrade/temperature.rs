//! The temperature a degraded call is lowered to: the requested one scaled
//! down as the model's live load rises, rounded down to two decimals:
//!
//! ```text
//! T = T_req × min(1, 0.6 × (1 − min(qps / qps_ref, 1)) + 0.4 × max(tokens_per_s / tokens_per_s_ref, 0.1))
//! ```
//!
//! `qps` and `tokens_per_s` are the model's live load signals, `qps_ref` and
//! `tokens_per_s_ref` the `degrade` settings of those names; the factor is
//! capped at 1, so a temperature is never raised. A request that names none
//! is taken at [`DEFAULT_T`], OpenAI's default, and gets the lowered one set.
//! A call lowered to the cache's temperature becomes cacheable.

use super::config::DegradeConfig;
use crate::dialect::request::Request;
use crate::json::{Document, Json};
use crate::load::Signals;

/// Weight of the calls-per-second term.
pub const QPS_WEIGHT: f64 = 0.6;
/// Weight of the tokens-per-second term.
pub const TOKENS_WEIGHT: f64 = 0.4;
/// Floor of the tokens-per-second ratio.
pub const TOKENS_FLOOR: f64 = 0.1;
/// The temperature of a request that names none (OpenAI's default).
pub const DEFAULT_T: f64 = 1.0;
/// Decimals the lowered temperature is written with.
const DECIMALS: f64 = 100.0;

/// The factor the requested temperature is multiplied by, in `[0, 1]`.
pub fn factor(cfg: &DegradeConfig, s: &Signals) -> f64 {
    if !s.rps.is_finite() || !s.tokens_per_s.is_finite() {
        return 1.0;
    }
    let qps = (s.rps / cfg.qps_ref).min(1.0);
    let tokens = (s.tokens_per_s / cfg.tokens_per_s_ref).max(TOKENS_FLOOR);
    let f = QPS_WEIGHT * (1.0 - qps) + TOKENS_WEIGHT * tokens;
    if f.is_finite() {
        f.clamp(0.0, 1.0)
    } else {
        1.0
    }
}

/// The lowered temperature of `t_req`, rounded down to two decimals.
pub fn lowered(t_req: f64, cfg: &DegradeConfig, s: &Signals) -> f64 {
    (t_req * factor(cfg, s) * DECIMALS).floor() / DECIMALS
}

/// Lowers the temperature of a body of `api`, where the API keeps it;
/// false, and nothing changed, when nothing changes (a factor of 1, a
/// temperature of 0) or the temperature is not a number.
pub fn lower(doc: &mut Document, api: &dyn Request, cfg: &DegradeConfig, s: &Signals) -> bool {
    let sampling = doc.tree().and_then(|tree| api.sampling(tree));
    let t_req = match sampling.and_then(|s| s.get("temperature")) {
        None | Some(Json::Null) => DEFAULT_T,
        Some(Json::Number(n)) => match n.parse::<f64>() {
            Ok(t) if t.is_finite() && t >= 0.0 => t,
            _ => return false,
        },
        Some(_) => return false,
    };
    let t = lowered(t_req, cfg, s);
    if t >= t_req {
        return false;
    }
    api.set_temperature(doc, t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    fn signals(rps: f64, tokens_per_s: f64) -> Signals {
        Signals {
            rps,
            tokens_per_s,
            in_flight: 0,
        }
    }

    #[test]
    fn the_rule_lowers_with_load_and_never_raises() {
        let cfg = DegradeConfig::default(); // qps_ref 10, tokens_per_s_ref 1000
        for (rps, tps, want) in [
            (0.0, 0.0, 0.64),     // 0.6 + 0.4 × 0.1
            (5.0, 0.0, 0.34),     // 0.3 + 0.04
            (10.0, 0.0, 0.04),    // qps term gone, token floor left
            (50.0, 500.0, 0.2),   // 0 + 0.4 × 0.5
            (0.0, 5000.0, 1.0),   // capped: never raised
            (f64::NAN, 0.0, 1.0), // a broken signal changes nothing
        ] {
            let f = factor(&cfg, &signals(rps, tps));
            assert!((f - want).abs() < 1e-9, "{rps} {tps}: {f}");
        }
        assert_eq!(lowered(0.7, &cfg, &signals(5.0, 0.0)), 0.23);
        assert_eq!(lowered(0.0, &cfg, &signals(5.0, 0.0)), 0.0);
    }

    #[test]
    fn the_body_gets_the_lowered_temperature() {
        let cfg = DegradeConfig::default();
        let s = signals(5.0, 0.0);
        for (body, want) in [
            (
                r#"{"model":"m","temperature":0.7}"#,
                Some(r#"{"model":"m","temperature":0.23}"#),
            ),
            (
                r#"{"model":"m"}"#,
                Some(r#"{"model":"m","temperature":0.34}"#),
            ),
            (
                r#"{"model":"m","temperature":null}"#,
                Some(r#"{"model":"m","temperature":0.34}"#),
            ),
            (r#"{"model":"m","temperature":0}"#, None),
            (r#"{"model":"m","temperature":"hot"}"#, None),
        ] {
            let mut doc = Document::parse(body.as_bytes().to_vec());
            let got = lower(&mut doc, Dialect::Chat.request(), &cfg, &s).then(|| doc.into_bytes());
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{body}");
        }
        // Unloaded but for the floor, and no temperature to lower: unchanged.
        let none = signals(0.0, 5000.0);
        let body = r#"{"temperature":0.5}"#;
        assert!(!lower(
            &mut Document::parse(body.as_bytes().to_vec()),
            Dialect::Chat.request(),
            &cfg,
            &none
        ));
    }

    #[test]
    fn a_gemini_temperature_is_lowered_in_its_generation_config() {
        let cfg = DegradeConfig::default();
        let s = signals(5.0, 0.0);
        for (body, want) in [
            (
                r#"{"contents":[],"generationConfig":{"temperature":0.7,"topK":3}}"#,
                Some(r#"{"contents":[],"generationConfig":{"temperature":0.23,"topK":3}}"#),
            ),
            (
                r#"{"contents":[]}"#,
                Some(r#"{"contents":[],"generationConfig":{"temperature":0.34}}"#),
            ),
            // The top level is no sampling of Gemini's: the default is lowered.
            (
                r#"{"temperature":0,"generationConfig":{}}"#,
                Some(r#"{"temperature":0,"generationConfig":{"temperature":0.34}}"#),
            ),
            (r#"{"generationConfig":{"temperature":0}}"#, None),
            (r#"{"generationConfig":{"temperature":"hot"}}"#, None),
        ] {
            let mut doc = Document::parse(body.as_bytes().to_vec());
            let api = Dialect::Gemini.request();
            let got = lower(&mut doc, api, &cfg, &s).then(|| doc.into_bytes());
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{body}");
        }
    }
}
