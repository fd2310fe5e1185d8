//! The part this worker holds in a group, as its slots and heartbeat see
//! it: which stage, the model a leader's shards run on, and how to point
//! the part at a re-formed group. `group` takes the orders that set it.

use std::sync::{Arc, Mutex};

use minions_schemas::JobId;
use minions_schemas::messages::{GroupOrder, HeldStage};
use tokio_util::sync::CancellationToken;

use crate::model::Model;
use crate::model::llm::pace::Pace;

/// Points a part at a re-formed group: the order and this worker's place
/// in it.
pub(crate) type Regroup = Box<dyn Fn(&GroupOrder, usize) + Send + Sync>;

/// The part this worker holds in a group.
pub(crate) struct Part {
    /// The stage, as the heartbeat shows it.
    pub(crate) held: HeldStage,
    /// The group's job.
    pub(crate) job: JobId,
    /// Set when it leads: the model the job's shards run on.
    pub(crate) model: Option<Arc<dyn Model>>,
    /// Points it at new members.
    pub(crate) regroup: Regroup,
    /// Ends the part's tasks (the stage served, the replies read).
    pub(crate) stop: CancellationToken,
    /// How fast it runs its layers.
    pub(crate) pace: Arc<Pace>,
}

/// This worker's group, if any.
#[derive(Default)]
pub(crate) struct Groups {
    part: Mutex<Option<Part>>,
}

impl Groups {
    /// The model a shard of `job` runs on when this worker leads the
    /// job's group.
    pub(crate) fn lead_model(&self, job: &JobId) -> Option<Arc<dyn Model>> {
        let part = self.part.lock().unwrap_or_else(|p| p.into_inner());
        part.as_ref()
            .filter(|p| &p.job == job)
            .and_then(|p| p.model.clone())
    }

    /// The stage held, for the heartbeat.
    pub(crate) fn stage(&self) -> Option<HeldStage> {
        let part = self.part.lock().unwrap_or_else(|p| p.into_inner());
        part.as_ref().map(|p| HeldStage {
            layer_ns: p.pace.ns_per_layer_token(),
            ..p.held.clone()
        })
    }

    /// Takes a newer epoch of the group held when this worker keeps the
    /// same job, place and layers in it: the part goes on (its model stays
    /// loaded), pointed at the new members. False when it holds no such
    /// part.
    pub(crate) fn regroup(&self, order: &GroupOrder, index: usize) -> bool {
        let mut part = self.part.lock().unwrap_or_else(|p| p.into_inner());
        let Some(p) = part.as_mut() else { return false };
        let Some(m) = order.members.get(index) else {
            return false;
        };
        let same = p.held.group == order.group
            && p.job == order.job
            && p.held.index as usize == index
            && p.held.of as usize == order.members.len()
            && (p.held.first_layer, p.held.end_layer) == (m.first_layer, m.end_layer);
        if !same {
            return false;
        }
        p.held.epoch = order.epoch;
        (p.regroup)(order, index);
        true
    }

    /// Puts `part` in place of the one held, whose tasks end.
    pub(crate) fn replace(&self, part: Option<Part>) {
        let mut held = self.part.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = held.take() {
            old.stop.cancel();
        }
        *held = part;
    }
}
