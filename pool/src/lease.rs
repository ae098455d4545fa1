//! `Lease`: one request's claim on a ready engine. It counts as the engine's request in
//! flight (so the engine is never evicted under it) until it is dropped or released.

use std::path::PathBuf;
use std::sync::Arc;

use corral_protocol::ModelId;

use crate::child;
use crate::event::Event;
use crate::pool::{Shared, now};

/// One request's claim on a ready engine; dropping it gives the claim back.
pub struct Lease {
    shared: Arc<Shared>,
    pub model: ModelId,
    pub socket: PathBuf,
    pub pid: u32,
    /// The process generation it was granted on (a lease outliving its process must not
    /// count against the next one).
    generation: u64,
    released: bool,
}

impl Lease {
    pub(crate) fn new(shared: Arc<Shared>, model: ModelId, socket: PathBuf, pid: u32, generation: u64) -> Self {
        Self { shared, model, socket, pid, generation, released: false }
    }
}

impl Lease {
    /// Give the slot back early (the proxy does this before retrying a connect).
    pub fn release(mut self) {
        self.release_inner();
    }

    fn release_inner(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let fx = {
            let mut g = self.shared.lock();
            let Some(m) = g.models.get_mut(&self.model) else { return };
            m.last_used_at = Some(child::unix_secs());
            m.apply(&self.model, Event::Released { generation: self.generation }, now())
        };
        self.shared.perform(&self.model, fx);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("model", &self.model).field("pid", &self.pid).finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release_inner();
    }
}
