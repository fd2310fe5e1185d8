//! What heartbeats say of each worker: its device, the memory it lends and
//! where its energy figures come from, written to the ledger's `workers`
//! rows now and then. Idempotent: first seen only moves earlier, last seen
//! only later, the rest is the newest beat's.

use minions_schemas::messages::Heartbeat;
use tokio_postgres::Client;

use super::LedgerError;
use crate::view::View;

/// The memory a worker lends to models: what it says it schedules by,
/// else (older workers) its owner's cap when there is one, else the
/// machine's memory.
fn memory_lent_mb(b: &Heartbeat) -> i64 {
    let mb = if b.lend_mb > 0 {
        b.lend_mb
    } else if b.mem_budget_mb > 0 {
        b.mem_budget_mb
    } else {
        b.mem_total_mb
    };
    i64::try_from(mb).unwrap_or(i64::MAX)
}

/// Upserts a row for every worker the watchdog knows.
pub(crate) async fn upsert(client: &Client, view: &View) -> Result<(), LedgerError> {
    let beats: Vec<Heartbeat> = view
        .registry()
        .iter()
        .map(|(_, t)| t.beat.clone())
        .collect();
    if beats.is_empty() {
        return Ok(());
    }
    let stmt = client
        .prepare(
            "INSERT INTO workers (worker, host, device, chip, memory_lent_mb, energy_source, first_seen, last_seen)
             VALUES ($1, $2, $3, $8, $4, $5, to_timestamp($6::float8), to_timestamp($7::float8))
             ON CONFLICT (worker) DO UPDATE SET
               host = EXCLUDED.host, device = EXCLUDED.device, chip = EXCLUDED.chip,
               memory_lent_mb = EXCLUDED.memory_lent_mb,
               energy_source = CASE WHEN EXCLUDED.energy_source = '' THEN workers.energy_source
                                    ELSE EXCLUDED.energy_source END,
               first_seen = LEAST(workers.first_seen, EXCLUDED.first_seen),
               last_seen = GREATEST(workers.last_seen, EXCLUDED.last_seen)",
        )
        .await?;
    for b in &beats {
        let source = b.power.as_ref().map_or("", |p| p.source.as_str());
        client
            .execute(
                &stmt,
                &[
                    &b.worker.as_str(),
                    &b.host,
                    &b.device,
                    &memory_lent_mb(b),
                    &source,
                    &(b.started_ms as f64 / 1000.0),
                    &(b.at_ms as f64 / 1000.0),
                    &b.chip,
                ],
            )
            .await?;
    }
    Ok(())
}
