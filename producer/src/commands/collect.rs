//! `minions collect`: merge a finished job's shard outputs, in input order,
//! into one `.npy` file (float32 `[records, dim]`).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use futures::StreamExt;
use minions_schemas::messages::{JobSpec, OutputPayload, ShardOutput};
use minions_schemas::{JobId, keys, limits};
use object_store::ObjectStore;
use object_store::path::Path as StorePath;

use crate::cli::{CollectArgs, Endpoints};
use crate::npy;
use crate::store_io::{get_doc, job_spec};

/// Shard outputs fetched at once.
const FETCH_WINDOW: usize = 8;

/// What collect wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectReport {
    /// Rows written.
    pub rows: u64,
    /// Vector length.
    pub dim: u32,
}

/// Runs `minions collect`.
pub async fn run(endpoints: &Endpoints, args: &CollectArgs) -> anyhow::Result<CollectReport> {
    let job = JobId::new(&args.job).context("job id")?;
    let store = minions_schemas::endpoints::store::open(&endpoints.store_url())?;
    let spec = job_spec(store.as_ref(), &job).await?;
    let missing = missing_outputs(store.as_ref(), &spec).await?;
    if !missing.is_empty() {
        let shown: Vec<String> = missing.iter().take(10).map(u32::to_string).collect();
        bail!(
            "job {job} is not complete: {} of {} shards have no output (e.g. shards {}); see `minions status {job}`",
            missing.len(),
            spec.shards,
            shown.join(", ")
        );
    }
    write_npy(store, &spec, &args.output).await
}

async fn missing_outputs(store: &dyn ObjectStore, spec: &JobSpec) -> anyhow::Result<Vec<u32>> {
    use futures::TryStreamExt;
    let prefix = StorePath::from(keys::job_outputs(&spec.job));
    let present: std::collections::HashSet<String> = store
        .list(Some(&prefix))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .context("listing outputs")?;
    Ok((0..spec.shards)
        .filter(|&s| !present.contains(&keys::shard_output(&spec.job, s)))
        .collect())
}

async fn fetch(
    store: std::sync::Arc<dyn ObjectStore>,
    spec: &JobSpec,
    shard: u32,
) -> anyhow::Result<ShardOutput> {
    let key = StorePath::from(keys::shard_output(&spec.job, shard));
    let out: ShardOutput = get_doc(
        store.as_ref(),
        &key,
        "shard output",
        limits::MAX_SHARD_OUTPUT_BYTES,
    )
    .await?
    .with_context(|| format!("{key} vanished"))?;
    if out.job != spec.job || out.shard != shard || out.rows != spec.shard_rows(shard) {
        bail!(
            "{key} does not hold job {} shard {shard} with {} rows",
            spec.job,
            spec.shard_rows(shard)
        );
    }
    out.check_shape().map_err(anyhow::Error::msg)?;
    Ok(out)
}

async fn write_npy(
    store: std::sync::Arc<dyn ObjectStore>,
    spec: &JobSpec,
    path: &Path,
) -> anyhow::Result<CollectReport> {
    let tmp = path.with_extension("npy.part");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut outputs = futures::stream::iter(0..spec.shards)
        .map(|s| fetch(store.clone(), spec, s))
        .buffered(FETCH_WINDOW);
    let mut dim: Option<u32> = None;
    let mut rows = 0u64;
    while let Some(out) = outputs.next().await {
        let out = out?;
        let OutputPayload::Embeddings { dim: d, data } = &out.payload;
        match dim {
            None => {
                npy::write_f32_header(&mut w, spec.records, u64::from(*d))?;
                dim = Some(*d);
            }
            Some(prev) if prev != *d => bail!(
                "shard {} has dimension {d}, earlier shards {prev}",
                out.shard
            ),
            Some(_) => {}
        }
        w.write_all(data)?;
        rows += out.rows;
    }
    w.flush()?;
    drop(w);
    if rows != spec.records {
        bail!(
            "outputs hold {rows} rows, the job has {} records",
            spec.records
        );
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    let dim = dim.unwrap_or(0);
    tracing::info!(job = %spec.job, rows, dim, output = %path.display(), "collected");
    Ok(CollectReport { rows, dim })
}
