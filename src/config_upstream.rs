//! The keys of a `[models.<id>]` table that make it an upstream model (served by
//! another OpenAI-compatible server), read one by one as the table is walked
//! (`config_file.rs`), then checked together: an upstream takes none of a local model's
//! keys (`path`, `ctx`, sampling…), and these keys need `upstream`.

use std::time::Duration;

use corral_gateway::{Api, UpstreamSpec};
use corral_protocol::ModelId;
use toml::de::DeValue;

/// Keys only an upstream table takes.
pub const KEYS: &[&str] =
    &["upstream", "upstream-model", "api-key-env", "connect-timeout", "timeout", "health-interval", "apis"];

/// Keys an upstream table may share with a local one.
const SHARED: &[&str] = &["aliases"];

/// What an upstream table said, key by key.
#[derive(Default)]
pub struct Keys {
    urls: Option<Vec<String>>,
    upstream_model: Option<String>,
    api_key_env: Option<String>,
    connect_timeout: Option<Duration>,
    timeout: Option<Duration>,
    health_interval: Option<Duration>,
    apis: Option<Vec<Api>>,
    /// Keys of this kind seen (for the message when `upstream` is missing).
    seen: Vec<&'static str>,
}

fn strings(v: &DeValue<'_>) -> Option<Vec<String>> {
    match v {
        DeValue::String(s) => Some(vec![s.to_string()]),
        DeValue::Array(items) => items.iter().map(|i| i.get_ref().as_str().map(str::to_owned)).collect(),
        _ => None,
    }
}

/// A duration as a string (`"30s"`, `"500ms"`) or a number of seconds, above zero.
fn duration(v: &DeValue<'_>) -> Result<Duration, String> {
    let text = match v {
        DeValue::String(s) => s.to_string(),
        DeValue::Integer(i) => i.as_str().replace('_', ""),
        DeValue::Float(f) => f.as_str().replace('_', ""),
        _ => return Err("must be a duration (\"30s\", \"500ms\", \"2m\") or a number of seconds".into()),
    };
    let d = crate::serve::parse_duration(&text)?;
    if d.is_zero() { Err("must be more than 0".into()) } else { Ok(d) }
}

impl Keys {
    /// Take `key` if it is an upstream key: `Ok(true)` when taken, `Ok(false)` when it
    /// is not one of these.
    pub fn take(&mut self, key: &str, v: &DeValue<'_>) -> Result<bool, String> {
        let Some(k) = KEYS.iter().find(|k| **k == key) else { return Ok(false) };
        self.seen.push(k);
        let text = || v.as_str().map(str::to_owned).ok_or_else(|| "must be a string".to_owned());
        match key {
            "upstream" => self.urls = Some(strings(v).ok_or("must be a URL or a list of URLs")?),
            "upstream-model" => self.upstream_model = Some(text()?),
            "api-key-env" => {
                let name = text()?;
                if name.is_empty() || name.contains('=') || name.contains('\0') {
                    return Err("must be the name of an environment variable (not the key)".into());
                }
                self.api_key_env = Some(name);
            }
            "connect-timeout" => self.connect_timeout = Some(duration(v)?),
            "timeout" => self.timeout = Some(duration(v)?),
            "health-interval" => self.health_interval = Some(duration(v)?),
            "apis" => {
                let names = strings(v).ok_or("must be a list of API names")?;
                self.apis = Some(names.iter().map(|n| Api::parse(n)).collect::<Result<_, _>>()?);
            }
            _ => unreachable!("every key of KEYS has an arm"),
        }
        Ok(true)
    }

    /// The upstream this table describes, if it has `upstream`; `local_keys` are the
    /// other keys the table gave (none may be a local model's).
    pub fn finish(self, id: &ModelId, aliases: &[String], local_keys: &[&str]) -> Result<Option<UpstreamSpec>, String> {
        let Some(urls) = self.urls else {
            return match self.seen.first() {
                Some(k) => Err(format!("`{k}` is for an upstream model, and the table has no `upstream` URL")),
                None => Ok(None),
            };
        };
        if let Some(k) = local_keys.iter().find(|k| !SHARED.contains(k)) {
            return Err(format!("`{k}` does not apply to an upstream model (set it on the upstream server)"));
        }
        let replicas = corral_gateway::upstream::spec::parse_urls(urls.iter().map(String::as_str))?;
        let mut s = UpstreamSpec::new(id.clone(), replicas);
        s.aliases = aliases.to_vec();
        s.upstream_model = self.upstream_model;
        s.api_key_env = self.api_key_env;
        s.timeout = self.timeout;
        s.apis = self.apis;
        if let Some(d) = self.connect_timeout {
            s.connect_timeout = d;
        }
        if let Some(d) = self.health_interval {
            s.health_interval = d;
        }
        Ok(Some(s))
    }
}
