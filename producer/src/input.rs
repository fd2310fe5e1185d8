//! Where a job's records come from: a JSON Lines file, a Parquet file, or
//! texts held in memory (the Python client's lists, Series and arrays).
//! Each is read as a stream of [`Record`]s by a [`RecordSource`], so
//! `submit` cuts shards the same way whatever the input, and no input is
//! held in memory whole.

use std::io::BufReader;
use std::path::{Path, PathBuf};

use minions_schemas::limits::MAX_TEXT_BYTES;
use sha2::{Digest, Sha256};

use crate::jsonl::{JsonlReader, ReadError, Record};
use crate::prompts::{self, GenDefaults};

/// A job's input.
#[derive(Debug, Clone)]
pub enum Input {
    /// A file: Parquet when its name ends in `.parquet` or `.parq`, else
    /// JSON Lines.
    File(PathBuf),
    /// A local copy of a remote file: read like [`Input::File`], recorded
    /// under the name it was given (`source`, e.g. its `s3://` URL).
    Named {
        /// The local copy.
        path: PathBuf,
        /// The name the user gave.
        source: String,
    },
    /// Texts in memory (prompts, for a generation model), with optional
    /// ids (as many as texts); `source` names them in the job spec.
    Texts {
        /// The texts, in input order.
        texts: Vec<String>,
        /// One id per text, or none.
        ids: Option<Vec<String>>,
        /// What the job spec records as the input's source.
        source: String,
    },
}

/// How records are taken from an input.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// The field (JSON Lines) or column (Parquet) holding the text; for a
    /// generation model's Parquet input, the prompt.
    pub text_field: String,
    /// The field or column holding a record id, if any.
    pub id_field: Option<String>,
    /// Longest accepted JSON line, in bytes.
    pub max_line_bytes: usize,
    /// Set for generation models: records are prompts with these defaults.
    pub generation: Option<GenDefaults>,
}

/// A stream of records from one input.
pub trait RecordSource: Send {
    /// The next record: `Ok(None)` at the end. A `Line` or `Row` error is
    /// about one record (reading can go on after it); any other error ends
    /// the input.
    fn next_record(&mut self) -> Result<Option<Record>, ReadError>;
    /// Bytes read so far (for progress).
    fn bytes_read(&self) -> u64;
    /// Lowercase hex SHA-256 identifying the input's content: of the file's
    /// bytes for JSON Lines, of the records taken for other inputs. Call
    /// after the last record.
    fn sha256_hex(self: Box<Self>) -> String;
}

impl Input {
    /// What the job spec records as the input's source.
    pub fn source(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Named { source, .. } | Self::Texts { source, .. } => source.clone(),
        }
    }

    /// Whether this is a Parquet file (by its name).
    pub fn is_parquet(&self) -> bool {
        match self {
            Self::File(p) | Self::Named { path: p, .. } => is_parquet_path(p),
            Self::Texts { .. } => false,
        }
    }

    /// The input's size in bytes (a file's length; texts' total length).
    pub fn bytes(&self) -> u64 {
        match self {
            Self::File(p) | Self::Named { path: p, .. } => {
                std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
            }
            Self::Texts { texts, .. } => texts.iter().map(|t| t.len() as u64).sum(),
        }
    }

    /// Opens the input for reading.
    pub fn open(self, opts: &ReadOptions) -> Result<Box<dyn RecordSource>, ReadError> {
        match self {
            Self::File(p) | Self::Named { path: p, .. } if is_parquet_path(&p) => Ok(Box::new(
                crate::parquet_input::ParquetSource::open(&p, opts)?,
            )),
            Self::File(p) | Self::Named { path: p, .. } => {
                let file = std::fs::File::open(&p).map_err(|e| {
                    ReadError::Input(format!("cannot open input {}: {e}", p.display()))
                })?;
                let hashing = HashingReader {
                    inner: file,
                    hasher: Sha256::new(),
                };
                let mut reader = JsonlReader::new(
                    BufReader::with_capacity(1 << 20, hashing),
                    &opts.text_field,
                    opts.id_field.as_deref(),
                    opts.max_line_bytes,
                );
                if let Some(d) = &opts.generation {
                    reader = reader.for_generation(d.clone());
                }
                Ok(Box::new(reader))
            }
            Self::Texts { texts, ids, .. } => {
                if let Some(ids) = &ids
                    && ids.len() != texts.len()
                {
                    return Err(ReadError::Input(format!(
                        "{} ids for {} texts; give one id per text",
                        ids.len(),
                        texts.len()
                    )));
                }
                Ok(Box::new(MemorySource {
                    texts: texts.into_iter(),
                    ids: ids.map(Vec::into_iter),
                    generation: opts.generation.clone(),
                    row: 0,
                    bytes: 0,
                    hash: RecordHasher::default(),
                }))
            }
        }
    }
}

/// Whether an input names a remote object (`s3://bucket/key`) rather
/// than a local file.
pub fn is_remote(name: &str) -> bool {
    name.starts_with("s3://")
}

/// Copies a remote input (`s3://bucket/key`, reached with the store's
/// AWS_* settings) into a temporary file, streamed (never whole in
/// memory), keeping its extension so its format is told the same way.
/// The file is removed when the returned path is dropped.
pub async fn fetch_remote(url: &str) -> anyhow::Result<tempfile::TempPath> {
    use anyhow::Context;
    use futures::StreamExt;
    use object_store::ObjectStoreExt;
    use std::io::Write;

    let rest = url
        .strip_prefix("s3://")
        .with_context(|| format!("{url}: only s3:// URLs are read remotely"))?;
    let (bucket, key) = rest
        .split_once('/')
        .filter(|(b, k)| !b.is_empty() && !k.is_empty())
        .with_context(|| format!("{url}: expected s3://bucket/key"))?;
    let store = minions_endpoints::store::open(&format!("s3://{bucket}"))?;
    let ext = Path::new(key)
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| format!(".{e}"))
        .unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix("minions-input-")
        .suffix(&ext)
        .tempfile()
        .context("cannot create a temporary file for the remote input")?;
    let (file, path) = tmp.into_parts();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let got = store
        .get(&object_store::path::Path::from(key))
        .await
        .with_context(|| format!("cannot read {url}"))?;
    let mut body = got.into_stream();
    let mut bytes = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.with_context(|| format!("reading {url}"))?;
        bytes += chunk.len() as u64;
        w.write_all(&chunk)
            .context("writing the remote input's local copy")?;
    }
    w.flush().context("writing the remote input's local copy")?;
    tracing::info!(input = %url, bytes, "remote input copied");
    Ok(path)
}

/// Whether a path names a Parquet file.
pub fn is_parquet_path(p: &Path) -> bool {
    matches!(
        p.extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("parquet" | "parq")
    )
}

/// Checks a text's size and makes the record for row `row`: an embedding
/// record, or with `generation`, a raw-text prompt with the job's defaults.
pub fn text_record(
    text: String,
    id: Option<String>,
    row: u64,
    generation: Option<&GenDefaults>,
) -> Result<Record, String> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(format!(
            "text is {} bytes; the limit is {MAX_TEXT_BYTES}",
            text.len()
        ));
    }
    match generation {
        None => Ok(Record {
            id,
            text,
            generation: None,
            audio: None,
        }),
        Some(d) => {
            let mut obj = serde_json::Map::new();
            obj.insert("prompt".into(), serde_json::Value::String(text));
            let (_, record) = prompts::parse(&obj, None, row, d)?;
            Ok(Record {
                id,
                text: String::new(),
                generation: Some(record),
                audio: None,
            })
        }
    }
}

/// Hashes records as they are taken: each id and text, length-prefixed, so
/// that two different record lists never hash alike by concatenation.
#[derive(Default)]
pub struct RecordHasher(Sha256);

impl RecordHasher {
    /// Adds one record's id (if any) and text.
    pub fn add(&mut self, id: Option<&str>, text: &str) {
        match id {
            Some(id) => {
                self.0.update([1u8]);
                self.0.update((id.len() as u64).to_le_bytes());
                self.0.update(id.as_bytes());
            }
            None => self.0.update([0u8]),
        }
        self.0.update((text.len() as u64).to_le_bytes());
        self.0.update(text.as_bytes());
    }

    /// The hash, lowercase hex.
    pub fn hex(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// A reader that hashes what passes through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

impl<R: std::io::Read + Send> RecordSource for JsonlReader<BufReader<HashingReader<R>>> {
    fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        JsonlReader::next_record(self)
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    fn sha256_hex(self: Box<Self>) -> String {
        hex::encode(self.into_inner().into_inner().hasher.finalize())
    }
}

/// Texts in memory.
struct MemorySource {
    texts: std::vec::IntoIter<String>,
    ids: Option<std::vec::IntoIter<String>>,
    generation: Option<GenDefaults>,
    row: u64,
    bytes: u64,
    hash: RecordHasher,
}

impl RecordSource for MemorySource {
    fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        let Some(text) = self.texts.next() else {
            return Ok(None);
        };
        let id = self.ids.as_mut().and_then(Iterator::next);
        let row = self.row;
        self.row += 1;
        self.bytes += text.len() as u64;
        self.hash.add(id.as_deref(), &text);
        text_record(text, id, row, self.generation.as_ref())
            .map(Some)
            .map_err(|problem| ReadError::Row {
                row: row + 1,
                problem,
            })
    }

    fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn sha256_hex(self: Box<Self>) -> String {
        self.hash.hex()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ReadOptions {
        ReadOptions {
            text_field: "text".into(),
            id_field: None,
            max_line_bytes: 1 << 20,
            generation: None,
        }
    }

    #[test]
    fn texts_in_memory_become_records_in_order() -> Result<(), ReadError> {
        let input = Input::Texts {
            texts: vec!["a".into(), "b".into()],
            ids: Some(vec!["x".into(), "y".into()]),
            source: "list".into(),
        };
        let mut s = input.open(&opts())?;
        let first = s.next_record()?.map(|r| (r.id, r.text));
        assert_eq!(first, Some((Some("x".into()), "a".into())));
        assert_eq!(s.next_record()?.map(|r| r.text), Some("b".into()));
        assert!(s.next_record()?.is_none());
        assert_eq!(s.bytes_read(), 2);
        assert_eq!(s.sha256_hex().len(), 64);
        Ok(())
    }

    #[test]
    fn ids_must_match_texts_and_hashes_tell_lists_apart() {
        let input = Input::Texts {
            texts: vec!["a".into()],
            ids: Some(vec![]),
            source: "list".into(),
        };
        let e = input.open(&opts()).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("0 ids for 1 texts")));
        let hash = |texts: &[&str]| {
            let mut h = RecordHasher::default();
            for t in texts {
                h.add(None, t);
            }
            h.hex()
        };
        assert_ne!(hash(&["ab", "c"]), hash(&["a", "bc"]));
    }

    #[test]
    fn prompts_in_memory_get_the_job_defaults() -> Result<(), String> {
        let d = GenDefaults {
            max_tokens: 7,
            ..GenDefaults::default()
        };
        let r = text_record("hi".into(), None, 3, Some(&d))?;
        let g = r.generation.ok_or("no generation record")?;
        assert_eq!(g.params.max_tokens, 7);
        assert!(text_record("x".repeat(MAX_TEXT_BYTES + 1), None, 0, None).is_err());
        Ok(())
    }

    #[test]
    fn parquet_is_told_by_its_name() {
        assert!(is_parquet_path(Path::new("a/b.PARQUET")));
        assert!(is_parquet_path(Path::new("b.parq")));
        assert!(!is_parquet_path(Path::new("b.jsonl")));
    }
}
