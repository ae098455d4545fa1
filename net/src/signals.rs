//! SIGTERM and SIGINT as stop requests. The first asks for a graceful stop; any later one
//! for a fast one (a person pressing Ctrl-C twice). Signals are read on a dedicated thread
//! (signal-hook's iterator), so no async runtime state is touched from a handler.

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
