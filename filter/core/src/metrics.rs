//! Every stat the filter defines, by name, and the one way labels are encoded
//! into a stat name. Envoy has no label API: each label is written into the
//! name right after the metric as `<label>=.=<value>;.;` and the `stats_tags`
//! rules of the bootstrap (`envoy/envoy.yaml`, one per label, [`tag_regex`])
//! split them back out into Prometheus labels.
//!
//! That is Istio's own form: the rule [`tag_regex`] gives is the one Istio's
//! bootstrap writes for each name of `meshConfig.defaultConfig.extraStatTags`,
//! so in a mesh that one setting labels every sidecar's stats
//! (docs/deploy/istio.md). Each rule removes its label's part whole and the
//! metric is what remains, so there is nothing between the metric and the
//! first label (`llm_filter_requests_totalpriority=.=P0;.;`): a separator
//! would stay in the name.
//!
//! The `=.=` and `;.;` around a value are what make this lossless for the
//! names people give clusters and models: a value keeps dots and pipes
//! (`outbound|80||api.openai.com`, `gpt-4.1`) because the rule's regex ends it
//! at `;.;`, not at the next dot. A value keeps `[A-Za-z0-9._|/:@+-]`; any other
//! character (`;` and `=` among them) becomes `_`, and it is cut at
//! [`MAX_VALUE_LEN`] characters. Istio's rules are not anchored: no label's
//! name may end with another's (`from_model` next to `model`), or the shorter
//! one's rule would read the longer one's value; and the default rules of
//! Istio's bootstrap take a tag after `cache.`, `component.`, `tag.` and
//! `wasm_filter.` anywhere in a name, so a value writes that dot as `_`
//! (`api.cache_example.com`).

use hashbrown::HashSet;

use crate::config::Names;
use crate::host::Metrics;
pub use crate::stat_name::{label_value, name, push_value, MAX_VALUE_LEN, UNKNOWN};

/// Calls seen, by `priority`, `model` and `outcome` (and `group` with A/B
/// groups, as the duration, time-to-first-token and token metrics).
pub const REQUESTS: &str = "llm_filter_requests_total";
/// Whole-call duration in milliseconds, by `model` (OpenTelemetry GenAI
/// `gen_ai.client.operation.duration`, in ms because Envoy histograms are integral).
pub const OPERATION_DURATION: &str = "gen_ai_client_operation_duration_ms";
/// Time from the request to the first byte of the response body, by `model`
/// (GenAI `gen_ai.server.time_to_first_token`).
pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai_server_time_to_first_token_ms";
/// Time per output token after the first of a stream (OpenTelemetry's
/// `gen_ai.server.time_per_output_token`), µs, by `model` and `api`.
pub const TIME_PER_OUTPUT_TOKEN: &str = "gen_ai_server_time_per_output_token_us";
/// Tokens reported in `usage`, by `model` and `token_type` (`input` |
/// `output`, and the parts of the input the provider's prompt cache read,
/// `cached_input`, and wrote, `cache_creation_input`), as in GenAI
/// `gen_ai.client.token.usage`.
pub const TOKEN_USAGE: &str = "gen_ai_client_token_usage_total";
/// Each model's learnt ratio of the prompt tokens its provider reports to
/// the filter's estimate, in thousandths (500..=2000), by `model`: set by the
/// worker that learnt it (see `tokens::calibration`).
pub const TOKEN_ESTIMATE_RATIO: &str = "llm_filter_token_estimate_ratio_milli";
/// The filter's own trouble, by `reason`; the request continued untouched.
pub const INTERNAL_ERRORS: &str = "llm_filter_internal_errors_total";
/// Host calls the filter made, by `call`: only in a bench build of the plugin
/// (feature `hostcall-census`), which `make bench-hostcalls` reads.
pub const BENCH_HOSTCALLS: &str = "llm_filter_bench_hostcalls_total";
/// Nanoseconds spent inside the filter's HTTP callbacks, by `callback`: only
/// in the same bench build, which `make bench-hostcalls` reads under load.
pub const BENCH_CALLBACK_NS: &str = "llm_filter_bench_callback_ns_total";
/// Nanoseconds spent inside host calls made from those callbacks, by `call`:
/// only in the same bench build.
pub const BENCH_HOSTCALL_NS: &str = "llm_filter_bench_hostcall_ns_total";

// budget
/// Share of its timeout budget a completed call used, in per-mille (0..=1000),
/// by `priority`.
pub const BUDGET_USED: &str = "llm_filter_budget_used_permille";
/// Breaker tier of a backend (0 pass, 1 shed, 2 reject), by `llm_cluster`.
pub const BUDGET_BREAKER_TIER: &str = "llm_filter_budget_breaker_tier";
/// Budget pressure of a backend over the breaker window, in per-mille, by
/// `llm_cluster`.
pub const BUDGET_BREAKER_PRESSURE: &str = "llm_filter_budget_breaker_pressure_permille";
/// Calls shed by the breaker, by `priority` and `reason`.
pub const BUDGET_SHED: &str = "llm_filter_budget_shed_total";
/// Calls rejected (breaker open, budget exhausted), by `priority` and `reason`.
pub const BUDGET_REJECTED: &str = "llm_filter_budget_rejected_total";
/// Retries allowed by the plans handed to Envoy (`x-envoy-max-retries`), by
/// `llm_cluster`.
pub const BUDGET_RETRIES_PLANNED: &str = "llm_filter_budget_retries_planned_total";
/// Calls planned without retries because the retry budget was spent, by
/// `llm_cluster`.
pub const BUDGET_RETRY_BUDGET_SPENT: &str = "llm_filter_budget_retry_budget_spent_total";

// cache
/// Cache lookups of LLM calls, by `result` (`hit` | `miss` | `bypass` |
/// `coalesced` | `stale` | `semantic`), the same value as the `x-cache` header.
pub const CACHE_LOOKUPS: &str = "llm_filter_cache_lookups_total";
/// Occupied cache slots (gauge, shared by all workers).
pub const CACHE_ENTRIES: &str = "llm_filter_cache_entries";
/// Bytes held by cache slots (gauge, shared by all workers).
pub const CACHE_BYTES: &str = "llm_filter_cache_bytes";
/// Fresh entries pushed out by another key's.
pub const CACHE_EVICTIONS: &str = "llm_filter_cache_evictions_total";
/// Calls that waited for an identical call in flight, by `outcome`
/// (`served` | `upstream`).
pub const CACHE_COALESCED_WAITS: &str = "llm_filter_cache_coalesced_waits_total";
/// Answers offered to the cache, by `result` (`stored` or why not).
pub const CACHE_STORES: &str = "llm_filter_cache_stores_total";
/// Shard headers (`cache.shard_header`), by `result`: `written` by a filter
/// in `shard` mode; `matched` or `mismatched` against the key a filter in
/// `local` mode computed itself (a mismatch is ignored).
pub const CACHE_SHARD_KEYS: &str = "llm_filter_cache_shard_keys_total";
/// Best cosine similarity found per semantic lookup, in thousandths (0..=1000).
pub const CACHE_SEMANTIC_SIMILARITY: &str = "llm_filter_cache_semantic_similarity_permille";
/// Duration of the embeddings callout of a semantic lookup, ms.
pub const CACHE_EMBEDDING_DURATION: &str = "llm_filter_cache_embedding_duration_ms";
/// Embeddings callouts that brought no vector, by `reason` (`dispatch` |
/// `timeout` | `status` | `invalid` | `dimensions`); the call went on as a miss.
pub const CACHE_EMBEDDING_FAILURES: &str = "llm_filter_cache_embedding_failures_total";
/// Vectors offered to the semantic index, by `result` (`stored` | `evicted` |
/// `contended` | `host_error`).
pub const CACHE_SEMANTIC_STORES: &str = "llm_filter_cache_semantic_stores_total";
/// Vectors held by the semantic index (gauge, shared by all workers).
pub const CACHE_SEMANTIC_VECTORS: &str = "llm_filter_cache_semantic_vectors";

// routing
/// Calls sent to a routed cluster, by `llm_cluster` and `outcome` (`success` |
/// `client_error` | `rate_limited` | `server_error` | `reset` | `timeout` |
/// `cancelled` | `outlasted`).
pub const ROUTING_CALLS: &str = "llm_filter_routing_calls_total";
/// Effective weight of a cluster for a model, ×1000, by `model` and
/// `llm_cluster`.
pub const ROUTING_WEIGHT: &str = "llm_filter_routing_weight_milli";
/// Clusters ejected (weight 0), by `llm_cluster`.
pub const ROUTING_EJECTIONS: &str = "llm_filter_routing_ejections_total";
/// Calls routed on base weights because every backend was ejected, by `model`.
pub const ROUTING_FALLBACKS: &str = "llm_filter_routing_fallbacks_total";
/// Active probes, by `llm_cluster` and `result` (`ok` | `fail`).
pub const ROUTING_PROBES: &str = "llm_filter_routing_probes_total";
/// Duration of routed calls in milliseconds, by `llm_cluster`.
pub const ROUTING_LATENCY: &str = "llm_filter_routing_call_duration_ms";
/// Calls in flight to a cluster across workers, by `llm_cluster`.
pub const ROUTING_IN_FLIGHT: &str = "llm_filter_routing_in_flight";
/// Slow calls also sent to another backend, by `result` (won, lost, abandoned).
pub const ROUTING_HEDGES: &str = "llm_filter_routing_hedges_total";
/// Calls sent to another backend after theirs failed them, by `result`.
pub const ROUTING_FAILOVERS: &str = "llm_filter_routing_failovers_total";
/// Calls moved to the next model of their fallback chain, by the model that
/// refused them, the error class (`reason`) and how the next model answered.
pub const ROUTING_MODEL_FALLBACKS: &str = "llm_filter_routing_model_fallbacks_total";
/// Tokens the backend reported in `usage`, by `model`, `llm_cluster` and
/// `token_type` (`input` | `cached_input` | `cache_creation_input` |
/// `output`): how warm each backend's prompt cache is for each model.
pub const ROUTING_TOKENS: &str = "llm_filter_routing_tokens_total";

// load
/// Calls per second of a model over the load window, ×1000, by `model`.
pub const LOAD_RPS: &str = "llm_filter_load_rps_milli";
/// Output tokens per second of a model over the load window, by `model`.
pub const LOAD_TOKENS: &str = "llm_filter_load_tokens_per_s";
/// Calls of a model in flight upstream across workers, by `model`.
pub const LOAD_IN_FLIGHT: &str = "llm_filter_load_in_flight";
/// Tries per second sent to a cluster over the load window, ×1000, by
/// `llm_cluster`.
pub const LOAD_CLUSTER_RPS: &str = "llm_filter_load_cluster_rps_milli";
/// Output tokens per second from a cluster over the load window, by
/// `llm_cluster`.
pub const LOAD_CLUSTER_TOKENS: &str = "llm_filter_load_cluster_tokens_per_s";
// shaping
/// Calls whose request shaping changed, by `what` (`max_tokens` | `history`)
/// and `priority`.
pub const SHAPED: &str = "llm_filter_shaped_total";

// degrade
/// The degrade level of a model (0..=3), by `model`.
pub const DEGRADE_LEVEL: &str = "llm_filter_degrade_level";
/// Actions the load-driven degrade took, by `action` and `priority`.
pub const DEGRADED: &str = "llm_filter_degraded_total";
/// Body actions a call's dialect has no field for, skipped, by `action` and
/// `api`.
pub const DEGRADE_SKIPPED: &str = "llm_filter_degrade_skipped_total";
/// Pulls of a degrade source, by `what` (`alertmanager` | `prometheus`) and
/// `result` (`ok`, `status`, `no_answer`, `not_sent`, `invalid`, `store`).
pub const DEGRADE_PULLS: &str = "llm_filter_degrade_pulls_total";
/// Alerts or samples of a pulled answer not kept, by `what`.
pub const DEGRADE_PULL_DROPPED: &str = "llm_filter_degrade_pull_dropped_total";
/// 1 while a degrade source's last pull was read, 0 after one failed, by `what`.
pub const DEGRADE_SOURCE_UP: &str = "llm_filter_degrade_source_up";

// spans
/// Spans of LLM calls (`tracing.otlp`), by `result`: `queued`, `exported`,
/// `failed` (their batch got no 2xx), `dropped` (the queue was full).
pub const SPANS: &str = "llm_filter_spans_total";
/// Spans waiting for export, across workers.
pub const SPANS_QUEUED: &str = "llm_filter_spans_queued";

// shared data
/// Keys the filter holds in Envoy shared data (gauge, counted every few
/// seconds; see `host::footprint` and the key families of docs/design.md).
pub const SHARED_DATA_KEYS: &str = "llm_filter_shared_data_keys";
/// Bytes of the values of those keys (gauge).
pub const SHARED_DATA_BYTES: &str = "llm_filter_shared_data_bytes";

// identity
/// Calls refused for who they are, before anything is spent
/// (`tenant.from: jwt | virtual_key`), by `reason` (`missing` | `unknown`)
/// and `api`.
pub const IDENTITY_REFUSED: &str = "llm_filter_identity_refused_total";

/// Label value used once a label has seen too many distinct values.
pub const OTHER: &str = "other";
/// The label that names a backend (an Envoy cluster). Not `cluster`, which
/// most Prometheus setups attach to every series themselves.
pub const LLM_CLUSTER: &str = "llm_cluster";

/// Every label the filter writes into stat names; the bootstrap has one
/// `stats_tags` rule per label, with the regex [`tag_regex`] gives.
pub const LABELS: [&str; 14] = [
    "priority",
    "model",
    "outcome",
    "token_type",
    LLM_CLUSTER,
    "result",
    "reason",
    "what",
    "group",
    "action",
    "api",
    "rule",
    "tenant",
    "limit",
];

/// The `stats_tags` regex that extracts `label` from the names [`name`]
/// writes, exactly as Istio's bootstrap template writes it for an
/// `extraStatTags` name: the first group (removed from the name) is
/// `label=.=value;.;`, the second (the label's value) runs up to the `;.;`,
/// dots included.
pub fn tag_regex(label: &str) -> String {
    format!(r"({label}=\.=(.*?);\.;)")
}

/// Counts the filter's own trouble by `reason`: the call goes on untouched
/// (fail-open), and this counter is how an operator hears of it.
pub fn internal_error(m: &mut dyn Metrics, reason: &str) {
    m.counter(&name(INTERNAL_ERRORS, &[("reason", reason)]), 1);
}

/// Bounds the distinct values of a label (each stat lives as long as Envoy):
/// the values the configuration names always keep their own (see
/// [`crate::config::Names`]); of the others, the first `cap` are kept and
/// later ones become [`OTHER`], so a client naming made-up values cannot
/// take the place of one the configuration acts on.
#[derive(Debug)]
pub struct BoundedLabel {
    seen: HashSet<String>,
    known: Names,
    cap: usize,
}

impl BoundedLabel {
    /// A bound of `cap` distinct values besides the known ones.
    pub fn new(cap: usize) -> Self {
        Self {
            seen: HashSet::new(),
            known: Names::default(),
            cap,
        }
    }

    /// The bound with the models `known` names kept outside it.
    pub fn knowing(mut self, known: &Names) -> Self {
        self.known = known.clone();
        self
    }

    /// The label value to use for `raw`.
    pub fn value<'a>(&mut self, raw: Option<&'a str>) -> &'a str {
        let Some(raw) = raw.filter(|r| !r.is_empty()) else {
            return UNKNOWN;
        };
        if self.known.has_model(raw) || self.seen.contains(raw) {
            return raw;
        }
        if self.seen.len() < self.cap {
            self.seen.insert(raw.to_string());
            return raw;
        }
        OTHER
    }
}

// limits
/// Calls a limit rule applied to, by `rule` and `result` (`pass` |
/// `degraded` | `rejected` | `unenforced`: its record could not be read or
/// written and the call went unchecked).
pub const LIMITS_CALLS: &str = "llm_filter_limits_calls_total";
/// Tokens charged under a rule, by `rule` and `tenant` (the first
/// `limits.tenant_labels` tenants a worker sees; the rest `other`).
pub const LIMITS_TOKENS: &str = "llm_filter_limits_tokens_total";
/// Cost charged under a rule, in millionths of the price unit, by `rule`
/// and `tenant`.
pub const LIMITS_COST: &str = "llm_filter_limits_cost_micros_total";
/// What a tenant used of a limit at its last call, in per-mille, by `rule`,
/// `tenant` and `limit` (`tokens_per_minute`, `cost_per_day`, …).
pub const LIMITS_USED: &str = "llm_filter_limits_used_permille";
/// Charges the limits had to estimate or mend, by `reason`
/// (`usage_unknown` | `stream_cut_short` | `usage_clamped`), and keys that
/// found every record of their probes held (`record_shared`: they count
/// with another key, stricter for both).
pub const LIMITS_ESTIMATED: &str = "llm_filter_limits_estimated_total";

// prices
/// What the provider's prompt cache saved, in millionths of the price
/// unit, by `model`: the tokens it read at the cached rate rather than the
/// input rate (`limits.prices`).
pub const PROMPT_CACHE_SAVED: &str = "llm_filter_prompt_cache_saved_micros_total";
/// What writing to the provider's prompt cache cost above the input rate,
/// in millionths of the price unit, by `model`: the net saving is the
/// saved counter less this one.
pub const PROMPT_CACHE_PREMIUM: &str = "llm_filter_prompt_cache_write_premium_micros_total";

/// Prompt-cache markers the filter put on calls whose client placed none,
/// by `model` and `api` (`routing.prompt_cache`).
pub const PROMPT_CACHE_MARKERS: &str = "llm_filter_prompt_cache_markers_total";

// credentials
/// Calls Envoy could not put the mesh's credential on (the secret missing or
/// unreadable), by `llm_cluster`: each answered 503 in the caller's shape
/// (`llm_filter_credential_unavailable`), never sent with the client's key.
pub const CREDENTIAL_UNAVAILABLE: &str = "llm_filter_credential_unavailable_total";

/// Calls a guardrail rule fired on, by `rule`, its `action` (`block` |
/// `mask` | `log`) and `api`: once per call and rule, never what was found.
pub const GUARDRAIL_FIRED: &str = "llm_filter_guardrail_fired_total";

/// Calls whose prompt the guardrails could not read whole while a rule
/// blocks or masks, by `reason` (`not_held` | `not_json` | `too_long`),
/// `result` (`refused` | `allowed`, by `guardrails.unchecked`) and `api`.
pub const GUARDRAIL_UNCHECKED: &str = "llm_filter_guardrail_unchecked_total";
/// Guardrail service callouts, asked to answered (or failed), ms.
pub const GUARDRAIL_SERVICE_DURATION: &str = "llm_filter_guardrail_service_duration_ms";
/// Prompts the guardrail service gave no verdict on, by `rule` (the
/// service's name), `reason` (`dispatch` | `timeout` | `status` | `invalid`
/// | `too_long` | `stream` | `failover` | `answer_too_long`), `result` (`allowed` | `refused`, by its `on_error`) and
/// `api`.
pub const GUARDRAIL_SERVICE_FAILURES: &str = "llm_filter_guardrail_service_failures_total";
/// Answers a guardrail rule found something in, by `rule`, `action` and
/// `api`.
pub const GUARDRAIL_ANSWER_FIRED: &str = "llm_filter_guardrail_answer_fired_total";
/// Answers the rules that block or mask could not read whole, by `reason`
/// (`too_long`, `not_json`), `result` (`refused`, `allowed`) and `api`.
pub const GUARDRAIL_ANSWER_UNCHECKED: &str = "llm_filter_guardrail_answer_unchecked_total";
/// Answers cut off by the guardrail service's verdict asked in parallel:
/// released before it (longer than the proxy holds), then refused; by
/// `rule` (the service's name) and `api`.
pub const GUARDRAIL_ANSWER_CUT: &str = "llm_filter_guardrail_answer_cut_total";

/// Every metric the filter defines, each of the constants above once:
/// `docs/metrics.md` documents each (a test of the core checks both).
pub const ALL: &[&str] = &[
    REQUESTS,
    OPERATION_DURATION,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    TOKEN_USAGE,
    TOKEN_ESTIMATE_RATIO,
    INTERNAL_ERRORS,
    BENCH_HOSTCALLS,
    BENCH_CALLBACK_NS,
    BENCH_HOSTCALL_NS,
    BUDGET_USED,
    BUDGET_BREAKER_TIER,
    BUDGET_BREAKER_PRESSURE,
    BUDGET_SHED,
    BUDGET_REJECTED,
    BUDGET_RETRIES_PLANNED,
    BUDGET_RETRY_BUDGET_SPENT,
    CACHE_LOOKUPS,
    CACHE_ENTRIES,
    CACHE_BYTES,
    CACHE_EVICTIONS,
    CACHE_COALESCED_WAITS,
    CACHE_STORES,
    CACHE_SHARD_KEYS,
    CACHE_SEMANTIC_SIMILARITY,
    CACHE_EMBEDDING_DURATION,
    CACHE_EMBEDDING_FAILURES,
    CACHE_SEMANTIC_STORES,
    CACHE_SEMANTIC_VECTORS,
    ROUTING_CALLS,
    ROUTING_WEIGHT,
    ROUTING_EJECTIONS,
    ROUTING_FALLBACKS,
    ROUTING_PROBES,
    ROUTING_LATENCY,
    ROUTING_IN_FLIGHT,
    ROUTING_HEDGES,
    ROUTING_FAILOVERS,
    ROUTING_MODEL_FALLBACKS,
    ROUTING_TOKENS,
    LOAD_RPS,
    LOAD_TOKENS,
    LOAD_IN_FLIGHT,
    LOAD_CLUSTER_RPS,
    LOAD_CLUSTER_TOKENS,
    SHAPED,
    DEGRADE_LEVEL,
    DEGRADED,
    DEGRADE_SKIPPED,
    DEGRADE_PULLS,
    DEGRADE_PULL_DROPPED,
    DEGRADE_SOURCE_UP,
    SPANS,
    SPANS_QUEUED,
    SHARED_DATA_KEYS,
    SHARED_DATA_BYTES,
    LIMITS_CALLS,
    LIMITS_TOKENS,
    LIMITS_COST,
    LIMITS_USED,
    LIMITS_ESTIMATED,
    PROMPT_CACHE_SAVED,
    PROMPT_CACHE_PREMIUM,
    PROMPT_CACHE_MARKERS,
    CREDENTIAL_UNAVAILABLE,
    IDENTITY_REFUSED,
    GUARDRAIL_FIRED,
    GUARDRAIL_UNCHECKED,
    GUARDRAIL_SERVICE_DURATION,
    GUARDRAIL_SERVICE_FAILURES,
    GUARDRAIL_ANSWER_FIRED,
    GUARDRAIL_ANSWER_UNCHECKED,
    GUARDRAIL_ANSWER_CUT,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// What a `stats_tags` rule does with a name: the value of the second
    /// group of `(label=\.=(.*?);\.;)` at its leftmost match, and the name
    /// with the first removed.
    fn extract(name: &str, label: &str) -> Option<(String, String)> {
        let head = format!("{label}=.=");
        let start = name.find(&head)?;
        let value_start = start + head.len();
        let end = value_start + name.get(value_start..)?.find(";.;")?;
        let value = name.get(value_start..end)?.to_string();
        let rest = format!("{}{}", name.get(..start)?, name.get(end + 3..)?);
        Some((value, rest))
    }

    #[test]
    fn encodes_labels_in_order() {
        assert_eq!(
            name(REQUESTS, &[("priority", "P1"), ("model", "gpt-4o")]),
            "llm_filter_requests_totalpriority=.=P1;.;model=.=gpt-4o;.;"
        );
    }

    #[test]
    fn values_keep_dots_and_pipes_and_lose_the_rest() {
        assert_eq!(
            name("m", &[("model", "meta-llama/Llama-3.1 8B"), ("x", "")]),
            "mmodel=.=meta-llama/Llama-3.1_8B;.;x=.=unknown;.;"
        );
        assert_eq!(
            name("m", &[("a", "x;.;b=.=y"), ("b", "z")]),
            "ma=.=x_._b_._y;.;b=.=z;.;"
        );
        // Istio's default rules would take a tag after these words' dot.
        assert_eq!(
            name(
                "m",
                &[("llm_cluster", "outbound|80||api.cache.example.com")]
            ),
            "mllm_cluster=.=outbound|80||api.cache_example.com;.;"
        );
        assert_eq!(
            name(
                "m",
                &[
                    ("tenant", "team.tag.a"),
                    ("model", "component.wasm_filter.x")
                ]
            ),
            "mtenant=.=team.tag_a;.;model=.=component_wasm_filter_x;.;"
        );
        assert_eq!(name("cache", &[("m", ".cachex.")]), "cachem=.=.cachex.;.;");
        let long = "a".repeat(500);
        assert_eq!(
            name("m", &[("l", &long)]).len(),
            "ml=.=;.;".len() + MAX_VALUE_LEN
        );
    }

    #[test]
    fn every_label_comes_back_whole_from_its_tag_rule() {
        let values = [
            "P0",
            "gpt-4.1",
            "success",
            "input",
            "outbound|80||api.openai.com",
            "hit",
            "outbound|8000|v1|vllm.inference.svc.cluster.local",
            "max_tokens",
            "canary",
            "shed",
        ];
        let labels: Vec<(&str, &str)> = LABELS.iter().copied().zip(values).collect();
        let encoded = name(ROUTING_CALLS, &labels);
        let mut rest = encoded.clone();
        for (label, value) in &labels {
            let (got, left) = extract(&encoded, label).expect(label);
            assert_eq!(&got, value, "{label} of {encoded}");
            // Each rule removes its own part only; all of them leave the metric.
            rest = extract(&rest, label).expect(label).1;
            assert!(left.starts_with(ROUTING_CALLS), "{left}");
        }
        assert_eq!(rest, ROUTING_CALLS);
        assert_eq!(tag_regex(LLM_CLUSTER), r"(llm_cluster=\.=(.*?);\.;)");
    }

    #[test]
    fn no_label_name_ends_with_another() {
        // Istio's rules are not anchored: `model=\.=` would also match
        // inside `from_model=.=`.
        for a in LABELS {
            for b in LABELS {
                assert!(a == b || !b.ends_with(a), "{b} ends with {a}");
            }
        }
    }

    #[test]
    fn bounded_label_caps_distinct_values() {
        let mut l = BoundedLabel::new(2);
        assert_eq!(l.value(Some("a")), "a");
        assert_eq!(l.value(Some("b")), "b");
        assert_eq!(l.value(Some("c")), OTHER);
        assert_eq!(l.value(Some("a")), "a");
        assert_eq!(l.value(None), UNKNOWN);
        assert_eq!(l.value(Some("")), UNKNOWN);
    }

    #[test]
    fn known_values_keep_their_label_whatever_came_first() {
        let known = Names::new(["routed", "cheap"], []);
        let mut l = BoundedLabel::new(2).knowing(&known);
        for made_up in ["x1", "x2"] {
            assert_eq!(l.value(Some(made_up)), made_up);
        }
        assert_eq!(l.value(Some("x3")), OTHER);
        assert_eq!(l.value(Some("routed")), "routed");
        assert_eq!(l.value(Some("cheap")), "cheap");
        // Known values take no place from the others, nor the others theirs.
        let mut l = BoundedLabel::new(1).knowing(&known);
        assert_eq!(l.value(Some("routed")), "routed");
        assert_eq!(l.value(Some("x1")), "x1");
        assert_eq!(l.value(Some("x2")), OTHER);
    }
}
