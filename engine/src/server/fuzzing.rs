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

#[cfg(test)]
mod tests {
    use corral_protocol::ApiShape;
    use corral_protocol::bounds::Outline;

    use super::*;

    fn engine(api: Api, body: impl AsRef<[u8]>) -> Result<Option<String>, ApiError> {
        check(api, body.as_ref(), &Model { tool_format: ToolFormat::fallback(), template: None })
    }

    fn gateway(shape: ApiShape, body: impl AsRef<[u8]>) -> Result<(), String> {
        let o = Outline::read(body.as_ref(), shape).map_err(|e| e.message)?;
        o.check(shape).map_err(|e| e.message)
    }

    /// Found by the request fuzz targets (`corral_fuzz::request`): bodies the engine
    /// accepts that the gateway refused, and bounds the two named differently.
    #[test]
    fn the_gateway_refuses_no_body_the_engine_accepts() {
        let hi = r#""messages": [{"role": "user", "content": "Hi"}]"#;
        // The engine used max_completion_tokens and never looked at max_tokens.
        let body = format!(r#"{{{hi}, "max_completion_tokens": 5, "max_tokens": 0}}"#);
        let (e, g) = (engine(Api::Chat, &body).unwrap_err(), gateway(ApiShape::OpenAi, &body).unwrap_err());
        assert_eq!(e.message, g);
        // A key given twice that the engine does not read for this API.
        let body = r#"{"prompt": "x", "max_output_tokens": 1, "max_output_tokens": 2}"#;
        assert!(engine(Api::Completion, body).is_ok() && gateway(ApiShape::OpenAi, body).is_ok());
        let body = format!(r#"{{"max_tokens": 1, {hi}, "n": 1, "n": 2}}"#);
        assert!(engine(Api::Messages, &body).is_ok() && gateway(ApiShape::Anthropic, &body).is_ok());
        // Fields the engine skips unread: not UTF-8, nested past serde_json's limit.
        let mut body = format!(r#"{{"max_tokens": 1, {hi}, "x": ["#).into_bytes();
        body.extend(b"\"\xff\"], \"deep\": ".iter().chain(&[b'['; 200]).chain(&[b']'; 200]).chain(b"}"));
        assert!(engine(Api::Messages, &body).is_ok() && gateway(ApiShape::Anthropic, &body).is_ok());
        // Another API's bounded field holding a string that is not UTF-8.
        let mut body = format!(r#"{{"max_tokens": 1, {hi}, "max_completion_tokens": {{"a"#).into_bytes();
        body.extend(b"\xa3\": 1}, \"stop\": [\"\xff\"]}");
        assert!(engine(Api::Messages, &body).is_ok() && gateway(ApiShape::Anthropic, &body).is_ok());
        // Out-of-bounds fields are named as the gateway names them.
        let stops = serde_json::to_string(&vec!["x"; 17]).unwrap();
        let body = format!(r#"{{"max_tokens": 1, {hi}, "stop_sequences": {stops}}}"#);
        let (e, g) = (engine(Api::Messages, &body).unwrap_err(), gateway(ApiShape::Anthropic, &body).unwrap_err());
        assert_eq!((e.param.as_deref(), e.message), (Some("stop_sequences"), g));
        let body = r#"{"input": "Hi", "max_output_tokens": 0}"#;
        let (e, g) = (
            engine(Api::Responses { history_expanded: false }, body).unwrap_err(),
            gateway(ApiShape::Responses, body).unwrap_err(),
        );
        assert_eq!((e.param.as_deref(), e.message), (Some("max_output_tokens"), g));
    }
}
