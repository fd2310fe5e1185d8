//! Operator actions on record ([`minions_schemas::messages::OperatorAction`]):
//! put one in the actions stream before carrying it out, and read them back
//! for `minions audit`. An action that cannot be put on record is not
//! carried out.

use async_nats::jetstream;
use minions_schemas::messages::{ActionKind, OperatorAction};
use minions_schemas::{SCHEMA_VERSION, decode, encode, limits, streams, subjects};

/// Why an action could not be put on record, or read back.
#[derive(Debug, thiserror::Error)]
pub enum ActionsError {
    /// The record was not stored (a refused subject, no actions stream).
    #[error(
        "the {action} of {target} could not be put on record, so it was not done: {detail} (an older fleet: run `minions admin init` once to make the actions stream)"
    )]
    NotRecorded {
        /// What was asked.
        action: &'static str,
        /// On what.
        target: String,
        /// Why.
        detail: String,
    },
    /// The record does not encode.
    #[error("an action record does not encode: {0}")]
    Encode(String),
    /// The stream could not be read.
    #[error("reading the actions on record: {0}")]
    Read(String),
}

/// Puts on record that `by` (its NATS identity's name) asked `action` on
/// `target` from `via`, and waits until the stream has stored it.
pub async fn record(
    js: &jetstream::Context,
    by: &str,
    via: &str,
    action: ActionKind,
    target: &str,
    detail: &str,
) -> Result<OperatorAction, ActionsError> {
    let record = OperatorAction {
        v: SCHEMA_VERSION,
        at_ms: minions_schemas::time::now_ms(),
        by: by.to_owned(),
        via: via.to_owned(),
        action,
        target: target.to_owned(),
        detail: detail.to_owned(),
    };
    let payload =
        encode("operator action", &record).map_err(|e| ActionsError::Encode(e.to_string()))?;
    let not_recorded = |detail: String| ActionsError::NotRecorded {
        action: action.as_str(),
        target: target.to_owned(),
        detail,
    };
    let ack = js
        .publish(subjects::action(by), payload.into())
        .await
        .map_err(|e| not_recorded(e.to_string()))?;
    ack.await.map_err(|e| not_recorded(e.to_string()))?;
    Ok(record)
}

/// The actions on record since `since_ms` (ms since the epoch), oldest
/// first; records that do not decode are skipped.
pub async fn since(
    js: &jetstream::Context,
    since_ms: u64,
) -> Result<Vec<OperatorAction>, ActionsError> {
    let messages = crate::snapshot::read(
        js,
        streams::ACTIONS_STREAM,
        subjects::ACTION_SUBJECTS,
        false,
    )
    .await
    .map_err(|e| ActionsError::Read(e.to_string()))?;
    Ok(messages
        .iter()
        .filter_map(|m| {
            let a: OperatorAction =
                decode("operator action", &m.payload, limits::MAX_EVENT_BYTES).ok()?;
            // Only what its actor may have said: the server let each
            // identity publish under its own name (a watchdog, for the
            // dashboard's users, under theirs).
            (m.subject.as_str() == subjects::action(&a.by)).then_some(a)
        })
        .filter(|a| a.at_ms >= since_ms)
        .collect())
}

/// What [`after`] read: the valid actions with their stream sequences, and
/// the last sequence read (past records that did not decode too), 0 when
/// nothing was read.
#[derive(Debug, Default)]
pub struct ReadAfter {
    /// The actions, oldest first.
    pub actions: Vec<(u64, OperatorAction)>,
    /// The last stream sequence read.
    pub last: u64,
}

/// At most `max` actions on record after stream sequence `after`, oldest
/// first, for readers that keep their place (the ledger, the dashboard).
pub async fn after(
    js: &jetstream::Context,
    after: u64,
    max: usize,
) -> Result<ReadAfter, ActionsError> {
    let messages = crate::snapshot::read_after(
        js,
        streams::ACTIONS_STREAM,
        subjects::ACTION_SUBJECTS,
        after,
        max,
    )
    .await
    .map_err(|e| ActionsError::Read(e.to_string()))?;
    let last = messages.last().map_or(0, |(seq, _)| *seq);
    let actions = messages
        .iter()
        .filter_map(|(seq, m)| {
            let a: OperatorAction =
                decode("operator action", &m.payload, limits::MAX_EVENT_BYTES).ok()?;
            (m.subject.as_str() == subjects::action(&a.by)).then_some((*seq, a))
        })
        .collect();
    Ok(ReadAfter { actions, last })
}
