//! Creating what the contract's streams module names: the server's
//! configurations of the streams and buckets, and [`ensure`] to create them
//! where missing (job consumers are made by the queue module).

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use minions_schemas::streams::{
    ACTIONS_MAX_AGE, ACTIONS_STREAM, DEAD_STREAM, EVENTS_DUPLICATE_WINDOW, EVENTS_MAX_AGE,
    EVENTS_STREAM, HEARTBEATS_STREAM, LEGACY_WORK_CONSUMER, MAX_REPLICAS, QUARANTINE_BUCKET,
    TEAMS_BUCKET, WORK_STREAM, WORKERS_BUCKET, WorkSettings,
};
use minions_schemas::subjects;

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

/// The work stream's configuration.
pub fn work_stream_config(settings: &WorkSettings) -> stream::Config {
    stream::Config {
        metadata: settings.metadata(),
        name: WORK_STREAM.to_owned(),
        description: Some("Minions shard tasks (work queue)".to_owned()),
        subjects: vec![subjects::WORK_SUBJECTS.to_owned()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        duplicate_window: settings.duplicate_window,
        max_message_size: i32::try_from(minions_schemas::limits::MAX_TASK_BYTES)
            .unwrap_or(i32::MAX),
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
        duplicate_window: EVENTS_DUPLICATE_WINDOW,
        max_message_size: i32::try_from(minions_schemas::limits::MAX_EVENT_BYTES)
            .unwrap_or(i32::MAX),
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
        max_message_size: i32::try_from(minions_schemas::limits::MAX_HEARTBEAT_BYTES)
            .unwrap_or(i32::MAX),
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

/// The actions stream's configuration: operator actions on record, kept
/// [`ACTIONS_MAX_AGE`].
pub fn actions_stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: ACTIONS_STREAM.to_owned(),
        description: Some("Minions operator actions on record".to_owned()),
        subjects: vec![subjects::ACTION_SUBJECTS.to_owned()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        max_age: ACTIONS_MAX_AGE,
        duplicate_window: Duration::from_secs(120),
        max_message_size: i32::try_from(minions_schemas::limits::MAX_EVENT_BYTES)
            .unwrap_or(i32::MAX),
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
/// cluster's leader elections (see [`crate::resilient`]).
pub async fn ensure(
    js: &jetstream::Context,
    settings: &WorkSettings,
) -> Result<WorkSettings, EnsureError> {
    crate::resilient::patiently("setting up the streams", crate::resilient::PATIENCE, || {
        ensure_once(js, settings)
    })
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
    let config = &work.cached_info().config;
    let actual = settings.of_stream(&config.metadata, config.num_replicas);
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
        (ACTIONS_STREAM, actions_stream_config(actual.replicas)),
    ] {
        let want_window = config.duplicate_window;
        let stream =
            js.get_or_create_stream(config)
                .await
                .map_err(|source| EnsureError::Stream {
                    stream: name,
                    source,
                })?;
        // A stream made by an older release has the server's default
        // window: set ours, nothing else of its configuration changes.
        let have = stream.cached_info().config.clone();
        if !want_window.is_zero() && have.duplicate_window != want_window {
            let updated = stream::Config {
                duplicate_window: want_window,
                ..have
            };
            match js.update_stream(updated).await {
                Ok(_) => tracing::info!(
                    stream = name,
                    window_secs = want_window.as_secs(),
                    "duplicate window set"
                ),
                Err(e) => {
                    tracing::warn!(stream = name, error = %e, "could not set the stream's duplicate window")
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_events_stream_sets_its_duplicate_window() {
        let c = events_stream_config(1);
        assert_eq!(c.duplicate_window, EVENTS_DUPLICATE_WINDOW);
        assert!(c.duplicate_window >= Duration::from_secs(30 * 60));
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
        let back = WorkSettings::default().of_stream(&stream.metadata, stream.num_replicas);
        assert_eq!(back.ack_wait, Duration::from_secs(7));
        assert_eq!(back.max_deliver, s.max_deliver);
    }
}
