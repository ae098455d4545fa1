//! corral's model pool: the registry of known models and (with the gateway) the
//! lifecycle of one engine child process per model. It never links model code.

pub mod registry;
