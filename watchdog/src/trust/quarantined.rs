//! Which machines are quarantined now, for the dashboard, `/metrics` and
//! the fleet JSON: the quarantine bucket read every few seconds into the
//! view (releases by an operator show as they happen).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use minions_schemas::messages::Quarantine;
use minions_schemas::{decode, limits, streams};
use tokio_util::sync::CancellationToken;

use crate::view::View;

/// Reads the quarantined machines (machine → reason); None when the bucket
/// cannot be read.
pub async fn read(js: &jetstream::Context) -> Option<BTreeMap<String, String>> {
    let kv = js.get_key_value(streams::QUARANTINE_BUCKET).await.ok()?;
    let mut keys = kv.keys().await.ok()?;
    let mut out = BTreeMap::new();
    while let Some(k) = keys.next().await {
        let Ok(k) = k else { return None };
        if let Ok(Some(bytes)) = kv.get(&k).await
            && let Ok(q) =
                decode::<Quarantine>("quarantine record", &bytes, limits::MAX_QUARANTINE_BYTES)
            && q.quarantined
        {
            out.insert(k, q.reason);
        }
    }
    Some(out)
}

/// Writes `record` under its machine; the error in words. A quarantine
/// is also put on record as an action when `on_record` is given.
pub async fn put(
    kv: &jetstream::kv::Store,
    record: &Quarantine,
    on_record: Option<&jetstream::Context>,
) -> Result<(), String> {
    let bytes = minions_schemas::encode("quarantine record", record).map_err(|e| e.to_string())?;
    kv.put(&record.machine, bytes.into())
        .await
        .map_err(|e| e.to_string())?;
    // A quarantine is an action on record too, under this watchdog's name
    // (best effort: the verdict stands either way).
    if record.quarantined
        && let Some(js) = on_record
        && let Err(e) = minions_endpoints::actions::record(
            js,
            &record.by,
            "watchdog",
            minions_schemas::messages::ActionKind::Quarantine,
            &record.machine,
            &record.reason,
        )
        .await
    {
        tracing::warn!(machine = %record.machine, error = %e, "the quarantine is not on record");
    }
    Ok(())
}

/// Keeps the view's quarantined machines current until `stop`.
pub async fn poll(
    js: jetstream::Context,
    view: Arc<View>,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        if let Some(q) = read(&js).await {
            view.set_quarantined(q);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
