//! Who this worker is: its id (replaced when it rejoins after being
//! declared dead), its name, host, device and chip, and the build, device
//! and kernel path its outputs record. Only the id changes, through
//! [`Identity::set_worker_id`]; the rest is fixed at start.

use std::sync::RwLock;

use minions_endpoints::host;
use minions_schemas::WorkerId;
use minions_schemas::messages::Provenance;

/// This worker's identity.
pub(crate) struct Identity {
    worker: RwLock<WorkerId>,
    /// The name new ids are made from (`--name`, else the host's).
    pub(crate) name: String,
    /// The host name.
    pub(crate) host: String,
    /// The device shards run on, as heartbeats show it (`cpu`, `cuda:0`).
    pub(crate) device: String,
    /// The chip that runs shards, for the record (empty when unknown).
    pub(crate) chip: String,
    /// The build, device and kernel path this worker's outputs record.
    pub(crate) made_by: Provenance,
}

impl Identity {
    /// An identity starting as `worker`.
    pub(crate) fn new(
        worker: WorkerId,
        name: String,
        host: String,
        device: String,
        chip: String,
        made_by: Provenance,
    ) -> Self {
        Self {
            worker: RwLock::new(worker),
            name,
            host,
            device,
            chip,
            made_by,
        }
    }

    /// The current worker id.
    pub(crate) fn worker_id(&self) -> WorkerId {
        self.worker
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the worker id (rejoining under a new one).
    pub(crate) fn set_worker_id(&self, id: WorkerId) {
        *self.worker.write().unwrap_or_else(|p| p.into_inner()) = id;
    }
}

/// A fresh worker id: the (sanitised) prefix and a random suffix. A worker
/// gets a new one on every start and whenever it rejoins after being
/// declared dead.
pub(crate) fn new_worker_id(prefix: &str) -> WorkerId {
    let base = host::id_prefix(prefix, "worker");
    let suffix = ulid::Ulid::new().to_string().to_lowercase();
    let id = format!("{base}-{}", &suffix[suffix.len() - 8..]);
    WorkerId::new(id)
        .unwrap_or_else(|_| WorkerId::new("worker-x").unwrap_or_else(|_| unreachable!()))
}
