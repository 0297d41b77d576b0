//! Measures what the filter costs on the data path: wrk drives an Envoy under test
//! (one worker) that proxies to a backend Envoy answering a fixed chat completion
//! itself, so the backend is never the bottleneck. Each scenario runs on a fresh
//! Envoy; the first one is the baseline the others are compared with.

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use llm_filter_e2e::{chat_body, post_json, Envoy, EnvoyBuilder};
use serde_json::json;

const USAGE: &str = "usage: bench [--duration SECS] [--warmup SECS] [--threads N] \
                     [--connections N] [--only NAME]...";

/// One measured setup: how to build the Envoy under test and what each request carries.
struct Scenario {
    /// Short name, shown in the table and selected by `--only`.
    name: &'static str,
    /// The Envoy under test, given the backend's port.
    envoy: fn(u16) -> EnvoyBuilder,
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
    /// The `x-cache` every measured request must get (checked on a second
    /// call after the first, which warms the cache).
    expect_cache: Option<&'static str>,
}

fn scenarios() -> Vec<Scenario> {
    let chat = chat_body("gpt-4o", "Say hello in one short sentence.").to_string();
    // Temperature 0: deterministic, so cacheable.
    let mut deterministic = chat_body("gpt-4o", "Say hello in one short sentence.");
    deterministic["temperature"] = json!(0);
    let mut streamed = deterministic.clone();
    streamed["stream"] = json!(true);
    let filter = |port| {
        EnvoyBuilder::new()
            .plugin_config("{}")
            .concurrency(1)
            .upstream("backend", port)
    };
    vec![
        Scenario {
            name: "plain",
            envoy: |port| {
                EnvoyBuilder::new()
                    .no_filter()
                    .concurrency(1)
                    .upstream("backend", port)
            },
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            // Traffic that is not an LLM call: what every other request of a
            // mesh pays for the filter being there.
            name: "filter-non-llm",
            envoy: filter,
            path: "/v1/other",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            name: "filter-tagging-only",
            envoy: |port| {
                EnvoyBuilder::new()
                    .plugin_config(r#"{"cache":{"enabled":false},"budget":{"enabled":false}}"#)
                    .concurrency(1)
                    .upstream("backend", port)
            },
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat.clone(),
            expect_cache: None,
        },
        Scenario {
            name: "filter-empty-config",
            envoy: filter,
            path: "/v1/chat/completions",
            headers: vec![],
            body: chat,
            expect_cache: Some("BYPASS"),
        },
        Scenario {
            name: "filter-cache-hit",
            envoy: filter,
            path: "/v1/chat/completions",
            headers: vec![],
            body: deterministic.to_string(),
            expect_cache: Some("HIT"),
        },
        Scenario {
            name: "filter-cache-hit-sse",
            envoy: filter,
            path: "/v1/chat/completions",
            headers: vec![],
            body: streamed.to_string(),
            expect_cache: Some("HIT"),
        },
    ]
}

/// The fixed answer of the backend.
fn backend_answer() -> String {
    json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-4o",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 14, "completion_tokens": 9, "total_tokens": 23},
    })
    .to_string()
}

struct Options {
    duration_s: u64,
    warmup_s: u64,
    threads: u32,
    connections: u32,
    only: Vec<String>,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        duration_s: 10,
        warmup_s: 2,
        threads: 2,
        connections: 32,
        only: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_string());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value}: {e}\n{USAGE}"))
        };
        match flag.as_str() {
            "--duration" => options.duration_s = number()?,
            "--warmup" => options.warmup_s = number()?,
            "--threads" => options.threads = number()?.try_into().map_err(|_| USAGE)?,
            "--connections" => options.connections = number()?.try_into().map_err(|_| USAGE)?,
            "--only" => options.only.push(value.clone()),
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(options)
}

/// What wrk reported for one run.
#[derive(Debug, Clone, PartialEq)]
struct WrkResult {
    requests_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests: u64,
    non_2xx: u64,
    socket_errors: u64,
}

/// A wrk duration (`812.00us`, `1.23ms`, `2.00s`, `1.00m`) in milliseconds.
fn parse_duration_ms(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match unit {
        "us" => 0.001,
        "ms" => 1.0,
        "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return None,
    };
    Some(number * factor)
}

/// Reads the numbers this bench needs out of `wrk --latency` output.
fn parse_wrk(output: &str) -> Result<WrkResult> {
    let mut requests_per_s = None;
    let mut p50_ms = None;
    let mut p99_ms = None;
    let mut requests = None;
    let mut non_2xx = 0;
    let mut socket_errors = 0;
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", value] => requests_per_s = value.parse().ok(),
            ["50%", value] => p50_ms = parse_duration_ms(value),
            ["99%", value] => p99_ms = parse_duration_ms(value),
            [count, "requests", "in", ..] => requests = count.parse().ok(),
            ["Non-2xx", "or", "3xx", "responses:", count] => non_2xx = count.parse()?,
            ["Socket", "errors:", rest @ ..] => {
                socket_errors = rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum();
            }
            _ => {}
        }
    }
    Ok(WrkResult {
        requests_per_s: requests_per_s.ok_or_else(|| anyhow!("no Requests/sec in wrk output"))?,
        p50_ms: p50_ms.ok_or_else(|| anyhow!("no 50% latency in wrk output"))?,
        p99_ms: p99_ms.ok_or_else(|| anyhow!("no 99% latency in wrk output"))?,
        requests: requests.ok_or_else(|| anyhow!("no request count in wrk output"))?,
        non_2xx,
        socket_errors,
    })
}

/// A Lua long-bracket string that cannot be closed by `text`.
fn lua_string(text: &str) -> String {
    let mut level = 0;
    while text.contains(&format!("]{}]", "=".repeat(level))) {
        level += 1;
    }
    let equals = "=".repeat(level);
    format!("[{equals}[{text}]{equals}]")
}

fn wrk_script(scenario: &Scenario) -> String {
    let mut script = String::from("wrk.method = \"POST\"\n");
    script.push_str(&format!("wrk.body = {}\n", lua_string(&scenario.body)));
    script.push_str("wrk.headers[\"content-type\"] = \"application/json\"\n");
    for (name, value) in &scenario.headers {
        script.push_str(&format!(
            "wrk.headers[{}] = {}\n",
            lua_string(name),
            lua_string(value)
        ));
    }
    script
}

fn wrk_bin() -> String {
    std::env::var("WRK_BIN").unwrap_or_else(|_| "wrk".to_string())
}

fn run_wrk(url: &str, script: &Path, options: &Options, duration_s: u64) -> Result<WrkResult> {
    let output = Command::new(wrk_bin())
        .arg(format!("-t{}", options.threads))
        .arg(format!("-c{}", options.connections))
        .arg(format!("-d{duration_s}s"))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .with_context(|| format!("run {} (is wrk installed?)", wrk_bin()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wrk failed ({}): {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    parse_wrk(&stdout).with_context(|| format!("wrk output:\n{stdout}"))
}

/// One request through the Envoy under test, so a broken setup fails loudly
/// instead of benchmarking error replies; a second one checks the cache's part
/// (the first one filled the entry the hit scenarios are served from).
async fn check(envoy: &Envoy, scenario: &Scenario) -> Result<()> {
    let body: serde_json::Value = serde_json::from_str(&scenario.body)?;
    let url = envoy.url(scenario.path);
    let response = post_json(&url, &body, &scenario.headers).await?;
    if response.status != 200 {
        bail!("check request got {}: {}", response.status, response.text());
    }
    if let Some(want) = scenario.expect_cache {
        let again = post_json(&url, &body, &scenario.headers).await?;
        let got = again.header("x-cache").unwrap_or("<none>");
        if again.status != 200 || got != want {
            bail!(
                "check request got {} with x-cache {got}, want 200 {want}",
                again.status
            );
        }
    }
    Ok(())
}

async fn run_scenario(
    scenario: &Scenario,
    backend_port: u16,
    options: &Options,
    dir: &Path,
) -> Result<WrkResult> {
    let envoy = (scenario.envoy)(backend_port).start()?;
    check(&envoy, scenario).await?;
    let script = dir.join(format!(
        "{}.lua",
        scenario
            .name
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    std::fs::write(&script, wrk_script(scenario))?;
    let url = envoy.url(scenario.path);
    if options.warmup_s > 0 {
        run_wrk(&url, &script, options, options.warmup_s)?;
    }
    run_wrk(&url, &script, options, options.duration_s)
}

fn ratio(value: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.2}", value / base)
    } else {
        "-".to_string()
    }
}

fn print_table(results: &[(&str, Result<WrkResult>)], options: &Options) {
    println!(
        "\nwrk -t{} -c{} -d{}s, proxy under test with 1 worker\n",
        options.threads, options.connections, options.duration_s
    );
    let base_name = results.first().map(|(name, _)| *name).unwrap_or("-");
    let base = results.first().and_then(|(_, r)| r.as_ref().ok());
    println!(
        "| scenario | req/s | p50 ms | p99 ms | non-2xx | socket errors | req/s vs {base_name} | p50 vs {base_name} | p99 vs {base_name} |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, result) in results {
        match result {
            Ok(r) => {
                let (rps, p50, p99) = match base {
                    Some(b) => (
                        ratio(r.requests_per_s, b.requests_per_s),
                        ratio(r.p50_ms, b.p50_ms),
                        ratio(r.p99_ms, b.p99_ms),
                    ),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                println!(
                    "| {name} | {:.0} | {:.3} | {:.3} | {} | {} | {rps} | {p50} | {p99} |",
                    r.requests_per_s, r.p50_ms, r.p99_ms, r.non_2xx, r.socket_errors
                );
            }
            Err(e) => println!(
                "| {name} | failed: {} | | | | | | | |",
                e.to_string().replace('\n', " ")
            ),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&options).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every selected scenario; returns whether all succeeded.
async fn run(options: &Options) -> Result<bool> {
    let dir = tempfile::Builder::new()
        .prefix("llm-filter-bench-")
        .tempdir()?;
    let backend = EnvoyBuilder::new()
        .no_filter()
        .concurrency(1)
        .direct_response(200, &backend_answer())
        .start()
        .context("backend envoy")?;
    let selected: Vec<Scenario> = scenarios()
        .into_iter()
        .filter(|s| options.only.is_empty() || options.only.iter().any(|o| o == s.name))
        .collect();
    if selected.is_empty() {
        bail!("no scenario matches --only {:?}", options.only);
    }
    let mut results = Vec::new();
    for scenario in &selected {
        eprintln!(
            "bench: {} ({}s warm-up, {}s measured)",
            scenario.name, options.warmup_s, options.duration_s
        );
        let result = run_scenario(scenario, backend.port(), options, dir.path()).await;
        if let Err(e) = &result {
            eprintln!("bench: {} failed: {e:#}", scenario.name);
        }
        results.push((scenario.name, result));
        // Let sockets of the finished run drain before the next one.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    print_table(&results, options);
    Ok(results.iter().all(|(_, r)| r.is_ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK_OUTPUT: &str = "Running 10s test @ http://127.0.0.1:4000/v1/chat/completions
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.52ms  812.33us  20.01ms   90.12%
    Req/Sec    10.80k     1.02k   12.34k    70.00%
  Latency Distribution
     50%  812.00us
     75%    1.64ms
     90%    2.30ms
     99%    1.20s
  215000 requests in 10.00s, 95.12MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:  21498.77
Transfer/sec:      9.51MB
";

    #[test]
    fn parses_wrk_latency_output() {
        let r = parse_wrk(WRK_OUTPUT).unwrap();
        assert_eq!(r.requests_per_s, 21498.77);
        assert!((r.p50_ms - 0.812).abs() < 1e-9);
        assert_eq!(r.p99_ms, 1200.0);
        assert_eq!(r.requests, 215_000);
        assert_eq!(r.non_2xx, 7);
        assert_eq!(r.socket_errors, 5);
    }

    #[test]
    fn rejects_output_without_numbers() {
        assert!(parse_wrk("unable to connect").is_err());
        assert_eq!(parse_duration_ms("3.5x"), None);
        assert_eq!(parse_duration_ms("ms"), None);
    }

    #[test]
    fn lua_strings_cannot_be_closed_early() {
        assert_eq!(lua_string("a"), "[[a]]");
        assert_eq!(lua_string("x]]y"), "[=[x]]y]=]");
        assert_eq!(lua_string("]]]=]"), "[==[]]]=]]==]");
    }

    #[test]
    fn scenario_names_are_unique() {
        let names: Vec<&str> = scenarios().iter().map(|s| s.name).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(names.len(), unique.len());
    }
}
