//! The weight formats the CUDA kernels take, their numbering in the kernels, the
//! activation format each pairs with (as the CPU kernels pair them), and which of them
//! `--device auto` still keeps off the GPU.

use candle_core::quantized::GgmlDType;

use crate::error::{Error, Result};
use crate::gguf::Stored;

/// How activations are quantized for a weight format (as the CPU kernels pair them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// Blocks of 32, f16 scale.
    Q8_0,
    /// Q8_0 plus f16(d * sum(q)).
    Q8_1,
    /// Super-blocks of 256, f32 scale, sums of 16.
    Q8K,
    /// Plain f32 values (F16 weights: the CPU widens them to f32 and multiplies f32
    /// activations, candle's `QMatMul`), kept in `DeviceAct::d`, one per value.
    F32,
    /// f32 values rounded to bf16 as the CPU's BF16 kernel rounds them
    /// (`GGML_FP32_TO_BF16`), kept widened in `DeviceAct::d`.
    Bf16,
}

impl ActFormat {
    pub fn for_weights(dtype: Stored) -> Option<Self> {
        use GgmlDType::*;
        match dtype {
            Stored::Ggml(Q4_0 | Q5_0 | Q8_0) | Stored::Iq4Nl | Stored::Mxfp4 => Some(Self::Q8_0),
            Stored::Ggml(Q4_1 | Q5_1) => Some(Self::Q8_1),
            Stored::Ggml(Q2K | Q3K | Q4K | Q5K | Q6K) | Stored::Iq4Xs => Some(Self::Q8K),
            Stored::Ggml(F16) => Some(Self::F32),
            Stored::Ggml(BF16) => Some(Self::Bf16),
            _ => None,
        }
    }

    /// Values per scale: 32 or 256; 1 for the unquantized formats, whose values are
    /// stored in the scales' array.
    pub(crate) fn block(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q8K => 256,
            Self::F32 | Self::Bf16 => 1,
        }
    }

    /// Whether the values are kept as floats (no int8 quantization).
    pub(crate) fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::Bf16)
    }
}

/// Every weight format with CUDA kernels, in the kernels' numbering (`type` in
/// `gemv.cu` / `embed.cu`; the kernel name arrays of `gemv.rs` and `gemm.rs` follow it).
pub(crate) const KERNEL_TYPES: [Stored; 15] = {
    use GgmlDType::*;
    [
        Stored::Ggml(Q4_0),
        Stored::Ggml(Q4_1),
        Stored::Ggml(Q5_0),
        Stored::Ggml(Q8_0),
        Stored::Ggml(Q4K),
        Stored::Ggml(Q6K),
        Stored::Ggml(Q5_1),
        Stored::Iq4Nl,
        Stored::Ggml(Q5K),
        Stored::Ggml(Q3K),
        Stored::Ggml(Q2K),
        Stored::Iq4Xs,
        Stored::Ggml(F16),
        Stored::Ggml(BF16),
        Stored::Mxfp4,
    ]
};

/// The kernels' number for a weight format (`KERNEL_TYPES`).
pub(crate) fn type_index(dtype: Stored) -> Result<usize> {
    KERNEL_TYPES
        .iter()
        .position(|&t| t == dtype)
        .ok_or_else(|| Error::Cuda { op: "shape check", reason: format!("no CUDA kernel for {dtype:?}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_format_has_an_activation_format_and_one_number() {
        for (i, &t) in KERNEL_TYPES.iter().enumerate() {
            assert_eq!(type_index(t).ok(), Some(i), "{t:?}");
            assert!(ActFormat::for_weights(t).is_some(), "{t:?}");
        }
        assert!(type_index(Stored::Ggml(GgmlDType::F32)).is_err());
        assert_eq!(ActFormat::for_weights(Stored::Iq4Xs), Some(ActFormat::Q8K));
        assert_eq!(ActFormat::for_weights(Stored::Iq4Nl), Some(ActFormat::Q8_0));
        assert_eq!(ActFormat::for_weights(Stored::Mxfp4), Some(ActFormat::Q8_0));
        assert_eq!(ActFormat::for_weights(Stored::Ggml(GgmlDType::Q5_1)), Some(ActFormat::Q8_1));
        assert_eq!(ActFormat::for_weights(Stored::Ggml(GgmlDType::F16)), Some(ActFormat::F32));
        assert_eq!(ActFormat::for_weights(Stored::Ggml(GgmlDType::BF16)), Some(ActFormat::Bf16));
    }
}
