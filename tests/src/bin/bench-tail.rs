//! Measures tail latency across backends (issue 9): one model served by three
//! backends of different speed, one of them heavy-tailed, under a closed loop
//! of clients, once through plain Envoy spreading the calls evenly and once
//! through Envoy with llm-filter routing the model (cache and budgets on); then
//! the same with one backend failing outright; then conversations against
//! backends that play a prefix cache ([`prefix`], issue 22). Every run starts
//! fresh mocks and a fresh Envoy, and the calls and the tail are drawn from one
//! seed, so runs compare.
// A tool of the test suite: a step that cannot run (a mock, Envoy, a client
// that does not start) ends the run, and `expect` says why. Indexing and
// `panic!` stay denied: malformed output is reported, not trapped on.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::panic, clippy::indexing_slicing))]

#[path = "bench-tail/prefix.rs"]
mod prefix;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use llm_filter_e2e::mock::TailLatency;
use llm_filter_e2e::{cli, http_client, prometheus, Envoy, EnvoyBuilder, MockConfig, MockUpstream};
use serde_json::{json, Value};

const USAGE: &str = "usage: bench-tail [--calls N] [--failure-calls N] [--concurrency N] \
                     [--seed N] [--repeat-percent N] [--max-phase-s N] \
                     [--only tail|failure|regions|prefix]";

/// The model every call asks for.
const MODEL: &str = "gpt-4o";
/// The header plain Envoy routes on, and the one the filter sets.
const CLUSTER_HEADER: &str = "x-llm-cluster";
/// Distinct prompts the repeated calls are drawn from.
const POOL: u64 = 16;
/// Envoy's route timeout on both sides (the filter's budget replaces it on its side).
const ROUTE_TIMEOUT_MS: u64 = 30_000;
/// The virtual host settings of `envoy/envoy.yaml`, on both sides: attempts
/// reported to the filter, retries spaced with back-off.
const VHOST: &str = "include_attempt_count_in_response: true
retry_policy:
  retry_back_off: {base_interval: 0.1s, max_interval: 1s}
  rate_limited_retry_back_off:
    reset_headers:
    - {name: retry-after, format: SECONDS}
    max_interval: 10s
";

/// The filter's counters read after each run; absent ones read 0.
const HEDGES: &str = "llm_filter_routing_hedges_total";
const FAILOVERS: &str = "llm_filter_routing_failovers_total";
const EJECTIONS: &str = "llm_filter_routing_ejections_total";

/// How one backend behaves during a phase.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Backend {
    /// Mock instance and Envoy cluster name.
    name: &'static str,
    /// Delay before every answer outside the tail.
    delay_ms: u64,
    tail: Option<TailLatency>,
    /// Every call and probe answered with this status.
    status: Option<u16>,
}

/// What the backends do while the load runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// All three answer; one has a heavy tail.
    Tail,
    /// As `Tail`, but the medium backend answers 503 at once to everything.
    Failure,
    /// Three regions of different distance, the nearest with a heavy tail,
    /// and the filter with nothing configured but the model's backends.
    Regions,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Tail => "tail",
            Phase::Failure => "failure",
            Phase::Regions => "regions",
        }
    }

    /// Share of calls, in percent, that ask a repeated prompt: the regions
    /// workload has its own, as filed (40 % repeated FAQ prompts).
    fn repeat_percent(self, options: &Options) -> u64 {
        match self {
            Phase::Regions => REGIONS_REPEAT_PERCENT,
            Phase::Tail | Phase::Failure => options.repeat_percent,
        }
    }

    fn backends(self, seed: u64) -> [Backend; 3] {
        let fast = Backend {
            name: "fast",
            delay_ms: 150,
            tail: None,
            status: None,
        };
        let medium = match self {
            Phase::Regions => return regions(seed),
            Phase::Tail => Backend {
                name: "medium",
                delay_ms: 400,
                ..fast
            },
            Phase::Failure => Backend {
                name: "medium",
                delay_ms: 0,
                status: Some(503),
                ..fast
            },
        };
        let tail = Backend {
            name: "tail",
            tail: Some(TailLatency {
                probability: 0.1,
                min_ms: 4000,
                max_ms: 6000,
                seed,
            }),
            ..fast
        };
        [fast, medium, tail]
    }
}

/// Repeated prompts of the regions workload, percent.
const REGIONS_REPEAT_PERCENT: u64 = 40;

/// Three regions about 210, 390 and 640 ms away; the nearest answers 12 %
/// of its calls only after 4 s. Its median is the best, its mean and tail
/// the worst: the backend a router must not fall for.
fn regions(seed: u64) -> [Backend; 3] {
    let near = Backend {
        name: "near",
        delay_ms: 210,
        tail: Some(TailLatency {
            probability: 0.12,
            min_ms: 4000,
            max_ms: 4500,
            seed,
        }),
        status: None,
    };
    let mid = Backend {
        name: "mid",
        delay_ms: 390,
        tail: None,
        ..near
    };
    let far = Backend {
        name: "far",
        delay_ms: 640,
        ..mid
    };
    [near, mid, far]
}

/// Who spreads the calls over the backends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    /// Plain Envoy: call n goes to backend n mod 3, named by the load
    /// generator in the header the route reads (equal weights, no randomness).
    Plain,
    /// Envoy with llm-filter routing the model over the three clusters.
    Filter,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Plain => "plain Envoy, even spread",
            Side::Filter => "llm-filter routing",
        }
    }

    /// The same Envoy on both sides but for the filter: a route on the cluster
    /// header ahead of the default one, as `envoy/envoy.yaml` has it.
    fn envoy(self, phase: Phase, mocks: &[MockUpstream]) -> EnvoyBuilder {
        let builder = match self {
            Side::Plain => EnvoyBuilder::new().no_filter(),
            Side::Filter => EnvoyBuilder::new().plugin_config(filter_config(phase, mocks)),
        };
        let mut builder = builder
            .concurrency(2)
            .header_route(CLUSTER_HEADER)
            .route_timeout_ms(ROUTE_TIMEOUT_MS)
            .virtual_host_yaml(VHOST);
        for mock in mocks {
            builder = builder.upstream(mock.name(), mock.port());
        }
        builder
    }
}

/// The model over every backend at equal base weight. The tail and failure
/// phases: cache and budgets on with their defaults, said explicitly,
/// failover on (its default) and hedging opted into for every priority, at
/// its default cap. The regions phase: nothing but the model's backends.
fn filter_config(phase: Phase, mocks: &[MockUpstream]) -> Value {
    let backends: Vec<Value> = mocks.iter().map(|m| json!({"cluster": m.name()})).collect();
    if phase == Phase::Regions {
        return json!({"routing": {"models": {MODEL: backends}}});
    }
    json!({
        "cache": {"enabled": true},
        "budget": {"enabled": true},
        "routing": {
            "models": {MODEL: backends},
            "hedge": {"priorities": ["P0", "P1", "P2"]},
        },
    })
}

/// SplitMix64's output for `state`: a stateless, seeded draw.
fn mix(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the calls ask, the same on both sides for one seed.
#[derive(Debug, Clone, Copy)]
struct Workload {
    seed: u64,
    /// Share of calls, in percent, drawn from the pool of repeated prompts.
    repeat_percent: u64,
}

impl Workload {
    /// The prompt of the n-th call: one of [`POOL`] repeated ones, or one no
    /// other call asks. Temperature 0 either way, so every call is cacheable.
    fn prompt(&self, n: usize) -> String {
        let draw = mix(self.seed ^ mix(n as u64));
        if draw % 100 < self.repeat_percent {
            let k = (draw >> 32) % POOL;
            format!("In two sentences, what does our refund policy say about case {k}?")
        } else {
            format!("In two sentences, summarise support ticket {n} for the on-call engineer.")
        }
    }

    fn body(&self, n: usize) -> Value {
        json!({
            "model": MODEL,
            "temperature": 0,
            "messages": [{"role": "user", "content": self.prompt(n)}],
        })
    }
}

/// One call as the client saw it.
#[derive(Debug, Clone, PartialEq)]
struct Call {
    latency_ms: f64,
    /// 0 when no response came (connection error, client timeout).
    status: u16,
    /// The mock that answered (`x-mock-instance`), else `x-llm-cluster`.
    backend: Option<String>,
    /// Answered by the filter's cache (`x-cache` `HIT`, `COALESCED`, `STALE`, `SEMANTIC`).
    from_cache: bool,
    /// `error.code` of an OpenAI-shaped error body (the filter's local replies).
    error_code: Option<String>,
}

impl Call {
    fn failed(&self) -> bool {
        !(200..300).contains(&self.status)
    }
}

/// Runs `concurrency` client loops, each sending its next call as soon as the
/// last one ended, until `calls` were sent or `deadline` passed. With `spread`,
/// call n names backend n mod len in the cluster header.
async fn drive(
    url: &str,
    workload: Workload,
    calls: usize,
    concurrency: usize,
    spread: Option<Vec<String>>,
    deadline: Instant,
) -> Vec<Call> {
    let client = http_client();
    let next = Arc::new(AtomicUsize::new(0));
    let spread = Arc::new(spread);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, next, spread, url) = (
            client.clone(),
            Arc::clone(&next),
            Arc::clone(&spread),
            url.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= calls || Instant::now() >= deadline {
                    return done;
                }
                let mut request = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(workload.body(n).to_string());
                if let Some(names) = spread.as_ref() {
                    if let Some(name) = names.get(n % names.len().max(1)) {
                        request = request.header(CLUSTER_HEADER, name.as_str());
                    }
                }
                done.push(call(request).await);
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        if let Ok(done) = task.await {
            all.extend(done);
        }
    }
    all
}

async fn call(request: reqwest::RequestBuilder) -> Call {
    let started = Instant::now();
    let (status, backend, from_cache, error_code) = match request.send().await {
        Ok(response) => {
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let backend =
                header(llm_filter_e2e::mock::HEADER_INSTANCE).or_else(|| header(CLUSTER_HEADER));
            let from_cache = matches!(
                header("x-cache").as_deref(),
                Some("HIT" | "COALESCED" | "STALE" | "SEMANTIC")
            );
            let status = response.status().as_u16();
            match response.bytes().await {
                Ok(body) => {
                    let error_code = serde_json::from_slice::<Value>(&body)
                        .ok()
                        .and_then(|v| v.pointer("/error/code")?.as_str().map(str::to_string));
                    (status, backend, from_cache, error_code)
                }
                Err(_) => (0, backend, false, None),
            }
        }
        Err(_) => (0, None, false, None),
    };
    Call {
        latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        status,
        backend,
        from_cache,
        error_code,
    }
}

/// The nearest-rank percentile `p` (0..=100) of ascending `sorted` values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.saturating_sub(1).min(last)).copied()
}

/// Latency and outcome of a set of calls.
#[derive(Debug, Clone, PartialEq, Default)]
struct Summary {
    calls: usize,
    p50_ms: Option<f64>,
    p90_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
    /// Calls that got no 2xx answer.
    errors: usize,
    from_cache: usize,
    /// Calls answered by each backend, by name.
    answered_by: BTreeMap<String, usize>,
}

impl Summary {
    fn of<'a>(calls: impl IntoIterator<Item = &'a Call>) -> Self {
        let mut summary = Summary::default();
        let mut latencies = Vec::new();
        for call in calls {
            summary.calls += 1;
            latencies.push(call.latency_ms);
            summary.errors += usize::from(call.failed());
            summary.from_cache += usize::from(call.from_cache);
            if let (Some(backend), false) = (&call.backend, call.from_cache || call.failed()) {
                *summary.answered_by.entry(backend.clone()).or_default() += 1;
            }
        }
        latencies.sort_by(f64::total_cmp);
        summary.p50_ms = percentile(&latencies, 50.0);
        summary.p90_ms = percentile(&latencies, 90.0);
        summary.p99_ms = percentile(&latencies, 99.0);
        summary.max_ms = latencies.last().copied();
        summary
    }
}

/// How the failed calls failed (status, and the error code when the body had
/// one; 0: no response) and how many failed so.
fn error_statuses(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut statuses = BTreeMap::new();
    for call in calls.iter().filter(|c| c.failed()) {
        let key = match &call.error_code {
            Some(code) => format!("{} {code}", call.status),
            None => call.status.to_string(),
        };
        *statuses.entry(key).or_default() += 1;
    }
    statuses
}

/// One side of one phase, measured.
#[derive(Debug, Clone)]
struct Run {
    phase: Phase,
    side: Side,
    /// Every call as the clients saw it.
    all: Summary,
    /// The calls that were not answered from the cache.
    upstream: Summary,
    /// Model calls each backend received, retries included, by backend order.
    upstream_calls: Vec<(String, usize)>,
    /// Envoy's retries and per-try timeouts over the three clusters.
    retries: u64,
    per_try_timeouts: u64,
    /// The filter's counters; `None` on the plain side.
    filter: Option<FilterCounters>,
    /// Whether the phase ended at `--max-phase-s` before every call was sent.
    capped: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct FilterCounters {
    ejections: u64,
    hedges: u64,
    failovers: u64,
}

impl FilterCounters {
    fn read(samples: &[prometheus::Sample]) -> Self {
        let counter = |name| prometheus::sum(samples, name, &[]) as u64;
        Self {
            ejections: counter(EJECTIONS),
            hedges: counter(HEDGES),
            failovers: counter(FAILOVERS),
        }
    }
}

struct Options {
    calls: usize,
    failure_calls: usize,
    concurrency: usize,
    seed: u64,
    repeat_percent: u64,
    max_phase_s: u64,
    only: Option<Only>,
}

/// What `--only` names: one phase of the tail workload, or the prefix one.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Only {
    Phase(Phase),
    Prefix,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        calls: 1200,
        failure_calls: 600,
        concurrency: 16,
        seed: 9,
        repeat_percent: 50,
        max_phase_s: 60,
        only: None,
    };
    for (flag, value) in cli::flag_values(args, USAGE)? {
        let number = || cli::parse::<u64>(&flag, &value, USAGE);
        let count = || cli::parse::<usize>(&flag, &value, USAGE);
        match flag.as_str() {
            "--calls" => options.calls = count()?,
            "--failure-calls" => options.failure_calls = count()?,
            "--concurrency" => options.concurrency = count()?.max(1),
            "--seed" => options.seed = number()?,
            "--repeat-percent" => options.repeat_percent = number()?.min(100),
            "--max-phase-s" => options.max_phase_s = number()?,
            "--only" => {
                options.only = Some(match value.as_str() {
                    "tail" => Only::Phase(Phase::Tail),
                    "failure" => Only::Phase(Phase::Failure),
                    "regions" => Only::Phase(Phase::Regions),
                    "prefix" => Only::Prefix,
                    _ => {
                        return Err(format!(
                            "--only {value}: tail, failure, regions or prefix\n{USAGE}"
                        ))
                    }
                })
            }
            _ => return Err(cli::unknown(&flag, USAGE)),
        }
    }
    Ok(options)
}

fn start_mock(backend: &Backend) -> Result<MockUpstream> {
    let mock = MockUpstream::try_start(MockConfig {
        default_delay_ms: backend.delay_ms,
        ..MockConfig::named(backend.name)
    })
    .with_context(|| format!("mock {}", backend.name))?;
    mock.set_tail_latency(backend.tail);
    mock.set_status(backend.status);
    Ok(mock)
}

/// Fresh mocks and a fresh Envoy, the load, then the counters.
async fn run_one(phase: Phase, side: Side, options: &Options) -> Result<Run> {
    let mocks = phase
        .backends(options.seed)
        .iter()
        .map(start_mock)
        .collect::<Result<Vec<_>>>()?;
    let envoy = side
        .envoy(phase, &mocks)
        .start()
        .context("envoy under test")?;
    let calls = match phase {
        Phase::Tail | Phase::Regions => options.calls,
        Phase::Failure => options.failure_calls,
    };
    let spread = match side {
        Side::Plain => Some(mocks.iter().map(|m| m.name().to_string()).collect()),
        Side::Filter => None,
    };
    let workload = Workload {
        seed: options.seed,
        repeat_percent: phase.repeat_percent(options),
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(options.max_phase_s);
    let url = envoy.url("/v1/chat/completions");
    let done = drive(&url, workload, calls, options.concurrency, spread, deadline).await;
    let elapsed = started.elapsed();
    // Envoy counts a stream when it logs it, just after its last byte.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run = measure(phase, side, &done, &mocks, &envoy, done.len() < calls);
    eprintln!(
        "bench-tail: {} / {}: {} calls in {:.1} s, failed by status {:?}",
        phase.name(),
        side.name(),
        done.len(),
        elapsed.as_secs_f64(),
        error_statuses(&done)
    );
    Ok(run)
}

fn measure(
    phase: Phase,
    side: Side,
    done: &[Call],
    mocks: &[MockUpstream],
    envoy: &Envoy,
    capped: bool,
) -> Run {
    let stats = envoy.stats().unwrap_or_default();
    let cluster_sum = |stat: &str| -> u64 {
        mocks
            .iter()
            .map(|m| {
                stats
                    .get(&format!("cluster.{}.{stat}", m.name()))
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    };
    Run {
        phase,
        side,
        all: Summary::of(done),
        upstream: Summary::of(done.iter().filter(|c| !c.from_cache)),
        upstream_calls: mocks
            .iter()
            .map(|m| {
                (
                    m.name().to_string(),
                    m.count("POST", "/v1/chat/completions"),
                )
            })
            .collect(),
        retries: cluster_sum("upstream_rq_retry"),
        per_try_timeouts: cluster_sum("upstream_rq_per_try_timeout"),
        filter: match side {
            Side::Plain => None,
            Side::Filter => Some(FilterCounters::read(&envoy.metrics())),
        },
        capped,
    }
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"))
}

fn slash_joined(values: impl IntoIterator<Item = String>) -> String {
    values.into_iter().collect::<Vec<_>>().join(" / ")
}

fn backend_names(runs: &[Run]) -> String {
    runs.first().map_or_else(String::new, |r| {
        slash_joined(r.upstream_calls.iter().map(|(name, _)| name.clone()))
    })
}

/// Two markdown tables: what the clients saw with the upstream and filter
/// counters, then the latency of the calls the cache did not answer.
fn tables(runs: &[Run], options: &Options) -> String {
    let names = backend_names(runs);
    let repeat = runs
        .first()
        .map_or(options.repeat_percent, |r| r.phase.repeat_percent(options));
    let mut out = format!(
        "\n{} clients in a closed loop, seed {}, {repeat} % of calls from a pool of {POOL} \
         repeated prompts\n\n",
        options.concurrency, options.seed
    );
    out.push_str(&format!(
        "| phase | side | calls | p50 ms | p90 ms | p99 ms | max ms | errors | from cache \
         | upstream calls {names} | Envoy retries | hedges | failovers |\n"
    ));
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let filter_cell = |run: &Run, read: fn(&FilterCounters) -> u64| {
        run.filter
            .as_ref()
            .map_or_else(|| "-".to_string(), |f| read(f).to_string())
    };
    for run in runs {
        let s = &run.all;
        out.push_str(&format!(
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            run.phase.name(),
            if run.capped { " (time cap)" } else { "" },
            run.side.name(),
            s.calls,
            ms(s.p50_ms),
            ms(s.p90_ms),
            ms(s.p99_ms),
            ms(s.max_ms),
            s.errors,
            s.from_cache,
            slash_joined(run.upstream_calls.iter().map(|(_, n)| n.to_string())),
            run.retries,
            filter_cell(run, |f| f.hedges),
            filter_cell(run, |f| f.failovers),
        ));
    }
    out.push_str(&format!(
        "\nCalls not answered from the cache:\n\n\
         | phase | side | calls | p50 ms | p90 ms | p99 ms | max ms | answered by {names} \
         | per-try timeouts | ejections |\n"
    ));
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for run in runs {
        let s = &run.upstream;
        let answered = slash_joined(run.upstream_calls.iter().map(|(name, _)| {
            s.answered_by
                .get(name)
                .copied()
                .unwrap_or_default()
                .to_string()
        }));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {answered} | {} | {} |\n",
            run.phase.name(),
            run.side.name(),
            s.calls,
            ms(s.p50_ms),
            ms(s.p90_ms),
            ms(s.p99_ms),
            ms(s.max_ms),
            run.per_try_timeouts,
            filter_cell(run, |f| f.ejections),
        ));
    }
    out
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-tail: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: &Options) -> Result<()> {
    let phases: Vec<Phase> = [Phase::Tail, Phase::Failure, Phase::Regions]
        .into_iter()
        .filter(|p| options.only.is_none_or(|only| only == Only::Phase(*p)))
        .collect();
    let mut runs = Vec::new();
    for phase in phases {
        for side in [Side::Plain, Side::Filter] {
            eprintln!("bench-tail: {} / {}", phase.name(), side.name());
            runs.push(run_one(phase, side, options).await?);
        }
    }
    let mut prefix_runs = Vec::new();
    if options.only.is_none_or(|only| only == Only::Prefix) {
        for side in [prefix::Side::Plain, prefix::Side::Filter] {
            let deadline = Duration::from_secs(options.max_phase_s);
            prefix_runs
                .push(prefix::run_one(side, options.seed, options.concurrency, deadline).await?);
        }
    }
    if runs.is_empty() && prefix_runs.is_empty() {
        bail!("nothing to run");
    }
    // The tail and failure phases share their backends; the regions have
    // their own, so their own tables.
    let (regions, others): (Vec<Run>, Vec<Run>) =
        runs.into_iter().partition(|r| r.phase == Phase::Regions);
    for group in [others, regions].iter().filter(|g| !g.is_empty()) {
        println!("{}", tables(group, options));
    }
    if !prefix_runs.is_empty() {
        println!(
            "{}",
            prefix::table(&prefix_runs, options.seed, options.concurrency)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(latency_ms: f64, status: u16, backend: &str, from_cache: bool) -> Call {
        Call {
            latency_ms,
            status,
            backend: Some(backend.to_string()),
            from_cache,
            error_code: None,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 90.0), Some(90.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 99.0), Some(10.0));
        assert_eq!(percentile(&ten, 50.0), Some(5.0));
        assert_eq!(percentile(&[7.0], 50.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0, 2.0], 150.0), Some(2.0));
    }

    #[test]
    fn a_summary_counts_errors_cache_and_who_answered() {
        let calls = vec![
            call(300.0, 200, "medium", false),
            call(100.0, 200, "fast", false),
            call(1.0, 200, "fast", true),
            call(5.0, 503, "medium", false),
            Call {
                latency_ms: 5000.0,
                status: 0,
                backend: None,
                from_cache: false,
                error_code: None,
            },
            Call {
                error_code: Some("llm_filter_upstream_timeout".into()),
                ..call(1000.0, 504, "tail", false)
            },
        ];
        let s = Summary::of(&calls);
        assert_eq!(s.calls, 6);
        assert_eq!(s.errors, 3);
        assert_eq!(s.from_cache, 1);
        assert_eq!(s.p50_ms, Some(100.0));
        assert_eq!(s.max_ms, Some(5000.0));
        // Errors and cache hits are nobody's answer.
        let answered: Vec<(&str, usize)> = s
            .answered_by
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(answered, vec![("fast", 1), ("medium", 1)]);
        let statuses: Vec<(String, usize)> = error_statuses(&calls).into_iter().collect();
        assert_eq!(
            statuses,
            vec![
                ("0".into(), 1),
                ("503".into(), 1),
                ("504 llm_filter_upstream_timeout".into(), 1)
            ]
        );

        let empty = Summary::of(&[]);
        assert_eq!((empty.calls, empty.p99_ms, empty.max_ms), (0, None, None));
        assert_eq!(ms(empty.p50_ms), "-");
    }

    #[test]
    fn the_workload_is_seeded_and_mixes_repeats_with_unique_prompts() {
        let workload = Workload {
            seed: 9,
            repeat_percent: 50,
        };
        let prompts: Vec<String> = (0..2000).map(|n| workload.prompt(n)).collect();
        assert_eq!(
            prompts,
            (0..2000).map(|n| workload.prompt(n)).collect::<Vec<_>>()
        );
        let repeated = prompts.iter().filter(|p| p.contains("refund")).count();
        assert!((900..1100).contains(&repeated), "{repeated}");
        let mut distinct_repeated: Vec<&String> =
            prompts.iter().filter(|p| p.contains("refund")).collect();
        distinct_repeated.sort();
        distinct_repeated.dedup();
        assert_eq!(distinct_repeated.len(), POOL as usize);
        let mut unique: Vec<&String> = prompts.iter().filter(|p| !p.contains("refund")).collect();
        let count = unique.len();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), count);
        assert_eq!(workload.body(3)["temperature"], 0);

        let other = Workload {
            seed: 10,
            ..workload
        };
        assert_ne!(
            prompts,
            (0..2000).map(|n| other.prompt(n)).collect::<Vec<_>>()
        );
        let none = Workload {
            repeat_percent: 0,
            ..workload
        };
        assert!((0..500).all(|n| !none.prompt(n).contains("refund")));
    }

    #[test]
    fn absent_filter_counters_read_zero() {
        let samples = prometheus::parse(
            "llm_filter_routing_ejections_total{llm_cluster=\"medium\"} 2\n\
             llm_filter_routing_ejections_total{llm_cluster=\"tail\"} 1\n",
        );
        assert_eq!(
            FilterCounters::read(&samples),
            FilterCounters {
                ejections: 3,
                hedges: 0,
                failovers: 0
            }
        );
    }

    #[test]
    fn only_the_failure_phase_fails_a_backend() {
        let tail = Phase::Tail.backends(1);
        assert!(tail.iter().all(|b| b.status.is_none()));
        assert_eq!(tail.iter().filter(|b| b.tail.is_some()).count(), 1);
        let failure = Phase::Failure.backends(1);
        assert_eq!(failure.iter().filter(|b| b.status == Some(503)).count(), 1);
        assert_eq!(failure[2], tail[2]);
    }

    #[test]
    fn parses_flags() {
        let args = |list: &[&str]| parse_args(list.iter().map(|s| s.to_string()));
        let o = args(&["--calls", "10", "--only", "failure", "--concurrency", "0"]).unwrap();
        assert_eq!(
            (o.calls, o.only, o.concurrency),
            (10, Some(Only::Phase(Phase::Failure)), 1)
        );
        assert_eq!(
            args(&["--only", "prefix"]).unwrap().only,
            Some(Only::Prefix)
        );
        assert!(args(&["--only", "both"]).is_err());
        assert!(args(&["--calls"]).is_err());
        assert!(args(&["--nope", "1"]).is_err());
    }

    #[test]
    fn tables_mark_the_plain_side_without_filter_counters() {
        let calls = [call(150.0, 200, "fast", false)];
        let run = |side, filter| Run {
            phase: Phase::Tail,
            side,
            all: Summary::of(&calls),
            upstream: Summary::of(&calls),
            upstream_calls: vec![("fast".into(), 1), ("medium".into(), 0), ("tail".into(), 0)],
            retries: 0,
            per_try_timeouts: 0,
            filter,
            capped: false,
        };
        let options = parse_args(Vec::new()).unwrap();
        let text = tables(
            &[
                run(Side::Plain, None),
                run(Side::Filter, Some(FilterCounters::default())),
            ],
            &options,
        );
        assert!(
            text.contains("upstream calls fast / medium / tail"),
            "{text}"
        );
        assert!(
            text.contains("| tail | plain Envoy, even spread | 1 | 150 | 150 | 150 | 150 | 0 | 0 | 1 / 0 / 0 | 0 | - | - |"),
            "{text}"
        );
        assert!(text.contains("| 1 / 0 / 0 | 0 | 0 | 0 |"), "{text}");
    }
}
