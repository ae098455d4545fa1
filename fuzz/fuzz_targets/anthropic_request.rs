//! Anthropic Messages bodies (`/v1/messages`): the engine's parse and validation, then
//! the gateway's bounds check, which must not refuse what the engine accepts
//! (`corral_fuzz::request`).
#![no_main]

use corral_engine::server::fuzzing::Api;
use corral_protocol::ApiShape;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    corral_fuzz::request::run(Api::Messages, ApiShape::Anthropic, data);
});
