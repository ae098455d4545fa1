//! corral's gateway: the public HTTP server a person leaves running. It owns the TCP
//! port, answers health and monitoring itself, and forwards API requests byte for byte
//! to the engine of the requested model through the pool. It never tokenizes and never
//! links model code; an engine crash is an error response, never a gateway crash.
//!
//! Layout, one job per file: `app` (shared state and config), `route` (the route table) and
//! `routes` (request spans, guards, dispatch), `respond` (the one error → HTTP site), `proxy` (forwarding)
//! with `proxy_error` (what can fail and what follows), `pass_through` (the answer on its
//! way back, shared with `upstream/`) and `body` (pass-through bodies),
//! `monitor` (`/stats`, `/metrics`) with `metrics` (the Prometheus text format) and
//! `stats` (counters), `stored` (the Responses store: bounds and persistence) with
//! `stored_routes` (`previous_response_id` expansion, capturing answers,
//! `GET`/`DELETE /v1/responses/{id}`), `ui` (the web UI's embedded files),
//! `model_controls` (`POST /api/models/{id}/load|unload`), `open` (the browser at an
//! interactive start), `guard` (the Host and Origin rules every request passes first),
//! `cors` (cross-origin headers and preflights for `--allow-origin`), `auth` (the API
//! key and the rule that a non-loopback bind needs one), `server` (process lifetime,
//! connection limits and shutdown), `target` (a request's model: local or upstream),
//! `upstream/` (models served by forwarding to another OpenAI-compatible server).
//! Dependencies point one way:
//! `server → routes → {proxy, monitor, stored_routes, ui, model_controls} → {route, body, respond, stored}`;
//! `proxy → upstream::forward → pass_through`; `monitor → metrics → stats`.

pub mod app;
pub mod auth;
pub mod body;
pub mod cors;
pub mod guard;
pub mod metrics;
pub mod model_controls;
pub mod monitor;
pub mod open;
pub(crate) mod pass_through;
pub mod proxy;
pub mod proxy_error;
pub mod respond;
pub mod route;
pub mod routes;
pub mod server;
pub mod stats;
pub mod stored;
pub mod stored_routes;
pub mod target;
pub mod ui;
pub mod upstream;

pub use app::GatewayConfig;
pub use auth::ApiKey;
pub use cors::Cors;
pub use server::run;
pub use stored::StoreConfig;
pub use upstream::spec::{Api, Base, UpstreamSpec};
