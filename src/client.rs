//! Talking to a running gateway for the everyday verbs (`ps`, `stats`, `load`, `stop`):
//! where it is (`--url`, `CORRAL_URL`) and its API key if it has one (`--api-key`,
//! `CORRAL_API_KEY`, sent as a bearer token), one HTTP/1.1 exchange per call over hyper with a
//! deadline, and errors a person can act on — no gateway there, or the gateway's own
//! message for a refused request (an unknown model is its 404 `model_not_found`).

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use clap::Args;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

/// The most a gateway answer may be (`/stats` with many engines is a few KiB).
const MAX_BODY: usize = 16 << 20;

/// Where the gateway is.
#[derive(Args, Clone, Debug)]
pub struct Target {
    /// The running gateway's address (`http://host:port`, as `corral serve` printed it).
    #[arg(long, env = "CORRAL_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The gateway's API key, when it was started with one.
    #[arg(long, env = "CORRAL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl Target {
    pub fn gateway(&self) -> Result<Gateway> {
        let mut g = Gateway::new(&self.url)?;
        g.api_key = self.api_key.clone();
        Ok(g)
    }
}

/// A gateway address, checked once.
#[derive(Debug, PartialEq, Eq)]
pub struct Gateway {
    /// As the person wrote it, for messages.
    url: String,
    /// `host:port` to connect to, also sent as `Host` (the gateway checks it).
    authority: String,
    /// A path the gateway sits under (behind a reverse proxy), without a trailing `/`.
    prefix: String,
    /// Sent as `Authorization: Bearer …` when set.
    api_key: Option<String>,
}

impl Gateway {
    pub fn new(url: &str) -> Result<Self> {
        let uri: http::Uri = url.parse().with_context(|| format!("--url {url:?} is not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(s) => bail!("--url {url:?}: only http:// is supported, not {s}://"),
            None => bail!("--url {url:?} needs a scheme: http://{url}"),
        }
        let auth = uri.authority().ok_or_else(|| anyhow!("--url {url:?} has no host"))?;
        let authority = match auth.port_u16() {
            Some(_) => auth.as_str().to_owned(),
            None => format!("{}:80", auth.as_str()),
        };
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(Self { url: url.trim_end_matches('/').to_owned(), authority, prefix, api_key: None })
    }

    pub async fn get(&self, path: &str, timeout: Duration) -> Result<Bytes> {
        self.call(Method::GET, path, timeout).await
    }

    pub async fn post(&self, path: &str, timeout: Duration) -> Result<Bytes> {
        self.call(Method::POST, path, timeout).await
    }

    /// One request; a 2xx answer's body, or an error saying what went wrong.
    async fn call(&self, method: Method, path: &str, timeout: Duration) -> Result<Bytes> {
        let (status, body) = tokio::time::timeout(timeout, self.exchange(method, path))
            .await
            .map_err(|_| anyhow!("{} did not answer within {}", self.url, crate::human::duration(timeout)))??;
        if (200..300).contains(&status) { Ok(body) } else { Err(anyhow!(refusal(status, &body))) }
    }

    async fn exchange(&self, method: Method, path: &str) -> Result<(u16, Bytes)> {
        let stream = tokio::net::TcpStream::connect(&self.authority).await.map_err(|e| self.unreachable(&e))?;
        let (mut tx, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .with_context(|| format!("talking to {}", self.url))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "gateway connection ended");
            }
        });
        let mut req = Request::builder().method(method).uri(format!("{}{path}", self.prefix));
        req = req.header(header::HOST, &self.authority);
        if let Some(key) = &self.api_key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let req = req.body(Empty::new()).context("building the request")?;
        let resp = tx.send_request(req).await.with_context(|| format!("talking to {}", self.url))?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow!("reading the answer of {}: {e}", self.url))?
            .to_bytes();
        Ok((status, body))
    }

    fn unreachable(&self, e: &std::io::Error) -> anyhow::Error {
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            anyhow!("no corral at {}: connection refused — start it with `corral serve`", self.url)
        } else {
            anyhow!("no corral at {}: {e}", self.url)
        }
    }
}

/// What a refused request says: the gateway's own message (OpenAI's
/// `{"error":{"message"}}`), else the status and the start of the body.
pub fn refusal(status: u16, body: &[u8]) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned));
    match message {
        Some(m) => m,
        None => {
            let text = String::from_utf8_lossy(body);
            let text: String = text.trim().chars().take(200).collect();
            if text.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {text}") }
        }
    }
}

/// Run a verb's async part on a runtime of its own.
pub fn block_on<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?.block_on(fut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_an_http_host_and_port_and_may_carry_a_prefix() {
        let g = Gateway::new("http://127.0.0.1:8080").unwrap();
        assert_eq!((g.authority.as_str(), g.prefix.as_str()), ("127.0.0.1:8080", ""));
        let g = Gateway::new("http://localhost/corral/").unwrap();
        assert_eq!(
            (g.authority.as_str(), g.prefix.as_str(), g.url.as_str()),
            ("localhost:80", "/corral", "http://localhost/corral")
        );
        let g = Gateway::new("http://[::1]:9000").unwrap();
        assert_eq!(g.authority, "[::1]:9000");
        for (bad, says) in [
            ("https://example.com", "only http://"),
            ("127.0.0.1:8080", "needs a scheme"),
            ("http://", "not a URL"),
            ("not a url", "not a URL"),
        ] {
            let e = Gateway::new(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_refusal_is_the_gateways_message_when_it_has_one() {
        let body = br#"{"error":{"message":"model 'x' not found; known: smol","type":"invalid_request_error","code":"model_not_found"}}"#;
        assert_eq!(refusal(404, body), "model 'x' not found; known: smol");
        assert_eq!(refusal(502, b"Bad Gateway\n"), "HTTP 502: Bad Gateway");
        assert_eq!(refusal(500, b""), "HTTP 500");
        assert_eq!(refusal(500, &[b'x'; 500]).len(), "HTTP 500: ".len() + 200);
    }
}
