-- Audio transcribed per worker, hour and job, beside the tokens: a
-- delivery's audio counts in the hour it ended, as its records do. Hours
-- written before this migration count 0 (jobs.audio_ms has their totals).
ALTER TABLE usage_hourly ADD COLUMN audio_ms bigint NOT NULL DEFAULT 0;
