//! A long run (issue 14): mixed traffic at a fixed rate through Envoy with the
//! filter for a set time — cache hits, misses churning a small cache, streams,
//! scripted upstream failures, non-cacheable calls — over two backends of one
//! model, one of which flaps. It samples Envoy's resident memory and the
//! filter's shared data over time and fails when either keeps growing after
//! warm-up, or when the VM trapped.
// A tool of the test suite: a step that cannot run (a mock, Envoy, a client
// that does not start) ends the run, and `expect` says why. Indexing and
// `panic!` stay denied: malformed output is reported, not trapped on.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::panic, clippy::indexing_slicing))]

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use llm_filter_e2e::mock::{HEADER_INSTANCE, HEADER_RESET_AFTER_BYTES};
use llm_filter_e2e::{http_client, with_field, Envoy, EnvoyBuilder, MockConfig, MockUpstream};
use serde_json::{json, Value};

const USAGE: &str = "usage: soak [--duration-s N] [--rate N] [--sample-s N] [--tolerance-percent N]
  (or SOAK_DURATION_S, SOAK_RATE, SOAK_SAMPLE_S, SOAK_TOLERANCE_PERCENT)";

const MODEL: &str = "gpt-4o";
const CHAT: &str = "/v1/chat/completions";
const CLUSTER_HEADER: &str = "x-llm-cluster";
/// Cache slots: far fewer than the distinct prompts, so the cache churns.
const MAX_ENTRIES: u64 = 64;
/// Prompts repeated often enough to be hits.
const HOT_PROMPTS: u64 = 24;
/// Calls in flight beyond which a tick is skipped (and counted) rather than
/// piling up on a stalled Envoy.
const MAX_IN_FLIGHT: u64 = 256;
/// One backend fails every call for `FLAP_DOWN_S` of every `FLAP_PERIOD_S`.
const FLAP_PERIOD_S: u64 = 30;
const FLAP_DOWN_S: u64 = 10;
/// Below this, a growth of resident memory is noise (allocator slack).
const RSS_SLACK_KB: u64 = 4 * 1024;
/// What Envoy's log says when the VM trapped or a callback failed.
const TRAP_MARKERS: [&str; 3] = ["panicked", "wasm trap", "Function: proxy_on_"];
/// The shared-data gauges, when the filter exports them; else the cache's.
const SHARED_KEYS: &str = "wasmcustom.llm_filter_shared_data_keys";
const SHARED_BYTES: &str = "wasmcustom.llm_filter_shared_data_bytes";
const CACHE_ENTRIES: &str = "wasmcustom.llm_filter_cache_entries";
const CACHE_BYTES: &str = "wasmcustom.llm_filter_cache_bytes";

#[derive(Debug, Clone, Copy)]
struct Options {
    duration: Duration,
    rate: u64,
    sample: Duration,
    tolerance_percent: u64,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    };
    let mut duration_s = env("SOAK_DURATION_S", 600);
    let mut rate = env("SOAK_RATE", 25);
    let mut sample_s = env("SOAK_SAMPLE_S", 10);
    let mut tolerance_percent = env("SOAK_TOLERANCE_PERCENT", 10);
    let mut args = args.peekable();
    while let Some(flag) = args.next() {
        let target = match flag.as_str() {
            "--duration-s" => &mut duration_s,
            "--rate" => &mut rate,
            "--sample-s" => &mut sample_s,
            "--tolerance-percent" => &mut tolerance_percent,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        };
        *target = args
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{flag} needs a number\n{USAGE}"))?;
    }
    if duration_s == 0 || rate == 0 || sample_s == 0 || duration_s < 3 * sample_s {
        return Err(format!(
            "duration must hold at least three samples, rate and sample above 0\n{USAGE}"
        ));
    }
    Ok(Options {
        duration: Duration::from_secs(duration_s),
        rate,
        sample: Duration::from_secs(sample_s),
        tolerance_percent,
    })
}

/// What kind of call the n-th tick sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A repeated prompt: mostly a cache hit.
    Hit,
    /// A new prompt: a miss that pushes another entry out.
    Miss,
    /// A streamed call, repeated or new.
    Stream,
    /// The upstream fails it on purpose (status, or a reset mid-answer).
    Failure,
    /// Not cacheable (temperature 1).
    Uncached,
}

impl Kind {
    fn of(n: u64) -> Self {
        match mix(n) % 100 {
            0..=34 => Self::Hit,
            35..=59 => Self::Miss,
            60..=79 => Self::Stream,
            80..=89 => Self::Failure,
            _ => Self::Uncached,
        }
    }
}

/// SplitMix64: a stateless, seeded draw.
fn mix(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Counts of what the clients saw.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    ok: AtomicU64,
    /// Failures the traffic asked the upstream for.
    scripted: AtomicU64,
    /// Anything else: transport errors, 5xx nobody asked for.
    errors: AtomicU64,
    skipped: AtomicU64,
    in_flight: AtomicU64,
}

/// One call of the mix; returns whether the client got what it should.
async fn call(client: &reqwest::Client, url: &str, n: u64, kind: Kind) -> Outcome {
    let draw = mix(n ^ 0x5eed);
    let (body, headers): (Value, Vec<(&str, String)>) = match kind {
        Kind::Hit => (
            chat(&format!("hot {}", draw % HOT_PROMPTS), 0.0, false),
            vec![],
        ),
        Kind::Miss => (chat(&format!("cold {n}"), 0.0, false), vec![]),
        Kind::Stream => (
            chat(&format!("stream {}", draw % (2 * HOT_PROMPTS)), 0.0, true),
            vec![],
        ),
        Kind::Failure => {
            let header = match draw % 3 {
                0 => ("x-mock-status", "500".to_string()),
                1 => ("x-mock-status", "429".to_string()),
                _ => (HEADER_RESET_AFTER_BYTES, "40".to_string()),
            };
            (
                chat(&format!("failing {n}"), 0.0, draw.is_multiple_of(2)),
                vec![header],
            )
        }
        Kind::Uncached => (chat(&format!("warm {}", draw % 8), 1.0, false), vec![]),
    };
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in &headers {
        request = request.header(*k, v);
    }
    let response = match request.send().await {
        Ok(r) => r,
        Err(_) => return Outcome::Error,
    };
    let status = response.status().as_u16();
    let from_upstream = response.headers().contains_key(HEADER_INSTANCE);
    let whole = response.bytes().await.is_ok();
    match (kind, status) {
        (Kind::Failure, _) => Outcome::Scripted,
        (_, 200) if whole => Outcome::Ok,
        // The flapping backend's own failure, when no retry could hide it.
        (_, s) if s >= 500 && from_upstream => Outcome::Scripted,
        _ => Outcome::Error,
    }
}

enum Outcome {
    Ok,
    Scripted,
    Error,
}

fn chat(content: &str, temperature: f64, stream: bool) -> Value {
    let body = json!({
        "model": MODEL,
        "temperature": temperature,
        "messages": [{"role": "user", "content": content}],
    });
    if stream {
        let body = with_field(body, "stream", json!(true));
        with_field(body, "stream_options", json!({"include_usage": true}))
    } else {
        body
    }
}

/// One sample of the process and the filter.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_s: u64,
    sent: u64,
    errors: u64,
    rss_kb: u64,
    /// Shared-data keys and bytes, from the filter's gauges or, without them,
    /// the cache's (its slots are most of the shared data).
    shared_keys: u64,
    shared_bytes: u64,
}

fn rss_kb(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read status of {pid}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

/// Keys and bytes of shared data, and whether the filter's own gauges said so.
fn shared_data(envoy: &Envoy) -> (u64, u64, bool) {
    let stats = envoy.stats().unwrap_or_default();
    match (stats.get(SHARED_KEYS), stats.get(SHARED_BYTES)) {
        (Some(k), Some(b)) => (*k, *b, true),
        _ => (
            stats.get(CACHE_ENTRIES).copied().unwrap_or(0),
            stats.get(CACHE_BYTES).copied().unwrap_or(0),
            false,
        ),
    }
}

/// Whether a series keeps growing: the mean of its last third above the mean
/// of its middle third by more than `tolerance_percent` and `slack`.
fn grows(values: &[u64], tolerance_percent: u64, slack: u64) -> Option<(f64, f64)> {
    let third = values.len() / 3;
    if third == 0 {
        return None;
    }
    let mean = |s: &[u64]| s.iter().sum::<u64>() as f64 / s.len() as f64;
    let middle = mean(values.get(third..2 * third)?);
    let last = mean(values.get(values.len() - third..)?);
    let allowed = middle * (1.0 + tolerance_percent as f64 / 100.0) + slack as f64;
    (last > allowed).then_some((middle, last))
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
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: Options) -> Result<()> {
    let mut mock_config = MockConfig::named("steady");
    mock_config.chunk_delay_ms = 5;
    mock_config.default_delay_ms = 5;
    let steady = MockUpstream::start(mock_config.clone());
    mock_config.name = "flappy".to_string();
    let flappy = MockUpstream::start(mock_config);
    let config = json!({
        "cache": {"enabled": true, "max_entries": MAX_ENTRIES},
        "budget": {"enabled": true},
        "routing": {"models": {MODEL: [{"cluster": "steady"}, {"cluster": "flappy"}]}},
    });
    let envoy = EnvoyBuilder::new()
        .plugin_config(config)
        .concurrency(2)
        .header_route(CLUSTER_HEADER)
        .route_timeout_ms(30_000)
        .upstream("steady", steady.port())
        .upstream("flappy", flappy.port())
        .log_level("warning")
        .start()?;
    let pid = envoy.pid().context("envoy pid")?;
    let url = envoy.url(CHAT);
    eprintln!(
        "soak: {} s at {} calls/s, a sample every {} s, Envoy pid {pid}",
        options.duration.as_secs(),
        options.rate,
        options.sample.as_secs()
    );

    let tally = Arc::new(Tally::default());
    let client = http_client();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / options.rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_sample = started + options.sample;
    let mut samples = Vec::new();
    let mut gauges_seen = false;
    let mut n = 0u64;
    println!("| t (s) | calls | errors | Envoy RSS (MiB) | shared keys | shared bytes |");
    println!("|------:|------:|-------:|----------------:|------------:|-------------:|");
    while started.elapsed() < options.duration {
        ticker.tick().await;
        let elapsed_s = started.elapsed().as_secs();
        flappy
            .set_status((elapsed_s % FLAP_PERIOD_S >= FLAP_PERIOD_S - FLAP_DOWN_S).then_some(503));
        if Instant::now() >= next_sample {
            next_sample += options.sample;
            let (shared_keys, shared_bytes, gauges) = shared_data(&envoy);
            gauges_seen |= gauges;
            let sample = Sample {
                at_s: elapsed_s,
                sent: tally.sent.load(Ordering::Relaxed),
                errors: tally.errors.load(Ordering::Relaxed),
                rss_kb: rss_kb(pid)?,
                shared_keys,
                shared_bytes,
            };
            println!(
                "| {} | {} | {} | {:.1} | {} | {} |",
                sample.at_s,
                sample.sent,
                sample.errors,
                sample.rss_kb as f64 / 1024.0,
                sample.shared_keys,
                sample.shared_bytes
            );
            samples.push(sample);
        }
        if tally.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            tally.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        n += 1;
        let kind = Kind::of(n);
        let (tally, client, url) = (Arc::clone(&tally), client.clone(), url.clone());
        tally.sent.fetch_add(1, Ordering::Relaxed);
        tally.in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let counter = match call(&client, &url, n, kind).await {
                Outcome::Ok => &tally.ok,
                Outcome::Scripted => &tally.scripted,
                Outcome::Error => &tally.errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            tally.in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    flappy.set_status(None);
    let drain = Instant::now() + Duration::from_secs(35);
    while tally.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < drain {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let stats = envoy.stats().unwrap_or_default();
    let stat = |prefix: &str| -> u64 {
        stats
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    };
    println!();
    println!(
        "calls {} (ok {}, scripted failures {}, unexpected errors {}, skipped ticks {})",
        tally.sent.load(Ordering::Relaxed),
        tally.ok.load(Ordering::Relaxed),
        tally.scripted.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.skipped.load(Ordering::Relaxed),
    );
    println!(
        "filter: hits {}, misses {}, stored {}, evictions {}, internal errors {}, failovers {}, ejections {}",
        stat("wasmcustom.llm_filter_cache_lookups_totalresult=.=hit;.;"),
        stat("wasmcustom.llm_filter_cache_lookups_totalresult=.=miss;.;"),
        stat("wasmcustom.llm_filter_cache_stores_totalresult=.=stored;.;"),
        stat("wasmcustom.llm_filter_cache_evictions_total"),
        stat("wasmcustom.llm_filter_internal_errors_total"),
        stat("wasmcustom.llm_filter_routing_failovers_total"),
        stat("wasmcustom.llm_filter_routing_ejections_total"),
    );
    println!(
        "shared data measured by {}",
        if gauges_seen {
            "llm_filter_shared_data_keys/_bytes"
        } else {
            "the cache gauges (llm_filter_shared_data_* absent)"
        }
    );

    let mut failures = Vec::new();
    let log = envoy.log_contents();
    if let Some(line) = log
        .lines()
        .find(|l| TRAP_MARKERS.iter().any(|m| l.contains(m)))
    {
        failures.push(format!("the VM trapped: {line}"));
    }
    let series = |f: fn(&Sample) -> u64| samples.iter().map(f).collect::<Vec<u64>>();
    let tolerance = options.tolerance_percent;
    for (name, values, slack) in [
        ("Envoy RSS (kB)", series(|s| s.rss_kb), RSS_SLACK_KB),
        ("shared-data keys", series(|s| s.shared_keys), 0),
        ("shared-data bytes", series(|s| s.shared_bytes), 0),
    ] {
        match grows(&values, tolerance, slack) {
            Some((middle, last)) => failures.push(format!(
                "{name} keeps growing: {middle:.0} on average in the middle third, {last:.0} in the last"
            )),
            None => println!("{name}: steady after warm-up"),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    println!("soak: steady");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_grows_only_past_the_tolerance() {
        assert_eq!(grows(&[1, 2], 10, 0), None);
        assert_eq!(grows(&[50, 100, 100, 100, 100, 105], 10, 0), None);
        assert_eq!(
            grows(&[50, 100, 100, 100, 120, 130], 10, 0),
            Some((100.0, 125.0))
        );
        assert_eq!(grows(&[0, 0, 0, 0, 4, 4], 10, 5), None);
    }

    #[test]
    fn the_mix_has_every_kind() {
        let kinds: Vec<Kind> = (0..1000).map(Kind::of).collect();
        for kind in [
            Kind::Hit,
            Kind::Miss,
            Kind::Stream,
            Kind::Failure,
            Kind::Uncached,
        ] {
            let n = kinds.iter().filter(|k| **k == kind).count();
            assert!(n > 50, "{kind:?}: {n}");
        }
    }

    #[test]
    fn options_from_flags() {
        let o = parse_args(
            ["--duration-s", "90", "--rate", "5"]
                .map(String::from)
                .into_iter(),
        )
        .unwrap();
        assert_eq!((o.duration.as_secs(), o.rate), (90, 5));
        assert!(parse_args(["--duration-s", "5"].map(String::from).into_iter()).is_err());
        assert!(parse_args(["--nope"].map(String::from).into_iter()).is_err());
    }
}
