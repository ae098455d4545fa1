//! Model hyperparameters read from GGUF metadata, validated once into an immutable
//! `ModelConfig` that the architectures and the KV cache size themselves from.

pub use crate::config_hybrid::HybridConfig;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::rope::{RopeScaling, RopeStyle};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (SmolLM2, Llama 2/3, Mistral-style GQA): RMSNorm, SwiGLU, rotary
    /// embedding on interleaved pairs (GGUF permutes Q/K for it).
    Llama,
    /// Gemma 3: pre+post norms, Q/K norms, GeGLU, sliding-window layers with their own
    /// rotary base, embedding scaled by sqrt(hidden).
    Gemma3,
    /// Qwen2/2.5 (and DeepSeek-R1 distills): llama's graph with Q/K/V biases and NeoX
    /// rotary pairs.
    Qwen2,
    /// Qwen3 (dense): llama's graph with RMSNorm on every Q and K head before RoPE, NeoX
    /// rotary pairs, and a head size of its own (`key_length`).
    Qwen3,
    /// Qwen3 MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): qwen3's attention and a mixture of
    /// experts in place of the MLP (`MoeConfig`).
    Qwen3Moe,
    /// Mistral 3 (Ministral 3, Mistral Small 3.x, Devstral): llama's graph with YaRN read
    /// in full (its β values and log multiplier) and Llama 4's optional attention
    /// temperature (queries scaled by position).
    Mistral3,
    /// Phi-3/3.5/4 mini: llama's graph with Q, K and V fused in one `attn_qkv` and gate|up
    /// in one `ffn_up`, NeoX pairs, LongRoPE's frequency factors (`rope_factors_long` or
    /// `_short` by the served context), queries scaled by 1/√head_dim before attention.
    Phi3,
    /// gpt-oss (20b, 120b): Q/K/V and output biases, a learned sink logit per head in every
    /// softmax, sliding-window layers alternating with full ones (even layers slide), YaRN,
    /// and a mixture of MXFP4 experts with biases, top-k-then-softmax routing and
    /// SwiGLU-OAI (`MoeKind::GptOss`).
    GptOss,
    /// Qwen3.5 (dense): a hybrid of Gated DeltaNet layers (a causal convolution and a
    /// delta-rule recurrent state per sequence) and, every `full_attention_interval`-th
    /// layer, gated full attention (queries with a sigmoid gate, Q/K head norms, partial
    /// M-RoPE); `post_attention_norm` before a SwiGLU MLP (`HybridConfig`).
    Qwen35,
    /// Qwen3.5 MoE (Qwen3.5/3.6-35B-A3B, -122B-A10B): qwen35's hybrid layers with a
    /// mixture of experts in place of the MLP (qwen3moe's routing) plus a shared expert
    /// scaled by a sigmoid gate of its own (`MoeConfig::shared`).
    Qwen35Moe,
}

impl Arch {
    pub(crate) const ALL: [Arch; 10] = [
        Arch::Llama,
        Arch::Gemma3,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Mistral3,
        Arch::Phi3,
        Arch::GptOss,
        Arch::Qwen35,
        Arch::Qwen35Moe,
    ];

    /// The architecture a GGUF's `general.architecture` names, if the engine runs it
    /// (`corral_protocol::ARCHITECTURES` lists the same names).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Mistral3 => "mistral3",
            Arch::Phi3 => "phi3",
            Arch::GptOss => "gpt-oss",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
        }
    }

    /// Which pairs of a head's dimensions rotate together (llama.cpp's
    /// `llama_model_rope_type`: NORM for llama, NEOX for the Qwen and Gemma families;
    /// qwen35's interleaved M-RoPE rotates text as NEOX does, over `HybridConfig::n_rot`).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama | Arch::Mistral3 => RopeStyle::Interleaved,
            Arch::Gemma3
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::Phi3
            | Arch::GptOss
            | Arch::Qwen35
            | Arch::Qwen35Moe => RopeStyle::Neox,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Context length the model was trained for.
    pub ctx_train: usize,
    pub rms_eps: f32,
    /// Rotary base of full-attention layers.
    pub rope_base: f32,
    /// Context scaling of the full-attention layers' rotary angles (`rope.scaling.*`);
    /// `RopeScaling::NONE` when the file asks for none.
    pub rope_scaling: RopeScaling,
    /// Llama 4's attention temperature (mistral3's `attention.temperature_scale`, with
    /// YaRN's original context as the floor): queries at position `p` are multiplied by
    /// `ln(floor(p / floor) + 1) * scale + 1`. `None` for every other model.
    pub attn_temperature: Option<AttnTemperature>,
    /// Rotary base of sliding-window layers (Gemma 3: 10,000).
    pub rope_base_local: f32,
    /// Sliding-window size in tokens, for the layers marked in `is_swa`.
    pub sliding_window: Option<usize>,
    /// Per layer: does it attend only to the last `sliding_window` positions?
    pub is_swa: Vec<bool>,
    /// The mixture of experts in every layer (qwen3moe, gpt-oss, qwen35moe); `None` for a
    /// dense MLP.
    pub moe: Option<MoeConfig>,
    /// The recurrent layers of a hybrid model (qwen35, qwen35moe); `None` when every layer
    /// attends.
    pub hybrid: Option<HybridConfig>,
}

/// A mixture of experts: `used` of `experts` chosen per token by the router, each an MLP
/// `width` wide (`expert_feed_forward_length`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub experts: usize,
    pub used: usize,
    pub width: usize,
    pub kind: MoeKind,
    /// qwen35moe's shared expert, a SwiGLU MLP this wide (`ffn_*_shexp`) that every token
    /// runs, its output scaled by sigmoid(x·`ffn_gate_inp_shexp`) and added to the routed
    /// experts' sum; `None` in the other families.
    pub shared: Option<usize>,
}

/// How a family's router weighs its experts and what each expert computes (llama.cpp's
/// gating function and FFN op in `build_moe_ffn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeKind {
    /// qwen3moe: softmax over every expert, the top `used`, their probabilities
    /// renormalized; SwiGLU experts without biases.
    Qwen3,
    /// gpt-oss: the router's logits plus its bias, the top `used` of them, a softmax over
    /// those alone; every expert matrix has a bias, and the activation is SwiGLU-OAI.
    GptOss,
}

impl ModelConfig {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch_name = g.architecture()?;
        let arch = Arch::from_name(arch_name).ok_or_else(|| Error::UnsupportedArch { arch: arch_name.to_owned() })?;
        let k = |suffix: &str| format!("{arch_name}.{suffix}");
        // qwen35's multi-token-prediction blocks follow its layers in the block count;
        // llama.cpp runs them only to draft (`nextn_predict_layers`; it skips loading them
        // unless asked to), and so never does corral: their tensors are left unread.
        let hybrid_arch = matches!(arch, Arch::Qwen35 | Arch::Qwen35Moe);
        let nextn = if hybrid_arch { g.opt_u32(&k("nextn_predict_layers")).unwrap_or(0) } else { 0 };
        let n_layers = g.u32(&k("block_count"))?.saturating_sub(nextn) as usize;
        let hidden = g.u32(&k("embedding_length"))? as usize;
        let n_heads = g.u32(&k("attention.head_count"))? as usize;
        let n_kv_heads = g.opt_u32(&k("attention.head_count_kv")).map_or(n_heads, |v| v as usize);
        let head_dim = g.opt_u32(&k("attention.key_length")).map_or_else(|| hidden / n_heads.max(1), |v| v as usize);
        let vocab = g.dims("token_embd.weight")?.first().copied().unwrap_or(0);
        let sliding_window = match arch {
            Arch::Gemma3 | Arch::GptOss => g.opt_u32(&k("attention.sliding_window")).map(|v| v as usize),
            // llama.cpp turns phi3's sliding window off (its files' windows are not
            // trustworthy, llama.cpp PR 13676): every layer attends to the whole context.
            Arch::Llama
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::Mistral3
            | Arch::Phi3
            | Arch::Qwen35
            | Arch::Qwen35Moe => None,
        };
        // Gemma 3: five sliding-window layers, then one global (llama.cpp's pattern 6);
        // gpt-oss: one of each, the first sliding (pattern 2); unless the file states the
        // pattern per layer.
        let pattern = if arch == Arch::Gemma3 { 6 } else { 2 };
        let is_swa = match (arch, sliding_window) {
            (Arch::Gemma3 | Arch::GptOss, Some(w)) if w > 0 => {
                match g.i32_array(&k("attention.sliding_window_pattern")) {
                    Ok(v) if v.len() == n_layers => v.iter().map(|&x| x != 0).collect(),
                    _ => (0..n_layers).map(|il| il % pattern < pattern - 1).collect(),
                }
            }
            _ => vec![false; n_layers],
        };
        // Every architecture here but qwen35 rotates whole heads (llama.cpp rejects a llama
        // file whose `rope.dimension_count` differs, and asserts it for qwen2/qwen3 and
        // gemma3); qwen35 rotates the first `n_rot` (`HybridConfig`).
        let hybrid = match hybrid_arch {
            true => Some(HybridConfig::from_gguf(g, arch_name, n_layers, head_dim)?),
            false => None,
        };
        if let Some(n_rot) = g.opt_u32(&k("rope.dimension_count"))
            && n_rot as usize != head_dim
            && hybrid.is_none()
        {
            return Err(Error::Tensor {
                name: k("rope.dimension_count"),
                reason: format!("partial rotary embedding ({n_rot} of {head_dim} dimensions) is not supported"),
            });
        }
        let ctx_train = g.opt_u32(&k("context_length")).unwrap_or(2048) as usize;
        let moe = match arch {
            Arch::Qwen3Moe | Arch::Qwen35Moe => Some(moe_config(g, arch_name, MoeKind::Qwen3)?),
            Arch::GptOss => Some(moe_config(g, arch_name, MoeKind::GptOss)?),
            _ => None,
        };
        let rope_base = g.opt_f32(&k("rope.freq_base")).unwrap_or(10_000.0);
        // gpt-oss's sliding-window layers rotate as its full ones unless the file says
        // otherwise (llama.cpp's `rope_freq_base_train_swa`).
        let base_local = if arch == Arch::GptOss { rope_base } else { 10_000.0 };
        // A mixture of experts' file may leave the dense width out (llama.cpp reads it as 0).
        let ffn = match moe {
            Some(m) => g.opt_u32(&k("feed_forward_length")).map_or(m.width, |v| v as usize),
            None => g.u32(&k("feed_forward_length"))? as usize,
        };
        let cfg = Self {
            arch,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn,
            vocab,
            ctx_train,
            rms_eps: g.f32(&k("attention.layer_norm_rms_epsilon"))?,
            rope_base,
            rope_scaling: rope_scaling(g, arch, ctx_train)?,
            attn_temperature: attn_temperature(g, arch, ctx_train)?,
            rope_base_local: g.opt_f32(&k("rope.freq_base_swa")).unwrap_or(base_local),
            sliding_window: sliding_window.filter(|&w| w > 0),
            is_swa,
            moe,
            hybrid,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |key: &str| Err(Error::Metadata { key: key.to_owned() });
        if self.n_layers == 0 || self.n_layers > 1024 {
            return bad("block_count");
        }
        if self.hidden == 0 || self.n_heads == 0 || self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("attention.head_count / key_length");
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad("attention.head_count_kv");
        }
        if self.vocab == 0 || self.ffn == 0 {
            return bad("feed_forward_length / vocabulary");
        }
        Ok(())
    }

    /// Layers with a KV cache: all but a hybrid model's recurrent ones.
    pub fn kv_layers(&self) -> usize {
        self.n_layers - self.hybrid.as_ref().map_or(0, HybridConfig::recurrent_layers)
    }

    /// A hybrid model's per-sequence recurrent state (its conv and delta-rule state of
    /// every recurrent layer); `None` for other models.
    pub fn recurrent_shape(&self) -> Option<crate::recurrent::RecurrentShape> {
        self.hybrid.as_ref().map(|hy| crate::recurrent::RecurrentShape {
            layers: hy.recurrent_layers(),
            conv: hy.conv_state(),
            ssm: hy.ssm_state(),
        })
    }

    /// K (or V) floats per token per layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}

/// A mixture of experts as llama.cpp reads it: `expert_count` and `expert_used_count`
/// (both required), `expert_feed_forward_length` (else the dense width / experts used);
/// qwen35moe's shared expert `expert_shared_feed_forward_length` wide (else the dense width).
fn moe_config(g: &Gguf, name: &str, kind: MoeKind) -> Result<MoeConfig> {
    let k = |suffix: &str| format!("{name}.{suffix}");
    let experts = g.u32(&k("expert_count"))? as usize;
    let used = g.u32(&k("expert_used_count"))? as usize;
    let width = match g.opt_u32(&k("expert_feed_forward_length")).filter(|&v| v > 0) {
        Some(v) => v as usize,
        None => g.u32(&k("feed_forward_length"))? as usize / used.max(1),
    };
    if experts == 0 || used == 0 || used > experts || width == 0 {
        return Err(Error::Metadata { key: k("expert_count / expert_used_count / expert_feed_forward_length") });
    }
    let shared = match name == Arch::Qwen35Moe.name() {
        false => None,
        true => {
            let key = k("expert_shared_feed_forward_length");
            let w = g.opt_u32(&key).filter(|&v| v > 0).or_else(|| g.opt_u32(&k("feed_forward_length")));
            Some(w.filter(|&v| v > 0).ok_or(Error::Metadata { key })? as usize)
        }
    };
    Ok(MoeConfig { experts, used, width, kind, shared })
}

/// llama.cpp's rotary scaling from `{arch}.rope.scaling.*`, as its context derives it
/// (`llama_context`'s constructor): `freq_scale` = 1/factor; YaRN turns the ramp on
/// (`ext_factor` 1) and sets the attention factor `get_mscale(factor)` (with a log
/// multiplier: `get_mscale(factor, 1) / get_mscale(factor, multiplier)`) divided by the
/// factor that `rope_yarn` multiplies back in (computed in the same f32 steps, so the
/// product is llama.cpp's to the bit).
fn rope_scaling(g: &Gguf, arch: Arch, ctx_train: usize) -> Result<RopeScaling> {
    let name = arch.name();
    let k = |suffix: &str| format!("{name}.rope.scaling.{suffix}");
    let kind = g.opt_str(&k("type")).unwrap_or("linear");
    let factor = g.opt_f32(&k("factor")).or_else(|| g.opt_f32(&format!("{name}.rope.scale_linear"))).unwrap_or(0.0);
    let freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
    let file_attn = g.opt_f32(&k("attn_factor")).unwrap_or(1.0);
    let n_ctx_orig = g.opt_u32(&k("original_context_length")).map_or(ctx_train, |v| v as usize);
    let plain = RopeScaling { freq_scale, attn_factor: file_attn, ..RopeScaling::NONE };
    match kind {
        "none" => Ok(RopeScaling { attn_factor: file_attn, ..RopeScaling::NONE }),
        "linear" => Ok(plain),
        "yarn" => {
            // llama.cpp reads the log multiplier and YaRN's β values for mistral3 (among the
            // families here); another family's file that sets a multiplier is DeepSeek-style.
            let log_mul = g.opt_f32(&k("yarn_log_multiplier")).unwrap_or(0.0);
            let (mut beta_fast, mut beta_slow) = (32.0, 1.0);
            if arch == Arch::Mistral3 {
                beta_fast = g.opt_f32(&k("yarn_beta_fast")).unwrap_or(beta_fast);
                beta_slow = g.opt_f32(&k("yarn_beta_slow")).unwrap_or(beta_slow);
            } else if log_mul != 0.0 {
                return Err(Error::Tensor {
                    name: k("yarn_log_multiplier"),
                    reason: format!("YaRN with a log multiplier is not supported in a {name} model"),
                });
            }
            let factor = 1.0 / freq_scale;
            let mscale = |m: f32| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
            let attn = if log_mul != 0.0 { mscale(1.0) / mscale(log_mul) } else { mscale(1.0) };
            // "Cancel" the factor rope_yarn applies.
            let attn = attn * (1.0 / (1.0 + 0.1 * factor.ln()));
            Ok(RopeScaling {
                freq_scale,
                ext_factor: 1.0,
                attn_factor: attn * file_attn,
                beta_fast,
                beta_slow,
                n_ctx_orig,
            })
        }
        other => Err(Error::Tensor { name: k("type"), reason: format!("rotary scaling {other:?} is not supported") }),
    }
}

/// Llama 4's attention temperature as llama.cpp's mistral3 reads it: on when
/// `attention.temperature_scale` is set and not 0, floored by YaRN's original context.
fn attn_temperature(g: &Gguf, arch: Arch, ctx_train: usize) -> Result<Option<AttnTemperature>> {
    let name = arch.name();
    let Some(scale) = g.opt_f32(&format!("{name}.attention.temperature_scale")).filter(|&s| s != 0.0) else {
        return Ok(None);
    };
    if arch != Arch::Mistral3 {
        return Err(Error::Tensor {
            name: format!("{name}.attention.temperature_scale"),
            reason: format!("attention temperature is not supported in a {name} model"),
        });
    }
    let floor = g.opt_u32(&format!("{name}.rope.scaling.original_context_length")).map_or(ctx_train, |v| v as usize);
    if floor == 0 {
        return Err(Error::Metadata { key: format!("{name}.rope.scaling.original_context_length") });
    }
    Ok(Some(AttnTemperature { scale, floor }))
}

/// Queries at position `p` times `ln(floor(p / floor) + 1) * scale + 1` (llama.cpp's
/// `llm_graph_input_attn_temp`, offset 0): exactly 1 below `floor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnTemperature {
    pub scale: f32,
    pub floor: usize,
}

impl AttnTemperature {
    /// In llama.cpp's steps: the quotient and its floor in f32, the rest in f64.
    pub fn at(&self, pos: usize) -> f32 {
        let q = (pos as f32 / self.floor as f32).floor();
        ((f64::from(q) + 1.0).ln() * f64::from(self.scale) + 1.0) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::{Arch, AttnTemperature};

    #[test]
    fn attention_temperature_is_one_below_the_floor_then_grows_per_floor_step() {
        let t = AttnTemperature { scale: 0.1, floor: 16 };
        assert!((0..16).all(|p| t.at(p) == 1.0));
        assert_eq!(t.at(16), (2f64.ln() * 0.1 + 1.0) as f32);
        assert_eq!(t.at(31), t.at(16));
        assert_eq!(t.at(47), (3f64.ln() * 0.1 + 1.0) as f32);
    }

    #[test]
    fn the_protocols_architecture_list_is_exactly_the_engines() {
        let engine: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(engine, corral_protocol::ARCHITECTURES);
        for name in corral_protocol::ARCHITECTURES {
            assert_eq!(Arch::from_name(name).map(Arch::name), Some(name));
        }
        assert_eq!(Arch::from_name("qwen2moe"), None);
    }
}
