//! OpenAI chat completions and completions bodies (`/v1/chat/completions`,
//! `/v1/completions`): the engine's parse and validation, then the gateway's bounds
//! check, which must not refuse what the engine accepts (`corral_fuzz::request`). The
//! selector byte's high bit picks completions.
#![no_main]

use corral_engine::server::fuzzing::Api;
use corral_protocol::ApiShape;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let api = if data.first().is_some_and(|b| b & 0x80 != 0) { Api::Completion } else { Api::Chat };
    corral_fuzz::request::run(api, ApiShape::OpenAi, data);
});
