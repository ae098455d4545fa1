//! Compute backends other than the CPU kernels in `crate::kernels`.
//!
//! Today only `cuda`: op-level device kernels checked against the CPU ops. Nothing here
//! is wired into the model forward yet; the CPU path is unaffected by this module.

pub mod cuda;
