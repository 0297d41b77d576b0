use super::*;
use crate::walk::fake::{FakeHost, World};

const TOKEN: &str = "0123456789abcdef-token";

fn world() -> World {
    World::new(&format!(
        r#"{{"admin":{{"token":"{TOKEN}"}},"degrade":{{"alert_ttl_s":60}}}}"#
    ))
}

fn webhook(status: &str, labels: &str) -> String {
    format!(
        r#"{{"version":"4","status":"{status}","alerts":[{{"status":"{status}","labels":{{{labels}}},"fingerprint":"fp1"}}]}}"#
    )
}

/// Runs an admin request through; returns the local reply's status and body.
fn call(
    w: &mut World,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &str,
) -> Option<(u32, String)> {
    let mut host = FakeHost::new()
        .with_header(":method", method)
        .with_header(":path", path);
    if let Some(a) = auth {
        host = host.with_header("authorization", a);
    }
    if !body.is_empty() {
        host = host.with_body(body);
    }
    let (mut admin, step) = AdminCall::start(&mut w.env(), &mut host, body.is_empty())?;
    assert_eq!(step, Step::Pause, "never forwarded");
    if host.local_reply.is_none() {
        let size = host.request_body.len();
        admin.on_request_body(&mut w.env(), &mut host, size, true);
    }
    let (status, _, body) = host.local_reply.expect("answered locally");
    Some((status, String::from_utf8(body).unwrap()))
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

fn level(w: &mut World, model: &str) -> u8 {
    degrade::level(&w.store, &w.config, model, w.now_ms)
}

#[test]
fn a_webhook_sets_and_clears_levels() {
    let mut w = world();
    let firing = webhook("firing", r#""alertname":"LLMDown","severity":"critical""#);
    let (status, body) = call(
        &mut w,
        "POST",
        "/llm-filter/alerts",
        Some(&bearer()),
        &firing,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""firing":1"#), "{body}");
    assert_eq!(level(&mut w, "gpt-4o"), 3);

    let (status, state) = call(&mut w, "GET", "/llm-filter/state", Some(&bearer()), "").unwrap();
    assert_eq!(status, 200);
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["levels"]["*"], 3);
    assert_eq!(state["alerts"][0]["alertname"], "LLMDown");
    assert_eq!(state["alerts"][0]["level"], 3);
    assert_eq!(state["alerts"][0]["expires_in_s"], 60);
    assert_eq!(state["alerts"][0]["source"], "webhook");

    let resolved = webhook("resolved", r#""alertname":"LLMDown","severity":"critical""#);
    let (status, _) = call(
        &mut w,
        "POST",
        "/llm-filter/alerts?x=1",
        Some(&bearer()),
        &resolved,
    )
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(level(&mut w, "gpt-4o"), 0);
}

#[test]
fn bad_tokens_and_bodies_change_nothing() {
    let mut w = world();
    let firing = webhook("firing", r#""severity":"warning""#);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some(TOKEN),
        Some("Basic 0123456789abcdef-token"),
    ] {
        let (status, body) = call(&mut w, "POST", "/llm-filter/alerts", auth, &firing).unwrap();
        assert_eq!(status, 401, "{auth:?} {body}");
        let (status, _) = call(&mut w, "GET", "/llm-filter/state", auth, "").unwrap();
        assert_eq!(status, 401);
    }
    assert_eq!(level(&mut w, "m"), 0);
    let big = format!(
        r#"{{"version":"4","alerts":[],"pad":"{}"}}"#,
        "x".repeat(MAX_BODY_BYTES)
    );
    for body in [
        "{",
        r#"{"version":"4"}"#,
        big.as_str(),
        r#"{"version":"4","alerts":[{"status":"firing","labels":{"severity":"warning"}},{"status":"odd"}]}"#,
    ] {
        let (status, reply) =
            call(&mut w, "POST", "/llm-filter/alerts", Some(&bearer()), body).unwrap();
        assert_eq!(status, 400, "{reply}");
        assert!(reply.contains("invalid_request_error"));
    }
    assert_eq!(level(&mut w, "m"), 0);
    assert!(w.store.is_empty(), "nothing was written");
    // Unknown paths and methods under the prefix are answered, not forwarded.
    for (method, path) in [
        ("GET", "/llm-filter/alerts"),
        ("POST", "/llm-filter"),
        ("GET", "/llm-filter/other"),
    ] {
        let (status, _) = call(&mut w, method, path, Some(&bearer()), "").unwrap();
        assert_eq!(status, 404, "{method} {path}");
    }
    // Other paths are not the admin's.
    for path in ["/llm-filterx/alerts", "/v1/chat/completions", "/"] {
        assert!(
            call(&mut w, "POST", path, Some(&bearer()), "").is_none(),
            "{path}"
        );
    }
}

#[test]
fn without_a_token_the_endpoints_do_not_exist() {
    let mut w = World::new("{}");
    for (method, path) in [("POST", "/llm-filter/alerts"), ("GET", "/llm-filter/state")] {
        let (status, _) = call(
            &mut w,
            method,
            path,
            Some("Bearer anything-at-all-really"),
            "{}",
        )
        .unwrap();
        assert_eq!(status, 404);
    }
    assert!(w.store.is_empty());
}

#[test]
fn a_large_declared_body_is_refused_before_it_arrives() {
    let mut w = world();
    let mut host = FakeHost::post("/llm-filter/alerts")
        .with_header("authorization", &bearer())
        .with_header("content-length", &(MAX_BODY_BYTES + 1).to_string());
    let (_, step) = AdminCall::start(&mut w.env(), &mut host, false).unwrap();
    assert_eq!(step, Step::Pause);
    assert_eq!(host.local_reply.unwrap().0, 400);
}

#[test]
fn tokens_compare_in_constant_time() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
    assert!(!constant_time_eq(b"", b"a"));
    assert!(constant_time_eq(b"", b""));
}

#[test]
fn the_config_checks_prefix_and_token() {
    let c =
        Config::parse(br#"{"admin":{"path_prefix":"/ops/","token":"0123456789abcdef"}}"#).unwrap();
    assert_eq!(c.admin.path_prefix, "/ops");
    assert!(!format!("{:?}", c.admin).contains("0123456789abcdef"));
    for (doc, field) in [
        (r#"{"admin":{"token":"short"}}"#, "admin.token"),
        (r#"{"admin":{"token":"0123456789abcdef 0"}}"#, "admin.token"),
        (r#"{"admin":{"path_prefix":"/"}}"#, "admin.path_prefix"),
        (r#"{"admin":{"path_prefix":"ops"}}"#, "admin.path_prefix"),
    ] {
        assert_eq!(
            Config::parse(doc.as_bytes()).unwrap_err().field,
            field,
            "{doc}"
        );
    }
}
