//! How one call ended, decided once, and what the walk knew of it at the end:
//! a [`CallSummary`] of the call, and a [`Try`] of each backend it asked.
//! Every policy maps [`End`] to what it needs, and the differences between
//! them are deliberate:
//!
//! | [`End`]                     | requests `outcome` | routing health (`outcome`, verdict) | budget breaker sample |
//! |-----------------------------|--------------------|-------------------------------------|-----------------------|
//! | `Local` 4xx/5xx (refused)   | `refused`          | not sent: in-flight count only      | none                  |
//! | `Local` 2xx (cache)         | `success`          | not sent: in-flight count only      | none                  |
//! | `Answered` 2xx, 3xx         | `success`          | `success`, success                  | budget used           |
//! | `Answered` 429              | `rate_limited`     | `rate_limited`, failure             | budget used           |
//! | `Answered` other 4xx        | `client_error`     | `client_error`, refused (alive)     | budget used           |
//! | `Answered` 5xx              | `server_error`     | `server_error`, failure             | failure (all budget)  |
//! | `TimedOut` (Envoy's 504)    | `server_error`     | `timeout`, failure                  | failure (all budget)  |
//! | `Reset` (Envoy's 503)       | `reset`            | `reset`, failure                    | failure (all budget)  |
//! | `NoCredential` (the gateway's 503) | `server_error` | `server_error`, failure         | none                  |
//! | `Cut` (answer began, never ended) | `incomplete`  | `cancelled`, nothing learnt         | none                  |
//! | `Abandoned` (client left)   | `reset`            | `cancelled`, nothing learnt         | none                  |
//! | `Outlasted` (a try a hedge beat) | never a call's end | `outlasted`, at least that slow | none              |
//!
//! A call that failed over ends as the answer of the backend that answered
//! it; the backend that failed it learns that try's end when the walk turns
//! to the other one.
//!
//! Why: a 429 is the provider pacing this caller, so routing moves load away
//! while the budget breaker (which measures time eaten, not refusals) does not
//! count it; a missing or refused mesh credential moves load to a backend
//! holding one but says nothing of the backend's pressure; a client that
//! leaves says nothing about the backend; and the requests counter keeps the
//! status the client saw. A cut answer may be the
//! upstream's doing or the client's, which the filter cannot tell apart: the
//! backend learns nothing from it.

use crate::dialect::Dialect;
use crate::priority::Priority;
use crate::usage::Usage;

/// Envoy's `response.code_details` of its own timeout replies (global and
/// per-try). The router calls the global one `response_timeout` (Envoy 1.40);
/// older releases said `upstream_response_timeout`.
pub const ENVOY_TIMEOUT_DETAILS: [&str; 4] = [
    "response_timeout",
    "upstream_response_timeout",
    "upstream_per_try_timeout",
    "upstream_per_try_idle_timeout",
];

/// Envoy's `response.code_details` prefix of its reply to an upstream that
/// reset (or refused) the stream before any response.
pub const UPSTREAM_RESET_DETAILS: &str = "upstream_reset_before_response_started";

/// Envoy's `response.code_details` of its 413 to a request body larger than
/// its buffer limit (the filter held it, or another filter did).
pub const TOO_LARGE_DETAILS: &str = "request_payload_too_large";

/// Why Envoy answered a call itself instead of the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvoyReply {
    /// Its router timed out (504).
    Timeout,
    /// The upstream reset the stream before responding (503).
    Reset,
    /// The request body outgrew Envoy's buffer limit (413): the request
    /// never went upstream.
    TooLarge,
    /// The cluster's `credential_injector` had no mesh credential to put on
    /// (401): the request never went upstream. A keyless call's 401 from
    /// the provider, which refused the mesh's credential, is read as this
    /// too.
    NoCredential,
}

impl EnvoyReply {
    /// Recognises Envoy's own reply from its status and `response.code_details`;
    /// `None` for an answer from the upstream (a 504 the upstream sent passes
    /// as it is).
    pub fn of(status: u16, code_details: Option<&str>) -> Option<Self> {
        let details = code_details?;
        if status == 504 && ENVOY_TIMEOUT_DETAILS.contains(&details) {
            Some(Self::Timeout)
        } else if status >= 500 && details.starts_with(UPSTREAM_RESET_DETAILS) {
            Some(Self::Reset)
        } else if status == 413 && details == TOO_LARGE_DETAILS {
            Some(Self::TooLarge)
        } else if status == 401 && details == crate::credentials::NOT_INJECTED_DETAILS {
            Some(Self::NoCredential)
        } else {
            None
        }
    }
}

/// How a call ended. See the module table for what each policy makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The filter answered the call itself with this status: from the cache,
    /// or refused (shed, circuit open, budget spent).
    Local(u16),
    /// The upstream answered with this status.
    Answered(u16),
    /// The upstream's answer with this status started but never ended: the
    /// upstream reset mid-answer or the client left.
    Cut(u16),
    /// Envoy gave up waiting for the upstream and answered with this status.
    TimedOut(u16),
    /// The upstream reset the stream before responding; Envoy answered with
    /// this status.
    Reset(u16),
    /// No response at all: Envoy answers every upstream failure itself, so
    /// the client went away first.
    Abandoned,
    /// Not a call's end but a try's: another backend's answer (a hedge's)
    /// reached the client first and this try was dropped unanswered.
    Outlasted,
    /// The backend's mesh credential was missing (Envoy's injector refused
    /// the call before it left) or refused by the provider; the client got
    /// this status, the gateway's.
    NoCredential(u16),
}

impl End {
    /// Decides how a call ended: `local` is the status of the filter's own
    /// reply, `status` the response status that reached the filter, `envoy`
    /// why Envoy itself answered, `complete` whether the response's end passed.
    pub fn classify(
        local: Option<u16>,
        status: Option<u16>,
        envoy: Option<EnvoyReply>,
        complete: bool,
    ) -> Self {
        match (local, status, envoy) {
            (Some(s), _, _) => Self::Local(s),
            (None, None, _) => Self::Abandoned,
            (None, Some(s), Some(EnvoyReply::Timeout)) => Self::TimedOut(s),
            (None, Some(s), Some(EnvoyReply::Reset)) => Self::Reset(s),
            // Envoy's own refusal of the request, answered as it is.
            (None, Some(s), Some(EnvoyReply::TooLarge)) => Self::Answered(s),
            (None, Some(s), Some(EnvoyReply::NoCredential)) => Self::NoCredential(s),
            (None, Some(s), None) if !complete => Self::Cut(s),
            (None, Some(s), None) => Self::Answered(s),
        }
    }

    /// The filter answered without going upstream.
    pub fn is_local(self) -> bool {
        matches!(self, Self::Local(_))
    }

    /// The upstream answered with a 2xx, whole or cut short.
    pub fn upstream_success(self) -> bool {
        matches!(self, Self::Answered(200..=299) | Self::Cut(200..=299))
    }
}

/// What a call was when it ended: what it asked for, and the try that
/// served it. The request metrics, the span, the record, the limits and the
/// model's load read it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallSummary<'a> {
    /// The API the call spoke (the `api` label of the request metrics).
    pub api: Dialect,
    /// The call's priority.
    pub priority: Priority,
    /// The model label (already bounded).
    pub model: &'a str,
    /// The call's A/B group, when A/B is on.
    pub group: Option<&'a str>,
    /// The try whose answer (or lack of one) reached the client: the call
    /// ended as it did.
    pub served: Try<'a>,
}

impl CallSummary<'_> {
    /// How the call ended: as the try that served it.
    pub fn end(&self) -> End {
        self.served.end
    }
}

/// One try of a call on one backend: what that backend's health, its
/// breaker and its load record learn from. A call makes one try per backend
/// it asks (a failover's, a hedge's); each is summarised on its own, with
/// its own end and its own usage, and knows nothing of the call's model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Try<'a> {
    /// The cluster the try went to, when routing placed it.
    pub cluster: Option<&'a str>,
    /// The breaker that admitted the try (it went upstream under a budget plan).
    pub breaker: Option<&'a str>,
    /// How it ended.
    pub end: End,
    /// When the call's request headers arrived, ms: a try's latency is the
    /// caller's wait.
    pub started_ms: u64,
    /// When the try's response headers arrived, ms.
    pub response_headers_ms: Option<u64>,
    /// When the try's first response body byte passed, ms.
    pub first_byte_ms: Option<u64>,
    /// When the try ended, ms.
    pub ended_ms: u64,
    /// Tokens the provider reported for this try's answer.
    pub usage: Option<Usage>,
    /// The try's answer was an SSE stream.
    pub streamed: bool,
    /// The caller's budget the try ran under, ms.
    pub budget_ms: u64,
    /// Retries the plan let Envoy make.
    pub planned_retries: u32,
    /// Envoy's attempt count, when it said.
    pub attempts: Option<u32>,
    /// Other backends asked after this try's backend failed it (each
    /// counts as a retry).
    pub failovers: u32,
}

impl Try<'_> {
    /// From the request to the end of the try, ms.
    pub fn elapsed_ms(&self) -> u64 {
        self.ended_ms.saturating_sub(self.started_ms)
    }

    /// From the request to the try's first response body byte, ms, when one came.
    pub fn first_byte_after_ms(&self) -> Option<u64> {
        self.first_byte_ms
            .map(|t| t.saturating_sub(self.started_ms))
    }
}

#[cfg(test)]
impl Try<'static> {
    /// A try on no cluster that ended as `end` at time 0, for tests.
    pub(crate) fn ended(end: End) -> Self {
        Self {
            cluster: None,
            breaker: None,
            end,
            started_ms: 0,
            response_headers_ms: None,
            first_byte_ms: None,
            ended_ms: 0,
            usage: None,
            streamed: false,
            budget_ms: 0,
            planned_retries: 0,
            attempts: None,
            failovers: 0,
        }
    }
}

#[cfg(test)]
impl CallSummary<'static> {
    /// A call of model `m` at priority P1 that ended as `end` at time 0, for tests.
    pub(crate) fn ended(end: End) -> Self {
        Self {
            api: Dialect::Chat,
            priority: Priority::P1,
            model: "m",
            group: None,
            served: Try::ended(end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_success_is_a_2xx_of_the_upstream_whole_or_cut() {
        for (end, success) in [
            (End::Answered(200), true),
            (End::Answered(299), true),
            (End::Cut(200), true),
            (End::Answered(300), false),
            (End::Answered(429), false),
            (End::Local(200), false),
            (End::TimedOut(504), false),
            (End::Reset(503), false),
            (End::Cut(500), false),
            (End::Abandoned, false),
            (End::Outlasted, false),
        ] {
            assert_eq!(end.upstream_success(), success, "{end:?}");
        }
    }

    #[test]
    fn envoy_replies_are_recognised_by_details() {
        for (status, details, want) in [
            (504, Some("response_timeout"), Some(EnvoyReply::Timeout)),
            (
                504,
                Some("upstream_response_timeout"),
                Some(EnvoyReply::Timeout),
            ),
            (
                504,
                Some("upstream_per_try_timeout"),
                Some(EnvoyReply::Timeout),
            ),
            (503, Some("upstream_response_timeout"), None),
            (504, Some("via_upstream"), None),
            (504, None, None),
            (408, Some("response_timeout"), None),
            (
                503,
                Some("upstream_reset_before_response_started{connection_failure}"),
                Some(EnvoyReply::Reset),
            ),
            (200, Some(UPSTREAM_RESET_DETAILS), None),
            (503, Some("via_upstream"), None),
            (413, Some(TOO_LARGE_DETAILS), Some(EnvoyReply::TooLarge)),
            (413, Some("via_upstream"), None),
        ] {
            assert_eq!(
                EnvoyReply::of(status, details),
                want,
                "{status} {details:?}"
            );
        }
    }

    #[test]
    fn the_end_is_classified_once() {
        use EnvoyReply::{Reset, Timeout};
        for (local, status, envoy, want) in [
            (Some(503), None, None, End::Local(503)),
            (Some(200), Some(500), Some(Timeout), End::Local(200)),
            (None, None, None, End::Abandoned),
            (None, None, Some(Reset), End::Abandoned),
            (None, Some(504), Some(Timeout), End::TimedOut(504)),
            (None, Some(503), Some(Reset), End::Reset(503)),
            (None, Some(429), None, End::Answered(429)),
            (
                None,
                Some(503),
                Some(EnvoyReply::NoCredential),
                End::NoCredential(503),
            ),
            (
                None,
                Some(413),
                Some(EnvoyReply::TooLarge),
                End::Answered(413),
            ),
        ] {
            assert_eq!(End::classify(local, status, envoy, true), want);
        }
        for (local, status, envoy, want) in [
            (None, Some(200), None, End::Cut(200)),
            (None, Some(504), Some(Timeout), End::TimedOut(504)),
            (Some(200), None, None, End::Local(200)),
        ] {
            assert_eq!(End::classify(local, status, envoy, false), want);
        }
        assert!(End::Local(200).is_local());
        assert!(!End::Abandoned.is_local());
    }
}
