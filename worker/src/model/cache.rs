//! The worker's model cache: fetches a model's files from the store into a
//! local folder named by its hash, checks every file against the manifest,
//! loads each model once per process and keeps the most recently used warm.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::Device;
use futures::StreamExt;
use minions_schemas::messages::{ModelFamily, ModelManifest, Precision};
use minions_schemas::{ModelHash, keys, limits};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::OnceCell;

use super::{Model, ModelError};

mod slice;

/// A store failure while fetching a model.
fn store_err(e: object_store::Error) -> ModelError {
    ModelError::Store(Box::new(e))
}

type Slot = Arc<OnceCell<Arc<dyn Model>>>;

/// Fetches, verifies, loads and keeps models warm. Cheap to share behind an `Arc`.
pub struct ModelCache {
    store: Arc<dyn ObjectStore>,
    dir: PathBuf,
    device: Device,
    /// The code models run ([`minions_engine::EnginePath`]).
    path: minions_engine::EnginePath,
    keep_warm: usize,
    /// Loaded models by content and precision, least recently used first.
    loaded: Mutex<Vec<((ModelHash, Precision), Slot)>>,
    /// Most memory, MB, a model's files may take (the owner policy's cap).
    budget_mb: Option<u64>,
    /// Memory, MB, a generation model's key/value caches take beside it.
    kv_mb: u64,
}

fn cache_err(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Cache {
        path: path.display().to_string(),
        source,
    }
}

async fn sha256_file(path: &Path) -> Result<String, ModelError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&path).map_err(cache_err(&path))?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(cache_err(&path))?;
        Ok(hex::encode(h.finalize()))
    })
    .await
    .map_err(|e| ModelError::Cache {
        path: String::new(),
        source: std::io::Error::other(e),
    })?
}

impl ModelCache {
    /// A cache that keeps files under `dir` and at most `keep_warm` models
    /// loaded on `device`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        dir: PathBuf,
        device: Device,
        keep_warm: usize,
    ) -> Self {
        Self {
            store,
            dir,
            device,
            path: minions_engine::EnginePath::Fast,
            keep_warm: keep_warm.max(1),
            loaded: Mutex::new(Vec::new()),
            budget_mb: None,
            kv_mb: 0,
        }
    }

    /// Refuses models whose files exceed `budget_mb` (the memory this
    /// machine lends); such shards go back to the queue for a larger machine.
    pub fn with_budget_mb(mut self, budget_mb: Option<u64>) -> Self {
        self.budget_mb = budget_mb;
        self
    }

    /// Loads models to run the code `path` names (the fast path unless
    /// set).
    pub fn with_engine_path(mut self, path: minions_engine::EnginePath) -> Self {
        self.path = path;
        self
    }

    /// The code models run.
    pub fn engine_path(&self) -> minions_engine::EnginePath {
        self.path
    }

    /// Counts `kv_mb` of key/value-cache memory beside every generation
    /// model against the budget: a model fits only with room to generate.
    pub fn with_kv_mb(mut self, kv_mb: u64) -> Self {
        self.kv_mb = kv_mb;
        self
    }

    /// The device models are loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Returns the model `hash` loaded in `precision`, fetching and loading
    /// it on first use. Concurrent callers for the same model share one
    /// load; each precision is its own warm entry.
    pub async fn get(
        &self,
        hash: &ModelHash,
        family: ModelFamily,
        precision: Precision,
    ) -> Result<Arc<dyn Model>, ModelError> {
        // Our CPU kernels run f16 as f32: one warm copy serves both.
        let precision = self.path.runs_as(&self.device, precision);
        let slot = self.slot(hash, precision);
        let model = slot
            .get_or_try_init(|| async {
                let manifest = self.fetch_manifest(hash).await?;
                let mut needs_mb = manifest.total_bytes().div_ceil(1 << 20);
                if manifest.family.generates() {
                    needs_mb += self.kv_mb;
                }
                if let Some(budget_mb) = self.budget_mb
                    && needs_mb > budget_mb
                {
                    return Err(ModelError::TooLarge {
                        needs_mb,
                        budget_mb,
                    });
                }
                if manifest.family != family {
                    return Err(ModelError::Invalid {
                        family: family.as_str(),
                        reason: format!("model {} is a {} model", hash.short(), manifest.family),
                    });
                }
                let dir = self.fetch_files(hash, &manifest).await?;
                let (device, path) = (self.device.clone(), self.path);
                tracing::info!(model = hash.short(), family = %family, %precision, engine_path = %path, "loading model");
                let started = std::time::Instant::now();
                let model = tokio::task::spawn_blocking(move || {
                    minions_engine::load(family, &dir, &device, precision, path)
                })
                .await
                .map_err(|e| ModelError::Cache {
                    path: String::new(),
                    source: std::io::Error::other(e),
                })??;
                tracing::info!(
                    model = hash.short(),
                    ms = started.elapsed().as_millis() as u64,
                    "model loaded"
                );
                Ok::<_, ModelError>(model)
            })
            .await?;
        Ok(model.clone())
    }

    /// The models loaded now (any precision): a worker prefers jobs that
    /// run one of them.
    pub fn held(&self) -> std::collections::HashSet<ModelHash> {
        let loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        loaded
            .iter()
            .filter(|(_, slot)| slot.initialized())
            .map(|((hash, _), _)| hash.clone())
            .collect()
    }

    /// Drops every loaded model (their memory is freed once running shards
    /// let go of them); files stay cached on disk.
    pub fn release(&self) {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if !loaded.is_empty() {
            tracing::info!(models = loaded.len(), "models released from memory");
        }
        loaded.clear();
    }

    fn slot(&self, hash: &ModelHash, precision: Precision) -> Slot {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pos) = loaded
            .iter()
            .position(|((h, p), _)| h == hash && *p == precision)
        {
            let entry = loaded.remove(pos);
            let slot = entry.1.clone();
            loaded.push(entry);
            return slot;
        }
        let slot: Slot = Arc::new(OnceCell::new());
        loaded.push(((hash.clone(), precision), slot.clone()));
        while loaded.len() > self.keep_warm {
            let ((old, p), _) = loaded.remove(0);
            tracing::info!(model = old.short(), precision = %p, "model evicted from memory");
        }
        slot
    }

    async fn fetch_manifest(&self, hash: &ModelHash) -> Result<ModelManifest, ModelError> {
        let key = StorePath::from(keys::model_manifest(hash));
        let bytes = match self.store.get(&key).await {
            Ok(r) => {
                if r.meta.size > limits::MAX_MANIFEST_BYTES as u64 {
                    return Err(ModelError::Invalid {
                        family: "any",
                        reason: format!("manifest of {} is {} bytes", hash.short(), r.meta.size),
                    });
                }
                r.bytes().await.map_err(store_err)?
            }
            Err(object_store::Error::NotFound { .. }) => {
                return Err(ModelError::Unknown { hash: hash.clone() });
            }
            Err(e) => return Err(store_err(e)),
        };
        let manifest: ModelManifest =
            minions_schemas::decode("model manifest", &bytes, limits::MAX_MANIFEST_BYTES).map_err(
                |e| ModelError::Invalid {
                    family: "any",
                    reason: e.to_string(),
                },
            )?;
        let found = manifest.content_hash().map_err(|e| ModelError::Invalid {
            family: "any",
            reason: e.to_string(),
        })?;
        if &found != hash {
            return Err(ModelError::HashMismatch {
                hash: hash.clone(),
                what: "manifest".into(),
                expected: hash.to_string(),
                found: found.to_string(),
            });
        }
        Ok(manifest)
    }

    async fn fetch_files(
        &self,
        hash: &ModelHash,
        manifest: &ModelManifest,
    ) -> Result<PathBuf, ModelError> {
        let dir = self.dir.join(hash.as_str());
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(cache_err(&dir))?;
        for file in &manifest.files {
            if !keys::valid_model_file_name(&file.name) {
                return Err(ModelError::Invalid {
                    family: "any",
                    reason: format!("manifest names a file {:?}", file.name),
                });
            }
            let path = dir.join(&file.name);
            if let Ok(meta) = tokio::fs::metadata(&path).await {
                if meta.len() == file.bytes && sha256_file(&path).await? == file.sha256 {
                    continue;
                }
                tracing::warn!(path = %path.display(), "cached model file is stale or damaged; fetching again");
            }
            self.download(hash, &file.name, &file.sha256, &path).await?;
        }
        Ok(dir)
    }

    async fn download(
        &self,
        hash: &ModelHash,
        name: &str,
        sha256: &str,
        path: &Path,
    ) -> Result<(), ModelError> {
        let key = StorePath::from(keys::model_file(hash, name));
        let result = match self.store.get(&key).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(ModelError::Invalid {
                    family: "any",
                    reason: format!("model {} lacks file {name} in the store", hash.short()),
                });
            }
            Err(e) => return Err(store_err(e)),
        };
        let tmp = path.with_extension(format!("part-{}", std::process::id()));
        let mut out = tokio::fs::File::create(&tmp)
            .await
            .map_err(cache_err(&tmp))?;
        let mut hasher = Sha256::new();
        let mut stream = result.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(store_err)?;
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(cache_err(&tmp))?;
        }
        out.flush().await.map_err(cache_err(&tmp))?;
        drop(out);
        let found = hex::encode(hasher.finalize());
        if found != sha256 {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(ModelError::HashMismatch {
                hash: hash.clone(),
                what: name.to_owned(),
                expected: sha256.to_owned(),
                found,
            });
        }
        tokio::fs::rename(&tmp, path)
            .await
            .map_err(cache_err(path))?;
        tracing::info!(
            model = hash.short(),
            file = name,
            "model file fetched and verified"
        );
        Ok(())
    }
}
