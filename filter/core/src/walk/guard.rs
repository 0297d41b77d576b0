//! The guard step of the walk (see [`crate::guard::policy`]): once the
//! body is held and read, before anything reads its prompt (capture, the
//! affinity key, the cache key, the trip upstream), the prompt is checked
//! against the guardrails' rules. A call a rule blocks is refused in its
//! API's shape, naming the rule and never what it found; a call a rule
//! masks goes on with each value replaced by its placeholder, so the cache
//! keys and capture see the masked text only.

use std::ops::ControlFlow;

use crate::budget::reply;
use crate::dialect::answer::ReplyKind;
use crate::guard::policy::{Side, Unchecked, Verdict};
use crate::guard::Vault;
use crate::metrics::{self as names};

use super::{set_request, Call, Env, Flow, HeldBody, Host};

/// Why a prompt could not be checked whole.
#[derive(Debug, Clone, Copy)]
enum Unread {
    /// The body streamed through, unheld.
    NotHeld,
    /// The body is no JSON document.
    NotJson,
    /// The prompt is longer than `guardrails.max_scan_bytes`.
    TooLong,
}

impl Unread {
    fn as_str(self) -> &'static str {
        match self {
            Self::NotHeld => "not_held",
            Self::NotJson => "not_json",
            Self::TooLong => "too_long",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Self::NotHeld => {
                "The request could not be checked by the guardrails: its body was not held \
                 (send it with a content-length, within the proxy's body limit)."
            }
            Self::NotJson => {
                "The request could not be checked by the guardrails: its body is not JSON."
            }
            Self::TooLong => {
                "The request could not be checked by the guardrails: its prompt is longer than \
                 they read."
            }
        }
    }
}

impl Call {
    /// Checks the call's prompt; `Break` when the call was refused.
    pub(super) fn guard(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        if env.config.guardrails.reads(Side::Answer) {
            // The answer is read as it passes; a compressed one could not be.
            set_request(env, host, "accept-encoding", None);
        }
        let rules = &env.config.guardrails;
        // The rules of the call's priority and model.
        let scope = rules.applying(self.request.priority, self.request.view.model.as_deref());
        self.decided.vault.limit_to(scope);
        if !rules.reads(Side::Prompt) {
            return ControlFlow::Continue(body);
        }
        let api = self.request.dialect;
        let mut vault = Vault::new();
        vault.limit_to(scope);
        let (verdict, unread) = match body.as_ref().map(HeldBody::tree) {
            None => (None, Some(Unread::NotHeld)),
            Some(None) => (None, Some(Unread::NotJson)),
            Some(Some(tree)) => {
                let v = rules.check(tree, api.request().guarded_fields(), &mut vault);
                let unread = v.truncated.then_some(Unread::TooLong);
                (Some(v), unread)
            }
        };
        if let Some(v) = &verdict {
            self.note_fired(env, v);
            if let Some(rule) = v.blocked_by() {
                let name = rules.rules.get(rule).map_or("", |r| r.name.as_str());
                let message = format!(
                    "The request was blocked by the guardrail rule `{name}`; nothing was sent."
                );
                let r = reply::with_message(ReplyKind::Blocked, &message, None);
                return ControlFlow::Break(self.reply_locally(env, host, r));
            }
        }
        if let Some(why) = unread.filter(|_| rules.enforces(Side::Prompt)) {
            let refused = rules.unchecked == Unchecked::Refuse;
            let labels = [
                ("reason", why.as_str()),
                ("result", if refused { "refused" } else { "allowed" }),
                ("api", api.api()),
            ];
            env.metrics
                .counter(&names::name(names::GUARDRAIL_UNCHECKED, &labels), 1);
            if refused {
                let r = reply::with_message(ReplyKind::Unchecked, why.message(), None);
                return ControlFlow::Break(self.reply_locally(env, host, r));
            }
        }
        // Kept for the answer: its placeholders are put back there.
        if vault.restores() && !env.config.guardrails.reads(Side::Answer) {
            set_request(env, host, "accept-encoding", None);
        }
        self.decided.vault = vault;
        let mut body = body;
        if let (Some(b), Some(v)) = (body.as_mut(), verdict) {
            if !v.edits.is_empty() {
                for (field, bytes, tree) in v.edits {
                    b.doc.set(field, &bytes, tree);
                }
                b.was_edited();
            }
        }
        ControlFlow::Continue(body)
    }

    /// Counts each rule that fired and keeps their names for the span and
    /// the record.
    fn note_fired(&mut self, env: &mut Env<'_>, v: &Verdict) {
        let rules = &env.config.guardrails.rules;
        let api = self.request.dialect.api();
        let mut named = Vec::with_capacity(v.fired.len());
        for rule in v.fired.iter().filter_map(|k| rules.get(*k)) {
            let labels = [
                ("rule", rule.name.as_str()),
                ("action", rule.action.as_str()),
                ("api", api),
            ];
            env.metrics
                .counter(&names::name(names::GUARDRAIL_FIRED, &labels), 1);
            named.push(format!("{}:{}", rule.name, rule.action.as_str()));
        }
        if !named.is_empty() {
            self.decided.guardrails = Some(named.join(","));
        }
    }
}
