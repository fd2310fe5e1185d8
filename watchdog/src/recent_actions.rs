//! The last operator actions on record, for the dashboard: read from the
//! actions stream every few seconds, from where the last read stopped.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use minions_schemas::streams;
use tokio_util::sync::CancellationToken;

use crate::view::View;

/// How many actions the dashboard shows.
pub const RECENT: usize = 20;

/// Keeps the view's last [`RECENT`] actions current until `stop`. A fleet
/// without an actions stream (one set up before it existed) shows none.
pub async fn poll(
    js: jetstream::Context,
    view: Arc<View>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut after: Option<u64> = None;
    loop {
        if after.is_none()
            && let Ok(mut s) = js.get_stream(streams::ACTIONS_STREAM).await
            && let Ok(info) = s.info().await
        {
            after = Some(info.state.last_sequence.saturating_sub(RECENT as u64));
        }
        if let Some(from) = after {
            match minions_endpoints::actions::after(&js, from, 1000).await {
                Ok(read) if read.last > from => {
                    view.push_actions(read.actions.into_iter().map(|(_, a)| a));
                    after = Some(read.last);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "the actions on record were not read"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
