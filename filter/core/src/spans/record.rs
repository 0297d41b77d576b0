//! The access-log record of a call: what its span says, as one line of JSON
//! the filter puts in Envoy's filter state (`access_log.enabled`), which
//! Envoy's access loggers print with `%FILTER_STATE(wasm.llm_filter.call:PLAIN)%`.
//! It is written when the answer is complete (or the filter answers itself),
//! before Envoy logs the stream.

use serde_json::{Map, Value};

use super::{bounded, error_type, spend, status, Details};
use crate::summary::CallSummary;
use crate::trace_context::{hex, SpanIds};

/// The property the record is set as (Envoy: filter state `wasm.llm_filter.call`).
pub const PROPERTY: &str = "llm_filter.call";

/// The record of a call.
pub fn record(ids: Option<&SpanIds>, call: &CallSummary<'_>, details: &Details<'_>) -> Vec<u8> {
    let mut r = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            r.insert(k.to_string(), v);
        }
    };
    if let Some(ids) = ids {
        put("trace_id", Value::from(hex(&ids.trace_id)));
        put("span_id", Value::from(hex(&ids.span_id)));
    }
    put("api", Value::from(call.api.api()));
    put("model", Value::from(call.model));
    put(
        "requested_model",
        details.requested_model.map(bounded).into(),
    );
    put("response_model", details.response_model.map(bounded).into());
    if !details.finish_reasons.is_empty() {
        put(
            "finish_reasons",
            details.finish_reasons.iter().map(|r| bounded(r)).collect(),
        );
    }
    put("priority", Value::from(call.priority.as_str()));
    put("status", status(call.end()).into());
    put("error", error_type(call.end()).into());
    put("cache", details.cache.into());
    put("cluster", call.served.cluster.map(bounded).into());
    put("duration_ms", Value::from(call.served.elapsed_ms()));
    put("ttfb_ms", call.served.first_byte_after_ms().into());
    if let Some(u) = &call.served.usage {
        put("input_tokens", Value::from(u.prompt_tokens));
        put("output_tokens", Value::from(u.completion_tokens));
        put("cached_tokens", Value::from(u.cached_tokens));
        put("cache_creation_tokens", Value::from(u.cache_write_tokens));
        put("reasoning_tokens", Value::from(u.reasoning_tokens));
    }
    if let Some((cost, saved)) = spend(call, details) {
        put("cost", Value::from(cost));
        put("prompt_cache_saved", saved.into());
    }
    put("max_tokens", details.max_tokens.into());
    put("temperature", details.temperature.into());
    put(
        "retries",
        call.served.attempts.map(|n| n.saturating_sub(1)).into(),
    );
    if call.served.failovers > 0 {
        put("failovers", Value::from(call.served.failovers));
    }
    put("hedge", details.hedge.into());
    put("breaker", call.served.breaker.map(bounded).into());
    put("degrade_level", details.degraded.into());
    put("fallback_model", details.fallback_model.map(bounded).into());
    put("group", call.group.map(bounded).into());
    put("tenant", details.tenant.map(bounded).into());
    put("guardrails", details.guardrails.map(bounded).into());
    if details.cache_markers > 0 {
        put("cache_markers", Value::from(details.cache_markers));
    }
    if call.served.budget_ms > 0 {
        put("budget_ms", Value::from(call.served.budget_ms));
    }
    // The captures as JSON in the record (each within its bound), under the
    // names of their span attributes without `gen_ai.`.
    for (name, c) in details.captured() {
        // Read as bytes, as every other JSON the filter parses: one reader
        // compiled into the module instead of two.
        let value = c.and_then(|c| serde_json::from_slice::<Value>(c.json.as_bytes()).ok());
        let key = name
            .strip_prefix("gen_ai.")
            .unwrap_or(name)
            .replace('.', "_");
        put(&key, value.unwrap_or(Value::Null));
    }
    let cut = details.cut();
    if !cut.is_empty() {
        put("capture_truncated", cut.into_iter().collect());
    }
    serde_json::to_vec(&Value::Object(r)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{End, Try};
    use crate::usage::Usage;

    #[test]
    fn a_record_is_one_line_of_json_without_nulls() {
        let ids = SpanIds {
            trace_id: [0xab; 16],
            span_id: [0x01; 8],
            parent_id: None,
            flags: 1,
        };
        let call = CallSummary {
            served: Try {
                usage: Some(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 2,
                    cached_tokens: 0,
                    ..Usage::default()
                }),
                started_ms: 10,
                ended_ms: 30,
                cluster: Some("openai"),
                ..Try::ended(End::Answered(200))
            },
            ..CallSummary::ended(End::Answered(200))
        };
        let details = Details {
            requested_model: Some("gpt-4o"),
            cache: Some("MISS"),
            ..Details::default()
        };
        let r: Value = serde_json::from_slice(&record(Some(&ids), &call, &details)).unwrap();
        assert_eq!(r["trace_id"], "ab".repeat(16));
        assert_eq!(r["span_id"], "0101010101010101");
        assert_eq!(
            (r["status"].clone(), r["duration_ms"].clone()),
            (200.into(), 20.into())
        );
        assert_eq!(
            (r["input_tokens"].clone(), r["cache"].clone()),
            (3.into(), "MISS".into())
        );
        assert!(r.get("error").is_none() && r.get("hedge").is_none());
        let failed = CallSummary {
            served: Try {
                end: End::Reset(503),
                ..call.served
            },
            ..call
        };
        let r: Value = serde_json::from_slice(&record(None, &failed, &details)).unwrap();
        assert_eq!(
            (r["error"].clone(), r.get("trace_id")),
            ("reset".into(), None)
        );
    }
}
