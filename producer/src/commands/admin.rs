//! `minions admin init`: the administrator's step that creates the streams,
//! the worker registry and the shared work consumer, with the work queue's
//! settings chosen here. Run once per fleet with credentials that may
//! create streams; workers, producers and watchdogs then only use them (a
//! least-privilege NATS identity cannot create or delete streams).

use std::fmt::Write;
use std::time::Duration;

use anyhow::Context;
use minions_schemas::streams::{self, WorkSettings};

use crate::cli::{AdminInitArgs, Endpoints};

/// Creates what is missing and reports every stream and the consumer.
pub async fn init(endpoints: &Endpoints, args: &AdminInitArgs) -> anyhow::Result<String> {
    let (_, js) = endpoints.connect("minions admin init").await?;
    let settings = WorkSettings {
        ack_wait: Duration::from_secs(args.ack_wait_secs),
        max_deliver: i64::from(args.max_deliver),
        max_ack_pending: i64::from(args.max_ack_pending),
        max_waiting: i64::from(args.max_ack_pending),
        replicas: usize::from(endpoints.replication.replicas),
        ..Default::default()
    };
    let existed = js.get_stream(streams::WORK_STREAM).await.is_ok();
    let actual = minions_endpoints::streams::ensure(&js, &settings)
        .await
        .context("setting up the streams")?;
    let mut out = String::new();
    let mut kept_replicas = Vec::new();
    for name in [
        streams::WORK_STREAM,
        streams::EVENTS_STREAM,
        streams::HEARTBEATS_STREAM,
        streams::DEAD_STREAM,
    ] {
        let info = js
            .get_stream(name)
            .await
            .with_context(|| format!("reading stream {name}"))?
            .get_info()
            .await
            .with_context(|| format!("reading stream {name}"))?;
        writeln!(
            out,
            "stream {name}: subjects {}, {:?} retention, {:?} storage, {} replica(s){}, {} messages",
            info.config.subjects.join(" "),
            info.config.retention,
            info.config.storage,
            info.config.num_replicas,
            leader(info.cluster.as_ref()),
            info.state.messages
        )?;
        if info.config.num_replicas != settings.replicas {
            kept_replicas.push(format!("{name} ({})", info.config.num_replicas));
        }
    }
    writeln!(
        out,
        "job consumers (one per job, made at submit): ack wait {} s, max deliver {}, max ack pending {}, {} replica(s)",
        actual.ack_wait.as_secs(),
        actual.max_deliver,
        actual.max_ack_pending,
        actual.replicas,
    )?;
    if !kept_replicas.is_empty() {
        writeln!(
            out,
            "note: {} existed with another replica count and kept it; to change it, recreate them on an idle fleet \
             (scaling a work queue's replicas in place is a known trouble spot, nats-server #3953)",
            kept_replicas.join(", ")
        )?;
    }
    let wanted = (
        settings.ack_wait,
        settings.max_deliver,
        settings.max_ack_pending,
    );
    let found = (actual.ack_wait, actual.max_deliver, actual.max_ack_pending);
    if existed && wanted != found {
        writeln!(
            out,
            "note: the work stream existed with other job consumer settings and kept them"
        )?;
    }
    write!(
        out,
        "{}",
        if existed {
            "ready (already set up)"
        } else {
            "ready (created)"
        }
    )?;
    Ok(out)
}

/// ", leader NAME" when the server reports a cluster leader.
fn leader(cluster: Option<&async_nats::jetstream::stream::ClusterInfo>) -> String {
    cluster
        .and_then(|c| c.leader.as_ref())
        .map(|l| format!(", leader {l}"))
        .unwrap_or_default()
}
