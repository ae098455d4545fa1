//! Tensor types candle's GGUF reader does not know (IQ4_NL, IQ4_XS, MXFP4): what they
//! are, and the header scan that finds them before that reader runs.

use std::collections::HashMap;

use candle_core::quantized::GgmlDType;

use super::Walk;

/// How a tensor is stored: a GGML type candle reads, or a type only the CPU's own
/// kernels read (`kernels::quant`): the IQ4s, and MXFP4 (gpt-oss's experts: 32 values
/// of a 4-bit E2M1 table under one E8M0 power-of-two scale, 17 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Ggml(GgmlDType),
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
}

impl Stored {
    /// GGML's type ids of the types candle does not read.
    fn own(id: u32) -> Option<Self> {
        match id {
            20 => Some(Self::Iq4Nl),
            23 => Some(Self::Iq4Xs),
            39 => Some(Self::Mxfp4),
            _ => None,
        }
    }

    pub fn block_size(self) -> usize {
        match self {
            Self::Ggml(d) => d.block_size(),
            Self::Iq4Nl => 32,
            Self::Iq4Xs => 256,
            Self::Mxfp4 => 32,
        }
    }

    pub fn type_size(self) -> usize {
        match self {
            Self::Ggml(d) => d.type_size(),
            Self::Iq4Nl => 18,
            Self::Iq4Xs => 136,
            Self::Mxfp4 => 17,
        }
    }
}

/// The tensors of a type candle does not know, with a copy of the header (through the tensor infos) that
/// names Q4_0 in their place for candle's reader; `None` when the file has none (or
/// the header is malformed: candle's reader then names the problem).
pub(super) fn own_types(bytes: &[u8]) -> Option<(Vec<u8>, HashMap<String, Stored>)> {
    let v1 = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?) == 1;
    let mut w = Walk { rest: bytes.get(8..)?, v1 };
    let (tensors, kvs) = (w.len()?, w.len()?);
    for _ in 0..kvs {
        let n = w.len()?;
        w.take(n)?;
        let ty = w.u32()?;
        w.skip(ty, 0)?;
    }
    let (mut own, mut patches) = (HashMap::new(), Vec::new());
    for _ in 0..tensors {
        let n = w.len()?;
        let name = w.take(n)?;
        let dims = w.u32()?;
        for _ in 0..dims {
            w.len()?;
        }
        let at = bytes.len() - w.rest.len();
        if let Some(stored) = Stored::own(w.u32()?) {
            // As candle names it: trailing NULs dropped, lossy UTF-8.
            let name = &name[..name.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
            own.insert(String::from_utf8_lossy(name).into_owned(), stored);
            patches.push(at);
        }
        w.take(8)?;
    }
    if patches.is_empty() {
        return None;
    }
    let mut header = bytes[..bytes.len() - w.rest.len()].to_vec();
    for at in patches {
        header[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
    }
    Some((header, own))
}
