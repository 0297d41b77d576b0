//! The root context: loads and compiles the configuration once per VM, hands
//! every HTTP context the shared state of this worker, and runs the timer that
//! wakes parked calls, sends the routing probes and the degrade sources'
//! pulls, and counts the filter's shared data.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use llm_filter_core::cache::semantic::config::SemanticConfig;
use llm_filter_core::cache::semantic::Index;
use llm_filter_core::cache::{CacheConfig, Store, PREPARE_MAX_SLOTS};
use llm_filter_core::config::Config;
use llm_filter_core::degrade::sources::{Pull, Puller, MAX_ANSWER_BYTES};
use llm_filter_core::host::footprint::{Census, KEYS_PER_STEP};
use llm_filter_core::host::{Random, SplitMix64};
use llm_filter_core::metrics::BoundedLabel;
use llm_filter_core::routing::probe::{Probe, ProbeEnd, Prober, MAX_METRICS_BYTES};
use llm_filter_core::walk::Wake;
use llm_filter_core::{degrade, keyspace, load};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, MapType};

use crate::adapter::{self, now_ms, EnvoyMetrics, EnvoyStore};
use crate::hostcall;
use crate::http::{deliver_callout, Http, Stream};
use crate::worker::{with_env, ParkedCall, Worker};

/// Distinct model names one worker turns into stat labels before using
/// `other`, besides the models the configuration names (always their own).
const MAX_MODEL_LABELS: usize = 100;
/// How often the load gauges are set from shared data.
const LOAD_GAUGES_EVERY_MS: u64 = 1000;
/// Timer period: how often parked calls are looked at and probes considered.
const TICK: Duration = Duration::from_millis(25);

/// The root context of one VM.
#[derive(Default)]
pub struct Root {
    worker: Option<Rc<Worker>>,
    prober: Prober,
    /// Probes in flight, by callout token.
    probes: HashMap<u32, Probe>,
    puller: Puller,
    /// Pulls of the degrade sources in flight, by callout token.
    pulls: HashMap<u32, Pull>,
    /// The token of this worker's batch of spans in flight.
    export: Option<u32>,
    /// Callouts that parked calls sent from the timer, by token: the SDK
    /// hands their answers to this context, which passes them on.
    callouts: HashMap<u32, ParkedCall>,
    /// The count of the filter's shared-data keys and bytes in progress.
    census: Census<Config>,
    /// When the load and degrade level gauges were last set, ms.
    load_published_ms: u64,
}

/// An HTTP context that does nothing.
struct Passthrough;

impl Context for Passthrough {}
impl HttpContext for Passthrough {}

impl Root {
    /// Wakes the parked calls whose time has come.
    fn wake_parked(&mut self, worker: &Worker) {
        let parked = worker.take_parked();
        let mut keep = Vec::with_capacity(parked.len());
        for (id, weak) in parked {
            let Some(slot) = weak.upgrade() else {
                continue;
            };
            let Ok(mut call) = slot.try_borrow_mut() else {
                // Busy in a callback of its own: look again next tick.
                keep.push((id, weak));
                continue;
            };
            let Some(c) = call.as_mut().filter(|c| c.is_parked()) else {
                continue;
            };
            if hostcall::set_effective_context(id).is_err() {
                // The stream is gone.
                continue;
            }
            let mut stream = Stream::default();
            // A worker busy in another callback: look again next tick.
            let wake = with_env(worker, |env| c.on_tick(env, &mut stream)).unwrap_or(Wake::Wait);
            for token in stream.take_dispatched() {
                self.callouts.insert(token, (id, weak.clone()));
            }
            if c.body_not_delivered() && worker.can_hold_body.replace(false) {
                log::warn!(
                    "llm-filter: Envoy does not deliver request bodies to a paused stream; \
                     set allow_on_headers_stop_iteration: true on the Wasm plugin config. \
                     Body-based features (cache, model routing) are off on this worker."
                );
            }
            match wake {
                Wake::Wait => keep.push((id, weak)),
                Wake::Resume => {
                    if hostcall::resume_http_request().is_err() {
                        worker.internal_error("resume");
                    }
                }
                Wake::Answered | Wake::Idle => {}
            }
        }
        worker.repark(keep);
    }

    /// Sends the probes that are due; what their ends mean is the prober's.
    fn probe(&mut self, worker: &Worker) {
        let cfg = &worker.config.routing;
        for probe in self.prober.due(cfg, &EnvoyStore, now_ms()) {
            match send(
                &probe.cluster,
                &probe.headers,
                probe.body.as_deref(),
                probe.timeout_ms,
            ) {
                Some(token) => {
                    self.probes.insert(token, probe);
                }
                None => worker.with_metrics(|m| {
                    self.prober
                        .finish(cfg, &EnvoyStore, m, &probe, ProbeEnd::NotSent, now_ms());
                }),
            }
        }
    }

    /// Sends the degrade sources' pulls that are due; what their answers do
    /// is the puller's.
    fn pull(&mut self, worker: &Worker) {
        let config = &worker.config;
        for pull in self.puller.due(&config.degrade, &EnvoyStore, now_ms()) {
            match send(&pull.cluster, &pull.headers, None, pull.timeout_ms) {
                Some(token) => {
                    self.pulls.insert(token, pull);
                }
                None => worker.with_metrics(|m| {
                    self.puller
                        .finish(config, &EnvoyStore, m, &pull, ProbeEnd::NotSent, now_ms());
                }),
            }
        }
    }

    /// Sends this worker's batch of spans when one is due; one at a time.
    fn export_spans(&mut self, worker: &Worker) {
        if self.export.is_some() {
            return;
        }
        let Some(batch) = worker.spans_due() else {
            return;
        };
        match send(
            &batch.cluster,
            &batch.headers,
            Some(&batch.body),
            batch.timeout_ms,
        ) {
            Some(token) => self.export = Some(token),
            None => worker.spans_exported(None),
        }
    }
}

/// Sends a callout from the timer; its token, `None` when the host would not
/// (Envoy knows no such cluster).
fn send<K: AsRef<str>>(
    cluster: &str,
    headers: &[(K, String)],
    body: Option<&[u8]>,
    timeout_ms: u64,
) -> Option<u32> {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_ref(), v.as_str()))
        .collect();
    hostcall::dispatch_http_call(cluster, &headers, body, Duration::from_millis(timeout_ms)).ok()
}

/// The status of a timer's callout's answer (`None`: none came) and its
/// body, read when `read_body` and no longer than `max_body` (a longer one
/// is left unread: an empty body, which no source takes for an answer).
fn callout_answer(body_size: usize, read_body: bool, max_body: usize) -> (Option<u16>, Vec<u8>) {
    let status = adapter::header(MapType::HttpCallResponseHeaders, ":status")
        .and_then(|s| s.parse::<u16>().ok());
    let body = if !read_body || body_size > max_body {
        Vec::new()
    } else {
        hostcall::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    (status, body)
}

/// Logs the most memory the cache can take and creates its slots in shared
/// data (up to [`PREPARE_MAX_SLOTS`]), so Envoy's compare-and-swap guards each
/// of them from the first write.
fn prepare_cache(cfg: &CacheConfig, metrics: &mut EnvoyMetrics) {
    if !cfg.keeps_entries() {
        if cfg.enabled {
            log::info!(
                "llm-filter: response cache in shard mode: calls are keyed into {} for the next tier; no table here",
                cfg.shard_header
            );
        }
        return;
    }
    let worst = cfg.worst_case_bytes();
    log::info!(
        "llm-filter: response cache of {} slots of at most {} bytes each: \
         worst-case shared-data footprint {} bytes ({} MiB)",
        cfg.max_entries,
        cfg.max_entry_bytes,
        worst,
        worst.div_ceil(1 << 20)
    );
    let store = Store::new(&EnvoyStore, cfg);
    // A configuration with fewer slots than the last one leaves slots that
    // no key reaches: they are emptied, so the table's memory shrinks with it.
    match store.relayout() {
        Ok(d) if d.slots > 0 => log::info!(
            "llm-filter: the cache shrank by {} slots; {} entries ({} bytes) beyond it dropped",
            d.slots,
            d.entries,
            d.bytes
        ),
        Ok(_) => {}
        Err(_) => log::warn!(
            "llm-filter: cannot record the cache layout; a smaller one may leave slots behind"
        ),
    }
    if cfg.max_entries > PREPARE_MAX_SLOTS {
        log::info!(
            "llm-filter: more than {PREPARE_MAX_SLOTS} cache slots: they are created as they fill"
        );
    } else if store.prepare().is_err() {
        log::warn!("llm-filter: cannot create the cache slots; the entry totals may drift");
    }
    if let Some(totals) = store.totals() {
        totals.set_gauges(metrics);
    }
    if let Some(sem) = &cfg.semantic {
        prepare_semantic(sem, metrics);
    }
}

/// Logs the most memory the semantic index can take and creates its group
/// slots, for the same reasons as the cache's.
fn prepare_semantic(cfg: &SemanticConfig, metrics: &mut EnvoyMetrics) {
    let worst = cfg.worst_case_bytes();
    log::info!(
        "llm-filter: semantic cache of {} context slots of at most {} vectors of {} dimensions \
         (embeddings from cluster {}): worst-case shared-data footprint {} bytes ({} MiB)",
        cfg.max_contexts,
        cfg.max_per_context,
        cfg.max_dimensions,
        cfg.embeddings.service.cluster,
        worst,
        worst.div_ceil(1 << 20)
    );
    let index = Index::new(&EnvoyStore, cfg);
    if index.prepare().is_err() {
        log::warn!("llm-filter: cannot create the semantic cache's slots; its totals may drift");
    }
    if let Some(totals) = index.totals() {
        totals.set_gauges(metrics);
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if let Some((id, weak)) = self.callouts.remove(&token) {
            let (Some(worker), Some(slot)) = (self.worker.clone(), weak.upgrade()) else {
                return;
            };
            if hostcall::set_effective_context(id).is_ok() {
                deliver_callout(&worker, id, &slot, body_size);
            }
            return;
        }
        let Some(worker) = self.worker.clone() else {
            return;
        };
        if self.export == Some(token) {
            self.export = None;
            let (status, _) = callout_answer(body_size, false, 0);
            worker.spans_exported(status);
            return;
        }
        if let Some(pull) = self.pulls.remove(&token) {
            let (status, body) = callout_answer(body_size, true, MAX_ANSWER_BYTES);
            let end = ProbeEnd::of(status, &body);
            worker.with_metrics(|m| {
                self.puller
                    .finish(&worker.config, &EnvoyStore, m, &pull, end, now_ms());
            });
            return;
        }
        let Some(probe) = self.probes.remove(&token) else {
            return;
        };
        let (status, body) = callout_answer(body_size, probe.kind.reads_body(), MAX_METRICS_BYTES);
        let end = ProbeEnd::of(status, &body);
        worker.with_metrics(|m| {
            let cfg = &worker.config.routing;
            self.prober
                .finish(cfg, &EnvoyStore, m, &probe, end, now_ms());
        });
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let raw = match hostcall::get_buffer(BufferType::PluginConfiguration, 0, size) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                log::error!("llm-filter: cannot read the plugin configuration: {status:?}");
                return false;
            }
        };
        let config = match Config::parse(&raw) {
            Ok(c) => c,
            Err(e) => {
                // Envoy refuses the configuration: never run on a half-valid one.
                log::error!("llm-filter: {e}");
                return false;
            }
        };
        log::info!(
            "llm-filter: configured for {} LLM path(s), {} routed model(s)",
            config.llm_paths.len(),
            config.routing.models.len()
        );
        let mut metrics = EnvoyMetrics::default();
        prepare_cache(&config.cache, &mut metrics);
        hostcall::count_unexpected(&mut metrics);
        let mut rng = SplitMix64::new(adapter::entropy());
        self.prober = Prober::new(rng.next_u64().max(1));
        self.puller = Puller::new(rng.next_u64().max(1));
        self.census = Census::new(keyspace::plan(&config));
        let model_labels = BoundedLabel::new(MAX_MODEL_LABELS).knowing(&config.names);
        self.worker = Some(Rc::new(Worker::new(config, metrics, rng, model_labels)));
        if hostcall::set_tick_period(TICK).is_err() {
            log::warn!("llm-filter: no timer: parked calls rely on their own callbacks");
        }
        true
    }

    fn on_tick(&mut self) {
        #[cfg(feature = "hostcall-census")]
        let _quiet = hostcall::bench_census::Quiet::new();
        let Some(worker) = self.worker.clone() else {
            return;
        };
        self.wake_parked(&worker);
        self.probe(&worker);
        self.pull(&worker);
        self.export_spans(&worker);
        let counted = self
            .census
            .step(&EnvoyStore, &worker.config, now_ms(), KEYS_PER_STEP);
        if let Some(footprint) = counted {
            worker.with_metrics(|m| keyspace::publish(&footprint, m));
        }
        let now = now_ms();
        if now.saturating_sub(self.load_published_ms) >= LOAD_GAUGES_EVERY_MS {
            self.load_published_ms = now;
            worker.with_metrics(|m| {
                load::publish(&EnvoyStore, m, now);
                degrade::publish(&EnvoyStore, &worker.config, m, now);
            });
        }
        worker.count_host_errors();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The SDK traps on `None`, so a worker without configuration passes
        // traffic through untouched instead.
        Some(match self.worker.clone() {
            Some(worker) => Box::new(Http::new(context_id, worker)),
            None => Box::new(Passthrough),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
