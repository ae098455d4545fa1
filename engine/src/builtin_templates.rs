//! Turn formats for model files without a chat template (`tokenizer.chat_template`),
//! chosen as llama.cpp and Ollama choose a family's default: by architecture, and for a
//! `llama` file by its vocabulary's special tokens (Llama 3's header tokens, ChatML's
//! `<|im_start|>`); a `llama` file with neither gets none (raw completions only). A
//! vocabulary with harmony's message tokens (o200k_harmony: gpt-oss) gets the harmony
//! format whatever the architecture (`crate::harmony::template`).

use crate::config::Arch;

/// A built-in template: its name (reported as the template's source) and Jinja text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Builtin {
    pub name: &'static str,
    pub text: &'static str,
}

/// Gemma's turns, as llama.cpp's built-in `gemma`: system text is merged into the first
/// user turn, `assistant` is called `model`, contents are trimmed.
const GEMMA: Builtin = Builtin {
    name: "gemma",
    text: concat!(
        "{%- set ns = namespace(system='') -%}",
        "{%- for m in messages -%}",
        "{%- if m.role == 'system' -%}{%- set ns.system = ns.system + (m.content | trim) -%}",
        "{%- else -%}",
        "{%- set role = 'model' if m.role == 'assistant' else m.role -%}",
        "{{ '<start_of_turn>' + role + '\\n' }}",
        "{%- if ns.system and role != 'model' -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}",
        "{{ (m.content | trim) + '<end_of_turn>\\n' }}",
        "{%- endif -%}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}",
    ),
};

/// ChatML (Qwen2/2.5/3, SmolLM): every message `<|im_start|>role\ncontent<|im_end|>\n`.
const CHATML: Builtin = Builtin {
    name: "chatml",
    text: concat!(
        "{%- for m in messages -%}",
        "{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}",
    ),
};

/// Llama 3.x: a header per message, contents trimmed, each turn ended by `<|eot_id|>`.
const LLAMA3: Builtin = Builtin {
    name: "llama3",
    text: concat!(
        "{%- for m in messages -%}",
        "{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + ((m.content or '') | trim) + '<|eot_id|>' }}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}",
    ),
};

/// Phi-3/3.5/4 mini: `<|role|>\ncontent<|end|>\n`.
const PHI3: Builtin = Builtin {
    name: "phi3",
    text: concat!(
        "{%- for m in messages -%}",
        "{{ '<|' + m.role + '|>\\n' + (m.content or '') + '<|end|>\\n' }}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}",
    ),
};

/// Mistral's v7 turns with the tekken tokenizer (Ministral 3, Mistral Small 3.x,
/// Devstral): `[SYSTEM_PROMPT]…[/SYSTEM_PROMPT]`, `[INST]…[/INST]`, the answer then EOS.
const MISTRAL: Builtin = Builtin {
    name: "mistral-v7-tekken",
    text: concat!(
        "{%- for m in messages -%}",
        "{%- if m.role == 'system' -%}{{ '[SYSTEM_PROMPT]' + (m.content or '') + '[/SYSTEM_PROMPT]' }}",
        "{%- elif m.role == 'assistant' -%}{{ (m.content or '') + eos_token }}",
        "{%- else -%}{{ '[INST]' + (m.content or '') + '[/INST]' }}",
        "{%- endif -%}",
        "{%- endfor -%}",
    ),
};

/// The built-in template for a file of `arch` whose vocabulary holds the tokens for which
/// `has_token` is true; `None` when no format fits.
pub fn choose(arch: Arch, has_token: impl Fn(&str) -> bool) -> Option<Builtin> {
    if crate::harmony::vocabulary_has(&has_token) {
        return Some(crate::harmony::template::builtin());
    }
    match arch {
        Arch::Gemma3 => Some(GEMMA),
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe => Some(CHATML),
        Arch::Mistral3 => Some(MISTRAL),
        Arch::Phi3 => Some(PHI3),
        Arch::Llama if has_token("<|start_header_id|>") && has_token("<|eot_id|>") => Some(LLAMA3),
        Arch::Llama if has_token("<|im_start|>") => Some(CHATML),
        Arch::Llama => None,
        Arch::GptOss => Some(crate::harmony::template::builtin()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatMessage, ChatTemplate};

    fn render(arch: Arch, vocab: &[&str]) -> (String, String) {
        let b = choose(arch, |t| vocab.contains(&t)).expect("a built-in template");
        let t = ChatTemplate::new(None, Some(b), "<s>", "</s>", true).unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi "),
            ChatMessage::new("assistant", "Hello"),
            ChatMessage::new("user", "Bye"),
        ];
        (b.name.to_owned(), t.render(&msgs, None, true).unwrap())
    }

    #[test]
    fn the_protocol_names_each_familys_builtin_as_the_engine_chooses_it() {
        for arch in Arch::ALL {
            let engine = choose(arch, |_| false).map(|b| b.name);
            assert_eq!(corral_protocol::builtin_template(arch.name()), engine, "{arch:?}");
        }
    }

    #[test]
    fn each_family_gets_its_own_turn_format() {
        let (name, out) = render(Arch::Qwen3, &[]);
        assert_eq!(name, "chatml");
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi <|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
        let (name, out) = render(Arch::Llama, &["<|start_header_id|>", "<|eot_id|>"]);
        assert_eq!(name, "llama3");
        assert_eq!(
            out,
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        let (_, out) = render(Arch::Phi3, &[]);
        assert_eq!(
            out,
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi <|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n"
        );
        let (_, out) = render(Arch::Mistral3, &[]);
        assert_eq!(out, "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi [/INST]Hello</s>[INST]Bye[/INST]");
        let (name, _) = render(Arch::Llama, &["<|im_start|>"]);
        assert_eq!(name, "chatml");
    }

    #[test]
    fn a_llama_file_without_known_special_tokens_gets_none() {
        assert_eq!(choose(Arch::Llama, |_| false), None);
        assert_eq!(choose(Arch::Llama, |t| t == "<|start_header_id|>"), None, "needs <|eot_id|> too");
        assert_eq!(choose(Arch::Gemma3, |_| false).map(|b| b.name), Some("gemma"));
    }
}
