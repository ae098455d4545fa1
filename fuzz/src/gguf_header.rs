//! GGUF model files, as untrusted bytes, through both readers:
//!
//! - the gateway's metadata reader (`pool::gguf_meta::parse`), from a slice;
//! - the engine's loader (`gguf::Gguf::open`, candle's header parser plus our range
//!   checks), then what the engine derives from the metadata before any weights: the
//!   model config, the tokenizer (built from `tokenizer.ggml.*`, then used once) and
//!   every tensor's bytes (small ones dequantized).
//!
//! Asserted: no panic; memory stays within libFuzzer's limits (`-rss_limit_mb`, and
//! `-malloc_limit_mb` for any single allocation), so a huge count or length in a
//! header is refused, never allocated; every tensor range lies inside the file.

use std::io::Cursor;

use corral_engine::config::ModelConfig;
use corral_engine::gguf::Gguf;
use corral_engine::tokenizer::Tokenizer;

use crate::scratch;

/// Tensors up to this many bytes are also dequantized.
const SMALL_TENSOR: usize = 1 << 16;

fn engine(g: &Gguf) {
    let _ = g.architecture();
    let _ = g.tokenizer_hash();
    let names: Vec<String> = g.tensor_names().map(str::to_owned).collect();
    for name in &names {
        if let Ok((bytes, _)) = g.raw(name) {
            assert!(bytes.len() as u64 <= g.file_len());
            let elems = g.dims(name).ok().and_then(|d| d.iter().try_fold(1usize, |a, &x| a.checked_mul(x)));
            if let Some(n) = elems.filter(|_| bytes.len() <= SMALL_TENSOR) {
                let _ = g.f32_tensor(name, n);
            }
        }
    }
    let _ = ModelConfig::from_gguf(g);
    if let Ok(t) = Tokenizer::from_gguf(g) {
        if let Ok(ids) = t.encode("Hello, <s>world</s> \u{1F600}", true) {
            let _ = t.decode(&ids);
        }
        let _ = (t.vocab_size(), t.bos(), t.eos(), t.eog_tokens(), t.fingerprint());
    }
}

/// The fuzz target `gguf_header` (fuzz/targets/fuzz_targets/gguf_header.rs): one input.
pub fn gguf_header(data: &[u8]) {
    let _ = corral_pool::gguf_meta::parse(&mut Cursor::new(data));
    scratch::with_file(data, |path| {
        if let Ok(g) = Gguf::open(path) {
            engine(&g);
        }
    });
}
