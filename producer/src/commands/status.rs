//! `minions status`: a job's progress, once.

use anyhow::Context;
use minions_schemas::JobId;

use crate::cli::{Endpoints, StatusArgs};
use crate::progress::{self, Progress};

/// Runs `minions status`, returning the progress and the text to print.
pub async fn run(endpoints: &Endpoints, args: &StatusArgs) -> anyhow::Result<(Progress, String)> {
    let job = JobId::new(&args.job).context("job id")?;
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
    let (_, js) = endpoints.connect("minions status").await?;
    let mut p = progress::load(&js, store.as_ref(), &job).await?;
    if p.verifying > 0 && !p.state.is_final() {
        p.checks_wait = p.checks_waiting(live_machines(&js).await);
    }
    let text = if args.json {
        serde_json::to_string_pretty(&p)?
    } else {
        p.render()
    };
    Ok((p, text))
}

/// The machines of the workers that beat lately (not stopped, not silent
/// for three beats); an unreadable heartbeat stream counts as a fleet of
/// many (nothing is claimed about it).
async fn live_machines(js: &async_nats::jetstream::Context) -> usize {
    let Ok(beats) = minions_endpoints::snapshot::last_heartbeats(js).await else {
        return usize::MAX;
    };
    let now = minions_schemas::time::now_ms();
    beats
        .iter()
        .filter(|hb| !hb.leaving && !super::worker::silent(hb, now))
        .map(|hb| minions_schemas::subjects::machine(&hb.worker).to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}
