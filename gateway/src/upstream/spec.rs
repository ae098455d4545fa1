//! What an upstream is, as configured: its id, one base URL per replica, the name the
//! upstream knows the model by, where its API key comes from, its timeouts and the APIs
//! it serves. Parsed here from plain text (the `--upstream ID=URL[,URL…]` flag, the URLs
//! of a `[models.<id>]` table); nothing here does I/O.

use std::fmt;
use std::time::Duration;

use corral_protocol::ModelId;
use http::Uri;
use http::uri::{Authority, Scheme};

/// Defaults of the timeouts a `[models.<id>]` table may set.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(10);

/// One replica's address: scheme, host and port, and a path prefix the API paths go
/// under (`http://h:8000` and `http://h:8000/v1` both mean the server whose chat API is
/// `http://h:8000/v1/chat/completions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    scheme: Scheme,
    authority: Authority,
    /// Without a trailing `/`, without a final `/v1`; empty for the root.
    prefix: String,
}

impl Base {
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.trim().parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| format!("{url:?} has no scheme (http:// or https://)"))?;
        if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
            return Err(format!("{url:?}: only http:// and https:// upstreams are served"));
        }
        let authority = uri.authority().cloned().ok_or_else(|| format!("{url:?} has no host"))?;
        if authority.as_str().contains('@') {
            // Not echoed: the URL holds a secret.
            return Err("a replica URL must not hold credentials (user:password@…); name the key's environment \
                        variable with api-key-env in the config file"
                .into());
        }
        if uri.query().is_some() {
            return Err(format!("{url:?}: a base URL takes no query"));
        }
        let path = uri.path().trim_end_matches('/');
        let prefix = path.strip_suffix("/v1").unwrap_or(path).to_owned();
        Ok(Self { scheme, authority, prefix })
    }

    /// The URI of an API path (`/v1/chat/completions`, with its query) on this replica.
    pub fn uri(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{path_and_query}", self.prefix))
            .build()
    }

    pub fn is_https(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }
}

impl fmt::Display for Base {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.prefix)
    }
}

/// The APIs a request can reach an upstream through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
    /// `/v1/messages` and `/v1/messages/count_tokens`
    Messages,
    /// `/v1/responses`
    Responses,
    /// corral's `/apply-template`
    ApplyTemplate,
}

impl Api {
    pub const ALL: [Api; 5] = [Api::Chat, Api::Completions, Api::Messages, Api::Responses, Api::ApplyTemplate];

    /// The name in the config file's `apis` list.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Messages => "messages",
            Api::Responses => "responses",
            Api::ApplyTemplate => "apply-template",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        Api::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Api::ALL.iter().map(|a| a.name()).collect();
            format!("unknown API {s:?} (known: {})", names.join(", "))
        })
    }

    /// What a person reads in an error.
    pub fn describe(self) -> &'static str {
        match self {
            Api::Chat => "OpenAI chat completions",
            Api::Completions => "OpenAI completions",
            Api::Messages => "Anthropic Messages (/v1/messages)",
            Api::Responses => "OpenAI Responses (/v1/responses)",
            Api::ApplyTemplate => "/apply-template",
        }
    }
}

/// One upstream model.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    pub id: ModelId,
    /// Other names requests may use for it.
    pub aliases: Vec<String>,
    pub replicas: Vec<Base>,
    /// The upstream's own name for the model (`None`: the id). Requests are sent with
    /// `model` set to it.
    pub upstream_model: Option<String>,
    /// The environment variable holding the upstream's API key (sent as a bearer
    /// token). Only the name is kept here; the key is read once at start.
    pub api_key_env: Option<String>,
    pub connect_timeout: Duration,
    /// No response head within this: 504 (`None`: the gateway's `--engine-timeout`).
    pub timeout: Option<Duration>,
    pub health_interval: Duration,
    /// The APIs it serves (`None`: what its `/v1/models` card reports, else chat and
    /// completions).
    pub apis: Option<Vec<Api>>,
}

impl fmt::Debug for UpstreamSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.replicas.iter().map(Base::to_string).collect();
        f.debug_struct("UpstreamSpec")
            .field("id", &self.id.as_str())
            .field("replicas", &urls)
            .field("upstream_model", &self.upstream_model)
            .field("api_key_env", &self.api_key_env)
            .finish_non_exhaustive()
    }
}

impl UpstreamSpec {
    /// An upstream with every setting at its default.
    pub fn new(id: ModelId, replicas: Vec<Base>) -> Self {
        Self {
            id,
            aliases: Vec::new(),
            replicas,
            upstream_model: None,
            api_key_env: None,
            connect_timeout: CONNECT_TIMEOUT,
            timeout: None,
            health_interval: HEALTH_INTERVAL,
            apis: None,
        }
    }

    /// `ID=URL[,URL…]`, the `--upstream` flag.
    pub fn parse_flag(s: &str) -> Result<Self, String> {
        let (id, urls) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected ID=URL[,URL…]"))?;
        let id = ModelId::new(id.trim()).map_err(|e| format!("{s:?}: {e}"))?;
        Ok(Self::new(id, parse_urls(urls.split(','))?))
    }

    /// The name sent upstream in `model`.
    pub fn remote_name(&self) -> &str {
        self.upstream_model.as_deref().unwrap_or(self.id.as_str())
    }
}

/// One or more replica URLs, none twice.
pub fn parse_urls<'a>(urls: impl IntoIterator<Item = &'a str>) -> Result<Vec<Base>, String> {
    let mut out: Vec<Base> = Vec::new();
    for u in urls.into_iter().map(str::trim).filter(|u| !u.is_empty()) {
        let b = Base::parse(u)?;
        if out.contains(&b) {
            return Err(format!("replica {b} is given twice"));
        }
        out.push(b);
    }
    if out.is_empty() {
        return Err("an upstream needs at least one URL".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_is_the_server_root_with_or_without_v1() {
        let b = Base::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!(b.uri("/v1/chat/completions").unwrap(), "http://127.0.0.1:8000/v1/chat/completions");
        assert_eq!(b.to_string(), "http://127.0.0.1:8000");
        let v1 = Base::parse("https://api.example.com/v1/").unwrap();
        assert_eq!(v1.uri("/v1/models").unwrap(), "https://api.example.com/v1/models");
        assert!(v1.is_https() && !b.is_https());
        let nested = Base::parse("http://gw:80/team-a/v1").unwrap();
        assert_eq!(nested.uri("/v1/completions?x=1").unwrap(), "http://gw:80/team-a/v1/completions?x=1");
        assert_eq!(nested.to_string(), "http://gw:80/team-a");
    }

    #[test]
    fn bad_urls_are_refused_with_a_reason() {
        for (url, why) in [
            ("127.0.0.1:8000", "scheme"),
            ("ftp://h/", "only http"),
            ("http://user:secret@h:1", "credentials"),
            ("http://h:1/?a=b", "query"),
            ("not a url", "not a URL"),
        ] {
            let e = Base::parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
        assert!(!Base::parse("http://user:secret@h:1").unwrap_err().contains("secret"), "not echoed");
    }

    #[test]
    fn the_flag_takes_an_id_and_its_replicas() {
        let s = UpstreamSpec::parse_flag("big=http://a:8000, http://b:8000/v1").unwrap();
        assert_eq!(s.id.as_str(), "big");
        assert_eq!(s.replicas.iter().map(Base::to_string).collect::<Vec<_>>(), ["http://a:8000", "http://b:8000"]);
        assert_eq!((s.remote_name(), s.connect_timeout, s.apis.as_ref()), ("big", CONNECT_TIMEOUT, None));
        assert!(UpstreamSpec::parse_flag("http://a:8000").unwrap_err().contains("ID=URL"));
        assert!(UpstreamSpec::parse_flag("a/b=http://a").is_err(), "ids are validated");
        assert!(UpstreamSpec::parse_flag("x=").unwrap_err().contains("at least one"));
        assert!(UpstreamSpec::parse_flag("x=http://a,http://a/v1").unwrap_err().contains("twice"));
    }

    #[test]
    fn api_names_round_trip() {
        for a in Api::ALL {
            assert_eq!(Api::parse(a.name()), Ok(a));
        }
        assert!(Api::parse("embeddings").unwrap_err().contains("chat, completions"));
    }
}
