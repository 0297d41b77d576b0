//! Local replies for calls the budget stops, in the caller's dialect's error
//! shape so SDKs surface the reason (and honour `retry-after`) instead of
//! failing to parse a proxy's plain-text page. Envoy's own timeout reply is
//! rewritten the same way. This module keeps why, the status and the retry
//! policy; the dialect ([`crate::dialect::answer::Answer::local_error`])
//! says it in its words.

use super::breaker::Admit;
use crate::dialect::Dialect;

pub use crate::dialect::chat::error_body;

/// A reply the filter sends in place of the upstream's, in OpenAI's shape
/// until [`LocalReply::in_dialect`] puts it in the caller's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    /// HTTP status.
    pub status: u32,
    /// Response headers, `content-type` and `retry-after` among them.
    pub headers: Vec<(&'static str, String)>,
    /// JSON body.
    pub body: Vec<u8>,
    /// Why, and in what words.
    kind: ReplyKind,
    message: String,
}

impl LocalReply {
    /// The same reply in the error shape of the caller's dialect, with the
    /// status its SDKs map to the matching error (Anthropic's 529
    /// `overloaded_error` for a shed or refused call, which they retry after
    /// `retry-after`).
    pub fn in_dialect(mut self, dialect: Dialect) -> Self {
        let (status, body) = dialect.answer().local_error(self.kind, &self.message);
        self.status = status;
        self.body = body;
        self
    }
}

/// The header OpenAI's SDKs obey over their own retry rules (`false`: do not
/// retry this answer, whatever its status).
pub const SHOULD_RETRY: &str = "x-should-retry";

/// Why the budget answered locally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// Shed by the breaker's shed tier (503).
    Shed,
    /// Rejected by the breaker's reject tier (503).
    Reject,
    /// The budget was spent before the call could be forwarded (504).
    BudgetExhausted,
    /// Envoy ended the call at the budget (504), its reply rewritten.
    UpstreamTimeout,
    /// Envoy refused a request body larger than its buffer limit (413), its
    /// reply rewritten.
    TooLarge,
    /// Shed by the load-driven degrade (503).
    DegradeShed,
    /// Rejected by the load-driven degrade (503).
    DegradeReject,
    /// Over a limit of `limits` (429).
    OverLimit,
    /// No virtual key or verified identity, or an unknown key (401).
    Unauthenticated,
}

impl ReplyKind {
    /// HTTP status.
    pub fn status(self) -> u32 {
        match self {
            Self::Shed | Self::Reject | Self::DegradeShed | Self::DegradeReject => 503,
            Self::BudgetExhausted | Self::UpstreamTimeout => 504,
            Self::TooLarge => 413,
            Self::OverLimit => 429,
            Self::Unauthenticated => 401,
        }
    }

    /// The error `type`.
    pub fn error_type(self) -> &'static str {
        match self {
            Self::Shed | Self::Reject | Self::DegradeShed | Self::DegradeReject => {
                "service_unavailable"
            }
            Self::BudgetExhausted | Self::UpstreamTimeout => "timeout",
            Self::TooLarge | Self::Unauthenticated => "invalid_request_error",
            Self::OverLimit => "rate_limit_exceeded",
        }
    }

    /// The error `code`, stable for clients and alerts to match on.
    pub fn code(self) -> &'static str {
        match self {
            Self::Shed => "llm_filter_shed",
            Self::Reject => "llm_filter_circuit_open",
            Self::BudgetExhausted => "llm_filter_budget_exhausted",
            Self::UpstreamTimeout => "llm_filter_upstream_timeout",
            Self::TooLarge => "llm_filter_request_too_large",
            Self::DegradeShed => "llm_filter_degraded_shed",
            Self::DegradeReject => "llm_filter_degraded_reject",
            Self::OverLimit => "llm_filter_limit_exceeded",
            // OpenAI's own code, which its SDKs and apps already match on.
            Self::Unauthenticated => "invalid_api_key",
        }
    }

    /// The caller's whole budget is gone: a retry can no longer meet its
    /// deadline, only add load, so the reply tells SDKs not to make one.
    pub fn spends_the_budget(self) -> bool {
        matches!(self, Self::BudgetExhausted | Self::UpstreamTimeout)
    }

    /// The default human-readable message.
    pub fn message(self) -> &'static str {
        match self {
            Self::Shed => {
                "The backend is under pressure and lower-priority requests are being shed; \
                 retry later."
            }
            Self::Reject => {
                "The backend is failing and the circuit is open for this priority; retry later."
            }
            Self::BudgetExhausted => {
                "The request's timeout budget was spent before it could be sent upstream."
            }
            Self::UpstreamTimeout => {
                "The upstream did not answer within the request's timeout budget."
            }
            Self::TooLarge => "The request body is larger than the proxy accepts.",
            Self::DegradeShed => {
                "The model is degraded under load and lower-priority requests are being shed; \
                 retry later."
            }
            Self::DegradeReject => {
                "The model is degraded under load and rejects this priority for now; retry later."
            }
            Self::OverLimit => "A usage limit of this caller is reached; retry later.",
            Self::Unauthenticated => "Incorrect API key provided.",
        }
    }
}

/// The reply of `kind` with its default message.
pub fn local_reply(kind: ReplyKind, retry_after_s: Option<u64>) -> LocalReply {
    with_message(kind, kind.message(), retry_after_s)
}

/// The reply of `kind` with a message of the caller's (escaped, never trusted).
pub fn with_message(kind: ReplyKind, message: &str, retry_after_s: Option<u64>) -> LocalReply {
    let mut headers = vec![
        ("content-type", "application/json".to_string()),
        // A refusal is about this moment; no cache may replay it.
        ("cache-control", "no-store".to_string()),
    ];
    if let Some(s) = retry_after_s {
        headers.push(("retry-after", s.to_string()));
    }
    if kind.spends_the_budget() {
        headers.push((SHOULD_RETRY, "false".to_string()));
    }
    LocalReply {
        status: kind.status(),
        headers,
        body: error_body(message, kind.error_type(), kind.code()),
        kind,
        message: message.to_string(),
    }
}

/// The reply for a breaker refusal, `None` for a pass.
pub fn for_admit(admit: &Admit, retry_after_s: Option<u64>) -> Option<LocalReply> {
    match admit {
        Admit::Pass => None,
        Admit::Shed { .. } => Some(local_reply(ReplyKind::Shed, retry_after_s)),
        Admit::Reject { .. } => Some(local_reply(ReplyKind::Reject, retry_after_s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Reason;

    fn parsed(r: &LocalReply) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    #[test]
    fn a_messages_caller_gets_anthropics_shape_and_status() {
        for (kind, status, error_type) in [
            (ReplyKind::Shed, 529, "overloaded_error"),
            (ReplyKind::DegradeReject, 529, "overloaded_error"),
            (ReplyKind::BudgetExhausted, 504, "timeout_error"),
            (ReplyKind::TooLarge, 413, "request_too_large"),
        ] {
            let openai = local_reply(kind, Some(3));
            let r = openai.clone().in_dialect(Dialect::Messages);
            assert_eq!(r.status, status, "{kind:?}");
            assert_eq!(r.headers, openai.headers, "{kind:?}");
            let v = parsed(&r);
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], error_type);
            assert_eq!(v["error"]["message"], kind.message());
            assert_eq!(v["error"]["code"], kind.code());
            for other in [Dialect::Chat, Dialect::Responses, Dialect::Embeddings] {
                assert_eq!(openai.clone().in_dialect(other), openai, "{other:?}");
            }
        }
    }

    #[test]
    fn replies_have_the_openai_shape() {
        for (kind, status, code) in [
            (ReplyKind::Shed, 503, "llm_filter_shed"),
            (ReplyKind::Reject, 503, "llm_filter_circuit_open"),
            (
                ReplyKind::BudgetExhausted,
                504,
                "llm_filter_budget_exhausted",
            ),
            (
                ReplyKind::UpstreamTimeout,
                504,
                "llm_filter_upstream_timeout",
            ),
        ] {
            let r = local_reply(kind, Some(7));
            assert_eq!(r.status, status);
            let v = parsed(&r);
            assert_eq!(v["error"]["code"], code);
            assert_eq!(v["error"]["type"], kind.error_type());
            assert_eq!(v["error"]["message"], kind.message());
            assert_eq!(v.as_object().unwrap().len(), 1);
            assert!(r
                .headers
                .contains(&("content-type", "application/json".to_string())));
            assert!(r.headers.contains(&("retry-after", "7".to_string())));
        }
        let r = local_reply(ReplyKind::UpstreamTimeout, None);
        assert!(r.headers.iter().all(|(k, _)| *k != "retry-after"));
    }

    #[test]
    fn only_a_spent_budget_tells_sdks_not_to_retry() {
        let no_retry = (SHOULD_RETRY, "false".to_string());
        for (kind, spent) in [
            (ReplyKind::Shed, false),
            (ReplyKind::Reject, false),
            (ReplyKind::BudgetExhausted, true),
            (ReplyKind::UpstreamTimeout, true),
            (ReplyKind::TooLarge, false),
        ] {
            let r = local_reply(kind, None);
            assert_eq!(r.headers.contains(&no_retry), spent, "{kind:?}");
        }
    }

    #[test]
    fn messages_are_escaped() {
        let nasty = "quote \" backslash \\ newline \n nul \u{0} </script> ünï";
        let r = with_message(ReplyKind::Shed, nasty, None);
        assert_eq!(parsed(&r)["error"]["message"], nasty);
        assert!(!r.body.contains(&b'\n'));
    }

    #[test]
    fn admit_maps_to_reply() {
        assert_eq!(for_admit(&Admit::Pass, Some(1)), None);
        let shed = for_admit(
            &Admit::Shed {
                reason: Reason::Pressure,
            },
            Some(3),
        )
        .unwrap();
        assert_eq!(parsed(&shed)["error"]["code"], "llm_filter_shed");
        let open = for_admit(
            &Admit::Reject {
                reason: Reason::CircuitOpen,
            },
            Some(15),
        )
        .unwrap();
        assert_eq!(parsed(&open)["error"]["code"], "llm_filter_circuit_open");
    }
}
