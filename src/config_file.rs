//! `corral.toml`, parsed: text in, a `Config` out, nothing read or resolved here (the
//! caller reads the file, resolves `repo` models in the Hugging Face cache and merges the
//! options with the command line — `config.rs`). A table with `upstream` names a model
//! served by another server (its keys: `config_upstream.rs`).
//!
//! Top-level keys are `corral serve`'s long flag names, checked against the serve
//! command itself (so a new flag is a new key with no list to keep in step), and turned
//! into the arguments that flag takes. `[models.<id>]` tables name extra models and
//! per-model settings. Every error names the file, the line and the key; unknown keys
//! are errors.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use clap::ArgAction;
use corral_pool::ModelSettings;
use corral_protocol::ModelId;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// The file, parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// Serve options, in file order.
    pub options: Vec<FileOption>,
    /// `[models.<id>]` tables, in file order.
    pub models: Vec<ModelSpec>,
}

/// One top-level key as the arguments of its flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOption {
    /// The long flag name (`model-pool`).
    pub key: String,
    pub line: usize,
    /// `--key=value` (one per value for repeatable flags), `--key` for a switch that is
    /// on, nothing for one that is off.
    pub args: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    Path(PathBuf),
    /// A file of a Hugging Face repository, looked up in the local cache.
    Hub {
        repo: String,
        file: String,
    },
    /// Served by another OpenAI-compatible server (`config_upstream.rs`).
    Upstream(Box<corral_gateway::UpstreamSpec>),
}

/// A `[models.<id>]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub id: ModelId,
    pub line: usize,
    /// `None`: settings for a model found otherwise (`--model`, models dir, cache).
    pub source: Option<ModelSource>,
    pub settings: ModelSettings,
}

/// A mistake in the file, located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Keys of a `[models.<id>]` table.
const MODEL_KEYS: &[&str] = &[
    "path",
    "repo",
    "file",
    "aliases",
    "pin",
    "ctx",
    "batch",
    "temperature",
    "top-p",
    "top-k",
    "min-p",
    "max-tokens",
    "thinking",
];

/// Serve flags that make no sense in the file.
const NOT_IN_FILE: &[&str] = &["config", "help"];

/// Parse `text` (named `file` in errors) against the serve command's flags.
pub fn parse(file: &str, text: &str, serve: &clap::Command) -> Result<Config, ConfigError> {
    let err = |span: Range<usize>, message: String| ConfigError {
        file: file.to_owned(),
        line: line_of(text, span.start),
        message,
    };
    let root = DeTable::parse(text).map_err(|e| err(e.span().unwrap_or(0..0), e.message().trim().to_owned()))?;
    let mut out = Config::default();
    for (key, value) in root.get_ref() {
        if key.get_ref() == "models" {
            let DeValue::Table(t) = value.get_ref() else {
                return Err(err(key.span(), "`models` must be a table of `[models.<id>]` tables".into()));
            };
            for (id, table) in t {
                let mut m = model(id, table).map_err(|(span, m)| err(span, m))?;
                m.line = line_of(text, id.span().start);
                out.models.push(m);
            }
            continue;
        }
        let name = key.get_ref().as_ref();
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(name) && !NOT_IN_FILE.contains(&name))
            .ok_or_else(|| err(key.span(), format!("unknown key `{name}` (keys are `corral serve` flag names)")))?;
        let args = option_args(name, arg.get_action(), value).map_err(|(span, m)| err(span, m))?;
        // Let the flag's own parser judge the value now, so the error has a line.
        let mut argv = vec!["serve".to_owned()];
        argv.extend(args.iter().cloned());
        if let Err(e) = serve.clone().try_get_matches_from(argv) {
            return Err(err(value.span(), format!("`{name}`: {}", clap_message(&e))));
        }
        out.options.push(FileOption { key: name.to_owned(), line: line_of(text, key.span().start), args });
    }
    // The parsed table is sorted by key; keep the file's order.
    out.options.sort_by_key(|o| o.line);
    out.models.sort_by_key(|m| m.line);
    Ok(out)
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).unwrap_or(text).matches('\n').count() + 1
}

/// clap's first line, without its `error: ` prefix.
fn clap_message(e: &clap::Error) -> String {
    let s = e.to_string();
    let first = s.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

type Located = (Range<usize>, String);

fn option_args(name: &str, action: &ArgAction, value: &Spanned<DeValue<'_>>) -> Result<Vec<String>, Located> {
    let flag = |v: String| format!("--{name}={v}");
    match (action, value.get_ref()) {
        (ArgAction::SetTrue, DeValue::Boolean(b)) => Ok(if *b { vec![format!("--{name}")] } else { vec![] }),
        (ArgAction::SetTrue, _) => Err((value.span(), format!("`{name}` must be true or false"))),
        (ArgAction::Append, DeValue::Array(items)) => items.iter().map(|i| scalar(name, i).map(flag)).collect(),
        _ => Ok(vec![flag(scalar(name, value)?)]),
    }
}

/// A string, number or boolean as the text a flag takes.
fn scalar(name: &str, v: &Spanned<DeValue<'_>>) -> Result<String, Located> {
    match v.get_ref() {
        DeValue::String(s) => Ok(s.to_string()),
        DeValue::Integer(i) => integer(i.as_str(), i.radix()).map(|n| n.to_string()).ok_or_else(|| bad_number(name, v)),
        DeValue::Float(f) => Ok(f.as_str().replace('_', "")),
        DeValue::Boolean(b) => Ok(b.to_string()),
        _ => Err((v.span(), format!("`{name}` must be a string, a number or a boolean"))),
    }
}

fn integer(digits: &str, radix: u32) -> Option<i64> {
    let d = digits.replace('_', "");
    let d = ["0x", "0o", "0b"].iter().find_map(|p| d.strip_prefix(p)).unwrap_or(&d);
    i64::from_str_radix(d, radix).ok()
}

fn bad_number(name: &str, v: &Spanned<DeValue<'_>>) -> Located {
    (v.span(), format!("`{name}` is not a number this key can take"))
}

fn model(id: &Spanned<std::borrow::Cow<'_, str>>, table: &Spanned<DeValue<'_>>) -> Result<ModelSpec, Located> {
    let name = id.get_ref();
    let model_id = ModelId::new(name.as_ref()).map_err(|e| (id.span(), format!("[models.{name}]: {e}")))?;
    let DeValue::Table(t) = table.get_ref() else {
        return Err((id.span(), format!("`models.{name}` must be a table")));
    };
    let mut s = ModelSettings::default();
    let (mut path, mut repo, mut file) = (None, None, None);
    let mut upstream = crate::config_upstream::Keys::default();
    let mut local_keys: Vec<&str> = Vec::new();
    for (k, v) in t {
        let key = k.get_ref().as_ref();
        let at = |m: String| (v.span(), format!("[models.{name}] `{key}`: {m}"));
        if upstream.take(key, v.get_ref()).map_err(at)? {
            continue;
        }
        if let Some(known) = MODEL_KEYS.iter().find(|m| **m == key) {
            local_keys.push(known);
        }
        let text = || v.get_ref().as_str().map(str::to_owned).ok_or_else(|| at("must be a string".into()));
        let int = |lo: i64, hi: i64| match v.get_ref() {
            DeValue::Integer(i) => integer(i.as_str(), i.radix())
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| at(format!("must be a whole number from {lo} to {hi}"))),
            _ => Err(at(format!("must be a whole number from {lo} to {hi}"))),
        };
        let float = |lo: f32, hi: f32| {
            let n = match v.get_ref() {
                DeValue::Float(f) => f.as_str().replace('_', "").parse::<f32>().ok(),
                DeValue::Integer(i) => integer(i.as_str(), i.radix()).map(|n| n as f32),
                _ => None,
            };
            n.filter(|n| (lo..=hi).contains(n)).ok_or_else(|| at(format!("must be a number from {lo} to {hi}")))
        };
        let boolean = || v.get_ref().as_bool().ok_or_else(|| at("must be true or false".into()));
        match key {
            "path" => path = Some(PathBuf::from(text()?)),
            "repo" => repo = Some(text()?),
            "file" => file = Some(text()?),
            "aliases" => {
                let DeValue::Array(items) = v.get_ref() else { return Err(at("must be a list of names".into())) };
                for i in items.iter() {
                    let a = i.get_ref().as_str().ok_or_else(|| at("must be a list of names".into()))?;
                    s.aliases.push(a.to_owned());
                }
            }
            "pin" => s.pin = boolean()?,
            "ctx" => s.ctx = Some(int(16, 1 << 24)? as usize),
            "batch" => s.batch = Some(int(1, 256)? as usize),
            "temperature" => s.sampling.temperature = Some(float(0.0, 5.0)?),
            "top-p" => s.sampling.top_p = Some(float(0.0, 1.0)?),
            "top-k" => s.sampling.top_k = Some(int(0, 1_000_000)? as usize),
            "min-p" => s.sampling.min_p = Some(float(0.0, 1.0)?),
            "max-tokens" => s.sampling.max_tokens = Some(int(1, i64::from(u32::MAX))? as usize),
            "thinking" => s.sampling.thinking = Some(boolean()?),
            _ => {
                return Err((
                    k.span(),
                    format!(
                        "unknown key `{key}` in [models.{name}] (known: {}; for an upstream model: {})",
                        MODEL_KEYS.join(", "),
                        crate::config_upstream::KEYS.join(", ")
                    ),
                ));
            }
        }
    }
    let spec = upstream
        .finish(&model_id, &s.aliases, &local_keys)
        .map_err(|m| (id.span(), format!("[models.{name}]: {m}")))?;
    if let Some(spec) = spec {
        return Ok(ModelSpec {
            id: model_id,
            line: 0,
            source: Some(ModelSource::Upstream(Box::new(spec))),
            settings: s,
        });
    }
    let source = match (path, repo, file) {
        (Some(p), None, None) => Some(ModelSource::Path(p)),
        (None, Some(repo), Some(file)) if repo.split('/').count() == 2 => Some(ModelSource::Hub { repo, file }),
        (None, Some(_), Some(_)) => return Err((id.span(), format!("[models.{name}]: `repo` must be ORG/NAME"))),
        (None, Some(_), None) => return Err((id.span(), format!("[models.{name}]: `repo` needs `file` too"))),
        (None, None, Some(_)) => return Err((id.span(), format!("[models.{name}]: `file` needs `repo` too"))),
        (Some(_), _, _) => {
            return Err((id.span(), format!("[models.{name}]: give `path` or `repo` + `file`, not both")));
        }
        (None, None, None) => None,
    };
    Ok(ModelSpec { id: model_id, line: 0, source, settings: s })
}

#[cfg(test)]
#[path = "config_file_tests.rs"]
mod tests;
