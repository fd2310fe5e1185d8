//! Asking the watchdogs to admit a job ([`minions_schemas::messages::SubmitClaim`]):
//! the producer's side. The claim goes on a subject naming the job's team,
//! priority and submitter; a producer identity's server entry allows only
//! its own, so the server refuses any other, and this says so in words.

use std::time::Duration;

use minions_schemas::messages::{Admission, JobSpec, SubmitClaim};
use minions_schemas::{SCHEMA_VERSION, decode, encode, limits, subjects};

use crate::nats::Asked;

/// How long a claim waits for a watchdog's answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// How a claim came out, when nothing refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// A watchdog admitted the job and made its consumers.
    ByWatchdog {
        /// Which watchdog.
        by: String,
    },
    /// No watchdog listens (or none answered in time): the submitter makes
    /// the job's consumer itself, as far as its identity may.
    NoWatchdog,
}

/// Why a job was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The NATS server refused the claim's subject to this identity.
    #[error(
        "the NATS server refused identity {identity:?} to submit for team {team:?} at priority {priority}: its grants (the server config entry `minions admin add-producer` wrote) name other teams or a lower priority; nothing was queued"
    )]
    NotAllowed {
        /// Who asked.
        identity: String,
        /// The team asked for.
        team: String,
        /// The priority asked for.
        priority: String,
    },
    /// A watchdog refused the job.
    #[error("watchdog {by} refused job {job}: {detail}; nothing was queued")]
    Refused {
        /// The job.
        job: String,
        /// Why.
        detail: String,
        /// The watchdog.
        by: String,
    },
    /// The claim could not be sent or its answer read.
    #[error("asking the watchdogs to admit job {job}: {detail}")]
    Ask {
        /// The job.
        job: String,
        /// What went wrong.
        detail: String,
    },
}

/// Asks the watchdogs to admit `spec`'s job (written to the store already),
/// as `spec.submitter` for `spec.team` at `spec.priority`.
pub async fn ask(client: &async_nats::Client, spec: &JobSpec) -> Result<Admitted, AdmissionError> {
    let subject = subjects::submit(&spec.team, spec.priority, &spec.submitter);
    let ask_err = |detail: String| AdmissionError::Ask {
        job: spec.job.to_string(),
        detail,
    };
    let claim = SubmitClaim {
        v: SCHEMA_VERSION,
        job: spec.job.clone(),
    };
    let payload = encode("submit claim", &claim).map_err(|e| ask_err(e.to_string()))?;
    let reply =
        match crate::nats::request_watched(client, subject, payload.into(), ANSWER_WITHIN).await {
            Asked::Answer(reply) => reply,
            Asked::Refused => {
                return Err(AdmissionError::NotAllowed {
                    identity: spec.submitter.clone(),
                    team: spec.team.clone(),
                    priority: spec.priority.to_string(),
                });
            }
            Asked::NoResponders => return Ok(Admitted::NoWatchdog),
            Asked::TimedOut => {
                tracing::warn!(job = %spec.job, within_s = ANSWER_WITHIN.as_secs(),
                "no watchdog answered the submit claim in time; making the job's consumer here");
                return Ok(Admitted::NoWatchdog);
            }
            Asked::Failed(e) => return Err(ask_err(e)),
        };
    let admission: Admission = decode("admission", &reply.payload, limits::MAX_ADMISSION_BYTES)
        .map_err(|e| ask_err(e.to_string()))?;
    if admission.admitted {
        Ok(Admitted::ByWatchdog { by: admission.by })
    } else {
        Err(AdmissionError::Refused {
            job: spec.job.to_string(),
            detail: admission.detail,
            by: admission.by,
        })
    }
}
