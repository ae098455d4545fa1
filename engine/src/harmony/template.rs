//! The built-in harmony template, for a file whose vocabulary is o200k_harmony but that
//! carries no chat template of its own (gpt-oss files do carry one; corral renders that).
//!
//! It renders what gpt-oss's own template renders for the same conversation: a system
//! message (identity, knowledge cutoff, today's date, `Reasoning: <reasoning_effort>`,
//! default medium, the valid channels), a developer message with the first
//! system/developer message as `# Instructions` and the tools as a TypeScript-like
//! `functions` namespace, user turns, assistant answers on `final`, past calls as
//! messages to `functions.NAME` on `commentary` ending in `<|call|>` and their results
//! from `functions.NAME` (the JSON-quoted content). Reasoning of earlier turns is dropped;
//! the reasoning (`thinking`) of a call turn is kept while no answer has followed it, so
//! the model continues from its own analysis after the tool results. Unlike gpt-oss's,
//! every call of a turn is rendered (its template writes only the first), and a tool
//! result names the tool its `tool_call_id` called (the engine sets `name`). Held to
//! llama.cpp's renderings of gpt-oss's own template (`scripts/models/oracle/harmony`,
//! the test in `server/input.rs`), whitespace quirks of nested types included.

use crate::builtin_templates::Builtin;

/// JSON Schema → the TypeScript-like type gpt-oss was trained on.
const TYPES: &str = concat!(
    "{%- macro ts_type(s) -%}",
    "{%- if s.type is string and s.type == 'array' -%}",
    "{%- if s['items'] and s['items'].type in ['string', 'number', 'integer', 'boolean'] -%}",
    "{{- ('number' if s['items'].type == 'integer' else s['items'].type) + '[]' -}}",
    "{%- else -%}{{- 'any[]' -}}{%- endif -%}",
    "{%- elif s.type is string and s.type == 'string' -%}",
    "{%- if s.enum -%}{{- '\"' + s.enum | join('\" | \"') + '\"' -}}{%- else -%}{{- 'string' -}}{%- endif -%}",
    "{%- elif s.type is string and s.type in ['number', 'integer'] -%}{{- 'number' -}}",
    "{%- elif s.type is string and s.type == 'boolean' -%}{{- 'boolean' -}}",
    "{%- elif s.type is string and s.type == 'object' -%}",
    "{%- if s.properties -%}{{- '{\\n' -}}",
    "{%- for k, v in s.properties | items -%}",
    // gpt-oss's template writes a newline and 16 spaces before a nested property's type.
    "{{- k + ('' if k in (s.required or []) else '?') + ': \n                ' + ts_type(v) -}}",
    "{{- ', ' if not loop.last -}}",
    "{%- endfor -%}{{- '}' -}}",
    "{%- else -%}{{- 'object' -}}{%- endif -%}",
    "{%- elif s.type is sequence and s.type is not string -%}{{- s.type | join(' | ') -}}",
    "{%- else -%}{{- 'any' -}}{%- endif -%}",
    "{%- if s.nullable -%}{{- ' | null' -}}{%- endif -%}",
    "{%- endmacro -%}",
);

const TOOLS: &str = concat!(
    "{%- macro functions(tools) -%}",
    "{{- '## functions\\n\\nnamespace functions {\\n\\n' -}}",
    "{%- for t in tools -%}{%- set f = t.function -%}",
    "{%- if f.description -%}{{- '// ' + f.description + '\\n' -}}{%- endif -%}",
    "{{- 'type ' + f.name + ' = ' -}}",
    "{%- if f.parameters and f.parameters.properties -%}{{- '(_: {\\n' -}}",
    "{%- for k, v in f.parameters.properties | items -%}",
    "{%- if v.description -%}{{- '// ' + v.description + '\\n' -}}{%- endif -%}",
    "{{- k + ('' if k in (f.parameters.required or []) else '?') + ': ' + ts_type(v) -}}",
    "{%- if v.default is defined -%}",
    "{{- ', // default: ' + (v.default | string if v.enum else v.default | tojson) -}}",
    "{%- endif -%}",
    "{{- ',\\n' -}}",
    "{%- endfor -%}{{- '}) => any;\\n\\n' -}}",
    "{%- else -%}{{- '() => any;\\n\\n' -}}{%- endif -%}",
    "{%- endfor -%}",
    "{{- '} // namespace functions' -}}",
    "{%- endmacro -%}",
);

const BODY: &str = concat!(
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n' -}}",
    "{{- 'Knowledge cutoff: 2024-06\\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\\n\\n' -}}",
    "{{- 'Reasoning: ' + (reasoning_effort or 'medium') + '\\n\\n' -}}",
    "{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}",
    "{%- if tools -%}{{- \"\\nCalls to these tools must go to the commentary channel: 'functions'.\" -}}{%- endif -%}",
    "{{- '<|end|>' -}}",
    "{%- if messages and messages[0].role in ['system', 'developer'] -%}",
    "{%- set instructions = messages[0].content -%}{%- set turns = messages[1:] -%}",
    "{%- else -%}{%- set instructions = '' -%}{%- set turns = messages -%}{%- endif -%}",
    "{%- if instructions or tools -%}{{- '<|start|>developer<|message|>' -}}",
    "{%- if instructions -%}{{- '# Instructions\\n\\n' + instructions + '\\n\\n' -}}{%- endif -%}",
    "{%- if tools -%}{{- '# Tools\\n\\n' + functions(tools) -}}{%- endif -%}",
    "{{- '<|end|>' -}}{%- endif -%}",
    "{%- set last = namespace(call=none) -%}",
    "{%- for m in turns -%}",
    "{%- if m.role == 'user' -%}{{- '<|start|>user<|message|>' + (m.content or '') + '<|end|>' -}}",
    "{%- elif m.role == 'assistant' and m.tool_calls -%}",
    "{%- set later = namespace(answer=false) -%}",
    "{%- for n in turns[loop.index:] -%}",
    "{%- if n.role == 'assistant' and not n.tool_calls -%}{%- set later.answer = true -%}{%- endif -%}",
    "{%- endfor -%}",
    "{%- set thought = m.thinking or m.content -%}",
    "{%- if thought and not later.answer -%}",
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + thought + '<|end|>' -}}",
    "{%- endif -%}",
    "{%- for c in m.tool_calls -%}",
    "{{- '<|start|>assistant to=functions.' + c.function.name + '<|channel|>commentary json<|message|>' -}}",
    "{{- (c.function.arguments | tojson) + '<|call|>' -}}",
    "{%- set last.call = c.function.name -%}",
    "{%- endfor -%}",
    "{%- elif m.role == 'assistant' -%}",
    "{{- '<|start|>assistant<|channel|>final<|message|>' + (m.content or '') + '<|end|>' -}}",
    "{%- elif m.role == 'tool' -%}",
    "{%- set name = m.name or last.call -%}",
    "{%- if not name -%}{{- raise_exception('a tool result with no call before it') -}}{%- endif -%}",
    "{{- '<|start|>functions.' + name + ' to=assistant<|channel|>commentary<|message|>' -}}",
    "{{- ((m.content or '') | tojson) + '<|end|>' -}}",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}",
);

/// The template's text, macros first.
pub fn builtin() -> Builtin {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    Builtin { name: "harmony", text: TEXT.get_or_init(|| format!("{TYPES}{TOOLS}{BODY}")) }
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
