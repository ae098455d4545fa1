//! An `https://` front for a plain HTTP/1.1 server, as a cluster's load balancer is: a
//! private CA and a server certificate for `localhost` and 127.0.0.1 made at test time
//! (rcgen; never committed), served by tokio-rustls with ALPN `h2` and `http/1.1`. Each
//! request is passed on to the backend over a fresh HTTP/1.1 connection and its answer
//! streamed back as it comes; the HTTP version and `Authorization` each request arrived
//! with are recorded.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Version, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA, and a certificate it signed for `localhost` and 127.0.0.1 with that key.
pub struct Certs {
    /// The CA's certificate, PEM: what `SSL_CERT_FILE` points at to trust it.
    pub ca_pem: String,
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl Certs {
    /// A fresh CA named `ca_name` and its server certificate.
    pub fn new(ca_name: &str) -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "localhost");
        let cert = params.signed_by(&key, &ca).unwrap();
        Self { ca_pem: ca.pem(), cert: cert.der().clone(), key: PrivatePkcs8KeyDer::from(key.serialize_der()) }
    }
}

/// One request as the front got it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub version: Version,
    pub path: String,
    pub auth: Option<String>,
}

pub struct TlsFront {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    _server: super::loopback::Loopback,
}

type Body = BoxBody<Bytes, hyper::Error>;

impl TlsFront {
    /// Serves `certs`' server certificate on 127.0.0.1:0, in front of `backend` (host:port).
    pub fn start(certs: &Certs, backend: &str) -> Self {
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certs.cert.clone()], PrivateKeyDer::Pkcs8(certs.key.clone_key()))
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let backend: SocketAddr = backend.parse().expect("backend host:port");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let server = super::loopback::Loopback::start(move |tcp| {
            let (acceptor, log) = (acceptor.clone(), log.clone());
            async move {
                // A client that rejects the certificate ends here.
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                let svc = hyper::service::service_fn(move |req| pass_on(req, backend, log.clone()));
                let io = TokioIo::new(tls);
                let _ = if h2 {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new()).serve_connection(io, svc).await
                } else {
                    hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await
                };
            }
        });
        Self { port: server.port, seen, _server: server }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn pass_on(
    req: Request<Incoming>,
    backend: SocketAddr,
    log: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let auth = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    log.lock().unwrap().push(Seen { version: req.version(), path: path.clone(), auth });
    match send(req, backend, &path).await {
        Ok(resp) => Ok(resp.map(BodyExt::boxed)),
        Err(e) => {
            let body = Full::new(Bytes::from(format!("tls front: {e}"))).map_err(|never| match never {}).boxed();
            let mut r = Response::new(body);
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            Ok(r)
        }
    }
}

/// The request as HTTP/1.1 to the backend (origin-form URI, its own `Host`), the body
/// streamed both ways.
async fn send(
    req: Request<Incoming>,
    backend: SocketAddr,
    path: &str,
) -> Result<Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let tcp = tokio::net::TcpStream::connect(backend).await?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let (parts, body) = req.into_parts();
    let mut out = Request::builder().method(parts.method).uri(path).version(Version::HTTP_11);
    if let Some(h) = out.headers_mut() {
        *h = parts.headers;
        h.insert(header::HOST, backend.to_string().parse()?);
    }
    Ok(tx.send_request(out.body(body)?).await?)
}
