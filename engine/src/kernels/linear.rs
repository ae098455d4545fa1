//! Weight matrices and the embedding table in their stored (quantized) format.
//!
//! `Linear::forward` is the matmul seam: `[m, in] x W^T -> [m, out]` on plain f32
//! slices, dispatched per GGML type: our own llama.cpp-faithful kernels where we have
//! them (`super::quant`), candle's `QMatMul` (its AVX2/AVX-512 and NEON vec-dot and
//! repacked kernels) for every other format. The IQ4 types, which candle does not read,
//! have only our kernels (and the embedding table its own row dequantization).

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::quant::{Job, QuantMatMul, Src};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, Stored};

enum Kernel {
    Own(QuantMatMul),
    Candle(QMatMul),
}

pub struct Linear {
    kernel: Kernel,
    in_dim: usize,
    out_dim: usize,
    dtype: Stored,
}

impl Linear {
    /// Load `name`, checking it is `[out_dim, in_dim]`.
    pub fn load(g: &Gguf, name: &str, in_dim: usize, out_dim: usize) -> Result<Self> {
        Self::load_rows(g, name, in_dim, out_dim, 0..out_dim)
    }

    /// Rows `rows` of `name`, an `[n, in_dim]` matrix, as a matrix of their own (a fused
    /// weight's part: each output row's dot product is the same as in the whole).
    pub fn load_rows(g: &Gguf, name: &str, in_dim: usize, n: usize, rows: std::ops::Range<usize>) -> Result<Self> {
        let dims = g.dims(name)?;
        if dims != [n, in_dim] {
            return Err(Error::Tensor {
                name: name.to_owned(),
                reason: format!("shape {dims:?}, expected [{n}, {in_dim}]"),
            });
        }
        let out_dim = rows.len();
        let (bytes, dtype) = g.raw_rows_stored(name, rows.clone())?;
        let kernel = if QuantMatMul::supports(dtype, in_dim) {
            Kernel::Own(QuantMatMul::from_bytes(name, dtype, bytes, in_dim, out_dim)?.with_rows_in_file(n))
        } else {
            Kernel::Candle(QMatMul::from_qtensor(g.qtensor_rows(name, rows)?)?)
        };
        Ok(Self { kernel, in_dim, out_dim, dtype })
    }

    /// An `[out_dim, in_dim]` matrix from its stored bytes: one expert's slice of a
    /// mixture of experts' 3-D `ffn_*_exps` tensor (`name` for errors). Its matmul is the
    /// one a matrix of its own would take (IQ4_NL repacked by its own row count).
    pub fn from_stored(name: &str, bytes: &[u8], dtype: Stored, in_dim: usize, out_dim: usize) -> Result<Self> {
        let kernel = match dtype {
            _ if QuantMatMul::supports(dtype, in_dim) => {
                Kernel::Own(QuantMatMul::from_bytes(name, dtype, bytes, in_dim, out_dim)?.with_rows_in_file(out_dim))
            }
            Stored::Ggml(d) => {
                Kernel::Candle(QMatMul::from_qtensor(crate::gguf::qtensor_of(bytes, d, (out_dim, in_dim).into())?)?)
            }
            other => {
                let reason = format!("{other:?} matrices with rows of {in_dim} are not supported");
                return Err(Error::Tensor { name: name.to_owned(), reason });
            }
        };
        Ok(Self { kernel, in_dim, out_dim, dtype })
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    pub fn dtype(&self) -> Stored {
        self.dtype
    }

    /// `x` is `[m, in_dim]` row-major; returns `[m, out_dim]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        debug_assert_eq!(x.len(), m * self.in_dim);
        match &self.kernel {
            Kernel::Own(k) => Ok(k.forward(x, m)),
            Kernel::Candle(w) => {
                let t = Tensor::from_slice(x, (m, self.in_dim), &Device::Cpu)?;
                Ok(w.forward(&t)?.flatten_all()?.to_vec1::<f32>()?)
            }
        }
    }
}

/// Several matrices of the same input width against one `x` (`[m, in_dim]`): with our
/// own kernels in one pool call (`QuantMatMul::forward_many`), otherwise one by one.
pub fn forward_many<const N: usize>(mats: [&Linear; N], x: &[f32], m: usize) -> Result<[Vec<f32>; N]> {
    debug_assert!(mats.iter().all(|l| l.in_dim == mats[0].in_dim));
    let own: Vec<&QuantMatMul> = mats
        .iter()
        .filter_map(|l| match &l.kernel {
            Kernel::Own(k) => Some(k),
            Kernel::Candle(_) => None,
        })
        .collect();
    let outs = if own.len() == N {
        QuantMatMul::forward_many(&own, x, m)
    } else {
        mats.iter().map(|l| l.forward(x, m)).collect::<Result<Vec<_>>>()?
    };
    Ok(outs.try_into().unwrap_or_else(|_| unreachable!("one output per matrix")))
}

/// Matrices each against rows of its own (`(w, x, m)`: `w` against the `m` rows `x`, a
/// slice of their own or rows picked from a shared batch), job `i`'s `[m, out_dim]`
/// product written into `outs[i]`: with our own kernels in one pool call
/// (`QuantMatMul::forward_each`, picked rows quantized once for every job that picks
/// them), otherwise one by one. A mixture's experts run this way, every expert's rows in
/// one barrier.
pub(crate) fn forward_each(jobs: &[(&Linear, Src<'_>, usize)], outs: &mut [&mut [f32]]) -> Result<()> {
    let own: Vec<Job<'_>> = jobs
        .iter()
        .filter_map(|&(l, x, m)| match &l.kernel {
            Kernel::Own(w) => Some(Job { w, x, m }),
            Kernel::Candle(_) => None,
        })
        .collect();
    if own.len() == jobs.len() {
        QuantMatMul::forward_each(&own, outs);
        return Ok(());
    }
    for (&(l, x, m), out) in jobs.iter().zip(outs.iter_mut()) {
        out.copy_from_slice(&l.forward(&x.gather(l.in_dim), m)?);
    }
    Ok(())
}

/// Token embedding table, looked up row by row without dequantizing the whole matrix
/// (Gemma's 262k x 640 table would be 670 MB as f32).
pub struct Embedding {
    table: Table,
    vocab: usize,
}

enum Table {
    Candle(QTensor),
    /// An IQ4 table's stored rows, dequantized row by row as ggml's `get_rows` does.
    Own {
        bytes: Vec<u8>,
        dtype: Stored,
        hidden: usize,
    },
}

impl Embedding {
    pub fn load(g: &Gguf, name: &str, vocab: usize, hidden: usize) -> Result<Self> {
        let dims = g.dims(name)?;
        if dims != [vocab, hidden] {
            return Err(Error::Tensor {
                name: name.to_owned(),
                reason: format!("shape {dims:?}, expected [{vocab}, {hidden}]"),
            });
        }
        let table = match g.raw_stored(name)? {
            (_, Stored::Ggml(_)) => Table::Candle(g.qtensor(name)?),
            (bytes, dtype) => {
                if !hidden.is_multiple_of(dtype.block_size()) {
                    let reason = format!("row length {hidden} is not a multiple of {}", dtype.block_size());
                    return Err(Error::Tensor { name: name.to_owned(), reason });
                }
                Table::Own { bytes: bytes.to_vec(), dtype, hidden }
            }
        };
        Ok(Self { table, vocab })
    }

    /// `[tokens.len(), hidden]`. Ids were validated against the vocabulary by the caller.
    pub fn lookup(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        debug_assert!(tokens.iter().all(|&t| (t as usize) < self.vocab));
        match &self.table {
            Table::Candle(table) => {
                let ids = Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?;
                Ok(table.embedding(&ids)?.flatten_all()?.to_vec1::<f32>()?)
            }
            Table::Own { bytes, dtype, hidden } => {
                let row = hidden / dtype.block_size() * dtype.type_size();
                let mut out = Vec::with_capacity(tokens.len() * hidden);
                for &t in tokens {
                    let at = t as usize * row;
                    out.extend(super::quant::dequantize_row(*dtype, &bytes[at..at + row]));
                }
                Ok(out)
            }
        }
    }
}
