//! `Experts` on a GGUF built byte by byte: 4 experts, 2 used, rows of 32 — Q8_0 for
//! qwen3moe (and qwen35moe, with a shared expert); MXFP4 with f32 biases (router and
//! experts) for gpt-oss. The CUDA backend's experts are tested against these on the same
//! file (`file`).

use super::*;

pub(crate) const H: usize = 32;
pub(crate) const W: usize = 32;
pub(crate) const E: usize = 4;

fn s(out: &mut Vec<u8>, v: &str) {
    out.extend((v.len() as u64).to_le_bytes());
    out.extend(v.as_bytes());
}

/// Deterministic 32-bit noise.
fn noise(i: usize) -> u64 {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 32
}

/// `n` Q8_0 blocks, d = 2^-7, values in -127..=127.
fn q8_0(n: usize, seed: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for b in 0..n {
        out.extend(0x2000u16.to_le_bytes());
        out.extend((0..32).map(|j| ((noise(seed + b * 32 + j) % 255) as i32 - 127) as i8 as u8));
    }
    out
}

/// `n` Q4_0 blocks, d = 2^-4, random nibbles.
fn q4_0(n: usize, seed: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for b in 0..n {
        out.extend(0x2c00u16.to_le_bytes());
        out.extend((0..16).map(|j| noise(seed + b * 16 + j) as u8));
    }
    out
}

/// `n` MXFP4 blocks, exponents 120..=123 (scales 2^-8..2^-5), random nibbles.
fn mxfp4(n: usize, seed: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for b in 0..n {
        out.push(120 + (noise(seed + b * 17) % 4) as u8);
        out.extend((0..16).map(|j| noise(seed + b * 17 + 1 + j) as u8));
    }
    out
}

/// `n` f32 values in [-1, 1].
fn f32s(n: usize, seed: usize) -> Vec<u8> {
    (0..n).flat_map(|i| ((noise(seed + 7 * i + 3) % 2001) as f32 / 1000.0 - 1.0).to_le_bytes()).collect()
}

/// Layer 0's router (f32) and three expert stacks, in a GGUF file; gpt-oss's as MXFP4
/// with biases.
pub(crate) fn file(kind: MoeKind) -> Gguf {
    file_with(kind, Vec::new())
}

/// qwen3moe's `file` with Q4_0 experts.
pub(crate) fn file_q4_0() -> Gguf {
    stacks_file(MoeKind::Qwen3, true, Vec::new())
}

/// `file`'s tensors and `extra`.
fn file_with(kind: MoeKind, extra: Vec<(&str, Vec<u64>, u32, Vec<u8>)>) -> Gguf {
    stacks_file(kind, false, extra)
}

/// `file_with`, qwen3moe's experts Q4_0 if `q4`.
fn stacks_file(kind: MoeKind, q4: bool, extra: Vec<(&str, Vec<u64>, u32, Vec<u8>)>) -> Gguf {
    let (h, w, e) = (H as u64, W as u64, E as u64);
    let mut tensors: Vec<(&str, Vec<u64>, u32, Vec<u8>)> =
        vec![("blk.0.ffn_gate_inp.weight", vec![h, e], 0, f32s(E * H, 0))];
    let names = ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"];
    let dims = [vec![h, w, e], vec![h, w, e], vec![w, h, e]];
    for ((name, dims), seed) in names.iter().zip(dims).zip([1_000, 50_000, 90_000]) {
        let (ty, bytes) = match kind {
            MoeKind::Qwen3 if q4 => (2, q4_0(E * W * H / 32, seed)),
            MoeKind::Qwen3 => (8, q8_0(E * W * H / 32, seed)),
            MoeKind::GptOss => (39, mxfp4(E * W * H / 32, seed)),
        };
        tensors.push((name, dims, ty, bytes));
    }
    let mut names_w: Vec<String> = Vec::new();
    if kind == MoeKind::GptOss {
        names_w = ["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
            .iter()
            .map(|n| format!("blk.0.{n}.bias"))
            .collect();
    }
    let bias_dims = [vec![e], vec![w, e], vec![w, e], vec![h, e]];
    for ((name, dims), seed) in names_w.iter().zip(bias_dims).zip([5, 7_000, 60_000, 99_000]) {
        let n = dims.iter().product::<u64>() as usize;
        tensors.push((name.as_str(), dims, 0, f32s(n, seed)));
    }
    tensors.extend(extra);
    write(&tensors)
}

fn write(tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Gguf {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(0u64.to_le_bytes());
    let mut data = Vec::new();
    for (name, dims, ty, bytes) in tensors {
        s(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(ty.to_le_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        data.extend(bytes);
        data.resize(data.len().next_multiple_of(32), 0);
    }
    out.resize(out.len().next_multiple_of(32), 0);
    out.extend(data);
    let n = tensors.len() + tensors.iter().map(|t| t.0.len()).sum::<usize>();
    let path = std::env::temp_dir().join(format!("corral-moe-{}-{n}.gguf", std::process::id()));
    std::fs::write(&path, &out).unwrap();
    let g = Gguf::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    g
}

/// Rows of a batch share experts; each row's output must be its own route's weighted
/// sum of its experts' MLPs, each expert run on that row alone, bit for bit; and experts
/// are read only once chosen.
#[test]
fn each_row_is_its_own_routes_weighted_sum_and_only_chosen_experts_are_read() {
    for kind in [MoeKind::Qwen3, MoeKind::GptOss] {
        rows_alone(kind);
    }
}

fn rows_alone(kind: MoeKind) {
    let g = file(kind);
    let m = MoeConfig { experts: E, used: 2, width: W, kind, shared: None };
    let experts = Experts::load(&g, 0, H, m).unwrap();
    let read = |x: &Experts| x.loaded.iter().filter(|l| l.get().is_some()).count();
    assert_eq!(read(&experts), 1, "the first expert only, at load");
    let x: Vec<f32> = (0..5 * H).map(|i| (noise(i + 11) % 1000) as f32 / 250.0 - 2.0).collect();
    let got = experts.forward(&x).unwrap();
    let mut chosen = [false; E];
    chosen[0] = true;
    for (r, row) in x.chunks_exact(H).enumerate() {
        let route = match kind {
            MoeKind::Qwen3 => route::route(&experts.logits(row), 2),
            MoeKind::GptOss => route::route_softmax_weight(&experts.logits(row), 2),
        };
        let mut want = vec![0.0f32; H];
        for (slot, &(e, w)) in route.iter().enumerate() {
            chosen[e] = true;
            let mat = |s: &Stack| s.matrix(&experts.map, E, e).unwrap();
            let [wg, wu, wd] = [mat(&experts.stacks[0]), mat(&experts.stacks[1]), mat(&experts.stacks[2])];
            let (mut gate, mut up) = (wg.forward(row, 1).unwrap(), wu.forward(row, 1).unwrap());
            let d = match &experts.biases {
                None => {
                    ops::silu_mul(&mut gate, &up);
                    wd.forward(&gate, 1).unwrap()
                }
                Some([bg, bu, bd]) => {
                    gate.iter_mut().zip(&bg[e * W..]).for_each(|(x, b)| *x += b);
                    up.iter_mut().zip(&bu[e * W..]).for_each(|(x, b)| *x += b);
                    ops::swiglu_oai(&mut gate, &up);
                    let mut d = wd.forward(&gate, 1).unwrap();
                    d.iter_mut().zip(&bd[e * H..]).for_each(|(x, b)| *x += b);
                    d
                }
            };
            for (y, d) in want.iter_mut().zip(d) {
                *y = if slot == 0 { d * w } else { *y + d * w };
            }
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[r * H..(r + 1) * H]), bits(&want), "{kind:?} row {r}");
        assert!(want.iter().any(|&v| v != 0.0));
    }
    assert_eq!(read(&experts), chosen.iter().filter(|&&c| c).count());
    assert!(chosen.iter().filter(|&&c| c).count() > 2, "{kind:?}: rows routed to different experts");
    if kind == MoeKind::GptOss {
        assert!(experts.router_bias.is_some() && experts.biases.is_some());
    }
}

/// qwen35moe: the routed experts' output plus, per row, sigmoid(x·`ffn_gate_inp_shexp`)
/// times the shared expert's SwiGLU MLP run on that row alone, the product rounded before
/// the sum, bit for bit; a file without the shared expert, or with fused gate|up experts,
/// is refused.
#[test]
fn the_shared_expert_is_added_gated_by_its_own_sigmoid() {
    const S: usize = 64;
    let (h, s) = (H as u64, S as u64);
    let shared = vec![
        ("blk.0.ffn_gate_inp_shexp.weight", vec![h], 0, f32s(H, 123)),
        ("blk.0.ffn_gate_shexp.weight", vec![h, s], 8, q8_0(S * H / 32, 3_000)),
        ("blk.0.ffn_up_shexp.weight", vec![h, s], 8, q8_0(S * H / 32, 33_000)),
        ("blk.0.ffn_down_shexp.weight", vec![s, h], 8, q8_0(S * H / 32, 77_000)),
    ];
    let g = file_with(MoeKind::Qwen3, shared);
    let m = MoeConfig { experts: E, used: 2, width: W, kind: MoeKind::Qwen3, shared: Some(S) };
    let with = Experts::load(&g, 0, H, m).unwrap();
    let routed = Experts::load(&g, 0, H, MoeConfig { shared: None, ..m }).unwrap();
    let x: Vec<f32> = (0..3 * H).map(|i| (noise(i + 5) % 1000) as f32 / 250.0 - 2.0).collect();
    let (got, base) = (with.forward(&x).unwrap(), routed.forward(&x).unwrap());
    let lin = |n: &str, i, o| Linear::load(&g, &format!("blk.0.{n}.weight"), i, o).unwrap();
    let (wg, wu, wd) = (lin("ffn_gate_shexp", H, S), lin("ffn_up_shexp", H, S), lin("ffn_down_shexp", S, H));
    let gate_inp = g.f32_tensor("blk.0.ffn_gate_inp_shexp.weight", H).unwrap();
    for (r, row) in x.chunks_exact(H).enumerate() {
        let (mut gate, up) = (wg.forward(row, 1).unwrap(), wu.forward(row, 1).unwrap());
        ops::silu_mul(&mut gate, &up);
        let d = wd.forward(&gate, 1).unwrap();
        let sg = 1.0 / (1.0 + (-crate::kernels::attention::dot_lanes(&gate_inp, row)).exp());
        assert!(sg > 0.0 && sg < 1.0 && sg != 0.5);
        let want: Vec<u32> = base[r * H..][..H].iter().zip(&d).map(|(b, d)| (b + d * sg).to_bits()).collect();
        let have: Vec<u32> = got[r * H..][..H].iter().map(|v| v.to_bits()).collect();
        assert_eq!(have, want, "row {r}");
        assert_ne!(got[r * H..][..H], base[r * H..][..H], "row {r}: the shared expert added something");
    }
    let plain = file(MoeKind::Qwen3);
    assert!(Experts::load(&plain, 0, H, m).is_err(), "a shared expert the file lacks");
    let fused =
        vec![("blk.0.ffn_gate_up_exps.weight", vec![h, 2 * W as u64, E as u64], 8, q8_0(E * 2 * W * H / 32, 1))];
    let err = Experts::load(&file_with(MoeKind::Qwen3, fused), 0, H, MoeConfig { shared: None, ..m }).err();
    assert!(err.is_some_and(|e| e.to_string().contains("fused")), "fused gate|up experts are refused");
}
