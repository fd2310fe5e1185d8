-- Operator actions on record (drain, evict, resume, release, cancel, retry,
-- team set, quarantine), copied from the actions stream. Each row is one
-- stream message, keyed by the stream's identity and the message's
-- sequence, so copying it again (another watchdog, a restart) adds nothing;
-- ledger_cursor holds how far the copy has read.
CREATE TABLE actions (
    -- The actions stream's name and creation time, as in ledger_cursor.
    stream  text NOT NULL,
    seq     bigint NOT NULL,
    at      timestamptz NOT NULL,
    -- Who: the NATS identity, or the dashboard's signed-in user.
    actor   text NOT NULL,
    -- From where: cli, dashboard or watchdog.
    via     text NOT NULL,
    action  text NOT NULL,
    -- On what: a worker id, machine, job id or team.
    target  text NOT NULL,
    detail  text NOT NULL DEFAULT '',
    PRIMARY KEY (stream, seq)
);
CREATE INDEX actions_at ON actions (at);
