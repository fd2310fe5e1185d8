//! Writing one batch of events to the ledger, once.
//!
//! The batch is applied in one transaction that first locks this events
//! stream's cursor row, skips the events at or before it (another watchdog,
//! or this one before a restart, applied them), applies the rest and moves
//! the cursor to the batch's last sequence. Two watchdogs racing take turns
//! on the row lock; whichever comes second finds the cursor moved and
//! writes only what is still new. Nothing is counted twice and, because a
//! writer that fails rereads the stream from the cursor, nothing is lost.

use std::collections::{BTreeMap, HashMap};

use minions_schemas::messages::{JobSpec, ShardEvent};
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use super::LedgerError;
use super::plan::{AttemptRow, Plan, split_hours};

/// What a batch write did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    /// Events applied by this write.
    pub(crate) applied: usize,
    /// Events skipped: already applied.
    pub(crate) skipped: usize,
    /// The cursor after the write.
    pub(crate) cursor: u64,
}

/// Seconds since the epoch, as `to_timestamp` takes them.
fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The cursor of `stream`, created at 0 when the ledger has none.
pub(crate) async fn cursor(client: &Client, stream: &str) -> Result<u64, LedgerError> {
    client
        .execute(
            "INSERT INTO ledger_cursor (stream, seq) VALUES ($1, 0) ON CONFLICT (stream) DO NOTHING",
            &[&stream],
        )
        .await?;
    let row = client
        .query_one(
            "SELECT seq FROM ledger_cursor WHERE stream = $1",
            &[&stream],
        )
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
}

/// Moves the cursor forward to `seq` unless it is past it already (events
/// that left the stream before the ledger read them are skipped this way).
pub(crate) async fn advance(client: &Client, stream: &str, seq: u64) -> Result<(), LedgerError> {
    client
        .execute(
            "UPDATE ledger_cursor SET seq = $2, updated = now() WHERE stream = $1 AND seq < $2",
            &[&stream, &big(seq)],
        )
        .await?;
    Ok(())
}

/// Per (worker, hour, job): device ms, records, tokens, measured and
/// estimated joules.
type Usage = BTreeMap<(String, u64, String), (i64, i64, i64, f64, f64)>;

/// Writes the stream sequences `first..=last`, whose valid events are
/// `events` (stream sequence, event; in stream order).
pub(crate) async fn batch(
    client: &mut Client,
    stream: &str,
    (first, last): (u64, u64),
    events: &[(u64, ShardEvent)],
    specs: &HashMap<String, Option<JobSpec>>,
) -> Result<Written, LedgerError> {
    let tx = client.transaction().await?;
    let row = tx
        .query_opt(
            "SELECT seq FROM ledger_cursor WHERE stream = $1 FOR UPDATE",
            &[&stream],
        )
        .await?;
    let cur = match row {
        Some(r) => u64::try_from(r.get::<_, i64>(0)).unwrap_or(0),
        None => {
            tx.execute(
                "INSERT INTO ledger_cursor (stream, seq) VALUES ($1, 0)",
                &[&stream],
            )
            .await?;
            0
        }
    };
    let fresh: Vec<&ShardEvent> = events
        .iter()
        .filter(|(s, _)| *s > cur)
        .map(|(_, e)| e)
        .collect();
    let skipped = events.len() - fresh.len();
    if last <= cur {
        tx.commit().await?;
        return Ok(Written {
            applied: 0,
            skipped,
            cursor: cur,
        });
    }
    if first > cur + 1 {
        return Err(LedgerError::Gap {
            cursor: cur,
            next: first,
        });
    }
    let plan = Plan::fold(fresh.iter().copied());
    apply(&tx, &plan, specs).await?;
    tx.execute(
        "UPDATE ledger_cursor SET seq = $2, updated = now() WHERE stream = $1",
        &[&stream, &big(last)],
    )
    .await?;
    tx.commit().await?;
    Ok(Written {
        applied: fresh.len(),
        skipped,
        cursor: last,
    })
}

/// Per job: shards done and failed (may go down: a failed shard retried and
/// done), records, tokens, device ms.
#[derive(Default)]
struct JobDelta {
    done: i64,
    failed: i64,
    records: i64,
    tokens: i64,
    busy_ms: i64,
}

async fn apply(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
    specs: &HashMap<String, Option<JobSpec>>,
) -> Result<(), LedgerError> {
    for (job, seen) in &plan.jobs {
        insert_job(
            tx,
            job,
            specs.get(job).and_then(|s| s.as_ref()),
            seen.last_ms,
        )
        .await?;
    }
    for (worker, (host, first, last)) in &plan.workers {
        tx.execute(
            "INSERT INTO workers (worker, host, first_seen, last_seen)
             VALUES ($1, $2, to_timestamp($3::float8), to_timestamp($4::float8))
             ON CONFLICT (worker) DO UPDATE SET
               first_seen = LEAST(workers.first_seen, EXCLUDED.first_seen),
               last_seen = GREATEST(workers.last_seen, EXCLUDED.last_seen)",
            &[worker, host, &secs(*first), &secs(*last)],
        )
        .await?;
    }
    for (job, shard, attempt) in &plan.redelivered {
        tx.execute(
            "UPDATE attempts SET outcome = 'failed',
               reason = 'no end reported: its worker was lost and the shard was delivered again'
             WHERE job = $1 AND shard = $2 AND attempt < $3 AND outcome = 'running'",
            &[job, &i64::from(*shard), &big(*attempt)],
        )
        .await?;
    }
    let mut jobs: BTreeMap<&str, JobDelta> = BTreeMap::new();
    let mut usage = Usage::new();
    for (key, row) in &plan.attempts {
        let (busy, ended) = upsert_attempt(tx, key, row).await?;
        if !row.ended() {
            continue;
        }
        let busy = busy.unwrap_or(0);
        jobs.entry(key.job.as_str()).or_default().busy_ms += busy;
        add_usage(&mut usage, &key.worker, &key.job, row, busy, ended);
    }
    for end in &plan.shard_ends {
        let d = jobs.entry(end.job.as_str()).or_default();
        let shard = i64::from(end.shard);
        if end.outcome == "done" {
            let r = tx
                .query_opt(
                    "INSERT INTO shards (job, shard, outcome, attempts, worker, host, finished, busy_ms)
                     SELECT $1, $2, 'done', count(*), $3, $4, to_timestamp($5::float8), COALESCE(sum(busy_ms), 0)::bigint
                       FROM attempts WHERE job = $1 AND shard = $2
                     ON CONFLICT (job, shard) DO UPDATE SET
                       outcome = 'done', attempts = EXCLUDED.attempts, worker = EXCLUDED.worker,
                       host = EXCLUDED.host, finished = EXCLUDED.finished,
                       busy_ms = EXCLUDED.busy_ms, reason = NULL
                     WHERE shards.outcome = 'failed'
                     RETURNING (xmax = 0)",
                    &[&end.job, &shard, &end.worker, &end.host, &secs(end.at_ms)],
                )
                .await?;
            match r.map(|r| r.get::<_, bool>(0)) {
                Some(true) => d.done += 1,
                Some(false) => {
                    d.done += 1;
                    d.failed -= 1;
                }
                None => continue,
            }
            d.records += big(end.records);
            d.tokens += big(end.tokens);
        } else {
            let r = tx
                .query_opt(
                    "INSERT INTO shards (job, shard, outcome, attempts, worker, host, finished, busy_ms, reason)
                     SELECT $1, $2, 'failed', count(*), $3, $4, to_timestamp($5::float8), COALESCE(sum(busy_ms), 0)::bigint, $6
                       FROM attempts WHERE job = $1 AND shard = $2
                     ON CONFLICT (job, shard) DO NOTHING
                     RETURNING 1",
                    &[&end.job, &shard, &end.worker, &end.host, &secs(end.at_ms), &end.reason],
                )
                .await?;
            if r.is_some() {
                d.failed += 1;
            }
        }
    }
    for (job, seen) in &plan.jobs {
        let d = jobs.remove(job.as_str()).unwrap_or_default();
        let first: Option<f64> = seen.first_start_ms.map(secs);
        tx.execute(
            "UPDATE jobs SET
               shards_done = shards_done + $2, shards_failed = shards_failed + $3,
               records_done = records_done + $4, tokens = tokens + $5, busy_ms = busy_ms + $6,
               started = LEAST(started, to_timestamp($7::float8))
             WHERE job = $1",
            &[
                job, &d.done, &d.failed, &d.records, &d.tokens, &d.busy_ms, &first,
            ],
        )
        .await?;
        tx.execute(
            "UPDATE jobs SET
               state = CASE
                 WHEN state = 'cancelled' THEN 'cancelled'
                 WHEN shards > 0 AND shards_done + shards_failed >= shards
                   THEN CASE WHEN shards_failed > 0 THEN 'failed' ELSE 'done' END
                 WHEN started IS NOT NULL THEN 'running'
                 ELSE 'queued' END,
               finished = CASE
                 WHEN state = 'cancelled' THEN finished
                 WHEN shards > 0 AND shards_done + shards_failed >= shards
                   THEN COALESCE(CASE WHEN $3 THEN NULL ELSE finished END, to_timestamp($2::float8))
                 ELSE NULL END
             WHERE job = $1",
            &[job, &secs(seen.last_ms), &seen.requeued],
        )
        .await?;
    }
    for ((worker, hour, job), (busy, records, tokens, measured, estimated)) in &usage {
        let hour = secs(*hour);
        tx.execute(
            "INSERT INTO usage_hourly (worker, hour, job, busy_ms, records, tokens, energy_measured_j, energy_estimated_j)
             VALUES ($1, to_timestamp($2::float8), $3, $4, $5, $6, $7, $8)
             ON CONFLICT (worker, hour, job) DO UPDATE SET
               busy_ms = usage_hourly.busy_ms + EXCLUDED.busy_ms,
               records = usage_hourly.records + EXCLUDED.records,
               tokens = usage_hourly.tokens + EXCLUDED.tokens,
               energy_measured_j = usage_hourly.energy_measured_j + EXCLUDED.energy_measured_j,
               energy_estimated_j = usage_hourly.energy_estimated_j + EXCLUDED.energy_estimated_j",
            &[worker, &hour, job, busy, records, tokens, measured, estimated],
        )
        .await?;
    }
    Ok(())
}

/// A job's row, from its spec; a job whose spec cannot be read gets a row
/// that says so (its shards are counted all the same).
async fn insert_job(
    tx: &tokio_postgres::Transaction<'_>,
    job: &str,
    spec: Option<&JobSpec>,
    at_ms: u64,
) -> Result<(), LedgerError> {
    let unknown = "(spec not readable)".to_owned();
    let (team, submitter, model, hash, family, precision, priority, shards, records, submitted) =
        match spec {
            Some(s) => (
                s.team.clone(),
                s.submitter.clone(),
                s.model_name.as_str().to_owned(),
                s.model_hash.as_str().to_owned(),
                s.family.to_string(),
                s.precision.to_string(),
                s.priority.to_string(),
                i64::from(s.shards),
                big(s.records),
                secs(s.created_ms),
            ),
            None => (
                unknown.clone(),
                String::new(),
                unknown.clone(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                0,
                0,
                secs(at_ms),
            ),
        };
    let params: [&(dyn ToSql + Sync); 11] = [
        &job, &team, &submitter, &model, &hash, &family, &precision, &priority, &shards, &records,
        &submitted,
    ];
    tx.execute(
        "INSERT INTO jobs (job, team, submitter, model, model_hash, family, precision, priority,
                           shards, records, submitted, state)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, to_timestamp($11::float8), 'queued')
         ON CONFLICT (job) DO NOTHING",
        &params,
    )
    .await?;
    Ok(())
}

/// Writes what the batch says about one delivery; returns its device ms
/// (when known) and end (ms since the epoch).
async fn upsert_attempt(
    tx: &tokio_postgres::Transaction<'_>,
    key: &super::plan::AttemptKey,
    row: &AttemptRow,
) -> Result<(Option<i64>, Option<u64>), LedgerError> {
    let busy = row.busy_ms.or(match (row.started_ms, row.ended_ms) {
        (Some(s), Some(e)) => Some(e.saturating_sub(s)),
        _ => None,
    });
    let outcome = row.outcome.unwrap_or("running");
    let energy = row.energy.as_ref().map(|e| e.joules);
    let measured = row.energy.as_ref().map(|e| e.measured);
    let params: [&(dyn ToSql + Sync); 15] = [
        &key.job,
        &i64::from(key.shard),
        &big(key.attempt),
        &key.worker,
        &row.host,
        &row.started_ms.map(secs),
        &row.ended_ms.map(secs),
        &busy.map(big),
        &row.compute_ms.map(big),
        &outcome,
        &row.reason,
        &big(row.records),
        &big(row.tokens),
        &energy,
        &measured,
    ];
    let r = tx
        .query_one(
            "INSERT INTO attempts (job, shard, attempt, worker, host, started, ended, busy_ms,
                                   compute_ms, outcome, reason, records, tokens, energy_j, energy_measured)
             VALUES ($1, $2, $3, $4, $5, to_timestamp($6::float8), to_timestamp($7::float8), $8,
                     $9, $10, $11, $12, $13, $14, $15)
             ON CONFLICT (job, shard, attempt, worker) DO UPDATE SET
               started = COALESCE(EXCLUDED.started, attempts.started),
               ended = COALESCE(EXCLUDED.ended, attempts.ended),
               busy_ms = COALESCE(EXCLUDED.busy_ms, attempts.busy_ms,
                 CASE WHEN EXCLUDED.ended IS NOT NULL AND attempts.started IS NOT NULL
                   THEN GREATEST(0, (EXTRACT(EPOCH FROM (EXCLUDED.ended - attempts.started)) * 1000)::bigint)
                 END),
               compute_ms = COALESCE(EXCLUDED.compute_ms, attempts.compute_ms),
               outcome = CASE WHEN EXCLUDED.outcome = 'running' THEN attempts.outcome ELSE EXCLUDED.outcome END,
               reason = COALESCE(EXCLUDED.reason, attempts.reason),
               records = GREATEST(EXCLUDED.records, attempts.records),
               tokens = GREATEST(EXCLUDED.tokens, attempts.tokens),
               energy_j = COALESCE(EXCLUDED.energy_j, attempts.energy_j),
               energy_measured = COALESCE(EXCLUDED.energy_measured, attempts.energy_measured)
             RETURNING busy_ms, (EXTRACT(EPOCH FROM ended) * 1000)::bigint",
            &params,
        )
        .await?;
    let ended = r
        .get::<_, Option<i64>>(1)
        .and_then(|e| u64::try_from(e).ok());
    Ok((r.get::<_, Option<i64>>(0), ended))
}

/// Adds a finished delivery to the hours it spans: device time and energy
/// split by the time in each hour; records and tokens to the hour it ended.
fn add_usage(
    usage: &mut Usage,
    worker: &str,
    job: &str,
    row: &AttemptRow,
    busy: i64,
    ended: Option<u64>,
) {
    let Some(end) = ended.or(row.ended_ms) else {
        return;
    };
    let busy_u = u64::try_from(busy).unwrap_or(0);
    let parts = split_hours(end.saturating_sub(busy_u), end);
    let joules = row.energy.as_ref().map_or(0.0, |e| e.joules);
    let measured = row.energy.as_ref().is_some_and(|e| e.measured);
    let n = parts.len();
    for (i, (hour, ms)) in parts.into_iter().enumerate() {
        let share = if busy_u == 0 {
            if i + 1 == n { 1.0 } else { 0.0 }
        } else {
            ms as f64 / busy_u as f64
        };
        let u = usage
            .entry((worker.to_owned(), hour, job.to_owned()))
            .or_default();
        u.0 += big(ms);
        if i + 1 == n {
            u.1 += big(row.records);
            u.2 += big(row.tokens);
        }
        if measured {
            u.3 += joules * share;
        } else {
            u.4 += joules * share;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::Energy;

    #[test]
    fn usage_splits_device_time_and_energy_by_hour() {
        const H: u64 = 3_600_000;
        let row = AttemptRow {
            records: 7,
            tokens: 9,
            energy: Some(Energy {
                joules: 30.0,
                measured: true,
                source: "rapl".into(),
            }),
            ..Default::default()
        };
        let mut u = Usage::new();
        add_usage(&mut u, "w", "j", &row, 3_000, Some(H + 2_000));
        let first = u.get(&("w".to_owned(), 0, "j".to_owned())).copied();
        let second = u.get(&("w".to_owned(), H, "j".to_owned())).copied();
        assert_eq!(first.map(|x| (x.0, x.1)), Some((1_000, 0)));
        assert_eq!(second.map(|x| (x.0, x.1, x.2)), Some((2_000, 7, 9)));
        let e = first.map_or(0.0, |x| x.3) + second.map_or(0.0, |x| x.3);
        assert!((e - 30.0).abs() < 1e-9);
        assert_eq!(second.map(|x| x.4), Some(0.0));
    }
}
