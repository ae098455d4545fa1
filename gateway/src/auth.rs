//! The API key (`--api-key`, `--api-key-file`, env `CORRAL_API_KEY`). With one set,
//! every route but `/health` and the web UI's own files (the page and its scripts: they
//! hold no data, and the page asks for the key before its first call) needs it, as
//! `Authorization: Bearer KEY` (OpenAI's SDKs) or `x-api-key: KEY` (Anthropic's). A
//! request without it, or with another key, is 401 `invalid_api_key`.
//!
//! The key is compared as exact bytes (no case folding) in constant time (`subtle`), so
//! how long a refusal takes says nothing about how much of a guess was right; only the
//! key's length is not hidden.
//!
//! And the rule that makes a key necessary: a gateway bound to anything but a loopback
//! address serves whoever can reach it, so it does not start without a key unless told
//! `--insecure-no-api-key`.
//!
//! Pure decisions on plain values; `routes::handle` applies them after the Host and
//! Origin guard, `server::run` checks the bind before it binds.

use std::net::IpAddr;
use std::path::Path;

use subtle::ConstantTimeEq;

/// A configured key. Its `Debug` never shows it.
#[derive(Clone)]
pub struct ApiKey(Vec<u8>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({} bytes)", self.0.len())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("the API key is empty")]
    Empty,
    #[error("the API key may hold only visible ASCII characters, without spaces (it is sent in an HTTP header)")]
    Charset,
    #[error("reading the API key file {path}: {reason}")]
    File { path: String, reason: String },
}

/// What a request presented, judged against the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyCheck {
    Pass,
    /// Neither `Authorization: Bearer …` nor `x-api-key`.
    Missing,
    /// A key, but not ours.
    Wrong,
}

impl ApiKey {
    pub fn new(key: &str) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError::Charset);
        }
        Ok(Self(key.as_bytes().to_vec()))
    }

    /// The key from `--api-key`, else from the first line of `--api-key-file` (a trailing
    /// newline is not part of it); `None` when neither is given.
    pub fn resolve(key: Option<&str>, file: Option<&Path>) -> Result<Option<Self>, KeyError> {
        match (key, file) {
            (Some(k), _) => Self::new(k).map(Some),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| KeyError::File { path: path.display().to_string(), reason: e.to_string() })?;
                Self::new(text.lines().next().unwrap_or("").trim()).map(Some)
            }
            (None, None) => Ok(None),
        }
    }

    fn matches(&self, presented: &[u8]) -> bool {
        self.0.ct_eq(presented).into()
    }

    /// Judge a request's `Authorization` and `x-api-key` header values. Either one that
    /// carries our key passes.
    pub fn check(&self, authorization: Option<&[u8]>, x_api_key: Option<&[u8]>) -> KeyCheck {
        let bearer = authorization.and_then(bearer_token);
        let presented: Vec<&[u8]> = bearer.into_iter().chain(x_api_key.map(trim)).collect();
        if presented.is_empty() {
            KeyCheck::Missing
        } else if presented.iter().any(|p| self.matches(p)) {
            KeyCheck::Pass
        } else {
            KeyCheck::Wrong
        }
    }
}

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

/// The token of `Bearer <token>` (the scheme is case-insensitive, RFC 9110 §11.1).
fn bearer_token(v: &[u8]) -> Option<&[u8]> {
    let v = trim(v);
    let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ')?);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| trim(rest)).filter(|t| !t.is_empty())
}

/// Whether the gateway may listen on `ip`: a loopback address always; anything else
/// (a LAN address, `0.0.0.0`, `::`) only with a key or with `--insecure-no-api-key`.
pub fn check_exposure(ip: IpAddr, has_key: bool, insecure_no_key: bool) -> Result<(), String> {
    if ip.is_loopback() || has_key || insecure_no_key {
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {ip} without an API key: anyone who can reach that address could use every \
         model. Set one with --api-key KEY (or --api-key-file PATH, or CORRAL_API_KEY), or pass \
         --insecure-no-api-key to serve it open anyway"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ApiKey {
        ApiKey::new("sk-local-0123456789abcdef").unwrap()
    }

    #[test]
    fn either_header_form_passes_with_the_exact_key() {
        let k = key();
        assert_eq!(k.check(Some(b"Bearer sk-local-0123456789abcdef"), None), KeyCheck::Pass);
        assert_eq!(k.check(Some(b"bearer  sk-local-0123456789abcdef "), None), KeyCheck::Pass, "scheme any case");
        assert_eq!(k.check(None, Some(b"sk-local-0123456789abcdef")), KeyCheck::Pass);
        assert_eq!(k.check(Some(b"Bearer nope"), Some(b"sk-local-0123456789abcdef")), KeyCheck::Pass);
    }

    #[test]
    fn a_missing_or_different_key_is_refused() {
        let k = key();
        assert_eq!(k.check(None, None), KeyCheck::Missing);
        assert_eq!(k.check(Some(b"Basic dXNlcjpwYXNz"), None), KeyCheck::Missing, "not a bearer token");
        assert_eq!(k.check(Some(b"Bearer "), None), KeyCheck::Missing);
        for wrong in
            [&b"SK-LOCAL-0123456789ABCDEF"[..], b"sk-local-0123456789abcde", b"sk-local-0123456789abcdefg", b""]
        {
            assert_eq!(k.check(None, Some(wrong)), KeyCheck::Wrong, "{:?}", String::from_utf8_lossy(wrong));
        }
        assert_eq!(k.check(Some(b"Bearer sk-local-0123456789ABCDEF"), None), KeyCheck::Wrong, "case matters");
    }

    #[test]
    fn keys_come_from_the_flag_or_the_first_line_of_a_file() {
        assert_eq!(ApiKey::new("").unwrap_err(), KeyError::Empty);
        assert_eq!(ApiKey::new("two words").unwrap_err(), KeyError::Charset);
        assert_eq!(ApiKey::new("tab\there").unwrap_err(), KeyError::Charset);
        assert!(ApiKey::resolve(None, None).unwrap().is_none());
        let dir = std::env::temp_dir().join(format!("corral-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("key");
        std::fs::write(&f, "from-file\n").unwrap();
        let k = ApiKey::resolve(None, Some(&f)).unwrap().unwrap();
        assert_eq!(k.check(None, Some(b"from-file")), KeyCheck::Pass);
        let k = ApiKey::resolve(Some("flag"), Some(&f)).unwrap().unwrap();
        assert_eq!(k.check(None, Some(b"flag")), KeyCheck::Pass, "the flag wins");
        std::fs::write(&f, "\n").unwrap();
        assert_eq!(ApiKey::resolve(None, Some(&f)).unwrap_err(), KeyError::Empty);
        assert!(matches!(ApiKey::resolve(None, Some(&dir.join("none"))), Err(KeyError::File { .. })));
        assert_eq!(format!("{k:?}"), "ApiKey(4 bytes)", "never printed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_loopback_binds_start_without_a_key() {
        for ip in ["127.0.0.1", "::1", "127.0.0.2"] {
            assert!(check_exposure(ip.parse().unwrap(), false, false).is_ok(), "{ip}");
        }
        for ip in ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1"] {
            let e = check_exposure(ip.parse().unwrap(), false, false).unwrap_err();
            assert!(e.contains("--api-key") && e.contains("--insecure-no-api-key"), "{e}");
            assert!(check_exposure(ip.parse().unwrap(), true, false).is_ok());
            assert!(check_exposure(ip.parse().unwrap(), false, true).is_ok());
        }
    }
}
