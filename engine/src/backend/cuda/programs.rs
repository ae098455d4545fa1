//! The CUDA C kernel sources, compiled at run time by NVRTC. Each program is the shared
//! prelude (`kernels/common.cuh`) followed by its own files; NVRTC gets no include path.

/// A kernel program: its name and its source files' text, in order (a later file may use
/// what an earlier one defines). A concept too big for one file is two files of one
/// program, so its launches name one program.
pub struct Program {
    pub name: &'static str,
    files: &'static [(&'static str, &'static str)],
}

const COMMON: &str = include_str!("kernels/common.cuh");

pub const QUANTIZE: Program =
    Program { name: "quantize", files: &[("quantize.cu", include_str!("kernels/quantize.cu"))] };
pub const GEMV: Program = Program {
    name: "gemv",
    files: &[
        ("gemv.cu", include_str!("kernels/gemv.cu")),
        ("gemv_k.cu", include_str!("kernels/gemv_k.cu")),
        ("gemv_f.cu", include_str!("kernels/gemv_f.cu")),
        ("gemv_rows.cu", include_str!("kernels/gemv_rows.cu")),
        ("gemv1.cu", include_str!("kernels/gemv1.cu")),
        ("gemv_id.cu", include_str!("kernels/gemv_id.cu")),
    ],
};
pub const MMQ: Program = Program {
    name: "mmq",
    files: &[("mmq.cu", include_str!("kernels/mmq.cu")), ("mmq_id.cu", include_str!("kernels/mmq_id.cu"))],
};
pub const OPS: Program = Program { name: "ops", files: &[("ops.cu", include_str!("kernels/ops.cu"))] };
pub const EMBED: Program = Program { name: "embed", files: &[("embed.cu", include_str!("kernels/embed.cu"))] };
pub const ATTENTION: Program = Program {
    name: "attention",
    files: &[
        ("kv.cu", include_str!("kernels/kv.cu")),
        ("attention.cu", include_str!("kernels/attention.cu")),
        ("flashdec.cu", include_str!("kernels/flashdec.cu")),
    ],
};
pub const MOE: Program = Program {
    name: "moe",
    files: &[("moe.cu", include_str!("kernels/moe.cu")), ("moe_tiles.cu", include_str!("kernels/moe_tiles.cu"))],
};
pub const HYBRID: Program = Program { name: "hybrid", files: &[("hybrid.cu", include_str!("kernels/hybrid.cu"))] };
pub const PREFILL: Program = Program { name: "prefill", files: &[("prefill.cu", include_str!("kernels/prefill.cu"))] };

/// Every program, in load order.
pub const ALL: [&Program; 9] = [&QUANTIZE, &GEMV, &MMQ, &OPS, &EMBED, &ATTENTION, &PREFILL, &MOE, &HYBRID];

impl Program {
    /// The full text handed to NVRTC.
    pub fn source(&self) -> String {
        let mut source = COMMON.to_owned();
        for (file, text) in self.files {
            source.push_str(&format!("\n#line 1 \"{file}\"\n{text}"));
        }
        source
    }
}
