//! A hybrid sequence's recurrent state and its checkpoints (`SeqCache`'s part of
//! `crate::recurrent` and `crate::checkpoint`).
//!
//! On a GPU backend the live state (the one after `len` positions) stays in device
//! memory while the sequence runs: a pass updates it there, and copying every layer's
//! delta-rule state back after each decode step would cost more than the step (a 9B
//! model's is ~50 MB). The backend then says so (`leave_state_on_device`) and the host
//! copy is stale until `settle` fetches it through the mirror. Everything that reads the
//! live state on the host settles first (`checkpoint`; `Sequence::into_parts` before the
//! prompt cache stores it); what cannot (`Clone`, `fork`, `states`) treats a stale live
//! state as absent, so a copy restores from its newest checkpoint instead.

use std::sync::Arc;

use super::SeqCache;
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::recurrent::{RecurrentShape, RecurrentState};

impl SeqCache {
    /// The recurrent state to update in this pass, made first (zeros) for a sequence
    /// that has none and no positions. `None` for a sequence with positions but no state,
    /// which a hybrid model cannot continue. The host's state: never one left on the
    /// device.
    pub(crate) fn recurrent_mut(&mut self, shape: RecurrentShape) -> Option<&mut RecurrentState> {
        debug_assert!(!self.state_on_device, "a host pass over a state left on the device");
        if self.recurrent.is_none() && self.len == 0 {
            self.recurrent = Some(Arc::new(RecurrentState::new(shape)));
        }
        let state = Arc::make_mut(self.recurrent.as_mut()?);
        (state.shape() == shape).then_some(state)
    }

    /// Give a sequence with no positions its first recurrent state (zeros), as
    /// `recurrent_mut` would, without touching a state it has. Returns whether the
    /// sequence has a state of `shape` now (false: positions but no state, which a hybrid
    /// model cannot continue).
    pub(crate) fn ensure_recurrent(&mut self, shape: RecurrentShape) -> bool {
        if self.recurrent.is_none() && self.len == 0 {
            self.recurrent = Some(Arc::new(RecurrentState::new(shape)));
        }
        self.recurrent.as_ref().is_some_and(|r| r.shape() == shape)
    }

    /// The host's recurrent state, if any (stale while `state_on_device`).
    pub(crate) fn recurrent(&self) -> Option<&RecurrentState> {
        self.recurrent.as_deref()
    }

    /// Whether the live recurrent state is newer in the backend's mirror than here.
    pub(crate) fn state_on_device(&self) -> bool {
        self.state_on_device
    }

    /// A pass left the live state in the mirror only (the host copy is now stale).
    pub(crate) fn leave_state_on_device(&mut self) {
        self.state_on_device = self.recurrent.is_some() && self.mirror.is_some();
    }

    /// Bring a live state left on the device back into the host copy (no-op otherwise).
    pub(crate) fn settle(&mut self) -> Result<()> {
        if !self.state_on_device {
            return Ok(());
        }
        let (Some(m), Some(r)) = (self.mirror.as_mut(), self.recurrent.as_mut()) else {
            return Err(Error::Cuda {
                op: "settle",
                reason: "a recurrent state left on the device without a mirror".into(),
            });
        };
        m.data.fetch_state(Arc::make_mut(r))?;
        self.state_on_device = false;
        Ok(())
    }

    /// Forget everything (a hybrid model's pass that failed after writing its state).
    pub(crate) fn clear(&mut self) {
        self.truncate(0);
        self.recurrent = None;
        self.state_on_device = false;
        self.checkpoints.clear();
    }

    /// How many of the first `n` positions a fork would keep: `n` (clamped to `len`),
    /// except that a sequence with recurrent state keeps those up to its newest state at
    /// or below `n` (a checkpoint, or `len` itself unless left on the device), or none.
    pub fn restorable(&self, n: usize) -> usize {
        let n = n.min(self.len);
        match &self.recurrent {
            Some(_) => checkpoint::restorable(self.state_positions(), n),
            None => n,
        }
    }

    /// The host's live state, unless it is stale.
    fn live(&self) -> Option<&Arc<RecurrentState>> {
        self.recurrent.as_ref().filter(|_| !self.state_on_device)
    }

    /// Positions at which this sequence has a recurrent state on the host: its
    /// checkpoints, then `len` (empty without a state).
    pub fn state_positions(&self) -> impl Iterator<Item = usize> + '_ {
        let live = self.live().map(|_| self.len);
        self.checkpoints.iter().map(|c| c.0).filter(move |&p| Some(p) != live).chain(live)
    }

    /// The recurrent states with their positions, ascending, the last at `len` when the
    /// host has it (for persistence: settle first; empty for a sequence without one).
    pub fn states(&self) -> impl Iterator<Item = (usize, &RecurrentState)> + '_ {
        let live = self.live().map(|r| (self.len, &**r));
        let len = self.len;
        self.checkpoints.iter().filter(move |c| c.0 < len).map(|(p, r)| (*p, &**r)).chain(live)
    }

    /// The state after exactly `n` positions, if the host has one there.
    pub(super) fn state_at(&self, n: usize) -> Option<Arc<RecurrentState>> {
        match self.live() {
            Some(r) if n == self.len => Some(r.clone()),
            _ => self.checkpoints.iter().find(|c| c.0 == n).map(|c| c.1.clone()),
        }
    }

    /// Keep a snapshot of the current recurrent state at `len` (no-op without a state),
    /// fetched first if it was left on the device. Thinned as `checkpoint::thin` says.
    pub(crate) fn checkpoint(&mut self) {
        if let Err(e) = self.settle() {
            // The device failed; the next pass fails too, and this snapshot is not needed
            // for correctness (a later request only recomputes more).
            tracing::warn!(error = %e, "recurrent state not fetched from the device; no checkpoint");
            return;
        }
        let Some(r) = &self.recurrent else { return };
        if self.len == 0 || self.checkpoints.last().is_some_and(|c| c.0 >= self.len) {
            return;
        }
        self.checkpoints.push((self.len, r.clone()));
        checkpoint::thin(&mut self.checkpoints);
    }

    /// Give a sequence (of restored KV) its recurrent states, ascending positions, the
    /// last at `len`. Returns false (and changes nothing) if they do not fit that rule.
    pub fn set_states(&mut self, mut states: Vec<(usize, Arc<RecurrentState>)>) -> bool {
        let ascending = states.windows(2).all(|w| w[0].0 < w[1].0);
        if !ascending || states.last().is_none_or(|l| l.0 != self.len) || states[0].0 == 0 {
            return false;
        }
        self.recurrent = states.pop().map(|s| s.1);
        self.state_on_device = false;
        self.checkpoints = states;
        true
    }
}
