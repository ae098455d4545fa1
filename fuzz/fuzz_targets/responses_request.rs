//! OpenAI Responses bodies (`/v1/responses`): the engine's parse and validation, with
//! and without the gateway's history mark (selector bit 0x80), then the gateway's
//! bounds check, which must not refuse what the engine accepts (`corral_fuzz::request`).
#![no_main]

use corral_engine::server::fuzzing::Api;
use corral_protocol::ApiShape;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let history_expanded = data.first().is_some_and(|b| b & 0x80 != 0);
    corral_fuzz::request::run(Api::Responses { history_expanded }, ApiShape::Responses, data);
});
