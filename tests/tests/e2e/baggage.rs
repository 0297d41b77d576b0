//! The `baggage` the upstream receives: the caller's members kept byte for byte
//! and in order, the `priority` member set once (from the caller's
//! `x-request-priority`, else its own `priority` member, when trusted), and
//! the W3C limits (64 members, 8192 bytes) held by dropping whole members,
//! never by cutting one.

use llm_filter_e2e::{
    chat_body, post_json, skip_without_envoy, unique, Envoy, EnvoyBuilder, MockConfig, MockUpstream,
};

const MAX_MEMBERS: usize = 64;
const MAX_BYTES: usize = 8192;

/// Sends one chat call with `headers`; returns every `baggage` value the upstream saw.
async fn forwarded(envoy: &Envoy, mock: &MockUpstream, headers: &[(&str, &str)]) -> Vec<String> {
    mock.clear();
    let response = post_json(
        &envoy.url("/v1/chat/completions"),
        &chat_body("gpt-4o", &unique("baggage")),
        headers,
    )
    .await
    .unwrap_or_else(|e| panic!("{headers:?}: {e:#}"));
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = mock.last_request().expect("upstream saw the call");
    seen.header_all("baggage")
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// Checks the limits and that every member but the last (ours) is a whole member
/// of `sent`, in the order sent; returns the kept members.
fn check_limits<'a>(out: &'a str, sent: &[String], priority: &str) -> Vec<&'a str> {
    assert!(out.len() <= MAX_BYTES, "{} bytes", out.len());
    let members: Vec<&str> = out.split(',').collect();
    assert!(members.len() <= MAX_MEMBERS, "{} members", members.len());
    let ours = format!("priority={priority}");
    assert_eq!(
        members.iter().filter(|m| m.starts_with("priority")).count(),
        1
    );
    assert!(members.contains(&ours.as_str()), "{out}");
    let kept: Vec<&str> = members
        .iter()
        .copied()
        .filter(|m| !m.starts_with("priority"))
        .collect();
    let mut position = 0;
    for member in &kept {
        let found = sent[position..]
            .iter()
            .position(|s| s == member)
            .unwrap_or_else(|| panic!("{member:?} is not a whole member sent, in order"));
        position += found + 1;
    }
    kept
}

fn start(mock: &MockUpstream) -> Envoy {
    EnvoyBuilder::new()
        .plugin_config("{}")
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter")
}

#[tokio::test]
async fn members_are_kept_and_priority_set_once() {
    if skip_without_envoy("members_are_kept_and_priority_set_once") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("bag"));
    let envoy = start(&mock);

    // (x-request-priority, baggage sent, baggage expected upstream)
    let cases: [(Option<&str>, &str, &str); 12] = [
        (Some("P0"), "userId=alice", "userId=alice,priority=P0"),
        (
            Some("p2"),
            "userId=al%20ice,serverNode=DF%2028;ttl=30;x,isProduction=false",
            "userId=al%20ice,serverNode=DF%2028;ttl=30;x,isProduction=false,priority=P2",
        ),
        // An existing priority member is replaced, wherever it is.
        (Some("P0"), "a=1,priority=P2,b=2", "a=1,b=2,priority=P0"),
        (Some("P0"), "priority=P2;prop=1,b=2", "b=2,priority=P0"),
        (Some("P2"), "a=1,priority=P0", "a=1,priority=P2"),
        // Without a valid header, the caller's baggage sets the priority
        // (an earlier hop's), normalised, its properties left out.
        (None, "priority=P0,z=9", "z=9,priority=P0"),
        (
            Some("urgent"),
            "z=9,priority=p2;src=edge",
            "z=9,priority=P2",
        ),
        // An invalid member is no priority: the default.
        (None, "priority=high", "priority=P1"),
        // Keys are case-sensitive, so `Priority` is someone else's member.
        (
            Some("P1"),
            "Priority=x,priorityx=y",
            "Priority=x,priorityx=y,priority=P1",
        ),
        // Unicode (percent-encoded) and `=` inside values survive as sent.
        (
            Some("P1"),
            "k=%E2%9C%93,eq=a=b=c",
            "k=%E2%9C%93,eq=a=b=c,priority=P1",
        ),
        // Nothing to keep: only ours.
        (Some("P2"), "", "priority=P2"),
        (None, ",,", "priority=P1"),
    ];
    for (priority, sent, want) in cases {
        let mut headers = vec![("baggage", sent)];
        if let Some(p) = priority {
            headers.push(("x-request-priority", p));
        }
        let got = forwarded(&envoy, &mock, &headers).await;
        assert_eq!(got, [want], "sent {headers:?}");
        // The header upstream carries the same normalised priority.
        let seen = mock.last_request().expect("upstream saw the call");
        let p = want.rsplit("priority=").next().unwrap_or_default();
        assert_eq!(
            seen.header("x-request-priority"),
            Some(p),
            "sent {headers:?}"
        );
    }

    // Optional whitespace around members is not part of them (W3C): members are kept.
    let got = forwarded(&envoy, &mock, &[("baggage", "a=1 ,  b=2;p ,c=3")]).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let members: Vec<&str> = got[0].split(',').map(str::trim).collect();
    assert_eq!(members, ["a=1", "b=2;p", "c=3", "priority=P1"]);
}

#[tokio::test]
async fn two_baggage_headers_are_merged_into_one() {
    if skip_without_envoy("two_baggage_headers_are_merged_into_one") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("bag-two"));
    let envoy = start(&mock);
    let got = forwarded(
        &envoy,
        &mock,
        &[
            ("baggage", "a=1,b=2"),
            ("x-request-priority", "P2"),
            ("baggage", "c=3;p=q"),
        ],
    )
    .await;
    assert_eq!(got, ["a=1,b=2,c=3;p=q,priority=P2"]);

    // A priority member in the second header counts and is replaced too.
    let got = forwarded(
        &envoy,
        &mock,
        &[("baggage", "a=1"), ("baggage", "priority=P0,d=4")],
    )
    .await;
    assert_eq!(got, ["a=1,d=4,priority=P0"]);
}

#[tokio::test]
async fn limits_drop_whole_members() {
    if skip_without_envoy("limits_drop_whole_members") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("bag-limits"));
    let envoy = start(&mock);

    // 100 members: at most 64 forwarded, ours among them, the first ones kept.
    let many: Vec<String> = (0..100).map(|i| format!("k{i}=v{i}")).collect();
    let got = forwarded(
        &envoy,
        &mock,
        &[("baggage", &many.join(",")), ("x-request-priority", "P0")],
    )
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    let kept = check_limits(&got[0], &many, "P0");
    assert_eq!(kept.len(), MAX_MEMBERS - 1, "{}", got[0]);
    assert_eq!(kept.first(), Some(&"k0=v0"));

    // 100 members with ours among them (past the 64th, and it sets the
    // priority): still one priority, still at most 64.
    let mut with_ours = many.clone();
    with_ours[70] = "priority=P2".to_string();
    let got = forwarded(&envoy, &mock, &[("baggage", &with_ours.join(","))]).await;
    check_limits(&got[0], &with_ours, "P2");

    // Over 8192 bytes: whole members dropped, none cut, total within the limit.
    let big: Vec<String> = (0..20)
        .map(|i| format!("m{i:02}={}", "x".repeat(300 + i * 37)))
        .collect();
    let sent = big.join(",");
    assert!(sent.len() > MAX_BYTES);
    let got = forwarded(
        &envoy,
        &mock,
        &[("baggage", &sent), ("x-request-priority", "p2")],
    )
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    let kept = check_limits(&got[0], &big, "P2");
    assert!(!kept.is_empty(), "members that fit are kept: {}", got[0]);
    // Members are dropped only when they do not fit: the first one always does.
    assert_eq!(kept.first(), Some(&big[0].as_str()));

    // A single member larger than the limit is dropped whole; smaller ones stay.
    let huge = format!("huge={}", "z".repeat(9000));
    let sent = ["a=1".to_string(), huge, "b=2".to_string()];
    let got = forwarded(&envoy, &mock, &[("baggage", &sent.join(","))]).await;
    assert_eq!(got, ["a=1,b=2,priority=P1"]);

    // Two headers that only together pass the byte limit.
    let half: Vec<String> = (0..2)
        .map(|i| format!("h{i}={}", "y".repeat(5000)))
        .collect();
    let got = forwarded(
        &envoy,
        &mock,
        &[("baggage", &half[0]), ("baggage", &half[1])],
    )
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    let kept = check_limits(&got[0], &half, "P1");
    assert_eq!(kept, [half[0].as_str()]);
}

#[tokio::test]
async fn an_untrusted_caller_raises_its_priority_by_neither_header_nor_baggage() {
    if skip_without_envoy("an_untrusted_caller_raises_its_priority_by_neither_header_nor_baggage") {
        return;
    }
    let mock = MockUpstream::start(MockConfig::named("bag-trust"));
    let envoy = EnvoyBuilder::new()
        .plugin_config(r#"{"priority":{"trust_client":false,"default":"P2"}}"#)
        .upstream("mock", mock.port())
        .start()
        .expect("envoy with the filter");
    for headers in [
        vec![("baggage", "priority=P0,a=1")],
        vec![("baggage", "priority=P0"), ("x-request-priority", "P0")],
    ] {
        let got = forwarded(&envoy, &mock, &headers).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].ends_with("priority=P2"), "{headers:?}: {got:?}");
        let seen = mock.last_request().expect("upstream saw the call");
        assert_eq!(seen.header("x-request-priority"), Some("P2"), "{headers:?}");
    }
}
