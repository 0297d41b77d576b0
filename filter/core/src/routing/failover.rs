//! Cross-cluster failover. Envoy's retries stay on the cluster the routing
//! header named, so a backend that fails a call would get every retry too.
//! When the chosen backend fails a held call in a way another backend could
//! answer, the walk sends the held request to another backend of the model
//! itself (an HTTP callout) and answers the client with that response; this
//! module says which failures qualify and what the callout and the reply carry.

use crate::dialect::provider;
use crate::host::Metrics;
use crate::metrics::{self as names};
use crate::summary::End;

/// Whether another backend may answer a call that ended so: a 5xx, a 429
/// (this backend pacing the caller, a model not ready yet, or a quota of
/// this backend's account spent), a 402 (Anthropic's `billing_error`: this
/// backend's account is out of credit, and another provider bills its own),
/// a 408 (the model took too long:
/// Bedrock's `ModelTimeoutException`; the SDKs retry it too), a 424 (the model failed while processing a valid call:
/// Bedrock's `ModelErrorException`, where a bad call is a 400
/// `ValidationException`; the same model elsewhere may not fail it), a
/// reset or refused connection, or Envoy's timeout of this backend.
pub fn retriable(end: End) -> bool {
    match end {
        End::Answered(s) => matches!(s, 402 | 408 | 424 | 429 | 500..=599),
        // Another backend may hold a credential of its own.
        End::TimedOut(_) | End::Reset(_) | End::NoCredential(_) => true,
        // Part of a cut answer already reached the client.
        End::Local(_) | End::Abandoned | End::Outlasted | End::Cut(_) => false,
    }
}

/// [`retriable`], unless the backend said otherwise: an error answer with
/// `x-should-retry: true` or `false` is retriable or not as it says, as
/// OpenAI's and Anthropic's SDKs take it (Anthropic's 529 `overloaded_error`
/// is a 5xx, retriable either way).
pub fn retriable_as_told(end: End, should_retry: Option<bool>) -> bool {
    match (end, should_retry) {
        (End::Answered(s), Some(told)) if s >= 400 => told,
        _ => retriable(end),
    }
}

/// Reads an `x-should-retry` header value: `true` or `false`, else nothing.
pub fn should_retry(value: &str) -> Option<bool> {
    match value.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// What an error answer tells of another backend taking the call: its
/// `x-should-retry` (`should_retry`), else yes when AWS's error type
/// (`error_type`, [`provider::ERROR_TYPE`]) names the account's quota spent,
/// Bedrock's 400 `ServiceQuotaExceededException`: another provider's
/// backend of the model bills its own account, as for a spent quota's 429.
pub fn told(should_retry: Option<&str>, error_type: Option<&str>) -> Option<bool> {
    should_retry
        .and_then(self::should_retry)
        .or_else(|| error_type.and_then(provider::refusal_named).map(|_| true))
}

/// How a failover ended, as the `result` label of the failovers counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverResult {
    /// The other backend answered (no failure [`retriable`] names): the client got
    /// it, unless a refusal of it moved the call along its fallback chain.
    Answered,
    /// The other backend failed too; the client got its answer.
    Failed,
    /// The other backend gave no answer in the budget left; the client got
    /// the first backend's failure.
    NoAnswer,
    /// The callout could not be sent; the client got the first failure.
    NotSent,
    /// A limit of the model a fallback would reach held the call back: the
    /// client got that limit's 429, or the first model's answer when the
    /// limit's rule degrades.
    Limited,
}

impl FailoverResult {
    /// The result of a failover whose callout answered with `status`.
    pub fn of(status: Option<u16>) -> Self {
        match status {
            None => Self::NoAnswer,
            Some(s) if retriable(End::Answered(s)) => Self::Failed,
            Some(_) => Self::Answered,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Failed => "failed",
            Self::NoAnswer => "no_answer",
            Self::NotSent => "not_sent",
            Self::Limited => "limited",
        }
    }
}

/// Counts a failover by its result.
pub fn count(m: &mut dyn Metrics, result: FailoverResult) {
    m.counter(
        &names::name(names::ROUTING_FAILOVERS, &[("result", result.as_str())]),
        1,
    );
}

/// Request headers the callout must not carry: the routing header (the
/// callout names its cluster itself), Envoy's router instructions (the
/// callout's timeout is what is left of the budget), and what the new body
/// or the callout's own connection sets.
fn dropped_from_callout(name: &str, cluster_header: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == cluster_header
        || n.starts_with("x-envoy-")
        || matches!(
            n.as_str(),
            ":authority" | "content-length" | "transfer-encoding" | "connection" | "expect"
        )
}

/// The headers of the failover callout: the request as it went to the first
/// backend (trace, baggage, idempotency key and credentials included), with
/// the new backend's `:authority` (or the one the request had) and the new
/// body's length.
pub fn callout_headers(
    request: &[(String, String)],
    cluster_header: &str,
    authority: Option<&str>,
    body_len: usize,
) -> Vec<(String, String)> {
    let original = request
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(":authority"))
        .map(|(_, v)| v.as_str());
    let mut out: Vec<(String, String)> = request
        .iter()
        .filter(|(k, _)| !dropped_from_callout(k, cluster_header))
        .cloned()
        .collect();
    if let Some(a) = authority.or(original) {
        out.push((":authority".to_string(), a.to_string()));
    }
    out.push(("content-length".to_string(), body_len.to_string()));
    out
}

/// The headers of the callout's answer that reach the client: all but the
/// status (sent apart) and those that describe the callout's own framing.
pub fn reply_headers(callout: &[(String, String)]) -> Vec<(String, String)> {
    callout
        .iter()
        .filter(|(k, _)| {
            let n = k.to_ascii_lowercase();
            !n.starts_with(':')
                && !matches!(
                    n.as_str(),
                    "content-length" | "transfer-encoding" | "connection" | "keep-alive"
                )
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_backends_word_on_retrying_wins_for_its_error_answers() {
        for (end, told, want) in [
            (End::Answered(529), None, true),
            (End::Answered(503), Some(false), false),
            (End::Answered(409), Some(true), true),
            (End::Answered(400), Some(true), true),
            (End::Answered(400), None, false),
            // A success is not retried, whatever it says.
            (End::Answered(200), Some(true), false),
            (End::Reset(503), Some(false), true),
        ] {
            assert_eq!(retriable_as_told(end, told), want, "{end:?} {told:?}");
        }
        assert_eq!(should_retry(" true"), Some(true));
        assert_eq!(should_retry("false"), Some(false));
        assert_eq!(should_retry("False"), None);
    }

    use super::*;
    use crate::dialect::Dialect;
    use crate::routing::fallback;

    #[test]
    fn each_providers_pacing_and_overload_fail_over_and_are_no_fallback_class() {
        for (api, status, body) in [
            // Anthropic overloaded.
            (
                Dialect::Messages,
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
            // Bedrock's ThrottlingException and ServiceUnavailableException
            // (named in x-amzn-errortype, the body a bare message).
            (
                Dialect::Messages,
                429,
                r#"{"message":"Too many requests, please wait before trying again."}"#,
            ),
            (
                Dialect::Messages,
                503,
                r#"{"message":"Bedrock is unable to process your request."}"#,
            ),
            // Bedrock's ModelNotReadyException (429, the SDKs retry it)
            // and ModelTimeoutException (408).
            (
                Dialect::Messages,
                429,
                r#"{"message":"Model is not ready to serve inference requests. Try again later."}"#,
            ),
            (
                Dialect::Messages,
                408,
                r#"{"message":"Model has timed out in processing the request. Try your request again."}"#,
            ),
            // Anthropic's own timeout.
            (
                Dialect::Messages,
                504,
                r#"{"type":"error","error":{"type":"timeout_error","message":"Request timed out"}}"#,
            ),
            // Vertex's RESOURCE_EXHAUSTED, for Claude and for Gemini.
            (
                Dialect::Messages,
                429,
                r#"{"error":{"code":429,"message":"Resource exhausted. Please try again later.","status":"RESOURCE_EXHAUSTED"}}"#,
            ),
            (
                Dialect::Gemini,
                429,
                r#"{"error":{"code":429,"message":"Resource exhausted. Please try again later.","status":"RESOURCE_EXHAUSTED"}}"#,
            ),
            // A minute's quota named in Google's details, through any API
            // Vertex serves, whatever its message says.
            (Dialect::Chat, 429, MINUTES_QUOTA),
            (Dialect::Messages, 429, MINUTES_QUOTA),
            // Bedrock's ModelErrorException: the model failed the call.
            (
                Dialect::Messages,
                424,
                r#"{"message":"Model failed to process the request.","originalStatusCode":500,"resourceName":"arn:aws:bedrock:us-east-1::foundation-model/m"}"#,
            ),
        ] {
            assert!(
                retriable_as_told(End::Answered(status), None),
                "{status} {body}"
            );
            assert_eq!(
                fallback::classify(api, status, body.as_bytes(), None),
                None,
                "{body}"
            );
        }
    }

    /// Google's 429 for a minute's quota, as the Gemini API words it.
    const MINUTES_QUOTA: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"26s"}]}}"#;

    /// The same 429 for a day's quota: failover's too, and the `quota`
    /// class where the walk ends.
    #[test]
    fn a_days_quota_fails_over_and_is_the_quota_class() {
        let day = MINUTES_QUOTA.replace("PerMinute", "PerDay");
        for api in [Dialect::Gemini, Dialect::Messages, Dialect::Chat] {
            assert!(retriable_as_told(End::Answered(429), None));
            assert_eq!(
                fallback::classify(api, 429, day.as_bytes(), None),
                Some(crate::dialect::answer::ErrorClass::Quota),
                "{api:?}"
            );
        }
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_answer_tells_by_its_retry_header_else_by_awss_quota() {
        let quota =
            "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/";
        assert_eq!(told(Some("false"), Some(quota)), Some(false));
        assert_eq!(told(Some("true"), None), Some(true));
        assert_eq!(told(None, Some(quota)), Some(true));
        assert_eq!(told(Some("maybe"), Some(quota)), Some(true));
        assert_eq!(told(None, Some("ValidationException")), None);
        assert_eq!(told(None, None), None);
        assert!(retriable_as_told(
            End::Answered(400),
            told(None, Some(quota))
        ));
        assert!(!retriable_as_told(
            End::Answered(400),
            told(None, Some("ValidationException"))
        ));
    }

    #[test]
    fn only_failures_another_backend_could_answer_qualify() {
        for (end, want) in [
            (End::Answered(500), true),
            (End::Answered(503), true),
            (End::NoCredential(503), true),
            (End::Answered(429), true),
            (End::Answered(402), true),
            (End::Answered(401), false),
            (End::Answered(403), false),
            (End::Answered(200), false),
            (End::Answered(400), false),
            (End::Answered(404), false),
            (End::Answered(408), true),
            (End::Answered(409), false),
            (End::Answered(424), true),
            (End::Answered(422), false),
            (End::TimedOut(504), true),
            (End::Reset(503), true),
            (End::Local(503), false),
            (End::Abandoned, false),
        ] {
            assert_eq!(retriable(end), want, "{end:?}");
            assert_eq!(retriable_as_told(end, None), want, "{end:?}");
        }
        assert_eq!(FailoverResult::of(Some(200)), FailoverResult::Answered);
        assert_eq!(FailoverResult::of(Some(404)), FailoverResult::Answered);
        assert_eq!(FailoverResult::of(Some(502)), FailoverResult::Failed);
        assert_eq!(FailoverResult::of(None), FailoverResult::NoAnswer);
    }

    #[test]
    fn the_callout_carries_the_request_for_the_new_backend() {
        let request = pairs(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":authority", "llm.local"),
            ("authorization", "Bearer k"),
            ("idempotency-key", "abc"),
            ("traceparent", "00-aa-bb-01"),
            ("x-llm-cluster", "openai"),
            ("x-envoy-upstream-rq-timeout-ms", "1000"),
            ("X-Envoy-Max-Retries", "2"),
            ("content-length", "99"),
        ]);
        let out = callout_headers(&request, "x-llm-cluster", Some("azure.example"), 42);
        let want = pairs(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("authorization", "Bearer k"),
            ("idempotency-key", "abc"),
            ("traceparent", "00-aa-bb-01"),
            (":authority", "azure.example"),
            ("content-length", "42"),
        ]);
        assert_eq!(out, want);
        let kept = callout_headers(&request, "x-llm-cluster", None, 1);
        assert!(kept.contains(&(":authority".to_string(), "llm.local".to_string())));
    }

    #[test]
    fn the_reply_keeps_the_answer_headers_but_its_framing() {
        let callout = pairs(&[
            (":status", "200"),
            ("content-type", "application/json"),
            ("content-length", "10"),
            ("Transfer-Encoding", "chunked"),
            ("x-request-id", "r"),
        ]);
        assert_eq!(
            reply_headers(&callout),
            pairs(&[("content-type", "application/json"), ("x-request-id", "r")])
        );
    }
}
