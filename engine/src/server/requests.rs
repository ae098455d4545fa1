//! Validation of the public request bodies into what the generation thread runs:
//! every field is checked here, with the field named in the error, before anything is
//! queued. Fields a request omits come from the server's flags, then the model file's
//! own defaults, then llama.cpp's.
//!
//! A constraint or tool request is compiled into a grammar here. One that cannot be
//! enforced (it does not compile, or grammars are off) is never an error and never
//! ignored: the request carries a warning (sent as a `Warning` header) and, for chat,
//! the system turn states the required output.

use corral_protocol::bounds;
use corral_protocol::openai::{CompletionRequest, Prompt, SamplingFields};
use corral_protocol::{ApiError, ErrorKind};
use llguidance::api::TopLevelGrammar;

use super::answer::Reading;
use super::structured;
use crate::Engine;
use crate::generate::GenerateParams;
use crate::grammar::{Constraint, Grammar};
use crate::sampler::SamplingParams;
use crate::speculate::Speculate;

/// Raw completions that omit `max_tokens` (and no `--max-tokens`): a prompt with no
/// template has no end-of-turn to stop at, so "until the context is full" would be
/// the usual outcome.
pub const COMPLETION_DEFAULT_MAX_TOKENS: usize = 512;
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// Server-wide overrides (flags); `None` falls through to the model's defaults.
#[derive(Clone, Debug, Default)]
pub struct ServerDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub max_tokens: Option<usize>,
    /// `--grammar off`: constraints are stated in the prompt, not enforced.
    pub grammar_off: bool,
    /// `--thinking`: whether templates that can reason are asked to, when a request
    /// does not say.
    pub thinking: Option<bool>,
    /// `--speculate`: for requests that do not say.
    pub speculate: Speculate,
}

/// The sampling defaults in effect: flags > model file (`general.sampling.*`) > built-in.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveDefaults {
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub grammar: bool,
    pub thinking: Option<bool>,
    pub speculate: Speculate,
}

impl EffectiveDefaults {
    pub fn new(flags: &ServerDefaults, model: &ModelSamplingDefaults) -> Self {
        let base = SamplingParams::default();
        Self {
            sampling: SamplingParams {
                temperature: flags.temperature.or(model.temperature).unwrap_or(base.temperature),
                top_p: flags.top_p.or(model.top_p).unwrap_or(base.top_p),
                top_k: flags.top_k.or(model.top_k).unwrap_or(base.top_k),
                min_p: flags.min_p.or(model.min_p).unwrap_or(base.min_p),
                ..base
            },
            max_tokens: flags.max_tokens,
            grammar: !flags.grammar_off,
            thinking: flags.thinking,
            speculate: flags.speculate,
        }
    }
}

/// Sampling defaults a GGUF may carry (`general.sampling.*`).
#[derive(Clone, Debug, Default)]
pub struct ModelSamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
}

pub struct Validated {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub stream: bool,
    pub include_usage: bool,
    /// Why a requested constraint is not enforced (each becomes a `Warning` header).
    pub warnings: Vec<String>,
    /// How to read the answer back (reasoning, tool calls).
    pub reading: Reading,
    /// The rendered chat prompt (`/apply-template`).
    pub rendered: Option<String>,
}

fn range_f(param: &str, v: Option<f64>, ok: impl Fn(f64) -> bool, what: &str) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && ok(x) => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid(param, format!("{param} must be {what} (got {x})"))),
    }
}

pub(super) fn sampling(
    f: &SamplingFields,
    d: &EffectiveDefaults,
    vocab: usize,
) -> Result<(SamplingParams, Option<usize>), ApiError> {
    // The request bounds (`n`, `max_tokens`, stop strings) are `protocol::bounds`'s, the
    // same checks the gateway makes before it starts an engine.
    if let Some(n) = f.n {
        bounds::choices(n)?;
    }
    let mut p = d.sampling.clone();
    if let Some(t) = range_f("temperature", f.temperature, |x| x >= 0.0, ">= 0")? {
        p.temperature = t;
    }
    if let Some(v) = range_f("top_p", f.top_p, |x| x > 0.0 && x <= 1.0, "in (0, 1]")? {
        p.top_p = v;
    }
    if let Some(v) = range_f("min_p", f.min_p, |x| (0.0..=1.0).contains(&x), "in [0, 1]")? {
        p.min_p = v;
    }
    if let Some(k) = f.top_k {
        p.top_k =
            usize::try_from(k).map_err(|_| ApiError::invalid("top_k", format!("top_k must be >= 0 (got {k})")))?;
    }
    if let Some(v) = range_f("presence_penalty", f.presence_penalty, |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")? {
        p.presence_penalty = v;
    }
    if let Some(v) = range_f("frequency_penalty", f.frequency_penalty, |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")? {
        p.frequency_penalty = v;
    }
    if let Some(v) = range_f("repetition_penalty", f.repetition_penalty, |x| x > 0.0 && x <= 10.0, "in (0, 10]")? {
        p.repetition_penalty = v;
    }
    p.seed = f.seed.map(|s| s as u64);
    if let Some(bias) = &f.logit_bias {
        let mut out = Vec::with_capacity(bias.len());
        for (k, &v) in bias {
            let id: u32 = k
                .parse()
                .map_err(|_| ApiError::invalid("logit_bias", format!("logit_bias key {k:?} is not a token id")))?;
            if id as usize >= vocab {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("token id {id} is outside the vocabulary ({vocab})"),
                ));
            }
            if !v.is_finite() || !(-100.0..=100.0).contains(&v) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias values must be in [-100, 100] (got {v})"),
                ));
            }
            out.push((id, v as f32));
        }
        out.sort_by_key(|x| x.0);
        p.logit_bias = out;
    }
    // Both are checked (as the gateway does) even though `max_completion_tokens` wins.
    let bounded = |param, v: Option<i64>| v.map(|m| bounds::output_tokens(param, m)).transpose();
    let tokens = bounded("max_tokens", f.max_tokens)?;
    let max_tokens = bounded("max_completion_tokens", f.max_completion_tokens)?.or(tokens).or(d.max_tokens);
    Ok((p, max_tokens))
}

pub(super) fn stops(f: &SamplingFields) -> Result<Vec<String>, ApiError> {
    let v = f.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    bounds::stops("stop", &v)?;
    Ok(v.into_iter().filter(|s| !s.is_empty()).collect())
}

/// What the sampling fields and the prompt give, before the grammar and the
/// response-shaping parts are added.
pub(super) struct Common {
    pub prompt: Vec<u32>,
    pub logprobs: Option<usize>,
    /// `max_tokens` when neither the request nor `--max-tokens` sets it.
    pub default_max: usize,
}

pub(super) fn finish(
    c: Common,
    f: &SamplingFields,
    d: &EffectiveDefaults,
    engine: &Engine,
    ctx: usize,
) -> Result<Validated, ApiError> {
    let (sampling, max_tokens) = sampling(f, d, engine.config().vocab)?;
    let prompt = c.prompt;
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if prompt.len() >= ctx {
        return Err(ApiError::new(
            ErrorKind::ContextLengthExceeded,
            format!("the prompt has {} tokens but the context holds {ctx}; shorten it", prompt.len()),
        ));
    }
    let params = GenerateParams {
        max_tokens: max_tokens.unwrap_or(c.default_max),
        sampling,
        stop: stops(f)?,
        ignore_eos: f.ignore_eos.unwrap_or(false),
        logprobs: c.logprobs,
        grammar: None,
        speculate: match &f.speculate {
            None => d.speculate,
            Some(s) => s.parse().map_err(|e: String| ApiError::invalid("speculate", e))?,
        },
    };
    let stream = f.stream.unwrap_or(false);
    let include_usage = f.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    Ok(Validated {
        prompt,
        params,
        stream,
        include_usage,
        warnings: Vec::new(),
        reading: Reading::default(),
        rendered: None,
    })
}

/// Compile `grammar`, or say why it is not enforced.
pub(super) fn compile(
    engine: &Engine,
    d: &EffectiveDefaults,
    grammar: TopLevelGrammar,
    json: bool,
) -> Result<Grammar, String> {
    if !d.grammar {
        return Err("grammars are turned off on this server (--grammar off)".into());
    }
    engine.grammars.compile(grammar, json).map_err(|e| {
        tracing::warn!(error = %e, "grammar does not compile: the constraint is stated in the prompt instead");
        format!("the constraint does not compile: {e}")
    })
}

pub(super) fn tokenize(engine: &Engine, text: &str) -> Result<Vec<u32>, ApiError> {
    engine.tokenizer.encode(text, true).map_err(|e| ApiError::from(&e))
}

/// A completion's prompt as the request gives it: text to tokenize, or token ids
/// (checked against the vocabulary).
pub(super) enum PromptIn<'a> {
    Text(&'a str),
    Ids(Vec<u32>),
}

/// What a completion request asks for, checked without the model: the prompt, the
/// logprobs count and the constraint (`vocab` bounds token ids).
pub(super) fn completion_parts(
    req: &CompletionRequest,
    vocab: usize,
) -> Result<(PromptIn<'_>, Option<usize>, Option<Constraint>), ApiError> {
    if req.echo.unwrap_or(false) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let ids = |v: &[i64]| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|&t| {
                u32::try_from(t).ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
                    ApiError::invalid("prompt", format!("token id {t} is outside the vocabulary ({vocab})"))
                })
            })
            .collect()
    };
    let prompt = match &req.prompt {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Prompt::Text(t)) => PromptIn::Text(t),
        Some(Prompt::Texts(v)) if v.len() == 1 => PromptIn::Text(&v[0]),
        Some(Prompt::Tokens(v)) => PromptIn::Ids(ids(v)?),
        Some(Prompt::TokenLists(v)) if v.len() == 1 => PromptIn::Ids(ids(&v[0])?),
        Some(_) => return Err(ApiError::invalid("prompt", "exactly one prompt per request is supported")),
    };
    let logprobs = match req.logprobs {
        None | Some(-1) => None,
        Some(n) if (0..=MAX_TOP_LOGPROBS).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {n})"),
            ));
        }
    };
    let constraint = structured::constraint(&req.constraints)?.map(|(_, c)| c);
    Ok((prompt, logprobs, constraint))
}

pub fn completion(
    req: &CompletionRequest,
    engine: &Engine,
    d: &EffectiveDefaults,
    ctx: usize,
) -> Result<Validated, ApiError> {
    let (prompt, logprobs, constraint) = completion_parts(req, engine.config().vocab)?;
    let prompt = match prompt {
        PromptIn::Text(t) => tokenize(engine, t)?,
        PromptIn::Ids(ids) => ids,
    };
    let common = Common { prompt, logprobs, default_max: COMPLETION_DEFAULT_MAX_TOKENS };
    let mut v = finish(common, &req.sampling, d, engine, ctx)?;
    // Raw completions have no template to state an unenforced constraint in: the
    // warning header alone tells the client.
    match constraint.map(|c| compile(engine, d, TopLevelGrammar::from_grammar(c.grammar("answer")), c.is_json())) {
        Some(Ok(g)) => v.params.grammar = Some(g),
        Some(Err(reason)) => v.warnings.push(format!("grammar not enforced: {reason}")),
        None => {}
    }
    Ok(v)
}
