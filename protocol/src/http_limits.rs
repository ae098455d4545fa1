//! Connection limits every corral HTTP server applies (the gateway on TCP, each engine
//! on its socket), defined once so the two cannot drift apart. The gateway's flags
//! (`--header-timeout`, `--body-timeout`, `--max-connections`) default to these.

use std::time::Duration;

/// A client must finish sending its request head within this time (slowloris).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A request body with no bytes for this long is given up: 408.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// More request headers than this → 431.
pub const MAX_HEADERS: usize = 100;
/// Largest request head, in bytes (→ 431 beyond).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Open connections a server serves at once; at the cap, accepting pauses (clients wait
/// in the backlog) instead of failing.
pub const MAX_CONNECTIONS: usize = 512;
