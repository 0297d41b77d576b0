//! A TLS upstream for tests: certificates made at test time (a CA and leaves
//! it signs, or self-signed ones) and a small TLS terminator that hands each
//! connection whose handshake completed to a plain backend (the mock), so a
//! test can tell a refused handshake (the backend saw nothing) from a served call.
//! And the other side of mutual TLS: client certificates with a URI SAN (a
//! workload's SPIFFE id) and a client that shows one to an Envoy listener.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName,
};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::HttpResponse;

/// A certificate authority made for one test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A server certificate and its key, PEM and DER.
pub struct ServerCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    key_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

/// A client certificate and its key, for a client that must show one.
pub struct ClientCert {
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    /// The CA certificate, PEM (what a client is told to trust).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA certificate into `dir`; its path.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join("test-ca.pem");
        std::fs::write(&path, self.pem()).context("write the CA")?;
        Ok(path)
    }

    /// A server certificate for the DNS names `names`, signed by this CA.
    pub fn issue(&self, names: &[&str]) -> Result<ServerCert> {
        let params = leaf_params(names)?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(ServerCert::new(&cert, &key))
    }

    /// A client certificate signed by this CA: with `uri` as its one URI SAN
    /// (a workload's SPIFFE id), or with `None` a DNS name and no URI SAN.
    pub fn issue_client(&self, uri: Option<&str>) -> Result<ClientCert> {
        let san = match uri {
            Some(uri) => SanType::URI(uri.try_into()?),
            None => SanType::DnsName("client.test".try_into()?),
        };
        let (cert, key) = self.sign(san)?;
        Ok(ClientCert {
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        })
    }

    /// A workload certificate as Istio's CA issues one: the SPIFFE id `uri`
    /// its one SAN, good for either end of mutual TLS.
    pub fn issue_workload(&self, uri: &str) -> Result<ServerCert> {
        let (cert, key) = self.sign(SanType::URI(uri.try_into()?))?;
        Ok(ServerCert::new(&cert, &key))
    }

    /// A leaf with `san` its one subject alternative name, signed by this CA.
    fn sign(&self, san: SanType) -> Result<(rcgen::Certificate, KeyPair)> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = vec![san];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok((cert, key))
    }
}

/// A server certificate for `names` that signs itself (no CA vouches for it).
pub fn self_signed(names: &[&str]) -> Result<ServerCert> {
    let params = leaf_params(names)?;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(ServerCert::new(&cert, &key))
}

fn leaf_params(names: &[&str]) -> Result<CertificateParams> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    Ok(CertificateParams::new(names)?)
}

impl ServerCert {
    fn new(cert: &rcgen::Certificate, key: &KeyPair) -> Self {
        Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }

    /// The private key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Writes the certificate and its key into `dir` as `<name>.pem` and
    /// `<name>-key.pem`; their paths (what an Envoy TLS context names).
    pub fn write(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}-key.pem"));
        std::fs::write(&cert, &self.cert_pem).context("write the certificate")?;
        std::fs::write(&key, &self.key_pem).context("write the key")?;
        Ok((cert, key))
    }
}

/// An HTTP/1.1 client over TLS that trusts one test CA and shows a client
/// certificate, or none: a workload calling a gateway that terminates mTLS.
pub struct MtlsClient {
    connector: TlsConnector,
}

impl MtlsClient {
    /// Trusts `ca` for the server and shows `cert` (`None`: no certificate).
    pub fn new(ca: &TestCa, cert: Option<&ClientCert>) -> Result<Self> {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert.der().clone()).context("trust the CA")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots);
        let config = match cert {
            Some(c) => builder
                .with_client_auth_cert(
                    vec![c.cert_der.clone()],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(c.key_der.clone())),
                )
                .context("client certificate")?,
            None => builder.with_no_client_auth(),
        };
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// POSTs `body` as JSON to `path` at `port` on 127.0.0.1 (the server
    /// named `server_name`), on a connection of its own.
    pub async fn post_json(
        &self,
        port: u16,
        server_name: &str,
        path: &str,
        body: &serde_json::Value,
        headers: &[(&str, &str)],
    ) -> Result<HttpResponse> {
        let started = std::time::Instant::now();
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        let name = ServerName::try_from(server_name.to_string())?;
        let tls = self.connector.connect(name, tcp).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        let driver = tokio::spawn(connection);
        let mut request = hyper::Request::post(path)
            .header("host", server_name)
            .header("content-type", "application/json");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request.body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| anyhow!("read the body: {e}"))?
            .to_bytes();
        driver.abort();
        Ok(HttpResponse {
            status,
            headers,
            body,
            elapsed: started.elapsed(),
        })
    }
}

/// A TLS listener on a free loopback port that forwards every connection
/// whose handshake completed to `backend`; stopped on drop.
pub struct TlsFront {
    addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TlsFront {
    /// Serves `cert` and forwards to `backend`.
    pub fn start(cert: &ServerCert, backend: SocketAddr) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.cert_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_der.clone())),
            )
            .context("server certificate")?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (handshakes, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (shutdown, stop) = oneshot::channel();
        let (ok, bad) = (Arc::clone(&handshakes), Arc::clone(&failed));
        let thread = std::thread::Builder::new()
            .name("tls-front".into())
            .spawn(move || {
                runtime.block_on(serve(listener, acceptor, backend, ok, bad, stop));
                runtime.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(Self {
            addr,
            handshakes,
            failed,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// Handshakes that failed (the client refused the certificate, e.g.).
    pub fn failed_handshakes(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    acceptor: TlsAcceptor,
    backend: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    mut stop: oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            a = listener.accept() => a,
        };
        let Ok((socket, _)) = accepted else {
            continue;
        };
        let (acceptor, handshakes, failed) = (
            acceptor.clone(),
            Arc::clone(&handshakes),
            Arc::clone(&failed),
        );
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(socket).await else {
                failed.fetch_add(1, Ordering::SeqCst);
                return;
            };
            handshakes.fetch_add(1, Ordering::SeqCst);
            let Ok(mut plain) = TcpStream::connect(backend).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
        });
    }
}
