//! Keyless egress as a mesh runs it (examples/istio/egress-keyless.yaml):
//! istiod configures a sidecar of `my-app` and the egress gateway, each run
//! by Istio's agent, which serves its Envoy the workload certificate by SDS;
//! the sidecar reaches the gateway over Istio's mutual TLS, the gateway's
//! filter names the caller by the sidecar's SPIFFE id, and the gateway's
//! provider cluster puts the key of the mounted Secret on. The certificates
//! are a test CA's, mounted as files for the agents (`FILE_MOUNTED_CERTS`,
//! [`WORKLOAD_CERT_FILES`]) in the form Istio's CA issues them (one URI SAN,
//! `spiffe://cluster.local/ns/<namespace>/sa/<service account>`): istiod runs
//! no CA here. The Secret is a folder laid out and updated as the kubelet
//! does a Secret volume.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llm_filter_e2e::istio::{read_manifests, EXAMPLES};
use llm_filter_e2e::istiod::{synced, Istiod, Node};
use llm_filter_e2e::pilot_agent::{agent_bin, PilotAgent, WORKLOAD_CERT_FILES};
use llm_filter_e2e::tls::TestCa;
use llm_filter_e2e::{chat_body, post_json, workspace_root, MockConfig, MockUpstream};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::agent::wait_ecds;
use super::{
    cacheable, chats, filled, filter_chain, hex, mesh, module, overlay, section,
    skip_without_istiod, yaml_docs, Layout, Module, PortLock, GATEWAY_SERVICE_ACCOUNT, PROVIDER,
    PROVIDER_CLUSTER, SIDECAR,
};
use crate::support;
use crate::support::secrets::never_saw;

const FILE: &str = "egress-keyless.yaml";
/// Where the example mounts the Secret in the gateway's pod.
const KEYS_DIR: &str = "/etc/llm-keys";
/// The placeholder of the provider's key in the example's Secret.
const KEY_PLACEHOLDER: &str = "OPENAI_API_KEY";

pub(super) const MESH_KEY: &str = "sk-mesh-egress-PLANTED-1";
const ROTATED_KEY: &str = "sk-mesh-egress-PLANTED-2";
const STRAY_KEY: &str = "sk-app-stray-PLANTED-3";
const VIRTUAL_KEY: &str = "vk-payments-PLANTED-4";

/// The sidecar's identity: `my-app`'s service account `default` (what the
/// agent announces), as Istio's CA writes it into the certificate.
pub(super) const APP_ID: &str = "spiffe://cluster.local/ns/my-app/sa/default";

/// The gateway's server for port 443 (the Service's `https`, 443 → 8443).
const KEYLESS_GATEWAY: Layout = Layout {
    listener: "0.0.0.0_8443",
    listener_port: 8443,
    route_config: "https.443.https.llm-egress.istio-system",
    vhost: "api.openai.com:443",
    filter: "istio-system.llm-filter",
};

/// The sidecar's cluster for the gateway's mTLS port.
const GATEWAY_MTLS_CLUSTER: &str =
    "outbound|443||istio-egressgateway.istio-system.svc.cluster.local";

fn gateway_id() -> String {
    format!("spiffe://cluster.local/ns/istio-system/sa/{GATEWAY_SERVICE_ACCOUNT}")
}

/// A Secret volume as the kubelet lays one out and updates it: each file a
/// symlink through `..data`, itself a symlink to the folder of the current
/// files; an update writes a new folder and renames a new `..data` over the
/// old one (the one change Envoy's `watched_directory` sees), then removes
/// the old folder.
struct SecretVolume {
    dir: tempfile::TempDir,
    generation: u32,
}

impl SecretVolume {
    fn new(files: &[(String, String)]) -> Self {
        let mut volume = Self {
            dir: tempfile::tempdir().expect("temp dir"),
            generation: 0,
        };
        volume.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.path().join(name))
                .expect("the file's symlink");
        }
        volume
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn update(&mut self, files: &[(String, String)]) {
        self.generation += 1;
        let folder = format!("..generation_{}", self.generation);
        std::fs::create_dir(self.path().join(&folder)).expect("the generation's folder");
        for (name, text) in files {
            std::fs::write(self.path().join(&folder).join(name), text).expect("a Secret's file");
        }
        let staged = self.path().join("..data_tmp");
        std::os::unix::fs::symlink(&folder, &staged).expect("..data_tmp");
        std::fs::rename(&staged, self.path().join("..data")).expect("the swap");
        if self.generation > 1 {
            let old = self
                .path()
                .join(format!("..generation_{}", self.generation - 1));
            std::fs::remove_dir_all(old).expect("the old generation");
        }
    }
}

/// The example's Secret, its files with `key` in place of the placeholder.
fn secret_files(docs: &[Value], key: &str) -> Vec<(String, String)> {
    let secret = docs
        .iter()
        .find(|d| d["kind"] == "Secret")
        .expect("the example's Secret");
    secret["stringData"]
        .as_object()
        .expect("stringData")
        .iter()
        .map(|(name, text)| {
            let text = text.as_str().expect("a file's text");
            assert!(text.contains(KEY_PLACEHOLDER), "{name}: {text}");
            (name.clone(), text.replace(KEY_PLACEHOLDER, key))
        })
        .collect()
}

/// What `agent`'s Envoy shows at `/stats/prometheus`.
pub(super) fn metrics_of(agent: &PilotAgent) -> Vec<llm_filter_e2e::prometheus::Sample> {
    let (status, text) = agent.admin_get("/stats/prometheus").expect("metrics");
    assert_eq!(status, 200, "{text}");
    llm_filter_e2e::prometheus::parse(&text)
}

/// A metric of `agent`'s Envoy, summed over the series with `labels`.
pub(super) fn metric(agent: &PilotAgent, name: &str, labels: &[(&str, &str)]) -> f64 {
    llm_filter_e2e::prometheus::sum(&metrics_of(agent), name, labels)
}

/// [`metric`] once it reaches `min`, or what it is after `within`.
pub(super) fn wait_metric(
    agent: &PilotAgent,
    name: &str,
    labels: &[(&str, &str)],
    min: f64,
    within: Duration,
) -> f64 {
    let deadline = Instant::now() + within;
    loop {
        let value = metric(agent, name, labels);
        if value >= min || Instant::now() >= deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// egress-keyless.yaml as a user fills it, for istiod: the module over HTTP
/// from the test's server (Istio's agent fetches it and checks its sha256,
/// as it pulls an image), the Secret's mount at `keys` (the Secret itself
/// goes to Kubernetes, not istiod), and `tenant`, when given, in place of
/// the filter's own.
fn filled_keyless(docs: &[Value], module: &Module, keys: &Path, tenant: Option<&Value>) -> String {
    let docs: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] != "Secret")
        .map(|doc| {
            let mut doc = doc.clone();
            for config in filter_configs(&mut doc) {
                fetched_by_the_agent(config, module);
                if let Some(tenant) = tenant {
                    let value = &mut config["configuration"]["value"];
                    let mut filter: Value =
                        serde_json::from_str(value.as_str().expect("the filter's config"))
                            .expect("the filter's config JSON");
                    filter["tenant"] = tenant.clone();
                    *value = json!(filter.to_string());
                }
            }
            let text = doc.to_string();
            if doc["kind"] != "EnvoyFilter" {
                return doc;
            }
            assert!(text.contains(&format!("\"{KEYS_DIR}/")), "{text}");
            serde_json::from_str(&text.replace(KEYS_DIR, &keys.display().to_string()))
                .expect("the EnvoyFilter")
        })
        .collect();
    yaml_docs(&docs)
}

/// The filter configurations (`typed_config.config`) of a manifest's patches.
pub(super) fn filter_configs(doc: &mut Value) -> impl Iterator<Item = &mut Value> {
    doc.pointer_mut("/spec/configPatches")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(|patch| patch.pointer_mut("/patch/value/typed_config/config"))
}

/// A Wasm filter's remote code (`oci://REGISTRY/...`, `IMAGE_SHA256`) as
/// the agent fetches it here: `module` over HTTP from the test's server,
/// checked against its sha256, as the agent pulls and checks an image.
pub(super) fn fetched_by_the_agent(config: &mut Value, module: &Module) {
    let remote = &mut config["vm_config"]["code"]["remote"];
    assert_eq!(remote["sha256"], "IMAGE_SHA256", "{remote}");
    remote["sha256"] = json!(module.sha256);
    remote["http_uri"]["uri"] = json!(format!(
        "http://127.0.0.1:{}/llm-filter.wasm",
        module.server.port()
    ));
}

/// istiod and Istio's agent, or `None` when the test `test` skips.
pub(super) fn binaries(test: &str) -> Option<(PathBuf, PathBuf)> {
    Some((skip_without_istiod(test)?, agent_bin(test)?))
}

/// The workload certificate of `id` as the agent reads it from files.
fn workload_files(ca: &TestCa, id: &str) -> Vec<(&'static str, String)> {
    let cert = ca.issue_workload(id).expect("workload certificate");
    WORKLOAD_CERT_FILES
        .into_iter()
        .zip([cert.cert_pem.clone(), cert.key_pem().to_string(), ca.pem()])
        .collect()
}

fn start_agent(bin: &Path, node: &Node, istiod: &Istiod, files: &[(&str, String)]) -> PilotAgent {
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    PilotAgent::start_with_files(bin, node, istiod.grpc_port(), &mesh(), &[], &files)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e:#}\n--- istiod ---\n{}",
                node.id,
                istiod.log_tail(20)
            )
        })
}

/// Waits until `node` is synced with `listener` and `cluster` in its Envoy;
/// returns the config dump.
fn wait_for(
    agent: &PilotAgent,
    node: &Node,
    istiod: &Istiod,
    listener: &str,
    cluster: &str,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dump = agent.config_dump().expect("config_dump");
        let sync = istiod
            .debug("/debug/syncz")
            .and_then(|s| synced(&s, node.proxy_id()));
        let has = |kind: &str, key: &str, name: &str| {
            section(&dump, kind)[key]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["name"] == name || c["cluster"]["name"] == name)
        };
        if sync.is_ok()
            && has("ListenersConfigDump", "dynamic_listeners", listener)
            && has("ClustersConfigDump", "dynamic_active_clusters", cluster)
        {
            return dump;
        }
        assert!(
            Instant::now() < deadline,
            "{}: no {listener} and {cluster} in 30 s: {sync:?}\n{}",
            node.id,
            agent.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cluster `name` of `dump`.
fn cluster(dump: &Value, name: &str) -> Value {
    section(dump, "ClustersConfigDump")["dynamic_active_clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| &c["cluster"])
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
        .clone()
}

/// The mesh of the test: istiod with provider.yaml and egress-keyless.yaml
/// as filled, the egress gateway and a sidecar of `my-app` each run by
/// Istio's agent with a workload certificate of the test CA, the provider
/// (taking only the mesh's key) and the gateway's Secret volume.
pub(super) struct KeylessMesh {
    pub(super) gateway: PilotAgent,
    pub(super) gateway_node: Node,
    pub(super) app: PilotAgent,
    pub(super) app_node: Node,
    pub(super) istiod: Istiod,
    pub(super) provider: MockUpstream,
    keys: SecretVolume,
    example: Vec<Value>,
    module: Module,
}

impl KeylessMesh {
    /// The mesh, once both proxies are synced with what they need; with the
    /// config dumps of the gateway and the sidecar.
    fn start(istiod_bin: &Path, agent_bin: &Path) -> (Self, Value, Value) {
        Self::start_with(istiod_bin, agent_bin, Vec::new())
    }

    /// [`KeylessMesh::start`] with `more` manifests (file name, text) in
    /// istiod's folder.
    pub(super) fn start_with(
        istiod_bin: &Path,
        agent_bin: &Path,
        more: Vec<(String, String)>,
    ) -> (Self, Value, Value) {
        let module = module();
        let provider = MockUpstream::start(MockConfig::named("provider"));
        provider.set_keys(Some(&[MESH_KEY]));
        let example = read_manifests(&workspace_root().join(EXAMPLES).join(FILE)).expect(FILE);
        let keys = SecretVolume::new(&secret_files(&example, MESH_KEY));
        let mut config = vec![
            (
                "provider.yaml".to_string(),
                filled("provider.yaml", &module, provider.port()),
            ),
            (
                FILE.to_string(),
                filled_keyless(&example, &module, keys.path(), None),
            ),
            (
                "test-mesh.yaml".to_string(),
                overlay(module.server.port(), true),
            ),
        ];
        config.extend(more);
        let istiod = Istiod::start(istiod_bin, &config, &mesh()).expect("istiod");
        let ca = TestCa::new("llm-filter e2e mesh CA").expect("CA");
        let gateway_node = Node::egress_gateway();
        let gateway = start_agent(
            agent_bin,
            &gateway_node,
            &istiod,
            &workload_files(&ca, &gateway_id()),
        );
        let app_node = Node::sidecar();
        let app = start_agent(agent_bin, &app_node, &istiod, &workload_files(&ca, APP_ID));
        wait_ecds(&gateway, KEYLESS_GATEWAY.filter, &istiod, &gateway_node);
        let gateway_dump = wait_for(
            &gateway,
            &gateway_node,
            &istiod,
            KEYLESS_GATEWAY.listener,
            PROVIDER_CLUSTER,
        );
        let app_dump = wait_for(
            &app,
            &app_node,
            &istiod,
            SIDECAR.listener,
            GATEWAY_MTLS_CLUSTER,
        );
        let mesh = Self {
            gateway,
            gateway_node,
            app,
            app_node,
            istiod,
            provider,
            keys,
            example,
            module,
        };
        (mesh, gateway_dump, app_dump)
    }

    /// The example with the filter's `tenant` replaced, written over the
    /// first in istiod's folder; returns once the gateway runs it.
    fn switch_tenant(&self, tenant: &Value) {
        let text = filled_keyless(&self.example, &self.module, self.keys.path(), Some(tenant));
        self.istiod.write_config(FILE, &text).expect("the new form");
        let from = tenant["from"].as_str().expect("tenant.from");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, ecds) = wait_ecds(
                &self.gateway,
                KEYLESS_GATEWAY.filter,
                &self.istiod,
                &self.gateway_node,
            );
            if ecds.to_string().contains(from) {
                return;
            }
            assert!(Instant::now() < deadline, "tenant.from {from} never came");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The gateway's limit tokens counted under `tenant`, once they reach
    /// `min` (or 5 s pass).
    pub(super) fn tokens_of(&self, tenant: &str, min: f64) -> f64 {
        let labels = [("rule", "per-workload"), ("tenant", tenant)];
        let tokens = "llm_filter_limits_tokens_total";
        wait_metric(&self.gateway, tokens, &labels, min, Duration::from_secs(5))
    }

    fn gateway_metrics(&self) -> Vec<llm_filter_e2e::prometheus::Sample> {
        metrics_of(&self.gateway)
    }

    /// The authorization each chat call the provider received carried.
    fn keys_received(&self) -> Vec<String> {
        chats(&self.provider)
            .iter()
            .map(|c| c.header("authorization").unwrap_or("<none>").to_string())
            .collect()
    }
}

/// What istiod generated: the gateway terminates mTLS on 8443 and asks for
/// the caller's certificate, the filter right before the router; the
/// provider's cluster puts the key of the mounted file (under `keys`) on,
/// Istio's own options kept; the sidecar reaches the gateway over mTLS with
/// its certificate, the provider's name as SNI, and checks the gateway's
/// identity.
fn assert_generated(gateway: &Value, app: &Value, keys: &Path) {
    let (chain, at) = filter_chain(gateway, &KEYLESS_GATEWAY);
    assert_eq!(
        chain.get(at + 1).map(String::as_str),
        Some("envoy.filters.http.router"),
        "{chain:?}"
    );
    let listener = section(gateway, "ListenersConfigDump")["dynamic_listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["name"] == KEYLESS_GATEWAY.listener)
        .expect("the gateway's mTLS listener")
        .to_string();
    assert!(
        listener.contains(r#""require_client_certificate":true"#),
        "{listener}"
    );
    let provider = cluster(gateway, PROVIDER_CLUSTER);
    let options = &provider["typed_extension_protocol_options"]
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    let upstream_filters: Vec<&str> = options["http_filters"]
        .as_array()
        .expect("upstream HTTP filters")
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert_eq!(
        upstream_filters,
        [
            "envoy.filters.http.credential_injector",
            "envoy.filters.http.upstream_codec"
        ]
    );
    assert_eq!(
        options["common_http_protocol_options"]["idle_timeout"], "300s",
        "{options}"
    );
    let injector = options["http_filters"][0].to_string();
    assert!(
        injector.contains(&format!("{}/openai.yaml", keys.display())),
        "{injector}"
    );
    let to_gateway = cluster(app, GATEWAY_MTLS_CLUSTER).to_string();
    for expected in [
        r#""sni":"api.openai.com""#,
        r#""name":"default""#,
        r#""name":"ROOTCA""#,
        &gateway_id(),
    ] {
        assert!(
            to_gateway.contains(expected),
            "{expected} not in {to_gateway}"
        );
    }
}

/// A chat call through the sidecar, as the app makes it, with `headers`.
async fn call(content: &str, headers: &[(&str, &str)]) -> llm_filter_e2e::HttpResponse {
    let mut all = vec![("host", PROVIDER)];
    all.extend_from_slice(headers);
    let r = post_json(
        &SIDECAR.chat_url(),
        &cacheable("gpt-4o-mini", content),
        &all,
    )
    .await
    .expect("call");
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

/// A rotation as Kubernetes makes one: the Secret's new key reaches the
/// volume by the kubelet's swap; the provider takes both keys meanwhile,
/// then only the new one. No call fails; returns how many calls went before
/// one carried the new key.
async fn rotate(mesh: &mut KeylessMesh) -> usize {
    mesh.provider.set_keys(Some(&[MESH_KEY, ROTATED_KEY]));
    mesh.keys.update(&secret_files(&mesh.example, ROTATED_KEY));
    let rotated = format!("Bearer {ROTATED_KEY}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut calls = 0;
    while mesh.keys_received().last() != Some(&rotated) {
        assert!(Instant::now() < deadline, "the rotated key not taken up");
        call(&format!("rotation {calls}"), &[]).await;
        calls += 1;
    }
    mesh.provider.set_keys(Some(&[ROTATED_KEY]));
    call("after the rotation", &[]).await;
    calls
}

/// No planted key anywhere istiod or the proxies write: the keys never pass
/// through istiod or an Istio resource, and the proxies never tell.
fn assert_no_planted_key(mesh: &KeylessMesh) {
    let (_, stats) = mesh.gateway.admin_get("/stats").expect("/stats");
    let (_, prometheus) = mesh
        .gateway
        .admin_get("/stats/prometheus")
        .expect("/stats/prometheus");
    let configz = mesh.istiod.debug("/debug/configz").expect("configz");
    let outputs = [
        ("istiod's config", configz.to_string()),
        ("istiod's log", mesh.istiod.log_tail(100_000)),
        (
            "the gateway's config dump",
            mesh.gateway.config_dump().expect("dump").to_string(),
        ),
        ("the gateway's stats", stats),
        ("the gateway's metrics", prometheus),
        ("the gateway's log", mesh.gateway.log()),
        ("the sidecar's log", mesh.app.log()),
    ];
    for (what, text) in &outputs {
        for secret in [MESH_KEY, ROTATED_KEY, STRAY_KEY, VIRTUAL_KEY] {
            assert!(!text.contains(secret), "{secret} in {what}");
        }
    }
}

/// egress-keyless.yaml and provider.yaml through istiod, a sidecar of
/// `my-app` and the egress gateway each run by Istio's agent with its
/// workload certificate: calls from the app with no key (the OpenAI SDK)
/// and with stray ones reach the provider with the key of the mounted
/// Secret and none of the app's; the gateway knows the caller by the
/// sidecar's SPIFFE id (its limit metrics say so) and serves it from the
/// cache; no plaintext call reaches the gateway; a rotation by the kubelet's
/// swap is taken up with no call failing; the virtual-key form of the same
/// file admits a call with the key the platform issued and refuses one
/// without; no planted key is in any output of istiod or the proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_egress_the_gateway_holds_the_key_and_knows_the_caller_by_its_mesh_identity() {
    let test = "keyless_egress_the_gateway_holds_the_key_and_knows_the_caller_by_its_mesh_identity";
    let Some((istiod_bin, agent_bin)) = binaries(test) else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let started = Instant::now();
    let (mut mesh, gateway_dump, app_dump) = KeylessMesh::start(&istiod_bin, &agent_bin);
    eprintln!("mesh up in {:?}", started.elapsed());
    assert_generated(&gateway_dump, &app_dump, mesh.keys.path());

    // A keyless app (the OpenAI SDK sends no key), then one with stray keys
    // of its own: each call leaves the gateway with the mesh's key alone.
    let base = "http://127.0.0.1:80/v1";
    let host = format!("host: {PROVIDER}");
    let out = support::sdk::run(
        support::sdk::OPENAI,
        "chat",
        base,
        &["--api-key", "", "--header", &host, "--prompt", "keyless"],
    )
    .await;
    let content = out["content"].as_str().unwrap_or_default();
    assert!(content.contains("keyless"), "{out}");
    let stray = format!("Bearer {STRAY_KEY}");
    let strays = [
        ("authorization", stray.as_str()),
        ("api-key", STRAY_KEY),
        ("x-api-key", STRAY_KEY),
    ];
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = call("with a stray key", &strays).await;
        seen.push(r.header("x-cache").unwrap_or("<none>").to_string());
    }
    assert_eq!(seen, ["MISS", "HIT"], "the caller's own cache entries");
    let mesh_bearer = format!("Bearer {MESH_KEY}");
    assert_eq!(mesh.keys_received(), [mesh_bearer.as_str(); 2]);
    never_saw(&mesh.provider, STRAY_KEY);

    // The caller, at the gateway, is the sidecar's SPIFFE id, and no other.
    let tokens = mesh.tokens_of(APP_ID, 3.0);
    assert!(tokens >= 3.0, "{APP_ID}: {tokens} tokens");
    let samples = mesh.gateway_metrics();
    let tenants: Vec<&str> = samples
        .iter()
        .filter(|s| s.name == "llm_filter_limits_tokens_total")
        .filter_map(|s| s.labels.get("tenant").map(String::as_str))
        .collect();
    assert!(tenants.iter().all(|t| *t == APP_ID), "{tenants:?}");

    // No way around the mTLS: a plaintext call to the gateway's port never
    // reaches its filter or the provider.
    let plain = post_json(
        &format!("http://{}:8443/v1/chat/completions", mesh.gateway_node.ip),
        &chat_body("gpt-4o-mini", "plaintext"),
        &[("host", PROVIDER)],
    )
    .await;
    assert!(plain.is_err(), "served in plaintext: {plain:?}");
    assert_eq!(chats(&mesh.provider).len(), 2);

    let calls = rotate(&mut mesh).await;
    eprintln!("the rotated key taken up after {calls} calls");

    // The file's virtual-key form: the platform issued the app a key, the
    // gateway's config holds its digest.
    let digest = hex(&Sha256::digest(VIRTUAL_KEY.as_bytes()));
    mesh.switch_tenant(&json!({"from": "virtual_key", "keys": {"payments": digest}}));
    let before = chats(&mesh.provider).len();
    let out = support::sdk::run(
        support::sdk::OPENAI,
        "chat_error",
        base,
        &["--api-key", "", "--header", &host],
    )
    .await;
    assert_eq!(out["status"], 401, "{out}");
    assert_eq!(out["code"], "invalid_api_key", "{out}");
    assert_eq!(
        chats(&mesh.provider).len(),
        before,
        "a refused call went out"
    );
    let args = [
        "--api-key",
        VIRTUAL_KEY,
        "--header",
        &host,
        "--prompt",
        "virtual",
    ];
    let out = support::sdk::run(support::sdk::OPENAI, "chat", base, &args).await;
    let content = out["content"].as_str().unwrap_or_default();
    assert!(content.contains("virtual"), "{out}");
    let rotated = format!("Bearer {ROTATED_KEY}");
    assert_eq!(mesh.keys_received().last(), Some(&rotated));
    never_saw(&mesh.provider, VIRTUAL_KEY);
    let payments = mesh.tokens_of("payments", 1.0);
    assert!(payments >= 1.0, "payments: {payments}");

    assert_no_planted_key(&mesh);
    for node in [&mesh.gateway_node, &mesh.app_node] {
        mesh.istiod
            .settled(node.proxy_id())
            .expect("no NACK after the calls");
    }
    eprintln!("keyless egress: {:?} in all", started.elapsed());
}
