//! The CUDA C kernel sources, compiled at run time by NVRTC. Each program is the shared
//! prelude (`kernels/common.cuh`) followed by its own file; NVRTC gets no include path.

/// A kernel program: its name, definitions put before its file, and the file's text.
pub struct Program {
    pub name: &'static str,
    defines: &'static str,
    body: &'static str,
}

const COMMON: &str = include_str!("kernels/common.cuh");

pub const QUANTIZE: Program = Program { name: "quantize", defines: "", body: include_str!("kernels/quantize.cu") };
pub const GEMV: Program = Program { name: "gemv", defines: "", body: include_str!("kernels/gemv.cu") };
/// The GEMV kernels for 2 to 8 activation rows: the same file, compiled apart (in
/// parallel with the rest) because its unrolled kernels take seconds to compile.
pub const GEMV_ROWS: Program =
    Program { name: "gemv_rows", defines: "#define GEMV_ROWS\n", body: include_str!("kernels/gemv.cu") };
pub const MMQ: Program = Program { name: "mmq", defines: "", body: include_str!("kernels/mmq.cu") };
pub const OPS: Program = Program { name: "ops", defines: "", body: include_str!("kernels/ops.cu") };
pub const EMBED: Program = Program { name: "embed", defines: "", body: include_str!("kernels/embed.cu") };
pub const ATTENTION: Program = Program { name: "attention", defines: "", body: include_str!("kernels/attention.cu") };
pub const PREFILL: Program = Program { name: "prefill", defines: "", body: include_str!("kernels/prefill.cu") };

/// Every program, in load order.
pub const ALL: [&Program; 8] = [&QUANTIZE, &GEMV, &GEMV_ROWS, &MMQ, &OPS, &EMBED, &ATTENTION, &PREFILL];

impl Program {
    /// The full text handed to NVRTC.
    pub fn source(&self) -> String {
        format!("{COMMON}\n{}#line 1 \"{}.cu\"\n{}", self.defines, self.name, self.body)
    }
}
