//! The root context: loads and compiles the configuration once per VM, hands
//! every HTTP context the shared state of this worker, and runs the timer that
//! wakes parked calls, runs the background jobs (the routing probes, the
//! degrade sources' pulls, the span export) and counts the filter's shared
//! data.

use std::rc::Rc;
use std::time::Duration;

use llm_filter_core::cache::semantic::config::SemanticConfig;
use llm_filter_core::cache::semantic::Index;
use llm_filter_core::cache::{CacheConfig, Store, PREPARE_MAX_SLOTS};
use llm_filter_core::config::Config;
use llm_filter_core::host::footprint::{Census, KEYS_PER_STEP};
use llm_filter_core::host::{Random, SplitMix64};
use llm_filter_core::metrics::BoundedLabel;
use llm_filter_core::wait::Jobs;
use llm_filter_core::walk::Wake;
use llm_filter_core::{degrade, keyspace, load};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

use crate::adapter::{self, now_ms, EnvoyMetrics, EnvoyStore};
use crate::callout;
use crate::hostcall;
use crate::http::Http;
use crate::stream::Stream;
use crate::worker::{with_env, Worker};

/// Distinct model names one worker turns into stat labels before using
/// `other`, besides the models the configuration names (always their own).
const MAX_MODEL_LABELS: usize = 100;
/// How often the load gauges are set from shared data.
const LOAD_GAUGES_EVERY_MS: u64 = 1000;
/// Timer period: how often parked calls are looked at and jobs considered.
const TICK: Duration = Duration::from_millis(25);

/// The root context of one VM.
#[derive(Default)]
pub struct Root {
    worker: Option<Rc<Worker>>,
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
    fn wake_parked(&self, worker: &Worker) {
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
            // The SDK hands their answers to this context, which passes them on.
            callout::register_calls(worker, id, &slot, stream.take_dispatched());
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
        if let Some(worker) = self.worker.clone() {
            callout::deliver(&worker, token, body_size, None);
        }
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
        let jobs = Jobs::new(rng.next_u64().max(1), rng.next_u64().max(1));
        self.census = Census::new(keyspace::census::plan(&config));
        let model_labels = BoundedLabel::new(MAX_MODEL_LABELS).knowing(&config.names);
        self.worker = Some(Rc::new(Worker::new(
            config,
            metrics,
            rng,
            model_labels,
            jobs,
        )));
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
        callout::run_jobs(&worker);
        let now = now_ms();
        // Before the load gauges below read the records.
        worker.flush_load(now);
        callout::give_up(&worker, now);
        let counted = self
            .census
            .step(&EnvoyStore, &worker.config, now, KEYS_PER_STEP);
        if let Some(footprint) = counted {
            worker.with_metrics(|m| keyspace::census::publish(&footprint, m));
        }
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
