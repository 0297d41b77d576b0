//! The "sidecars + gateway tier" topology (docs/deploy/topologies.md) as a
//! mesh runs it: istiod configures a sidecar of `my-app` with
//! egress-sidecars.yaml (the sidecar build) and the egress gateway with
//! egress-keyless.yaml (the full build), access-log.yaml printing the
//! gateway's records; each proxy run by Istio's agent with a workload
//! certificate of a test CA (keyless.rs's mesh), the sidecar reaching the
//! gateway over Istio's mutual TLS. A real Prometheus scrapes both proxies'
//! Prometheus ports with examples/prometheus/llm-filter.rules.yaml and sends
//! the alerts they raise to a real Alertmanager, which the sidecar pulls.

use std::path::Path;
use std::time::{Duration, Instant};

use llm_filter_core::metrics::{
    DEGRADED, DEGRADE_PULLS, REQUESTS, ROUTING_EJECTIONS, ROUTING_FALLBACKS,
};
use llm_filter_e2e::istio::{read_manifests, EXAMPLES};
use llm_filter_e2e::istiod::{Istiod, Node};
use llm_filter_e2e::pilot_agent::PilotAgent;
use llm_filter_e2e::prometheus::Sample;
use llm_filter_e2e::prometheus_server::{free_port, scrape_envoys, with_alertmanager, with_rules};
use llm_filter_e2e::{
    alertmanager_bin, post_json, prometheus_bin, running_in_ci, unique, workspace_root,
    Alertmanager, MockUpstream, PrometheusServer,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::agent::wait_ecds;
use super::keyless::{
    binaries, fetched_by_the_agent, filter_configs, metric, metrics_of, wait_metric, KeylessMesh,
    APP_ID, MESH_KEY,
};
use super::{
    cacheable, chats, filter_chain, hex, module, sidecar_module, yaml_docs, Layout, Module,
    PortLock, PROVIDER, PROVIDER_CLUSTER, SIDECAR,
};
use crate::support;

const SIDECARS: &str = "egress-sidecars.yaml";
/// egress-sidecars.yaml's filter on the app's sidecar.
const SIDECAR_BUILD: Layout = Layout {
    filter: "my-app.llm-filter-sidecar",
    ..SIDECAR
};
/// The gateway's filter (egress-keyless.yaml).
const GATEWAY_FILTER: &str = "istio-system.llm-filter";
/// The Alertmanager egress-sidecars.yaml names, here a stand-in for the
/// Prometheus operator's Service on the test's Alertmanager.
const ALERTMANAGER_HOST: &str = "alertmanager-operated.monitoring.svc.cluster.local";
const MODEL: &str = "gpt-4o-mini";
/// The gateway tier's alert the sidecars degrade a model by (2: P2 shed).
const ALERT: &str = "LLMAllBackendsEjected";
/// The app's trace, as its own tracer started it.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const APP_SPAN: &str = "00f067aa0ba902b7";
/// The app's OpenAI base URL: its sidecar's outbound listener, the
/// provider's name in `host` (as `http://api.openai.com/v1` in a pod).
const BASE: &str = "http://127.0.0.1:80/v1";
const HOST: &str = "host: api.openai.com";

/// egress-sidecars.yaml as a user fills it, for istiod: the sidecar image
/// is the sidecar build, fetched by the agent from the test's server.
fn sidecars_filled(module: &Module) -> String {
    let path = workspace_root().join(EXAMPLES).join(SIDECARS);
    let mut docs = read_manifests(&path).expect(SIDECARS);
    for config in docs.iter_mut().flat_map(filter_configs) {
        let uri = &config["vm_config"]["code"]["remote"]["http_uri"]["uri"];
        assert!(
            uri.as_str().is_some_and(|u| u.ends_with("-sidecar")),
            "the sidecar image: {uri}"
        );
        fetched_by_the_agent(config, module);
    }
    yaml_docs(&docs)
}

/// The Alertmanager Service egress-sidecars.yaml names, on the test's
/// Alertmanager at `port`.
fn alertmanager_service(port: u16) -> String {
    yaml_docs(&[
        json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": "alertmanager-operated", "namespace": "monitoring"},
        "spec": {"hosts": [ALERTMANAGER_HOST], "location": "MESH_EXTERNAL", "resolution": "STATIC",
            "ports": [{"number": 9093, "name": "http", "protocol": "HTTP"}],
            "endpoints": [{"address": "127.0.0.1", "ports": {"http": port}}]}}),
    ])
}

/// The module `agent` runs for the filter `name`: the sha256 of the file
/// the agent handed Envoy.
fn module_run(agent: &PilotAgent, istiod: &Istiod, node: &Node, name: &str) -> String {
    let (_, ecds) = wait_ecds(agent, name, istiod, node);
    let file = ecds["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"]
        .as_str()
        .unwrap_or_else(|| panic!("a local file from the agent: {ecds}"))
        .to_string();
    let bytes = std::fs::read(Path::new(&file)).expect("the agent's module file");
    hex(&Sha256::digest(&bytes))
}

/// The records of the LLM calls the gateway logged (access-log.yaml's
/// Telemetry: Istio's JSON line holds the record as a string of JSON).
fn gateway_records(gateway: &PilotAgent) -> Vec<Value> {
    gateway
        .log()
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|line| serde_json::from_str(line["llm"].as_str()?).ok())
        .collect()
}

/// A run of the OpenAI SDK's `scenario` from the app: keyless, through its
/// sidecar, with `args`.
async fn sdk(scenario: &str, args: &[&str]) -> Value {
    let mut all = vec!["--api-key", "", "--header", HOST];
    all.extend_from_slice(args);
    support::sdk::run(support::sdk::OPENAI, scenario, BASE, &all).await
}

/// A chat call of `priority` through the app's sidecar: status, body and
/// `x-llm-degraded`.
async fn call(priority: &str, content: &str) -> (u16, Value, Option<String>) {
    let r = post_json(
        &SIDECAR.chat_url(),
        &cacheable(MODEL, content),
        &[("host", PROVIDER), ("x-request-priority", priority)],
    )
    .await
    .expect("call");
    let degraded = r.header("x-llm-degraded").map(str::to_string);
    let json = serde_json::from_str(&r.text()).unwrap_or(Value::Null);
    (r.status, json, degraded)
}

/// Whether Alertmanager holds [`ALERT`] for [`MODEL`].
async fn alert_held(am: &Alertmanager) -> bool {
    am.alerts().await.unwrap_or_default().iter().any(|a| {
        a["labels"]["alertname"] == ALERT
            && a["labels"]["model"] == MODEL
            && a["status"]["state"] == "active"
    })
}

fn samples_named<'a>(samples: &'a [Sample], name: &str) -> Vec<&'a Sample> {
    samples.iter().filter(|s| s.name == name).collect()
}

/// The app's two identical calls through its sidecar and the gateway:
/// what the app got, what the provider received, what each tier counted.
async fn two_calls_through_the_tier(mesh: &KeylessMesh) {
    let (app, gateway, provider) = (&mesh.app, &mesh.gateway, &mesh.provider);
    // The app's two identical calls (the SDK, keyless): priority P2 (not
    // the default; P0 would be exempt from the gateway's limit), its trace,
    // a baggage member of its own.
    let traceparent = format!("traceparent: 00-{TRACE_ID}-{APP_SPAN}-01");
    let prompt = "through the gateway tier";
    let out = sdk(
        "chat_raw",
        &[
            "--calls",
            "2",
            "--temperature",
            "0",
            "--prompt",
            prompt,
            "--header",
            "x-request-priority: P2",
            "--header",
            &traceparent,
            "--header",
            "baggage: session=s-42",
        ],
    )
    .await;
    let calls = out["calls"].as_array().expect("calls");
    let seen: Vec<(&Value, &Value, &Value)> = calls
        .iter()
        .map(|c| {
            (
                &c["status"],
                &c["headers"]["x-cache"],
                &c["headers"]["x-trace-id"],
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (&json!(200), &json!("MISS"), &json!(TRACE_ID)),
            (&json!(200), &json!("HIT"), &json!(TRACE_ID)),
        ],
        "{out}"
    );
    assert_eq!(calls[0]["content"], calls[1]["content"], "{out}");
    assert!(
        calls[0]["content"]
            .as_str()
            .is_some_and(|c| c.contains(prompt)),
        "{out}"
    );
    assert_eq!(
        calls[0]["headers"]["x-llm-cluster"], PROVIDER_CLUSTER,
        "routed by the gateway: {out}"
    );

    // What the provider received: one call for the two, the app's priority
    // in baggage beside its member, its trace under the app's own span (no
    // hop between exports a span of its own: the sidecar build has none,
    // the gateway leaves the trace to Istio's tracer), the mesh's key.
    let got: Vec<_> = chats(provider)
        .into_iter()
        .filter(|c| {
            c.json()
                .is_some_and(|b| b["messages"][0]["content"] == prompt)
        })
        .collect();
    assert_eq!(got.len(), 1, "one provider call for two identical ones");
    let got = &got[0];
    let baggage = got.header("baggage").unwrap_or_default();
    let members: Vec<&str> = baggage.split(',').map(str::trim).collect();
    assert!(members.contains(&"session=s-42"), "{baggage}");
    assert!(members.contains(&"priority=P2"), "{baggage}");
    let tp: Vec<&str> = got
        .header("traceparent")
        .unwrap_or_default()
        .split('-')
        .collect();
    assert_eq!(tp, ["00", TRACE_ID, APP_SPAN, "01"], "the app's span");
    assert_eq!(
        got.header("authorization"),
        Some(format!("Bearer {MESH_KEY}").as_str())
    );

    // The sidecar counted both calls at the app's priority; the gateway knew
    // the app by its SPIFFE id (its limit's tokens, its records), served the
    // repeat from its cache and routed the first.
    let p2 = [("priority", "P2"), ("model", MODEL)];
    let sidecar_calls = wait_metric(app, REQUESTS, &p2, 2.0, Duration::from_secs(5));
    assert_eq!(sidecar_calls, 2.0, "the sidecar's P2 calls");
    let tokens = mesh.tokens_of(APP_ID, 1.0);
    assert!(tokens >= 1.0, "{APP_ID}: {tokens} tokens");
    let tenants: Vec<String> =
        samples_named(&metrics_of(gateway), "llm_filter_limits_tokens_total")
            .iter()
            .filter_map(|s| s.labels.get("tenant").cloned())
            .collect();
    assert!(tenants.iter().all(|t| t == APP_ID), "{tenants:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let records = loop {
        let records: Vec<Value> = gateway_records(gateway)
            .into_iter()
            .filter(|r| r["priority"] == "P2")
            .collect();
        if records.len() >= 2 || Instant::now() >= deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let told: Vec<(&Value, &Value, &Value)> = records
        .iter()
        .map(|r| (&r["tenant"], &r["cache"], &r["model"]))
        .collect();
    assert_eq!(
        told,
        [
            (&json!(APP_ID), &json!("MISS"), &json!(MODEL)),
            (&json!(APP_ID), &json!("HIT"), &json!(MODEL)),
        ],
        "the gateway's records: {records:?}"
    );
    assert_eq!(records[0]["cluster"], PROVIDER_CLUSTER, "{records:?}");

    // Each call counted once in the mesh-wide load the sidecars' degrade
    // reads (`llm:load_*:sum`): the gateway publishes its models' load (each
    // second, on its tick), the sidecar build none.
    let load = "llm_filter_load_rps_milli";
    let deadline = Instant::now() + Duration::from_secs(10);
    let at_gateway = loop {
        let samples = metrics_of(gateway);
        let models: Vec<String> = samples_named(&samples, load)
            .iter()
            .filter_map(|s| s.labels.get("model").cloned())
            .collect();
        if models.iter().any(|m| m == MODEL) || Instant::now() >= deadline {
            break models;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(at_gateway.iter().any(|m| m == MODEL), "{at_gateway:?}");
    let at_sidecar: Vec<String> = metrics_of(app)
        .into_iter()
        .filter(|s| s.name.starts_with("llm_filter_load_"))
        .map(|s| s.name)
        .collect();
    assert!(at_sidecar.is_empty(), "the sidecar's load: {at_sidecar:?}");
}

/// The app's budget, planned at the sidecar, ends a call the provider is
/// slow to answer.
async fn the_budget_ends_a_slow_call(provider: &MockUpstream) {
    // The app's budget, planned at the sidecar: 1 s against a provider that
    // answers in 3 ends the call in about 1 s.
    let out = sdk(
        "chat_error",
        &[
            "--prompt",
            "a slow provider",
            "--header",
            "x-request-timeout-ms: 1000",
            "--header",
            "x-mock-delay-ms: 3000",
        ],
    )
    .await;
    assert_eq!(out["status"], 504, "{out}");
    assert_eq!(out["code"], "llm_filter_upstream_timeout", "{out}");
    assert_eq!(out["attempts"][0]["should_retry"], "false", "{out}");
    let elapsed = out["elapsed_ms"].as_u64().unwrap_or(u64::MAX);
    assert!((900..2500).contains(&elapsed), "{out}");
    // The gateway's Envoy held the call to the same budget.
    let slow = chats(provider)
        .into_iter()
        .find(|c| {
            c.json()
                .is_some_and(|b| b["messages"][0]["content"] == "a slow provider")
        })
        .expect("the slow call reached the provider");
    let expected = slow
        .header("x-envoy-expected-rq-timeout-ms")
        .and_then(|v| v.parse::<u64>().ok());
    assert!(expected.is_some_and(|ms| ms <= 1000), "{:?}", slow.headers);
}

/// The gateway tier's alert, raised by its metrics in Prometheus and held
/// by Alertmanager, sheds a P2 call at the sidecar, which pulls it.
async fn the_gateway_tiers_alert_sheds_p2_at_the_sidecar(
    mesh: &KeylessMesh,
    am: &Alertmanager,
    prom: &PrometheusServer,
) {
    let (app, gateway, provider) = (&mesh.app, &mesh.gateway, &mesh.provider);
    // Before any alert a P2 call goes through.
    let (status, body, _) = call("P2", &unique("P2 before")).await;
    assert_eq!(status, 200, "{body}");

    // The gateway tier finds the model's only backend down (its probe
    // fails: one failed probe ejects), then the provider recovers; every
    // call while the backend is out goes on base weights, which the rules
    // alert on.
    provider.set_status(Some(503));
    let ejected = wait_metric(
        gateway,
        ROUTING_EJECTIONS,
        &[("llm_cluster", PROVIDER_CLUSTER)],
        1.0,
        Duration::from_secs(15),
    );
    provider.set_status(None);
    assert!(ejected >= 1.0, "the gateway's probe ejected the backend");
    let ejected_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while !alert_held(am).await {
        assert!(
            Instant::now() < deadline,
            "no {ALERT} in Alertmanager: fallbacks {}\n{}",
            metric(gateway, ROUTING_FALLBACKS, &[("model", MODEL)]),
            prom.log_contents()
        );
        let (status, body, _) = call("P1", &format!("while ejected {n}")).await;
        assert_eq!(status, 200, "{body}");
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let alerted = Instant::now();
    let fallbacks = metric(gateway, ROUTING_FALLBACKS, &[("model", MODEL)]);
    assert!(
        fallbacks >= 2.0,
        "the gateway's calls on base weights: {fallbacks}"
    );
    eprintln!(
        "{ALERT} in Alertmanager {:?} after the ejection, {n} calls on base weights",
        alerted - ejected_at
    );

    // The sidecar pulls it (every 10 s) and sheds P2 calls of the model.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body, _) = call("P2", &unique("P2 while degraded")).await;
        if status == 503 {
            assert_eq!(body["error"]["code"], "llm_filter_degraded_shed", "{body}");
            break;
        }
        assert_eq!(status, 200, "{body}");
        assert!(Instant::now() < deadline, "P2 never shed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "P2 shed at the sidecar {:?} after the alert",
        alerted.elapsed()
    );

    // The SDK's P2 call: shed in the pod, it reaches neither the gateway
    // nor the provider.
    let provider_before = chats(provider).len();
    let gateway_before = metric(gateway, REQUESTS, &[]);
    let out = sdk(
        "chat_error",
        &[
            "--prompt",
            "shed at the sidecar",
            "--header",
            "x-request-priority: P2",
        ],
    )
    .await;
    assert_eq!(out["status"], 503, "{out}");
    assert_eq!(out["code"], "llm_filter_degraded_shed", "{out}");
    assert!(
        out["attempts"][0]["retry_after"].is_string(),
        "retry-after: {out}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(chats(provider).len(), provider_before, "no provider call");
    assert_eq!(
        metric(gateway, REQUESTS, &[]),
        gateway_before,
        "no gateway call"
    );
    let shed = metric(app, DEGRADED, &[("action", "shed"), ("priority", "P2")]);
    assert!(shed >= 2.0, "the sidecar's sheds: {shed}");
    let pulls = metric(
        app,
        DEGRADE_PULLS,
        &[("what", "alertmanager"), ("result", "ok")],
    );
    assert!(pulls >= 1.0, "the sidecar's pulls: {pulls}");
    // P1 goes on, degraded; P0 goes on untouched.
    let (status, body, degraded) = call("P1", &unique("P1 while degraded")).await;
    assert_eq!((status, degraded.as_deref()), (200, Some("2")), "{body}");
    let (status, body, degraded) = call("P0", &unique("P0 while degraded")).await;
    assert_eq!((status, degraded), (200, None), "{body}");
}

/// App sidecar (sidecar build) → egress gateway (full build) → provider,
/// configured by the real istiod: the OpenAI SDK's calls carry the app's
/// priority in baggage and continue its trace from the sidecar; the sidecar
/// plans the budget, whose timeout ends a slow call; the gateway knows the
/// app by its SPIFFE id over mTLS, serves a repeat from its cache (one
/// provider call for two), routes, counts the tenant's tokens and writes the
/// record; when the gateway finds every backend of the model down, its
/// metric raises LLMAllBackendsEjected in Prometheus, Alertmanager holds it,
/// the sidecar pulls it and sheds a P2 call of that model in the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_build_in_front_of_the_gateway_tier() {
    let test = "sidecar_build_in_front_of_the_gateway_tier";
    let Some((istiod_bin, agent_bin)) = binaries(test) else {
        return;
    };
    if prometheus_bin().is_none() || alertmanager_bin().is_none() {
        assert!(
            !running_in_ci(),
            "{test}: no prometheus or alertmanager; `make e2e` installs them"
        );
        eprintln!("SKIP {test}: no prometheus or alertmanager; `make e2e` installs them");
        return;
    }
    let _ports = PortLock::acquire().expect("port lock");
    let started = Instant::now();
    // Alertmanager sends nowhere: the sidecars pull.
    let am = Alertmanager::start(
        "route: {receiver: nobody, group_wait: 1s, group_interval: 1s, repeat_interval: 1h}\n\
         receivers: [{name: nobody}]\n",
    )
    .expect("alertmanager");
    let sidecar_build = sidecar_module();
    let full_build = module();
    let more = vec![
        (SIDECARS.to_string(), sidecars_filled(&sidecar_build)),
        (
            "access-log.yaml".to_string(),
            std::fs::read_to_string(workspace_root().join(EXAMPLES).join("access-log.yaml"))
                .expect("access-log.yaml"),
        ),
        (
            "monitoring.yaml".to_string(),
            alertmanager_service(am.port()),
        ),
    ];
    let (mesh, _, _) = KeylessMesh::start_with(&istiod_bin, &agent_bin, more);
    let (app, gateway, provider) = (&mesh.app, &mesh.gateway, &mesh.provider);

    // Each proxy runs its build: the sidecar's filter right before the
    // router of its outbound listener.
    let sidecar_sha = module_run(app, &mesh.istiod, &mesh.app_node, SIDECAR_BUILD.filter);
    assert_eq!(sidecar_sha, sidecar_build.sha256, "the sidecar build");
    let gateway_sha = module_run(gateway, &mesh.istiod, &mesh.gateway_node, GATEWAY_FILTER);
    assert_eq!(gateway_sha, full_build.sha256, "the full build");
    assert_ne!(sidecar_sha, gateway_sha);
    let (chain, at) = filter_chain(&app.config_dump().expect("dump"), &SIDECAR_BUILD);
    assert_eq!(
        chain.get(at + 1).map(String::as_str),
        Some("envoy.filters.http.router"),
        "{chain:?}"
    );
    let prom = PrometheusServer::start(
        free_port().expect("port"),
        &with_alertmanager(
            &with_rules(
                &scrape_envoys(&[gateway.prometheus_port(), app.prometheus_port()]),
                &workspace_root().join("examples/prometheus/llm-filter.rules.yaml"),
            ),
            am.port(),
        ),
    )
    .expect("prometheus");
    eprintln!("mesh up in {:?}", started.elapsed());

    two_calls_through_the_tier(&mesh).await;
    the_budget_ends_a_slow_call(provider).await;
    the_gateway_tiers_alert_sheds_p2_at_the_sidecar(&mesh, &am, &prom).await;

    for node in [&mesh.gateway_node, &mesh.app_node] {
        mesh.istiod
            .settled(node.proxy_id())
            .expect("no NACK after the calls");
    }
    eprintln!("the topology: {:?} in all", started.elapsed());
}
