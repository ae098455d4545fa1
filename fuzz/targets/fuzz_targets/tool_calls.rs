//! `corral_fuzz::tool_calls` under libFuzzer (what it runs and asserts: fuzz/src/, and
//! docs/reliability.md, "Fuzzing").
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_fuzz::tool_calls(data));
