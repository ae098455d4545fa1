//! `corral pull ORG/REPO [--file NAME] [--revision REV]`: one GGUF file from Hugging Face
//! into its shared cache (`corral_hub`), with a progress bar on a terminal. The path of
//! the file is printed on stdout; what happened, and the id to serve it by, on stderr.

use std::io::IsTerminal;

use anyhow::Result;
use clap::Args;
use corral_hub::choose::Why;
use corral_hub::layout::Env;
use corral_hub::repo::{RepoId, Revision};
use corral_hub::{Progress, PullRequest};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Args)]
pub struct PullArgs {
    /// The repository, ORG/NAME (e.g. bartowski/SmolLM2-135M-Instruct-GGUF).
    repo: String,
    /// Which GGUF file: its path in the repository, its name, or a quantization such as
    /// Q8_0. Default: the repository's only GGUF, else its Q4_K_M one.
    #[arg(long)]
    file: Option<String>,
    /// Branch, tag or commit.
    #[arg(long, default_value = "main")]
    revision: String,
    /// Models directory (for the id the file will be served by).
    #[arg(long, env = "CORRAL_MODELS_DIR")]
    models_dir: Option<std::path::PathBuf>,
}

pub fn pull(args: PullArgs) -> Result<()> {
    let env = Env::from_process();
    let req = PullRequest {
        repo: RepoId::parse(&args.repo)?,
        revision: Revision::parse(&args.revision)?,
        file: args.file.clone(),
        endpoint: std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| corral_hub::DEFAULT_ENDPOINT.to_owned()),
        token: corral_hub::token::find(corral_hub::token::from_env(), &env.token_path()),
        cache_root: env.cache_root(),
    };
    let bar = Bar::new();
    let pulled = corral_hub::pull(&req, &bar)?;
    match pulled.why {
        Why::Default { others } => eprintln!(
            "corral: {} has {} GGUF files; took the {} one (--file NAME picks another)",
            req.repo,
            others + 1,
            corral_hub::choose::DEFAULT_QUANT
        ),
        Why::Named | Why::Only => {}
    }
    let state = match (pulled.fetched, pulled.checked) {
        (None, _) => "already in the cache",
        (Some(_), true) => "downloaded, sha256 checked",
        (Some(_), false) => "downloaded (the hub gives no sha256 for it: not checked)",
    };
    eprintln!("corral: {} {} ({:.2} GB) {state}", req.repo, pulled.file, pulled.size as f64 / 1e9);
    let dir = args.models_dir.clone().unwrap_or_else(corral_pool::registry::default_models_dir);
    if let Some(k) = crate::models::discover(&dir)?.into_iter().find(|k| k.entry.path == pulled.path) {
        eprintln!("corral: serve it with: corral serve {}", k.entry.id);
    }
    println!("{}", pulled.path.display());
    Ok(())
}

/// indicatif's bar on stderr, hidden when stderr is not a terminal.
struct Bar(ProgressBar);

impl Bar {
    fn new() -> Self {
        let target =
            if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Self(bar)
    }
}

impl Progress for Bar {
    fn begin(&self, name: &str, size: u64, done: u64) {
        self.0.set_message(name.to_owned());
        self.0.set_length(size);
        self.0.set_position(done);
        self.0.reset_eta();
    }

    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }

    fn finish(&self) {
        self.0.finish_and_clear();
    }
}
