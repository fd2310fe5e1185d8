//! What a worker's slots, heartbeat, control and settlement code share: the
//! connections and the model cache, and the worker's state in parts with
//! one owner each. Parts whose state changes ([`Identity`]'s id,
//! [`Holds`], [`RunningTable`], the [`Scheduler`]) are changed only through
//! their methods; [`Settings`] are fixed at start. A file takes the part it
//! needs.

use std::sync::Arc;

use async_nats::jetstream;
use object_store::ObjectStore;
use tokio::sync::Semaphore;

use crate::beats::Beats;
use crate::holds::Holds;
use crate::identity::Identity;
use crate::model::ModelCache;
use crate::running::RunningTable;
use crate::schedule::Scheduler;
use crate::settings::Settings;

/// Everything a slot needs to run and settle a shard.
pub(crate) struct Ctx {
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) cache: ModelCache,
    /// One shard (or one shared generation run) computes on the device at
    /// a time.
    pub(crate) compute: Arc<Semaphore>,
    /// The generation run that shards of one model share.
    pub(crate) runs: crate::shared_run::SharedRuns,
    /// Embedding shards waiting for the device, packed into shared passes.
    pub(crate) packs: crate::pack::Packer,
    /// Who this worker is.
    pub(crate) identity: Identity,
    /// How it runs shards.
    pub(crate) settings: Settings,
    /// What keeps it from pulling.
    pub(crate) holds: Holds,
    /// The shards it runs.
    pub(crate) running: RunningTable,
    /// Asks the heartbeat loop for an early beat.
    pub(crate) beats: Arc<Beats>,
    /// What is queued, and which job a free slot pulls from.
    pub(crate) sched: Scheduler,
    /// The energy meter: each delivery's share, the heartbeat's power.
    pub(crate) energy: Arc<crate::energy::EnergyMeter>,
    /// Its part in a group, if any.
    pub(crate) groups: crate::group_part::Groups,
}

impl Ctx {
    /// Why running shard `job`/`shard` is being handed back, for its event.
    pub(crate) fn hand_back_reason(&self, job: &str, shard: u32) -> String {
        if self.running.take_preempted(job, shard) {
            "preempted: other work was waiting".to_owned()
        } else {
            self.holds
                .reason()
                .unwrap_or_else(|| "worker stopping".to_owned())
        }
    }
}
