//! `/metrics`: the view in the Prometheus text exposition format (0.0.4).
//! Names are `minions_*`; counters end in `_total`; label values are escaped
//! as the format requires.

use std::fmt::Write;

use crate::view::Snapshot;

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

struct Out(String);

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else if v.is_nan() {
        "NaN".to_owned()
    } else {
        format!("{v}")
    }
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(val));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", number(v));
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, v: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }
}

/// Renders every metric of `s`.
pub fn render(s: &Snapshot) -> String {
    let mut o = Out(String::with_capacity(4096));
    let c = &s.counters;
    let q = &s.queue;

    o.family("minions_workers", "gauge", "Workers by registry state.");
    for (state, n) in &s.states {
        o.sample("minions_workers", &[("state", state)], *n as f64);
    }
    o.one(
        "minions_workers_owner_active",
        "gauge",
        "Live workers whose owner is using the machine (yielded, taking no work).",
        s.owner_active as f64,
    );

    o.family(
        "minions_shards_total",
        "counter",
        "Shard outcomes: done and failed count each shard once; retried and handed_back count deliveries.",
    );
    for (outcome, n) in [
        ("done", c.done),
        ("failed", c.failed),
        ("retried", c.retried),
        ("handed_back", c.handed_back),
    ] {
        o.sample("minions_shards_total", &[("outcome", outcome)], n as f64);
    }
    o.one(
        "minions_records_total",
        "counter",
        "Records of shards done.",
        c.records as f64,
    );

    let h = &c.durations;
    o.family(
        "minions_shard_duration_seconds",
        "histogram",
        "Wall time of shards done, from delivery to stored output.",
    );
    let cumulative = h.cumulative();
    for (i, n) in cumulative.iter().enumerate() {
        let le = h.bounds.get(i).map_or("+Inf".to_owned(), |b| number(*b));
        o.sample(
            "minions_shard_duration_seconds_bucket",
            &[("le", &le)],
            *n as f64,
        );
    }
    o.sample("minions_shard_duration_seconds_sum", &[], h.sum);
    o.sample("minions_shard_duration_seconds_count", &[], h.count as f64);

    o.one(
        "minions_queue_depth",
        "gauge",
        "Messages in the work stream (queued or running).",
        q.depth as f64,
    );
    o.one(
        "minions_queue_pending",
        "gauge",
        "Work messages not yet delivered to any worker.",
        q.pending as f64,
    );
    o.one(
        "minions_queue_ack_pending",
        "gauge",
        "Deliveries not yet acknowledged.",
        q.ack_pending as f64,
    );
    o.one(
        "minions_queue_max_ack_pending",
        "gauge",
        "The work consumer's limit on unacknowledged deliveries.",
        q.max_ack_pending as f64,
    );
    o.one(
        "minions_queue_waiting_pulls",
        "gauge",
        "Pull requests waiting for work (idle worker slots).",
        q.waiting as f64,
    );
    o.one(
        "minions_queue_readable",
        "gauge",
        "1 when the last read of the work queue succeeded.",
        if q.ok { 1.0 } else { 0.0 },
    );
    o.one(
        "minions_redeliveries_total",
        "counter",
        "Deliveries of a shard beyond its first.",
        c.redeliveries as f64,
    );
    o.one(
        "minions_dead_letters_total",
        "counter",
        "Shards failed for good (each has a dead-letter record).",
        c.failed as f64,
    );
    o.one(
        "minions_dead_letters_stored",
        "gauge",
        "Dead-letter records in the dead-letter stream.",
        q.dead_letters as f64,
    );
    o.one(
        "minions_owner_handbacks_total",
        "counter",
        "Shards handed back because a machine's owner came back.",
        c.owner_handbacks as f64,
    );

    o.family(
        "minions_jobs",
        "gauge",
        "Jobs shown (every job not ended, and recent ended ones) by state.",
    );
    for state in ["pending", "running", "done", "failed", "cancelled"] {
        let n = s.jobs.iter().filter(|j| j.state.as_str() == state).count();
        o.sample("minions_jobs", &[("state", state)], n as f64);
    }
    o.family(
        "minions_job_progress_ratio",
        "gauge",
        "Share of a job's shards done, 0 to 1.",
    );
    for j in &s.jobs {
        o.sample(
            "minions_job_progress_ratio",
            &[("job", &j.job)],
            j.fraction_done(),
        );
    }
    o.one(
        "minions_heartbeats_total",
        "counter",
        "Worker heartbeats received.",
        s.heartbeats as f64,
    );
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_numbers_formatted() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(3.0), "3");
    }
}
