//! Deliveries held by no worker. When the server leading a job's consumer
//! dies (or the only server restarts), the shard messages it had just sent
//! may never reach a worker; JetStream still counts them as delivered and
//! gives them out again only after the ack wait (a minute), so the job's
//! last shards wait that long for nothing.
//!
//! After a job consumer's leader changes, or this watchdog's connection
//! comes back, and a short grace (for the workers' next beats), the
//! consumer's unacknowledged deliveries are compared with what live workers
//! report running. Each message between the consumer's ack floor and its
//! last delivery that no live worker names is handed back at once (a NAK
//! on its acknowledgement subject, which carries the stream sequence), so
//! it is delivered again now. A worker that did hold it and had not yet
//! said so runs it twice at worst: outputs are written per shard, so the
//! result is the same. A shard waiting out a retry delay at that moment is
//! retried early; check runs (their own consumers) are left alone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use minions_schemas::messages::WorkerState;
use minions_schemas::streams;
use tokio_util::sync::CancellationToken;

use crate::view::View;

/// How long after a leader change or a reconnect the deliveries are looked
/// at: the workers' beats (about one a second) name what they hold.
pub const GRACE: Duration = Duration::from_secs(3);

/// Messages looked at per consumer, at most, in one look.
const MAX_LOOKED: usize = 10_000;

/// The stream sequence and consumer name of a `$JS.ACK` subject (both
/// layouts: 7 tokens after the prefix, or 9 and more with a domain and an
/// account hash).
pub fn ack_subject_seq(reply: &str) -> Option<(&str, u64)> {
    let rest = reply.strip_prefix("$JS.ACK.")?;
    let t: Vec<&str> = rest.split('.').collect();
    let (consumer, sseq) = match t.len() {
        7 | 8 => (t[1], t[3]),
        n if n >= 9 => (t[3], t[5]),
        _ => return None,
    };
    Some((consumer, sseq.parse().ok()?))
}

/// The stream sequences live workers report running, per consumer.
fn held(view: &View) -> HashMap<String, HashSet<u64>> {
    let mut out: HashMap<String, HashSet<u64>> = HashMap::new();
    let reg = view.registry();
    for (_, t) in reg.iter() {
        if matches!(t.state, WorkerState::Dead | WorkerState::Left) {
            continue;
        }
        for f in &t.beat.in_flight {
            if let Some((consumer, seq)) = ack_subject_seq(&f.reply) {
                out.entry(consumer.to_owned()).or_default().insert(seq);
            }
        }
    }
    out
}

/// Watches the job consumers' leaders and this connection every `every`
/// until `stop`, handing back deliveries held by no one after each change.
pub async fn watch(
    js: jetstream::Context,
    client: async_nats::Client,
    view: Arc<View>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut leaders: HashMap<String, Option<String>> = HashMap::new();
    let mut due: HashMap<String, Instant> = HashMap::new();
    let stats = client.statistics();
    let mut connects = stats.connects.load(std::sync::atomic::Ordering::Relaxed);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if client.connection_state() != async_nats::connection::State::Connected {
            continue;
        }
        let now_connects = stats.connects.load(std::sync::atomic::Ordering::Relaxed);
        let reconnected = now_connects > connects;
        connects = now_connects;
        let Ok(stream) = js.get_stream(streams::WORK_STREAM).await else {
            continue;
        };
        let mut seen = HashSet::new();
        let mut consumers = stream.consumers();
        while let Some(c) = consumers.next().await {
            let Ok(c) = c else { break };
            if !c.name.starts_with("job-") {
                continue;
            }
            let leader = c.cluster.as_ref().and_then(|k| k.leader.clone());
            let changed = leaders
                .insert(c.name.clone(), leader.clone())
                .is_some_and(|before| before != leader && leader.is_some());
            if changed || (reconnected && c.num_ack_pending > 0) {
                due.insert(c.name.clone(), Instant::now() + GRACE);
            }
            seen.insert(c.name);
        }
        leaders.retain(|name, _| seen.contains(name));
        let ready: Vec<String> = due
            .iter()
            .filter(|(name, at)| **at <= Instant::now() && seen.contains(*name))
            .map(|(name, _)| name.clone())
            .collect();
        due.retain(|name, _| seen.contains(name) && !ready.contains(name));
        for name in ready {
            match hand_back(&stream, &client, &view, &name).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(consumer = %name, handed_back = n,
                    "deliveries held by no worker after a leader change or reconnect; handed back now"),
                Err(e) => tracing::warn!(consumer = %name, error = %e,
                    "deliveries held by no worker not looked at; they return after the ack wait"),
            }
        }
    }
}

/// Hands back `consumer`'s deliveries that no live worker holds; returns
/// how many.
async fn hand_back(
    stream: &jetstream::stream::Stream,
    client: &async_nats::Client,
    view: &View,
    consumer: &str,
) -> Result<usize, String> {
    let mut c: jetstream::consumer::PullConsumer = stream
        .get_consumer(consumer)
        .await
        .map_err(|e| e.to_string())?;
    let info = c.info().await.map_err(|e| e.to_string())?.clone();
    if info.num_ack_pending == 0 {
        return Ok(0);
    }
    let held = held(view).remove(consumer).unwrap_or_default();
    if info.num_ack_pending <= held.len() {
        return Ok(0);
    }
    let filter = info.config.filter_subject.clone();
    if filter.is_empty() {
        return Ok(0);
    }
    let (last, dseq) = (
        info.delivered.stream_sequence,
        info.delivered.consumer_sequence,
    );
    let mut seq = info.ack_floor.stream_sequence + 1;
    let (mut looked, mut naked) = (0usize, 0usize);
    while seq <= last && looked < MAX_LOOKED {
        let m = match stream
            .raw_message_builder()
            .sequence(seq)
            .next_by_subject(filter.clone())
            .send()
            .await
        {
            Ok(m) => m,
            Err(_) => break,
        };
        if m.sequence > last {
            break;
        }
        looked += 1;
        seq = m.sequence + 1;
        if held.contains(&m.sequence) {
            continue;
        }
        // The consumer leader takes a NAK for any of its pending stream
        // sequences, with a delivery sequence within its range.
        let subject = format!(
            "$JS.ACK.{}.{consumer}.1.{}.{dseq}.{}.0",
            streams::WORK_STREAM,
            m.sequence,
            minions_schemas::time::now_ms().saturating_mul(1_000_000)
        );
        if client
            .publish(subject, bytes::Bytes::from_static(b"-NAK"))
            .await
            .is_ok()
        {
            naked += 1;
        }
    }
    let _ = client.flush().await;
    Ok(naked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_subjects_of_both_layouts_name_consumer_and_sequence() {
        assert_eq!(
            ack_subject_seq("$JS.ACK.MINIONS_WORK.job-a.1.42.7.1700000000000000000.3"),
            Some(("job-a", 42))
        );
        assert_eq!(
            ack_subject_seq("$JS.ACK.hub.HASH.MINIONS_WORK.job-b.2.50.9.1700000000000000000.0.r"),
            Some(("job-b", 50))
        );
        assert_eq!(ack_subject_seq("$JS.ACK.short.1"), None);
        assert_eq!(ack_subject_seq("_INBOX.x.y"), None);
    }
}
