//! One chat request, whichever API it came in on. OpenAI chat completions, Anthropic
//! Messages and OpenAI Responses each turn their request into a `ChatInput`
//! (`from_openai` here, the others in `api/`); `chat` then does everything else the
//! same way for all three: constraint and tool grammars, the degrade path, reasoning
//! controls, the chat template, tokenization, sampling defaults.

use corral_protocol::ApiError;
use corral_protocol::openai::{ChatCompletionRequest, SamplingFields};
use llguidance::api::TopLevelGrammar;
use serde_json::{Map, Value};

use super::answer::{Reading, ToolOutput};
use super::conversation::{self, Turn};
use super::requests::{Common, EffectiveDefaults, MAX_TOP_LOGPROBS, Validated, compile, finish, tokenize};
use super::structured;
use crate::Engine;
use crate::chat::ChatMessage;
use crate::grammar::{Constraint, Grammar};
use crate::reasoning::{self, Effort};
use crate::tools::ToolRequest;
use crate::tools::format::{Syntax, ToolFormat};
use crate::tools::grammar::tool_grammar;
use crate::tools::prompt::fallback_system;

/// A chat request in the form every API shares.
#[derive(Clone, Debug, Default)]
pub struct ChatInput {
    pub turns: Vec<Turn>,
    pub tools: Option<ToolRequest>,
    pub constraint: Option<Constraint>,
    /// Sampling, length, stop strings and streaming, in OpenAI's names.
    pub sampling: SamplingFields,
    pub logprobs: Option<usize>,
    /// `chat_template_kwargs`, passed to the template as variables.
    pub template_kwargs: Map<String, Value>,
    /// How hard the request asks the model to reason.
    pub effort: Option<Effort>,
    /// The request field that set `effort`, for a 400 about it.
    pub effort_field: &'static str,
    /// Parts of the request that are accepted but not honoured (Warning headers).
    pub warnings: Vec<String>,
}

/// `reasoning_effort` (chat) / `reasoning.effort` (Responses).
pub fn effort(param: &str, v: Option<&str>) -> Result<Option<Effort>, ApiError> {
    v.map(|s| {
        Effort::parse(s).ok_or_else(|| {
            ApiError::invalid(param, format!("{param} must be none, minimal, low, medium or high (got {s:?})"))
        })
    })
    .transpose()
}

pub fn from_openai(req: &ChatCompletionRequest) -> Result<ChatInput, ApiError> {
    let messages = req.messages.as_ref().ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs.filter(|&n| n != -1)) {
        (_, Some(n)) if !(0..=MAX_TOP_LOGPROBS).contains(&n) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {n})"),
            ));
        }
        (false, Some(_)) => return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true")),
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, None) => None,
    };
    Ok(ChatInput {
        turns: conversation::turns(messages)?,
        tools: structured::tools(req)?,
        constraint: structured::constraint(&req.constraints)?.map(|(_, c)| c),
        sampling: req.sampling.clone(),
        logprobs,
        template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        effort: effort("reasoning_effort", req.reasoning_effort.as_deref())?,
        effort_field: "reasoning_effort",
        warnings: Vec::new(),
    })
}

/// A chat request made ready for the chat template: everything `chat` decides before
/// it needs the model's template, tokenizer and vocabulary.
pub(super) struct Prepared {
    pub messages: Vec<ChatMessage>,
    /// The tools, for a template that renders them itself.
    pub tools_json: Option<Value>,
    pub template_kwargs: Map<String, Value>,
    pub tools: Option<ToolRequest>,
    /// The grammar, compiled, or why it is not enforced; `None`: nothing to enforce.
    pub compiled: Option<Result<Grammar, String>>,
    pub sampling: SamplingFields,
    pub logprobs: Option<usize>,
    pub warnings: Vec<String>,
}

/// The model-independent part of `chat`: the constraint and tool grammars (compiled by
/// `compile`, which may refuse), the system text they need, the reasoning switch and
/// the messages in the template's shape. `fmt` is the model's tool-call format.
pub(super) fn prepare(
    input: ChatInput,
    fmt: &ToolFormat,
    thinking: Option<bool>,
    compile: impl FnOnce(TopLevelGrammar, bool) -> Result<Grammar, String>,
) -> Result<Prepared, ApiError> {
    if input.turns.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let ChatInput { turns, tools, constraint, sampling, logprobs, mut template_kwargs, effort, effort_field, warnings } =
        input;
    let harmony = fmt.syntax == Syntax::Harmony;
    let grammar = match (&tools, &constraint) {
        (Some(t), c) => Some(tool_grammar(fmt, t, c.as_ref())),
        // Harmony's answer is a message: the constraint applies to its body.
        (None, Some(c)) if harmony => Some(crate::harmony::grammar::grammar(None, Some(c))),
        (None, Some(c)) => Some(TopLevelGrammar::from_grammar(c.grammar("answer"))),
        (None, None) => None,
    };
    let json = tools.is_some() || constraint.as_ref().is_some_and(Constraint::is_json);
    let compiled = grammar.map(|g| compile(g, json));
    let enforced = matches!(compiled, Some(Ok(_)));

    // What the system turn must say: the tools (unless the template renders them),
    // and, when nothing is enforced, the required output.
    let mut system = Vec::new();
    if let Some(t) = tools.as_ref().filter(|_| !fmt.native) {
        system.push(fallback_system(t));
    }
    if let Some(c) = constraint.as_ref().filter(|_| !enforced) {
        system.push(c.instruction());
    }
    let tools_json = tools.as_ref().filter(|_| fmt.native).map(|t| {
        Value::Array(
            t.tools
                .iter()
                .map(|d| {
                    serde_json::json!({"type": "function", "function": {
                        "name": d.name, "description": d.description, "parameters": d.parameters}})
                })
                .collect(),
        )
    });
    let explicit = match template_kwargs.get("enable_thinking") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs.enable_thinking",
                "chat_template_kwargs.enable_thinking must be true or false",
            ));
        }
    };
    if let Some(on) = reasoning::enable_thinking(explicit, effort, thinking) {
        template_kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    if let Some(e) = effort.filter(|_| harmony) {
        // Harmony always reasons; the effort is the system message's "Reasoning: <level>"
        // (gpt-oss's template reads `reasoning_effort`; an explicit kwarg wins).
        let level = crate::harmony::effort_level(e).ok_or_else(|| {
            ApiError::invalid(
                effort_field,
                format!("this model always reasons (harmony format): {effort_field} must be low, medium or high"),
            )
        })?;
        template_kwargs.entry("reasoning_effort").or_insert_with(|| Value::from(level));
    }
    let messages = conversation::template_messages(&turns, fmt, &system);
    Ok(Prepared { messages, tools_json, template_kwargs, tools, compiled, sampling, logprobs, warnings })
}

/// Validate a chat request into what the generation thread runs.
pub fn chat(input: ChatInput, engine: &Engine, d: &EffectiveDefaults, ctx: usize) -> Result<Validated, ApiError> {
    let fmt = &engine.tool_format;
    let p = prepare(input, fmt, d.thinking, |g, json| compile(engine, d, g, json))?;
    let enforced = matches!(p.compiled, Some(Ok(_)));
    let text =
        engine.render_chat(&p.messages, p.tools_json.as_ref(), &p.template_kwargs).map_err(|e| ApiError::from(&e))?;
    let prompt = tokenize(engine, &text)?;
    let mut v = finish(Common { prompt, logprobs: p.logprobs, default_max: ctx }, &p.sampling, d, engine, ctx)?;
    v.warnings = p.warnings;
    match p.compiled {
        Some(Ok(g)) => v.params.grammar = Some(g),
        Some(Err(reason)) => v.warnings.push(format!("grammar not enforced: {reason}")),
        None => {}
    }
    v.reading = Reading {
        harmony: fmt.syntax == Syntax::Harmony,
        tools: p.tools.map(|_| ToolOutput { format: fmt.clone(), enforced }),
        think: engine
            .template
            .as_ref()
            .is_some_and(|t| t.text().contains(reasoning::OPEN))
            .then(|| reasoning::prompt_opens(&text)),
    };
    v.rendered = Some(text);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatTemplate;

    /// The built-in harmony template, fed by the same request path as a real request,
    /// renders what llama.cpp renders from gpt-oss's own template
    /// (`scripts/models/oracle/harmony`), today's date aside.
    #[test]
    fn the_builtin_harmony_template_renders_as_gpt_oss_own_does() {
        let doc: Value = serde_json::from_str(include_str!("../../tests/fixtures/harmony-template.json")).unwrap();
        let builtin = crate::harmony::template::builtin();
        let t = ChatTemplate::new(None, Some(builtin), "<|startoftext|>", "<|return|>", false).unwrap();
        let fmt = ToolFormat::detect(Some(t.text()), |_| None);
        let undated = |s: &str| {
            let at = s.find("Current date: ").expect("a date") + "Current date: ".len();
            format!("{}{}", &s[..at], &s[at + "YYYY-MM-DD".len()..])
        };
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 6);
        for c in cases {
            let req: ChatCompletionRequest = serde_json::from_value(c["request"].clone()).unwrap();
            let input = from_openai(&req).unwrap();
            let p = prepare(input, &fmt, None, |_, _| Err("not compiled in this test".into())).unwrap();
            let ours = t.render_with(&p.messages, p.tools_json.as_ref(), true, &p.template_kwargs).unwrap();
            assert_eq!(undated(&ours), undated(c["prompt"].as_str().unwrap()), "{}", c["name"]);
        }
    }
}
