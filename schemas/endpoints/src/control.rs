//! Operating workers and machines, for the CLI and the dashboard alike:
//! ask one worker to drain, evict itself or resume ([`ask`]), and release
//! a quarantined machine ([`release`]). Each puts the action on record
//! first ([`crate::actions::record`]); an action that cannot be recorded
//! is not done.

use std::time::Duration;

use async_nats::jetstream;
use minions_schemas::messages::{ActionKind, Control, ControlCommand, ControlReply, Quarantine};
use minions_schemas::{SCHEMA_VERSION, WorkerId, decode, encode, limits, streams, subjects};

use crate::actions::{self, ActionsError};

/// How long a worker has to answer a control request.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Who asks, and from where (`cli`, `dashboard`).
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// The name the action is on record under.
    pub by: &'a str,
    /// From where.
    pub via: &'a str,
}

/// Why a control request or a release did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Not on record, so not done.
    #[error(transparent)]
    NotRecorded(#[from] ActionsError),
    /// The request does not encode, or the answer does not decode.
    #[error("{0}")]
    Wire(String),
    /// The worker did not answer.
    #[error("worker {worker} did not answer: {reason} (is it running? see `minions worker list`)")]
    NoAnswer {
        /// The worker.
        worker: String,
        /// Why.
        reason: String,
    },
    /// The machine is not quarantined.
    #[error("machine {0} is not quarantined ({1})")]
    NotQuarantined(String, &'static str),
    /// The quarantine records could not be read or written.
    #[error("the quarantine record of {machine}: {reason}")]
    Quarantine {
        /// The machine.
        machine: String,
        /// Why.
        reason: String,
    },
}

/// The action a control command puts on record (none for `rejoin`, which a
/// worker asks of itself).
pub fn action_of(command: ControlCommand) -> Option<ActionKind> {
    match command {
        ControlCommand::Drain => Some(ActionKind::Drain),
        ControlCommand::Evict => Some(ActionKind::Evict),
        ControlCommand::Resume => Some(ActionKind::Resume),
        ControlCommand::Rejoin => None,
    }
}

/// Puts `command` on record as `actor`'s, sends it to worker `id` and
/// returns its answer.
pub async fn ask(
    client: &async_nats::Client,
    js: &jetstream::Context,
    actor: Actor<'_>,
    id: &WorkerId,
    command: ControlCommand,
) -> Result<ControlReply, ControlError> {
    if let Some(action) = action_of(command) {
        actions::record(js, actor.by, actor.via, action, id.as_str(), "").await?;
    }
    let c = Control {
        v: SCHEMA_VERSION,
        command,
        by: actor.by.to_owned(),
    };
    let payload = encode("control", &c).map_err(|e| ControlError::Wire(e.to_string()))?;
    let no_answer = |reason: String| ControlError::NoAnswer {
        worker: id.as_str().to_owned(),
        reason,
    };
    let reply = tokio::time::timeout(
        ANSWER_WITHIN,
        client.request(subjects::control(id), payload.into()),
    )
    .await
    .map_err(|_| no_answer(format!("no answer within {} s", ANSWER_WITHIN.as_secs())))?
    .map_err(|e| no_answer(e.to_string()))?;
    decode("control reply", &reply.payload, limits::MAX_CONTROL_BYTES)
        .map_err(|e| ControlError::Wire(e.to_string()))
}

/// What [`release`] did.
#[derive(Debug, Clone)]
pub struct Released {
    /// The machine's name as its record has it.
    pub machine: String,
    /// Strikes against it so far.
    pub strikes: u32,
    /// Why it had been quarantined.
    pub was: String,
}

/// Releases quarantined `machine` (a machine name, or a worker id on it):
/// puts it on record as `actor`'s, then writes the record that lets its
/// workers pull again.
pub async fn release(
    js: &jetstream::Context,
    actor: Actor<'_>,
    machine: &str,
) -> Result<Released, ControlError> {
    let quarantine = |machine: &str, e: &dyn std::fmt::Display| ControlError::Quarantine {
        machine: machine.to_owned(),
        reason: e.to_string(),
    };
    // Read as it is (made by the watchdog with the work stream's replica
    // count); none yet: nothing was ever quarantined.
    let Ok(kv) = js.get_key_value(streams::QUARANTINE_BUCKET).await else {
        return Err(ControlError::NotQuarantined(
            machine.to_owned(),
            "no machine ever was on this fleet",
        ));
    };
    let mut name = machine.to_owned();
    let mut entry = kv.get(&name).await.map_err(|e| quarantine(&name, &e))?;
    if entry.is_none()
        && let Ok(id) = WorkerId::new(machine)
    {
        name = subjects::machine(&id).to_owned();
        entry = kv.get(&name).await.map_err(|e| quarantine(&name, &e))?;
    }
    let Some(bytes) = entry else {
        return Err(ControlError::NotQuarantined(
            machine.to_owned(),
            "no record; see `minions worker list`",
        ));
    };
    let old: Quarantine = decode("quarantine record", &bytes, limits::MAX_QUARANTINE_BYTES)
        .map_err(|e| quarantine(&name, &e))?;
    if !old.quarantined {
        return Err(ControlError::NotQuarantined(name, "released before"));
    }
    actions::record(
        js,
        actor.by,
        actor.via,
        ActionKind::Release,
        &name,
        &format!("was: {}", old.reason),
    )
    .await?;
    let new = Quarantine {
        v: SCHEMA_VERSION,
        machine: name.clone(),
        quarantined: false,
        strikes: old.strikes,
        reason: format!("released by {} (was: {})", actor.by, old.reason),
        by: actor.by.to_owned(),
        at_ms: minions_schemas::time::now_ms(),
    };
    let bytes = encode("quarantine record", &new).map_err(|e| quarantine(&name, &e))?;
    kv.put(&name, bytes.into())
        .await
        .map_err(|e| quarantine(&name, &e))?;
    Ok(Released {
        machine: name,
        strikes: old.strikes,
        was: old.reason,
    })
}
