//! corral's gateway: the public HTTP server a person leaves running. It owns the TCP
//! port, answers health and monitoring itself, and forwards API requests byte for byte
//! to the engine of the requested model through the pool. It never tokenizes and never
//! links model code; an engine crash is an error response, never a gateway crash.

pub mod body;
pub mod proxy;
pub mod server;
pub mod stats;

pub use server::{GatewayConfig, run};
