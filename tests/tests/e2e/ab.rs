//! A/B groups through the real Envoy: users spread over the groups by their
//! percents and stay in theirs, the group reaches the upstream (header and
//! baggage) and the client, labels the request metrics, and a group's
//! overrides (another cluster for the model, another shaping cap, the cache
//! off) apply to its calls only.

use std::collections::HashMap;
use std::time::Duration;

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, EnvoyBuilder, MockConfig, MockUpstream,
};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const CLUSTER_HEADER: &str = "x-llm-cluster";

/// The filter's grouping rule (`ab.rs`), written again here: FNV-1a 32-bit of
/// the user, modulo 100, against the cumulative percents.
fn expected_group(user: &str, groups: &[(&str, u32)]) -> String {
    let hash = user.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let bucket = hash % 100;
    let mut upto = 0;
    for (name, percent) in groups {
        upto += percent;
        if bucket < upto {
            return name.to_string();
        }
    }
    unreachable!("percents sum to 100")
}

const GROUPS: [(&str, u32); 2] = [("control", 70), ("b", 30)];

fn config() -> Value {
    json!({
        "routing": {"models": {"gpt-4o": [{"cluster": "a"}]}},
        "shaping": {"max_tokens_cap": 512},
        "cache": {"enabled": true},
        "ab": {"groups": [
            {"name": "control", "percent": 70},
            {"name": "b", "percent": 30, "overrides": {
                "routing": {"models": {"gpt-4o": [{"cluster": "b", "model": "gpt-4o-mini"}]}},
                "shaping": {"max_tokens_cap": 64},
                "cache": {"enabled": false}
            }}
        ]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_spread_by_percent_stay_put_and_carry_their_group() {
    if skip_without_envoy("ab_groups") {
        return;
    }
    let default = MockUpstream::start(MockConfig::named("default"));
    let a = MockUpstream::start(MockConfig::named("a"));
    let b = MockUpstream::start(MockConfig::named("b"));
    let envoy = EnvoyBuilder::new()
        .plugin_config(config())
        .upstream(default.name(), default.port())
        .upstream(a.name(), a.port())
        .upstream(b.name(), b.port())
        .header_route(CLUSTER_HEADER)
        .start()
        .expect("envoy with A/B groups");
    let url = envoy.url(CHAT);

    let mut seen: HashMap<String, String> = HashMap::new();
    let mut per_group: HashMap<String, u32> = HashMap::new();
    for i in 0..200 {
        let user = format!("user-{i}");
        let body = chat_body("gpt-4o", &format!("question {i}"));
        let r = post_json(
            &url,
            &body,
            &[("x-user-id", &user), ("baggage", "tenant=t1")],
        )
        .await
        .expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        let group = r.header("x-user-group").expect("x-user-group").to_string();
        assert_eq!(group, expected_group(&user, &GROUPS), "{user}");
        // The group's overrides: its cluster, its cap, its cache.
        let (mock, cluster, model, cap) = match group.as_str() {
            "b" => (&b, "b", "gpt-4o-mini", 64),
            _ => (&a, "a", "gpt-4o", 512),
        };
        assert_eq!(r.header(CLUSTER_HEADER), Some(cluster));
        assert_eq!(r.header("x-cache").is_some(), group == "control", "{group}");
        let got = mock
            .last_request()
            .expect("the group's backend got the call");
        let sent = got.json().unwrap();
        assert_eq!(sent["messages"][0]["content"], format!("question {i}"));
        assert_eq!(sent["model"], model);
        assert_eq!(sent["max_tokens"], cap);
        assert_eq!(got.header("x-user-group"), Some(group.as_str()));
        assert_eq!(
            got.header("baggage"),
            Some(format!("tenant=t1,priority=P1,user_group={group}").as_str())
        );
        *per_group.entry(group.clone()).or_default() += 1;
        seen.insert(user, group);
    }
    // About the split: 70 % of 200 is 140.
    let control = per_group.get("control").copied().unwrap_or(0);
    assert!((115..=165).contains(&control), "{per_group:?}");
    assert_eq!(default.request_count(), 0);

    // The same users again, the user now in the body: the same groups.
    for (user, group) in seen.iter().take(40) {
        let mut body = chat_body("gpt-4o", "again");
        body["user"] = json!(user);
        let r = post_json(&url, &body, &[]).await.expect("call");
        assert_eq!(r.header("x-user-group"), Some(group.as_str()), "{user}");
    }
    // No user at all: the first group.
    let r = post_json(&url, &chat_body("gpt-4o", "anonymous"), &[])
        .await
        .expect("call");
    assert_eq!(r.header("x-user-group"), Some("control"));

    // The request metrics carry the group.
    let b_calls = seen.values().filter(|g| *g == "b").count() as f64;
    let b_again = seen.iter().take(40).filter(|(_, g)| *g == "b").count() as f64;
    let counted = envoy.wait_for_metric(
        "llm_filter_requests_total",
        &[("group", "b")],
        b_calls + b_again,
        Duration::from_secs(5),
    );
    assert_eq!(counted, b_calls + b_again);
    let b_timed = envoy.wait_for_metric(
        "gen_ai_client_operation_duration_ms_count",
        &[("group", "b")],
        b_calls + b_again,
        Duration::from_secs(15),
    );
    assert_eq!(b_timed, b_calls + b_again, "durations labelled by group");
}
