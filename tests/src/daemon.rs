//! A server the tests start from its real binary (Alertmanager, Prometheus):
//! a temp folder for its config and data, a free loopback port, its stderr in
//! a log, ready once `GET /-/ready` answers 200, killed by pid when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running server.
pub struct Daemon {
    name: &'static str,
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

/// A port of 127.0.0.1 nobody listens on now, for a child process to bind.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), from
/// 20000 up: a port the kernel hands out for `bind(0)` is also one it may
/// give the next outgoing connection's local end, which then holds it when
/// the child binds (istiod failed so, "address already in use"). Each call
/// moves on from a start that differs per process, so calls of one run
/// never get the same port and runs side by side rarely meet.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .min(u32::from(u16::MAX));
    if ephemeral > LOW + 1_000 {
        let span = ephemeral - LOW;
        let start = std::process::id().wrapping_mul(2_654_435_761) % span;
        for _ in 0..span {
            let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            let port = u16::try_from(LOW + offset).unwrap_or(u16::MAX);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Daemon {
    /// Starts `bin` on `port` with `--config.file=<dir>/<config_name>`
    /// holding `config` and the arguments `args` gives for its folder and
    /// port, and waits until it is ready.
    pub fn start(
        bin: &Path,
        name: &'static str,
        port: u16,
        (config_name, config): (&str, &str),
        args: impl FnOnce(&Path, u16) -> Vec<String>,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let config_path = dir.path().join(config_name);
        std::fs::write(&config_path, config)?;
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .args(args(dir.path(), port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log"))?)
            .spawn()
            .with_context(|| format!("spawn {name}"))?;
        let daemon = Self {
            name,
            child: Some(child),
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if status_of(&daemon.url("/-/ready")).is_ok_and(|s| s == 200) {
                return Ok(daemon);
            }
            if Instant::now() >= deadline {
                bail!("{name} not ready: {}", daemon.log_contents());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A URL of its API.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What it logged.
    pub fn log_contents(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        format!("{} log:\n{log}", self.name)
    }

    /// Kills it now; its port is free again once this returns.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The status of `GET http://host:port/path`, on a plain socket: the readiness
/// poll runs before any async runtime is needed.
fn status_of(url: &str) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    Ok(buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}
