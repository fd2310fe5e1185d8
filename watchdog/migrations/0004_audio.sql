-- Speech jobs: milliseconds of audio transcribed, beside the tokens that
-- generation jobs count. A delivery's, from its done event; a job's, the
-- sum over its done shards.
ALTER TABLE attempts ADD COLUMN audio_ms bigint NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN audio_ms bigint NOT NULL DEFAULT 0;
