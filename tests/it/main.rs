//! corral's integration tests, one test binary: each module is one area (the file of the
//! same name in `tests/`), `common` the helpers they share. One binary means `common` and
//! the dev-dependencies are compiled and linked once, not once per file (CI time).
//! Run one area with `cargo test --test it <module>::`, e.g. `cargo test --test it upstream::`.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod api_messages;
mod api_responses;
mod batching;
mod cache_crash;
mod cache_switch;
mod catalogue_faults;
mod catalogue_input;
mod catalogue_shutdown;
mod client_verbs;
mod config_reload;
mod engine_api;
mod engine_process;
mod gateway_auth;
mod gateway_cors;
mod gateway_faults;
mod gateway_guard;
mod gateway_limits;
mod gateway_real;
mod harmony;
mod hf_cache;
mod hybrid_cache;
mod lifecycle_real;
mod metrics;
mod openapi;
mod prompt_cache;
mod pull;
mod reasoning;
mod run_cli;
mod runtime_dir;
mod serve_open;
mod service;
mod stored_responses;
mod structured_output;
mod tool_calls;
mod ui_routes;
mod upstream;
mod upstream_tls;
