//! The CUDA backend, op level: kernels as CUDA C sources (`kernels/*.cu`) compiled at
//! run time by NVRTC to a CUBIN for the device's own architecture, loaded through
//! cudarc with dynamic loading (the build needs no CUDA toolkit; a machine without a
//! driver or NVRTC gets `Unavailable` naming the missing library, never a panic).
//!
//! Owns: library probing, the device context and stream, weight repacking/upload, and
//! one host wrapper per op (activation quantization, quantized GEMV, RMSNorm, RoPE,
//! SiLU/GELU gating, residual add, argmax, attention over the device KV mirror), and
//! `CudaBackend`, the model forward's `Backend` on the GPU (`forward.rs`). `tests.rs`
//! checks every op against the CPU op, `tests_model.rs` whole models against the CPU.

mod attention;
mod device;
mod download;
pub mod fit;
mod flashdec;
mod formats;
mod forward;
mod fused;
mod gemm;
mod gemv;
mod graph;
mod hybrid;
mod kv;
mod mmq;
mod mmq_id;
mod moe;
mod ops;
mod pass;
mod probe;
pub mod programs;
mod recurrent;
mod rope;
mod runs;
mod sinks;
mod weights;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_flash;
#[cfg(test)]
mod tests_gemv;
#[cfg(test)]
mod tests_hybrid;
#[cfg(test)]
mod tests_kv;
#[cfg(test)]
mod tests_mmq;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_moe;
#[cfg(test)]
mod tests_moe_mmq;
#[cfg(test)]
mod tests_ops;

pub use device::{Gpu, compile_cubin};
pub use forward::{CudaBackend, CudaPass};
pub use ops::{ActFormat, DeviceAct, GEMV_MAX_ROWS, RopeSpec};
pub use probe::{Library, Presence, Unavailable};
pub use weights::{DeviceWeights, MatrixBytes};
