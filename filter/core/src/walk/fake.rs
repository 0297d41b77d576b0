//! A host standing in for Envoy in scenario tests of the walk.

use std::collections::BTreeMap;

use super::{Call, CalloutAnswer, Env, Host, Step};
use crate::config::Config;
use crate::degrade::alerts;
use crate::host::{MemoryMetrics, MemoryStore, SplitMix64};
use crate::keyspace;
use crate::metrics::BoundedLabel;
use crate::spans;
use crate::walk::CallWait;

/// What the fake proxy holds and what the walk did to it.
#[derive(Debug, Default, Clone)]
pub struct FakeHost {
    pub request_headers: Vec<(String, String)>,
    pub request_body: Vec<u8>,
    pub response_headers: Vec<(String, String)>,
    pub response_body: Vec<u8>,
    pub code_details: Option<String>,
    pub local_reply: Option<(u32, BTreeMap<String, String>, Vec<u8>)>,
    /// Local replies sent (the last is `local_reply`).
    pub replies: u32,
    pub route_cache_cleared: u32,
    /// Callouts sent.
    pub callouts: Vec<Callout>,
    /// What the walk does with each callout's answer, in the order sent.
    pub waits: Vec<CallWait>,
    /// The host refuses to send callouts.
    pub refuse_callouts: bool,
    /// Times the request body was replaced.
    pub body_writes: u32,
    /// Times the request body was read.
    pub body_reads: std::cell::Cell<u32>,
    /// The request headers read, by name, in order.
    pub header_reads: std::cell::RefCell<Vec<String>>,
    /// Properties set, last value by path.
    pub properties: BTreeMap<String, Vec<u8>>,
    /// The response stream was reset.
    pub reset: bool,
}

/// A callout sent: cluster, headers, body, timeout.
pub type Callout = (String, Vec<(String, String)>, Vec<u8>, u64);

impl Call {
    /// Hands `answer` to the call as the answer of the last callout it sent
    /// through `host`, with the continuation it registered, as the plugin
    /// does with the one its registry holds under the callout's token.
    pub fn answer_callout(
        &mut self,
        env: &mut Env<'_>,
        host: &mut FakeHost,
        answer: CalloutAnswer,
    ) -> Step {
        let then = *host.waits.last().expect("a callout was sent");
        self.on_callout_response(env, host, then, answer)
    }
}

impl FakeHost {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn post(path: &str) -> Self {
        Self::new()
            .with_header(":method", "POST")
            .with_header(":path", path)
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.request_headers
            .push((name.to_string(), value.to_string()));
        self
    }

    pub fn with_body(mut self, body: &str) -> Self {
        self.request_body = body.as_bytes().to_vec();
        let len = self.request_body.len().to_string();
        self.with_header("content-length", &len)
    }

    pub fn with_response(mut self, status: u16, content_type: &str, body: &str) -> Self {
        self.response_headers = vec![
            (":status".to_string(), status.to_string()),
            ("content-type".to_string(), content_type.to_string()),
        ];
        self.response_body = body.as_bytes().to_vec();
        self
    }

    pub fn with_response_header(mut self, name: &str, value: &str) -> Self {
        self.response_headers
            .push((name.to_string(), value.to_string()));
        self
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.request_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn response(&self, name: &str) -> Option<&str> {
        self.response_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn get(map: &[(String, String)], name: &str) -> Option<String> {
    map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn set(map: &mut Vec<(String, String)>, name: &str, value: Option<&str>) {
    map.retain(|(k, _)| k != name);
    if let Some(v) = value {
        map.push((name.to_string(), v.to_string()));
    }
}

impl Host for FakeHost {
    fn request_header(&self, name: &str) -> Option<String> {
        self.header_reads.borrow_mut().push(name.to_string());
        get(&self.request_headers, name)
    }
    fn request_header_all(&self, name: &str) -> Vec<String> {
        self.request_headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }
    fn set_request_header(&mut self, name: &str, value: Option<&str>) -> bool {
        set(&mut self.request_headers, name, value);
        true
    }
    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        self.body_reads.set(self.body_reads.get() + 1);
        Some(self.request_body[..size.min(self.request_body.len())].to_vec())
    }
    fn set_request_body(&mut self, _size: usize, body: &[u8]) -> bool {
        self.request_body = body.to_vec();
        self.body_writes += 1;
        true
    }
    fn response_header(&self, name: &str) -> Option<String> {
        get(&self.response_headers, name)
    }
    fn set_response_header(&mut self, name: &str, value: Option<&str>) -> bool {
        set(&mut self.response_headers, name, value);
        true
    }
    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        Some(self.response_body[..size.min(self.response_body.len())].to_vec())
    }
    fn set_response_body(&mut self, _size: usize, body: &[u8]) -> bool {
        self.response_body = body.to_vec();
        true
    }
    #[cfg(feature = "guardrails")]
    fn reset_response(&mut self) -> bool {
        self.reset = true;
        true
    }
    fn response_code_details(&self) -> Option<String> {
        self.code_details.clone()
    }
    fn send_local_reply(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> bool {
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.local_reply = Some((status, headers, body.to_vec()));
        self.replies += 1;
        true
    }
    fn set_property(&mut self, path: &str, value: &[u8]) -> bool {
        self.properties.insert(path.to_string(), value.to_vec());
        true
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.properties.get(&path.join(".")).cloned()
    }
    fn clear_route_cache(&mut self) -> bool {
        self.route_cache_cleared += 1;
        true
    }
    fn request_headers(&self) -> Vec<(String, String)> {
        self.request_headers.clone()
    }
    fn dispatch_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
        then: CallWait,
    ) -> bool {
        if self.refuse_callouts {
            return false;
        }
        self.waits.push(then);
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.callouts
            .push((cluster.to_string(), headers, body.to_vec(), timeout_ms));
        true
    }
}

/// The admin endpoints' token: the webhook a test's alerts come by.
pub const ADMIN_SECTION: &str = r#""admin":{"token":"0123456789abcdef"}"#;

/// `config` with `section` (`"name":{..}`) first in it when the build has
/// its feature (`has`), as the full build's tests configure it; the sidecar
/// build refuses the section (`build`), so its tests go without.
pub fn with_section(has: bool, section: &str, config: &str) -> String {
    let rest = config.trim_start().strip_prefix('{');
    match (has, rest) {
        (false, _) => config.to_string(),
        (true, Some(rest)) if rest.trim_start().starts_with('}') => format!("{{{section}{rest}"),
        (true, Some(rest)) => format!("{{{section},{rest}"),
        (true, None) => panic!("not a JSON object: {config}"),
    }
}

/// `config` (whose `degrade` section comes first) with the way its alerts
/// arrive: the admin endpoints' webhook in a build with them, else a pull of
/// Alertmanager's API, as the sidecar build takes them.
pub fn with_alerts(config: &str) -> String {
    match crate::build::ADMIN {
        true => with_section(true, ADMIN_SECTION, config),
        false => config.replacen(
            r#""degrade":{"#,
            r#""degrade":{"alertmanager":{"cluster":"am"},"#,
            1,
        ),
    }
}

/// Fires the alerts of Alertmanager's webhook body `hook` the way
/// [`with_alerts`] said they arrive.
pub fn fire(w: &World, hook: &str) {
    let reports = alerts::parse(hook.as_bytes(), w.now_ms).unwrap();
    let apply = match crate::build::ADMIN {
        true => alerts::apply,
        false => alerts::apply_pulled,
    };
    apply(&w.store, &w.config.degrade, &reports, w.now_ms).unwrap();
}

/// The worker state a call walks against: config, in-memory shared data,
/// recorded metrics, seeded randomness and a clock set by the test.
pub struct World {
    pub config: Config,
    pub store: MemoryStore,
    pub metrics: MemoryMetrics,
    pub rng: SplitMix64,
    pub models: BoundedLabel,
    pub tenants: BoundedLabel,
    pub spans: spans::Queue,
    pub load: crate::load::Pending,
    pub now_ms: u64,
}

impl World {
    pub fn new(config: &str) -> Self {
        let config = Config::parse(config.as_bytes()).unwrap();
        Self {
            models: BoundedLabel::new(10).knowing(&config.names),
            config,
            store: MemoryStore::checked(keyspace::is_named),
            metrics: MemoryMetrics::default(),
            rng: SplitMix64::new(42),
            tenants: BoundedLabel::new(10),
            spans: spans::Queue::default(),
            load: crate::load::Pending::default(),
            now_ms: 1_000_000,
        }
    }

    pub fn env(&mut self) -> Env<'_> {
        Env {
            config: &self.config,
            store: &self.store,
            metrics: &mut self.metrics,
            rng: &mut self.rng,
            model_labels: &mut self.models,
            tenant_labels: &mut self.tenants,
            spans: &mut self.spans,
            load: &mut self.load,
            now_ms: self.now_ms,
            can_hold_body: true,
        }
    }

    pub fn counter(&self, name: &str) -> u64 {
        self.metrics.counters.get(name).copied().unwrap_or(0)
    }
}

/// Every scenario's shared data is in families the key registry names: a
/// key written outside them is one nobody bounds or counts.
impl Drop for World {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let unnamed = self.store.unnamed();
            assert!(
                unnamed.is_empty(),
                "keys of no registered family: {unnamed:?}"
            );
        }
    }
}
