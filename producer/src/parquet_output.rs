//! `minions collect --output x.parquet`: a finished job as one Parquet file,
//! one row per input record in input order.
//!
//! Columns: `row` (UInt64, the record's input position), `id` (Utf8, when
//! the job has ids), then for an embedding job `vector`
//! (`FixedSizeList<Float32, dim>`), for a generation job `text`,
//! `finish_reason` (Utf8), `prompt_tokens`, `completion_tokens` (UInt32)
//! and `error` (Utf8, null unless the record could not run). The file's
//! key-value metadata holds `minions.job`, `minions.model` and
//! `minions.model_hash`. Zstd-compressed.
//!
//! Written shard by shard: each shard becomes one record batch, and a row
//! group is closed every [`ROW_GROUP_ROWS`] rows or [`ROW_GROUP_BYTES`]
//! buffered bytes, so the job is never held in memory whole. The file is
//! written beside the output as `.parquet.part` and renamed into place once
//! complete.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use arrow_array::{
    ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::StreamExt;
use minions_schemas::messages::{FinishReason, JobSpec, OutputPayload};
use object_store::ObjectStore;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::commands::collect::{
    CollectReport, CollectedShard, has_ids, part_file, settle_file, shards_in_order,
};

/// Rows per row group at most.
pub const ROW_GROUP_ROWS: usize = 65_536;
/// Encoded bytes a row group may buffer before it is written out.
pub const ROW_GROUP_BYTES: usize = 128 << 20;

type Writer = ArrowWriter<std::io::BufWriter<std::fs::File>>;

/// Writes finished job `spec` from `store` into the Parquet file `path`.
pub async fn write(
    store: Arc<dyn ObjectStore>,
    spec: &JobSpec,
    path: &Path,
) -> anyhow::Result<CollectReport> {
    let with_ids = has_ids(spec);
    let generates = spec.family.generates();
    let (tmp, file) = part_file(path, "parquet.part")?;
    let mut file = Some(file);
    let mut writer: Option<(Writer, SchemaRef)> = None;
    let mut shards = std::pin::pin!(shards_in_order(store, spec, with_ids));
    let (mut rows, mut errors, mut dim) = (0u64, 0u64, None::<u32>);
    while let Some(shard) = shards.next().await {
        let CollectedShard { output: out, ids } = shard?;
        let mut columns: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from_iter_values(
            out.first_row..out.first_row + out.rows,
        ))];
        if with_ids {
            let ids = match ids {
                Some(ids) => ids,
                None => (out.first_row..out.first_row + out.rows)
                    .map(|r| r.to_string())
                    .collect(),
            };
            columns.push(Arc::new(StringArray::from(ids)));
        }
        match (&out.payload, generates) {
            (OutputPayload::Embeddings { dim: d, data }, false) => {
                match dim {
                    None => dim = Some(*d),
                    Some(prev) if prev != *d => bail!(
                        "shard {} has dimension {d}, earlier shards {prev}",
                        out.shard
                    ),
                    Some(_) => {}
                }
                columns.push(vectors(*d, data)?);
            }
            (OutputPayload::Generations { records }, true) => {
                errors += records
                    .iter()
                    .filter(|g| g.finish_reason == FinishReason::Error)
                    .count() as u64;
                columns.push(Arc::new(StringArray::from_iter_values(
                    records.iter().map(|g| g.text.as_str()),
                )));
                columns.push(Arc::new(StringArray::from_iter_values(
                    records.iter().map(|g| g.finish_reason.as_str()),
                )));
                columns.push(Arc::new(UInt32Array::from_iter_values(
                    records.iter().map(|g| g.prompt_tokens),
                )));
                columns.push(Arc::new(UInt32Array::from_iter_values(
                    records.iter().map(|g| g.completion_tokens),
                )));
                columns.push(Arc::new(StringArray::from_iter(
                    records.iter().map(|g| g.error.as_deref()),
                )));
            }
            (_, true) => bail!("shard {} holds vectors, not generations", out.shard),
            (_, false) => bail!("shard {} holds generations, not vectors", out.shard),
        }
        if writer.is_none() {
            let schema = schema(spec, with_ids, dim);
            let props = properties(spec);
            let inner = file.take().context("the output file was taken twice")?;
            let w = ArrowWriter::try_new(inner, schema.clone(), Some(props))
                .with_context(|| format!("cannot start Parquet file {}", tmp.display()))?;
            writer = Some((w, schema));
        }
        if let Some((w, schema)) = &mut writer {
            let batch = RecordBatch::try_new(schema.clone(), columns)
                .with_context(|| format!("shard {} does not fit the file's columns", out.shard))?;
            w.write(&batch)
                .with_context(|| format!("cannot write {}", tmp.display()))?;
            if w.in_progress_rows() >= ROW_GROUP_ROWS || w.in_progress_size() >= ROW_GROUP_BYTES {
                w.flush()
                    .with_context(|| format!("cannot write {}", tmp.display()))?;
            }
        }
        rows += out.rows;
    }
    let Some((w, _)) = writer else {
        bail!("job {} has no shards to collect", spec.job);
    };
    let inner = w
        .into_inner()
        .with_context(|| format!("cannot finish {}", tmp.display()))?;
    settle_file(inner, &tmp, path, rows, spec)?;
    let dim = dim.unwrap_or(0);
    tracing::info!(job = %spec.job, rows, dim, errors, output = %path.display(), "collected as Parquet");
    Ok(CollectReport { rows, dim, errors })
}

/// The file's columns for a job of `spec`'s family.
fn schema(spec: &JobSpec, with_ids: bool, dim: Option<u32>) -> SchemaRef {
    let mut fields = vec![Field::new("row", DataType::UInt64, false)];
    if with_ids {
        fields.push(Field::new("id", DataType::Utf8, false));
    }
    if spec.family.generates() {
        fields.extend([
            Field::new("text", DataType::Utf8, false),
            Field::new("finish_reason", DataType::Utf8, false),
            Field::new("prompt_tokens", DataType::UInt32, false),
            Field::new("completion_tokens", DataType::UInt32, false),
            Field::new("error", DataType::Utf8, true),
        ]);
    } else {
        fields.push(Field::new(
            "vector",
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Float32, false)),
                i32::try_from(dim.unwrap_or(0)).unwrap_or(i32::MAX),
            ),
            false,
        ));
    }
    Arc::new(Schema::new(fields))
}

/// Zstd, row-group limits, and the job in the key-value metadata.
fn properties(spec: &JobSpec) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
        .set_key_value_metadata(Some(vec![
            KeyValue::new("minions.job".into(), spec.job.as_str().to_owned()),
            KeyValue::new("minions.model".into(), spec.model_name.as_str().to_owned()),
            KeyValue::new(
                "minions.model_hash".into(),
                spec.model_hash.as_str().to_owned(),
            ),
        ]))
        .build()
}

/// A shard's row-major little-endian f32 vectors as a list column.
fn vectors(dim: u32, data: &[u8]) -> anyhow::Result<ArrayRef> {
    let values = Float32Array::from_iter_values(
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    let size = i32::try_from(dim).context("vectors too long for a Parquet list")?;
    let list = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        size,
        Arc::new(values),
        None,
    )?;
    Ok(Arc::new(list))
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, UInt32Type, UInt64Type};
    use minions_schemas::messages::{
        Generation, InputDescription, ModelFamily, Precision, ShardInput, ShardOutput,
    };
    use minions_schemas::{JobId, ModelHash, ModelName, SCHEMA_VERSION, WorkerId, encode, keys};
    use object_store::memory::InMemory;
    use object_store::path::Path as StorePath;
    use object_store::{ObjectStoreExt, PutPayload};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const HASH: &str = "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12";

    fn spec(
        family: ModelFamily,
        records: u64,
        shard_size: u32,
        ids: bool,
    ) -> anyhow::Result<JobSpec> {
        Ok(JobSpec {
            submitter: String::new(),
            verify_ppm: None,
            layers: None,
            stage_split: Vec::new(),
            v: SCHEMA_VERSION,
            job: JobId::new("pq")?,
            model_name: ModelName::new("tiny")?,
            model_hash: ModelHash::new(HASH)?,
            family,
            input: InputDescription {
                source: "in.parquet".into(),
                sha256: String::new(),
                bytes: 0,
                text_field: "text".into(),
                id_field: ids.then(|| "doc".into()),
            },
            shard_size,
            max_batch: 0,
            precision: Precision::F32,
            shards: u32::try_from(records.div_ceil(u64::from(shard_size)))?,
            records,
            skipped: 0,
            created_ms: 0,
            team: minions_schemas::messages::DEFAULT_TEAM.to_owned(),
            priority: Default::default(),
            preemptible: false,
            needs: Default::default(),
        })
    }

    async fn put<T: serde::Serialize>(
        store: &InMemory,
        key: String,
        what: &'static str,
        v: &T,
    ) -> TestResult {
        store
            .put(&StorePath::from(key), PutPayload::from(encode(what, v)?))
            .await?;
        Ok(())
    }

    /// Stores `spec`'s shard inputs (ids `d<row>` when it has ids) and
    /// outputs from `payload(first_row, rows)`.
    async fn store_job(
        spec: &JobSpec,
        payload: impl Fn(u64, u64) -> OutputPayload,
    ) -> Result<Arc<InMemory>, Box<dyn std::error::Error>> {
        let store = Arc::new(InMemory::new());
        put(&store, keys::job_spec(&spec.job), "job spec", spec).await?;
        for s in 0..spec.shards {
            let first_row = u64::from(s) * u64::from(spec.shard_size);
            let rows = spec.shard_rows(s);
            let input = ShardInput {
                v: SCHEMA_VERSION,
                job: spec.job.clone(),
                shard: s,
                first_row,
                ids: spec.input.id_field.as_ref().map(|_| {
                    (first_row..first_row + rows)
                        .map(|r| format!("d{r}"))
                        .collect()
                }),
                texts: Vec::new(),
                records: Vec::new(),
                audio: Vec::new(),
            };
            put(
                &store,
                keys::shard_input(&spec.job, s),
                "shard input",
                &input,
            )
            .await?;
            let output = ShardOutput {
                v: SCHEMA_VERSION,
                job: spec.job.clone(),
                shard: s,
                first_row,
                rows,
                model_hash: spec.model_hash.clone(),
                worker: WorkerId::new("w1")?,
                payload: payload(first_row, rows),
                made_by: None,
            };
            put(
                &store,
                keys::shard_output(&spec.job, s),
                "shard output",
                &output,
            )
            .await?;
        }
        Ok(store)
    }

    /// A Parquet file's batches, key-value metadata and row-group count.
    type Read = (Vec<RecordBatch>, Vec<KeyValue>, usize);

    fn read(path: &Path) -> Result<Read, Box<dyn std::error::Error>> {
        let b = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path)?)?;
        let kv = b
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .cloned()
            .unwrap_or_default();
        let groups = b.metadata().num_row_groups();
        let batches = b.build()?.collect::<Result<Vec<_>, _>>()?;
        Ok((batches, kv, groups))
    }

    fn meta(kv: &[KeyValue], key: &str) -> Option<String> {
        kv.iter()
            .find(|k| k.key == key)
            .and_then(|k| k.value.clone())
    }

    #[tokio::test]
    async fn an_embedding_job_round_trips() -> TestResult {
        let dim = 3u32;
        let job = spec(ModelFamily::BertEmbedding, 10, 4, true)?;
        let value = |row: u64, j: u32| row as f32 + j as f32 / 10.0;
        let store = store_job(&job, |first, rows| OutputPayload::Embeddings {
            dim,
            data: (first..first + rows)
                .flat_map(|r| (0..dim).flat_map(move |j| value(r, j).to_le_bytes()))
                .collect(),
        })
        .await?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("out.parquet");
        let report = write(store, &job, &path).await?;
        assert_eq!(
            report,
            CollectReport {
                rows: 10,
                dim,
                errors: 0
            }
        );
        assert!(!dir.path().join("out.parquet.part").exists());
        let (batches, kv, _) = read(&path)?;
        let schema = batches[0].schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["row", "id", "vector"]);
        assert_eq!(
            schema.field(2).data_type(),
            &DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 3)
        );
        assert_eq!(meta(&kv, "minions.job").as_deref(), Some("pq"));
        assert_eq!(meta(&kv, "minions.model").as_deref(), Some("tiny"));
        assert_eq!(meta(&kv, "minions.model_hash").as_deref(), Some(HASH));
        let mut row = 0u64;
        for b in &batches {
            let rows = b.column(0).as_primitive::<UInt64Type>();
            let ids = b.column(1).as_string::<i32>();
            let vectors = b.column(2).as_fixed_size_list();
            for i in 0..b.num_rows() {
                assert_eq!(rows.value(i), row);
                assert_eq!(ids.value(i), format!("d{row}"));
                let v = vectors.value(i);
                let v = v.as_primitive::<Float32Type>();
                let want: Vec<f32> = (0..dim).map(|j| value(row, j)).collect();
                assert_eq!(v.values().to_vec(), want, "row {row}");
                row += 1;
            }
        }
        assert_eq!(row, 10);

        // Without ids: no id column.
        let bare = spec(ModelFamily::BertEmbedding, 5, 5, false)?;
        let store = store_job(&bare, |_, rows| OutputPayload::Embeddings {
            dim: 2,
            data: vec![0; rows as usize * 8],
        })
        .await?;
        write(store, &bare, &path).await?;
        let (batches, _, _) = read(&path)?;
        let names: Vec<String> = batches[0]
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["row", "vector"]);
        Ok(())
    }

    #[tokio::test]
    async fn a_generation_job_round_trips() -> TestResult {
        let spec = spec(ModelFamily::LlmGeneration, 7, 3, false)?;
        let gen_of = |r: u64| {
            if r == 4 {
                Generation::failed("prompt too long")
            } else {
                Generation {
                    text: format!("answer {r}"),
                    finish_reason: FinishReason::Stop,
                    prompt_tokens: r as u32 + 1,
                    completion_tokens: 2 * r as u32,
                    error: None,
                }
            }
        };
        let store = store_job(&spec, |first, rows| OutputPayload::Generations {
            records: (first..first + rows).map(gen_of).collect(),
        })
        .await?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("answers.parquet");
        let report = write(store, &spec, &path).await?;
        assert_eq!(
            report,
            CollectReport {
                rows: 7,
                dim: 0,
                errors: 1
            }
        );
        let (batches, _, _) = read(&path)?;
        let schema = batches[0].schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "row",
                "id",
                "text",
                "finish_reason",
                "prompt_tokens",
                "completion_tokens",
                "error"
            ]
        );
        assert!(schema.field(6).is_nullable());
        let mut row = 0u64;
        for b in &batches {
            for i in 0..b.num_rows() {
                let g = gen_of(row);
                // No id field: a generation record's id is its row number.
                assert_eq!(b.column(1).as_string::<i32>().value(i), row.to_string());
                assert_eq!(b.column(2).as_string::<i32>().value(i), g.text);
                assert_eq!(
                    b.column(3).as_string::<i32>().value(i),
                    g.finish_reason.as_str()
                );
                assert_eq!(
                    b.column(4).as_primitive::<UInt32Type>().value(i),
                    g.prompt_tokens
                );
                assert_eq!(
                    b.column(5).as_primitive::<UInt32Type>().value(i),
                    g.completion_tokens
                );
                let error = b.column(6).as_string::<i32>();
                assert_eq!(
                    (!error.is_null(i)).then(|| error.value(i).to_owned()),
                    g.error
                );
                row += 1;
            }
        }
        assert_eq!(row, 7);
        Ok(())
    }

    #[tokio::test]
    async fn row_groups_are_cut_as_the_job_streams() -> TestResult {
        // 70,000 rows of dimension 1 in shards of 10,000: two row groups.
        let spec = spec(ModelFamily::BertEmbedding, 70_000, 10_000, false)?;
        let store = store_job(&spec, |_, rows| OutputPayload::Embeddings {
            dim: 1,
            data: vec![0; rows as usize * 4],
        })
        .await?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("big.parquet");
        write(store, &spec, &path).await?;
        let (batches, _, groups) = read(&path)?;
        assert_eq!(
            batches.iter().map(RecordBatch::num_rows).sum::<usize>(),
            70_000
        );
        assert_eq!(groups, 2);
        Ok(())
    }
}
