//! What the fuzz targets share: a request body run through the engine's checks and
//! the gateway's (`request`), and a scratch file for the readers that take a path
//! (`scratch`). Each target is one file in `fuzz_targets/`; see docs/reliability.md.

pub mod request;
pub mod scratch;
