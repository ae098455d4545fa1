//! Per-model settings from the config file (`[models.<id>]` in `corral.toml`): other
//! names a model answers to, whether the LRU pool may evict it, and engine options that
//! override the pool-wide ones for this model's engines. Pure values; the pool reads
//! them when it routes, evicts and starts an engine.

use corral_protocol::launch::{EngineOptions, SamplingFlags};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelSettings {
    /// Names a request's `model` may use instead of the id.
    pub aliases: Vec<String>,
    /// Never evicted by the LRU pool or stopped by keep-alive (an unload or shutdown still
    /// stops it).
    pub pin: bool,
    pub ctx: Option<usize>,
    pub batch: Option<usize>,
    /// Only the fields that are `Some` override the pool-wide defaults.
    pub sampling: SamplingFlags,
}

impl ModelSettings {
    /// The options this model's engines start with: the pool-wide ones, with this
    /// model's overrides on top.
    pub fn apply(&self, base: &EngineOptions) -> EngineOptions {
        let mut o = base.clone();
        o.ctx = self.ctx.or(o.ctx);
        o.batch = self.batch.or(o.batch);
        let (s, b) = (&self.sampling, &mut o.sampling);
        b.temperature = s.temperature.or(b.temperature);
        b.top_p = s.top_p.or(b.top_p);
        b.top_k = s.top_k.or(b.top_k);
        b.min_p = s.min_p.or(b.min_p);
        b.max_tokens = s.max_tokens.or(b.max_tokens);
        b.grammar = s.grammar.or(b.grammar);
        b.thinking = s.thinking.or(b.thinking);
        b.speculate = s.speculate.clone().or(b.speculate.take());
        b.chat_template = s.chat_template.clone().or(b.chat_template.take());
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_only_what_is_set() {
        let mut base = EngineOptions { ctx: Some(2048), batch: Some(8), threads: Some(4), ..Default::default() };
        base.sampling.temperature = Some(0.7);
        base.sampling.top_k = Some(40);
        let mut s = ModelSettings { ctx: Some(8192), ..Default::default() };
        s.sampling.temperature = Some(0.2);
        let o = s.apply(&base);
        assert_eq!((o.ctx, o.batch, o.threads), (Some(8192), Some(8), Some(4)));
        assert_eq!((o.sampling.temperature, o.sampling.top_k), (Some(0.2), Some(40)));
        assert_eq!(ModelSettings::default().apply(&base), base);
    }
}
