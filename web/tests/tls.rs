//! HTTPS (vLLM's `--ssl-*` flags): the server speaks TLS with the given chain and key, serves
//! real requests over it and refuses plain HTTP; client certificates are asked for, checked
//! against `--ssl-ca-certs` or required; refresh serves a replaced certificate to new
//! connections; files that do not load are clear errors. Certificates are made by rcgen at
//! test time.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{start, KEY};
use infer_web::{ClientCerts, ServeOptions, Tls, TlsError, TlsFiles};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};

/// A CA that signs server and client certificates.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn new_ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let pem = params.self_signed(&key).unwrap().pem();
    Ca {
        pem,
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate signed by `ca`: (certificate PEM, key PEM).
fn leaf(ca: &Ca, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.extended_key_usages = vec![purpose];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn server_leaf(ca: &Ca) -> (String, String) {
    leaf(
        ca,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The server's files in `dir`, signed by `ca` (the chain is the leaf, then the CA).
fn server_files(dir: &Path, ca: &Ca) -> TlsFiles {
    let (cert, key) = server_leaf(ca);
    TlsFiles {
        certfile: write(dir, "cert.pem", &format!("{cert}{}", ca.pem)),
        keyfile: write(dir, "key.pem", &key),
        ca_certs: None,
        client_certs: ClientCerts::None,
        refresh: false,
    }
}

fn tls_server(files: TlsFiles) -> SocketAddr {
    let options = ServeOptions {
        tls: Some(Tls::load(files).unwrap()),
        ..ServeOptions::default()
    };
    start(4, 64, options, std::future::pending()).addr
}

/// One HTTPS request (HTTP/1.1, `Connection: close`) trusting `roots`, showing `client`'s
/// certificate if given: the status and body, or the error the connection ended with.
fn https(
    addr: SocketAddr,
    roots: &str,
    client: Option<&(String, String)>,
    request: &str,
) -> Result<(u16, String), String> {
    let mut store = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(roots.as_bytes()) {
        store.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    // A peer that closes without close_notify still gave a whole response: keep what came.
    if let Err(e) = tls.read_to_end(&mut reply) {
        if reply.is_empty() {
            return Err(e.to_string());
        }
    }
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {reply:?}"))?;
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

fn post(path: &str, body: &Value) -> String {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn https_serves_requests_and_refuses_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca("infer test CA");
    let addr = tls_server(server_files(dir.path(), &ca));

    assert_eq!(https(addr, &ca.pem, None, &get("/health")).unwrap().0, 200);
    let request = json!({"model": "smol", "prompt": "The capital of France is",
                         "max_tokens": 4, "temperature": 0});
    let (status, body) = https(addr, &ca.pem, None, &post("/v1/completions", &request)).unwrap();
    assert_eq!(status, 200, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["usage"]["completion_tokens"], 4, "{reply}");
    assert!(!reply["choices"][0]["text"].as_str().unwrap().is_empty());

    // A client that does not trust the CA stops at the handshake.
    let other = new_ca("another CA");
    let err = https(addr, &other.pem, None, &get("/health")).unwrap_err();
    assert!(err.contains("certificate"), "{err}");

    // Plain HTTP on the TLS port gets no HTTP reply.
    let plain = ureq::get(&format!("http://{addr}/health"))
        .timeout(Duration::from_secs(20))
        .call();
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");

    // The server is still fine after the failed handshakes.
    assert_eq!(https(addr, &ca.pem, None, &get("/health")).unwrap().0, 200);
}

#[test]
fn client_certificates_required_or_optional() {
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca("infer test CA");
    let client_ca = new_ca("client CA");
    let trusted = leaf(&client_ca, &["client"], ExtendedKeyUsagePurpose::ClientAuth);
    let stranger = leaf(
        &new_ca("stranger CA"),
        &["client"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let ca_certs = write(dir.path(), "clients.pem", &client_ca.pem);

    let mut files = server_files(dir.path(), &ca);
    files.ca_certs = Some(ca_certs.clone());
    files.client_certs = ClientCerts::Required;
    let required = tls_server(files.clone());
    assert_eq!(
        https(required, &ca.pem, Some(&trusted), &get("/health"))
            .unwrap()
            .0,
        200
    );
    let err = https(required, &ca.pem, None, &get("/health")).unwrap_err();
    assert!(!err.is_empty());
    assert!(https(required, &ca.pem, Some(&stranger), &get("/health")).is_err());

    files.client_certs = ClientCerts::Optional;
    let optional = tls_server(files);
    assert_eq!(
        https(optional, &ca.pem, None, &get("/health")).unwrap().0,
        200
    );
    assert_eq!(
        https(optional, &ca.pem, Some(&trusted), &get("/health"))
            .unwrap()
            .0,
        200
    );
    // A certificate shown must still be one the CAs signed.
    assert!(https(optional, &ca.pem, Some(&stranger), &get("/health")).is_err());
}

#[test]
fn refresh_serves_a_replaced_certificate_to_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let first = new_ca("first CA");
    let mut files = server_files(dir.path(), &first);
    files.refresh = true;
    let addr = tls_server(files.clone());
    assert_eq!(
        https(addr, &first.pem, None, &get("/health")).unwrap().0,
        200
    );

    // A half-written set (a key that is not PEM) keeps the old certificate in service.
    std::fs::write(&files.keyfile, "not a key").unwrap();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        https(addr, &first.pem, None, &get("/health")).unwrap().0,
        200
    );

    let second = new_ca("second CA");
    let (cert, key) = server_leaf(&second);
    std::fs::write(&files.keyfile, key).unwrap();
    std::fs::write(&files.certfile, format!("{cert}{}", second.pem)).unwrap();
    let t = Instant::now();
    loop {
        if let Ok((200, _)) = https(addr, &second.pem, None, &get("/health")) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the new certificate was not served"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(https(addr, &first.pem, None, &get("/health")).is_err());
}

#[test]
fn files_that_do_not_load_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca("infer test CA");
    let good = server_files(dir.path(), &ca);
    let load = |files: &TlsFiles| infer_web::tls::server_config(files).map(|_| ());
    assert!(load(&good).is_ok());

    let missing = TlsFiles {
        certfile: dir.path().join("absent.pem"),
        ..good.clone()
    };
    let e = load(&missing).unwrap_err();
    assert!(matches!(e, TlsError::Read { .. }), "{e}");
    assert!(e.to_string().contains("absent.pem"), "{e}");

    let not_pem = TlsFiles {
        certfile: write(dir.path(), "garbage.pem", "hello"),
        ..good.clone()
    };
    assert!(matches!(
        load(&not_pem).unwrap_err(),
        TlsError::NoCertificate { .. }
    ));

    let no_key = TlsFiles {
        keyfile: good.certfile.clone(),
        ..good.clone()
    };
    assert!(matches!(load(&no_key).unwrap_err(), TlsError::Key { .. }));

    // Another certificate's key: rustls checks that key and certificate match.
    let (_, other_key) = server_leaf(&ca);
    let mismatched = TlsFiles {
        keyfile: write(dir.path(), "other-key.pem", &other_key),
        ..good.clone()
    };
    let e = load(&mismatched).unwrap_err();
    assert!(matches!(e, TlsError::Config(_)), "{e}");

    let no_ca = TlsFiles {
        client_certs: ClientCerts::Required,
        ..good.clone()
    };
    let e = load(&no_ca).unwrap_err();
    assert!(e.to_string().contains("--ssl-ca-certs"), "{e}");

    let huge = dir.path().join("huge.pem");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let too_large = TlsFiles {
        certfile: huge,
        ..good
    };
    assert!(matches!(
        load(&too_large).unwrap_err(),
        TlsError::TooLarge { .. }
    ));
}
