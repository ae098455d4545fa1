//! Server plumbing both corral HTTP servers share — the gateway on TCP and each engine
//! on its unix socket — written once so their behaviour cannot drift apart:
//!
//! - `accept`: the accept loop, with a connection cap (a semaphore: at the cap, accepting
//!   pauses instead of failing), hyper's limits from `protocol::http_limits`, every
//!   connection a tracked task, and graceful connection shutdown on cancellation;
//! - `signals`: SIGTERM/SIGINT as a stream of stop requests (the first graceful, later
//!   ones fast);
//! - `body`: request bodies read up to a byte limit;
//! - `dirs`: private directories (ours, not a symlink, mode 0700) and the stale-socket
//!   probe;
//! - `gauge`: a count of work in progress whose `wait_zero(deadline)` wakes on the last
//!   exit (no polling);
//! - `respond`: the hyper adapter of `protocol`'s error rendering;
//! - `host`: physical memory (the default memory budget).
//!
//! It holds no policy of either server (routes, proxying, models): only mechanisms.

pub mod accept;
pub mod body;
pub mod dirs;
pub mod gauge;
pub mod host;
pub mod respond;
pub mod signals;

pub use tokio_util::sync::CancellationToken;
pub use tokio_util::task::TaskTracker;
