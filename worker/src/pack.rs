//! Embedding shards of one model packed into shared passes.
//!
//! A small embedding shard alone leaves most of a forward pass idle (a GPU
//! above all). A worker that holds several shards of one model runs their
//! texts through it together, up to the texts one pass takes
//! ([`Batching::max_texts`]). Each shard still gets only its own rows,
//! writes its own output and is acked alone.
//!
//! Invariants:
//! - One driver task at a time takes packs from the queue, each under the
//!   device permit, first come first served: a pack is the oldest queued
//!   shard and the later ones of the same loaded model and batching that
//!   fit beside it.
//! - A shard whose wait is dropped (hand-back, cancellation) leaves the
//!   queue; one already in a running pack is computed and its rows are
//!   dropped.
//! - A pack that fails is run again shard by shard, so that a shard's
//!   error (a permanent one terminates it) is only ever its own.
//! - While a pack runs and the queue has room for another shard of its
//!   model in the next pass (judged by the running pack's smallest shard),
//!   [`SharedRuns::room`] names the model, so that the worker's join slots
//!   pull its next shards. Shards as large as a pass never open it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use minions_schemas::ids::ModelHash;
use minions_schemas::messages::OutputPayload;
use tokio::sync::{Semaphore, oneshot};

use crate::error::ShardError;
use crate::model::{Batching, Model};
use crate::shared_run::SharedRuns;

/// One shard's share of a pack.
pub(crate) struct Packed {
    /// The shard's own rows.
    pub(crate) payload: OutputPayload,
    /// Its share of the pack's device time, by texts.
    pub(crate) compute_ms: u64,
}

/// The queue of embedding shards waiting for the device, and its driver.
pub(crate) struct Packer {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    compute: Arc<Semaphore>,
    runs: SharedRuns,
    /// Shards in one pack, at most (the worker's `--max-shards`).
    most: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Entry>,
    next_id: u64,
    /// A driver task is taking packs.
    driving: bool,
    /// The pack on the device, while one runs.
    running: Option<Running>,
}

/// What the room for the next pack is judged by.
struct Running {
    model: ModelHash,
    /// Texts a pass takes.
    max_texts: usize,
    /// Texts of the running pack's smallest shard: what the next shard of
    /// the model is expected to bring.
    shard_texts: usize,
}

/// A shard's texts, waiting in the queue.
struct Entry {
    id: u64,
    model_hash: ModelHash,
    model: Arc<dyn Model>,
    batching: Batching,
    texts: Vec<String>,
    /// The test-only pace: the device stays held at least this long.
    paced: Option<Duration>,
    tx: oneshot::Sender<Result<Packed, ShardError>>,
}

/// What a shard asks of the packer.
pub(crate) struct Request {
    /// The model's identity, for the join slots.
    pub(crate) model_hash: ModelHash,
    /// The loaded model; only shards of the same loaded model share a pack.
    pub(crate) model: Arc<dyn Model>,
    /// How the shard's passes are cut; only equal ones share a pack.
    pub(crate) batching: Batching,
    /// The shard's texts, in order.
    pub(crate) texts: Vec<String>,
    /// The test-only pace for this shard.
    pub(crate) paced: Option<Duration>,
}

/// A shard's place in the queue: its rows arrive on [`Waiting::result`];
/// dropping it takes the shard out of the queue.
pub(crate) struct Waiting {
    id: u64,
    inner: Arc<Inner>,
    rx: oneshot::Receiver<Result<Packed, ShardError>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Packer {
    /// An empty queue in front of the device that `compute` guards, whose
    /// packs hold at most `most` shards (1: each shard alone).
    pub(crate) fn new(compute: Arc<Semaphore>, runs: SharedRuns, most: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                compute,
                runs,
                most: most.max(1),
            }),
        }
    }

    /// Queues a shard's texts; starts the driver when none runs.
    pub(crate) fn queue(&self, request: Request) -> Waiting {
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.inner.state);
        let id = st.next_id;
        st.next_id += 1;
        st.queue.push_back(Entry {
            id,
            model_hash: request.model_hash,
            model: request.model,
            batching: request.batching,
            texts: request.texts,
            paced: request.paced,
            tx,
        });
        if !st.driving {
            st.driving = true;
            tokio::spawn(drive(self.inner.clone()));
        }
        drop(st);
        // Another model queued closes the room; the device goes to it next.
        reconsider(&self.inner);
        Waiting {
            id,
            inner: self.inner.clone(),
            rx,
        }
    }

    /// Opens the room for the running pack's model while the next pass has
    /// room for another of its shards; closes it otherwise. Called after a
    /// shard joined the queue and its pull's claim was let go.
    pub(crate) fn reconsider(&self) {
        reconsider(&self.inner);
    }
}

impl Waiting {
    /// The shard's rows once its pack has run.
    pub(crate) async fn result(mut self) -> Result<Packed, ShardError> {
        (&mut self.rx).await.unwrap_or(Err(ShardError::Stopping))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut st = lock(&self.inner.state);
        st.queue.retain(|e| e.id != self.id);
        drop(st);
        reconsider(&self.inner);
    }
}

/// The room while a pack runs (see [`Packer::reconsider`]); left alone
/// while none does. Decided under the queue's lock, so that a pack's end
/// (which closes the room) is never overtaken by a stale opening.
fn reconsider(inner: &Inner) {
    let st = lock(&inner.state);
    let Some(running) = &st.running else {
        return;
    };
    let mut queued = 0;
    let mut other = false;
    for e in &st.queue {
        if e.model_hash != running.model {
            // Another model waits: the device goes to it next.
            other = true;
            break;
        }
        queued += e.texts.len();
    }
    let room = queued + running.shard_texts <= running.max_texts;
    inner
        .runs
        .offer_room((!other && room).then(|| running.model.clone()));
}

/// Takes packs from the queue, one under the device permit at a time,
/// until the queue is empty.
async fn drive(inner: Arc<Inner>) {
    loop {
        {
            let mut st = lock(&inner.state);
            if st.queue.is_empty() {
                st.driving = false;
                return;
            }
        }
        let permit = inner
            .runs
            .waiting_for_device(inner.compute.clone().acquire_owned())
            .await;
        let taken = {
            let mut st = lock(&inner.state);
            let pack = take_pack(&mut st.queue, inner.most);
            match permit {
                Ok(p) if !pack.is_empty() => {
                    st.running = Some(Running {
                        model: pack[0].model_hash.clone(),
                        max_texts: pack[0].batching.max_texts,
                        shard_texts: pack.iter().map(|e| e.texts.len()).min().unwrap_or(1),
                    });
                    Some((pack, p))
                }
                // Every shard left while the pack waited for the device.
                Ok(_) => None,
                Err(_) => {
                    // The device is closed: the worker is ending, and the
                    // shards still queued are handed back.
                    for e in st.queue.drain(..).chain(pack) {
                        let _ = e.tx.send(Err(ShardError::Stopping));
                    }
                    st.driving = false;
                    return;
                }
            }
        };
        let Some((pack, permit)) = taken else {
            continue;
        };
        reconsider(&inner);
        run_pack(pack).await;
        {
            let mut st = lock(&inner.state);
            st.running = None;
            inner.runs.offer_room(None);
        }
        drop(permit);
    }
}

/// The oldest queued shard and the later ones of the same loaded model and
/// batching that fit beside it in one pass, `most` shards at most.
fn take_pack(queue: &mut VecDeque<Entry>, most: usize) -> Vec<Entry> {
    let Some(first) = queue.pop_front() else {
        return Vec::new();
    };
    let mut texts = first.texts.len();
    let mut pack = vec![first];
    let mut rest = VecDeque::with_capacity(queue.len());
    while let Some(e) = queue.pop_front() {
        let lead = &pack[0];
        let fits = pack.len() < most
            && std::ptr::addr_eq(Arc::as_ptr(&e.model), Arc::as_ptr(&lead.model))
            && e.batching == lead.batching
            && texts + e.texts.len() <= lead.batching.max_texts;
        if fits {
            texts += e.texts.len();
            pack.push(e);
        } else {
            rest.push_back(e);
        }
    }
    *queue = rest;
    pack
}

/// Runs a pack on a blocking thread and hands each shard its rows; a pack
/// that fails runs again shard by shard.
async fn run_pack(mut pack: Vec<Entry>) {
    let started = Instant::now();
    let counts: Vec<usize> = pack.iter().map(|e| e.texts.len()).collect();
    let model = pack[0].model.clone();
    let batching = pack[0].batching;
    let shards = pack.len();
    let results = if shards == 1 {
        // A shard alone: its texts go as they are, uncopied.
        let texts = std::mem::take(&mut pack[0].texts);
        vec![compute(&model, batching, texts).await]
    } else {
        let texts: Vec<Vec<String>> = pack
            .iter_mut()
            .map(|e| std::mem::take(&mut e.texts))
            .collect();
        match compute(&model, batching, texts.concat()).await {
            Ok(payload) => split(payload, &counts),
            Err(e) => {
                tracing::warn!(shards, error = %e, "embedding pack failed; running its shards one by one");
                let mut each = Vec::with_capacity(shards);
                for t in texts {
                    each.push(compute(&model, batching, t).await);
                }
                each
            }
        }
    };
    // The test-only pace holds the device as a slower machine would, until
    // every shard of the pack has stopped waiting.
    let paced: Option<Duration> = pack.iter().filter_map(|e| e.paced).reduce(|a, b| a + b);
    if let Some(at_least) = paced {
        let left = at_least.saturating_sub(started.elapsed());
        let all_gone = futures::future::join_all(pack.iter_mut().map(|e| e.tx.closed()));
        tokio::select! {
            _ = tokio::time::sleep(left) => {}
            _ = all_gone => {}
        }
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let total: usize = counts.iter().sum::<usize>().max(1);
    if shards > 1 {
        tracing::debug!(shards, texts = total, ms = elapsed_ms, "embedding pack ran");
    }
    for ((e, n), r) in pack.into_iter().zip(&counts).zip(results) {
        let r = r.map(|payload| Packed {
            payload,
            compute_ms: elapsed_ms * *n as u64 / total as u64,
        });
        let _ = e.tx.send(r);
    }
}

async fn compute(
    model: &Arc<dyn Model>,
    batching: Batching,
    texts: Vec<String>,
) -> Result<OutputPayload, ShardError> {
    let model = model.clone();
    tokio::task::spawn_blocking(move || model.run(&texts, batching))
        .await
        .map_err(|e| ShardError::Transient(format!("inference task failed: {e}")))?
        .map_err(ShardError::from)
}

/// Cuts a pack's rows into each shard's own (`counts` rows each), in order.
fn split(payload: OutputPayload, counts: &[usize]) -> Vec<Result<OutputPayload, ShardError>> {
    let rows: usize = counts.iter().sum();
    let OutputPayload::Embeddings { dim, data } = payload else {
        let e = ShardError::Permanent("an embedding model returned no embeddings".into());
        return counts.iter().map(|_| Err(e.clone())).collect();
    };
    let row_bytes = dim as usize * 4;
    if data.len() != rows * row_bytes {
        let e = ShardError::Transient(format!(
            "an embedding pack returned {} bytes for {rows} rows of {dim}",
            data.len()
        ));
        return counts.iter().map(|_| Err(e.clone())).collect();
    }
    let mut at = 0;
    counts
        .iter()
        .map(|n| {
            let end = at + n * row_bytes;
            let part = data[at..end].to_vec();
            at = end;
            Ok(OutputPayload::Embeddings { dim, data: part })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(n: usize, tag: &str) -> Vec<String> {
        (0..n).map(|i| format!("{tag}{i}")).collect()
    }

    /// A loaded model that is never run.
    struct Idle;

    impl Model for Idle {
        fn family(&self) -> minions_schemas::messages::ModelFamily {
            minions_schemas::messages::ModelFamily::BertEmbedding
        }
    }

    fn entry(
        id: u64,
        model: &Arc<dyn Model>,
        hash: &ModelHash,
        n: usize,
        max_texts: usize,
    ) -> Entry {
        let (tx, _) = oneshot::channel();
        Entry {
            id,
            model_hash: hash.clone(),
            model: model.clone(),
            batching: Batching {
                max_texts,
                max_tokens: 8192,
            },
            texts: texts(n, "t"),
            paced: None,
            tx,
        }
    }

    #[test]
    fn a_pack_takes_the_oldest_shard_and_the_later_ones_of_its_model_that_fit()
    -> Result<(), minions_schemas::ids::IdError> {
        let (a, b): (Arc<dyn Model>, Arc<dyn Model>) = (Arc::new(Idle), Arc::new(Idle));
        let (ha, hb) = (
            ModelHash::new("a".repeat(64))?,
            ModelHash::new("b".repeat(64))?,
        );
        let mut queue: VecDeque<Entry> = [
            entry(0, &a, &ha, 64, 128),
            entry(1, &b, &hb, 10, 128),
            entry(2, &a, &ha, 60, 128),
            entry(3, &a, &ha, 10, 128),
            entry(4, &a, &ha, 4, 128),
            entry(5, &a, &ha, 1, 64),
        ]
        .into();
        let ids = |q: &[Entry]| q.iter().map(|e| e.id).collect::<Vec<_>>();
        // 64 + 60 + 4 = 128 fit; 10 more would not; another model, or
        // the same one cut into other passes, waits.
        assert_eq!(ids(&take_pack(&mut queue, 4)), [0, 2, 4]);
        assert_eq!(ids(queue.make_contiguous()), [1, 3, 5]);
        assert_eq!(ids(&take_pack(&mut queue, 4)), [1]);
        assert_eq!(ids(&take_pack(&mut queue, 4)), [3]);
        assert_eq!(ids(&take_pack(&mut queue, 4)), [5]);
        assert!(take_pack(&mut queue, 4).is_empty());
        // At most `most` shards in a pack.
        let mut queue: VecDeque<Entry> = (0..4).map(|i| entry(i, &a, &ha, 1, 128)).collect();
        assert_eq!(ids(&take_pack(&mut queue, 3)), [0, 1, 2]);
        assert_eq!(ids(&take_pack(&mut queue, 1)), [3]);
        Ok(())
    }

    #[test]
    fn a_pack_is_cut_back_into_each_shards_rows_in_order() {
        let data: Vec<u8> = (0..6u8).flat_map(|r| [r; 8]).collect();
        let parts = split(OutputPayload::Embeddings { dim: 2, data }, &[2, 1, 3]);
        let rows: Vec<Vec<u8>> = parts
            .into_iter()
            .map(|p| match p {
                Ok(OutputPayload::Embeddings { dim: 2, data }) => data,
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(rows[0], [[0u8; 8], [1; 8]].concat());
        assert_eq!(rows[1], [2u8; 8]);
        assert_eq!(rows[2], [[3u8; 8], [4; 8], [5; 8]].concat());
    }

    #[test]
    fn a_pack_with_the_wrong_number_of_rows_fails_every_shard() {
        let parts = split(
            OutputPayload::Embeddings {
                dim: 2,
                data: vec![0; 16],
            },
            &[2, 1],
        );
        assert!(parts.iter().all(Result::is_err));
    }
}
