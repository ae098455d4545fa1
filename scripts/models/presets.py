"""make-gguf's presets: the shapes and the rotary/vocabulary settings of each noise model
(imported by scripts/models/make-gguf; `make-gguf --list` prints them).

llama `tiny`, `smol` (SmolLM2-135M shapes), `1b`, `8b` (a SentencePiece filler vocabulary; `1b` and
`8b` declare a 131,072-token context, as Llama 3.2 1B and 3.1 8B do, so scripts/bench/gpu's long
prompts fit);
gemma3 `gtiny` (6 layers: five sliding-window, one global) and `g270m` (Gemma 3 270M shapes,
its 262,144-token vocabulary).

The families of issue 33, tiny (2 layers, hidden 256), each with its family's real tokenizer
vocabulary (a llama.cpp vocab-only file, named by `vocab`):
  `llama3`   Llama 3.1's rope_freqs (factor 8, low/high 1/4, original context 8192, as
             convert_hf_to_gguf computes them), tied embeddings (3.2), llama-bpe;
  `qwen2`    Q/K/V biases, YaRN factor 4 (original 32,768), an output matrix, qwen2;
  `qwen3`    Q and K head norms, head size 128 (key_length != hidden/heads), tied, qwen2;
  `mistral3` YaRN 16 with β 32/1 and log multiplier 1, attention temperature 0.1 over an
             original context of 16 (so it acts within a prompt), tied, llama-bpe
             (llama.cpp has no vocab-only tekken file);
  `phi3`     fused attn_qkv and gate|up ffn_up, LongRoPE factors with an original context
             of 2,048 (a 4,096 context takes the long ones), attn_factor 1.19, a sliding
             window llama.cpp ignores, phi-3;
  `qwen3moe` qwen3's attention and a mixture of experts in every layer: an f32 router
             (`ffn_gate_inp`), 16 experts of which 4 are used, experts 256 wide (so
             llama-quantize's K-quants fit their rows), tied, qwen2;
  `gpt-oss`  4 layers alternating a sliding window of 16 (even layers: the parity prompts
             cross it) with full attention, 8 heads of 64, Q/K/V and output biases, a sink
             logit per head, YaRN 32 over an original context of 4,096, 8 MXFP4 experts
             (whatever --type says) of which 4 are used, 256 wide, with biases, an f32 router
             with a bias, an output matrix, o200k_harmony (scripts/models/vocab-o200k: gpt-oss's
             own vocabulary, so the file gets the harmony template);
  `qwen35`   Qwen3.5's hybrid: 4 layers, the 4th gated full attention (4 heads of 128 over 2
             K/V heads, each query with its sigmoid gate, Q/K norms, M-RoPE sections 6/5/5
             over the first 32 dimensions), the others Gated DeltaNet (2 key heads and 4
             value heads of 64, a 4-tap convolution; `ssm_a` negative, so every state
             decays), tied, qwen35 (llama.cpp's Qwen3.5 test vocabulary: 151,936 tokens of
             the qwen2 family with its own pre-tokenizer);
  `qwen35moe` qwen35's hybrid layers with a mixture of experts in place of every MLP, as
             Qwen3.5 MoE's converter writes it: an f32 router over 16 experts of which 4 are
             used, 256 wide, a shared expert 256 wide with its f32 sigmoid gate, the
             per-layer recurrent flags, no dense width, and one multi-token-prediction
             block after the 4 layers (which both engines leave unread); tied, qwen35.

The same families at the shapes of the released models people download, `<family>-<size>`
(values from each model's config.json; the weights are noise, so only shapes, rotary
settings and vocabulary matter):
  `llama3-1b`    Llama 3.2 1B: rope_freqs factor 32, low/high 1/4, original context 8192;
                 tied;
  `qwen2-0.5b`   Qwen2.5 0.5B: Q/K/V biases, no rotary scaling, tied;
  `qwen3-0.6b`   Qwen3 0.6B: head size 128, tied;
  `qwen3-8b`     Qwen3 8B: head size 128, an output matrix;
  `mistral3-3b`  Ministral 3 3B: head size 128 (hidden/heads is 96), YaRN 16 over an
                 original context of 16,384 with β 32/1 and log multiplier 1, attention
                 temperature 0.1 (its floor scale the original context), tied, llama-bpe
                 standing in for tekken;
  `phi3-mini`    Phi-3 mini 128k: LongRoPE over an original context of 4,096 (so the
                 oracle's 4,096 context takes the short factors), attn_factor 1.19;
  `qwen3moe-30b-a3b`  Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B, the same shapes): 48 layers,
                 head size 128, 128 experts of which 8 are used, experts 768 wide, an output
                 matrix (30.5 B parameters, 3.3 B active per token);
  `gpt-oss-20b`  gpt-oss-20b: 24 layers, hidden 2,880, 64 heads of 64 over 8 K/V heads,
                 sliding window 128 on even layers, rotary base 150,000 with YaRN 32 over
                 4,096, 32 MXFP4 experts of which 4 are used, 2,880 wide, an output matrix,
                 a vocabulary of 201,088 (20.9 B parameters; 4.2 B active per token as
                 --list counts them, the embedding and output matrices included);
  `qwen35-9b`    Qwen3.5 9B as its config.json gives it (not checked against a released
                 GGUF here): 32 layers, hidden 4,096, every 4th layer full attention (16 heads
                 of 256 over 4 K/V heads, 64 rotated dimensions in sections 11/11/10), the
                 others Gated DeltaNet (16 key and 32 value heads of 128), MLP 12,288, an
                 output matrix, a filler vocabulary of 248,320 (its size, not its tokens);
  `qwen35moe-35b-a3b`  Qwen3.5-35B-A3B (and Qwen3.6-35B-A3B, the same shapes) as its
                 config.json and llama.cpp's converter give it: 40 layers, hidden 2,048,
                 every 4th layer full attention (16 heads of 256 over 2 K/V heads, 64
                 rotated dimensions in sections 11/11/10), the others Gated DeltaNet (16
                 key and 32 value heads of 128), 256 experts of which 8 are used, 512 wide,
                 a shared expert 512 wide, one MTP block (block_count 41), an output
                 matrix, a filler vocabulary of 248,320 (35.5 B parameters, 0.85 B of them
                 the MTP block's; 3.5 B active per token as --list counts them, the MTP
                 block left out).

`hybrid=(interval, taps, head, k_heads, v_heads, n_rot, sections)` makes a preset qwen35's
hybrid: every `interval`-th layer attends, the others are Gated DeltaNet layers of `k_heads`
key and `v_heads` value heads of `head`, with a `taps`-tap convolution; attention layers
rotate their first `n_rot` dimensions in M-RoPE `sections`.

`experts=(count, used, width)` makes a preset a mixture of experts (qwen3moe, gpt-oss,
qwen35moe): `ffn` is then only the `feed_forward_length` written to the file (none for
qwen35moe, whose `shared` is its shared expert's width). `mtp=N` appends N
multi-token-prediction blocks to a hybrid.
"""

PRESETS = {
    "tiny": dict(arch="llama", hidden=256, layers=2, heads=8, kv_heads=2, ffn=512, vocab=32000, rope=10000.0),
    "smol": dict(arch="llama", hidden=576, layers=30, heads=9, kv_heads=3, ffn=1536, vocab=49152, rope=100000.0),
    "1b": dict(arch="llama", hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=32000, rope=500000.0,
               ctx=131072),
    "8b": dict(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=32000, rope=500000.0,
               ctx=131072),
    "gtiny": dict(arch="gemma3", hidden=256, layers=6, heads=4, kv_heads=1, head_dim=128, ffn=512, vocab=32000,
                  window=128),
    "g270m": dict(arch="gemma3", hidden=640, layers=18, heads=4, kv_heads=1, head_dim=256, ffn=2048, vocab=262144,
                  window=512),
    "llama3": dict(arch="llama", hidden=256, layers=2, heads=8, kv_heads=2, ffn=512, vocab="llama-bpe", rope=500000.0,
                   ctx=131072, rope_freqs=(8.0, 1.0, 4.0, 8192), tied=True),
    "qwen2": dict(arch="qwen2", hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab="qwen2", rope=1e6, ctx=32768,
                  bias=True, scaling=("yarn", 4.0, 32768)),
    "qwen3": dict(arch="qwen3", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=128, ffn=512, vocab="qwen2",
                  rope=1e6, ctx=40960, tied=True),
    "mistral3": dict(arch="mistral3", hidden=256, layers=2, heads=8, kv_heads=2, ffn=512, vocab="llama-bpe",
                     rope=1e6, ctx=262144, tied=True, scaling=("yarn", 16.0, 16), yarn_extra=(32.0, 1.0, 1.0),
                     temperature=0.1),
    "phi3": dict(arch="phi3", hidden=256, layers=2, heads=8, kv_heads=2, ffn=512, vocab="phi-3", rope=10000.0,
                 ctx=131072, longrope=(2048, 1.19), window=64),
    "qwen3moe": dict(arch="qwen3moe", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=128, ffn=512,
                     experts=(16, 4, 256), vocab="qwen2", rope=1e6, ctx=40960, tied=True),
    "gpt-oss": dict(arch="gpt-oss", hidden=256, layers=4, heads=8, kv_heads=2, head_dim=64, ffn=256,
                    experts=(8, 4, 256), vocab="o200k-harmony", rope=150000.0, ctx=131072, window=16, bias=True,
                    scaling=("yarn", 32.0, 4096)),
    "qwen35": dict(arch="qwen35", hidden=256, layers=4, heads=4, kv_heads=2, head_dim=128, ffn=512, vocab="qwen35",
                   rope=1e7, ctx=262144, tied=True, hybrid=(4, 4, 64, 2, 4, 32, (6, 5, 5, 0))),
    "qwen35moe": dict(arch="qwen35moe", hidden=256, layers=4, heads=4, kv_heads=2, head_dim=128, ffn=256,
                      experts=(16, 4, 256), shared=256, vocab="qwen35", rope=1e7, ctx=262144, tied=True, mtp=1,
                      hybrid=(4, 4, 64, 2, 4, 32, (6, 5, 5, 0))),
    "llama3-1b": dict(arch="llama", hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab="llama-bpe",
                      rope=500000.0, ctx=131072, rope_freqs=(32.0, 1.0, 4.0, 8192), tied=True),
    "qwen2-0.5b": dict(arch="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab="qwen2", rope=1e6,
                       ctx=32768, bias=True, tied=True),
    "qwen3-0.6b": dict(arch="qwen3", hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=3072,
                       vocab="qwen2", rope=1e6, ctx=40960, tied=True),
    "qwen3-8b": dict(arch="qwen3", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                     vocab="qwen2", rope=1e6, ctx=40960),
    "mistral3-3b": dict(arch="mistral3", hidden=3072, layers=26, heads=32, kv_heads=8, head_dim=128, ffn=9216,
                        vocab="llama-bpe", rope=1e6, ctx=262144, tied=True, scaling=("yarn", 16.0, 16384),
                        yarn_extra=(32.0, 1.0, 1.0), temperature=0.1),
    "phi3-mini": dict(arch="phi3", hidden=3072, layers=32, heads=32, kv_heads=32, ffn=8192, vocab="phi-3",
                      rope=10000.0, ctx=131072, longrope=(4096, 1.19), window=262144),
    "qwen3moe-30b-a3b": dict(arch="qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=6144,
                             experts=(128, 8, 768), vocab="qwen2", rope=1e6, ctx=40960),
    "gpt-oss-20b": dict(arch="gpt-oss", hidden=2880, layers=24, heads=64, kv_heads=8, head_dim=64, ffn=2880,
                        experts=(32, 4, 2880), vocab="o200k-harmony", rope=150000.0, ctx=131072, window=128, bias=True,
                        scaling=("yarn", 32.0, 4096)),
    "qwen35-9b": dict(arch="qwen35", hidden=4096, layers=32, heads=16, kv_heads=4, head_dim=256, ffn=12288,
                      vocab=248320, rope=1e7, ctx=262144, hybrid=(4, 4, 128, 16, 32, 64, (11, 11, 10, 0))),
    "qwen35moe-35b-a3b": dict(arch="qwen35moe", hidden=2048, layers=40, heads=16, kv_heads=2, head_dim=256, ffn=512,
                              experts=(256, 8, 512), shared=512, vocab=248320, rope=1e7, ctx=262144, mtp=1,
                              hybrid=(4, 4, 128, 16, 32, 64, (11, 11, 10, 0))),
}

# Token counts of the real vocabularies (for --list, which needs no vocab file).
VOCAB_SIZES = {"llama-bpe": 128256, "qwen2": 151936, "phi-3": 32064, "o200k-harmony": 201088, "qwen35": 151936}


def recurrent_layers(p):
    """Which layers of a hybrid preset are Gated DeltaNet layers (all but every
    interval-th, as llama.cpp's `full_attention_interval`)."""
    interval = p["hybrid"][0]
    return [(i + 1) % interval != 0 for i in range(p["layers"])]


def params(p):
    H, L, F, NH, NKV = p["hidden"], p["layers"], p["ffn"], p["heads"], p["kv_heads"]
    V = p["vocab"] if isinstance(p["vocab"], int) else VOCAB_SIZES.get(p["vocab"], 0)
    HD = p.get("head_dim", H // NH)
    per_layer = H * NH * HD * 2 + 2 * H * NKV * HD + 3 * H * F
    if "hybrid" in p:  # gated queries on attention layers; the DeltaNet's matrices on the others
        _, taps, HS, KH, VH, _, _ = p["hybrid"]
        conv = 2 * KH * HS + VH * HS
        attn = H * NH * HD * 3 + 2 * H * NKV * HD
        delta = H * conv + H * VH * HS + 2 * H * VH + taps * conv + VH * HS * H
        rec = recurrent_layers(p)
        tied = p.get("tied", False)
        ffn = 3 * H * F
        if "experts" in p:  # the router, every expert, the shared expert and its gate
            E, _, FE = p["experts"]
            ffn = H * E + 3 * H * FE * E + 3 * H * p["shared"] + H
        mtp = p.get("mtp", 0) * (attn + ffn + 2 * H * H)  # an attention block and eh_proj each
        return V * H * (1 if tied else 2) + sum(delta if r else attn for r in rec) + L * ffn + mtp
    if "experts" in p:  # the router and every expert's gate, up and down
        E, _, FE = p["experts"]
        per_layer += H * E + 3 * H * FE * E - 3 * H * F
    if p["arch"] == "gpt-oss":  # biases (Q, K, V, output, router, experts) and sinks
        per_layer += NH * HD + 2 * NKV * HD + H + E + E * (2 * FE + H) + NH
    tied = p["arch"] == "gemma3" or p.get("tied", False)
    return V * H * (1 if tied else 2) + L * per_layer


def active_params(p):
    """Parameters one token reads: every expert's share but the used ones' left out, and
    the MTP blocks (they only draft)."""
    total = params(p)
    if "experts" not in p:
        return total
    E, used, FE = p["experts"]
    mtp = params(dict(p, mtp=0))
    return mtp - p["layers"] * 3 * p["hidden"] * FE * (E - used)
