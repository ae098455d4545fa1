//! `Experts` on a GGUF built byte by byte: 4 Q8_0 experts, 2 used, rows of 32.

use super::*;

const H: usize = 32;
const W: usize = 32;
const E: usize = 4;

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

/// Layer 0's router (f32) and three expert stacks, in a GGUF file.
fn file() -> Gguf {
    let router: Vec<u8> =
        (0..E * H).flat_map(|i| ((noise(7 * i + 3) % 2001) as f32 / 1000.0 - 1.0).to_le_bytes()).collect();
    let stack = |seed| q8_0(E * W * H / 32, seed);
    let tensors: [(&str, [u64; 3], u32, Vec<u8>); 4] = [
        ("blk.0.ffn_gate_inp.weight", [H as u64, E as u64, 1], 0, router),
        ("blk.0.ffn_gate_exps.weight", [H as u64, W as u64, E as u64], 8, stack(1_000)),
        ("blk.0.ffn_up_exps.weight", [H as u64, W as u64, E as u64], 8, stack(50_000)),
        ("blk.0.ffn_down_exps.weight", [W as u64, H as u64, E as u64], 8, stack(90_000)),
    ];
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(0u64.to_le_bytes());
    let mut data = Vec::new();
    for (name, dims, ty, bytes) in &tensors {
        s(&mut out, name);
        let dims: &[u64] = if *ty == 0 { &dims[..2] } else { &dims[..] };
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(ty.to_le_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        data.extend(bytes);
        data.resize(data.len().next_multiple_of(32), 0);
    }
    out.resize(out.len().next_multiple_of(32), 0);
    out.extend(data);
    let path = std::env::temp_dir().join(format!("corral-moe-{}.gguf", std::process::id()));
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
    let g = file();
    let m = MoeConfig { experts: E, used: 2, width: W, kind: crate::config::MoeKind::Qwen3 };
    let experts = Experts::load(&g, 0, H, m).unwrap();
    let read = |x: &Experts| x.loaded.iter().filter(|l| l.get().is_some()).count();
    assert_eq!(read(&experts), 1, "the first expert only, at load");
    let x: Vec<f32> = (0..5 * H).map(|i| (noise(i + 11) % 1000) as f32 / 250.0 - 2.0).collect();
    let got = experts.forward(&x).unwrap();
    let mut chosen = [false; E];
    chosen[0] = true;
    for (r, row) in x.chunks_exact(H).enumerate() {
        let route = route::route(&experts.logits(row), 2);
        let mut want = vec![0.0f32; H];
        for (slot, &(e, w)) in route.iter().enumerate() {
            chosen[e] = true;
            let mat = |s: &Stack| s.matrix(&experts.map, E, e).unwrap();
            let [wg, wu, wd] = [mat(&experts.stacks[0]), mat(&experts.stacks[1]), mat(&experts.stacks[2])];
            let mut gate = wg.forward(row, 1).unwrap();
            ops::silu_mul(&mut gate, &wu.forward(row, 1).unwrap());
            let d = wd.forward(&gate, 1).unwrap();
            for (y, d) in want.iter_mut().zip(d) {
                *y = if slot == 0 { d * w } else { *y + d * w };
            }
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[r * H..(r + 1) * H]), bits(&want), "row {r}");
        assert!(want.iter().any(|&v| v != 0.0));
    }
    assert_eq!(read(&experts), chosen.iter().filter(|&&c| c).count());
}
