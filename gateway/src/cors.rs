//! Cross-origin access (CORS): off unless `--allow-origin` lists origins. The web UI is
//! served from the gateway's own origin and needs none of this; it is for a web app on
//! another origin (a dev server on `http://localhost:5173`, an extension) that calls the
//! API from the browser.
//!
//! - A request whose `Origin` is listed (exactly: scheme, host and port; no wildcards)
//!   gets `Access-Control-Allow-Origin` echoing that origin and `Vary: Origin`, and may
//!   change state (the guard lets it through). Nothing else gets CORS headers, so the
//!   browser keeps every answer from an unlisted page.
//! - A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) from a
//!   listed origin is answered 204 with the route's methods and the request headers
//!   asked for that the APIs use (`authorization`, `content-type`, `x-api-key`, the
//!   Anthropic and OpenAI SDK headers); from any other origin it is 403.
//! - No `Access-Control-Allow-Credentials`: the key travels in a header the page sets,
//!   never in a cookie.
//!
//! Pure decisions on plain values; `routes::handle` applies them.

use http::Method;

/// Request headers a listed origin may send (lower case), besides those starting with
/// `SDK_HEADER_PREFIX`.
const ALLOWED_HEADERS: [&str; 10] = [
    "authorization",
    "content-type",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "openai-organization",
    "openai-project",
    "openai-beta",
    "x-request-id",
];
/// The Stainless-generated SDKs (OpenAI's and Anthropic's) send `x-stainless-os`,
/// `x-stainless-retry-count`, … and the set grows with their versions.
const SDK_HEADER_PREFIX: &str = "x-stainless-";
/// Response headers a listed origin's script may read besides the safelisted ones.
pub const EXPOSED_HEADERS: &str = "retry-after, warning";
/// How long a browser may cache a preflight answer, in seconds.
pub const PREFLIGHT_MAX_AGE: &str = "600";

#[derive(Clone, Debug, Default)]
pub struct Cors {
    /// Listed origins, lower case, without a trailing `/`.
    origins: Vec<String>,
}

fn normalize(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Whether a request is a CORS preflight rather than a plain `OPTIONS`.
pub fn is_preflight(method: &Method, origin: Option<&str>, requested_method: Option<&str>) -> bool {
    method == Method::OPTIONS && origin.is_some() && requested_method.is_some()
}

impl Cors {
    /// From `--allow-origin` values: each `scheme://host[:port]`.
    pub fn new(origins: &[String]) -> Result<Self, String> {
        let mut out = Vec::new();
        for o in origins {
            let n = normalize(o);
            let Some((scheme, rest)) = n.split_once("://") else {
                return Err(format!(
                    "--allow-origin {o:?}: an origin is scheme://host[:port], e.g. http://localhost:5173"
                ));
            };
            if scheme.is_empty() || rest.is_empty() || rest.contains(['/', '*', '?', '#', ' ']) {
                return Err(format!(
                    "--allow-origin {o:?}: give an exact origin, scheme://host[:port] (no path, no wildcard)"
                ));
            }
            out.push(n);
        }
        Ok(Self { origins: out })
    }

    /// Whether any origin is listed (then every response varies by `Origin`).
    pub fn enabled(&self) -> bool {
        !self.origins.is_empty()
    }

    pub fn allows(&self, origin: &str) -> bool {
        let o = normalize(origin);
        self.origins.contains(&o)
    }

    /// The CORS headers of a response to a request from `origin`: `Vary: Origin` whenever
    /// any origin is listed, and the allow headers when this one is.
    pub fn response_headers(&self, origin: Option<&str>) -> Vec<(&'static str, String)> {
        if !self.enabled() {
            return Vec::new();
        }
        let mut h = vec![("vary", "Origin".to_owned())];
        if let Some(o) = origin.filter(|o| self.allows(o)) {
            h.push(("access-control-allow-origin", o.to_owned()));
            h.push(("access-control-expose-headers", EXPOSED_HEADERS.to_owned()));
        }
        h
    }

    /// The answer to a preflight from `origin` for a route taking `methods`, asking for
    /// `requested_headers` (`Access-Control-Request-Headers`): the headers of a 204 on top
    /// of `response_headers`, or `None` when the origin is not listed (403).
    pub fn preflight(
        &self,
        origin: &str,
        methods: &str,
        requested_headers: Option<&str>,
    ) -> Option<Vec<(&'static str, String)>> {
        if !self.allows(origin) {
            return None;
        }
        let allowed: Vec<String> = requested_headers
            .unwrap_or("")
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| ALLOWED_HEADERS.contains(&h.as_str()) || h.starts_with(SDK_HEADER_PREFIX))
            .collect();
        let mut h = vec![("access-control-allow-methods", methods.to_owned())];
        if !allowed.is_empty() {
            h.push(("access-control-allow-headers", allowed.join(", ")));
        }
        h.push(("access-control-max-age", PREFLIGHT_MAX_AGE.to_owned()));
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(list: &[&str]) -> Cors {
        Cors::new(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn get<'a>(h: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
        h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn off_without_a_list() {
        let c = cors(&[]);
        assert!(!c.enabled() && !c.allows("http://localhost:5173"));
        assert!(c.response_headers(Some("http://localhost:5173")).is_empty());
        assert!(c.preflight("http://localhost:5173", "POST", Some("authorization")).is_none());
    }

    #[test]
    fn a_listed_origin_is_echoed_exactly_and_others_get_nothing_but_vary() {
        let c = cors(&["http://localhost:5173", "https://App.Example/"]);
        let h = c.response_headers(Some("http://localhost:5173"));
        assert_eq!(get(&h, "access-control-allow-origin"), Some("http://localhost:5173"));
        assert_eq!(get(&h, "vary"), Some("Origin"));
        assert_eq!(
            get(&c.response_headers(Some("https://app.example")), "access-control-allow-origin"),
            Some("https://app.example")
        );
        for other in ["http://localhost:5174", "https://localhost:5173", "http://evil.example", "null", "*"] {
            let h = c.response_headers(Some(other));
            assert_eq!(get(&h, "access-control-allow-origin"), None, "{other}");
            assert_eq!(h.len(), 1, "only Vary for {other}");
        }
        assert_eq!(c.response_headers(None).len(), 1);
    }

    #[test]
    fn preflights_name_the_routes_methods_and_the_api_headers_asked_for() {
        let c = cors(&["http://localhost:5173"]);
        let asked = "Authorization, content-type, X-Stainless-OS, x-stainless-retry-count, anthropic-version, x-evil";
        let h = c.preflight("http://localhost:5173", "POST", Some(asked)).expect("listed");
        assert_eq!(get(&h, "access-control-allow-methods"), Some("POST"));
        assert_eq!(
            get(&h, "access-control-allow-headers"),
            Some("authorization, content-type, x-stainless-os, x-stainless-retry-count, anthropic-version")
        );
        assert_eq!(get(&h, "access-control-max-age"), Some(PREFLIGHT_MAX_AGE));
        assert!(c.preflight("http://evil.example", "POST", Some("authorization")).is_none());
        let bare = c.preflight("http://localhost:5173", "GET, DELETE", None).unwrap();
        assert_eq!(get(&bare, "access-control-allow-headers"), None);
    }

    #[test]
    fn only_exact_origins_are_accepted_as_flags() {
        for bad in ["localhost:5173", "http://*.example", "https://app.example/path", "http://", "://x"] {
            assert!(Cors::new(&[bad.to_owned()]).is_err(), "{bad}");
        }
        assert!(is_preflight(&Method::OPTIONS, Some("http://a"), Some("POST")));
        assert!(!is_preflight(&Method::OPTIONS, None, Some("POST")));
        assert!(!is_preflight(&Method::OPTIONS, Some("http://a"), None));
        assert!(!is_preflight(&Method::POST, Some("http://a"), Some("POST")));
    }
}
