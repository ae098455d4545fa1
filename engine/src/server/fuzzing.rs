//! Entry points for the fuzz targets in `fuzz/`, not for the server: a request body
//! through the engine's own parse and validation (`http::parse_json`, each API's
//! reading into `ChatInput`, `input::prepare`, the sampling and stop checks), as far as
//! they go without a loaded model. Grammars are built but not compiled (that needs the
//! tokenizer): every request takes the path of a grammar that is not enforced.

use corral_protocol::ApiError;
use corral_protocol::openai::{ChatCompletionRequest, CompletionRequest, SamplingFields};
use corral_protocol::responses::ResponsesRequest;

use super::http::parse_json;
use super::input::{self, ChatInput};
use super::requests::{self, EffectiveDefaults, ModelSamplingDefaults, ServerDefaults};
use super::{anthropic, responses_api};
use crate::chat::ChatTemplate;
use crate::tools::format::ToolFormat;

/// The vocabulary size the checks assume (token ids, `logit_bias` keys): SmolLM2's.
pub const VOCAB: usize = 49_152;

/// The generation APIs, by request shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
    Messages,
    /// `history_expanded`: the gateway sent the whole history (`x-corral-history`).
    Responses {
        history_expanded: bool,
    },
}

/// How a chat request is prepared: the model's tool-call format and, if given, the
/// chat template the prompt is rendered with.
pub struct Model<'a> {
    pub tool_format: ToolFormat,
    pub template: Option<&'a ChatTemplate>,
}

/// Check `body` as `api`'s request. `Ok` carries the rendered chat prompt (chat APIs
/// with a template); an `Err` is the 4xx the engine would answer.
pub fn check(api: Api, body: &[u8], model: &Model<'_>) -> Result<Option<String>, ApiError> {
    let defaults = EffectiveDefaults::new(&ServerDefaults::default(), &ModelSamplingDefaults::default());
    let input: ChatInput = match api {
        Api::Completion => {
            let req: CompletionRequest = parse_json(body)?;
            requests::completion_parts(&req, VOCAB)?;
            sampling(&req.sampling, &defaults)?;
            return Ok(None);
        }
        Api::Chat => input::from_openai(&parse_json::<ChatCompletionRequest>(body)?)?,
        Api::Messages => anthropic::input(&parse_json(body)?)?,
        Api::Responses { history_expanded } => {
            responses_api::input(&parse_json::<ResponsesRequest>(body)?, history_expanded)?
        }
    };
    let p = input::prepare(input, &model.tool_format, defaults.thinking, |_, _| {
        Err("grammars are not compiled while fuzzing".into())
    })?;
    let rendered = match model.template {
        Some(t) => Some(
            t.render_with(&p.messages, p.tools_json.as_ref(), true, &p.template_kwargs)
                .map_err(|e| ApiError::from(&e))?,
        ),
        None => None,
    };
    sampling(&p.sampling, &defaults)?;
    Ok(rendered)
}

fn sampling(f: &SamplingFields, d: &EffectiveDefaults) -> Result<(), ApiError> {
    requests::sampling(f, d, VOCAB)?;
    requests::stops(f)?;
    Ok(())
}
