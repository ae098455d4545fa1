//! What an upstream says about its model in its `/v1/models`, and the card this gateway
//! lists for it; and which APIs a request may reach it through. Pure.
//!
//! Read from the entry whose `id` is the upstream's name for the model (or the only
//! entry): `capabilities` when it reports corral's object, the context from
//! `context_window` (corral) or `max_model_len` (vLLM), `owned_by`.

use corral_protocol::openai::{Capabilities, ModelCard};
use serde_json::Value;

use super::spec::Api;

/// What the upstream reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    /// Its `/v1/models` lists the model (by name, or as its only model).
    pub listed: bool,
    pub capabilities: Option<Capabilities>,
    pub context_window: Option<usize>,
    pub owned_by: Option<String>,
}

/// Read a `/v1/models` answer.
pub fn read(body: &[u8], name: &str) -> Reported {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return Reported::default() };
    let data: &[Value] = v["data"].as_array().map_or(&[], Vec::as_slice);
    let entry = data.iter().find(|m| m["id"] == name).or(match data {
        [only] => Some(only),
        _ => None,
    });
    let Some(m) = entry else { return Reported::default() };
    let size = |k: &str| m[k].as_u64().and_then(|n| usize::try_from(n).ok()).filter(|n| *n > 0);
    Reported {
        listed: true,
        capabilities: serde_json::from_value(m["capabilities"].clone()).ok(),
        context_window: size("context_window").or_else(|| size("max_model_len")),
        owned_by: m["owned_by"].as_str().map(str::to_owned),
    }
}

/// The card `/v1/models` lists for an upstream model.
pub fn card(id: &str, reported: Option<&Reported>, up: bool) -> ModelCard {
    let mut card = ModelCard::new(id, 0);
    card.owned_by = reported.and_then(|r| r.owned_by.clone()).unwrap_or_else(|| "upstream".to_owned());
    card.context_window = reported.and_then(|r| r.context_window);
    card.resident = Some(up);
    match reported.and_then(|r| r.capabilities.clone()) {
        Some(c) => card.with_capabilities(c),
        None => card,
    }
}

/// Whether a request through `api` may go to the upstream: as configured (`apis`), else
/// as its card reports, else chat and completions only (what every OpenAI-compatible
/// server has).
pub fn serves(api: Api, declared: Option<&[Api]>, reported: Option<&Capabilities>) -> bool {
    if let Some(list) = declared {
        return list.contains(&api);
    }
    match (api, reported) {
        (Api::Chat, Some(c)) => c.chat_completions,
        (Api::Completions, Some(c)) => c.text_completions,
        (Api::Messages, Some(c)) => c.anthropic_messages,
        (Api::Responses, Some(c)) => c.responses,
        (Api::Chat | Api::Completions, None) => true,
        (Api::Messages | Api::Responses | Api::ApplyTemplate, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corral_vllm_and_llama_server_cards_are_read() {
        let corral = br#"{"object":"list","data":[{"id":"other","object":"model","created":1,"owned_by":"corral"},
            {"id":"smol","object":"model","created":1,"owned_by":"corral","context_window":4096,
             "capabilities":{"chat_completions":true,"text_completions":true,"anthropic_messages":true,"responses":true,
             "streaming":true,"logprobs":true,"tools":true,"structured_output":true,"vision":false,"embeddings":false,"audio":false}}]}"#;
        let r = read(corral, "smol");
        assert!(r.listed && r.capabilities.as_ref().is_some_and(|c| c.anthropic_messages));
        assert_eq!((r.context_window, r.owned_by.as_deref()), (Some(4096), Some("corral")));
        let vllm = br#"{"object":"list","data":[{"id":"meta-llama/Llama-3.1-70B","object":"model","owned_by":"vllm","max_model_len":131072}]}"#;
        let r = read(vllm, "meta-llama/Llama-3.1-70B");
        assert_eq!((r.listed, r.context_window, r.capabilities), (true, Some(131072), None));
        // llama-server lists its one model under the file's name, whatever it is asked.
        let llama = br#"{"models":[{"name":"x"}],"object":"list","data":[{"id":"/m/smol.gguf","object":"model","owned_by":"llamacpp","meta":{"n_ctx_train":8192}}]}"#;
        assert_eq!(read(llama, "smol").owned_by.as_deref(), Some("llamacpp"));
        assert_eq!(read(b"{\"data\":[{\"id\":\"a\"},{\"id\":\"b\"}]}", "c"), Reported::default());
        assert_eq!(read(b"<html>", "c"), Reported::default());
    }

    #[test]
    fn the_listed_card_carries_what_was_reported() {
        let c = card("big", None, false);
        assert_eq!(
            (c.id.as_str(), c.owned_by.as_str(), c.resident, c.capabilities),
            ("big", "upstream", Some(false), None)
        );
        let r = read(br#"{"data":[{"id":"m","owned_by":"vllm","max_model_len":8192}]}"#, "m");
        let c = card("big", Some(&r), true);
        assert_eq!((c.owned_by.as_str(), c.context_window, c.resident), ("vllm", Some(8192), Some(true)));
    }

    #[test]
    fn apis_come_from_the_config_then_the_card_then_the_openai_baseline() {
        let mut caps = Capabilities::of_engine(true);
        assert!(serves(Api::Messages, None, Some(&caps)) && serves(Api::Responses, None, Some(&caps)));
        caps.anthropic_messages = false;
        assert!(!serves(Api::Messages, None, Some(&caps)));
        assert!(serves(Api::Chat, None, None) && serves(Api::Completions, None, None));
        assert!(!serves(Api::Messages, None, None) && !serves(Api::Responses, None, None));
        assert!(!serves(Api::ApplyTemplate, None, Some(&caps)), "never assumed");
        let declared = [Api::Chat, Api::Responses];
        assert!(serves(Api::Responses, Some(&declared), None));
        assert!(!serves(Api::Completions, Some(&declared), Some(&caps)), "the config wins over the card");
    }
}
