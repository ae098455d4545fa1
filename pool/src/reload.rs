//! A new model list while serving (`corral serve` re-reads its config on SIGHUP).
//!
//! New models are added; models still listed keep their engine and take their new
//! settings (engines started afterwards get the new options); models no longer listed
//! stop being routed at once and their engine is stopped the one way every engine is —
//! drained first, so requests in flight finish — after which the entry is forgotten
//! (`Shared::step`). A model listed again before its old engine is gone is simply live
//! again. Nothing here touches an engine that keeps serving.

use std::collections::BTreeMap;

use corral_protocol::ModelId;
use corral_protocol::launch::EngineOptions;

use crate::event::{Event, StopReason};
use crate::pool::{Model, Pool, now};
use crate::registry::ModelEntry;
use crate::settings::ModelSettings;

/// What a reload changed, for the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Still listed, with a different file or different settings.
    pub updated: Vec<String>,
}

impl Pool {
    /// Serve `models` from now on, each with its `settings`, engines started later with
    /// `engine_options`.
    pub fn reconfigure(
        &self,
        models: Vec<ModelEntry>,
        mut settings: BTreeMap<ModelId, ModelSettings>,
        engine_options: EngineOptions,
    ) -> Changes {
        let shared = &self.shared;
        let mut changes = Changes::default();
        let stops: Vec<ModelId> = {
            let mut g = shared.lock();
            let t = now();
            let base_changed = g.engine_options != engine_options;
            g.engine_options = engine_options;
            let listed: Vec<ModelId> = models.iter().map(|e| e.id.clone()).collect();
            for e in models {
                let s = settings.remove(&e.id).unwrap_or_default();
                let base = g.engine_options.clone();
                match g.models.get_mut(&e.id) {
                    Some(m) if m.entry.path == e.path && !m.retired => {
                        if m.settings != s || base_changed {
                            changes.updated.push(e.id.to_string());
                        }
                        m.settings = s;
                        m.entry = e;
                    }
                    Some(m) if m.slot.state().is_resident() => {
                        // Its engine keeps the old file until it stops; the next one
                        // starts from the new file.
                        changes.updated.push(e.id.to_string());
                        m.retired = false;
                        m.settings = s;
                        m.entry = e;
                    }
                    _ => {
                        changes.added.push(e.id.to_string());
                        let id = e.id.clone();
                        g.models.insert(id, Model::new(e, s, &base, t));
                    }
                }
            }
            let dropped: Vec<ModelId> = g.order.iter().filter(|id| !listed.contains(id)).cloned().collect();
            g.order = listed;
            for id in &dropped {
                changes.removed.push(id.to_string());
                if let Some(m) = g.models.get_mut(id) {
                    m.retired = true;
                }
            }
            dropped
        };
        for id in &stops {
            let idle =
                shared.lock().models.get(id).is_some_and(|m| m.slot.proc().is_none() && !m.slot.state().is_resident());
            if idle {
                shared.lock().models.remove(id);
            } else {
                tracing::info!(model = %id, "a reload dropped this model; draining and stopping its engine");
                shared.step(id, Event::Stop { why: StopReason::Unload, pid: None });
            }
        }
        shared.changed.notify_waiters();
        changes
    }
}
