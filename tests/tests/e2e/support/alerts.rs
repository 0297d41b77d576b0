//! Alertmanager's webhook as the filter's admin path receives it, and the
//! firing of one alert through it: what the degrade scenarios start from.

use llm_filter_e2e::{post_raw, Envoy};
use serde_json::{json, Value};

/// An Alertmanager webhook (version 4) with one alert of `labels`.
pub fn webhook(status: &str, labels: Value, fingerprint: &str) -> String {
    json!({
        "version": "4", "status": status, "receiver": "llm-filter",
        "groupLabels": {}, "commonLabels": labels, "commonAnnotations": {},
        "externalURL": "http://am", "groupKey": "{}:{}", "truncatedAlerts": 0,
        "alerts": [{"status": status, "labels": labels, "annotations": {},
                    "startsAt": "2026-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "", "fingerprint": fingerprint}]
    })
    .to_string()
}

/// Fires one alert of `labels` at the filter's admin path with `token`.
pub async fn fire(envoy: &Envoy, token: &str, labels: Value) {
    let bearer = format!("Bearer {token}");
    let r = post_raw(
        &envoy.url("/llm-filter/alerts"),
        &webhook("firing", labels, "e2e0000000000002"),
        &[("authorization", bearer.as_str())],
    )
    .await
    .expect("alert");
    assert_eq!(r.status, 200, "{}", r.text());
}
