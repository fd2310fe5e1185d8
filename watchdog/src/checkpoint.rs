//! Checkpoints of the watchdog's folded event state, so that a restart reads
//! only the tail of the events stream instead of all of it (thirty days of
//! events: millions at a company's scale).
//!
//! A checkpoint holds the [`Tracker`]'s state and the view's jobs (progress,
//! counters, histories) after every event up to one events-stream sequence,
//! with that sequence. A watchdog loads the newest usable one, restores it
//! and follows the stream from the next sequence on.
//!
//! Where: in the object store, under [`keys::WATCHDOG_CHECKPOINTS`], one
//! object per sequence. The state grows with the shards of open jobs (tens
//! of bytes a shard; a finished job's detail leaves it once its manifest
//! is written, see [`crate::tracker`]), past NATS's 1 MB message limit,
//! while a store put of any size is atomic (the local store
//! renames a finished file into place, S3 publishes an object whole), so a
//! reader sees a whole checkpoint or none. Several watchdogs may write at
//! once: each writes the fold of a prefix of the same stream under that
//! prefix's sequence, so two writes of one key hold the same state, and
//! keys of different sequences never clash; the newest [`KEEP`] are kept.
//!
//! Format (version [`FORMAT`]): `MWCK`, the header's length (u32, big
//! endian), the [`Header`] (MessagePack), the body (MessagePack maps:
//! every record has named fields, so a field added later with a default
//! leaves it readable), then the SHA-256 of everything before it. The
//! header names the oldest format that can read it ([`Header::readable_from`]):
//! a later build that only adds fields keeps it at [`FORMAT`], and this
//! build reads what it writes; one that changes what a field means raises
//! it. A checkpoint that is truncated, corrupt, of a format this build
//! cannot read or of another schema version, past the stream's end (the
//! stream was recreated) or of another stream (its creation time differs)
//! is skipped with a warning for the next older one, then for a full replay:
//! a checkpoint either restores exactly the state it saved or is not used.

use std::time::Duration;

use futures::TryStreamExt;
use minions_schemas::{CodecError, SCHEMA_VERSION, decode, keys, limits};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::tracker::{RestoreError, SavedTracker, SavedTrackerRef, Tracker};
use crate::view::job_progress::{SavedJobs, SavedJobsRef};

/// The checkpoint format this build writes.
pub const FORMAT: u16 = 8;
/// The oldest format this build reads (6 and before saved shards as
/// positional tuples; 7 kept a shard's outcome and check rounds beside
/// the tracker's record instead of in its state machine).
pub const OLDEST_READ: u16 = 8;
/// The oldest reader format that can read what this build writes.
pub const READABLE_FROM: u16 = 8;
/// How many checkpoints are kept in the store (older ones are deleted after
/// a new one is written): a corrupt newest one falls back to the next.
pub const KEEP: usize = 3;
const MAGIC: &[u8; 4] = b"MWCK";
const DIGEST_BYTES: usize = 32;

/// What a checkpoint covers. Limit: [`limits::MAX_CHECKPOINT_HEADER_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Schema version.
    pub v: u16,
    /// Checkpoint format ([`FORMAT`]).
    pub format: u16,
    /// The oldest reader format that reads it ([`READABLE_FROM`]; absent:
    /// `format`).
    #[serde(default)]
    pub readable_from: Option<u16>,
    /// The last events-stream sequence folded: the state is that of every
    /// event up to and including it.
    pub seq: u64,
    /// The events stream's creation time, as the server reports it: a
    /// stream created again is another stream.
    pub stream_created: String,
    /// When it was written (ms since the epoch).
    pub written_ms: u64,
    /// The watchdog that wrote it.
    pub writer: String,
}

#[derive(Serialize)]
struct BodyRef<'a> {
    v: u16,
    tracker: SavedTrackerRef<'a>,
    view: SavedJobsRef<'a>,
}

/// The folded state a checkpoint holds.
/// Limit: [`limits::MAX_WATCHDOG_CHECKPOINT_BYTES`].
#[derive(Deserialize)]
pub struct Body {
    /// Schema version.
    pub v: u16,
    /// The tracker's part.
    pub tracker: SavedTracker,
    /// The view's jobs.
    pub view: SavedJobs,
}

/// A decoded checkpoint.
pub struct Checkpoint {
    /// What it covers.
    pub header: Header,
    /// The state.
    pub body: Body,
}

/// Why a checkpoint could not be written or used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] object_store::Error),
    /// The object is larger than any checkpoint may be.
    #[error("checkpoint is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        limit: usize,
    },
    /// It does not start as a checkpoint does.
    #[error("not a watchdog checkpoint (no MWCK mark)")]
    NotACheckpoint,
    /// It is shorter than its own framing says.
    #[error("checkpoint truncated: {0} bytes")]
    Truncated(usize),
    /// Its bytes are not those that were written.
    #[error("checkpoint corrupt: its SHA-256 does not match its contents")]
    Checksum,
    /// Its header or body does not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The thread that encoded it failed.
    #[error("encoding the checkpoint: {0}")]
    Encode(String),
    /// Another checkpoint format.
    #[error(
        "checkpoint format {found} (readable from format {readable_from}); this build reads formats {oldest} to {supported}"
    )]
    Format {
        /// The format found.
        found: u16,
        /// The oldest reader format the checkpoint says reads it.
        readable_from: u16,
        /// The oldest format this build reads.
        oldest: u16,
        /// The format this build writes.
        supported: u16,
    },
    /// The key names another sequence than the header.
    #[error("checkpoint key names sequence {key} but it covers {header}")]
    KeyMismatch {
        /// The key's sequence.
        key: u64,
        /// The header's.
        header: u64,
    },
    /// The state does not restore.
    #[error(transparent)]
    Restore(#[from] RestoreError),
}

/// The events stream as a watchdog finds it when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFacts {
    /// Its last sequence (0 when it never held a message).
    pub last_seq: u64,
    /// Its creation time, as the server reports it.
    pub created: String,
}

/// When to write checkpoints while events flow (and always once caught up
/// and on a clean stop, when anything was folded since the last one).
#[derive(Debug, Clone)]
pub struct CheckpointPolicy {
    /// Write none at all (every start replays the whole stream).
    pub disabled: bool,
    /// Write after this many events…
    pub every_events: u64,
    /// …but not more often than this (writing costs about a second per
    /// 100 MB of state, during which events wait).
    pub min_gap: Duration,
    /// Write after this long whenever any event was folded since the last.
    pub every: Duration,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self {
            disabled: false,
            every_events: 100_000,
            min_gap: Duration::from_secs(30),
            every: Duration::from_secs(300),
        }
    }
}

impl CheckpointPolicy {
    /// Whether a checkpoint is due, `events` folded and `since` elapsed
    /// since the last one (or the start).
    pub fn due(&self, events: u64, since: Duration) -> bool {
        !self.disabled
            && events > 0
            && (since >= self.every || (events >= self.every_events && since >= self.min_gap))
    }
}

/// A checkpoint's state copied out of the tracker and its view: open
/// jobs' detail and closed jobs' summaries (small: the state is bounded by
/// open work). The view's lock is held only while it is copied, so that
/// encoding and writing it hold up neither the dashboard nor the fold.
pub struct Snapshot {
    tracker: crate::tracker::TrackerCopy,
    view: crate::view::job_progress::JobsView,
}

impl Snapshot {
    /// The tracker's state and its view's jobs, now.
    pub fn of(tracker: &Tracker) -> Self {
        let view = tracker.view().jobs().clone();
        Self {
            tracker: tracker.copy(),
            view,
        }
    }

    /// Encodes it as a checkpoint of `header`.
    pub fn encode(&self, header: &Header) -> Result<Vec<u8>, CodecError> {
        let head = minions_schemas::encode("checkpoint header", header)?;
        let head_len = u32::try_from(head.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(64 * 1024);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&head_len.to_be_bytes());
        out.extend_from_slice(&head);
        let body = BodyRef {
            v: SCHEMA_VERSION,
            tracker: self.tracker.saved(),
            view: self.view.saved(),
        };
        rmp_serde::encode::write_named(&mut out, &body).map_err(|source| CodecError::Encode {
            what: "checkpoint",
            source,
        })?;
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        Ok(out)
    }
}

/// Encodes the tracker's state (and its view's jobs) as a checkpoint of
/// `header` ([`Snapshot::of`] then [`Snapshot::encode`]).
pub fn encode(tracker: &Tracker, header: &Header) -> Result<Vec<u8>, CodecError> {
    Snapshot::of(tracker).encode(header)
}

/// Decodes a checkpoint from untrusted `bytes`: framing, checksum, header,
/// format, body, in that order; each failure names its cause.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    if bytes.len() > limits::MAX_WATCHDOG_CHECKPOINT_BYTES {
        return Err(CheckpointError::TooLarge {
            size: bytes.len() as u64,
            limit: limits::MAX_WATCHDOG_CHECKPOINT_BYTES,
        });
    }
    if bytes.len() < MAGIC.len() + 4 + DIGEST_BYTES {
        return Err(if bytes.starts_with(MAGIC) || bytes.len() < MAGIC.len() {
            CheckpointError::Truncated(bytes.len())
        } else {
            CheckpointError::NotACheckpoint
        });
    }
    if !bytes.starts_with(MAGIC) {
        return Err(CheckpointError::NotACheckpoint);
    }
    let (content, digest) = bytes.split_at(bytes.len() - DIGEST_BYTES);
    if Sha256::digest(content).as_slice() != digest {
        return Err(CheckpointError::Checksum);
    }
    let mut len = [0u8; 4];
    len.copy_from_slice(&content[MAGIC.len()..MAGIC.len() + 4]);
    let head_len = usize::try_from(u32::from_be_bytes(len)).unwrap_or(usize::MAX);
    let rest = &content[MAGIC.len() + 4..];
    if head_len > rest.len() {
        return Err(CheckpointError::Truncated(bytes.len()));
    }
    let (head, body) = rest.split_at(head_len);
    let header: Header = decode(
        "checkpoint header",
        head,
        limits::MAX_CHECKPOINT_HEADER_BYTES,
    )?;
    let readable_from = header.readable_from.unwrap_or(header.format);
    if header.format < OLDEST_READ || readable_from > FORMAT {
        return Err(CheckpointError::Format {
            found: header.format,
            readable_from,
            oldest: OLDEST_READ,
            supported: FORMAT,
        });
    }
    let body: Body = decode("checkpoint", body, limits::MAX_WATCHDOG_CHECKPOINT_BYTES)?;
    Ok(Checkpoint { header, body })
}

/// Writes a checkpoint of `snapshot` covering the events stream up to
/// `header.seq` (encoded on a blocking thread), then deletes all but the
/// newest [`KEEP`]. Returns its key and size.
pub async fn save(
    store: &dyn ObjectStore,
    snapshot: Snapshot,
    header: &Header,
) -> Result<(String, usize), CheckpointError> {
    let head = header.clone();
    let bytes = tokio::task::spawn_blocking(move || snapshot.encode(&head))
        .await
        .map_err(|e| CheckpointError::Encode(e.to_string()))??;
    let size = bytes.len();
    let key = keys::watchdog_checkpoint(header.seq);
    store
        .put(&StorePath::from(key.as_str()), PutPayload::from(bytes))
        .await?;
    if let Err(e) = prune(store).await {
        tracing::warn!(error = %e, "old checkpoints not deleted");
    }
    Ok((key, size))
}

/// Every checkpoint in the store as (sequence, key), newest first.
async fn list(store: &dyn ObjectStore) -> Result<Vec<(u64, StorePath)>, object_store::Error> {
    let prefix = StorePath::from(keys::WATCHDOG_CHECKPOINTS);
    let mut found: Vec<(u64, StorePath)> = store
        .list(Some(&prefix))
        .try_filter_map(|m| async move {
            Ok(keys::watchdog_checkpoint_seq(m.location.as_ref()).map(|seq| (seq, m.location)))
        })
        .try_collect()
        .await?;
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found)
}

async fn prune(store: &dyn ObjectStore) -> Result<(), object_store::Error> {
    for (_, key) in list(store).await?.into_iter().skip(KEEP) {
        match store.delete(&key).await {
            // Another watchdog pruned it first.
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads and decodes the checkpoint at `key`, which names sequence `seq`.
pub async fn read(
    store: &dyn ObjectStore,
    key: &StorePath,
    seq: u64,
) -> Result<Checkpoint, CheckpointError> {
    let got = store.get(key).await?;
    if got.meta.size > limits::MAX_WATCHDOG_CHECKPOINT_BYTES as u64 {
        return Err(CheckpointError::TooLarge {
            size: got.meta.size,
            limit: limits::MAX_WATCHDOG_CHECKPOINT_BYTES,
        });
    }
    let bytes = got.bytes().await?;
    let cp = decode_checkpoint(&bytes)?;
    if cp.header.seq != seq {
        return Err(CheckpointError::KeyMismatch {
            key: seq,
            header: cp.header.seq,
        });
    }
    Ok(cp)
}

/// Restores the newest usable checkpoint of the stream `facts` describes
/// into `tracker`; returns its header, or None (after a warning for each
/// checkpoint passed over) when the whole stream must be replayed.
pub async fn restore_newest(
    store: &dyn ObjectStore,
    facts: &StreamFacts,
    tracker: &mut Tracker,
) -> Option<Header> {
    let found = match list(store).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list checkpoints; replaying every event");
            return None;
        }
    };
    for (seq, key) in found {
        if seq > facts.last_seq {
            tracing::warn!(key = %key, seq, stream_last_seq = facts.last_seq,
                "checkpoint is past the end of the events stream (the stream was created again); ignored");
            continue;
        }
        let cp = match read(store, &key, seq).await {
            Ok(cp) => cp,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "checkpoint unusable; trying an older one");
                continue;
            }
        };
        if cp.header.stream_created != facts.created {
            tracing::warn!(key = %key, checkpoint_stream = %cp.header.stream_created, stream = %facts.created,
                "checkpoint is of another events stream (created at another time); ignored");
            continue;
        }
        let header = cp.header;
        if let Err(e) = tracker.restore(cp.body.tracker, cp.body.view) {
            tracing::warn!(key = %key, error = %e, "checkpoint does not restore; trying an older one");
            continue;
        }
        return Some(header);
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use minions_schemas::messages::{EventKind, JobManifest, ShardEvent};
    use minions_schemas::{JobId, WorkerId};
    use object_store::memory::InMemory;

    use super::*;
    use crate::registry::Registry;
    use crate::view::View;
    use crate::view::job_progress::fixtures::spec;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const JOBS: [&str; 3] = ["job-a", "job-b", "job-c"];
    const SHARDS: u32 = 6;

    /// A store holding the specs of [`JOBS`].
    async fn store() -> Result<Arc<dyn ObjectStore>, Box<dyn std::error::Error>> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        for j in JOBS {
            let s = spec(j, SHARDS, u64::from(SHARDS) * 10 - 5)?;
            store
                .put(
                    &StorePath::from(keys::job_spec(&s.job)),
                    minions_schemas::encode("job spec", &s)?.into(),
                )
                .await?;
        }
        Ok(store)
    }

    fn tracker(store: &Arc<dyn ObjectStore>) -> Tracker {
        let view = Arc::new(View::new("test".into(), Registry::new(3)));
        Tracker::offline(store.clone(), view)
    }

    fn event(job: &str, shard: u32, attempt: u64, at_ms: u64, kind: EventKind) -> ShardEvent {
        ShardEvent {
            energy: None,
            v: SCHEMA_VERSION,
            job: JobId::new(job).unwrap_or_else(|_| unreachable!()),
            shard,
            worker: WorkerId::new(format!("w-{}", at_ms % 4)).unwrap_or_else(|_| unreachable!()),
            host: format!("h{}", at_ms % 3),
            attempt,
            at_ms,
            kind,
        }
    }

    fn done(at_ms: u64) -> EventKind {
        EventKind::Done {
            rows: 10,
            output_bytes: 1,
            duration_ms: 100 + at_ms % 5000,
            compute_ms: 100,
            already_done: false,
            sha256: format!("{at_ms:064x}"),
            tokens: at_ms % 7,
            audio_ms: 0,
            made_by: None,
        }
    }

    /// A pseudo-random mix of every kind of event over [`JOBS`], most of
    /// them a shard's start then its end, minutes apart.
    fn events(n: usize) -> Vec<ShardEvent> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut out = Vec::new();
        for (i, j) in JOBS.iter().enumerate() {
            out.push(event(
                j,
                0,
                1,
                i as u64,
                EventKind::Submitted { shards: SHARDS },
            ));
        }
        for step in 0..n as u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let job = JOBS[(x % 3) as usize];
            let shard = ((x >> 8) % u64::from(SHARDS)) as u32;
            let attempt = 1 + (x >> 16) % 3;
            let at = 60_000 + step * 7_000;
            let kind = match (x >> 24) % 10 {
                0..=2 => EventKind::Started,
                3..=5 => done(at),
                6 => EventKind::HandedBack {
                    reason: "owner: input 0 s ago".into(),
                },
                7 => EventKind::Failed {
                    reason: "net".into(),
                    permanent: false,
                    stream_seq: None,
                },
                8 => EventKind::Failed {
                    reason: format!("bad input {step}"),
                    permanent: true,
                    stream_seq: None,
                },
                _ => EventKind::Progress {
                    records: 3,
                    tokens: 9,
                    audio_ms: 0,
                },
            };
            out.push(event(job, shard, attempt, at, kind));
        }
        out
    }

    fn header(seq: u64) -> Header {
        Header {
            v: SCHEMA_VERSION,
            format: FORMAT,
            readable_from: Some(READABLE_FROM),
            seq,
            stream_created: "2026-01-01 0:00:00.0 +00:00:00".into(),
            written_ms: 1,
            writer: "test".into(),
        }
    }

    fn facts(last_seq: u64) -> StreamFacts {
        StreamFacts {
            last_seq,
            created: header(0).stream_created,
        }
    }

    /// What the dashboard would show: every job's progress and the counters.
    fn shown(t: &Tracker) -> String {
        let s = t.view().snapshot();
        format!("{:?}\n{:?}\n{:?}", s.jobs, s.counters, s.history)
    }

    #[tokio::test]
    async fn checkpoint_and_tail_fold_as_a_full_replay() -> TestResult {
        let all = events(600);
        let full_store = store().await?;
        let mut full = tracker(&full_store);
        for e in &all {
            full.apply(e.clone()).await;
        }
        for cut in [0, 1, 57, 300, all.len()] {
            let store = store().await?;
            let mut before = tracker(&store);
            for e in &all[..cut] {
                before.apply(e.clone()).await;
            }
            save(store.as_ref(), Snapshot::of(&before), &header(cut as u64)).await?;
            let mut after = tracker(&store);
            let h = restore_newest(store.as_ref(), &facts(all.len() as u64), &mut after).await;
            assert_eq!(h.map(|h| h.seq), Some(cut as u64));
            after.resume().await;
            for e in &all[cut..] {
                after.apply(e.clone()).await;
            }
            let n = all.len() as u64;
            assert_eq!(
                encode(&after, &header(n))?,
                encode(&full, &header(n))?,
                "state differs after a checkpoint at event {cut}"
            );
            assert_eq!(shown(&after), shown(&full), "view differs (cut {cut})");
        }
        // The mix reached the outcomes the state keeps.
        let c = full.view().jobs().counters.clone();
        assert!(c.done > 0 && c.failed > 0 && c.handed_back > 0, "{c:?}");
        assert!(!full.saved().pending_dead.is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn format_round_trips_byte_for_byte() -> TestResult {
        let store = store().await?;
        let mut t = tracker(&store);
        for e in events(300) {
            t.apply(e).await;
        }
        let bytes = encode(&t, &header(303))?;
        let cp = decode_checkpoint(&bytes)?;
        assert_eq!(cp.header, header(303));
        let mut back = tracker(&store);
        back.restore(cp.body.tracker, cp.body.view)?;
        assert_eq!(encode(&back, &header(303))?, bytes);
        assert_eq!(shown(&back), shown(&t));
        Ok(())
    }

    #[tokio::test]
    async fn corrupt_checkpoints_are_refused_with_their_cause() -> TestResult {
        let store = store().await?;
        let mut t = tracker(&store);
        for e in events(100) {
            t.apply(e).await;
        }
        let good = encode(&t, &header(103))?;
        let why = |b: &[u8]| decode_checkpoint(b).err().map(|e| e.to_string());

        let mut flipped = good.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert_eq!(
            why(&flipped).as_deref(),
            Some("checkpoint corrupt: its SHA-256 does not match its contents")
        );
        assert_eq!(
            why(&good[..good.len() - 1000]).as_deref(),
            Some("checkpoint corrupt: its SHA-256 does not match its contents")
        );
        assert_eq!(
            why(&good[..10]).as_deref(),
            Some("checkpoint truncated: 10 bytes")
        );
        assert_eq!(
            why(b"{\"not\": \"a checkpoint at all, but long enough to look\"}").as_deref(),
            Some("not a watchdog checkpoint (no MWCK mark)")
        );
        // A well-framed checkpoint of a later format that this build
        // cannot read, and one of a format before the oldest it reads.
        let mut other = header(103);
        other.format = FORMAT + 1;
        other.readable_from = Some(FORMAT + 1);
        let other = encode(&t, &other)?;
        assert_eq!(
            why(&other),
            Some(format!(
                "checkpoint format {} (readable from format {}); this build reads formats {OLDEST_READ} to {FORMAT}",
                FORMAT + 1,
                FORMAT + 1
            ))
        );
        let mut old = header(103);
        old.format = OLDEST_READ - 1;
        old.readable_from = None;
        let old = encode(&t, &old)?;
        assert!(why(&old).is_some_and(|e| e.starts_with(&format!(
            "checkpoint format {} (readable from format {})",
            OLDEST_READ - 1,
            OLDEST_READ - 1
        ))));
        // A later format that says this build reads it (it only added
        // fields) is read.
        let mut later = header(103);
        later.format = FORMAT + 1;
        later.readable_from = Some(FORMAT);
        assert_eq!(why(&encode(&t, &later)?), None);
        // A header length past the end, with a valid checksum.
        let mut lying = good[..good.len() - DIGEST_BYTES].to_vec();
        lying[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        let digest = Sha256::digest(&lying);
        lying.extend_from_slice(&digest);
        assert!(why(&lying).is_some_and(|e| e.starts_with("checkpoint truncated")));
        Ok(())
    }

    #[tokio::test]
    async fn a_bad_or_foreign_checkpoint_falls_back_to_an_older_one() -> TestResult {
        let store = store().await?;
        let all = events(200);
        let mut t = tracker(&store);
        for (i, e) in all.iter().enumerate() {
            t.apply(e.clone()).await;
            if i == 99 {
                save(store.as_ref(), Snapshot::of(&t), &header(100)).await?;
            }
        }
        save(store.as_ref(), Snapshot::of(&t), &header(150)).await?;
        save(store.as_ref(), Snapshot::of(&t), &header(180)).await?;
        // The newest is corrupt, the next past the stream's end.
        let newest = StorePath::from(keys::watchdog_checkpoint(180));
        let mut bytes = store.get(&newest).await?.bytes().await?.to_vec();
        bytes[20] ^= 1;
        store.put(&newest, bytes.into()).await?;
        let mut r = tracker(&store);
        let h = restore_newest(store.as_ref(), &facts(120), &mut r).await;
        assert_eq!(h.map(|h| h.seq), Some(100));
        // Another stream (created at another time): none is used.
        let mut other = facts(1000);
        other.created = "another time".into();
        let mut r = tracker(&store);
        assert!(
            restore_newest(store.as_ref(), &other, &mut r)
                .await
                .is_none()
        );
        assert_eq!(r.saved().open_jobs(), 0);
        // Only the newest KEEP are kept.
        save(store.as_ref(), Snapshot::of(&t), &header(190)).await?;
        let seqs: Vec<u64> = list(store.as_ref())
            .await?
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(seqs, vec![190, 180, 150]);
        Ok(())
    }

    #[tokio::test]
    async fn manifests_are_written_once_across_a_restart() -> TestResult {
        let store = store().await?;
        let manifest = |job: &str| {
            StorePath::from(keys::job_manifest(
                &JobId::new(job).unwrap_or_else(|_| unreachable!()),
            ))
        };
        let mut t = tracker(&store);
        // job-a completes before the checkpoint.
        for s in 0..SHARDS {
            t.apply(event("job-a", s, 1, 1000, EventKind::Started))
                .await;
            t.apply(event("job-a", s, 1, 2000, done(2000))).await;
        }
        t.apply(event("job-b", 0, 1, 3000, done(3000))).await;
        assert!(store.head(&manifest("job-a")).await.is_ok());
        save(store.as_ref(), Snapshot::of(&t), &header(13)).await?;
        // Remove job-a's manifest: a resumed watchdog must not write it
        // again (it knows it wrote it), whatever events of job-a follow.
        store.delete(&manifest("job-a")).await?;
        let mut r = tracker(&store);
        assert!(
            restore_newest(store.as_ref(), &facts(13), &mut r)
                .await
                .is_some()
        );
        r.resume().await;
        r.apply(event("job-a", 2, 2, 4000, done(4000))).await;
        assert!(store.head(&manifest("job-a")).await.is_err());
        // job-b completes in the tail: its manifest is written.
        for s in 1..SHARDS {
            r.apply(event("job-b", s, 1, 5000, done(5000))).await;
        }
        let got = store.get(&manifest("job-b")).await?.bytes().await?;
        let m: JobManifest = decode("job manifest", &got, 1 << 20)?;
        assert_eq!((m.done, m.failed), (SHARDS, 0));
        Ok(())
    }

    #[tokio::test]
    async fn an_unwritten_manifest_is_written_on_resume() -> TestResult {
        let store = store().await?;
        let mut t = tracker(&store);
        for s in 0..SHARDS {
            t.apply(event("job-c", s, 1, 2000, done(2000))).await;
        }
        // Written, the job closed; opened again to build the state of a
        // store that refused its manifest: complete, open, unwritten.
        assert!(t.reopen(&JobId::new("job-c")?).await);
        let bytes = encode(&t, &header(6))?;
        let mut cp = decode_checkpoint(&bytes)?;
        cp.body.tracker.forget_manifests();
        let key = StorePath::from(keys::job_manifest(&JobId::new("job-c")?));
        store.delete(&key).await?;
        let mut r = tracker(&store);
        r.restore(cp.body.tracker, cp.body.view)?;
        r.resume().await;
        assert!(store.head(&key).await.is_ok());
        Ok(())
    }

    #[test]
    fn policy_waits_for_events_and_time() {
        let p = CheckpointPolicy::default();
        assert!(!p.due(0, Duration::from_secs(3600)));
        assert!(p.due(1, p.every));
        assert!(!p.due(p.every_events, p.min_gap / 2));
        assert!(p.due(p.every_events, p.min_gap));
        assert!(!p.due(p.every_events - 1, p.min_gap));
        let off = CheckpointPolicy {
            disabled: true,
            ..Default::default()
        };
        assert!(!off.due(u64::MAX, Duration::MAX));
    }
}
