//! Parquet through the real binaries: a Parquet input (integer ids, several
//! row groups, a column that is not read) gives the same vectors as the
//! same texts submitted as JSON Lines, `collect --output x.parquet` writes
//! them with their rows and ids, and a Parquet input that cannot be used
//! (a missing column, a column of the wrong type, a damaged file, a null
//! text) is refused by name with nothing published.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt64Type};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use minions_schemas::streams::WORK_STREAM;
use minions_tests::{Fleet, Result, max_abs_diff, read_npy_f32, write_corpus};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

/// Records in the job.
const N: usize = 300;

#[tokio::test(flavor = "multi_thread")]
async fn parquet_in_and_out_match_json_lines() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

/// Writes `columns` as a Parquet file with row groups of `group` rows.
fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>, group: usize) -> Result<()> {
    let batch = RecordBatch::try_from_iter(columns)?;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group))
        .set_compression(Compression::SNAPPY)
        .build();
    let mut w = ArrowWriter::try_new(File::create(path)?, batch.schema(), Some(props))?;
    w.write(&batch)?;
    w.close()?;
    Ok(())
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let model = fleet.push_model("tiny", Default::default())?;
    let dir = fleet.dir.path().to_path_buf();
    let jsonl = dir.join("in.jsonl");
    let texts = write_corpus(&jsonl, N)?;
    let input = dir.join("in.parquet");
    write_parquet(
        &input,
        vec![
            (
                "lang",
                Arc::new(StringArray::from(vec!["en"; N])) as ArrayRef,
            ),
            (
                "doc_id",
                Arc::new(Int64Array::from_iter_values(0..N as i64)),
            ),
            ("body", Arc::new(StringArray::from(texts.clone()))),
        ],
        128,
    )?;
    let groups = ParquetRecordBatchReaderBuilder::try_new(File::open(&input)?)?
        .metadata()
        .num_row_groups();
    assert_eq!(groups, 3, "300 rows in row groups of 128");
    let input_s = input.display().to_string();

    let submit = |job: &str, file: &str, extra: &[&str]| -> Result<String> {
        let mut args = vec![
            "submit",
            "--model",
            "tiny",
            "--input",
            file,
            "--shard-size",
            "50",
            "--job",
            job,
        ];
        args.extend_from_slice(extra);
        fleet.cli(&args)
    };
    submit(
        "pq",
        &input_s,
        &["--text-field", "body", "--id-field", "doc_id"],
    )?;
    submit("js", &jsonl.display().to_string(), &["--id-field", "id"])?;

    // Queued and waiting for a worker: what "nothing published" is told from.
    assert_eq!(queued(fleet, "pq").await?, 6);
    refusals(fleet, &input, &texts).await?;

    fleet.add_worker(&[])?;
    for job in ["pq", "js", "nulls-skipped"] {
        let status = fleet.wait_job(job, Duration::from_secs(120))?;
        assert_eq!(status["state"], "done", "{status}");
    }
    let status: serde_json::Value = serde_json::from_str(&fleet.cli(&["status", "pq", "--json"])?)?;
    assert_eq!(status["records"], N, "{status}");

    // The JSON Lines job against the model in-process, then the Parquet
    // job against the JSON Lines job.
    fleet.check_outputs("js", &model, &texts)?;
    let (rows, dim, want) = read_npy_f32(&dir.join("js.npy"))?;
    assert_eq!(rows, N);
    let out = dir.join("out.parquet");
    let said = fleet.cli(&["collect", "pq", "--output", &out.display().to_string()])?;
    assert!(said.contains(&format!("{N} vectors")), "{said}");
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&out)?)?;
    let kv = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    let job_meta = kv.iter().find(|k| k.key == "minions.job");
    assert_eq!(
        job_meta.and_then(|k| k.value.as_deref()),
        Some("pq"),
        "{kv:?}"
    );
    let names: Vec<String> = reader
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["row", "id", "vector"]);
    let (mut got, mut ids, mut positions) = (Vec::<f32>::new(), Vec::new(), Vec::<u64>::new());
    for batch in reader.build()? {
        let batch = batch?;
        positions.extend(batch.column(0).as_primitive::<UInt64Type>().values().iter());
        let id = batch.column(1).as_string::<i32>();
        ids.extend((0..batch.num_rows()).map(|i| id.value(i).to_owned()));
        let vectors = batch.column(2).as_fixed_size_list();
        assert_eq!(vectors.value_length() as usize, dim);
        got.extend(
            vectors
                .values()
                .as_primitive::<Float32Type>()
                .values()
                .iter(),
        );
    }
    assert_eq!(positions, (0..N as u64).collect::<Vec<_>>());
    assert_eq!(ids, (0..N).map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(got.len(), want.len());
    let diff = max_abs_diff(&got, &want);
    eprintln!("Parquet job against the JSON Lines job: max abs diff {diff:e}");
    assert!(
        got == want,
        "the Parquet job's vectors differ from the JSON Lines job's by {diff}"
    );
    Ok(())
}

/// Messages of `job` in the work stream.
async fn queued(fleet: &Fleet, job: &str) -> Result<usize> {
    use futures::StreamExt;
    let js = async_nats::jetstream::new(fleet.client().await?);
    let stream = js.get_stream(WORK_STREAM).await?;
    let mut subjects = stream
        .info_with_subjects(format!("minions.work.{job}.>"))
        .await?;
    let mut n = 0;
    while let Some(s) = subjects.next().await {
        n += s?.1;
    }
    Ok(n)
}

/// Asserts that a submit of `job` failed saying every one of `says`, and
/// that nothing of it was published: no shard message, no job spec.
async fn refused(fleet: &Fleet, job: &str, args: &[&str], says: &[&str]) -> Result<()> {
    let mut all = vec![
        "submit",
        "--model",
        "tiny",
        "--job",
        job,
        "--shard-size",
        "50",
    ];
    all.extend_from_slice(args);
    let out = fleet.cli_raw(&all)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{job} was accepted: {err}");
    for s in says {
        assert!(err.contains(s), "{job}: no {s:?} in\n{err}");
    }
    assert!(err.contains("nothing was published"), "{err}");
    assert_eq!(queued(fleet, job).await?, 0, "{job} has shard messages");
    let spec = fleet
        .dir
        .path()
        .join(format!("store/jobs/{job}/spec.msgpack"));
    assert!(!spec.exists(), "{job} has a job spec");
    eprintln!(
        "{job}: {}",
        err.lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default()
    );
    Ok(())
}

/// Parquet inputs that cannot be used are refused before anything is
/// published; null texts are skipped with `--skip-bad`.
async fn refusals(fleet: &Fleet, input: &Path, texts: &[String]) -> Result<()> {
    let input_s = input.display().to_string();
    refused(
        fleet,
        "no-column",
        &["--input", &input_s, "--text-field", "text"],
        &[
            "in.parquet",
            "no column \"text\" (named by --text-field)",
            "\"lang\", \"doc_id\", \"body\"",
        ],
    )
    .await?;
    refused(
        fleet,
        "wrong-type",
        &["--input", &input_s, "--text-field", "doc_id"],
        &["in.parquet", "column \"doc_id\"", "of type Int64"],
    )
    .await?;
    let bytes = std::fs::read(input)?;
    let cut = fleet.dir.path().join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() / 3])?;
    refused(
        fleet,
        "damaged",
        &[
            "--input",
            &cut.display().to_string(),
            "--text-field",
            "body",
        ],
        &["cut.parquet is not a readable Parquet file"],
    )
    .await?;

    // Null texts: refused with the row number, or skipped and counted.
    let nulls = fleet.dir.path().join("nulls.parquet");
    let with_nulls: Vec<Option<&str>> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (i % 100 != 2).then_some(t.as_str()))
        .collect();
    write_parquet(
        &nulls,
        vec![("body", Arc::new(StringArray::from(with_nulls)) as ArrayRef)],
        128,
    )?;
    let nulls_s = nulls.display().to_string();
    refused(
        fleet,
        "nulls",
        &["--input", &nulls_s, "--text-field", "body"],
        &[
            "nulls.parquet",
            "row 3: the text column \"body\" (--text-field) is null",
            "--skip-bad",
        ],
    )
    .await?;
    fleet.cli(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &nulls_s,
        "--text-field",
        "body",
        "--skip-bad",
        "--job",
        "nulls-skipped",
    ])?;
    let status: serde_json::Value =
        serde_json::from_str(&fleet.cli(&["status", "nulls-skipped", "--json"])?)?;
    assert_eq!(status["records"], N - 3, "{status}");
    Ok(())
}
