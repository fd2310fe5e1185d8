//! Groups: a language model split by layers over several workers. A
//! watchdog forms a group for a job that asks for one and tells each member
//! its part with a [`GroupOrder`] on [`crate::subjects::group`]; the member
//! loads its layers and answers with a [`GroupAnswer`]. The first member
//! drives the group and is the only one that pulls the job's shards; the
//! others serve their layers ([`super::StagePass`]). An order with a newer
//! epoch replaces the one before (a member was lost and replaced).

use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash, WorkerId};

/// One member of a group: a worker and the layers it holds,
/// `first_layer..end_layer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    /// The worker.
    pub worker: WorkerId,
    /// Its first layer.
    pub first_layer: u32,
    /// One past its last layer.
    pub end_layer: u32,
}

/// A watchdog's order to one member of a group. Limit:
/// [`crate::limits::MAX_CONTROL_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupOrder {
    /// Schema version.
    pub v: u16,
    /// The group.
    pub group: String,
    /// Its membership epoch; a newer order replaces an older one.
    pub epoch: u64,
    /// The job it runs.
    pub job: JobId,
    /// The model it splits.
    pub model_hash: ModelHash,
    /// The members in stage order, their layers consecutive from 0 to the
    /// model's last; the first drives.
    pub members: Vec<GroupMember>,
    /// The group is over: members let their layers go.
    pub release: bool,
    /// Who orders it, for the worker's log.
    pub by: String,
}

/// The stage of a group a worker holds, in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldStage {
    /// The group.
    pub group: String,
    /// Its epoch.
    pub epoch: u64,
    /// The worker's place in it (0 leads).
    pub index: u32,
    /// Members in the group.
    pub of: u32,
    /// Its layers, `first_layer..end_layer`.
    pub first_layer: u32,
    /// See [`HeldStage::first_layer`].
    pub end_layer: u32,
    /// Mean nanoseconds its passes took per layer per token so far (0: none
    /// measured yet): the watchdog gives faster members more layers when
    /// it forms a group.
    #[serde(default)]
    pub layer_ns: u32,
}

impl HeldStage {
    /// In words, for lists and pages: `stage 2 of 2 (layers 15..30) of
    /// g-<job>`.
    pub fn describe(&self) -> String {
        format!(
            "stage {} of {} (layers {}..{}) of {}",
            self.index + 1,
            self.of,
            self.first_layer,
            self.end_layer,
            self.group
        )
    }
}

/// A member's answer to a [`GroupOrder`]. Limit:
/// [`crate::limits::MAX_CONTROL_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupAnswer {
    /// Schema version.
    pub v: u16,
    /// The member that answers.
    pub worker: WorkerId,
    /// The group and epoch answered.
    pub group: String,
    /// See [`GroupAnswer::group`].
    pub epoch: u64,
    /// Whether it holds its layers and serves them (or, for a release,
    /// let them go).
    pub ready: bool,
    /// What it did, or why not, in words.
    pub detail: String,
    /// Bytes its layers' weights take.
    pub weight_bytes: u64,
}
