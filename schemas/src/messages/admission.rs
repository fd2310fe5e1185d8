//! Admission: a producer asks a watchdog to admit a job it has written
//! (spec and inputs in the store), on a subject whose tokens name the
//! job's team, priority and submitter
//! ([`crate::subjects::submit`]). The NATS server lets an identity made by
//! `minions admin add-producer` publish only on its own teams, priorities
//! and name, so a watchdog that admits a job on that subject knows them
//! from the server, not from what the producer wrote; it checks the spec
//! agrees and makes the job's consumers (the identity may not).

use serde::{Deserialize, Serialize};

use crate::ids::JobId;

/// A producer's request, on [`crate::subjects::submit`], that a watchdog
/// admit `job`. Limit: [`crate::limits::MAX_ADMISSION_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitClaim {
    /// Schema version.
    pub v: u16,
    /// The job, whose spec is in the store.
    pub job: JobId,
}

/// A watchdog's reply to a [`SubmitClaim`]: admitted (its consumers
/// exist), or refused and why. Limit: [`crate::limits::MAX_ADMISSION_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// Schema version.
    pub v: u16,
    /// Whether the job was admitted.
    pub admitted: bool,
    /// Why not, in words (empty when admitted).
    pub detail: String,
    /// The watchdog that answered.
    pub by: String,
}
