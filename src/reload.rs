//! SIGHUP: read the config file and the models again and hand the pool the new list
//! (`Pool::reconfigure`: new models added, dropped ones drained and stopped, engines
//! started afterwards get the new options). A file that does not parse, or names a model
//! that is not there, changes nothing: the error is logged and the old config stays.
//! Options that shape the server itself (address, pool size, timeouts) and the upstream
//! models take a restart.

use corral_pool::Pool;

use crate::config::Source;

/// Reload on every SIGHUP (`hangups`: `corral_net::signals::watch_hangup`, called before
/// the server listens) until the runtime ends.
pub async fn on_sighup(
    hangups: std::io::Result<tokio::sync::mpsc::Receiver<()>>,
    source: Source,
    pool: Pool,
    upstreams: Vec<corral_gateway::UpstreamSpec>,
) {
    let mut hangups = match hangups {
        Ok(rx) => rx,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGHUP; the config will not be reloaded");
            return;
        }
    };
    while hangups.recv().await.is_some() {
        let s = source.clone();
        // Reading files and GGUF headers blocks.
        let loaded = match tokio::task::spawn_blocking(move || s.load()).await {
            Ok(r) => r,
            Err(e) => Err(e.into()),
        };
        let loaded = match loaded {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(file = %source.file.display(), error = format!("{e:#}"), "reload failed; keeping the old config");
                continue;
            }
        };
        if loaded.upstreams != upstreams {
            tracing::warn!(file = %source.file.display(), "upstream models changed in the config; that takes a restart");
        }
        let cfg = pool.config();
        let options = crate::serve::engine_options(&loaded.args, cfg.memory_budget, cfg.cap);
        let changes = pool.reconfigure(loaded.models, loaded.settings, options);
        tracing::info!(
            file = %source.file.display(),
            added = ?changes.added,
            removed = ?changes.removed,
            updated = ?changes.updated,
            "config reloaded"
        );
    }
}
