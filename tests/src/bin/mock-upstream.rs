//! The mock LLM provider (OpenAI-compatible, Responses, Anthropic Messages) as a
//! process, for `make run` and manual tries.
// A tool of the test suite: a step that cannot run (a mock, Envoy, a client
// that does not start) ends the run, and `expect` says why. Indexing and
// `panic!` stay denied: malformed output is reported, not trapped on.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::panic, clippy::indexing_slicing))]

use std::process::ExitCode;

use llm_filter_e2e::cli;
use llm_filter_e2e::mock::{MockConfig, MockUpstream};

const USAGE: &str = "usage: mock-upstream [--port N] [--name NAME] [--latency-ms N] \
                     [--chunk-delay-ms N] [--host ADDR]";

fn parse_args() -> Result<MockConfig, String> {
    let mut config = MockConfig::default();
    for (flag, value) in cli::flag_values(std::env::args().skip(1), USAGE)? {
        match flag.as_str() {
            "--port" => config.port = cli::parse(&flag, &value, USAGE)?,
            "--name" => config.name = value,
            "--latency-ms" => config.default_delay_ms = cli::parse(&flag, &value, USAGE)?,
            "--chunk-delay-ms" => config.chunk_delay_ms = cli::parse(&flag, &value, USAGE)?,
            "--host" => config.host = cli::parse(&flag, &value, USAGE)?,
            _ => return Err(cli::unknown(&flag, USAGE)),
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
