//! The OTLP/HTTP receiver of the span scenarios: tests/otlp/receiver.py,
//! which decodes each export with the official opentelemetry-proto
//! definitions and writes it, one JSON line each, to a file read here.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use llm_filter_e2e::workspace_root;
use serde_json::Value;

use crate::support::sdk::python;

/// The receiver script, killed when dropped; its spans are read from its file.
pub struct Receiver {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    /// Starts it with the script's `args` (`--delay-s 3`: a slow collector).
    pub fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("spans.jsonl");
        let mut child = Command::new(python())
            .arg(workspace_root().join("tests/otlp/receiver.py"))
            .arg(&out)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the OTLP receiver (`make e2e` installs opentelemetry-proto)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the receiver's port");
        Self {
            child,
            port,
            out,
            _dir: dir,
        }
    }

    /// Every export received so far: each whole line the receiver wrote (a
    /// last line still being written is read next time).
    pub fn exports(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        whole
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Value> {
        self.exports()
            .iter()
            .flat_map(|e| e["spans"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Waits up to `within` for a span of `trace_id`.
    pub async fn span_of(&self, trace_id: &str, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.spans().into_iter().find(|s| s["trace_id"] == trace_id) {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
