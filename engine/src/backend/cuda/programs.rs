//! The CUDA C kernel sources, compiled at run time by NVRTC. Each program is the shared
//! prelude (`kernels/common.cuh`) followed by its own file; NVRTC gets no include path.

/// A kernel program: its name and its source file's text.
pub struct Program {
    pub name: &'static str,
    body: &'static str,
}

const COMMON: &str = include_str!("kernels/common.cuh");

pub const QUANTIZE: Program = Program { name: "quantize", body: include_str!("kernels/quantize.cu") };
pub const GEMV: Program = Program { name: "gemv", body: include_str!("kernels/gemv.cu") };
pub const MMQ: Program = Program { name: "mmq", body: include_str!("kernels/mmq.cu") };
pub const OPS: Program = Program { name: "ops", body: include_str!("kernels/ops.cu") };
pub const EMBED: Program = Program { name: "embed", body: include_str!("kernels/embed.cu") };
pub const ATTENTION: Program = Program { name: "attention", body: include_str!("kernels/attention.cu") };
pub const PREFILL: Program = Program { name: "prefill", body: include_str!("kernels/prefill.cu") };

/// Every program, in load order.
pub const ALL: [&Program; 7] = [&QUANTIZE, &GEMV, &MMQ, &OPS, &EMBED, &ATTENTION, &PREFILL];

impl Program {
    /// The full text handed to NVRTC.
    pub fn source(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}.cu\"\n{}", self.name, self.body)
    }
}
