//! The span's part of the walk: the prompt and the completion captured when
//! `tracing.capture` asks, and the call's span queued for the OTLP export
//! (`tracing.otlp`). A build without spans (the sidecar build: spans are the
//! gateway tier's) has `span_off.rs` instead, and refuses those settings.

use crate::config::Config;
use crate::dialect::Dialect;
use crate::spans::{self, Captured};
use crate::summary::CallSummary;

use super::state::Response;
use super::{Call, Env, HeldBody};

impl Call {
    /// The prompt as the client sent it, captured when asked and when it
    /// goes somewhere: the record, or the span of a sampled trace.
    pub(super) fn capture_prompt(&mut self, env: &Env<'_>, body: &HeldBody) {
        let cfg = env.config;
        let spanned = cfg.otlp.is_some() && self.decided.span.is_some_and(|s| s.sampled());
        if !cfg.capture.prompt || !(cfg.access_log || spanned) {
            return;
        }
        if let Some(tree) = body.tree() {
            self.request.prompt = spans::capture::prompt(&cfg.capture, self.request.dialect, tree);
        }
    }

    /// The call's span, queued for export when spans are exported and the
    /// trace is sampled.
    pub(super) fn queue_span(&self, env: &mut Env<'_>, call: &CallSummary<'_>) {
        let (Some(otlp), Some(ids)) = (env.config.otlp.as_ref(), self.decided.span) else {
            return;
        };
        if !ids.sampled() {
            return;
        }
        let served = self.served();
        let finish = served.finish_reasons();
        let span = spans::encode(&ids, call, &self.details(env.config, &finish, served));
        env.spans.push(otlp, env.metrics, span);
    }

    /// The completion as captured, when `config` asks.
    pub(super) fn captured_completion<'a>(
        &self,
        response: &'a Response,
        dialect: Dialect,
        config: &Config,
    ) -> Option<&'a Captured> {
        response.completion(dialect, &config.capture)
    }
}
