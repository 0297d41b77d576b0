//! Google's errors (`{"error": {"code", "status", "message", "details"}}`),
//! read whatever the call's API: Vertex answers its own errors (its quotas,
//! its outages) so for Claude and its OpenAI-compatible chat too, so the
//! shared reading of a refusal ([`super::refusal_of`]) reads them first.

use serde_json::Value;

use super::Refusal;

/// The refusal a Google error says (`{"error": {"code": 429, "status":
/// "RESOURCE_EXHAUSTED", "message", "details"}}`, or a list of one such, as
/// Vertex's stream paths answer), whatever the call's API: Vertex fronts
/// Claude and an OpenAI-compatible chat and answers its own errors so.
/// `Some` when the error is Google's and one of its rows says: a prompt
/// over the model's input limit (400 `INVALID_ARGUMENT`, "exceeds the
/// maximum number of tokens"), a spent quota (400 `FAILED_PRECONDITION`
/// naming billing, or a 429 [`quota_spent`]), a model the API does not
/// serve (404 `NOT_FOUND` naming a model). Any other 429 is `Some(None)`:
/// a rate limit, failover's, even when its message says "You exceeded your
/// current quota, please check your plan and billing details" (Google
/// writes that for a per-minute limit too). `None` for anything else, which
/// the shared reading reads on ([`super::refusal_of`]).
/// The body was bounded before it was parsed.
pub(crate) fn google_refusal(status: u16, body: &Value) -> Option<Option<Refusal>> {
    let body = match body.as_array().map(Vec::as_slice) {
        Some([one]) => one,
        _ => body,
    };
    let error = body
        .get("error")
        .filter(|e| e.get("code").is_some_and(Value::is_number))?;
    let kind = error.get("status")?.as_str()?;
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    let says = |words: &[&str]| words.iter().any(|w| message.contains(w));
    match (status, kind) {
        (400, "INVALID_ARGUMENT")
            if says(&["exceeds the maximum number of tokens", "input token count"]) =>
        {
            Some(Some(Refusal::ContextLength))
        }
        (400, "FAILED_PRECONDITION") if says(&["billing"]) => Some(Some(Refusal::Quota)),
        (429, "RESOURCE_EXHAUSTED") => {
            Some((says(&["per day"]) || quota_spent(error)).then_some(Refusal::Quota))
        }
        (404, "NOT_FOUND") if says(&["models/", "model"]) => Some(Some(Refusal::UnknownModel)),
        _ => None,
    }
}

/// A Google 429's `details` name a quota that waiting a minute does not
/// give back: a `google.rpc.QuotaFailure` violation whose `quotaId` or
/// `quotaMetric` is per day (`GenerateRequestsPerDayPerProjectPerModel-
/// FreeTier`), or whose `quotaValue` is 0 (the tier has none of that
/// model), or a `google.rpc.ErrorInfo` whose `quota_limit` is per day (the
/// Cloud APIs' form). One such among per-minute ones is enough: the
/// per-day one still holds when they are back. A `google.rpc.RetryInfo`'s
/// `retryDelay` is not read: routing paces a backend by its failures, not
/// by what it asks.
pub(crate) fn quota_spent(error: &Value) -> bool {
    let details = error.get("details").and_then(Value::as_array);
    details.into_iter().flatten().any(|d| {
        let violations = d.get("violations").and_then(Value::as_array);
        named_per_day(d.get("metadata").and_then(|m| m.get("quota_limit")))
            || violations.into_iter().flatten().any(|v| {
                named_per_day(v.get("quotaId"))
                    || named_per_day(v.get("quotaMetric"))
                    || none_left(v.get("quotaValue"))
            })
    })
}

/// A quota's name, when it says it is counted per day.
fn named_per_day(name: Option<&Value>) -> bool {
    name.and_then(Value::as_str).is_some_and(per_day)
}

/// A `quotaValue` of 0, as Google writes it (a string) or as a number.
fn none_left(value: Option<&Value>) -> bool {
    match value {
        Some(Value::String(s)) => s == "0",
        Some(Value::Number(n)) => n.as_u64() == Some(0),
        _ => false,
    }
}

/// A quota's name says it is counted per day.
fn per_day(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["perday", "per_day", "per day", "daily"]
        .iter()
        .any(|w| name.contains(w))
}
