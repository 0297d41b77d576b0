//! Token and cost limits through the real Envoy: 32 concurrent calls against
//! a small limit pass no more than it holds (what the upstream received and
//! what the calls were charged), a stream is charged its reported usage,
//! what is left reaches the caller in the rate-limit headers its SDK reads,
//! a refusal is a 429 in the caller's API shape with `retry-after`, a
//! degrading rule sends the call cheaper, a tenant's limit holds across
//! three gateway replicas when the front hashes the tenant onto one, and at a
//! gateway that terminates mutual TLS the tenant is the caller's SPIFFE id.

use futures_util::future::join_all;
use llm_filter_e2e::tls::{ClientCert, MtlsClient, TestCa};
use llm_filter_e2e::{
    chat_body, http_client_without_reuse, messages_body, post_json, send_bytes, skip_without_envoy,
    stream_sse, temp_dir, with_field, Envoy, EnvoyBuilder, HttpResponse, MockConfig, MockUpstream,
};
use reqwest::Method;
use serde_json::json;

use crate::support::cache::{Rig, CHAT};
use crate::support::sdk;

const TENANT_A: &str = "Bearer sk-tenant-a";
const TENANT_B: &str = "Bearer sk-tenant-b";

fn total_tokens(r: &HttpResponse) -> u64 {
    r.json()["usage"]["total_tokens"].as_u64().unwrap_or(0)
}

fn header_u64(r: &HttpResponse, name: &str) -> u64 {
    r.header(name)
        .unwrap_or_else(|| panic!("no {name}: {:?}", r.headers))
        .parse()
        .unwrap()
}

/// Waits, when the wall clock's minute has less than `span` left, until the
/// next one begins: a minute's count weighs the minute before by the share
/// of it still inside the sliding window, so calls on both sides of a
/// boundary would see what an earlier call spent as a little less.
async fn clear_of_a_minute_boundary(span: std::time::Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = std::time::Duration::from_millis((now.as_millis() % 60_000) as u64);
    let left = std::time::Duration::from_secs(60) - into;
    if left < span {
        tokio::time::sleep(left + std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_cannot_pass_a_token_limit_by_more_than_their_reservations() {
    const LIMIT: u64 = 1000;
    const CALLS: usize = 32;
    let config = json!({"limits": {"rules": [
        {"name": "team", "by": ["tenant"], "tokens_per_minute": LIMIT}
    ]}});
    let Some(rig) = Rig::start("limits_concurrent", config) else {
        return;
    };
    // The calls, their settling and the other tenant's call in one minute.
    clear_of_a_minute_boundary(std::time::Duration::from_secs(10)).await;
    // Every call is in flight at once: none settles (and gives back what its
    // reservation held over its usage) before the others reserve. 3 s: under
    // the suite's load, 32 calls took more than 400 ms to all reach the filter.
    rig.mock.set_default_delay_ms(3000);
    // 15 letters and spaces (4 estimated tokens) + a cap of 100: 104 reserved each,
    // so 9 fit in 1000.
    let body = with_field(
        chat_body("gpt-4o", "limit me please"),
        "max_tokens",
        json!(100),
    );
    let client = http_client_without_reuse();
    let url = rig.url(CHAT);
    let bytes = serde_json::to_vec(&body).unwrap();
    let calls = (0..CALLS).map(|_| {
        send_bytes(
            &client,
            Method::POST,
            &url,
            Some(bytes.clone()),
            &[
                ("content-type", "application/json"),
                ("authorization", TENANT_A),
            ],
        )
    });
    let answers: Vec<HttpResponse> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("call"))
        .collect();
    let passed: Vec<&HttpResponse> = answers.iter().filter(|r| r.status == 200).collect();
    let refused: Vec<&HttpResponse> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(passed.len() + refused.len(), CALLS, "only 200s and 429s");
    // Before the first answer settles (3 s after it reached the upstream),
    // as many as their reservations fit. A call that reaches the filter only
    // after that (a loaded machine's straggler) may take what the settled
    // call gave back over its usage; it is charged like the others, below.
    let reached: Vec<_> = rig.mock.requests().iter().map(|r| r.received_at).collect();
    let first = reached.iter().min().copied().expect("a call passed");
    let before_a_settle = reached
        .iter()
        .filter(|t| t.duration_since(first) < std::time::Duration::from_millis(3000))
        .count();
    assert_eq!(before_a_settle, 9, "as many as their reservations fit");
    assert_eq!(
        rig.mock.request_count(),
        passed.len(),
        "the upstream saw only those"
    );
    let charged: u64 = passed.iter().map(|r| total_tokens(r)).sum();
    assert!(charged <= LIMIT, "{charged} tokens charged against {LIMIT}");
    for r in &refused {
        let v = r.json();
        assert_eq!(
            v["error"]["code"],
            "llm_filter_limit_exceeded",
            "{}",
            r.text()
        );
        assert_eq!(v["error"]["type"], "rate_limit_exceeded");
        assert!(header_u64(r, "retry-after") >= 1);
        // What is left, without the refused call: too little for its 104.
        assert!(header_u64(r, "x-ratelimit-remaining-tokens") < 104);
        assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("1000"));
    }
    // Another tenant has a count of its own.
    let r = rig.chat(&body, &[("authorization", TENANT_B)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-tokens"), LIMIT - 104);
    // Seen with real labels.
    let rejected = rig.envoy.wait_for_metric(
        "llm_filter_limits_calls_total",
        &[("rule", "team"), ("result", "rejected")],
        refused.len() as f64,
        std::time::Duration::from_secs(5),
    );
    assert_eq!(rejected as usize, refused.len());
    let spent = rig.envoy.wait_for_metric(
        "llm_filter_limits_tokens_total",
        &[("rule", "team")],
        (charged + total_tokens(&r)) as f64,
        std::time::Duration::from_secs(5),
    );
    assert_eq!(
        spent as u64,
        charged + total_tokens(&r),
        "settled with the usage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_charged_its_usage_and_what_is_left_reaches_the_caller() {
    const LIMIT: u64 = 2000;
    let config = json!({"limits": {"rules": [
        {"name": "team", "by": ["tenant"], "tokens_per_minute": LIMIT, "requests_per_minute": 10}
    ]}});
    let Some(rig) = Rig::start("limits_stream", config) else {
        return;
    };
    // The stream and the calls that read what it was charged in one minute.
    clear_of_a_minute_boundary(std::time::Duration::from_secs(10)).await;
    rig.mock.set_answer_words(Some(40));
    let plain = with_field(
        chat_body("gpt-4o", "tell me a story"),
        "max_tokens",
        json!(300),
    );
    let mut stream = with_field(plain.clone(), "stream", json!(true));
    stream["stream_options"] = json!({"include_usage": true});
    let s = stream_sse(&rig.url(CHAT), &stream, &[("authorization", TENANT_A)])
        .await
        .unwrap();
    assert_eq!(s.status, 200);
    let first_left: u64 = s.headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let streamed = s.usage().expect("the stream's usage")["total_tokens"]
        .as_u64()
        .unwrap();
    assert!(streamed > 40, "{streamed}");
    // Settled at the stream's end: the next call, reserving as much as the
    // stream did, sees the stream's real usage gone instead of its reservation.
    rig.envoy.wait_for_metric(
        "llm_filter_limits_tokens_total",
        &[("rule", "team")],
        streamed as f64,
        std::time::Duration::from_secs(5),
    );
    let r = rig.chat(&plain, &[("authorization", TENANT_A)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let second_left = header_u64(&r, "x-ratelimit-remaining-tokens");
    assert_eq!(
        first_left - second_left,
        streamed,
        "the stream was charged its usage"
    );
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), 8);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-requests"), 10);
    assert!(r.header("x-ratelimit-reset-tokens").unwrap().ends_with('s'));
    // And a call after it sees the second one's usage too.
    let r3 = rig.chat(&plain, &[("authorization", TENANT_A)]).await;
    assert_eq!(
        second_left - header_u64(&r3, "x-ratelimit-remaining-tokens"),
        total_tokens(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_degrading_rule_the_call_goes_cheaper_then_is_refused() {
    let config = json!({"limits": {"rules": [
        {"name": "soft", "by": ["tenant"], "requests_per_minute": 1,
         "degrade": {"max_tokens": 8, "model": "gpt-4o-mini", "until": 3}}
    ]}});
    let Some(rig) = Rig::start("limits_degrade", config) else {
        return;
    };
    let body = with_field(chat_body("gpt-4o", "hello"), "max_tokens", json!(500));
    let h = [("authorization", TENANT_A)];
    let r = rig.chat(&body, &h).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-llm-limited"), None);
    assert_eq!(
        rig.mock.last_request().unwrap().json().unwrap(),
        body,
        "untouched"
    );
    for _ in 0..2 {
        let r = rig.chat(&body, &h).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-llm-limited"), Some("degraded"));
        let sent = rig.mock.last_request().unwrap().json().unwrap();
        assert_eq!(sent["model"], "gpt-4o-mini");
        assert_eq!(sent["max_tokens"], 8);
        assert_eq!(sent["messages"], body["messages"]);
    }
    // Three calls reached the ceiling of 3 × 1.
    let r = rig.chat(&body, &h).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(rig.mock.request_count(), 3);
    // P0 is exempt unless the rule names it.
    let r = rig.chat(&body, &[h[0], ("x-request-priority", "P0")]).await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_caller_over_its_daily_cost_gets_anthropics_429() {
    // One thousandth a token: 0.5 a day is 500 tokens.
    let config = json!({"limits": {
        "prices": {"*": {"input": 1000, "output": 1000}},
        "rules": [{"name": "spend", "by": ["tenant"], "cost_per_day": 0.5}]
    }});
    let Some(rig) = Rig::start("limits_cost", config) else {
        return;
    };
    let url = rig.url("/v1/messages");
    let h = [
        ("x-api-key", "sk-ant-tenant"),
        ("anthropic-version", "2023-06-01"),
    ];
    // A cap of 1024 alone costs more than the day allows: never fits.
    let r = post_json(&url, &messages_body("claude-sonnet", "hi"), &h)
        .await
        .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert_eq!(
        r.header("x-should-retry"),
        Some("false"),
        "not before tomorrow"
    );
    // A prompt of 90 words (113 estimated tokens) that the mock echoes within
    // the cap of 100: 213 reserved, about 184 charged, so two calls fit.
    let prompt = "word ".repeat(90);
    let small = with_field(
        messages_body("claude-sonnet", &prompt),
        "max_tokens",
        json!(100),
    );
    let mut used = 0;
    let mut last = 0;
    let mut passed = 0;
    loop {
        let r = post_json(&url, &small, &h).await.unwrap();
        if r.status != 200 {
            assert_eq!(r.status, 429, "{}", r.text());
            assert!(r.header("retry-after").is_some());
            break;
        }
        assert!(
            r.header("anthropic-ratelimit-tokens-remaining").is_none(),
            "no token limit"
        );
        let u = &r.json()["usage"];
        last = u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap();
        used += last;
        passed += 1;
        assert!(
            passed < 20,
            "the cost limit never stopped the calls: {} {:?}",
            r.text(),
            r.headers
        );
    }
    assert!(passed >= 2, "{passed} calls");
    assert!(used <= 500, "{used} tokens of cost charged against 500");
    // Refused only when the next call's reservation no longer fit.
    assert!(used + 2 * last > 500, "stopped early at {used}");
    let micros = rig.envoy.wait_for_metric(
        "llm_filter_limits_cost_micros_total",
        &[("rule", "spend")],
        (used * 1000) as f64,
        std::time::Duration::from_secs(5),
    );
    assert_eq!(micros as u64, used * 1000, "charged at the price");
}

/// Three gateway Envoys with the limit, behind a front Envoy that spreads
/// calls by `lb_policy`; the gateways' counts are each their own.
struct Mesh {
    mock: MockUpstream,
    front: Envoy,
    _gateways: Vec<Envoy>,
}

/// The front of the recipe in docs/limits.md: the filter in `limits.mode:
/// shard` names each call's tenant, and the route hashes on that name.
const SHARD_FRONT: &str = "hash_policy:\n- header: {header_name: x-llm-tenant-key}\n";

impl Mesh {
    /// `front`: the front's filter configuration; `None`, plain Envoy.
    fn start(lb: &str, route: &str, front: Option<serde_json::Value>) -> Self {
        let mock = MockUpstream::start(MockConfig::named("provider"));
        let limits = json!({"limits": {"rules": [
            {"name": "tenant", "by": ["tenant"], "requests_per_minute": 6}
        ]}});
        let gateways: Vec<Envoy> = (0..3)
            .map(|i| {
                EnvoyBuilder::new()
                    .concurrency(1)
                    .plugin_config(limits.clone())
                    .upstream("provider", mock.port())
                    .start()
                    .unwrap_or_else(|e| panic!("gateway {i}: {e:#}"))
            })
            .collect();
        let ports: Vec<u16> = gateways.iter().map(Envoy::port).collect();
        // One worker: round-robin is then one rotation over the gateways.
        let builder = EnvoyBuilder::new().concurrency(1);
        let builder = match front {
            Some(config) => builder.plugin_config(config),
            None => builder.no_filter(),
        };
        let front = builder
            .upstream_pool("gateways", &ports, &format!("lb_policy: {lb}\n"))
            .extra_route_yaml(route)
            .start()
            .unwrap_or_else(|e| panic!("front: {e:#}"));
        Self {
            mock,
            front,
            _gateways: gateways,
        }
    }

    fn sharded() -> Self {
        Self::start(
            "RING_HASH",
            SHARD_FRONT,
            Some(json!({"limits": {"mode": "shard"}})),
        )
    }

    /// `calls` chat calls of a tenant, call `i` with `headers(i)` too.
    async fn passed_with(
        &self,
        tenant: &str,
        calls: usize,
        headers: impl Fn(usize) -> Vec<(&'static str, String)>,
    ) -> usize {
        let mut passed = 0;
        for i in 0..calls {
            let body = chat_body("gpt-4o", &format!("call {i}"));
            let extra = headers(i);
            let mut h: Vec<(&str, &str)> = vec![("authorization", tenant)];
            h.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
            let r = post_json(&self.front.url(CHAT), &body, &h).await.unwrap();
            assert!(matches!(r.status, 200 | 429), "{}", r.text());
            if r.status == 429 {
                // What is left, as OpenAI's own 429 says it.
                assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
                assert_eq!(r.header("x-ratelimit-limit-requests"), Some("6"));
                assert!(r.header("x-ratelimit-reset-requests").is_some());
            }
            passed += usize::from(r.status == 200);
        }
        passed
    }

    async fn passed(&self, tenant: &str, calls: usize) -> usize {
        self.passed_with(tenant, calls, |_| Vec::new()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_limit_holds_across_gateways_when_the_front_hashes_the_tenant() {
    if skip_without_envoy("a_tenant_limit_holds_across_gateways_when_the_front_hashes_the_tenant") {
        return;
    }
    // The front names the tenant: one gateway owns each tenant's count.
    let hashed = Mesh::sharded();
    assert_eq!(
        hashed.passed(TENANT_A, 18).await,
        6,
        "the limit, once for the mesh"
    );
    assert_eq!(hashed.passed(TENANT_B, 18).await, 6, "another tenant's own");
    assert_eq!(hashed.mock.request_count(), 12);
    // The tenant's name is the front's business: no upstream saw it.
    assert!(hashed
        .mock
        .requests()
        .iter()
        .all(|r| r.header("x-llm-tenant-key").is_none()));
    // Spread round-robin, each gateway counts a third: three times the limit.
    let spread = Mesh::start("ROUND_ROBIN", "", None);
    assert_eq!(spread.passed(TENANT_A, 18).await, 18);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_the_provider_ignores_open_no_fresh_budget_anywhere_in_the_mesh() {
    if skip_without_envoy("headers_the_provider_ignores_open_no_fresh_budget_anywhere_in_the_mesh")
    {
        return;
    }
    let mesh = Mesh::sharded();
    // Each call of the one key adds junk a chat provider ignores, and spells
    // its scheme another way: one key is one tenant on one replica.
    let junk = |i: usize| {
        let mut h = vec![("api-key", format!("junk-{i}"))];
        if i % 3 == 1 {
            h.push(("x-api-key", String::new()));
        }
        h
    };
    assert_eq!(mesh.passed_with(TENANT_A, 9, junk).await, 6);
    let spelt = [
        "bearer sk-tenant-a",
        "BEARER  sk-tenant-a",
        "Bearer sk-tenant-a ",
    ];
    for s in spelt {
        assert_eq!(mesh.passed(s, 2).await, 0, "{s:?} is the same key");
    }
    assert_eq!(mesh.mock.request_count(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_sdk_caller_is_held_to_its_limit_across_three_gateways() {
    if skip_without_envoy("an_anthropic_sdk_caller_is_held_to_its_limit_across_three_gateways") {
        return;
    }
    let mesh = Mesh::sharded();
    let base = format!("http://127.0.0.1:{}", mesh.front.port());
    // Three runs of the official SDK with its key in `x-api-key`, each with
    // another stray `authorization` (which the provider ignores beside it).
    let mut calls = Vec::new();
    for run in 0..3 {
        let junk = format!("authorization: Bearer junk-{run}");
        let out = sdk::run(
            sdk::ANTHROPIC,
            "messages_calls",
            &base,
            &[
                "--calls",
                "6",
                "--api-key",
                "sk-ant-mesh-a",
                "--header",
                &junk,
            ],
        )
        .await;
        calls.extend(out["calls"].as_array().unwrap().clone());
    }
    let passed = calls.iter().filter(|c| c["status"] == 200).count();
    assert_eq!(passed, 6, "the limit, once for the mesh: {calls:?}");
    for c in calls.iter().filter(|c| c["status"] != 200) {
        assert_eq!(c["status"], 429, "{c}");
        assert_eq!(c["error_class"], "RateLimitError", "{c}");
        assert_eq!(c["type"], "rate_limit_error", "{c}");
        let h = &c["headers"];
        assert_eq!(h["anthropic-ratelimit-requests-limit"], "6", "{c}");
        assert_eq!(h["anthropic-ratelimit-requests-remaining"], "0", "{c}");
        assert!(
            h["anthropic-ratelimit-requests-reset"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z')),
            "{c}"
        );
        assert!(h["retry-after"].is_string(), "{c}");
    }
    // Answers say what is left too, counting down on the one replica.
    let left: Vec<&str> = calls
        .iter()
        .filter(|c| c["status"] == 200)
        .filter_map(|c| c["headers"]["anthropic-ratelimit-requests-remaining"].as_str())
        .collect();
    assert_eq!(left, ["5", "4", "3", "2", "1", "0"]);
    assert_eq!(mesh.mock.request_count(), 6);
    // Another key has its own.
    let other = sdk::run(
        sdk::ANTHROPIC,
        "messages_calls",
        &base,
        &["--calls", "2", "--api-key", "sk-ant-mesh-b"],
    )
    .await;
    assert!(other["calls"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == 200));
}

/// A gateway Envoy whose listener terminates mutual TLS: it shows a
/// certificate for `localhost` and requires the client's, signed by the
/// test CA, before any request, as an egress gateway of a mesh does.
struct MtlsGateway {
    ca: TestCa,
    mock: MockUpstream,
    envoy: Envoy,
}

const GATEWAY_NAME: &str = "localhost";
const SPIFFE_A: &str = "spiffe://cluster.local/ns/a/sa/x";
const SPIFFE_B: &str = "spiffe://cluster.local/ns/b/sa/y";

impl MtlsGateway {
    fn start(config: serde_json::Value) -> Self {
        let ca = TestCa::new("mesh test CA").unwrap();
        let dir = temp_dir().unwrap();
        let ca_path = ca.write(dir.path()).unwrap();
        let (cert, key) = ca
            .issue(&[GATEWAY_NAME])
            .unwrap()
            .write(dir.path(), "gateway")
            .unwrap();
        let mock = MockUpstream::start(MockConfig::named("provider"));
        let builder = EnvoyBuilder::new()
            .concurrency(1)
            .plugin_config(config)
            .upstream("provider", mock.port());
        let tls = format!(
            "    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_certificates:
            - certificate_chain: {{filename: {cert:?}}}
              private_key: {{filename: {key:?}}}
            validation_context:
              trusted_ca: {{filename: {ca_path:?}}}
      filters:
"
        );
        let plain = builder.config_yaml();
        let chain = "    filter_chains:\n    - filters:\n";
        assert!(plain.contains(chain), "no filter chain in {plain}");
        let yaml = plain.replacen(chain, &format!("    filter_chains:\n{tls}"), 1);
        let envoy = builder
            .start_config_in(dir, &yaml)
            .unwrap_or_else(|e| panic!("gateway: {e:#}"));
        Self { ca, mock, envoy }
    }

    /// A client showing a certificate with `uri` as its URI SAN (`None`: a
    /// certificate without one).
    fn client(&self, uri: Option<&str>) -> MtlsClient {
        let cert: ClientCert = self.ca.issue_client(uri).unwrap();
        MtlsClient::new(&self.ca, Some(&cert)).unwrap()
    }

    async fn call(&self, client: &MtlsClient, i: usize) -> anyhow::Result<HttpResponse> {
        let body = chat_body("gpt-4o", &format!("call {i}"));
        client
            .post_json(self.envoy.port(), GATEWAY_NAME, CHAT, &body, &[])
            .await
    }

    /// `calls` calls of `client`: the answers, each a 200 or a 429.
    async fn calls(&self, client: &MtlsClient, calls: usize) -> Vec<HttpResponse> {
        let mut answers = Vec::new();
        for i in 0..calls {
            let r = self.call(client, i).await.expect("call over mTLS");
            assert!(matches!(r.status, 200 | 429), "{}", r.text());
            answers.push(r);
        }
        answers
    }
}

fn passed(answers: &[HttpResponse]) -> usize {
    answers.iter().filter(|r| r.status == 200).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_an_mtls_gateway_the_tenant_is_the_peers_spiffe_id() {
    if skip_without_envoy("at_an_mtls_gateway_the_tenant_is_the_peers_spiffe_id") {
        return;
    }
    let gateway = MtlsGateway::start(json!({"tenant": {"from": "peer"}, "limits": {
        "rules": [{"name": "workload", "by": ["tenant"], "requests_per_minute": 3}]
    }}));
    // The two workloads call with the same key (none at all): only their
    // certificates tell them apart.
    let a = gateway.client(Some(SPIFFE_A));
    let b = gateway.client(Some(SPIFFE_B));
    let of_a = gateway.calls(&a, 5).await;
    assert_eq!(passed(&of_a), 3, "a's limit");
    let of_b = gateway.calls(&b, 3).await;
    assert_eq!(passed(&of_b), 3, "b counts apart from a");
    assert_eq!(
        gateway.mock.request_count(),
        6,
        "the upstream saw only those"
    );
    for r in of_a.iter().filter(|r| r.status == 429) {
        let v = r.json();
        assert_eq!(v["error"]["type"], "rate_limit_exceeded", "{}", r.text());
        assert_eq!(v["error"]["code"], "llm_filter_limit_exceeded");
        assert!(header_u64(r, "retry-after") >= 1);
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("3"));
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    }
    assert_eq!(header_u64(&of_b[2], "x-ratelimit-remaining-requests"), 0);
    // The spend metrics name each workload by its identity.
    let wait = std::time::Duration::from_secs(5);
    for (tenant, calls) in [(SPIFFE_A, 3.0), (SPIFFE_B, 3.0)] {
        let tokens = gateway.envoy.wait_for_metric(
            "llm_filter_limits_tokens_total",
            &[("rule", "workload"), ("tenant", tenant)],
            calls,
            wait,
        );
        assert!(tokens >= calls, "{tenant}: {tokens} tokens charged");
        let used = gateway.envoy.metric(
            "llm_filter_limits_used_permille",
            &[
                ("rule", "workload"),
                ("tenant", tenant),
                ("limit", "requests_per_minute"),
            ],
        );
        assert_eq!(used, 1000.0, "{tenant} used its minute");
    }
    let rejected = gateway.envoy.wait_for_metric(
        "llm_filter_limits_calls_total",
        &[("rule", "workload"), ("result", "rejected")],
        2.0,
        wait,
    );
    assert_eq!(rejected, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_an_mtls_gateway_a_caller_without_an_identity_counts_under_none_or_never_connects() {
    if skip_without_envoy(
        "at_an_mtls_gateway_a_caller_without_an_identity_counts_under_none_or_never_connects",
    ) {
        return;
    }
    let gateway = MtlsGateway::start(json!({"tenant": {"from": "peer"}, "limits": {
        "rules": [{"name": "workload", "by": ["tenant"], "requests_per_minute": 2}]
    }}));
    // Certificates the CA signed, but with no URI SAN: no tenant, so all of
    // them share the one count of tenant `none`.
    let first = gateway.client(None);
    let second = gateway.client(None);
    assert_eq!(passed(&gateway.calls(&first, 2).await), 2);
    let r = gateway.call(&second, 2).await.unwrap();
    assert_eq!(
        r.status, 429,
        "another caller without an identity shares the count"
    );
    // A caller with an identity has its own.
    let a = gateway.client(Some(SPIFFE_A));
    assert_eq!(passed(&gateway.calls(&a, 2).await), 2);
    assert_eq!(gateway.mock.request_count(), 4);
    let unlabelled = gateway.envoy.wait_for_metric(
        "llm_filter_limits_tokens_total",
        &[("rule", "workload"), ("tenant", "unknown")],
        2.0,
        std::time::Duration::from_secs(5),
    );
    assert!(unlabelled >= 2.0, "{unlabelled}");
    // Without a certificate the listener refuses the handshake: no call
    // reaches the filter, let alone the upstream.
    let anonymous = MtlsClient::new(&gateway.ca, None).unwrap();
    let refused = gateway.call(&anonymous, 0).await;
    assert!(
        refused.is_err(),
        "served without a certificate: {refused:?}"
    );
    assert_eq!(gateway.mock.request_count(), 4);
}
