//! The HTTP client an upstream is reached with: hyper's pooled client over TCP, TLS by
//! rustls with the system's trusted roots (`https://`), HTTP/1.1, and HTTP/2 where TLS
//! negotiates it (ALPN). One per upstream, so its connect timeout and its connection
//! pool are its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How long an idle pooled connection is kept.
const IDLE: Duration = Duration::from_secs(60);

/// The system's trusted roots, read once: (roots, how many were found).
fn system_roots() -> (rustls::RootCertStore, usize) {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "a system CA certificate could not be read");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    (roots, added)
}

/// What to do about a TLS failure in `e`'s chain whose own text does not say it: rustls
/// words an untrusted certificate as `invalid peer certificate: UnknownIssuer`.
pub fn tls_hint(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)) = err.downcast_ref() {
            return Some(
                "the server's certificate is not signed by a CA this gateway trusts; for a private CA, point \
                 SSL_CERT_FILE at a PEM bundle that holds it",
            );
        }
        // rustls' error comes inside an io::Error inside another (tokio-rustls, then
        // hyper-rustls), and an io::Error's `source()` skips what it wraps.
        cur = match err.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            Some(inner) => Some(inner),
            None => err.source(),
        };
    }
    None
}

/// A client for one upstream. `tls`: it has an `https://` replica, so the system's roots
/// must be there.
pub fn build(connect_timeout: Duration, tls: bool) -> Result<HttpClient, String> {
    let roots = if tls {
        let (roots, n) = system_roots();
        if n == 0 {
            return Err("an https:// upstream needs the system's CA certificates, and none were found (install \
                        ca-certificates, or point SSL_CERT_FILE at a bundle)"
                .into());
        }
        roots
    } else {
        rustls::RootCertStore::empty()
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(connect_timeout));
    tcp.set_keepalive(Some(Duration::from_secs(30)));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_issuer_comes_with_what_to_do() {
        let bad = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, bad));
        assert!(tls_hint(&wrapped).is_some_and(|h| h.contains("SSL_CERT_FILE")));
        let other = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert_eq!(tls_hint(&other), None);
        assert_eq!(tls_hint(&std::io::Error::from(std::io::ErrorKind::ConnectionRefused)), None);
    }
}
