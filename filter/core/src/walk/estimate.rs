//! The call's prompt-token estimate as its model counts tokens: the
//! estimate by script ([`crate::tokens`]) times the model's learnt ratio,
//! read from shared data at most once per call, by the first step that needs
//! it (shaping's token cap, routing's prompt-length rules, a limit's
//! reservation). A call whose estimate was used teaches the ratio at its end,
//! from the prompt tokens its provider reported.

use crate::dialect::features::Features;
use crate::summary::{CallSummary, End};
use crate::tokens::{calibration, Ratio};

use super::{Call, Env, HeldBody};

/// What the call knows of its estimate.
#[derive(Debug, Default)]
pub(super) struct Estimate {
    /// The model's ratio, once read.
    ratio: Option<Ratio>,
    /// The uncalibrated estimate of the body sent, and whether it counts
    /// every part of it.
    sent: Option<(u64, bool)>,
}

impl Call {
    /// The calibrated prompt-token estimate of `body`, the request as it
    /// stands: what the history cap, the prompt-length rules and a limit's
    /// reservation compare. `None` when the body is no request object.
    /// The first call of a request reads its model's ratio (one host call).
    pub(super) fn prompt_tokens_estimate(
        &mut self,
        env: &mut Env<'_>,
        body: &HeldBody,
    ) -> Option<u64> {
        let features = body.features.as_ref()?;
        let ratio = self.estimate_ratio(env);
        Some(ratio.apply(features.prompt_tokens))
    }

    /// `features` with the prompt estimate calibrated, for routing's rules.
    pub(super) fn calibrated_features(
        &mut self,
        env: &mut Env<'_>,
        features: &Features,
    ) -> Features {
        let ratio = self.estimate_ratio(env);
        features.calibrated(ratio)
    }

    /// The ratio read so far: [`Ratio::ONE`] when none was.
    pub(super) fn known_ratio(&self) -> Ratio {
        self.decided.estimate.ratio.unwrap_or(Ratio::ONE)
    }

    /// The ratio of the call's model, read once.
    pub(super) fn estimate_ratio(&mut self, env: &mut Env<'_>) -> Ratio {
        if let Some(r) = self.decided.estimate.ratio {
            return r;
        }
        let label = env.model_labels.value(self.model()).to_string();
        let r = calibration::ratio(env.store, &env.config.names, &label);
        self.decided.estimate.ratio = Some(r);
        r
    }

    /// The body goes upstream: its estimate is the one the provider's count
    /// is compared with.
    pub(super) fn note_sent_estimate(&mut self, body: &HeldBody) {
        self.decided.estimate.sent = body
            .features
            .as_ref()
            .map(|f| (f.prompt_tokens, f.measured));
    }

    /// The call's model learns its ratio from the prompt tokens the provider
    /// reported, when the call's estimate was used, counted every part of the
    /// prompt, and the backend answered it.
    pub(super) fn calibrate(&self, env: &mut Env<'_>, call: &CallSummary<'_>) {
        let est = &self.decided.estimate;
        let (Some(_), Some((estimated, true)), Some(usage)) =
            (est.ratio, est.sent, call.served.usage)
        else {
            return;
        };
        if !self.shaping_config(env.config).calibrate
            || !matches!(call.end(), End::Answered(200..=299))
        {
            return;
        }
        calibration::learn(
            env.store,
            env.metrics,
            &env.config.names,
            call.model,
            estimated,
            usage.prompt_tokens,
            env.now_ms,
        );
    }
}
