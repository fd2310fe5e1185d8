//! A group stage's slice of a model's GGUF file: only the pieces
//! ([`MODEL_CHUNK_BYTES`] each) that hold the header, the tensors outside
//! the layers and the stage's own layers are fetched, by ranged reads,
//! each checked against the manifest's hash of it, into a sparse file
//! beside the cached whole files (`<file>.slice`). A piece already there
//! and still matching its hash is not fetched again.

use std::collections::BTreeSet;
use std::ops::Range;
use std::os::unix::fs::FileExt as _;

use minions_engine::llm::GgufPieces;
use minions_engine::llm::gguf_slice::GgufLayout;
use minions_schemas::messages::{MODEL_CHUNK_BYTES, ModelFile};

use super::*;

/// Pieces fetched at once.
const AT_ONCE: usize = 4;

impl ModelCache {
    /// The GGUF file of generation model `hash` holding what a stage of
    /// `layers` reads: the whole file where it is cached here (or the
    /// model was pushed without piece hashes), else this stage's slice.
    pub async fn stage_pieces(
        &self,
        hash: &ModelHash,
        layers: Range<usize>,
    ) -> Result<GgufPieces, ModelError> {
        let manifest = self.fetch_manifest(hash).await?;
        let bad = |reason: String| ModelError::Invalid {
            family: "llm-generation",
            reason,
        };
        let file = manifest
            .files
            .iter()
            .find(|f| f.name.to_ascii_lowercase().ends_with(".gguf"))
            .ok_or_else(|| bad(format!("model {} holds no GGUF file", hash.short())))?;
        if !keys::valid_model_file_name(&file.name) {
            return Err(bad(format!("manifest names a file {:?}", file.name)));
        }
        let dir = self.dir.join(hash.as_str());
        let whole = dir.join(&file.name);
        let cached = tokio::fs::metadata(&whole)
            .await
            .is_ok_and(|m| m.len() == file.bytes);
        if file.chunks.is_empty() || cached {
            let dir = self.fetch_files(hash, &manifest).await?;
            return Ok(GgufPieces::whole(dir.join(&file.name)));
        }
        if !file.chunks_agree() {
            return Err(bad(format!(
                "model {}: {} piece hashes for a file of {} bytes",
                hash.short(),
                file.chunks.len(),
                file.bytes
            )));
        }
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(cache_err(&dir))?;
        let path = dir.join(format!("{}.slice", file.name));
        let slice = Slice::open(&path, file.bytes)?;
        let mut fetched = 0u64;
        // The header: pieces from the start, one more each time, until it
        // reads whole.
        let mut k = 0u64;
        let layout = loop {
            fetched += self.ensure(hash, file, &slice, BTreeSet::from([k])).await?;
            k += 1;
            let end = (k * MODEL_CHUNK_BYTES).min(file.bytes);
            let prefix = slice.read(0..end)?;
            if let Some(l) = GgufLayout::read(&prefix, file.bytes)? {
                break l;
            }
        };
        let ranges = layout.stage_ranges(layers.clone());
        let pieces: BTreeSet<u64> = ranges
            .iter()
            .filter(|r| !r.is_empty())
            .flat_map(|r| r.start / MODEL_CHUNK_BYTES..=(r.end - 1) / MODEL_CHUNK_BYTES)
            .collect();
        let wanted = pieces.len();
        // The header's pieces are checked already.
        let rest = pieces.into_iter().filter(|&i| i >= k).collect();
        fetched += self.ensure(hash, file, &slice, rest).await?;
        tracing::info!(model = hash.short(), layers = ?layers, pieces = wanted,
            of = file.chunks.len(), fetched, "a stage's slice of the model is ready");
        Ok(GgufPieces {
            path,
            present: Some(ranges),
        })
    }

    /// Makes `pieces` of `slice` hold what `file`'s hashes say, fetching
    /// those that do not; returns how many were fetched.
    async fn ensure(
        &self,
        hash: &ModelHash,
        file: &ModelFile,
        slice: &Slice,
        pieces: BTreeSet<u64>,
    ) -> Result<u64, ModelError> {
        let mut missing = Vec::new();
        for i in pieces {
            let have = slice.read(piece_range(i, file.bytes))?;
            let want = file.chunks.get(i as usize).map(String::as_str);
            if want != Some(hex::encode(Sha256::digest(&have)).as_str()) {
                missing.push(i);
            }
        }
        let key = StorePath::from(keys::model_file(hash, &file.name));
        let n = missing.len() as u64;
        let fetch = missing.into_iter().map(|i| {
            let key = key.clone();
            async move {
                let r = piece_range(i, file.bytes);
                let bytes = match self.store.get_range(&key, r.clone()).await {
                    Ok(b) => b,
                    Err(object_store::Error::NotFound { .. }) => {
                        return Err(ModelError::Invalid {
                            family: "any",
                            reason: format!(
                                "model {} lacks file {} in the store",
                                hash.short(),
                                file.name
                            ),
                        });
                    }
                    Err(e) => return Err(store_err(e)),
                };
                let found = hex::encode(Sha256::digest(&bytes));
                let expected = file.chunks.get(i as usize).cloned().unwrap_or_default();
                if bytes.len() as u64 != r.end - r.start || found != expected {
                    return Err(ModelError::HashMismatch {
                        hash: hash.clone(),
                        what: format!("{} piece {i}", file.name),
                        expected,
                        found,
                    });
                }
                slice.write(r.start, &bytes)
            }
        });
        let mut done = futures::stream::iter(fetch).buffer_unordered(AT_ONCE);
        while let Some(r) = done.next().await {
            r?;
        }
        Ok(n)
    }
}

/// Bytes of piece `i` of a file of `len` bytes.
fn piece_range(i: u64, len: u64) -> Range<u64> {
    let start = i * MODEL_CHUNK_BYTES;
    start..(start + MODEL_CHUNK_BYTES).min(len)
}

/// The sparse file a slice is kept in: as long as the whole file, zeros
/// where no piece was fetched.
struct Slice {
    path: PathBuf,
    file: std::fs::File,
}

impl Slice {
    fn open(path: &Path, len: u64) -> Result<Self, ModelError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(cache_err(path))?;
        let now = file.metadata().map_err(cache_err(path))?.len();
        if now != len {
            file.set_len(len).map_err(cache_err(path))?;
        }
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    fn read(&self, r: Range<u64>) -> Result<Vec<u8>, ModelError> {
        let mut buf = vec![0u8; (r.end - r.start) as usize];
        self.file
            .read_exact_at(&mut buf, r.start)
            .map_err(cache_err(&self.path))?;
        Ok(buf)
    }

    fn write(&self, at: u64, bytes: &[u8]) -> Result<(), ModelError> {
        self.file
            .write_all_at(bytes, at)
            .map_err(cache_err(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    use minions_engine::llm::GgufFile;
    use minions_schemas::messages::ModelFamily;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A GGUF file of eight 8 MiB blocks (`blk.N.w`, all N) between a
    /// small embedding and output norm, pushed as a model with piece
    /// hashes to a store in `root`.
    async fn push(
        root: &Path,
    ) -> Result<(Arc<dyn ObjectStore>, ModelHash, Vec<u8>), Box<dyn std::error::Error>> {
        let q = |v: f32, n: usize| -> candle_core::Result<QTensor> {
            QTensor::quantize(&Tensor::full(v, (n,), &Device::Cpu)?, GgmlDType::F32)
        };
        let mut tensors = vec![("token_embd.weight".to_owned(), q(-1.0, 64)?)];
        for b in 0..8 {
            tensors.push((format!("blk.{b}.w"), q(b as f32, 2 << 20)?));
        }
        tensors.push(("output_norm.weight".to_owned(), q(9.0, 64)?));
        let arch = Value::String("llama".into());
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut gguf = std::io::Cursor::new(Vec::new());
        gguf_file::write(&mut gguf, &[("general.architecture", &arch)], &refs)?;
        let data = gguf.into_inner();
        let manifest = ModelManifest {
            v: minions_schemas::SCHEMA_VERSION,
            family: ModelFamily::LlmGeneration,
            files: vec![ModelFile {
                name: "m.gguf".into(),
                bytes: data.len() as u64,
                sha256: hex::encode(Sha256::digest(&data)),
                chunks: data
                    .chunks(MODEL_CHUNK_BYTES as usize)
                    .map(|c| hex::encode(Sha256::digest(c)))
                    .collect(),
            }],
        };
        let hash = manifest.content_hash()?;
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(root)?);
        let bytes = minions_schemas::encode("model manifest", &manifest)?;
        store
            .put(&StorePath::from(keys::model_manifest(&hash)), bytes.into())
            .await?;
        store
            .put(
                &StorePath::from(keys::model_file(&hash, "m.gguf")),
                data.clone().into(),
            )
            .await?;
        Ok((store, hash, data))
    }

    #[tokio::test]
    async fn a_stage_fetches_only_its_pieces_and_reads_no_tensor_outside_them() -> TestResult {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("store");
        std::fs::create_dir_all(&root)?;
        let (store, hash, data) = push(&root).await?;
        let cache = ModelCache::new(store, tmp.path().join("cache"), Device::Cpu, 1);
        let pieces = cache.stage_pieces(&hash, 6..7).await?;
        assert!(pieces.path.display().to_string().ends_with("m.gguf.slice"));
        // Pieces 1 and 2 hold only blocks 0 to 5: never fetched.
        let on_disk = std::fs::read(&pieces.path)?;
        assert_eq!(on_disk.len(), data.len());
        let piece = |i: u64| piece_range(i, data.len() as u64);
        for i in [1, 2] {
            let r = piece(i);
            assert!(
                on_disk[r.start as usize..r.end as usize]
                    .iter()
                    .all(|&b| b == 0),
                "piece {i} was fetched"
            );
        }
        let r = piece(3);
        assert_eq!(
            on_disk[r.start as usize..r.end as usize],
            data[r.start as usize..r.end as usize]
        );
        let mut file = GgufFile::open_pieces(&pieces)?;
        let w = file
            .tensor("blk.6.w", &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        assert_eq!(w.flatten_all()?.max(0)?.to_scalar::<f32>()?, 6.0);
        assert!(file.tensor("output_norm.weight", &Device::Cpu).is_ok());
        let refused = file
            .tensor("blk.1.w", &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("not in this stage's slice"), "{refused}");

        // A piece changed in the store is refused (blocks 4 and 5 lie in
        // piece 2, not fetched yet); one damaged on disk is fetched again.
        let tampered = {
            let mut d = data.clone();
            d[piece(2).start as usize + 10] ^= 1;
            d
        };
        std::fs::write(root.join(keys::model_file(&hash, "m.gguf")), &tampered)?;
        let err = cache
            .stage_pieces(&hash, 4..5)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("piece 2"), "{err}");
        std::fs::write(root.join(keys::model_file(&hash, "m.gguf")), &data)?;
        let slice = std::fs::OpenOptions::new().write(true).open(&pieces.path)?;
        slice.write_all_at(b"damage", piece(3).start + 100)?;
        let again = cache.stage_pieces(&hash, 6..7).await?;
        let mut file = GgufFile::open_pieces(&again)?;
        let w = file
            .tensor("blk.6.w", &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        assert_eq!(w.flatten_all()?.min(0)?.to_scalar::<f32>()?, 6.0);
        Ok(())
    }

    #[test]
    fn pieces_cover_the_file_and_the_last_is_short() {
        let len = 2 * MODEL_CHUNK_BYTES + 5;
        assert_eq!(piece_range(0, len), 0..MODEL_CHUNK_BYTES);
        assert_eq!(piece_range(2, len), 2 * MODEL_CHUNK_BYTES..len);
        assert_eq!(ModelFile::chunk_count(len), 3);
    }
}
