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
    let p = progress::load(&js, store.as_ref(), &job).await?;
    let text = if args.json {
        serde_json::to_string_pretty(&p)?
    } else {
        p.render()
    };
    Ok((p, text))
}
