//! `corral_fuzz::cache_file_hybrid` under libFuzzer (what it runs and asserts: fuzz/src/,
//! and docs/reliability.md, "Fuzzing").
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_fuzz::cache_file_hybrid(data));
