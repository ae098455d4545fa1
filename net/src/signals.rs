//! SIGTERM and SIGINT as stop requests. The first asks for a graceful stop; any later one
//! for a fast one (a person pressing Ctrl-C twice). Signals are read on a dedicated thread
//! (signal-hook's iterator), so no async runtime state is touched from a handler.
//! SIGHUP asks `corral serve` to re-read its configuration (`watch_hangup`).

use tokio::sync::mpsc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Finish what is running (bounded by a deadline), then exit.
    Graceful,
    /// Exit now.
    Fast,
}

/// Start watching SIGTERM and SIGINT. The receiver yields one `Stop` per signal.
pub fn watch() -> std::io::Result<mpsc::UnboundedReceiver<Stop>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut next = Stop::Graceful;
        for sig in signals.forever() {
            tracing::info!(signal = sig, "stop signal");
            if tx.send(next).is_err() {
                break;
            }
            next = Stop::Fast;
        }
    })?;
    Ok(rx)
}

/// Start watching SIGHUP (reload the configuration). The receiver yields one `()` per
/// signal; signals that arrive while one is pending are merged (a reload reads the
/// latest files anyway).
pub fn watch_hangup() -> std::io::Result<mpsc::Receiver<()>> {
    use signal_hook::consts::SIGHUP;
    let mut signals = signal_hook::iterator::Signals::new([SIGHUP])?;
    let (tx, rx) = mpsc::channel(1);
    std::thread::Builder::new().name("sighup".into()).spawn(move || {
        for sig in signals.forever() {
            tracing::info!(signal = sig, "reload signal");
            if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                break;
            }
        }
    })?;
    Ok(rx)
}
