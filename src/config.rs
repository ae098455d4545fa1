//! Where `corral serve`'s settings come from: the command line, `CORRAL_*` environment
//! variables and the config file (`corral.toml`), in that order of precedence; and the
//! models they name. Read at start and again on SIGHUP (`reload.rs`).
//!
//! Merging: the file's options are turned into flags (`config_file.rs`) and placed before
//! the user's arguments, keeping only those whose flag the user did not give on the
//! command line or through its environment variable (clap's `value_source`). The result
//! is parsed once more by the same clap parser, so the file's values pass the same
//! checks and defaults apply as if typed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::parser::ValueSource;
use clap::{Args, FromArgMatches};
use corral_pool::ModelSettings;
use corral_pool::registry::{self, ModelEntry};
use corral_protocol::ModelId;

use corral_gateway::UpstreamSpec;

use crate::config_file::{self, Config, ModelSource};
use crate::serve::ServeArgs;

/// `$XDG_CONFIG_HOME/corral/corral.toml`, else `~/.config/corral/corral.toml` — the same
/// rule on every system, macOS included.
pub fn default_path() -> PathBuf {
    let base = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".config"),
    };
    base.join("corral").join("corral.toml")
}

/// How to read the settings again: the config file and the serve arguments as given.
#[derive(Clone, Debug)]
pub struct Source {
    /// `--config`/`CORRAL_CONFIG` (must exist), else the default path (may be missing).
    pub file: PathBuf,
    pub explicit: bool,
    /// The arguments after `serve`.
    pub argv: Vec<OsString>,
}

/// Settings and models, ready for the pool (and, for upstream models, the gateway).
pub struct Loaded {
    pub args: ServeArgs,
    pub models: Vec<ModelEntry>,
    pub settings: BTreeMap<ModelId, ModelSettings>,
    /// `--upstream` flags, then the file's upstream tables.
    pub upstreams: Vec<UpstreamSpec>,
}

pub fn serve_command() -> clap::Command {
    ServeArgs::augment_args(clap::Command::new("serve").no_binary_name(false))
}

impl Source {
    /// For this process: `corral` has no options before its verb, so the serve arguments
    /// are everything after `corral serve`.
    pub fn from_process(config: Option<PathBuf>) -> Self {
        let argv = std::env::args_os().skip(2).collect();
        match config {
            Some(file) => Self { file, explicit: true, argv },
            None => Self { file: default_path(), explicit: false, argv },
        }
    }

    pub fn load(&self) -> Result<Loaded> {
        let name = self.file.display().to_string();
        let cfg = match std::fs::read_to_string(&self.file) {
            Ok(text) => config_file::parse(&name, &text, &serve_command())?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.explicit => Config::default(),
            Err(e) => return Err(e).with_context(|| format!("reading config file {name}")),
        };
        let args = merge(&self.argv, &cfg)?;
        let upstreams = upstreams(&args, &cfg, &name)?;
        let (models, settings) = models(&args, &cfg, &name, !upstreams.is_empty())?;
        check_names(&models, &settings, &upstreams)?;
        Ok(Loaded { args, models, settings, upstreams })
    }
}

/// The serve arguments with the file's options under the user's.
pub fn merge(argv: &[OsString], cfg: &Config) -> Result<ServeArgs> {
    let cmd = serve_command();
    let serve = || std::iter::once(OsString::from("serve"));
    let user = cmd.clone().try_get_matches_from(serve().chain(argv.iter().cloned()))?;
    let mut full: Vec<OsString> = serve().collect();
    for o in &cfg.options {
        let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(o.key.as_str())) else {
            bail!("config key {} is not a serve flag", o.key);
        };
        match user.value_source(arg.get_id().as_str()) {
            Some(ValueSource::CommandLine | ValueSource::EnvVariable) => {
                tracing::debug!(key = %o.key, "the command line or environment overrides the config file");
            }
            _ => full.extend(o.args.iter().map(OsString::from)),
        }
    }
    full.extend(argv.iter().cloned());
    let m = cmd.try_get_matches_from(full).context("the config file's options with the command line's")?;
    Ok(ServeArgs::from_arg_matches(&m)?)
}

/// The models to serve: `--model` flags and `[models.<id>]` tables with a `path` or
/// `repo`; when there are none, the models directory and the Hugging Face cache. Tables
/// without a source give settings to a model found that way. Then the query, if any.
fn models(
    args: &ServeArgs,
    cfg: &Config,
    file: &str,
    has_upstreams: bool,
) -> Result<(Vec<ModelEntry>, BTreeMap<ModelId, ModelSettings>)> {
    let cache = crate::models::hf_cache_root();
    let cached = if cfg.models.iter().any(|m| matches!(m.source, Some(ModelSource::Hub { .. }))) {
        corral_hub::scan::scan(&cache)
    } else {
        Vec::new()
    };
    let mut configured = Vec::new();
    for m in &cfg.models {
        let at = |what: String| format!("{file}:{}: [models.{}]: {what}", m.line, m.id);
        let path = match &m.source {
            None | Some(ModelSource::Upstream(_)) => continue,
            Some(ModelSource::Path(p)) => p.clone(),
            Some(ModelSource::Hub { repo, file: f }) => cached
                .iter()
                .find(|c| format!("{}/{}", c.repo.org(), c.repo.name()) == *repo && c.file.to_string() == *f)
                .map(|c| c.path.clone())
                .with_context(|| {
                    at(format!(
                        "{repo} file {f} is not in the Hugging Face cache {} (corral pull {repo} --file {f} fetches it)",
                        cache.display()
                    ))
                })?,
        };
        configured.push(registry::entry_as(&path, m.id.clone()).with_context(|| at("path".into()))?);
    }
    let all = crate::serve::model_entries(args, configured, has_upstreams)?;
    for m in cfg.models.iter().filter(|m| m.source.is_none()) {
        if !all.iter().any(|e| e.id == m.id) {
            bail!("{file}:{}: [models.{}] has no `path` or `repo`, and no model has this id", m.line, m.id);
        }
    }
    let settings = cfg
        .models
        .iter()
        .filter(|m| !matches!(m.source, Some(ModelSource::Upstream(_))))
        .map(|m| (m.id.clone(), m.settings.clone()))
        .collect();
    let models = match &args.query {
        Some(q) if !(all.is_empty() && has_upstreams) => registry::select(all, |e| &e.id, q)?,
        _ => all,
    };
    Ok((models, settings))
}

/// The upstream models: `--upstream` flags, then the file's tables with `upstream`.
fn upstreams(args: &ServeArgs, cfg: &Config, file: &str) -> Result<Vec<UpstreamSpec>> {
    let mut out: Vec<UpstreamSpec> = args.upstreams.clone();
    for m in &cfg.models {
        if let Some(ModelSource::Upstream(spec)) = &m.source {
            if out.iter().any(|u| u.id == spec.id) {
                bail!("{file}:{}: [models.{}]: this upstream is also given with --upstream", m.line, m.id);
            }
            out.push((**spec).clone());
        }
    }
    if let Some(dup) = out.iter().enumerate().find(|(i, u)| out[..*i].iter().any(|o| o.id == u.id)) {
        bail!("upstream model {} is given twice", dup.1.id);
    }
    Ok(out)
}

/// No name (id or alias) may route to two models, local or upstream.
fn check_names(models: &[ModelEntry], settings: &BTreeMap<ModelId, ModelSettings>, ups: &[UpstreamSpec]) -> Result<()> {
    let mut names: Vec<(&str, &str)> = Vec::new();
    for m in models {
        names.push((m.id.as_str(), m.id.as_str()));
        for a in settings.get(&m.id).map_or(&[][..], |s| s.aliases.as_slice()) {
            names.push((a, m.id.as_str()));
        }
    }
    for u in ups {
        for n in std::iter::once(u.id.as_str()).chain(u.aliases.iter().map(String::as_str)) {
            if let Some((_, other)) = names.iter().find(|(taken, _)| *taken == n) {
                bail!("the name {n} is taken by model {other} and by upstream model {}", u.id);
            }
            names.push((n, u.id.as_str()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(file: &str, argv: &[&str]) -> ServeArgs {
        let cfg = config_file::parse("t.toml", file, &serve_command()).unwrap();
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        merge(&argv, &cfg).unwrap()
    }

    #[test]
    fn a_name_routes_to_one_model_only() {
        let entry = |id: &str| ModelEntry { id: ModelId::new(id).unwrap(), path: "/m".into(), bytes: 1, modified: 0 };
        let up = |flag: &str| UpstreamSpec::parse_flag(flag).unwrap();
        let mut settings = BTreeMap::new();
        settings
            .insert(ModelId::new("smol").unwrap(), ModelSettings { aliases: vec!["s".into()], ..Default::default() });
        let models = [entry("smol")];
        assert!(check_names(&models, &settings, &[up("big=http://h")]).is_ok());
        let e = check_names(&models, &settings, &[up("smol=http://h")]).unwrap_err().to_string();
        assert!(e.contains("smol is taken by model smol"), "{e}");
        let mut aliased = up("big=http://h");
        aliased.aliases = vec!["s".into()];
        assert!(check_names(&models, &settings, &[aliased]).unwrap_err().to_string().contains("the name s"));
        let e = check_names(&[], &BTreeMap::new(), &[up("a=http://h"), up("a=http://i")]).unwrap_err();
        assert!(e.to_string().contains("taken by model a"), "{e}");
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        let a = merged("port = 9000\nmodel-pool = 3\nkeep-alive = \"5m\"\n", &["--port", "7000"]);
        assert_eq!((a.port, a.model_pool), (7000, 3));
        assert_eq!(a.keep_alive, Some(std::time::Duration::from_secs(300)));
        let a = merged("model = [\"/a.gguf\", \"/b.gguf\"]\n", &["--model", "/c.gguf"]);
        assert_eq!(a.models, ["/c.gguf"], "a repeatable flag given on the command line replaces the file's list");
        let a = merged("model = [\"/a.gguf\"]\nno-open = true\n", &["smol"]);
        assert_eq!(
            (a.models.as_slice(), a.no_open, a.query.as_deref()),
            (&["/a.gguf".to_owned()][..], true, Some("smol"))
        );
        assert_eq!(merged("", &[]).port, 8080, "defaults still apply");
    }
}
