//! A sidecar as a pod runs it: Istio's agent (`pilot-agent proxy sidecar`,
//! built from the same source as istiod) writes the bootstrap, starts Envoy,
//! proxies its xDS to istiod and serves its SDS. The shipped manifests as a
//! user fills them: envoyfilter-ecds.yaml's `oci://REGISTRY/llm-filter:0.1.0`
//! (and wasmplugin.yaml's `…:0.1.0-sidecar`) on a private registry on
//! loopback holding the two images `make image` built, `IMAGE_SHA256` each
//! one's manifest digest; provider.yaml's DestinationRule as
//! shipped (TLS origination, the provider's name checked) with the test CA as
//! its `caCertificates`, in front of a mock provider behind TLS. No CA: mTLS
//! is off in the test mesh and the agent serves files only
//! (`FILE_MOUNTED_CERTS`).

use std::path::Path;
use std::time::{Duration, Instant};

use llm_filter_e2e::istio::{read_manifests, EXAMPLES};
use llm_filter_e2e::istiod::{agent_bootstrap, synced, Istiod, Node, PortLock};
use llm_filter_e2e::pilot_agent::{agent_bin, PilotAgent, WASM_DATA_DIR};
use llm_filter_e2e::registry::{image_archive, registry_tools, sidecar_image_archive, Registry};
use llm_filter_e2e::tls::{TestCa, TlsFront};
use llm_filter_e2e::{
    chat_body, post_json, running_in_ci, sidecar_wasm_path, wasm_path, workspace_root, MockConfig,
    MockUpstream,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{
    assert_before_the_router, cacheable, calls_through, chats, filter_chain, hex, mesh, section,
    skip_without_istiod, yaml_docs, GATEWAY, PROVIDER, PROVIDER_CLUSTER, SIDECAR,
    WASMPLUGIN_SIDECAR,
};

/// What the test needs besides istiod: the agent, the image and the registry
/// tools; `None` (skip) outside `make test` and CI, a failure under CI.
fn prerequisites(test: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let istiod = skip_without_istiod(test)?;
    let agent = agent_bin(test)?;
    let built = image_archive().and(sidecar_image_archive());
    let missing = match (built, registry_tools()) {
        (Some(_), Ok(())) => None,
        (None, _) => Some("no images (make image)".to_string()),
        (_, Err(e)) => Some(e),
    };
    if let Some(why) = missing {
        assert!(!running_in_ci(), "{test}: {why}");
        eprintln!("SKIP {test}: {why}");
        return None;
    }
    Some((istiod, agent))
}

/// The shipped manifest `file` with its placeholders filled as a user would:
/// each image it names on `images`' registry with that image's digest (or
/// `sha256`, when a test says so); the provider at `front` on loopback, its
/// certificate checked against `ca` (as shipped, against the proxy's system
/// bundle, when `None`).
fn filled(
    file: &str,
    images: &Images,
    sha256: Option<&str>,
    front: u16,
    ca: Option<&Path>,
) -> String {
    let fill = |url: &mut Value, sha: &mut Value, what: &Value| {
        assert_eq!(*sha, "IMAGE_SHA256", "{file}: {what}");
        let name = url
            .as_str()
            .and_then(|u| u.strip_prefix("oci://REGISTRY/"))
            .unwrap_or_else(|| panic!("{file}: {what}"));
        let digest = images
            .digest(name)
            .unwrap_or_else(|| panic!("{file}: {what}"));
        *url = json!(format!("oci://{}/{name}", images.host));
        *sha = json!(sha256.unwrap_or(digest));
    };
    let path = workspace_root().join(EXAMPLES).join(file);
    let docs: Vec<Value> = read_manifests(&path)
        .unwrap_or_else(|e| panic!("{file}: {e:#}"))
        .into_iter()
        .map(|mut doc| {
            for patch in doc
                .pointer_mut("/spec/configPatches")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(remote) =
                    patch.pointer_mut("/patch/value/typed_config/config/vm_config/code/remote")
                {
                    let what = remote.clone();
                    let mut url = remote["http_uri"]["uri"].take();
                    let mut sha = remote["sha256"].take();
                    fill(&mut url, &mut sha, &what);
                    remote["http_uri"]["uri"] = url;
                    remote["sha256"] = sha;
                }
            }
            match doc["kind"].as_str() {
                Some("WasmPlugin") => {
                    let spec = &mut doc["spec"];
                    let what = spec.clone();
                    let mut url = spec["url"].take();
                    let mut sha = spec["sha256"].take();
                    fill(&mut url, &mut sha, &what);
                    spec["url"] = url;
                    spec["sha256"] = sha;
                }
                Some("ServiceEntry") if file == "provider.yaml" => {
                    doc["spec"]["resolution"] = json!("STATIC");
                    doc["spec"]["endpoints"] =
                        json!([{"address": "127.0.0.1", "ports": {"http": front}}]);
                }
                Some("DestinationRule") if file == "provider.yaml" => {
                    let tls = doc
                        .pointer_mut("/spec/trafficPolicy/portLevelSettings/0/tls")
                        .expect("provider.yaml's TLS origination");
                    assert_eq!(tls["mode"], "SIMPLE", "{tls}");
                    if let Some(ca) = ca {
                        tls["caCertificates"] = json!(ca);
                    }
                }
                _ => {}
            }
            doc
        })
        .collect();
    yaml_docs(&docs)
}

/// mTLS off: no workload certificates without a CA.
fn no_mtls() -> String {
    yaml_docs(&[
        json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "istio-system"},
        "spec": {"mtls": {"mode": "DISABLE"}}}),
    ])
}

/// The ECDS resource `name` as Envoy holds it, once it is there.
pub(super) fn wait_ecds(
    agent: &PilotAgent,
    name: &str,
    istiod: &Istiod,
    node: &Node,
) -> (Value, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dump = agent.config_dump().expect("config_dump");
        let ecds = dump["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["ecds_filters"].as_array())
            .flatten()
            .map(|e| &e["ecds_filter"])
            .find(|e| e["name"] == name)
            .cloned();
        let sync = istiod
            .debug("/debug/syncz")
            .and_then(|s| synced(&s, node.proxy_id()));
        if let (Some(ecds), Ok(())) = (ecds.clone(), &sync) {
            return (dump, ecds);
        }
        assert!(
            Instant::now() < deadline,
            "no ECDS {name} or not synced in 30 s: {sync:?} {ecds:?}\n{}\n--- istiod ---\n{}",
            agent.log_tail(30),
            istiod.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The mesh's config for the sidecar: provider.yaml (TLS origination to the
/// front, checked against `ca`), envoyfilter-ecds.yaml (the full build's
/// image on `images`' registry), routes.yaml, mTLS off.
///
/// For the WasmPlugin form: provider.yaml and wasmplugin.yaml (the sidecar
/// build's image), mTLS off.
///
/// For the egress gateway: provider.yaml and egress-gateway.yaml, mTLS off,
/// the service that selects the gateway and its workload (istiod.rs's
/// overlay; its module server's entry goes unused).
fn config(
    images: &Images,
    sha256: Option<&str>,
    front: u16,
    ca: Option<&Path>,
    form: Form,
) -> Vec<(String, String)> {
    let files: &[&str] = match form {
        Form::Gateway => &["provider.yaml", "egress-gateway.yaml"],
        Form::Sidecar => &["provider.yaml", "envoyfilter-ecds.yaml", "routes.yaml"],
        Form::WasmPlugin => &["provider.yaml", "wasmplugin.yaml"],
    };
    let mut config: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.to_string(), filled(f, images, sha256, front, ca)))
        .collect();
    let test_mesh = if form == Form::Gateway {
        super::overlay(1, true)
    } else {
        no_mtls()
    };
    config.push(("test-mesh.yaml".into(), test_mesh));
    config
}

/// The images' names and tags as the manifests name them: the full build's
/// (envoyfilter-ecds.yaml, the gateways) and the sidecar build's
/// (wasmplugin.yaml).
const IMAGE: &str = "llm-filter:0.1.0";
const SIDECAR_IMAGE: &str = "llm-filter:0.1.0-sidecar";

/// Both images pushed to a registry: its host and each one's manifest digest.
struct Images {
    host: String,
    full: String,
    sidecar: String,
}

impl Images {
    /// The digest of the image a manifest names `name`; `None` for an image
    /// `make image` does not build.
    fn digest(&self, name: &str) -> Option<&str> {
        match name {
            IMAGE => Some(&self.full),
            SIDECAR_IMAGE => Some(&self.sidecar),
            _ => None,
        }
    }
}

/// A mesh of one sidecar run by the agent: the image on a registry of its
/// own, the provider behind TLS with a CA of its own, istiod with [`config`].
struct AgentMesh {
    agent: PilotAgent,
    istiod: Istiod,
    node: Node,
    provider: MockUpstream,
    front: TlsFront,
    registry: Registry,
    /// The registry's requests before the agent started (the push's).
    pushed: usize,
    /// The manifest digest of the image the form's manifests name.
    digest: String,
    /// When the agent was started.
    agent_started: Instant,
    ca_path: std::path::PathBuf,
    _certs: tempfile::TempDir,
}

/// How a test fills the manifests; the default is as the docs say.
#[derive(Default)]
struct Setup {
    /// `IMAGE_SHA256` when not the image's manifest digest.
    sha256: Option<String>,
    /// provider.yaml's DestinationRule without the test CA as its
    /// `caCertificates`, exactly as shipped.
    system_bundle: bool,
    /// Which manifests load the filter, and into which node.
    form: Form,
}

/// The shipped manifests a test loads the filter with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Form {
    /// envoyfilter-ecds.yaml (and routes.yaml) on the sidecar.
    #[default]
    Sidecar,
    /// wasmplugin.yaml on the sidecar, translated by istiod.
    WasmPlugin,
    /// egress-gateway.yaml on the egress gateway.
    Gateway,
}

impl Form {
    /// The module the form's manifests name: the sidecar build for
    /// wasmplugin.yaml, the full build for the others.
    fn module(self) -> std::path::PathBuf {
        match self {
            Form::WasmPlugin => sidecar_wasm_path(),
            Form::Sidecar | Form::Gateway => wasm_path(),
        }
    }

    /// The tag of that module's image.
    fn tag(self) -> &'static str {
        match self {
            Form::WasmPlugin => SIDECAR_IMAGE,
            Form::Sidecar | Form::Gateway => IMAGE,
        }
        .trim_start_matches("llm-filter:")
    }

    /// The filter's ECDS resource on the node.
    fn filter(self) -> &'static str {
        match self {
            Form::Sidecar => SIDECAR.filter,
            Form::WasmPlugin => WASMPLUGIN_SIDECAR.filter,
            Form::Gateway => GATEWAY.filter,
        }
    }
}

/// The local file the agent handed Envoy for the module in `ecds`: in its
/// cache, named by the image's manifest `digest`, holding the bytes of the
/// form's module (plugin.wasm of the image).
fn assert_agent_module_file(ecds: &Value, digest: &str, form: Form) {
    let file = ecds["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"]
        .as_str()
        .unwrap_or_else(|| panic!("no local file: {ecds}"));
    eprintln!("module file: {file}");
    assert!(
        file.starts_with(&format!("{WASM_DATA_DIR}/"))
            && file.ends_with(&format!("/{digest}.wasm")),
        "{file}"
    );
    let bytes = std::fs::read(file).expect("the agent's module file");
    let module = std::fs::read(form.module()).expect("the module");
    assert_eq!(
        hex(&Sha256::digest(&bytes)),
        hex(&Sha256::digest(&module)),
        "plugin.wasm of the image is the module"
    );
}

/// Whether the registry's access log `requests` has a 200 for the image's
/// `what` (`manifests/<tag>`, `blobs/sha256:`).
fn served(requests: &[String], what: &str) -> bool {
    requests
        .iter()
        .any(|r| r.starts_with(&format!("GET /v2/llm-filter/{what}")) && r.contains("\" 200 "))
}

/// [`AgentMesh`] as `setup` says, once the agent's Envoy is ready.
fn start_mesh(istiod_bin: &Path, agent_bin: &Path, setup: Setup) -> AgentMesh {
    let registry = Registry::start().expect("registry");
    let mut digests = [IMAGE, SIDECAR_IMAGE].map(|name| {
        let (archive, digest) = if name == IMAGE {
            image_archive()
        } else {
            sidecar_image_archive()
        }
        .expect("the image");
        registry.push(&archive, name).expect("push the image");
        digest
    });
    let images = Images {
        host: registry.host(),
        sidecar: std::mem::take(&mut digests[1]),
        full: std::mem::take(&mut digests[0]),
    };
    let digest = images
        .digest(&format!("llm-filter:{}", setup.form.tag()))
        .expect("the form's image")
        .to_string();
    let pushed = registry.requests().len();

    let certs = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new("llm-filter e2e provider CA").expect("CA");
    let ca_path = ca.write(certs.path()).expect("write the CA");
    let provider = MockUpstream::start(MockConfig::named("provider"));
    let front =
        TlsFront::start(&ca.issue(&[PROVIDER]).expect("cert"), provider.addr()).expect("TLS front");
    let ca = (!setup.system_bundle).then_some(&*ca_path);
    let istiod = Istiod::start(
        istiod_bin,
        &config(
            &images,
            setup.sha256.as_deref(),
            front.port(),
            ca,
            setup.form,
        ),
        &mesh(),
    )
    .expect("istiod");

    let node = if setup.form == Form::Gateway {
        Node::egress_gateway()
    } else {
        Node::sidecar()
    };
    let agent_started = Instant::now();
    let agent = PilotAgent::start(
        agent_bin,
        &node,
        istiod.grpc_port(),
        &mesh(),
        &[("WASM_INSECURE_REGISTRIES", registry.host())],
    )
    .unwrap_or_else(|e| panic!("{e:#}\n--- istiod ---\n{}", istiod.log_tail(20)));
    AgentMesh {
        agent,
        istiod,
        node,
        provider,
        front,
        registry,
        pushed,
        digest,
        agent_started,
        ca_path,
        _certs: certs,
    }
}

/// The agent pulls the image for the sidecar: the ECDS resource Envoy holds
/// names a file of the agent's Wasm cache (the module's bytes), not the
/// `oci://` URL; the registry served the manifest and the layer; istiod sees
/// every type ACKed; calls through the sidecar are the filter's (a cached
/// HIT, a routed call, an SSE stream) and reach the provider over TLS that
/// the sidecar originates with the agent's SDS; and the bootstrap the agent
/// wrote has the `stats_config` tests/istio-bootstrap gives the other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_and_the_agent_run_the_sidecar_from_the_image() {
    let test = "istiod_and_the_agent_run_the_sidecar_from_the_image";
    let Some((istiod_bin, agent_bin)) = prerequisites(test) else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let started = Instant::now();
    let AgentMesh {
        agent,
        istiod,
        node,
        provider,
        front,
        registry,
        pushed,
        digest,
        agent_started,
        ca_path,
        _certs,
    } = start_mesh(&istiod_bin, &agent_bin, Setup::default());
    let (dump, ecds) = wait_ecds(&agent, SIDECAR.filter, &istiod, &node);
    eprintln!(
        "the module loaded {:?} after the agent's start ({:?} with the registry and istiod)",
        agent_started.elapsed(),
        started.elapsed()
    );

    // The node the agent announced: the id the other tests give their node.
    let bootstrap = agent.bootstrap().expect("the agent's bootstrap");
    assert_eq!(bootstrap["node"]["id"], node.id.as_str());
    assert_eq!(bootstrap["node"]["metadata"]["LABELS"], node.labels);

    // The module: a file of the agent's cache, named by the manifest digest,
    // holding the module's bytes; the rest of the resource as istiod sent it.
    let config = &ecds["typed_config"]["config"];
    let code = &config["vm_config"]["code"];
    assert!(code.get("remote").is_none(), "still remote: {code}");
    assert_agent_module_file(&ecds, &digest, Form::Sidecar);
    assert_eq!(config["fail_open"], true, "{config}");
    assert_eq!(config["allow_on_headers_stop_iteration"], true, "{config}");
    assert!(
        agent.stat("wasm.envoy.wasm.runtime.v8.active") > 0,
        "the module runs"
    );
    let (chain, at) = filter_chain(&dump, &SIDECAR);
    assert_eq!(
        chain.get(at + 1).map(String::as_str),
        Some("envoy.filters.http.router"),
        "{}: {chain:?}",
        SIDECAR.listener
    );

    // The registry served the manifest by tag and its layer, to the agent.
    let pulled: Vec<String> = registry.requests().split_off(pushed);
    assert!(
        served(&pulled, "manifests/0.1.0") && served(&pulled, "blobs/sha256:"),
        "{pulled:#?}"
    );

    // TLS origination as provider.yaml ships it, the CA file served by the
    // agent's SDS.
    let cluster = section(&dump, "ClustersConfigDump")["dynamic_active_clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| &c["cluster"])
        .find(|c| c["name"] == PROVIDER_CLUSTER)
        .expect("the provider's cluster")
        .clone();
    let tls = cluster.to_string();
    eprintln!(
        "provider cluster transport socket: {}",
        cluster["transport_socket"]
    );
    assert!(tls.contains(r#""sni":"api.openai.com""#), "{tls}");
    assert!(
        tls.contains(&format!("file-root:{}", ca_path.display())),
        "{tls}"
    );

    let url = SIDECAR.chat_url();
    calls_through(&url, &provider, "agent's sidecar", true).await;
    assert!(front.handshakes() >= 1, "no TLS to the provider");
    assert_eq!(front.failed_handshakes(), 0);
    let got = chats(&provider).pop().expect("a call");
    assert_eq!(got.header("host"), Some(PROVIDER), "{got:?}");
    // What Envoy got from the agent's SDS: the CA file, and no workload
    // certificate (with mTLS off nothing asks for one, so no CA is needed).
    let (status, certs) = agent.admin_get("/certs").expect("/certs");
    assert_eq!(status, 200, "{certs}");
    let certs: Value = serde_json::from_str(&certs).expect("/certs JSON");
    let all = certs["certificates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        all.iter()
            .any(|c| c["ca_cert"].as_array().is_some_and(|a| !a.is_empty())),
        "{certs}"
    );
    assert!(
        all.iter()
            .all(|c| c["cert_chain"].as_array().is_none_or(Vec::is_empty)),
        "a workload certificate: {certs}"
    );

    // The bootstrap the agent wrote: the stats config the other tests take
    // from tests/istio-bootstrap for the same mesh and node.
    let expected = agent_bootstrap(&mesh(), &node).expect("istio-bootstrap");
    let tags = |b: &Value| -> Vec<String> {
        b["stats_config"]["stats_tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["tag_name"].as_str().map(str::to_string))
            .collect()
    };
    eprintln!("stats_tags the agent wrote: {:?}", tags(&bootstrap));
    assert_eq!(
        bootstrap["stats_config"], expected["stats_config"],
        "the agent's stats_config differs from istio-bootstrap's"
    );

    istiod
        .settled(node.proxy_id())
        .expect("no NACK after the calls");
}

/// A module the agent cannot pull fails open as the manifests say, in both
/// forms: with `IMAGE_SHA256` the module's own sha256 (not the manifest's, a
/// slip the docs warn of) the agent refuses the image and hands Envoy an
/// allow-all RBAC filter under the filter's name instead, which the HTTP
/// filter's `type_urls` accept (the EnvoyFilter's as shipped, the ones istiod
/// writes for a WasmPlugin): no NACK, no Wasm VM, every call passes untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_the_agent_refuses_leaves_calls_untouched() {
    let test = "an_image_the_agent_refuses_leaves_calls_untouched";
    let Some((istiod_bin, agent_bin)) = prerequisites(test) else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    for form in [Form::Sidecar, Form::WasmPlugin] {
        let module = std::fs::read(form.module()).expect("the module");
        let wrong = hex(&Sha256::digest(&module));
        let AgentMesh {
            agent,
            istiod,
            node,
            provider,
            // Held to the end, as the others.
            front: _front,
            registry: _registry,
            _certs,
            ..
        } = start_mesh(
            &istiod_bin,
            &agent_bin,
            Setup {
                sha256: Some(wrong.clone()),
                form,
                ..Setup::default()
            },
        );
        let (_, ecds) = wait_ecds(&agent, form.filter(), &istiod, &node);
        assert_eq!(
            ecds["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
            "{form:?}: {ecds}"
        );
        let refused = agent
            .log()
            .lines()
            .find(|l| l.contains("applying allow RBAC filter"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{form:?}: {}", agent.log_tail(30)));
        eprintln!("{form:?}, the agent: {refused}");
        assert!(refused.contains(&wrong), "{refused}");
        assert_eq!(agent.stat("wasm.envoy.wasm.runtime.v8.active"), 0);

        let url = SIDECAR.chat_url();
        let body = cacheable("gpt-4o-mini", "no filter here");
        for _ in 0..2 {
            let r = post_json(
                &url,
                &body,
                &[("host", PROVIDER), ("x-request-priority", "P0")],
            )
            .await
            .expect("call");
            assert_eq!(r.status, 200, "{form:?}: {}", r.text());
            assert_eq!(r.header("x-cache"), None, "{form:?}: the filter answered");
        }
        let got = chats(&provider);
        assert_eq!(got.len(), 2, "{form:?}: both calls reached the provider");
        assert!(
            got.iter().all(|c| c.header("baggage").is_none()),
            "{form:?}: tagged without the filter"
        );
        istiod.settled(node.proxy_id()).expect("no NACK");
    }
}

/// wasmplugin.yaml as a cluster runs it: istiod translates the WasmPlugin,
/// the agent pulls its `oci://` image (the sidecar build's, its own tag)
/// and hands Envoy that module from its cache; the resource keeps
/// `failStrategy` and has no body access, so calls get the header features
/// (the caller's priority in baggage, no cache) and reach the provider over
/// the TLS provider.yaml originates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_and_the_agent_run_the_wasmplugin_from_the_image() {
    let test = "istiod_and_the_agent_run_the_wasmplugin_from_the_image";
    let Some((istiod_bin, agent_bin)) = prerequisites(test) else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let AgentMesh {
        agent,
        istiod,
        node,
        provider,
        front,
        registry,
        pushed,
        digest,
        _certs,
        ..
    } = start_mesh(
        &istiod_bin,
        &agent_bin,
        Setup {
            form: Form::WasmPlugin,
            ..Setup::default()
        },
    );
    let (dump, ecds) = wait_ecds(&agent, WASMPLUGIN_SIDECAR.filter, &istiod, &node);
    assert_agent_module_file(&ecds, &digest, Form::WasmPlugin);
    let wasm = &ecds["typed_config"]["config"];
    assert_eq!(wasm["failure_policy"], "FAIL_OPEN", "failStrategy: {wasm}");
    assert!(
        wasm.get("allow_on_headers_stop_iteration").is_none(),
        "{wasm}"
    );
    assert!(agent.stat("wasm.envoy.wasm.runtime.v8.active") > 0);
    assert_before_the_router(&dump, &WASMPLUGIN_SIDECAR);
    let pulled: Vec<String> = registry.requests().split_off(pushed);
    assert!(
        served(&pulled, "manifests/0.1.0-sidecar") && served(&pulled, "blobs/sha256:"),
        "{pulled:#?}"
    );

    let url = WASMPLUGIN_SIDECAR.chat_url();
    let headers = [("host", PROVIDER), ("x-request-priority", "P0")];
    let body = cacheable("gpt-4o-mini", "the WasmPlugin from the image");
    for _ in 0..2 {
        let r = post_json(&url, &body, &headers).await.expect("call");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.header("x-cache"),
            None,
            "the sidecar build keeps no cache"
        );
    }
    let got = chats(&provider);
    assert_eq!(got.len(), 2, "both calls reached the provider");
    for call in &got {
        assert_eq!(call.header("host"), Some(PROVIDER), "{call:?}");
        assert!(
            call.header("baggage")
                .is_some_and(|b| b.contains("priority=P0")),
            "{:?}",
            call.headers
        );
    }
    assert!(front.handshakes() >= 1, "no TLS to the provider");
    istiod
        .settled(node.proxy_id())
        .expect("no NACK after the calls");
}

/// provider.yaml's DestinationRule exactly as shipped (no `caCertificates`):
/// the sidecar checks the provider against the proxy's system CA bundle,
/// which the agent serves by SDS (`file-root:system`); a provider whose
/// certificate only the test CA vouches for is refused before any byte of
/// the call leaves the sidecar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_destination_rule_checks_the_provider_against_the_system_bundle() {
    let test = "the_shipped_destination_rule_checks_the_provider_against_the_system_bundle";
    let Some((istiod_bin, agent_bin)) = prerequisites(test) else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let AgentMesh {
        agent,
        istiod,
        node,
        provider,
        front,
        registry: _registry,
        _certs,
        ..
    } = start_mesh(
        &istiod_bin,
        &agent_bin,
        Setup {
            system_bundle: true,
            ..Setup::default()
        },
    );
    let (dump, _) = wait_ecds(&agent, SIDECAR.filter, &istiod, &node);
    let cluster = section(&dump, "ClustersConfigDump")["dynamic_active_clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| &c["cluster"])
        .find(|c| c["name"] == PROVIDER_CLUSTER)
        .expect("the provider's cluster")
        .to_string();
    assert!(
        cluster.contains(r#""name":"file-root:system""#),
        "{cluster}"
    );

    let url = SIDECAR.chat_url();
    let r = post_json(
        &url,
        &chat_body("gpt-4o-mini", "to an untrusted provider"),
        &[("host", PROVIDER)],
    )
    .await
    .expect("call");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(provider.request_count(), 0, "{:?}", provider.requests());
    assert_eq!(front.handshakes(), 0, "a handshake completed");
    assert!(front.failed_handshakes() >= 1, "the sidecar never tried");
    istiod.settled(node.proxy_id()).expect("no NACK");
}

/// The egress gateway as Istio's agent runs it (`pilot-agent proxy router`,
/// egress-gateway.yaml): the agent pulls the same image for it, and calls
/// through the gateway are the filter's and reach the provider over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_and_the_agent_run_the_egress_gateway_from_the_image() {
    let test = "istiod_and_the_agent_run_the_egress_gateway_from_the_image";
    let Some((istiod_bin, agent_bin)) = prerequisites(test) else {
        return;
    };
    let _ports = PortLock::acquire().expect("port lock");
    let AgentMesh {
        agent,
        istiod,
        node,
        provider,
        front,
        registry: _registry,
        digest,
        _certs,
        ..
    } = start_mesh(
        &istiod_bin,
        &agent_bin,
        Setup {
            form: Form::Gateway,
            ..Setup::default()
        },
    );
    let (dump, ecds) = wait_ecds(&agent, GATEWAY.filter, &istiod, &node);
    assert_agent_module_file(&ecds, &digest, Form::Gateway);
    filter_chain(&dump, &GATEWAY);
    let url = GATEWAY.chat_url();
    calls_through(&url, &provider, "agent's gateway", true).await;
    assert!(front.handshakes() >= 1, "no TLS to the provider");
    istiod
        .settled(node.proxy_id())
        .expect("no NACK after the calls");
}
