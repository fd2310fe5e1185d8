//! One running generation batch that shards of the same model join:
//! continuous batching across shards.
//!
//! The first generation shard to get the device starts a run on a blocking
//! thread; it holds the device (the compute permit) until nothing is left
//! in it. A later shard of the same model joins that run instead of waiting
//! for the device, and its records queue behind the run's own, so the batch
//! stays full while a shard's last sequences finish. Each shard (a
//! *member*) still gets only its own records' results, writes its own
//! output and is acked alone.
//!
//! Invariants:
//! - A run takes no new member once a shard of other work waits for the
//!   device, so that work gets it when the run drains; nor after its
//!   blocking thread has found nothing left (it is closed).
//! - A member that leaves (hand-back, cancellation) has its records dropped
//!   from the batch before the pass after it leaves; it is told [`Arrived::Out`]
//!   then, and the run goes on for the others. The last member to leave
//!   stops the run.
//! - [`SharedRuns::room`] names the run's model while it could take more
//!   sequences than its members fill, so that an extra pull brings in the
//!   next shard (the worker's join slots).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use minions_schemas::ids::ModelHash;
use minions_schemas::messages::{Generation, GenerationRecord};
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};

use crate::error::ShardError;
use crate::model::Model;
use crate::model::llm::{GenControl, GenLimits, Joining};

/// What a member hears from its run.
pub(crate) enum Arrived {
    /// Its record (index within its shard) finished.
    Done(usize, Generation),
    /// It left, and none of its records runs any more.
    Out,
    /// The run ended; an error ends every member that was still in it.
    Ended(Result<(), ShardError>),
}

/// The worker's generation runs: at most one at a time (it holds the
/// device), and what decides who may join it. Clones share them.
#[derive(Clone)]
pub(crate) struct SharedRuns {
    inner: Arc<Inner>,
}

struct Inner {
    current: Mutex<Option<Arc<Run>>>,
    /// Shards of other work waiting for the device.
    waiting: AtomicUsize,
    /// Extra pulls under way for the current run.
    claims: AtomicUsize,
    /// The running model while its run has room for another shard.
    room: watch::Sender<Option<ModelHash>>,
}

struct Run {
    model_hash: ModelHash,
    max_seqs: usize,
    joinable: bool,
    control: GenControl,
    /// A member left since the run's thread last looked.
    departed: AtomicBool,
    state: Mutex<RunState>,
    inner: Arc<Inner>,
}

#[derive(Default)]
struct RunState {
    /// Records of members that joined, not yet taken by the run.
    queue: Vec<(usize, GenerationRecord)>,
    /// The run's index of a record → (member, index within its shard).
    tickets: HashMap<usize, (u64, usize)>,
    next_ticket: usize,
    members: HashMap<u64, Member>,
    next_member: u64,
    /// The run's thread found nothing left; no one joins any more.
    closed: bool,
}

struct Member {
    tx: mpsc::UnboundedSender<Arrived>,
    /// Its records not yet finished.
    outstanding: usize,
    left: bool,
    told: bool,
}

/// A shard's part in a run: the results of its records arrive on `rx`;
/// dropping it (or [`Membership::leave`]) takes its records out.
pub(crate) struct Membership {
    id: u64,
    run: Arc<Run>,
    /// The member's results, then `Out` or `Ended`; closed once all of its
    /// records have finished.
    pub(crate) rx: mpsc::UnboundedReceiver<Arrived>,
    gone: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SharedRuns {
    /// No run yet.
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                current: Mutex::new(None),
                waiting: AtomicUsize::new(0),
                claims: AtomicUsize::new(0),
                room: watch::Sender::new(None),
            }),
        }
    }

    /// The running model while its run could take another shard's records.
    pub(crate) fn room(&self) -> watch::Receiver<Option<ModelHash>> {
        self.inner.room.subscribe()
    }

    /// Names `model` as having room for another shard, so that the join
    /// slots pull its jobs, while no other work waits for the device and
    /// no extra pull is under way; `None` closes the room. For work that
    /// shares the device other than a generation run (embedding packs).
    pub(crate) fn offer_room(&self, model: Option<ModelHash>) {
        let open = model.filter(|_| {
            self.inner.waiting.load(Ordering::SeqCst) == 0
                && self.inner.claims.load(Ordering::SeqCst) == 0
        });
        self.inner.room.send_if_modified(|r| {
            if *r == open {
                false
            } else {
                *r = open;
                true
            }
        });
    }

    /// Claims the room for one extra pull: no other extra pull starts until
    /// the claim is dropped (after its shard joined, or none came).
    pub(crate) fn claim(&self) -> Claim {
        self.inner.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.room.send_replace(None);
        Claim {
            inner: self.inner.clone(),
        }
    }

    /// Joins the open run of `model_hash` with `records` (each with its
    /// index within the shard); hands them back when no such run takes
    /// shards now.
    pub(crate) fn join(
        &self,
        model_hash: &ModelHash,
        records: Vec<(usize, GenerationRecord)>,
    ) -> Result<Membership, Vec<(usize, GenerationRecord)>> {
        if self.inner.waiting.load(Ordering::SeqCst) > 0 {
            return Err(records);
        }
        let Some(run) = lock(&self.inner.current).clone() else {
            return Err(records);
        };
        if !run.joinable || &run.model_hash != model_hash {
            return Err(records);
        }
        let mut st = lock(&run.state);
        // Closed, or its last member left and it is stopping.
        if st.closed || run.control.stop.load(Ordering::Relaxed) {
            return Err(records);
        }
        let (id, rx) = st.add_member();
        for (index, record) in records {
            let ticket = st.ticket(id, index);
            st.queue.push((ticket, record));
        }
        drop(st);
        // The queue is no longer empty: no room until the run takes it.
        self.inner.room.send_replace(None);
        Ok(Membership {
            id,
            run,
            rx,
            gone: AtomicBool::new(false),
        })
    }

    /// Counts a shard of other work waiting for the device while `f` runs:
    /// the current run takes no new member meanwhile.
    pub(crate) async fn waiting_for_device<T>(&self, f: impl Future<Output = T>) -> T {
        self.inner.waiting.fetch_add(1, Ordering::SeqCst);
        self.inner.room.send_replace(None);
        let out = f.await;
        self.inner.waiting.fetch_sub(1, Ordering::SeqCst);
        out
    }

    /// Starts a run of `model` over `records` on a blocking thread, holding
    /// `permit` (the device) until it ends. Other shards of the same model
    /// may join it when `model` joins and `max_shards` > 1.
    pub(crate) fn start(
        &self,
        model_hash: ModelHash,
        model: Arc<dyn Model>,
        records: Vec<(usize, GenerationRecord)>,
        limits: GenLimits,
        max_shards: usize,
        permit: OwnedSemaphorePermit,
    ) -> Membership {
        let run = Arc::new(Run {
            model_hash,
            max_seqs: limits.max_seqs.max(1),
            joinable: model.joins() && max_shards > 1,
            control: GenControl::default(),
            departed: AtomicBool::new(false),
            state: Mutex::new(RunState::default()),
            inner: self.inner.clone(),
        });
        let mut st = lock(&run.state);
        let (id, rx) = st.add_member();
        let first: Vec<(usize, GenerationRecord)> = records
            .into_iter()
            .map(|(index, record)| (st.ticket(id, index), record))
            .collect();
        drop(st);
        *lock(&self.inner.current) = Some(run.clone());
        let driver = run.clone();
        tokio::spawn(async move {
            let thread = driver.clone();
            let result = tokio::task::spawn_blocking(move || {
                let refs: Vec<(usize, &GenerationRecord)> =
                    first.iter().map(|(t, r)| (*t, r)).collect();
                let mut feed = RunFeed {
                    run: thread.clone(),
                    passes: 0,
                    running: 0,
                };
                let r = model.generate_joined(
                    &refs,
                    limits,
                    &thread.control,
                    &mut feed,
                    &mut |ticket, g| thread.finished(ticket, g),
                );
                if feed.passes > 0 {
                    // How full the batch stayed: what joining shards are for.
                    tracing::info!(passes = feed.passes,
                        mean_running = %format!("{:.2}", feed.running as f64 / feed.passes as f64),
                        max_seqs = thread.max_seqs, shards = lock(&thread.state).next_member,
                        "generation run ended");
                }
                r
            })
            .await;
            let result = match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(ShardError::from(e)),
                Err(e) => Err(ShardError::Transient(format!(
                    "generation task failed: {e}"
                ))),
            };
            driver.end(result);
            drop(permit);
        });
        Membership {
            id,
            run,
            rx,
            gone: AtomicBool::new(false),
        }
    }
}

/// An extra pull under way (see [`SharedRuns::claim`]).
pub(crate) struct Claim {
    inner: Arc<Inner>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.inner.claims.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RunState {
    fn add_member(&mut self) -> (u64, mpsc::UnboundedReceiver<Arrived>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_member;
        self.next_member += 1;
        self.members.insert(
            id,
            Member {
                tx,
                outstanding: 0,
                left: false,
                told: false,
            },
        );
        (id, rx)
    }

    fn ticket(&mut self, member: u64, index: usize) -> usize {
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(t, (member, index));
        if let Some(m) = self.members.get_mut(&member) {
            m.outstanding += 1;
        }
        t
    }

    fn wanted(&self, ticket: usize) -> bool {
        self.tickets
            .get(&ticket)
            .and_then(|(m, _)| self.members.get(m))
            .is_some_and(|m| !m.left)
    }
}

impl Run {
    /// Hands a finished record to its member; a member whose records have
    /// all finished is done with the run (its channel closes).
    fn finished(&self, ticket: usize, g: Generation) {
        let mut st = lock(&self.state);
        let Some((member, index)) = st.tickets.remove(&ticket) else {
            return;
        };
        let Some(m) = st.members.get_mut(&member) else {
            return;
        };
        if !m.left {
            let _ = m.tx.send(Arrived::Done(index, g));
        }
        m.outstanding = m.outstanding.saturating_sub(1);
        if m.outstanding == 0 {
            st.members.remove(&member);
        }
    }

    /// The run's thread returned: no one joins any more, every member still
    /// in it hears how it ended.
    fn end(&self, result: Result<(), ShardError>) {
        let mut st = lock(&self.state);
        st.closed = true;
        for (_, m) in st.members.drain() {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(e.clone()),
            };
            let _ = m.tx.send(Arrived::Ended(r));
        }
        st.tickets.clear();
        st.queue.clear();
        drop(st);
        let mut current = lock(&self.inner.current);
        if current.as_ref().is_some_and(|c| std::ptr::eq(&**c, self)) {
            *current = None;
            self.inner.room.send_replace(None);
        }
    }
}

impl Membership {
    /// Takes this shard's records out of the run: queued ones at once,
    /// running ones before the next pass ([`Arrived::Out`] says when). The
    /// last member to leave stops the run.
    pub(crate) fn leave(&self) {
        if self.gone.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut st = lock(&self.run.state);
        // A member whose records all finished is out already.
        let Some(m) = st.members.get_mut(&self.id) else {
            return;
        };
        m.left = true;
        self.run.departed.store(true, Ordering::SeqCst);
        let id = self.id;
        let RunState { queue, tickets, .. } = &mut *st;
        queue.retain(|(t, _)| tickets.get(t).is_none_or(|(m, _)| *m != id));
        if st.members.values().all(|m| m.left) {
            self.run.control.stop.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The run's side of [`Joining`], on its blocking thread.
struct RunFeed {
    run: Arc<Run>,
    /// Passes run, and the sequences they carried together.
    passes: u64,
    running: u64,
}

impl Joining for RunFeed {
    fn take(&mut self) -> Vec<(usize, GenerationRecord)> {
        std::mem::take(&mut lock(&self.run.state).queue)
    }

    fn departed(&mut self) -> bool {
        self.run.departed.swap(false, Ordering::SeqCst)
    }

    fn wanted(&self, index: usize) -> bool {
        lock(&self.run.state).wanted(index)
    }

    fn wait(&mut self) -> Vec<(usize, GenerationRecord)> {
        let mut st = lock(&self.run.state);
        if st.queue.is_empty() {
            st.closed = true;
            drop(st);
            self.run.inner.room.send_replace(None);
            return Vec::new();
        }
        std::mem::take(&mut st.queue)
    }

    fn settled(&mut self, running: usize, waiting: usize) {
        if running > 0 {
            self.passes += 1;
            self.running += running as u64;
        }
        let mut st = lock(&self.run.state);
        // Members that left hear that their records are out.
        let mut gone = Vec::new();
        for (id, m) in st.members.iter_mut() {
            if m.left && !m.told {
                m.told = true;
                let _ = m.tx.send(Arrived::Out);
                gone.push(*id);
            }
        }
        for id in &gone {
            st.members.remove(id);
        }
        if !gone.is_empty() {
            let RunState {
                tickets, members, ..
            } = &mut *st;
            tickets.retain(|_, (m, _)| members.contains_key(m));
        }
        let open = self.run.joinable
            && !st.closed
            && st.queue.is_empty()
            && waiting == 0
            && running < self.run.max_seqs
            && self.run.inner.waiting.load(Ordering::SeqCst) == 0
            && self.run.inner.claims.load(Ordering::SeqCst) == 0;
        drop(st);
        let room = open.then(|| self.run.model_hash.clone());
        self.run.inner.room.send_if_modified(|r| {
            if *r == room {
                false
            } else {
                *r = room;
                true
            }
        });
    }
}
