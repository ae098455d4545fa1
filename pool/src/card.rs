//! A model's `/v1/models` card before its engine has ever run: read from the GGUF
//! header (`gguf_meta`), never by loading the model. What the engine will offer follows
//! the same rules the engine applies (`Capabilities::of_engine`): the chat APIs need a
//! chat template — the file's, a `--chat-template` file, or the family's built-in one
//! (`corral_protocol::builtin_template`; a `llama` file without a template is promised
//! none here, as its format follows its vocabulary) — and the context is `--ctx` (default 4,096) within the training context.
//! Once an engine has run, its own card replaces this one.

use corral_protocol::launch::{EngineOptions, effective_ctx};
use corral_protocol::openai::{Capabilities, ModelCard};

use crate::gguf_meta::{GgufMeta, GgufMetaError};
use crate::registry::ModelEntry;

pub fn from_header(entry: &ModelEntry, meta: Result<GgufMeta, GgufMetaError>, opts: &EngineOptions) -> ModelCard {
    let card = ModelCard::new(entry.id.to_string(), entry.modified);
    let meta = match meta {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(model = %entry.id, error = %e, "cannot read the model's header; /v1/models says little about it");
            return card;
        }
    };
    let template = if opts.sampling.chat_template.is_some() {
        Some("file".to_owned())
    } else if meta.chat_template.as_deref().is_some_and(|t| !t.trim().is_empty()) {
        Some("gguf".to_owned())
    } else {
        corral_protocol::builtin_template(&meta.arch).map(|n| format!("builtin:{n}"))
    };
    let runs = corral_protocol::ARCHITECTURES.contains(&meta.arch.as_str());
    let mut caps = Capabilities::of_engine(runs && template.is_some());
    if !runs {
        (caps.text_completions, caps.streaming, caps.logprobs, caps.structured_output) = (false, false, false, false);
    }
    let ctx_train = meta.context_length.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    ModelCard {
        context_window: runs.then(|| effective_ctx(opts.ctx, ctx_train)),
        arch: Some(meta.arch),
        chat_template: template,
        ..card
    }
    .with_capabilities(caps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_protocol::ModelId;

    fn entry() -> ModelEntry {
        ModelEntry { id: ModelId::new("m").unwrap(), path: "/m.gguf".into(), bytes: 1, modified: 7 }
    }

    fn meta(arch: &str, ctx: Option<u64>, template: Option<&str>) -> Result<GgufMeta, GgufMetaError> {
        Ok(GgufMeta {
            arch: arch.into(),
            context_length: ctx,
            chat_template: template.map(Into::into),
            file_type: None,
        })
    }

    #[test]
    fn chat_needs_a_template_from_the_file_a_flag_or_a_builtin() {
        let opts = EngineOptions::default();
        let c = from_header(&entry(), meta("llama", Some(8192), Some("{{ x }}")), &opts);
        assert_eq!((c.context_window, c.chat_template.as_deref(), c.tools), (Some(4096), Some("gguf"), Some(true)));
        let caps = c.capabilities.unwrap();
        assert!(caps.chat_completions && caps.anthropic_messages && caps.responses && !caps.vision && !caps.audio);

        let c = from_header(&entry(), meta("llama", Some(2048), None), &opts);
        assert_eq!((c.context_window, c.tools, c.structured_output), (Some(2048), Some(false), Some(true)));
        assert!(!c.capabilities.unwrap().chat_completions && c.chat_template.is_none());

        let c = from_header(&entry(), meta("gemma3", None, Some("  ")), &opts);
        assert_eq!(c.chat_template.as_deref(), Some("builtin:gemma"));
        assert!(c.capabilities.unwrap().responses);
        let c = from_header(&entry(), meta("qwen2", None, None), &opts);
        assert_eq!(c.chat_template.as_deref(), Some("builtin:chatml"));
        assert!(c.capabilities.unwrap().chat_completions);

        let mut with_file = EngineOptions::default();
        with_file.sampling.chat_template = Some("/t.jinja".into());
        with_file.ctx = Some(100);
        let c = from_header(&entry(), meta("llama", Some(8192), None), &with_file);
        assert_eq!((c.context_window, c.chat_template.as_deref(), c.tools), (Some(100), Some("file"), Some(true)));
    }

    #[test]
    fn an_unknown_arch_or_an_unreadable_header_promises_nothing() {
        let c = from_header(&entry(), meta("mamba", Some(4096), Some("t")), &EngineOptions::default());
        let caps = c.capabilities.unwrap();
        assert!(!caps.chat_completions && !caps.text_completions && !caps.streaming && c.context_window.is_none());
        let c = from_header(&entry(), Err(GgufMetaError::NotGguf), &EngineOptions::default());
        assert_eq!((c.capabilities, c.id.as_str(), c.created), (None, "m", 7));
    }
}
