//! Loading and unloading a model because a person asked (`POST /api/models/{id}/load`
//! and `/unload`, the engines page's buttons), as opposed to a request's routing.
//!
//! Both name their model exactly: there is no fallback to the only configured model, so
//! a typo is an unknown model, never an action on another one. A load is a lease that is
//! given back at once: the engine starts (or is already up), other engines over the
//! limits are evicted once it is ready, exactly as for a request. An unload is one more
//! stop reason for the slot (`StopReason::Unload`), carried out by the one stop path
//! (drain, prompt cache to the SSD tier, SIGTERM, SIGKILL at the deadline).

use corral_protocol::ModelId;

use crate::error::LeaseError;
use crate::event::{Event, StopHow, StopReason};
use crate::pool::Pool;
use crate::state::EngineState;
use crate::stop::StopPolicy;

impl Pool {
    /// The configured model with exactly this id (not an alias).
    pub fn exact(&self, id: &str) -> Result<ModelId, LeaseError> {
        let g = self.shared.lock();
        match g.models.iter().find(|(k, m)| k.as_str() == id && !m.retired) {
            Some((k, _)) => Ok(k.clone()),
            None => Err(LeaseError::UnknownModel { requested: Some(id.to_owned()), known: g.known() }),
        }
    }

    /// Start `id`'s engine unless it runs, and return once it is ready (the same waits
    /// and errors as a request: load timeout, a full pool of busy engines, a crash loop).
    pub async fn load(&self, id: &str) -> Result<(), LeaseError> {
        let id = self.exact(id)?;
        self.lease(Some(id.as_str())).await.map(drop)
    }

    /// Stop `id`'s engine and return once it is gone (its requests in flight finish up
    /// to the drain timeout). A crashed or failed model is reset to stopped. Returns the
    /// state it ended in: `stopped`, or whatever it was when the stop path's own bound
    /// ran out (it is killed by then; the caller can poll `/engine`).
    pub async fn unload(&self, id: &str) -> Result<EngineState, LeaseError> {
        let id = self.exact(id)?;
        let shared = &self.shared;
        if shared.lock().shutting_down {
            return Err(LeaseError::ShuttingDown);
        }
        tracing::info!(model = %id, "unload requested");
        shared.step(&id, Event::Stop { why: StopReason::Unload, pid: None });
        let bound = StopPolicy::new(StopHow::Graceful, shared.cfg.drain_timeout, shared.cfg.stop_timeout).bound();
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let notified = shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let state = shared.lock().models.get(&id).map_or(EngineState::Stopped, |m| m.slot.state());
            if matches!(state, EngineState::Stopped | EngineState::Crashed | EngineState::Failed) {
                return Ok(state);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(state);
            }
        }
    }
}
