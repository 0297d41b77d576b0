//! The root context: loads and compiles the configuration once per VM and
//! hands every HTTP context the shared state of this worker.

use std::cell::RefCell;
use std::rc::Rc;

use llm_filter_core::config::Config;
use llm_filter_core::host::SplitMix64;
use llm_filter_core::metrics::BoundedLabel;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

use crate::host::{self, EnvoyMetrics};
use crate::http::Http;

/// Distinct model names one worker turns into stat labels before using `other`.
const MAX_MODEL_LABELS: usize = 100;

/// What every HTTP context of this worker shares.
pub struct Worker {
    /// The compiled configuration.
    pub config: Config,
    /// Stats sink.
    pub metrics: RefCell<EnvoyMetrics>,
    /// Randomness, seeded once from the host.
    pub rng: RefCell<SplitMix64>,
    /// Bound on model label values.
    pub models: RefCell<BoundedLabel>,
}

/// An HTTP context that does nothing.
struct Passthrough;

impl Context for Passthrough {}
impl HttpContext for Passthrough {}

/// The root context of one VM.
#[derive(Default)]
pub struct Root {
    worker: Option<Rc<Worker>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let raw = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size) {
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
            "llm-filter: configured for {} LLM path(s)",
            config.llm_paths.len()
        );
        self.worker = Some(Rc::new(Worker {
            config,
            metrics: RefCell::new(EnvoyMetrics::default()),
            rng: RefCell::new(SplitMix64::new(host::entropy())),
            models: RefCell::new(BoundedLabel::new(MAX_MODEL_LABELS)),
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The SDK traps on `None`, so a worker without configuration passes
        // traffic through untouched instead.
        Some(match self.worker.clone() {
            Some(worker) => Box::new(Http::new(worker)),
            None => Box::new(Passthrough),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
