//! `Engine`: a loaded model with its tokenizer and chat template: what `corral run`
//! and `corral engine` hold for their one model.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::DeviceChoice;
use crate::builtin_templates;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::grammar::Grammars;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::tools::format::ToolFormat;

/// Sampling defaults a model file may carry (`general.sampling.*`).
#[derive(Clone, Debug, Default)]
pub struct SamplingMetadata {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
}

pub struct Engine {
    pub path: PathBuf,
    pub sampling_metadata: SamplingMetadata,
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// `None` when the file has no template and no built-in one fits its architecture.
    pub template: Option<ChatTemplate>,
    /// The tool-call syntax its template speaks (or corral's fallback).
    pub tool_format: ToolFormat,
    /// Constrained decoding over this vocabulary (built on first use).
    pub grammars: Grammars,
    pub file_bytes: u64,
    pub load_time: Duration,
    /// BLAKE3 of the whole model file (weights, config and tokenizer): the identity of
    /// this model's prompt-cache files.
    pub fingerprint: [u8; 32],
    pub tokenizer_hash: [u8; 32],
}

/// Mixed into the fingerprint so that a change in how KV values are computed or laid
/// out gives old cache files another directory.
fn file_kv_version_tag() -> [u8; 8] {
    let mut t = [0u8; 8];
    t[..4].copy_from_slice(&crate::cache::file::KV_LAYOUT_VERSION.to_le_bytes());
    t[4..6].copy_from_slice(&crate::cache::file::FORMAT_VERSION.to_le_bytes());
    t
}

impl Engine {
    /// Load on the CPU.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, None, DeviceChoice::Cpu)
    }

    /// Like `load`; `cache_dir` (the prompt cache's directory) keeps what is slow to
    /// derive from the file's vocabulary for the next start (`tokenizer::from_gguf_cached`).
    /// `device` picks the backend (see `Model::load_on`).
    pub fn load_with(path: &Path, cache_dir: Option<&Path>, device: DeviceChoice) -> Result<Self> {
        let start = Instant::now();
        let g = Gguf::open(path)?;
        tracing::debug!(ms = start.elapsed().as_millis() as u64, "model file opened");
        // The tokenizer (Gemma's 262k-piece vocabulary turned into ~515k ranked merges) is
        // the longest job of a load and takes as long as the weights and the file hash (the
        // prompt cache's identity) together, so it gets a thread of its own while this one
        // loads the weights, then hashes. A model switch waits on the slower of the two
        // instead of on the sum; a third thread would only slow the tokenizer down on a
        // two-core machine.
        let (model, (fingerprint, tokenizer_hash), tokenizer) = std::thread::scope(|s| {
            let tokenizer = s.spawn(|| {
                let t = Instant::now();
                let tok = Tokenizer::from_gguf_cached(&g, cache_dir);
                tracing::debug!(ms = t.elapsed().as_millis() as u64, "tokenizer built");
                tok
            });
            let t = Instant::now();
            let model = Model::load_on(&g, device);
            tracing::debug!(ms = t.elapsed().as_millis() as u64, "weights loaded");
            let t = Instant::now();
            let mut h = blake3::Hasher::new();
            h.update(&file_kv_version_tag());
            h.update(g.bytes());
            let hashes = (*h.finalize().as_bytes(), g.tokenizer_hash());
            tracing::debug!(ms = t.elapsed().as_millis() as u64, "model file hashed");
            let tokenizer = tokenizer.join().expect("tokenizer construction does not panic");
            (model, hashes, tokenizer)
        });
        let model = model?;
        let tokenizer = tokenizer?;
        let text = |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or("").to_owned();
        let (bos, eos) = (text(tokenizer.bos()), text(tokenizer.eos()));
        let gguf_template = g.opt_str("tokenizer.chat_template");
        let builtin = builtin_templates::choose(model.config().arch, |t| tokenizer.token_id(t).is_some());
        let template = match ChatTemplate::new(gguf_template, builtin, &bos, &eos, tokenizer.add_bos()) {
            Ok(t) => {
                if gguf_template.is_none() {
                    tracing::info!(arch = model.config().arch.name(), source = ?t.source(), "model file has no chat template; using the built-in one");
                }
                Some(t)
            }
            Err(e) if gguf_template.is_none() => {
                tracing::warn!(error = %e, "no chat template: only raw completions will work");
                None
            }
            Err(e) => return Err(e),
        };
        let file_bytes = g.file_len();
        let sampling_metadata = SamplingMetadata {
            temperature: g.opt_f32("general.sampling.temp"),
            top_p: g.opt_f32("general.sampling.top_p"),
            top_k: g.opt_u32("general.sampling.top_k").map(|k| k as usize),
            min_p: g.opt_f32("general.sampling.min_p"),
        };
        drop(g);
        let tool_format = ToolFormat::detect(template.as_ref().map(ChatTemplate::text), |t| tokenizer.token_id(t));
        let grammars = Grammars::new(&tokenizer);
        Ok(Self {
            path: path.to_owned(),
            sampling_metadata,
            model,
            tokenizer,
            template,
            tool_format,
            grammars,
            file_bytes,
            load_time: start.elapsed(),
            fingerprint,
            tokenizer_hash,
        })
    }

    /// Replace the model's chat template (`--chat-template FILE`); the tool-call format
    /// is detected again from the new one.
    pub fn set_chat_template(&mut self, text: &str) -> Result<()> {
        let tok = &self.tokenizer;
        let piece = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_owned();
        let t = ChatTemplate::from_file_text(text, &piece(tok.bos()), &piece(tok.eos()), tok.add_bos())?;
        self.tool_format = ToolFormat::detect(Some(t.text()), |s| tok.token_id(s));
        self.template = Some(t);
        Ok(())
    }

    /// What this model's prompt-cache files must match.
    pub fn cache_identity(&self) -> crate::cache::Identity {
        crate::cache::Identity {
            model_fingerprint: self.fingerprint,
            tokenizer_hash: self.tokenizer_hash,
            shape: self.model.kv_shape(),
            recurrent: self.model.recurrent_shape(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// The context the engine serves (`--ctx` within the training context): the model's
    /// math may depend on it (phi3's LongRoPE factors).
    pub fn set_context(&self, ctx: usize) {
        self.model.set_context(ctx);
    }

    /// What the model computes on (`/admin/stats`' `device`).
    pub fn device_stats(&self) -> corral_protocol::engine_wire::DeviceStats {
        self.model.device_stats()
    }

    /// Render a conversation with the chat template and tokenize it.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let text = self.render_chat(messages, None, &serde_json::Map::new())?;
        self.tokenizer.encode(&text, true)
    }

    /// The chat template's text for a conversation (with a generation prompt);
    /// `kwargs` are extra template variables (`chat_template_kwargs`).
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let t = self.template.as_ref().ok_or_else(|| Error::Template("this model has no chat template".into()))?;
        t.render_with(messages, tools, true, kwargs)
    }

    /// Tokenize a raw completion prompt (BOS added when the model wants it).
    pub fn raw_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text, true)
    }
}
