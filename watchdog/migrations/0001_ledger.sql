-- The ledger's tables. The watchdog applies every file in
-- watchdog/migrations/ in order, once each, at start (a row per file in
-- ledger_migrations), under an advisory lock so that watchdogs starting
-- together apply each once.
--
-- Everything below is folded from the events stream, whose sequence
-- numbers make each write happen once: ledger_cursor holds, per events
-- stream, the last sequence applied, and a batch of events is applied in
-- the same transaction that moves the cursor past it, only if the cursor
-- still stands where the batch begins. A restarted watchdog, a second
-- watchdog or a replay therefore never counts an event twice.
-- Times are timestamptz; durations are milliseconds; energy is joules.

CREATE TABLE ledger_cursor (
    -- The events stream's identity: its name and creation time (a stream
    -- created again numbers its events from 1 again).
    stream      text PRIMARY KEY,
    -- The last stream sequence applied.
    seq         bigint NOT NULL,
    updated     timestamptz NOT NULL DEFAULT now()
);

-- One row per job, from its spec (read from the store) and its events.
CREATE TABLE jobs (
    job           text PRIMARY KEY,
    team          text NOT NULL,
    -- Who submitted it: the NATS identity, else the submitting OS user.
    submitter     text NOT NULL,
    model         text NOT NULL,
    model_hash    text NOT NULL,
    family        text NOT NULL,
    precision     text NOT NULL,
    priority      text NOT NULL,
    shards        bigint NOT NULL,
    records       bigint NOT NULL,
    submitted     timestamptz NOT NULL,
    -- The first shard's start, and the moment the last shard was done or
    -- failed for good (null until then).
    started       timestamptz,
    finished      timestamptz,
    -- queued, running, done, failed (some shards failed for good),
    -- cancelled (`minions cancel`; its running shards may still finish).
    state         text NOT NULL,
    shards_done   bigint NOT NULL DEFAULT 0,
    shards_failed bigint NOT NULL DEFAULT 0,
    records_done  bigint NOT NULL DEFAULT 0,
    tokens        bigint NOT NULL DEFAULT 0,
    -- Device-busy time of every delivery of every shard, ms.
    busy_ms       bigint NOT NULL DEFAULT 0
);

-- One row per delivery of a shard to a worker.
CREATE TABLE attempts (
    job        text NOT NULL,
    shard      bigint NOT NULL,
    -- The delivery's number (1 = first).
    attempt    bigint NOT NULL,
    worker     text NOT NULL,
    host       text NOT NULL,
    started    timestamptz,
    ended      timestamptz,
    -- Wall time on the device, ms (null for a delivery lost with its
    -- worker: nothing says how long it ran).
    busy_ms    bigint,
    compute_ms bigint,
    -- running, done, duplicate (done again: an earlier delivery had written
    -- the output), failed, handed_back. A delivery whose worker vanished
    -- (killed, asleep, off the network) reports no end: it is marked failed,
    -- with the reason, when the shard is delivered again.
    outcome    text NOT NULL,
    reason     text,
    records    bigint NOT NULL DEFAULT 0,
    tokens     bigint NOT NULL DEFAULT 0,
    energy_j   double precision,
    -- true: read from a meter; false: estimated; null: unknown.
    energy_measured boolean,
    PRIMARY KEY (job, shard, attempt, worker)
);
CREATE INDEX attempts_worker_ended ON attempts (worker, ended);

-- One row per shard that finished: done (once) or failed for good.
CREATE TABLE shards (
    job       text NOT NULL,
    shard     bigint NOT NULL,
    -- done or failed.
    outcome   text NOT NULL,
    -- Deliveries it took.
    attempts  bigint NOT NULL,
    worker    text NOT NULL,
    host      text NOT NULL,
    finished  timestamptz NOT NULL,
    busy_ms   bigint NOT NULL,
    reason    text,
    PRIMARY KEY (job, shard)
);

-- One row per worker process seen (a machine's restarts are new workers).
CREATE TABLE workers (
    worker        text PRIMARY KEY,
    host          text NOT NULL,
    device        text NOT NULL DEFAULT '',
    chip          text NOT NULL DEFAULT '',
    -- Memory lent to models, MB (0: not known).
    memory_lent_mb bigint NOT NULL DEFAULT 0,
    -- How its energy is known: rapl, nvidia-smi, powermetrics, estimate.
    energy_source text NOT NULL DEFAULT '',
    first_seen    timestamptz NOT NULL,
    last_seen     timestamptz NOT NULL
);

-- Usage per worker, per hour, per job: each delivery's device time,
-- records, tokens and energy, split across the hours it spanned.
CREATE TABLE usage_hourly (
    worker       text NOT NULL,
    hour         timestamptz NOT NULL,
    job          text NOT NULL,
    busy_ms      bigint NOT NULL DEFAULT 0,
    records      bigint NOT NULL DEFAULT 0,
    tokens       bigint NOT NULL DEFAULT 0,
    energy_measured_j  double precision NOT NULL DEFAULT 0,
    energy_estimated_j double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (worker, hour, job)
);
CREATE INDEX usage_hourly_hour ON usage_hourly (hour);
