//! `minions model push` and `minions model list`.
//!
//! A model is stored by content: its manifest lists every file with its size
//! and SHA-256, and the model's hash is the SHA-256 of the manifest. A name
//! is a small record pointing at a hash; jobs pin the hash at submit time.

use std::path::Path;

use anyhow::{Context, bail};
use minions_schemas::messages::{
    MODEL_CHUNK_BYTES, ModelFamily, ModelFile, ModelManifest, ModelRecord,
};
use minions_schemas::time::now_ms;
use minions_schemas::{ModelName, SCHEMA_VERSION, encode, keys};
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use object_store::path::Path as StorePath;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::cli::{Endpoints, ModelListArgs, ModelPushArgs};
use crate::store_io::model_records;

/// Which family a folder holds, from the files it has: one `.gguf` file
/// is a generation model, otherwise the named files decide.
pub fn detect_family(names: &[String]) -> anyhow::Result<ModelFamily> {
    let ggufs: Vec<&String> = names.iter().filter(|n| is_gguf(n)).collect();
    match ggufs.len() {
        0 => {}
        1 => return Ok(ModelFamily::LlmGeneration),
        _ => bail!(
            "the folder holds {} .gguf files ({}); a generation model is exactly one: push the file itself",
            ggufs.len(),
            ggufs
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    let mut wants = Vec::new();
    // Families known by their files' names (a GGUF file is known above).
    for family in ModelFamily::ALL
        .into_iter()
        .filter(|f| !f.required_files().is_empty())
    {
        let missing: Vec<&str> = family
            .required_files()
            .iter()
            .copied()
            .filter(|f| !names.iter().any(|n| n == f))
            .collect();
        if missing.is_empty() {
            return Ok(family);
        }
        wants.push(format!(
            "a {family} model needs {} (missing: {})",
            family.required_files().join(", "),
            missing.join(", ")
        ));
    }
    wants.push("an llm-generation model is one .gguf file".into());
    bail!("not a model folder Minions knows: {}", wants.join("; "))
}

fn is_gguf(name: &str) -> bool {
    Path::new(name)
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
}

/// The file's size and SHA-256, and with `chunked` the SHA-256 of each
/// [`MODEL_CHUNK_BYTES`] piece (for a group's stage to fetch only some).
fn hash_file(path: &Path, chunked: bool) -> anyhow::Result<(u64, String, Vec<String>)> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut f = std::io::BufReader::with_capacity(1 << 20, f);
    let mut whole = Sha256::new();
    let mut chunks = Vec::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut piece = Sha256::new();
        let mut got = 0u64;
        while got < MODEL_CHUNK_BYTES {
            let want = (MODEL_CHUNK_BYTES - got).min(buf.len() as u64) as usize;
            let r = f
                .read(&mut buf[..want])
                .with_context(|| format!("cannot read {}", path.display()))?;
            if r == 0 {
                break;
            }
            whole.update(&buf[..r]);
            piece.update(&buf[..r]);
            got += r as u64;
        }
        n += got;
        if got > 0 && chunked {
            chunks.push(hex::encode(piece.finalize()));
        }
        if got < MODEL_CHUNK_BYTES {
            break;
        }
    }
    Ok((n, hex::encode(whole.finalize()), chunks))
}

/// Runs `minions model push`; prints the model hash on stdout.
pub async fn push(endpoints: &Endpoints, args: ModelPushArgs) -> anyhow::Result<ModelRecord> {
    let name = ModelName::new(&args.name).context("--name")?;
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
    // A single file (a GGUF model) is pushed as a folder holding it alone.
    let (dir, only) = if args.dir.is_file() {
        let name = args
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .with_context(|| format!("{} has no file name", args.dir.display()))?;
        let parent = args
            .dir
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(Path::new("."))
            .to_owned();
        (parent, Some(name))
    } else {
        (args.dir.clone(), None)
    };
    let entries = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read model folder {}", dir.display()))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with('.') || !entry.file_type()?.is_file() {
            continue;
        }
        if only.as_ref().is_some_and(|o| *o != file_name) {
            continue;
        }
        if !keys::valid_model_file_name(&file_name) {
            tracing::warn!(file = %file_name, "skipping file with a name outside letters, digits, '.', '-', '_'");
            continue;
        }
        names.push(file_name);
    }
    names.sort();
    let family = detect_family(&names).with_context(|| format!("{}", args.dir.display()))?;
    let mut context = None;
    let mut layers = None;
    if family == ModelFamily::LlmGeneration {
        // A generation model is one GGUF file; the rest of a folder stays home.
        names.retain(|n| is_gguf(n));
        let path = dir.join(&names[0]);
        let summary = tokio::task::spawn_blocking(move || minions_engine::llm::inspect(&path))
            .await?
            .map_err(anyhow::Error::new)
            .context("the model cannot be pushed")?;
        tracing::info!(arch = %summary.arch, context = summary.context, vocab = summary.vocab,
            chat_template = summary.chat_template, "GGUF model checked");
        context = Some(u32::try_from(summary.context).unwrap_or(u32::MAX));
        layers = Some(u32::try_from(summary.layers).unwrap_or(u32::MAX));
    }
    if family == ModelFamily::WhisperSpeech {
        let d = dir.clone();
        let summary =
            tokio::task::spawn_blocking(move || minions_engine::speech::SpeechModel::inspect(&d))
                .await?
                .map_err(anyhow::Error::new)
                .context("the model cannot be pushed")?;
        tracing::info!(
            width = summary.dims.d_model,
            encoder_layers = summary.dims.encoder_layers,
            decoder_layers = summary.dims.decoder_layers,
            vocab = summary.dims.vocab,
            languages = summary.languages,
            "Whisper model checked"
        );
    }
    let mut files = Vec::new();
    for n in &names {
        let path = dir.join(n);
        let chunked = is_gguf(n);
        let (bytes, sha256, chunks) =
            tokio::task::spawn_blocking(move || hash_file(&path, chunked)).await??;
        files.push(ModelFile {
            name: n.clone(),
            bytes,
            sha256,
            chunks,
        });
    }
    let manifest = ModelManifest {
        v: SCHEMA_VERSION,
        family,
        files,
    };
    let hash = manifest.content_hash()?;
    let mut uploaded = 0u64;
    for f in &manifest.files {
        let key = StorePath::from(keys::model_file(&hash, &f.name));
        if let Ok(meta) = store.head(&key).await
            && meta.size == f.bytes
        {
            continue;
        }
        tracing::info!(file = %f.name, bytes = f.bytes, "uploading");
        let mut src = tokio::fs::File::open(dir.join(&f.name)).await?;
        let mut dst = BufWriter::new(store.clone(), key.clone());
        tokio::io::copy(&mut src, &mut dst)
            .await
            .with_context(|| format!("uploading {key}"))?;
        dst.shutdown()
            .await
            .with_context(|| format!("uploading {key}"))?;
        uploaded += f.bytes;
    }
    let manifest_key = StorePath::from(keys::model_manifest(&hash));
    store
        .put(&manifest_key, encode("model manifest", &manifest)?.into())
        .await?;
    let record = ModelRecord {
        v: SCHEMA_VERSION,
        name: name.clone(),
        hash: hash.clone(),
        family,
        bytes: manifest.total_bytes(),
        pushed_ms: now_ms(),
        context,
        layers,
    };
    store
        .put(
            &StorePath::from(keys::model_name(&name)),
            encode("model record", &record)?.into(),
        )
        .await?;
    tracing::info!(name = %name, hash = %hash, family = %family, files = manifest.files.len(),
        bytes = record.bytes, uploaded, "model pushed");
    Ok(record)
}

/// Runs `minions model list`, returning the lines to print.
pub async fn list(endpoints: &Endpoints, args: &ModelListArgs) -> anyhow::Result<String> {
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
    let records = model_records(store.as_ref()).await?;
    if args.json {
        let v: Vec<_> = records
            .iter()
            .map(|r| {
                serde_json::json!({"name": r.name.as_str(), "hash": r.hash.as_str(),
                    "family": r.family.as_str(), "bytes": r.bytes, "pushed_ms": r.pushed_ms})
            })
            .collect();
        return Ok(serde_json::to_string_pretty(&v)?);
    }
    if records.is_empty() {
        return Ok(
            "no models in the store; push one with `minions model push DIR --name NAME`".into(),
        );
    }
    let mut out = format!(
        "{:<24} {:<16} {:<14} {:>10}\n",
        "NAME", "FAMILY", "HASH", "SIZE"
    );
    for r in records {
        out.push_str(&format!(
            "{:<24} {:<16} {:<14} {:>7.1} MB\n",
            r.name.as_str(),
            r.family.as_str(),
            r.hash.short(),
            r.bytes as f64 / 1e6
        ));
    }
    Ok(out.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gguf_file_is_a_generation_model() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(matches!(
            detect_family(&names(&["README.md", "m.Q4_1.gguf"])),
            Ok(ModelFamily::LlmGeneration)
        ));
        let err = detect_family(&names(&["a.gguf", "b.GGUF"]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("2 .gguf files"), "{err}");
        let err = detect_family(&names(&["README.md"]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(".gguf"), "{err}");
    }

    #[test]
    fn detects_whisper_folders() {
        let names: Vec<String> = [
            "config.json",
            "model.bin",
            "tokenizer.json",
            "vocabulary.txt",
        ]
        .map(String::from)
        .to_vec();
        assert!(matches!(
            detect_family(&names),
            Ok(ModelFamily::WhisperSpeech)
        ));
        let err = detect_family(&names[..3])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("missing: vocabulary.txt"), "{err}");
    }

    #[test]
    fn detects_bert_and_names_missing_files() {
        let all: Vec<String> = ModelFamily::BertEmbedding
            .required_files()
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert!(matches!(
            detect_family(&all),
            Ok(ModelFamily::BertEmbedding)
        ));
        let err = detect_family(&all[..1])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("tokenizer.json") && err.contains("model.safetensors"),
            "{err}"
        );
    }
}
