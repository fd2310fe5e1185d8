//! `minions collect`: merge a finished job's shard outputs, in input order,
//! into one `.npy` file (float32 `[records, dim]`) for embedding jobs, or
//! one JSON line per record for generation jobs (ours, or OpenAI's batch
//! output shape).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use futures::StreamExt;
use minions_schemas::messages::{
    FinishReason, Generation, JobSpec, OutputPayload, ShardInput, ShardOutput,
};
use minions_schemas::{JobId, keys, limits};
use object_store::ObjectStore;
use object_store::path::Path as StorePath;

use crate::cli::{CollectArgs, CollectFormat, Endpoints};
use crate::npy;
use crate::store_io::{get_doc, job_spec};

/// Shard outputs fetched at once.
const FETCH_WINDOW: usize = 8;

/// What collect wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectReport {
    /// Rows written.
    pub rows: u64,
    /// Vector length (0 for generation jobs).
    pub dim: u32,
    /// Records that could not run (generation jobs).
    pub errors: u64,
}

/// Runs `minions collect`: a `.parquet` output is written as Parquet for
/// either family; otherwise embedding jobs write `.npy`, generation jobs
/// JSON Lines.
pub async fn run(endpoints: &Endpoints, args: &CollectArgs) -> anyhow::Result<CollectReport> {
    let parquet = crate::input::is_parquet_path(&args.output);
    if parquet && args.format == CollectFormat::Openai {
        bail!("--format openai writes JSON Lines; name a .jsonl output, or drop --format");
    }
    let (store, spec) = open_complete(endpoints, &args.job).await?;
    let speech = spec.family == minions_schemas::messages::ModelFamily::WhisperSpeech;
    if parquet && speech {
        bail!(
            "a speech job is collected as JSON Lines (name a .jsonl output) or as subtitles (--format srt or vtt)"
        );
    }
    if parquet {
        crate::parquet_output::write(store, &spec, &args.output).await
    } else if speech {
        super::collect_speech::write(store, &spec, &args.output, args.format).await
    } else if matches!(args.format, CollectFormat::Srt | CollectFormat::Vtt) {
        bail!(
            "--format {:?} writes subtitles of a speech job; job {} is a {} job",
            args.format,
            spec.job,
            spec.family
        )
    } else if spec.family.generates() {
        write_jsonl(store, &spec, &args.output, args.format).await
    } else {
        write_npy(store, &spec, &args.output).await
    }
}

/// Opens the store and reads job `job`'s spec, checking that every shard
/// has its output (else an error saying how many do not).
pub async fn open_complete(
    endpoints: &Endpoints,
    job: &str,
) -> anyhow::Result<(std::sync::Arc<dyn ObjectStore>, JobSpec)> {
    let job = JobId::new(job).context("job id")?;
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
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
    Ok((store, spec))
}

/// One shard's output with its records' ids.
#[derive(Debug)]
pub struct CollectedShard {
    /// The output, checked to belong to the job and shard with the right
    /// number of rows and a consistent payload.
    pub output: ShardOutput,
    /// The records' ids, when the job has them (generation jobs always
    /// do; embedding jobs when submitted with an id field).
    pub ids: Option<Vec<String>>,
}

/// Whether a job's records have ids kept with its inputs.
pub fn has_ids(spec: &JobSpec) -> bool {
    spec.family.generates()
        || spec.family == minions_schemas::messages::ModelFamily::WhisperSpeech
        || spec.input.id_field.is_some()
}

/// A complete job's shards in input order, each with its ids when
/// `with_ids` (read from the shard inputs); at most [`FETCH_WINDOW`]
/// fetched ahead.
pub fn shards_in_order(
    store: std::sync::Arc<dyn ObjectStore>,
    spec: &JobSpec,
    with_ids: bool,
) -> impl futures::Stream<Item = anyhow::Result<CollectedShard>> + '_ {
    let ids = futures::stream::iter(0..spec.shards)
        .map(move |s| {
            let store = store.clone();
            async move {
                if !with_ids {
                    return anyhow::Ok((fetch(store.clone(), spec, s).await?, None));
                }
                let key = StorePath::from(keys::shard_input(&spec.job, s));
                let input: Option<ShardInput> = get_doc(
                    store.as_ref(),
                    &key,
                    "shard input",
                    limits::MAX_SHARD_INPUT_BYTES,
                )
                .await?;
                let ids = input.and_then(|i| i.ids);
                if let Some(ids) = &ids
                    && ids.len() as u64 != spec.shard_rows(s)
                {
                    bail!(
                        "{key} holds {} ids for {} rows",
                        ids.len(),
                        spec.shard_rows(s)
                    );
                }
                anyhow::Ok((fetch(store.clone(), spec, s).await?, ids))
            }
        })
        .buffered(FETCH_WINDOW);
    ids.map(|r| r.map(|(output, ids)| CollectedShard { output, ids }))
}

/// A complete job's results in memory, in input order.
#[derive(Debug, Clone, PartialEq)]
pub enum Gathered {
    /// An embedding job's vectors.
    Vectors {
        /// The records' ids, when the job has them.
        ids: Option<Vec<String>>,
        /// Vector length.
        dim: u32,
        /// `rows × dim` little-endian float32 values, row-major, as the
        /// shard outputs store them.
        data: Vec<u8>,
    },
    /// A generation job's results.
    Generations {
        /// The records' ids (their own, else their row number).
        ids: Vec<String>,
        /// One result per record.
        results: Vec<Generation>,
    },
    /// A speech job's transcripts: one object per audio file, as `minions
    /// collect --output x.jsonl` writes its lines (`id`, `text`,
    /// `language`, `segments`, `duration`, and `error` for a file that
    /// could not be transcribed).
    Transcripts {
        /// One object per file, in input order.
        lines: Vec<serde_json::Value>,
    },
}

/// Reads a complete job's results into memory (for the Python client).
pub async fn gather(endpoints: &Endpoints, job: &str) -> anyhow::Result<Gathered> {
    let (store, spec) = open_complete(endpoints, job).await?;
    let with_ids = has_ids(&spec);
    let mut ids: Vec<String> = Vec::new();
    let (mut rows, mut dim, mut data, mut results) = (0u64, None::<u32>, Vec::new(), Vec::new());
    let mut lines = Vec::new();
    let mut shards = std::pin::pin!(shards_in_order(store, &spec, with_ids));
    while let Some(shard) = shards.next().await {
        let CollectedShard {
            output,
            ids: shard_ids,
        } = shard?;
        rows += output.rows;
        if with_ids {
            // A shard input without ids (written before ids were kept for
            // every generation record) falls back to row numbers.
            match shard_ids {
                Some(v) => ids.extend(v),
                None => ids.extend((0..output.rows).map(|i| (output.first_row + i).to_string())),
            }
        }
        match output.payload {
            OutputPayload::Embeddings {
                dim: d,
                data: bytes,
            } => {
                match dim {
                    None => {
                        dim = Some(d);
                        let all = usize::try_from(spec.records.saturating_mul(u64::from(d) * 4))
                            .context("too many records for this machine")?;
                        data.reserve_exact(all);
                    }
                    Some(prev) if prev != d => bail!(
                        "shard {} has dimension {d}, earlier shards {prev}",
                        output.shard
                    ),
                    Some(_) => {}
                }
                // Stored as little-endian float32, as the caller wants them.
                data.extend_from_slice(&bytes);
            }
            OutputPayload::Generations { records } => results.extend(records),
            OutputPayload::Transcripts { records } => {
                for (i, t) in records.iter().enumerate() {
                    let row = output.first_row + i as u64;
                    // The id was pushed above (ids are kept for every
                    // speech job); a shard without them falls back to rows.
                    let at = usize::try_from(row).unwrap_or(usize::MAX);
                    let id = ids.get(at).cloned().unwrap_or_else(|| row.to_string());
                    lines.push(super::collect_speech::line(&id, t));
                }
            }
        }
    }
    if rows != spec.records {
        bail!(
            "outputs hold {rows} rows, the job has {} records",
            spec.records
        );
    }
    Ok(
        if spec.family == minions_schemas::messages::ModelFamily::WhisperSpeech {
            Gathered::Transcripts { lines }
        } else if spec.family.generates() {
            Gathered::Generations { ids, results }
        } else {
            Gathered::Vectors {
                ids: with_ids.then_some(ids),
                dim: dim.unwrap_or(0),
                data,
            }
        },
    )
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

/// A buffered file beside `path` (extension `ext`), renamed into place by
/// [`settle_file`] once complete: a failed collect leaves no partial output.
pub(crate) fn part_file(
    path: &Path,
    ext: &str,
) -> anyhow::Result<(std::path::PathBuf, std::io::BufWriter<std::fs::File>)> {
    let tmp = path.with_extension(ext);
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    Ok((tmp, std::io::BufWriter::with_capacity(1 << 20, file)))
}

/// Flushes `w`, checks that `rows` covers the job, and moves `tmp` to `path`.
pub(crate) fn settle_file(
    mut w: std::io::BufWriter<std::fs::File>,
    tmp: &Path,
    path: &Path,
    rows: u64,
    spec: &JobSpec,
) -> anyhow::Result<()> {
    w.flush()?;
    drop(w);
    if rows != spec.records {
        bail!(
            "outputs hold {rows} rows, the job has {} records",
            spec.records
        );
    }
    std::fs::rename(tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

async fn write_npy(
    store: std::sync::Arc<dyn ObjectStore>,
    spec: &JobSpec,
    path: &Path,
) -> anyhow::Result<CollectReport> {
    let (tmp, mut w) = part_file(path, "npy.part")?;
    let mut outputs = std::pin::pin!(shards_in_order(store, spec, false));
    let mut dim: Option<u32> = None;
    let mut rows = 0u64;
    while let Some(out) = outputs.next().await {
        let out = out?.output;
        let OutputPayload::Embeddings { dim: d, data } = &out.payload else {
            bail!("shard {} holds generations, not vectors", out.shard);
        };
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
    settle_file(w, &tmp, path, rows, spec)?;
    let dim = dim.unwrap_or(0);
    tracing::info!(job = %spec.job, rows, dim, output = %path.display(), "collected");
    Ok(CollectReport {
        rows,
        dim,
        errors: 0,
    })
}

async fn write_jsonl(
    store: std::sync::Arc<dyn ObjectStore>,
    spec: &JobSpec,
    path: &Path,
    format: CollectFormat,
) -> anyhow::Result<CollectReport> {
    let (tmp, mut w) = part_file(path, "jsonl.part")?;
    let mut outputs = std::pin::pin!(shards_in_order(store, spec, true));
    let (mut rows, mut errors) = (0u64, 0u64);
    let created = minions_schemas::time::now_ms() / 1000;
    while let Some(shard) = outputs.next().await {
        let CollectedShard { output: out, ids } = shard?;
        let OutputPayload::Generations { records } = &out.payload else {
            bail!("shard {} holds vectors, not generations", out.shard);
        };
        for (i, g) in records.iter().enumerate() {
            let row = out.first_row + i as u64;
            let id = ids
                .as_ref()
                .and_then(|v| v.get(i).cloned())
                .unwrap_or_else(|| row.to_string());
            if g.finish_reason == FinishReason::Error {
                errors += 1;
            }
            let line = match format {
                // Subtitles are refused for generation jobs before this.
                CollectFormat::Jsonl | CollectFormat::Srt | CollectFormat::Vtt => {
                    jsonl_line(&id, g)
                }
                CollectFormat::Openai => openai_line(&id, row, g, spec, created),
            };
            serde_json::to_writer(&mut w, &line)?;
            w.write_all(b"\n")?;
        }
        rows += out.rows;
    }
    settle_file(w, &tmp, path, rows, spec)?;
    tracing::info!(job = %spec.job, rows, errors, output = %path.display(), "collected");
    Ok(CollectReport {
        rows,
        dim: 0,
        errors,
    })
}

/// Our line: `{"id", "text", "finish_reason", "prompt_tokens",
/// "completion_tokens"}`, plus `"error"` for a record that could not run.
fn jsonl_line(id: &str, g: &Generation) -> serde_json::Value {
    let mut v = serde_json::json!({
        "id": id,
        "text": g.text,
        "finish_reason": g.finish_reason.as_str(),
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
    });
    if let Some(e) = &g.error {
        v["error"] = serde_json::Value::String(e.clone());
    }
    v
}

/// An OpenAI Batch API output line for the request `custom_id`.
fn openai_line(
    custom_id: &str,
    row: u64,
    g: &Generation,
    spec: &JobSpec,
    created: u64,
) -> serde_json::Value {
    let request_id = format!("{}-{row}", spec.job);
    if let Some(e) = &g.error {
        return serde_json::json!({
            "id": format!("batch_req_{request_id}"),
            "custom_id": custom_id,
            "response": null,
            "error": {"code": "invalid_request", "message": e},
        });
    }
    serde_json::json!({
        "id": format!("batch_req_{request_id}"),
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": request_id,
            "body": {
                "id": format!("chatcmpl-{request_id}"),
                "object": "chat.completion",
                "created": created,
                "model": spec.model_name.as_str(),
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": g.text},
                    "logprobs": null,
                    "finish_reason": g.finish_reason.as_str(),
                }],
                "usage": {
                    "prompt_tokens": g.prompt_tokens,
                    "completion_tokens": g.completion_tokens,
                    "total_tokens": g.prompt_tokens + g.completion_tokens,
                },
            },
        },
        "error": null,
    })
}
