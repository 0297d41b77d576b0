//! A private OCI registry on loopback (Debian's `docker-registry`, which
//! `make tools-image` installs) holding the module's image as `make image`
//! built it, pushed unchanged by `make push`'s own script: what Istio's agent
//! pulls an `oci://` module from. Its access log tells what it served.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::daemon::free_port;
use crate::envoy::http_request;
use crate::workspace_root;

/// The image archives and their manifest digests, as `make image` writes
/// them: the full build's and the sidecar build's.
pub const IMAGE_ARCHIVE: &str = "target/image/llm-filter.oci.tar";
pub const SIDECAR_IMAGE_ARCHIVE: &str = "target/image/llm-filter-sidecar.oci.tar";

/// The full build's archive `make image` built, with the manifest digest it
/// printed (hex, no `sha256:`); `None` when it is not built.
pub fn image_archive() -> Option<(PathBuf, String)> {
    archive_at(IMAGE_ARCHIVE)
}

/// The sidecar build's archive, as [`image_archive`].
pub fn sidecar_image_archive() -> Option<(PathBuf, String)> {
    archive_at(SIDECAR_IMAGE_ARCHIVE)
}

fn archive_at(relative: &str) -> Option<(PathBuf, String)> {
    let archive = workspace_root().join(relative);
    let digest = std::fs::read_to_string(archive.with_extension("tar.digest")).ok()?;
    archive
        .is_file()
        .then(|| (archive, digest.trim().to_string()))
}

/// Whether the registry and the tools that push to it are on PATH.
pub fn registry_tools() -> Result<(), String> {
    for tool in ["docker-registry", "skopeo"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()));
        if !found {
            return Err(format!("no {tool} on PATH (make tools-image)"));
        }
    }
    Ok(())
}

/// A running registry; killed by pid and reaped on drop.
pub struct Registry {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
}

impl Registry {
    /// Starts one with its own storage on a free port of 127.0.0.1 and waits
    /// until `/v2/` answers.
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("llm-filter-e2e-registry-")
            .tempdir()?;
        let port = free_port()?;
        let storage = dir.path().join("storage");
        std::fs::create_dir(&storage)?;
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{ level: warn }}\nstorage:\n  filesystem: {{ rootdirectory: {} }}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                storage.display()
            ),
        )?;
        let log = File::create(dir.path().join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn docker-registry")?;
        let mut registry = Self {
            child: Some(child),
            dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = registry
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("docker-registry exited with {status}: {}", registry.log());
            }
            if http_request(registry.addr(), "GET", "/v2/").is_ok_and(|(s, _)| s == 200) {
                return Ok(registry);
            }
            if Instant::now() >= deadline {
                bail!("docker-registry not ready: {}", registry.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `127.0.0.1:<port>`, the host of its image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Pushes `archive` as `<host>/<name>` (`llm-filter:0.1.0`) with
    /// `scripts/image.sh push`, digests preserved, over plain HTTP.
    pub fn push(&self, archive: &Path, name: &str) -> Result<String> {
        let image = format!("{}/{name}", self.host());
        let out = Command::new(workspace_root().join("scripts/image.sh"))
            .arg("push")
            .arg(archive)
            .arg(&image)
            .args(["--quiet", "--dest-tls-verify=false"])
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .output()
            .context("run scripts/image.sh push")?;
        if !out.status.success() {
            bail!(
                "push {image}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(image)
    }

    /// The requests it answered, as its access log writes them
    /// (`GET /v2/llm-filter/manifests/0.1.0 HTTP/1.1" 200 ...`).
    pub fn requests(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| l.split_once("] \"").map(|(_, r)| r.to_string()))
            .collect()
    }

    /// Everything it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
