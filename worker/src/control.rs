//! Control of a running worker: drain, resume, evict and rejoin requests on
//! its control subject, and job cancellations broadcast to every worker.

use std::sync::Arc;

use futures::StreamExt;
use minions_schemas::messages::{Control, ControlCommand, ControlReply};
use minions_schemas::{JobId, SCHEMA_VERSION, decode, encode, limits, subjects};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::identity::new_worker_id;

async fn reply(ctx: &Ctx, to: Option<async_nats::Subject>, status: &str, handed_back: usize) {
    let Some(to) = to else { return };
    let r = ControlReply {
        v: SCHEMA_VERSION,
        worker: ctx.identity.worker_id(),
        status: status.to_owned(),
        handed_back: u32::try_from(handed_back).unwrap_or(u32::MAX),
    };
    if let Ok(bytes) = encode("control reply", &r) {
        let _ = ctx.client.publish(to, bytes.into()).await;
    }
}

/// Aborts the task it holds when dropped, whichever way `run` returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves control requests and cancellations until `stop` is cancelled;
/// beside them, reads the cancellation markers of running jobs
/// ([`crate::cancel_marker`]).
/// `ready` fires once both subscriptions are sent: what the worker publishes
/// after that (its first heartbeat) reaches the server after them, so no one
/// who learns of the worker finds it deaf.
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    stop: CancellationToken,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let markers = tokio::spawn(crate::cancel_marker::watch(
        ctx.clone(),
        ctx.settings.cancel_check,
        stop.child_token(),
    ));
    let _markers = AbortOnDrop(markers);
    let mut cancels = match ctx.client.subscribe(subjects::CANCEL_ALL).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for job cancellations");
            return;
        }
    };
    loop {
        let id = ctx.identity.worker_id();
        let mut ctl = match ctx.client.subscribe(subjects::control(&id)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for control requests");
                return;
            }
        };
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                Some(m) = cancels.next() => {
                    let job = m.subject.as_str().rsplit('.').next().unwrap_or_default();
                    if JobId::new(job).is_ok() {
                        let n = ctx.running.cancel_job(job);
                        tracing::info!(job, stopped = n, "job cancelled");
                    }
                }
                m = ctl.next() => {
                    let Some(m) = m else { return };
                    let c: Control = match decode("control", &m.payload, limits::MAX_CONTROL_BYTES) {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!(error = %e, "control message does not decode");
                            continue;
                        }
                    };
                    match c.command {
                        ControlCommand::Drain => {
                            ctx.holds.set_operator(true);
                            tracing::info!(by = %c.by, running = ctx.running.in_flight().len(), "draining: finishing running shards, pulling nothing new");
                            reply(&ctx, m.reply, "draining", 0).await;
                        }
                        ControlCommand::Resume => {
                            ctx.holds.set_operator(false);
                            tracing::info!(by = %c.by, "resumed: pulling again");
                            reply(&ctx, m.reply, "resumed", 0).await;
                        }
                        ControlCommand::Evict => {
                            ctx.holds.set_operator(true);
                            crate::group::leave(&ctx, "evicted");
                            let n = ctx.running.hand_back_all();
                            tracing::warn!(by = %c.by, handed_back = n, "evicted: handing back running shards, pulling nothing new");
                            reply(&ctx, m.reply, "evicted", n).await;
                        }
                        ControlCommand::Rejoin => {
                            let new = new_worker_id(&ctx.identity.name);
                            tracing::warn!(old = %id, new = %new, by = %c.by,
                                "this worker was declared dead while it was unreachable; rejoining as a new session");
                            ctx.identity.set_worker_id(new);
                            reply(&ctx, m.reply, "rejoined", 0).await;
                            break;
                        }
                    }
                }
            }
        }
    }
}
