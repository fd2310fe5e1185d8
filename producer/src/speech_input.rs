//! A speech job's input: the audio files to transcribe, each copied into
//! the fleet's store (workers read only the store) under the job, named by
//! its content's SHA-256 (`jobs/<job>/audio/<sha256>.<ext>`), so a
//! resubmit uploads nothing twice.
//!
//! `--input` names one of:
//! - a local folder, or an `s3://bucket/prefix/` folder: every file below it
//!   that `--glob` matches (default: audio extensions), in path order, each
//!   with its path below the folder as its id;
//! - a JSON Lines file of `{"id": …, "audio": …}` lines, optionally with
//!   `"language"`, `"task"` and `"initial_prompt"`; `audio` is an `s3://bucket/key` URL, a local
//!   path (relative to the list's folder), or a key in the fleet's store.
//!
//! Every file is checked (present, at most [`MAX_AUDIO_BYTES`]) before the
//! job is written: a bad line or file refuses the whole input, naming it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use futures::StreamExt;
use minions_schemas::JobId;
use minions_schemas::limits::{MAX_AUDIO_BYTES, MAX_AUDIO_LIST_BYTES};
use minions_schemas::messages::{AudioRecord, SpeechOptions, SpeechTask};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

use crate::input::RecordSource;
use crate::jsonl::{ReadError, Record};

/// Files read and uploaded at once.
const UPLOAD_WINDOW: usize = 4;

/// Extensions taken from a folder when no `--glob` is given.
pub const AUDIO_EXTENSIONS: &[&str] = &["wav", "flac", "mp3", "ogg", "oga", "m4a", "mp4", "aac"];

/// Whether `path`'s extension is one of [`AUDIO_EXTENSIONS`] (any case).
fn has_audio_extension(path: &str) -> bool {
    Path::new(path)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| AUDIO_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Where one file's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    Local(PathBuf),
    Remote(String),
    Stored(String),
}

/// One file of the input, before upload.
#[derive(Clone, Debug)]
struct Wanted {
    id: String,
    name: String,
    source: Source,
    options: SpeechOptions,
}

/// A speech job's records, resolved and uploaded.
pub struct SpeechSource {
    records: std::vec::IntoIter<Record>,
    bytes: u64,
    sha256: String,
}

impl RecordSource for SpeechSource {
    fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        Ok(self.records.next())
    }

    fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn sha256_hex(self: Box<Self>) -> String {
        self.sha256
    }
}

/// Reads the input `named` (a folder, an `s3://` folder, or a list; `local`
/// is where a list was copied to), copies every file into `store` under
/// `job`, and returns the records. `defaults` are the job's options.
pub async fn open(
    store: Arc<dyn ObjectStore>,
    job: &JobId,
    named: &str,
    local: &Path,
    glob: Option<&str>,
    defaults: &SpeechOptions,
) -> anyhow::Result<SpeechSource> {
    let pattern = glob
        .map(|g| glob::Pattern::new(g).with_context(|| format!("--glob {g:?}")))
        .transpose()?;
    let matches = |rel: &str| match &pattern {
        Some(p) => p.matches_with(
            rel,
            glob::MatchOptions {
                case_sensitive: true,
                require_literal_separator: false,
                require_literal_leading_dot: false,
            },
        ),
        None => has_audio_extension(rel),
    };
    let wanted: Vec<Wanted> =
        if crate::input::is_remote(named) && (named.ends_with('/') || glob.is_some()) {
            remote_folder(named, &matches, defaults).await?
        } else if local.is_dir() {
            local_folder(local, &matches, defaults)?
        } else if glob.is_some() {
            bail!(
                "--glob {}: --input {named} is not a folder",
                glob.unwrap_or_default()
            );
        } else {
            list(named, local, defaults)?
        };
    if wanted.is_empty() {
        bail!(
            "{named}: no audio files (a folder's files are chosen by --glob, else by their audio extension); nothing was published"
        );
    }
    let mut ids = std::collections::HashSet::new();
    for w in &wanted {
        if !ids.insert(w.id.as_str()) {
            bail!(
                "{named}: the id {:?} is given to two files; nothing was published",
                w.id
            );
        }
    }
    tracing::info!(job = %job, files = wanted.len(), "copying audio files into the store");
    let mut hasher = Sha256::new();
    let mut records = Vec::with_capacity(wanted.len());
    let mut total = 0u64;
    let mut done = futures::stream::iter(wanted.into_iter().map(|w| {
        let store = store.clone();
        async move { upload(store.as_ref(), job, w).await }
    }))
    .buffered(UPLOAD_WINDOW);
    let mut last_report = std::time::Instant::now();
    while let Some(r) = done.next().await {
        let (w, rec) = r?;
        hasher.update(w.id.as_bytes());
        hasher.update([0]);
        hasher.update(rec.key.as_bytes());
        hasher.update([0]);
        hasher.update(serde_json::to_vec(&rec.options).unwrap_or_default());
        hasher.update([b'\n']);
        total += rec.bytes;
        records.push(Record {
            id: Some(w.id),
            text: String::new(),
            generation: None,
            audio: Some(rec),
        });
        if last_report.elapsed().as_secs() >= 2 {
            last_report = std::time::Instant::now();
            tracing::info!(job = %job, files = records.len(), mb = total / 1_000_000, "copying audio files");
        }
    }
    Ok(SpeechSource {
        records: records.into_iter(),
        bytes: total,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// Every matching file below a local folder, in path order.
fn local_folder(
    root: &Path,
    matches: &(dyn Fn(&str) -> bool + Sync),
    defaults: &SpeechOptions,
) -> anyhow::Result<Vec<Wanted>> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        for e in entries {
            let e = e.with_context(|| format!("cannot list {}", dir.display()))?;
            let path = e.path();
            let kind = e.file_type()?;
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file()
                && let Ok(rel) = path.strip_prefix(root)
            {
                let rel = rel.to_string_lossy().replace('\\', "/");
                if matches(&rel) {
                    found.push((rel, path));
                }
            }
        }
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|(rel, path)| Wanted {
            name: file_name(&rel),
            id: rel,
            source: Source::Local(path),
            options: defaults.clone(),
        })
        .collect())
}

/// Every matching object below an `s3://bucket/prefix/`, in key order.
async fn remote_folder(
    url: &str,
    matches: &(dyn Fn(&str) -> bool + Sync),
    defaults: &SpeechOptions,
) -> anyhow::Result<Vec<Wanted>> {
    let (bucket, prefix) = split_url(url)?;
    let store = minions_endpoints::store::open(&format!("s3://{bucket}"))?;
    let prefix = prefix.trim_end_matches('/');
    let under = (!prefix.is_empty()).then(|| StorePath::from(prefix));
    let mut listed = store.list(under.as_ref());
    let mut found = Vec::new();
    while let Some(meta) = listed.next().await {
        let meta = meta.with_context(|| format!("cannot list {url}"))?;
        let key = meta.location.to_string();
        let rel = key
            .strip_prefix(prefix)
            .unwrap_or(&key)
            .trim_start_matches('/')
            .to_string();
        if matches(&rel) {
            found.push((rel, key));
        }
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|(rel, key)| Wanted {
            name: file_name(&rel),
            id: rel,
            source: Source::Remote(format!("s3://{bucket}/{key}")),
            options: defaults.clone(),
        })
        .collect())
}

/// The lines of a JSON Lines list of files.
fn list(named: &str, local: &Path, defaults: &SpeechOptions) -> anyhow::Result<Vec<Wanted>> {
    let len = std::fs::metadata(local)
        .with_context(|| format!("cannot read input {named}"))?
        .len();
    if len > MAX_AUDIO_LIST_BYTES {
        bail!(
            "{named} is {len} bytes; a speech job's list of files is at most {MAX_AUDIO_LIST_BYTES} bytes (split the job)"
        );
    }
    let text =
        std::fs::read_to_string(local).with_context(|| format!("cannot read input {named}"))?;
    // Local paths in a list are relative to the list's folder (a list
    // fetched from s3:// names no local files).
    let base = if crate::input::is_remote(named) {
        None
    } else {
        local.parent().map(Path::to_path_buf)
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let w = list_line(line, n as u64 + 1, base.as_deref(), defaults)
            .with_context(|| format!("{named}: line {}; nothing was published", n + 1))?;
        out.push(w);
    }
    Ok(out)
}

/// One line of a list: `{"id", "audio"}` with optional `language`, `task`
/// and `initial_prompt`.
fn list_line(
    line: &str,
    row: u64,
    base: Option<&Path>,
    defaults: &SpeechOptions,
) -> anyhow::Result<Wanted> {
    let v: serde_json::Value = serde_json::from_str(line).context("not a JSON object")?;
    let obj = v.as_object().context("not a JSON object")?;
    let audio = obj
        .get("audio")
        .and_then(|a| a.as_str())
        .filter(|a| !a.is_empty())
        .context("no \"audio\" string (an s3:// URL, a local path or a store key)")?;
    let id = match obj.get("id") {
        None | Some(serde_json::Value::Null) => row.to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(_) => bail!("\"id\" must be a string or a number"),
    };
    let mut options = defaults.clone();
    match obj.get("language") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::String(l)) => options.language = Some(language(l)?),
        Some(_) => bail!("\"language\" must be a string such as \"en\""),
    }
    match obj.get("task").and_then(|t| t.as_str()) {
        None => {}
        Some("transcribe") => options.task = SpeechTask::Transcribe,
        Some("translate") => options.task = SpeechTask::Translate,
        Some(t) => bail!("\"task\" is {t:?}; use \"transcribe\" or \"translate\""),
    }
    match obj.get("initial_prompt") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::String(p)) => {
            options.initial_prompt = Some(p.clone());
            options
                .check()
                .map_err(|why| anyhow::anyhow!("\"initial_prompt\": {why}"))?;
        }
        Some(_) => bail!("\"initial_prompt\" must be a string"),
    }
    let source = if crate::input::is_remote(audio) {
        split_url(audio)?;
        Source::Remote(audio.to_string())
    } else {
        let path = match base {
            Some(b) if Path::new(audio).is_relative() => b.join(audio),
            _ => PathBuf::from(audio),
        };
        if path.is_file() {
            Source::Local(path)
        } else {
            Source::Stored(audio.to_string())
        }
    };
    Ok(Wanted {
        name: file_name(audio),
        id,
        source,
        options,
    })
}

/// A language code as `--language` or a record gives it, checked.
pub fn language(code: &str) -> anyhow::Result<String> {
    let ok = (2..=3).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_lowercase());
    if !ok && code != "haw" {
        bail!("language {code:?}: give a code such as \"en\", \"de\" or \"yue\"");
    }
    Ok(code.to_string())
}

/// Reads one file, checks it, and copies it into the store; returns the
/// record that names it there.
async fn upload(
    store: &dyn ObjectStore,
    job: &JobId,
    w: Wanted,
) -> anyhow::Result<(Wanted, AudioRecord)> {
    let bytes: bytes::Bytes = match &w.source {
        Source::Local(p) => {
            let len = std::fs::metadata(p)
                .with_context(|| format!("{}: cannot read {}", w.id, p.display()))?
                .len();
            check_size(&w.id, len)?;
            tokio::fs::read(p)
                .await
                .with_context(|| format!("{}: cannot read {}", w.id, p.display()))?
                .into()
        }
        Source::Remote(url) => {
            let (bucket, key) = split_url(url)?;
            let remote = minions_endpoints::store::open(&format!("s3://{bucket}"))?;
            // The response's size is checked before its body is read.
            let got = remote
                .get(&StorePath::from(key))
                .await
                .with_context(|| format!("{}: cannot read {url}", w.id))?;
            check_size(&w.id, got.meta.size)?;
            got.bytes()
                .await
                .with_context(|| format!("{}: cannot read {url}", w.id))?
        }
        Source::Stored(key) => {
            let path = StorePath::parse(key).with_context(|| {
                format!(
                    "{}: {key:?} is neither a local file, an s3:// URL nor a store key",
                    w.id
                )
            })?;
            let meta = store.head(&path).await.with_context(|| {
                format!(
                    "{}: {key:?} is neither a local file, an s3:// URL nor a key in the store",
                    w.id
                )
            })?;
            check_size(&w.id, meta.size)?;
            let rec = AudioRecord {
                key: key.clone(),
                bytes: meta.size,
                name: w.name.clone(),
                options: w.options.clone(),
            };
            return Ok((w, rec));
        }
    };
    let sha = hex::encode(Sha256::digest(&bytes));
    let ext = Path::new(&w.name)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .filter(|e| e.len() <= 8 && e.bytes().all(|b| b.is_ascii_alphanumeric()));
    let key = match ext {
        Some(e) => format!("jobs/{job}/audio/{sha}.{e}"),
        None => format!("jobs/{job}/audio/{sha}"),
    };
    let path = StorePath::from(key.as_str());
    let size = bytes.len() as u64;
    if store.head(&path).await.is_err() {
        store
            .put(&path, bytes.into())
            .await
            .with_context(|| format!("{}: uploading to {key}", w.id))?;
    }
    let rec = AudioRecord {
        key,
        bytes: size,
        name: w.name.clone(),
        options: w.options.clone(),
    };
    Ok((w, rec))
}

fn check_size(id: &str, len: u64) -> anyhow::Result<()> {
    if len > MAX_AUDIO_BYTES {
        bail!("{id}: the file is {len} bytes; an audio file is at most {MAX_AUDIO_BYTES} bytes");
    }
    if len == 0 {
        bail!("{id}: the file is empty");
    }
    Ok(())
}

/// `s3://bucket/key` split, or why not.
fn split_url(url: &str) -> anyhow::Result<(&str, &str)> {
    url.strip_prefix("s3://")
        .and_then(|r| r.split_once('/'))
        .filter(|(b, _)| !b.is_empty())
        .with_context(|| format!("{url}: expected s3://bucket/key"))
}

/// The last part of a path or key.
fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_lines_name_their_files_and_options() -> anyhow::Result<()> {
        let d = SpeechOptions::default();
        let w = list_line(
            r#"{"id": 7, "audio": "calls/a.mp3", "language": "de"}"#,
            1,
            None,
            &d,
        )?;
        assert_eq!((w.id.as_str(), w.name.as_str()), ("7", "a.mp3"));
        assert_eq!(w.source, Source::Stored("calls/a.mp3".into()));
        assert_eq!(w.options.language.as_deref(), Some("de"));
        let w = list_line(
            r#"{"audio": "s3://b/x/y.wav", "task": "translate"}"#,
            3,
            None,
            &d,
        )?;
        assert_eq!(w.id, "3");
        assert_eq!(w.source, Source::Remote("s3://b/x/y.wav".into()));
        assert_eq!(w.options.task, SpeechTask::Translate);
        for (bad, why) in [
            ("[1]", "not a JSON object"),
            (r#"{"id": "a"}"#, "no \"audio\""),
            (
                r#"{"audio": "a.wav", "task": "summarise"}"#,
                "use \"transcribe\"",
            ),
            (
                r#"{"audio": "a.wav", "language": "English"}"#,
                "give a code",
            ),
            (r#"{"audio": "s3://nobucket"}"#, "expected s3://bucket/key"),
        ] {
            let e = list_line(bad, 1, None, &d).err().map(|e| format!("{e:#}"));
            assert!(
                e.as_deref().is_some_and(|e| e.contains(why)),
                "{bad}: {e:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn folders_are_read_in_path_order_by_pattern_or_extension() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("b"))?;
        for f in ["b/2.wav", "a.MP3", "notes.txt", "b/1.flac"] {
            std::fs::write(dir.path().join(f), b"x")?;
        }
        let d = SpeechOptions::default();
        let by_ext = |rel: &str| has_audio_extension(rel);
        let ids: Vec<String> = local_folder(dir.path(), &by_ext, &d)?
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(ids, ["a.MP3", "b/1.flac", "b/2.wav"]);
        let p = glob::Pattern::new("b/*.wav")?;
        let ids: Vec<String> = local_folder(dir.path(), &|r| p.matches(r), &d)?
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(ids, ["b/2.wav"]);
        Ok(())
    }
}
