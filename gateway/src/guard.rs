//! Who may talk to the gateway. Any web page the user opens can send requests to a
//! server on localhost: through DNS rebinding (a name the page controls, resolved to
//! 127.0.0.1, so the browser sends that name as the Host) or as a plain cross-site form
//! or fetch POST (CORS hides the answer, not the side effect). So:
//! - the Host header must name this server: `localhost`, `127.0.0.1` or `[::1]` (or the
//!   address it is bound to, or a name given with `--allow-host`), with this server's
//!   port if it has one; anything else is 403 `host_not_allowed`, no Host at all 400
//!   `missing_host`;
//! - a request that can change state (any method but GET, HEAD and OPTIONS) that a
//!   browser marked with an `Origin` must come from this server's own origin or one
//!   listed with `--allow-origin` (`cors.rs`); anything else is 403
//!   `origin_not_allowed`. Clients that send no Origin (SDKs, curl) pass.
//!
//! Pure decisions on plain values; `routes::handle` applies them before any handler.

use std::net::{IpAddr, SocketAddr};

use http::Method;

use crate::cors::Cors;

#[derive(Clone, Debug)]
pub struct Guard {
    port: u16,
    /// Host names allowed besides the loopback ones, lower-cased.
    hosts: Vec<String>,
    /// Other origins allowed (`--allow-origin`), which also get CORS headers.
    cors: Cors,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    MissingHost,
    HostNotAllowed(String),
    OriginNotAllowed(String),
}

const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// `name[:port]` → (lower-cased name, port); an IPv6 literal keeps its brackets.
fn split_host(h: &str) -> Option<(String, Option<u16>)> {
    let h = h.trim();
    let (name, port) = match h.rfind(':') {
        Some(i) if !h[i..].contains(']') => (&h[..i], Some(h[i + 1..].parse().ok()?)),
        _ => (h, None),
    };
    (!name.is_empty()).then(|| (name.to_ascii_lowercase(), port))
}

impl Guard {
    /// For a gateway bound to `addr`, also allowing `extra` host names and `cors`'s
    /// origins.
    pub fn new(addr: SocketAddr, extra: &[String], cors: Cors) -> Self {
        let mut hosts: Vec<String> = extra.iter().map(|h| h.trim().to_ascii_lowercase()).collect();
        match addr.ip() {
            ip if ip.is_unspecified() || ip.is_loopback() => {}
            IpAddr::V4(v4) => hosts.push(v4.to_string()),
            IpAddr::V6(v6) => hosts.push(format!("[{v6}]")),
        }
        Self { port: addr.port(), hosts, cors }
    }

    pub fn cors(&self) -> &Cors {
        &self.cors
    }

    /// Whether `host` (a Host header's value, or an origin's host part) names us.
    fn ours(&self, host: &str) -> bool {
        let Some((name, port)) = split_host(host) else { return false };
        let named = LOOPBACK.contains(&name.as_str()) || self.hosts.contains(&name);
        named && port.is_none_or(|p| p == self.port)
    }

    pub fn check(&self, method: &Method, host: Option<&str>, origin: Option<&str>) -> Verdict {
        let Some(host) = host else { return Verdict::MissingHost };
        if !self.ours(host) {
            return Verdict::HostNotAllowed(host.to_owned());
        }
        let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        match origin {
            Some(o) if !safe && !o.strip_prefix("http://").is_some_and(|h| self.ours(h)) && !self.cors.allows(o) => {
                Verdict::OriginNotAllowed(o.to_owned())
            }
            _ => Verdict::Pass,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(addr: &str, extra: &[&str]) -> Guard {
        Guard::new(
            addr.parse().expect("addr"),
            &extra.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            Cors::default(),
        )
    }

    #[test]
    fn loopback_names_with_our_port_pass_and_others_are_refused() {
        let g = guard("127.0.0.1:8080", &[]);
        for h in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "LOCALHOST:8080"] {
            assert_eq!(g.check(&Method::POST, Some(h), None), Verdict::Pass, "{h}");
        }
        for h in ["evil.example:8080", "localhost:8081", "evil.example", "127.0.0.1.nip.io:8080", "", "[::2]"] {
            assert_eq!(g.check(&Method::GET, Some(h), None), Verdict::HostNotAllowed(h.into()), "{h}");
        }
        assert_eq!(g.check(&Method::GET, None, None), Verdict::MissingHost);
        // A name without a port (a browser leaves out only 80; other clients may) passes.
        assert_eq!(g.check(&Method::GET, Some("localhost"), None), Verdict::Pass);
        assert_eq!(g.check(&Method::GET, Some("[::1]"), None), Verdict::Pass);
    }

    #[test]
    fn allowed_and_bound_names_pass() {
        let g = guard("0.0.0.0:9000", &["box.lan"]);
        assert_eq!(g.check(&Method::GET, Some("Box.LAN:9000"), None), Verdict::Pass);
        assert!(matches!(g.check(&Method::GET, Some("0.0.0.0:9000"), None), Verdict::HostNotAllowed(_)));
        let g = guard("192.168.1.5:9000", &[]);
        assert_eq!(g.check(&Method::GET, Some("192.168.1.5:9000"), None), Verdict::Pass);
        assert_eq!(guard("[fe80::1]:9000", &[]).check(&Method::GET, Some("[fe80::1]:9000"), None), Verdict::Pass);
    }

    #[test]
    fn state_changing_requests_from_a_foreign_origin_are_refused() {
        let g = guard("127.0.0.1:8080", &[]);
        let h = Some("127.0.0.1:8080");
        assert_eq!(g.check(&Method::POST, h, Some("http://127.0.0.1:8080")), Verdict::Pass);
        assert_eq!(g.check(&Method::DELETE, h, Some("http://localhost:8080")), Verdict::Pass);
        for o in ["https://evil.example", "null", "http://localhost:3000", "https://127.0.0.1:8080"] {
            assert_eq!(g.check(&Method::POST, h, Some(o)), Verdict::OriginNotAllowed(o.into()), "{o}");
        }
        assert_eq!(g.check(&Method::GET, h, Some("https://evil.example")), Verdict::Pass, "reads are not refused");
        assert_eq!(g.check(&Method::POST, h, None), Verdict::Pass, "no Origin: not a browser");
    }

    #[test]
    fn origins_listed_for_cors_may_change_state_too() {
        let cors = Cors::new(&["http://localhost:5173".to_owned()]).unwrap();
        let g = Guard::new("127.0.0.1:8080".parse().unwrap(), &[], cors);
        let h = Some("127.0.0.1:8080");
        assert_eq!(g.check(&Method::POST, h, Some("http://localhost:5173")), Verdict::Pass);
        let o = "http://localhost:5174";
        assert_eq!(g.check(&Method::POST, h, Some(o)), Verdict::OriginNotAllowed(o.into()));
    }
}
