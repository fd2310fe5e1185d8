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
use super::plan::{AttemptKey, AttemptRow, Plan, ShardEnd, split_hours};

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

/// What one (worker, hour, job) row of `usage_hourly` gains from a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct HourUsage {
    /// Device-busy time, ms (split across the hours a delivery spanned).
    busy_ms: i64,
    /// Records (in the hour the delivery ended).
    records: i64,
    /// Tokens generated (in the hour the delivery ended).
    tokens: i64,
    /// Audio transcribed, ms (in the hour the delivery ended).
    audio_ms: i64,
    /// Energy read from meters, joules (split as the device time).
    measured_j: f64,
    /// Energy estimated, joules (split as the device time).
    estimated_j: f64,
}

/// Per (worker, hour, job), what the batch adds.
type Usage = BTreeMap<(String, u64, String), HourUsage>;

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
/// done), records, tokens, audio ms, device ms.
#[derive(Default)]
struct JobDelta {
    done: i64,
    failed: i64,
    records: i64,
    tokens: i64,
    audio_ms: i64,
    busy_ms: i64,
}

/// Applies a batch's plan with one statement per table and kind of change,
/// whatever the batch's size: each takes its rows as arrays (`unnest`), so
/// a batch of a thousand events costs about as many round trips as one.
async fn apply(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
    specs: &HashMap<String, Option<JobSpec>>,
) -> Result<(), LedgerError> {
    insert_jobs(tx, plan, specs).await?;
    upsert_workers(tx, plan).await?;
    mark_lost(tx, plan).await?;
    let ends = upsert_attempts(tx, plan).await?;
    let mut jobs: BTreeMap<&str, JobDelta> = BTreeMap::new();
    let mut usage = Usage::new();
    for (key, row) in plan.attempts.iter().filter(|(_, r)| r.ended()) {
        let (busy, ended) = ends.get(key).copied().unwrap_or((None, None));
        let busy = busy.unwrap_or(0);
        jobs.entry(key.job.as_str()).or_default().busy_ms += busy;
        add_usage(&mut usage, &key.worker, &key.job, row, busy, ended);
    }
    reject_results(tx, plan, &mut jobs).await?;
    finish_shards(tx, plan, &mut jobs).await?;
    update_jobs(tx, plan, jobs).await?;
    upsert_usage(tx, &usage).await?;
    Ok(())
}

/// The jobs' rows, from their specs; a job whose spec cannot be read gets a
/// row that says so (its shards are counted all the same).
async fn insert_jobs(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
    specs: &HashMap<String, Option<JobSpec>>,
) -> Result<(), LedgerError> {
    if plan.jobs.is_empty() {
        return Ok(());
    }
    let unknown = "(spec not readable)";
    let mut c = JobColumns::default();
    for (job, seen) in &plan.jobs {
        c.job.push(job.as_str());
        match specs.get(job).and_then(|s| s.as_ref()) {
            Some(s) => {
                c.team.push(s.team.clone());
                c.submitter.push(s.submitter.clone());
                c.model.push(s.model_name.as_str().to_owned());
                c.hash.push(s.model_hash.as_str().to_owned());
                c.family.push(s.family.to_string());
                c.precision.push(s.precision.to_string());
                c.priority.push(s.priority.to_string());
                c.shards.push(i64::from(s.shards));
                c.records.push(big(s.records));
                c.submitted.push(secs(s.created_ms));
            }
            None => {
                c.team.push(unknown.to_owned());
                c.submitter.push(String::new());
                c.model.push(unknown.to_owned());
                c.hash.push(String::new());
                c.family.push(String::new());
                c.precision.push(String::new());
                c.priority.push(String::new());
                c.shards.push(0);
                c.records.push(0);
                c.submitted.push(secs(seen.last_ms));
            }
        }
    }
    let params: [&(dyn ToSql + Sync); 11] = [
        &c.job,
        &c.team,
        &c.submitter,
        &c.model,
        &c.hash,
        &c.family,
        &c.precision,
        &c.priority,
        &c.shards,
        &c.records,
        &c.submitted,
    ];
    tx.execute(
        "INSERT INTO jobs (job, team, submitter, model, model_hash, family, precision, priority,
                           shards, records, submitted, state)
         SELECT job, team, submitter, model, model_hash, family, precision, priority,
                shards, records, to_timestamp(submitted), 'queued'
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                       $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::float8[])
             AS u(job, team, submitter, model, model_hash, family, precision, priority,
                  shards, records, submitted)
          WHERE true
         ON CONFLICT (job) DO NOTHING",
        &params,
    )
    .await?;
    Ok(())
}

/// Column arrays of the jobs' rows.
#[derive(Default)]
struct JobColumns<'a> {
    job: Vec<&'a str>,
    team: Vec<String>,
    submitter: Vec<String>,
    model: Vec<String>,
    hash: Vec<String>,
    family: Vec<String>,
    precision: Vec<String>,
    priority: Vec<String>,
    shards: Vec<i64>,
    records: Vec<i64>,
    submitted: Vec<f64>,
}

/// The workers the events name: first and last seen widen.
async fn upsert_workers(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
) -> Result<(), LedgerError> {
    if plan.workers.is_empty() {
        return Ok(());
    }
    let worker: Vec<&str> = plan.workers.keys().map(String::as_str).collect();
    let host: Vec<&str> = plan.workers.values().map(|w| w.0.as_str()).collect();
    let first: Vec<f64> = plan.workers.values().map(|w| secs(w.1)).collect();
    let last: Vec<f64> = plan.workers.values().map(|w| secs(w.2)).collect();
    tx.execute(
        "INSERT INTO workers (worker, host, first_seen, last_seen)
         SELECT worker, host, to_timestamp(f), to_timestamp(l)
           FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[]) AS u(worker, host, f, l)
          WHERE true
         ON CONFLICT (worker) DO UPDATE SET
           first_seen = LEAST(workers.first_seen, EXCLUDED.first_seen),
           last_seen = GREATEST(workers.last_seen, EXCLUDED.last_seen)",
        &[&worker, &host, &first, &last],
    )
    .await?;
    Ok(())
}

/// Earlier deliveries of shards delivered again that still say running:
/// their worker was lost.
async fn mark_lost(tx: &tokio_postgres::Transaction<'_>, plan: &Plan) -> Result<(), LedgerError> {
    if plan.redelivered.is_empty() {
        return Ok(());
    }
    let job: Vec<&str> = plan.redelivered.iter().map(|r| r.0.as_str()).collect();
    let shard: Vec<i64> = plan.redelivered.iter().map(|r| i64::from(r.1)).collect();
    let attempt: Vec<i64> = plan.redelivered.iter().map(|r| big(r.2)).collect();
    tx.execute(
        "UPDATE attempts SET outcome = 'failed',
           reason = 'no end reported: its worker was lost and the shard was delivered again'
          FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(job, shard, attempt)
         WHERE attempts.job = u.job AND attempts.shard = u.shard
           AND attempts.attempt < u.attempt AND attempts.outcome = 'running'",
        &[&job, &shard, &attempt],
    )
    .await?;
    Ok(())
}

/// Device ms (when known) and end (ms since the epoch) of each delivery
/// the batch names, as the ledger holds them after the batch.
type Ends = BTreeMap<AttemptKey, (Option<i64>, Option<u64>)>;

/// Writes what the batch says about each delivery.
async fn upsert_attempts(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
) -> Result<Ends, LedgerError> {
    let mut ends = Ends::new();
    if plan.attempts.is_empty() {
        return Ok(ends);
    }
    let n = plan.attempts.len();
    let mut job = Vec::with_capacity(n);
    let mut shard = Vec::with_capacity(n);
    let mut attempt = Vec::with_capacity(n);
    let mut worker = Vec::with_capacity(n);
    let mut host = Vec::with_capacity(n);
    let mut started = Vec::with_capacity(n);
    let mut ended = Vec::with_capacity(n);
    let mut busy = Vec::with_capacity(n);
    let mut compute = Vec::with_capacity(n);
    let mut outcome = Vec::with_capacity(n);
    let mut reason = Vec::with_capacity(n);
    let mut records = Vec::with_capacity(n);
    let mut tokens = Vec::with_capacity(n);
    let mut audio = Vec::with_capacity(n);
    let mut energy = Vec::with_capacity(n);
    let mut measured = Vec::with_capacity(n);
    for (key, row) in &plan.attempts {
        job.push(key.job.as_str());
        shard.push(i64::from(key.shard));
        attempt.push(big(key.attempt));
        worker.push(key.worker.as_str());
        host.push(row.host.as_str());
        started.push(row.started_ms.map(secs));
        ended.push(row.ended_ms.map(secs));
        let b = row.busy_ms.or(match (row.started_ms, row.ended_ms) {
            (Some(s), Some(e)) => Some(e.saturating_sub(s)),
            _ => None,
        });
        busy.push(b.map(big));
        compute.push(row.compute_ms.map(big));
        outcome.push(row.outcome.unwrap_or("running"));
        reason.push(row.reason.as_deref());
        records.push(big(row.records));
        tokens.push(big(row.tokens));
        audio.push(big(row.audio_ms));
        energy.push(row.energy.as_ref().map(|e| e.joules));
        measured.push(row.energy.as_ref().map(|e| e.measured));
    }
    let params: [&(dyn ToSql + Sync); 16] = [
        &job, &shard, &attempt, &worker, &host, &started, &ended, &busy, &compute, &outcome,
        &reason, &records, &tokens, &energy, &measured, &audio,
    ];
    let rows = tx
        .query(
            "INSERT INTO attempts (job, shard, attempt, worker, host, started, ended, busy_ms,
                                   compute_ms, outcome, reason, records, tokens, energy_j, energy_measured,
                                   audio_ms)
             SELECT job, shard, attempt, worker, host, to_timestamp(started), to_timestamp(ended), busy_ms,
                    compute_ms, outcome, reason, records, tokens, energy_j, energy_measured, audio_ms
               FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[],
                           $6::float8[], $7::float8[], $8::bigint[], $9::bigint[], $10::text[],
                           $11::text[], $12::bigint[], $13::bigint[], $14::float8[], $15::bool[],
                           $16::bigint[])
                 AS u(job, shard, attempt, worker, host, started, ended, busy_ms, compute_ms,
                      outcome, reason, records, tokens, energy_j, energy_measured, audio_ms)
              WHERE true
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
               audio_ms = GREATEST(EXCLUDED.audio_ms, attempts.audio_ms),
               energy_j = COALESCE(EXCLUDED.energy_j, attempts.energy_j),
               energy_measured = COALESCE(EXCLUDED.energy_measured, attempts.energy_measured)
             RETURNING job, shard, attempt, worker, busy_ms, (EXTRACT(EPOCH FROM ended) * 1000)::bigint",
            &params,
        )
        .await?;
    for r in rows {
        let key = AttemptKey {
            job: r.get(0),
            shard: u32::try_from(r.get::<_, i64>(1)).unwrap_or(u32::MAX),
            attempt: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            worker: r.get(3),
        };
        let end = r
            .get::<_, Option<i64>>(5)
            .and_then(|e| u64::try_from(e).ok());
        ends.insert(key, (r.get::<_, Option<i64>>(4), end));
    }
    Ok(ends)
}

/// One end per shard that decides what the batch does to its row, the
/// same as applying the ends one by one: a `done` row never changes, and a
/// `failed` row only becomes `done`; so the shard's first done end wins,
/// else its first failed end.
fn deciding_ends(plan: &Plan) -> BTreeMap<(&str, u32), &ShardEnd> {
    let mut pick: BTreeMap<(&str, u32), &ShardEnd> = BTreeMap::new();
    for end in &plan.shard_ends {
        let e = pick.entry((end.job.as_str(), end.shard)).or_insert(end);
        if e.outcome != "done" && end.outcome == "done" {
            *e = end;
        }
    }
    pick
}

/// Column arrays of shard ends: job, shard, worker, host, time (s).
struct EndColumns<'a> {
    job: Vec<&'a str>,
    shard: Vec<i64>,
    worker: Vec<&'a str>,
    host: Vec<&'a str>,
    at: Vec<f64>,
}

impl<'a> EndColumns<'a> {
    fn of(ends: &[&'a ShardEnd]) -> Self {
        Self {
            job: ends.iter().map(|e| e.job.as_str()).collect(),
            shard: ends.iter().map(|e| i64::from(e.shard)).collect(),
            worker: ends.iter().map(|e| e.worker.as_str()).collect(),
            host: ends.iter().map(|e| e.host.as_str()).collect(),
            at: ends.iter().map(|e| secs(e.at_ms)).collect(),
        }
    }
}

/// Results a watchdog rejected: their deliveries become `forged` (with
/// the reason), and a shard that such a result had made done is not done
/// any more (it runs again; its next done is written as any other), which
/// takes it off its job's counts. Before [`finish_shards`], so that the
/// rerun's done, when in the same batch, finds no row in its way.
async fn reject_results<'p>(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &'p Plan,
    jobs: &mut BTreeMap<&'p str, JobDelta>,
) -> Result<(), LedgerError> {
    if plan.rejected.is_empty() {
        return Ok(());
    }
    let job: Vec<&str> = plan.rejected.iter().map(|r| r.0.job.as_str()).collect();
    let shard: Vec<i64> = plan.rejected.iter().map(|r| i64::from(r.0.shard)).collect();
    let attempt: Vec<i64> = plan.rejected.iter().map(|r| big(r.0.attempt)).collect();
    let worker: Vec<&str> = plan.rejected.iter().map(|r| r.0.worker.as_str()).collect();
    let reason: Vec<&str> = plan.rejected.iter().map(|r| r.1.as_str()).collect();
    tx.execute(
        "UPDATE attempts SET outcome = 'forged', reason = u.reason
           FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[])
             AS u(job, shard, attempt, worker, reason)
          WHERE attempts.job = u.job AND attempts.shard = u.shard
            AND attempts.attempt = u.attempt AND attempts.worker = u.worker",
        &[&job, &shard, &attempt, &worker, &reason],
    )
    .await?;
    let rows = tx
        .query(
            "WITH gone AS (
               DELETE FROM shards USING unnest($1::text[], $2::bigint[], $3::text[])
                 AS u(job, shard, worker)
                WHERE shards.job = u.job AND shards.shard = u.shard
                  AND shards.worker = u.worker AND shards.outcome = 'done'
               RETURNING shards.job, shards.shard, shards.worker)
             SELECT g.job, COALESCE(max(a.records), 0), COALESCE(max(a.tokens), 0),
                    COALESCE(max(a.audio_ms), 0)
               FROM gone g LEFT JOIN attempts a
                 ON a.job = g.job AND a.shard = g.shard
                AND a.worker = g.worker AND a.outcome = 'forged'
              GROUP BY g.job, g.shard, g.worker",
            &[&job, &shard, &worker],
        )
        .await?;
    for r in rows {
        let name: String = r.get(0);
        let Some(key) = plan.rejected.iter().find(|k| k.0.job == name) else {
            continue;
        };
        let d = jobs.entry(key.0.job.as_str()).or_default();
        d.done -= 1;
        d.records -= r.get::<_, i64>(1);
        d.tokens -= r.get::<_, i64>(2);
        d.audio_ms -= r.get::<_, i64>(3);
    }
    Ok(())
}

/// The shards that finished: done ones (once; a failed one retried and
/// done becomes done) and failed ones; counts the changes per job.
async fn finish_shards<'p>(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &'p Plan,
    jobs: &mut BTreeMap<&'p str, JobDelta>,
) -> Result<(), LedgerError> {
    let pick = deciding_ends(plan);
    let (done, failed): (Vec<&ShardEnd>, Vec<&ShardEnd>) =
        pick.values().partition(|e| e.outcome == "done");
    if !done.is_empty() {
        let c = EndColumns::of(&done);
        let rows = tx
            .query(
                "INSERT INTO shards (job, shard, outcome, attempts, worker, host, finished, busy_ms)
                 SELECT u.job, u.shard, 'done', a.n, u.worker, u.host, to_timestamp(u.at), a.busy
                   FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::float8[])
                     AS u(job, shard, worker, host, at)
                   CROSS JOIN LATERAL (
                     SELECT count(*) AS n, COALESCE(sum(busy_ms), 0)::bigint AS busy
                       FROM attempts WHERE attempts.job = u.job AND attempts.shard = u.shard) AS a
                  WHERE true
                 ON CONFLICT (job, shard) DO UPDATE SET
                   outcome = 'done', attempts = EXCLUDED.attempts, worker = EXCLUDED.worker,
                   host = EXCLUDED.host, finished = EXCLUDED.finished,
                   busy_ms = EXCLUDED.busy_ms, reason = NULL
                 WHERE shards.outcome = 'failed'
                 RETURNING job, shard, (xmax = 0)",
                &[&c.job, &c.shard, &c.worker, &c.host, &c.at],
            )
            .await?;
        for r in rows {
            let (job, shard): (String, i64) = (r.get(0), r.get(1));
            let Some(end) = u32::try_from(shard)
                .ok()
                .and_then(|s| pick.get(&(job.as_str(), s)))
            else {
                continue;
            };
            let d = jobs.entry(end.job.as_str()).or_default();
            d.done += 1;
            if !r.get::<_, bool>(2) {
                d.failed -= 1;
            }
            d.records += big(end.records);
            d.tokens += big(end.tokens);
            d.audio_ms += big(end.audio_ms);
        }
    }
    if !failed.is_empty() {
        let c = EndColumns::of(&failed);
        let reason: Vec<Option<&str>> = failed.iter().map(|e| e.reason.as_deref()).collect();
        let rows = tx
            .query(
                "INSERT INTO shards (job, shard, outcome, attempts, worker, host, finished, busy_ms, reason)
                 SELECT u.job, u.shard, 'failed', a.n, u.worker, u.host, to_timestamp(u.at), a.busy, u.reason
                   FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::float8[], $6::text[])
                     AS u(job, shard, worker, host, at, reason)
                   CROSS JOIN LATERAL (
                     SELECT count(*) AS n, COALESCE(sum(busy_ms), 0)::bigint AS busy
                       FROM attempts WHERE attempts.job = u.job AND attempts.shard = u.shard) AS a
                  WHERE true
                 ON CONFLICT (job, shard) DO NOTHING
                 RETURNING job",
                &[&c.job, &c.shard, &c.worker, &c.host, &c.at, &reason],
            )
            .await?;
        for r in rows {
            let job: String = r.get(0);
            if let Some(end) = failed.iter().find(|e| e.job == job) {
                jobs.entry(end.job.as_str()).or_default().failed += 1;
            }
        }
    }
    Ok(())
}

/// Adds the batch's counts to each job's row, then sets its state and end.
async fn update_jobs(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
    mut deltas: BTreeMap<&str, JobDelta>,
) -> Result<(), LedgerError> {
    if plan.jobs.is_empty() {
        return Ok(());
    }
    let n = plan.jobs.len();
    let mut job = Vec::with_capacity(n);
    let (mut done, mut failed, mut records, mut tokens, mut busy) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut audio = Vec::with_capacity(n);
    let (mut first, mut last, mut requeued) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (j, seen) in &plan.jobs {
        let d = deltas.remove(j.as_str()).unwrap_or_default();
        job.push(j.as_str());
        done.push(d.done);
        failed.push(d.failed);
        records.push(d.records);
        tokens.push(d.tokens);
        audio.push(d.audio_ms);
        busy.push(d.busy_ms);
        first.push(seen.first_start_ms.map(secs));
        last.push(secs(seen.last_ms));
        requeued.push(seen.requeued);
    }
    let params: [&(dyn ToSql + Sync); 8] = [
        &job, &done, &failed, &records, &tokens, &busy, &first, &audio,
    ];
    tx.execute(
        "UPDATE jobs SET
           shards_done = shards_done + u.d_done, shards_failed = shards_failed + u.d_failed,
           records_done = records_done + u.d_records, tokens = tokens + u.d_tokens,
           audio_ms = audio_ms + u.d_audio, busy_ms = busy_ms + u.d_busy,
           started = LEAST(started, to_timestamp(u.first_start))
          FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[],
                      $6::bigint[], $7::float8[], $8::bigint[])
            AS u(job, d_done, d_failed, d_records, d_tokens, d_busy, first_start, d_audio)
         WHERE jobs.job = u.job",
        &params,
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
               THEN COALESCE(CASE WHEN u.requeued THEN NULL ELSE finished END, to_timestamp(u.last_s))
             ELSE NULL END
          FROM unnest($1::text[], $2::float8[], $3::bool[]) AS u(job, last_s, requeued)
         WHERE jobs.job = u.job",
        &[&job, &last, &requeued],
    )
    .await?;
    Ok(())
}

/// Adds the batch's usage to the (worker, hour, job) rows.
async fn upsert_usage(
    tx: &tokio_postgres::Transaction<'_>,
    usage: &Usage,
) -> Result<(), LedgerError> {
    if usage.is_empty() {
        return Ok(());
    }
    let worker: Vec<&str> = usage.keys().map(|k| k.0.as_str()).collect();
    let hour: Vec<f64> = usage.keys().map(|k| secs(k.1)).collect();
    let job: Vec<&str> = usage.keys().map(|k| k.2.as_str()).collect();
    let busy: Vec<i64> = usage.values().map(|u| u.busy_ms).collect();
    let records: Vec<i64> = usage.values().map(|u| u.records).collect();
    let tokens: Vec<i64> = usage.values().map(|u| u.tokens).collect();
    let audio: Vec<i64> = usage.values().map(|u| u.audio_ms).collect();
    let measured: Vec<f64> = usage.values().map(|u| u.measured_j).collect();
    let estimated: Vec<f64> = usage.values().map(|u| u.estimated_j).collect();
    let params: [&(dyn ToSql + Sync); 9] = [
        &worker, &hour, &job, &busy, &records, &tokens, &measured, &estimated, &audio,
    ];
    tx.execute(
        "INSERT INTO usage_hourly (worker, hour, job, busy_ms, records, tokens, energy_measured_j, energy_estimated_j, audio_ms)
         SELECT worker, to_timestamp(hour), job, busy_ms, records, tokens, em, ee, audio_ms
           FROM unnest($1::text[], $2::float8[], $3::text[], $4::bigint[], $5::bigint[],
                       $6::bigint[], $7::float8[], $8::float8[], $9::bigint[])
             AS u(worker, hour, job, busy_ms, records, tokens, em, ee, audio_ms)
          WHERE true
         ON CONFLICT (worker, hour, job) DO UPDATE SET
           busy_ms = usage_hourly.busy_ms + EXCLUDED.busy_ms,
           records = usage_hourly.records + EXCLUDED.records,
           tokens = usage_hourly.tokens + EXCLUDED.tokens,
           audio_ms = usage_hourly.audio_ms + EXCLUDED.audio_ms,
           energy_measured_j = usage_hourly.energy_measured_j + EXCLUDED.energy_measured_j,
           energy_estimated_j = usage_hourly.energy_estimated_j + EXCLUDED.energy_estimated_j",
        &params,
    )
    .await?;
    Ok(())
}

/// Adds a finished delivery to the hours it spans: device time and energy
/// split by the time in each hour; records, tokens and audio to the hour it
/// ended.
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
        u.busy_ms += big(ms);
        if i + 1 == n {
            u.records += big(row.records);
            u.tokens += big(row.tokens);
            u.audio_ms += big(row.audio_ms);
        }
        if measured {
            u.measured_j += joules * share;
        } else {
            u.estimated_j += joules * share;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::Energy;

    fn end(shard: u32, outcome: &'static str, worker: &str) -> ShardEnd {
        ShardEnd {
            job: "j".into(),
            shard,
            outcome,
            worker: worker.into(),
            host: "h".into(),
            at_ms: 1,
            records: 1,
            tokens: 0,
            audio_ms: 0,
            reason: None,
        }
    }

    #[test]
    fn a_shards_first_done_end_decides_else_its_first_failed_one() {
        let plan = Plan {
            shard_ends: vec![
                end(1, "failed", "a"),
                end(1, "done", "b"),
                end(1, "done", "c"),
                end(2, "failed", "d"),
                end(2, "failed", "e"),
                end(3, "done", "f"),
                end(3, "failed", "g"),
            ],
            ..Default::default()
        };
        let pick = deciding_ends(&plan);
        let got: Vec<(u32, &str, &str)> = pick
            .iter()
            .map(|((_, s), e)| (*s, e.outcome, e.worker.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![(1, "done", "b"), (2, "failed", "d"), (3, "done", "f")]
        );
    }

    #[test]
    fn usage_splits_device_time_and_energy_by_hour() {
        const H: u64 = 3_600_000;
        let row = AttemptRow {
            records: 7,
            tokens: 9,
            audio_ms: 61_250,
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
        assert_eq!(
            first.map(|x| (x.busy_ms, x.records, x.audio_ms)),
            Some((1_000, 0, 0))
        );
        assert_eq!(
            second.map(|x| (x.busy_ms, x.records, x.tokens, x.audio_ms)),
            Some((2_000, 7, 9, 61_250))
        );
        let e = first.map_or(0.0, |x| x.measured_j) + second.map_or(0.0, |x| x.measured_j);
        assert!((e - 30.0).abs() < 1e-9);
        assert_eq!(second.map(|x| x.estimated_j), Some(0.0));
    }
}
