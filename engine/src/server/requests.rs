//! Validation of the public request bodies into what the generation thread runs:
//! every field is checked here, with the field named in the error, before anything is
//! queued. Fields a request omits come from the server's flags, then the model file's
//! own defaults, then llama.cpp's.

use corral_protocol::openai::{ChatCompletionRequest, CompletionRequest, Content, Prompt, SamplingFields};
use corral_protocol::{ApiError, ErrorKind};

use crate::Engine;
use crate::chat::ChatMessage;
use crate::generate::GenerateParams;
use crate::sampler::SamplingParams;

/// A `max_tokens` above this is not a request anyone means.
pub const MAX_TOKENS_LIMIT: i64 = 1 << 24;
pub const MAX_STOPS: usize = 16;
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// Server-wide overrides (flags); `None` falls through to the model's defaults.
#[derive(Clone, Debug, Default)]
pub struct ServerDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub max_tokens: Option<usize>,
}

/// The sampling defaults in effect: flags > model file (`general.sampling.*`) > built-in.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveDefaults {
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
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
}

fn range_f(param: &str, v: Option<f64>, ok: impl Fn(f64) -> bool, what: &str) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && ok(x) => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::invalid(param, format!("{param} must be {what} (got {x})"))),
    }
}

fn sampling(
    f: &SamplingFields,
    d: &EffectiveDefaults,
    vocab: usize,
) -> Result<(SamplingParams, Option<usize>), ApiError> {
    if let Some(n) = f.n
        && n != 1
    {
        return Err(ApiError::invalid("n", format!("only n=1 is supported (got {n})")));
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
    let max = f.max_completion_tokens.or(f.max_tokens);
    let max_tokens = match max {
        None => d.max_tokens,
        Some(m) if m <= 0 => return Err(ApiError::invalid("max_tokens", format!("max_tokens must be > 0 (got {m})"))),
        Some(m) if m > MAX_TOKENS_LIMIT => {
            return Err(ApiError::invalid("max_tokens", format!("max_tokens must be <= {MAX_TOKENS_LIMIT} (got {m})")));
        }
        Some(m) => Some(m as usize),
    };
    Ok((p, max_tokens))
}

fn stops(f: &SamplingFields) -> Result<Vec<String>, ApiError> {
    let v = f.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if v.len() > MAX_STOPS {
        return Err(ApiError::invalid("stop", format!("at most {MAX_STOPS} stop strings")));
    }
    Ok(v.into_iter().filter(|s| !s.is_empty()).collect())
}

fn finish(
    prompt: Vec<u32>,
    f: &SamplingFields,
    d: &EffectiveDefaults,
    engine: &Engine,
    ctx: usize,
    logprobs: Option<usize>,
) -> Result<Validated, ApiError> {
    let (sampling, max_tokens) = sampling(f, d, engine.config().vocab)?;
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
        // Unset: until end of generation or the context is full (OpenAI's default).
        max_tokens: max_tokens.unwrap_or(ctx),
        sampling,
        stop: stops(f)?,
        ignore_eos: f.ignore_eos.unwrap_or(false),
        logprobs,
    };
    let stream = f.stream.unwrap_or(false);
    let include_usage = f.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    Ok(Validated { prompt, params, stream, include_usage })
}

fn message_text(i: usize, content: &Option<Content>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s.clone()),
        Some(Content::Parts(parts)) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => out.push_str(t),
                    ("text", None) => {
                        return Err(ApiError::invalid(&format!("{param}[{j}].text"), "a text part needs `text`"));
                    }
                    (other, _) => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}].type"),
                            format!("content part type {other:?} is not supported by this model"),
                        ));
                    }
                }
            }
            Ok(out)
        }
    }
}

pub fn chat(
    req: &ChatCompletionRequest,
    engine: &Engine,
    d: &EffectiveDefaults,
    ctx: usize,
) -> Result<Validated, ApiError> {
    let messages = req.messages.as_ref().ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut msgs = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => return Err(ApiError::invalid(&format!("messages[{i}].role"), format!("unknown role {other:?}"))),
        };
        msgs.push(ChatMessage::new(role, &message_text(i, &m.content)?));
    }
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
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
    let prompt = engine.chat_prompt(&msgs).map_err(|e| match e {
        crate::Error::Template(m) => ApiError::invalid("messages", format!("chat template: {m}")),
        other => ApiError::new(ErrorKind::Internal, other.to_string()),
    })?;
    finish(prompt, &req.sampling, d, engine, ctx, logprobs)
}

pub fn completion(
    req: &CompletionRequest,
    engine: &Engine,
    d: &EffectiveDefaults,
    ctx: usize,
) -> Result<Validated, ApiError> {
    if req.echo.unwrap_or(false) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let vocab = engine.config().vocab;
    let ids = |v: &[i64]| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|&t| {
                u32::try_from(t).ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
                    ApiError::invalid("prompt", format!("token id {t} is outside the vocabulary ({vocab})"))
                })
            })
            .collect()
    };
    let text = |t: &str| engine.raw_prompt(t).map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()));
    let prompt = match &req.prompt {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Prompt::Text(t)) => text(t)?,
        Some(Prompt::Texts(v)) if v.len() == 1 => text(&v[0])?,
        Some(Prompt::Tokens(v)) => ids(v)?,
        Some(Prompt::TokenLists(v)) if v.len() == 1 => ids(&v[0])?,
        Some(_) => return Err(ApiError::invalid("prompt", "exactly one prompt per request is supported")),
    };
    let logprobs = match req.logprobs {
        None => None,
        Some(n) if (0..=MAX_TOP_LOGPROBS).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {n})"),
            ));
        }
    };
    finish(prompt, &req.sampling, d, engine, ctx, logprobs)
}
