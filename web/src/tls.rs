//! HTTPS for `infer serve` (vLLM's `--ssl-certfile`, `--ssl-keyfile`, `--ssl-ca-certs`,
//! `--ssl-cert-reqs`, `--enable-ssl-refresh`), on rustls. The files are PEM, as uvicorn reads
//! them: a certificate chain (leaf first), its private key (PKCS#8, PKCS#1 or SEC1), and for
//! client certificates the CAs that sign them. With refresh on, the files are checked every
//! few seconds and a changed set is loaded for new connections; a set that does not load
//! keeps the old one (and says why).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;

/// A PEM file larger than this is refused before it is read: real chains and keys are a few
/// KiB, a CA bundle a few hundred.
const MAX_PEM_BYTES: u64 = 8 << 20;

/// How often `--enable-ssl-refresh` looks at the files' modification times.
const REFRESH_EVERY: Duration = Duration::from_secs(2);

/// Whether clients must show a certificate (uvicorn's `ssl_cert_reqs`, Python's
/// `ssl.CERT_NONE` = 0, `CERT_OPTIONAL` = 1, `CERT_REQUIRED` = 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientCerts {
    #[default]
    None,
    Optional,
    Required,
}

impl ClientCerts {
    /// vLLM's integer value.
    pub fn from_reqs(value: u8) -> Option<ClientCerts> {
        match value {
            0 => Some(ClientCerts::None),
            1 => Some(ClientCerts::Optional),
            2 => Some(ClientCerts::Required),
            _ => None,
        }
    }
}

/// The files and policy of the server's TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub certfile: PathBuf,
    pub keyfile: PathBuf,
    /// CAs whose client certificates are accepted; needed when `client_certs` is not `None`.
    pub ca_certs: Option<PathBuf>,
    pub client_certs: ClientCerts,
    /// Reload the files when they change.
    pub refresh: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, over the {MAX_PEM_BYTES}-byte limit for a PEM file")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no PEM private key (PKCS#8, PKCS#1 or SEC1) could be read: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("{path}: a certificate does not parse as PEM: {reason}")]
    BadCertificate { path: PathBuf, reason: String },
    #[error("--ssl-cert-reqs {reqs} asks for client certificates, which needs --ssl-ca-certs (the CAs that sign them)")]
    NoCaCerts { reqs: u8 },
    #[error("--ssl-ca-certs {path}: {reason}")]
    CaCerts { path: PathBuf, reason: String },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    let read = |source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read)?.len();
    if size > MAX_PEM_BYTES {
        return Err(TlsError::TooLarge {
            path: path.to_path_buf(),
            size,
        });
    }
    std::fs::read(path).map_err(read)
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCertificate {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Builds the rustls configuration the files describe (HTTP/1.1 over ALPN, as the server
/// speaks).
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&files.certfile)?;
    let key =
        PrivateKeyDer::from_pem_slice(&read_pem(&files.keyfile)?).map_err(|e| TlsError::Key {
            path: files.keyfile.clone(),
            reason: e.to_string(),
        })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (files.client_certs, &files.ca_certs) {
        (ClientCerts::None, _) => builder.with_no_client_auth(),
        (reqs, None) => return Err(TlsError::NoCaCerts { reqs: reqs as u8 }),
        (reqs, Some(path)) => {
            let ca_error = |reason: String| TlsError::CaCerts {
                path: path.clone(),
                reason,
            };
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path)? {
                roots.add(cert).map_err(|e| ca_error(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider);
            let verifier = if reqs == ClientCerts::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder
                .with_client_cert_verifier(verifier.build().map_err(|e| ca_error(e.to_string()))?)
        }
    };
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

/// The server's TLS: the configuration new connections get, replaced when refresh sees the
/// files change.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Loads the files (any error is the server's start-up error).
    pub fn load(files: TlsFiles) -> Result<Arc<Tls>, TlsError> {
        let config = Arc::new(server_config(&files)?);
        Ok(Arc::new(Tls {
            files,
            current: RwLock::new(config),
        }))
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        tokio_rustls::TlsAcceptor::from(config)
    }

    fn stamps(&self) -> Vec<Option<SystemTime>> {
        let f = &self.files;
        [Some(&f.certfile), Some(&f.keyfile), f.ca_certs.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }

    /// With `--enable-ssl-refresh`, a task that reloads the files when any of them changes;
    /// otherwise nothing.
    pub fn spawn_refresh(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        if !self.files.refresh {
            return None;
        }
        let tls = self.clone();
        Some(tokio::spawn(async move {
            let mut seen = tls.stamps();
            loop {
                tokio::time::sleep(REFRESH_EVERY).await;
                let now = tls.stamps();
                if now == seen {
                    continue;
                }
                // A writer may be midway (key renewed, certificate not yet): a set that does
                // not load is tried again at the next change, the old one serving meanwhile.
                seen = now;
                let files = tls.files.clone();
                match tokio::task::spawn_blocking(move || server_config(&files)).await {
                    Ok(Ok(config)) => {
                        if let Ok(mut current) = tls.current.write() {
                            *current = Arc::new(config);
                        }
                        tracing::info!(
                            "TLS certificate files changed: reloaded for new connections"
                        );
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "TLS files changed but do not load; keeping the previous ones")
                    }
                    Err(e) => tracing::warn!(error = %e, "TLS reload task failed"),
                }
            }
        }))
    }
}
