//! Cancelled jobs: a cancellation is no event (it is a marker in the store
//! and a message to the workers), so the ledger takes it from what the
//! watchdog knows, now and then. Idempotent: only a queued or running job
//! becomes cancelled, and it stays so.

use tokio_postgres::Client;

use super::LedgerError;
use crate::view::View;

/// Marks every job the watchdog knows as cancelled so in the ledger.
pub(crate) async fn mark(client: &Client, view: &View) -> Result<(), LedgerError> {
    let jobs: Vec<String> = view
        .jobs()
        .iter()
        .filter(|j| j.cancelled)
        .map(|j| j.progress(0).job)
        .collect();
    if jobs.is_empty() {
        return Ok(());
    }
    client
        .execute(
            "UPDATE jobs SET state = 'cancelled', finished = COALESCE(finished, now())
             WHERE job = ANY($1) AND state IN ('queued', 'running')",
            &[&jobs],
        )
        .await?;
    Ok(())
}
