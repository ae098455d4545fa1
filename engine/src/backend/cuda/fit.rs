//! Whether a model fits a GPU's memory, decided before any upload (a model that does
//! not fit gets one message naming the sizes, never a CUDA out-of-memory error halfway
//! through loading), and how much KV the device can mirror after the weights.

/// Device bytes kept free for activations, cuBLAS's workspace and the f32 copy of the
/// largest matrix a prefill GEMM dequantizes.
pub const HEADROOM: u64 = 1 << 30;

/// Repacked weights keep scales as f32 (GGUF: f16), a little more than the file.
pub fn weight_estimate(file_bytes: u64) -> u64 {
    file_bytes + file_bytes / 8
}

/// `Ok(())` when `weights` plus the headroom fit in `free`; otherwise the message.
pub fn check(weights: u64, free: u64, total: u64) -> Result<(), String> {
    let need = weights + HEADROOM;
    if need <= free {
        return Ok(());
    }
    let gb = |b: u64| b as f64 / 1e9;
    Err(format!(
        "the model needs about {:.2} GB of GPU memory ({:.2} GB of weights + {:.2} GB working space); \
         {:.2} GB of {:.2} GB is free",
        gb(need),
        gb(weights),
        gb(HEADROOM),
        gb(free),
        gb(total)
    ))
}

/// Bytes of KV the device can mirror once the weights are loaded (`free` read after the
/// upload), keeping the headroom.
pub fn kv_capacity(free_after_load: u64) -> u64 {
    free_after_load.saturating_sub(HEADROOM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_only_with_headroom_and_names_the_sizes() {
        assert!(check(4_000_000_000, 4_000_000_000 + HEADROOM, 8_000_000_000).is_ok());
        let e = check(4_000_000_000, 4_500_000_000, 8_000_000_000).unwrap_err();
        assert!(e.contains("5.07 GB of GPU memory") && e.contains("4.50 GB of 8.00 GB is free"), "{e}");
        assert_eq!(weight_estimate(800), 900);
        assert_eq!(kv_capacity(HEADROOM / 2), 0);
        assert_eq!(kv_capacity(HEADROOM + 5), 5);
    }
}
