//! Reading documents from the store with size limits and clear errors.

use anyhow::{Context, bail};
use futures::TryStreamExt;
use minions_schemas::messages::{JobSpec, ModelRecord};
use minions_schemas::{JobId, ModelName, decode, keys, limits};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::de::DeserializeOwned;

/// Reads and decodes the document at `key`; `Ok(None)` when it does not exist.
pub async fn get_doc<T: DeserializeOwned>(
    store: &dyn ObjectStore,
    key: &StorePath,
    what: &'static str,
    limit: usize,
) -> anyhow::Result<Option<T>> {
    let got = match store.get(key).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {key}")),
    };
    if got.meta.size > limit as u64 {
        bail!(
            "{key} is {} bytes; the limit for a {what} is {limit}",
            got.meta.size
        );
    }
    let bytes = got
        .bytes()
        .await
        .with_context(|| format!("reading {key}"))?;
    Ok(Some(
        decode(what, &bytes, limit).with_context(|| format!("{key}"))?,
    ))
}

/// A job's spec; an unknown job is an error that says so.
pub async fn job_spec(store: &dyn ObjectStore, job: &JobId) -> anyhow::Result<JobSpec> {
    let key = StorePath::from(keys::job_spec(job));
    get_doc(store, &key, "job spec", limits::MAX_SPEC_BYTES)
        .await?
        .with_context(|| format!("unknown job {job:?}: no job spec in this store"))
}

/// Every model name record in the store, sorted by name.
pub async fn model_records(store: &dyn ObjectStore) -> anyhow::Result<Vec<ModelRecord>> {
    let prefix = StorePath::from(keys::MODEL_NAMES);
    let metas: Vec<_> = store
        .list(Some(&prefix))
        .try_collect()
        .await
        .context("listing models")?;
    let mut out = Vec::new();
    for meta in metas {
        if let Some(r) = get_doc::<ModelRecord>(
            store,
            &meta.location,
            "model record",
            limits::MAX_MANIFEST_BYTES,
        )
        .await?
        {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Resolves a model name; an unknown name is an error that lists the known ones.
pub async fn model_record(
    store: &dyn ObjectStore,
    name: &ModelName,
) -> anyhow::Result<ModelRecord> {
    let key = StorePath::from(keys::model_name(name));
    if let Some(r) =
        get_doc::<ModelRecord>(store, &key, "model record", limits::MAX_MANIFEST_BYTES).await?
    {
        return Ok(r);
    }
    let known: Vec<String> = model_records(store)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.name.to_string())
        .collect();
    let known = if known.is_empty() {
        "the store has no models yet".to_owned()
    } else {
        format!("known models: {}", known.join(", "))
    };
    bail!("unknown model {name:?} ({known}); push it with `minions model push DIR --name {name}`")
}
