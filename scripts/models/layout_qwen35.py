"""make-gguf's layout of the Qwen3.5 hybrids (qwen35 dense, qwen35moe): the tensors and
metadata after token_embd, as llama.cpp's converter writes them and its loader reads them.
Gated DeltaNet layers, with every `interval`-th layer gated full attention; after each
mixer, `post_attention_norm` and either a SwiGLU MLP (qwen35) or a mixture of experts with
a shared expert (qwen35moe: an f32 router `ffn_gate_inp`, the experts stacked in 3-D
`ffn_{gate,up,down}_exps`, the shared expert `ffn_{gate,up,down}_shexp` and its f32 gate
`ffn_gate_inp_shexp`). A preset with `mtp` appends that many multi-token-prediction blocks
(`nextn_predict_layers`): a full-attention block with the layer's FFN plus `nextn.eh_proj`,
`nextn.enorm`, `nextn.hnorm` and `nextn.shared_head_norm`, which llama.cpp loads only to
draft tokens. Like Qwen3.5 MoE's converter, qwen35moe presets write the per-layer
`attention.recurrent_layers` flags (bools) and no `feed_forward_length`.
"""
import numpy as np

from gguf_kv import kv
from presets import recurrent_layers

F32 = "F32"


def qwen35_layout(p, t, values, mat, out, tied, V):
    """qwen35's or qwen35moe's tensors and metadata (appended to `t`, after token_embd);
    `values` gets the f32 tensors that are not random (`ssm_a`)."""
    a, H, L, NH, NKV, HD = p["arch"], p["hidden"], p["layers"], p["heads"], p["kv_heads"], p["head_dim"]
    interval, taps, HS, KH, VH, n_rot, sections = p["hybrid"]
    conv = 2 * KH * HS + VH * HS
    mtp = p.get("mtp", 0)
    rec = recurrent_layers(p)
    for i, r in enumerate(rec + [False] * mtp):
        b = f"blk.{i}."
        t.append((b + "attn_norm.weight", [H], F32))
        if r:
            # ssm_a is -exp(A_log): negative, so exp(g) < 1 and every state decays.
            values[b + "ssm_a"] = (-(np.arange(VH, dtype=np.float32) + 1.0) * np.float32(2.0 / VH)).astype(np.float32)
            t += [(b + "attn_qkv.weight", [H, conv], mat), (b + "attn_gate.weight", [H, VH * HS], mat),
                  (b + "ssm_conv1d.weight", [taps, conv], F32), (b + "ssm_dt.bias", [VH], F32), (b + "ssm_a", [VH], F32),
                  (b + "ssm_beta.weight", [H, VH], mat), (b + "ssm_alpha.weight", [H, VH], mat),
                  (b + "ssm_norm.weight", [HS], F32), (b + "ssm_out.weight", [VH * HS, H], mat)]
        else:  # each head's query and its gate side by side in attn_q
            t += [(b + "attn_q.weight", [H, 2 * NH * HD], mat), (b + "attn_k.weight", [H, NKV * HD], mat),
                  (b + "attn_v.weight", [H, NKV * HD], mat), (b + "attn_q_norm.weight", [HD], F32),
                  (b + "attn_k_norm.weight", [HD], F32), (b + "attn_output.weight", [NH * HD, H], mat)]
        t.append((b + "post_attention_norm.weight", [H], F32))
        t += ffn(p, b, mat)
        if i >= L:  # a multi-token-prediction block
            t += [(b + "nextn.eh_proj.weight", [2 * H, H], mat), (b + "nextn.enorm.weight", [H], F32),
                  (b + "nextn.hnorm.weight", [H], F32), (b + "nextn.shared_head_norm.weight", [H], F32)]
    t.append(("output_norm.weight", [H], F32))
    if not tied:
        t.append(("output.weight", [H, V], out))
    dense = [] if "experts" in p else [kv(f"{a}.feed_forward_length", p["ffn"], "u32")]
    meta = [kv(f"{a}.context_length", p["ctx"], "u32"), kv(f"{a}.embedding_length", H, "u32"),
            kv(f"{a}.block_count", L + mtp, "u32")] + dense + [
            kv(f"{a}.attention.head_count", NH, "u32"), kv(f"{a}.attention.head_count_kv", NKV, "u32"),
            kv(f"{a}.attention.key_length", HD, "u32"), kv(f"{a}.attention.value_length", HD, "u32"),
            kv(f"{a}.rope.freq_base", p["rope"], "f32"), kv(f"{a}.rope.dimension_count", n_rot, "u32"),
            kv(f"{a}.rope.dimension_sections", list(sections), "i32s"),
            kv(f"{a}.attention.layer_norm_rms_epsilon", 1e-6, "f32"),
            kv(f"{a}.ssm.conv_kernel", taps, "u32"), kv(f"{a}.ssm.inner_size", VH * HS, "u32"),
            kv(f"{a}.ssm.state_size", HS, "u32"), kv(f"{a}.ssm.time_step_rank", VH, "u32"),
            kv(f"{a}.ssm.group_count", KH, "u32"), kv(f"{a}.full_attention_interval", interval, "u32")]
    if "experts" in p:
        E, used, FE = p["experts"]
        meta += [kv(f"{a}.expert_count", E, "u32"), kv(f"{a}.expert_used_count", used, "u32"),
                 kv(f"{a}.expert_feed_forward_length", FE, "u32"),
                 kv(f"{a}.expert_shared_feed_forward_length", p["shared"], "u32"),
                 kv(f"{a}.attention.recurrent_layers", rec + [False] * mtp, "bools")]
    if mtp:
        meta.append(kv(f"{a}.nextn_predict_layers", mtp, "u32"))
    return t, meta


def ffn(p, b, mat):
    """Block `b`'s feed-forward tensors: a SwiGLU MLP, or routed experts and a shared one."""
    H = p["hidden"]
    if "experts" not in p:
        F = p["ffn"]
        return [(b + "ffn_gate.weight", [H, F], mat), (b + "ffn_up.weight", [H, F], mat),
                (b + "ffn_down.weight", [F, H], mat)]
    E, _, FE = p["experts"]
    FS = p["shared"]
    return [(b + "ffn_gate_inp.weight", [H, E], F32), (b + "ffn_gate_exps.weight", [H, FE, E], mat),
            (b + "ffn_up_exps.weight", [H, FE, E], mat), (b + "ffn_down_exps.weight", [FE, H, E], mat),
            (b + "ffn_gate_inp_shexp.weight", [H], F32), (b + "ffn_gate_shexp.weight", [H, FS], mat),
            (b + "ffn_up_shexp.weight", [H, FS], mat), (b + "ffn_down_shexp.weight", [FS, H], mat)]
