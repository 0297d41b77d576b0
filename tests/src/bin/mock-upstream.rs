//! The mock OpenAI-compatible upstream as a process, for `make run` and manual tries.

use std::process::ExitCode;

use llm_filter_e2e::mock::{MockConfig, MockUpstream};

const USAGE: &str = "usage: mock-upstream [--port N] [--name NAME] [--latency-ms N] \
                     [--chunk-delay-ms N] [--host ADDR]";

fn parse_args() -> Result<MockConfig, String> {
    let mut config = MockConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_string());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}\n{USAGE}");
        match flag.as_str() {
            "--port" => config.port = value.parse().map_err(|e| bad(&e))?,
            "--name" => config.name = value.clone(),
            "--latency-ms" => config.default_delay_ms = value.parse().map_err(|e| bad(&e))?,
            "--chunk-delay-ms" => config.chunk_delay_ms = value.parse().map_err(|e| bad(&e))?,
            "--host" => config.host = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(config)
}

fn main() -> ExitCode {
    let config = match parse_args() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let mock = match MockUpstream::try_start(config) {
        Ok(mock) => mock,
        Err(e) => {
            eprintln!("mock-upstream: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("mock-upstream {} listening on {}", mock.name(), mock.addr());
    // Serves until the process is signalled; the default SIGINT/SIGTERM action ends it.
    loop {
        std::thread::park();
    }
}
