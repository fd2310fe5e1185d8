-- A watchdog rejects a result whose `done` its output does not back (no
-- output object, or one that is not what the event says): that delivery's
-- outcome becomes `forged` and the shard it had made done runs again. A
-- check run (another machine's run of a shard, compared with its output)
-- ends as `check`.
COMMENT ON COLUMN attempts.outcome IS
  'running, done, duplicate (done again: an earlier delivery had written the output), failed, handed_back, check (a check run: another machine ran the shard to compare outputs), or forged (a done not backed by its output, rejected by a watchdog; reason says why)';
