//! Operator actions: copied from the actions stream into the `actions`
//! table now and then (they are few). Each row is keyed by its stream
//! message, and the copy's cursor moves in the same transaction, so a
//! second watchdog or a restart copies nothing twice; a fleet without an
//! actions stream has nothing to copy.

use async_nats::jetstream;
use minions_schemas::streams;
use tokio_postgres::Client;

use super::LedgerError;
use super::write;

/// The most actions copied in one call (the rest on the next).
const MAX_PER_COPY: usize = 1000;

/// Copies the actions on record after the ledger's cursor; returns how
/// many rows it added.
pub(crate) async fn copy(client: &mut Client, js: &jetstream::Context) -> Result<u64, LedgerError> {
    let Ok(mut stream) = js.get_stream(streams::ACTIONS_STREAM).await else {
        return Ok(0);
    };
    let info = stream.info().await.map_err(super::follow_err)?;
    let key = format!("{}@{}", streams::ACTIONS_STREAM, info.created);
    let cursor = write::cursor(client, &key).await?;
    if info.state.last_sequence <= cursor {
        return Ok(0);
    }
    let read = minions_endpoints::actions::after(js, cursor, MAX_PER_COPY)
        .await
        .map_err(super::follow_err)?;
    if read.last <= cursor {
        return Ok(0);
    }
    let tx = client.transaction().await?;
    let mut added = 0;
    for (seq, a) in &read.actions {
        added += tx
            .execute(
                "INSERT INTO actions (stream, seq, at, actor, via, action, target, detail)
                 VALUES ($1, $2, to_timestamp($3), $4, $5, $6, $7, $8)
                 ON CONFLICT (stream, seq) DO NOTHING",
                &[
                    &key,
                    &i64::try_from(*seq).unwrap_or(i64::MAX),
                    &(a.at_ms as f64 / 1000.0),
                    &a.by,
                    &a.via,
                    &a.action.as_str(),
                    &a.target,
                    &a.detail,
                ],
            )
            .await?;
    }
    tx.execute(
        "UPDATE ledger_cursor SET seq = $2, updated = now() WHERE stream = $1 AND seq < $2",
        &[&key, &i64::try_from(read.last).unwrap_or(i64::MAX)],
    )
    .await?;
    tx.commit().await?;
    Ok(added)
}
