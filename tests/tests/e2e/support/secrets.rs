//! Where the mesh keeps provider secrets and where they must never show:
//! SDS files a watched directory holds (written as an operator or
//! Kubernetes swaps them), and the search of every output Envoy and the
//! filter write for planted secrets.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llm_filter_e2e::{workspace_root, Envoy, EnvoyBuilder, MockUpstream};
use serde_json::{json, Value};

use super::otlp::Receiver;

/// Writes the SDS file `name.yaml` in `dir` holding the generic secret
/// `name` = `value`, atomically (a rename into the watched directory, as
/// Kubernetes' projected volumes and an operator's `mv` do).
pub fn write_secret(dir: &Path, name: &str, value: Option<&str>) {
    let body = match value {
        Some(v) => format!(
            "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: {name}\n  generic_secret:\n    secret:\n      inline_string: \"{v}\"\n"
        ),
        None => "resources: []\n".to_string(),
    };
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{name}.yaml"))).unwrap();
}

/// No header of any call `mock` received carries `stray`, in any place a
/// provider reads a key from.
pub fn never_saw(mock: &MockUpstream, stray: &str) {
    for r in mock.requests() {
        for (k, v) in &r.headers {
            assert!(!v.contains(stray), "{} got {k}: {v}", mock.name());
        }
        let q = r.query.clone().unwrap_or_default();
        assert!(!q.contains(stray), "{} got ?{q}", mock.name());
    }
}

/// The token of the filter's admin pages in these scenarios.
const ADMIN_TOKEN: &str = "admin-token-0123456789";

/// Every output of an Envoy and its filter a secret could leak to, beyond
/// Envoy's log, stats and config dump: the spans it pushes (to an OTLP
/// receiver), its access log, the filter's state page.
pub struct Outputs {
    receiver: Receiver,
    access_log: PathBuf,
}

impl Outputs {
    /// A span receiver, and an access log written in `dir`.
    pub fn start(dir: &Path) -> Self {
        Self {
            receiver: Receiver::start(&[]),
            access_log: dir.join("access.log"),
        }
    }

    /// The filter's `config` with these outputs on: spans pushed to the
    /// receiver, its record in the access log, its admin pages.
    pub fn config(&self, mut config: Value) -> Value {
        config["admin"] = json!({"token": ADMIN_TOKEN});
        config["tracing"] = json!({"otlp": {"cluster": "otel", "interval_ms": 200}});
        config["access_log"] = json!({"enabled": true});
        config
    }

    /// `envoy` with the receiver's cluster and the access log.
    pub fn envoy(&self, envoy: EnvoyBuilder) -> EnvoyBuilder {
        envoy.upstream("otel", self.receiver.port).access_log(
            &self.access_log,
            "%FILTER_STATE(wasm.llm_filter.call:PLAIN)% %REQ(:PATH)%",
        )
    }

    /// The access log's records so far.
    pub fn records(&self) -> String {
        std::fs::read_to_string(&self.access_log).unwrap_or_default()
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<Value> {
        self.receiver.spans()
    }

    /// None of `secrets` is in Envoy's log, its stats, its config dump,
    /// the filter's state page, the access log (which must have records) or
    /// the spans (which must be some).
    pub async fn assert_none_of(&self, envoy: &Envoy, secrets: &[&str]) {
        let (_, dump) = envoy.admin_get("/config_dump?include_eds").unwrap();
        let (_, stats) = envoy.admin_get("/stats").unwrap();
        let (_, prom) = envoy.admin_get("/stats/prometheus").unwrap();
        let state = reqwest::Client::new()
            .get(envoy.url("/llm-filter/state"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(state.status(), 200);
        let state = state.text().await.unwrap();
        // Spans are pushed every 200 ms; wait for some.
        let receiver = &self.receiver;
        let deadline = Instant::now() + Duration::from_secs(5);
        while receiver.spans().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let spans = serde_json::to_string(&receiver.exports()).unwrap();
        assert!(!receiver.spans().is_empty(), "spans arrived");
        let access = std::fs::read_to_string(&self.access_log).unwrap_or_default();
        assert!(!access.trim().is_empty(), "the access log has records");
        let log = envoy.log_contents();
        for secret in secrets {
            for (what, text) in [
                ("config_dump", &dump),
                ("stats", &stats),
                ("prometheus", &prom),
                ("state", &state),
                ("spans", &spans),
                ("access log", &access),
                ("envoy log", &log),
            ] {
                assert!(!text.contains(secret), "{secret} in {what}");
            }
        }
    }
}

/// The YAML block `n` (from 0) of the section of docs/credentials.md whose
/// heading starts with `heading`.
pub fn documented_yaml(heading: &str, n: usize) -> String {
    let page = std::fs::read_to_string(workspace_root().join("docs/credentials.md")).unwrap();
    let at = page
        .find(&format!("\n{heading}"))
        .unwrap_or_else(|| panic!("docs/credentials.md has a section {heading}"));
    let section = &page[at..];
    let block = section.split("```yaml\n").nth(n + 1).unwrap();
    block.split("```").next().unwrap().to_string()
}

/// The `typed_extension_protocol_options` of the first cluster in the
/// first YAML block of the section `heading` of docs/credentials.md, at
/// column 0, with the secret files in `dir` instead of the page's
/// `/etc/llm-keys`.
pub fn documented_options(heading: &str, dir: &Path) -> String {
    let cluster = documented_yaml(heading, 0);
    let options: Vec<&str> = cluster
        .lines()
        .skip_while(|l| l.trim() != "typed_extension_protocol_options:")
        .take_while(|l| !l.starts_with("- "))
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect();
    assert!(options.len() > 10, "{cluster}");
    let options = options.join("\n") + "\n";
    assert!(options.contains("/etc/llm-keys/"), "{options}");
    options.replace("/etc/llm-keys", &dir.display().to_string())
}
