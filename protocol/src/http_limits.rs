//! Connection limits every corral HTTP server applies (the gateway on TCP, each engine
//! on its socket), defined once so the two cannot drift apart.

use std::time::Duration;

/// A client must finish sending its request head within this time (slowloris).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// More request headers than this → 431.
pub const MAX_HEADERS: usize = 100;
/// Largest request head, in bytes (→ 431 beyond).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Open connections a server serves at once; at the cap, accepting pauses (clients wait
/// in the backlog) instead of failing.
pub const MAX_CONNECTIONS: usize = 256;
