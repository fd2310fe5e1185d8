//! Forming groups: a generation job that asks to run split by layers
//! (`minions submit --stages N`) runs on a group of N workers, formed here
//! from idle ones ([`plan`]) and told their parts with
//! [`GroupOrder`]s. The first member leads: it alone pulls the job's
//! shards.
//!
//! Each pass (every [`GroupSettings::every`]):
//! - a group whose job is no longer queued or running is released;
//! - a member that died, left, drains or whose owner came back is
//!   replaced by an idle worker that can hold its layers: every member
//!   gets the group anew under a newer epoch (the others keep their
//!   layers and drop their caches; the leader runs the records in flight
//!   again);
//! - a job without a group gets one when enough idle workers lend enough
//!   memory (layers in proportion to the members' measured pace as
//!   stages where all have one and the shares fit, else to the memory
//!   they lend); why not is kept for the job's "why is it waiting". A
//!   generation job that no able worker lends enough for gets one
//!   without asking: the smallest group (2 to 4) whose shares fit;
//! - a worker whose heartbeat shows a part in a group this watchdog did
//!   not form (or no longer counts it in) is told to let it go.
//!
//! One watchdog forms groups: where several run, the others are started
//! with `--no-groups` and leave groups alone.

pub mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use minions_schemas::messages::{
    GroupAnswer, GroupMember, GroupOrder, JobSpec, Requirements, Schedule, WorkerState,
};
use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId, decode, encode, limits, subjects};
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use crate::view::View;
use plan::Candidate;

/// How groups are formed.
#[derive(Debug, Clone)]
pub struct GroupSettings {
    /// This watchdog's name, in orders.
    pub me: String,
    /// How often groups are looked at.
    pub every: Duration,
    /// How long a member may take to load its layers and answer.
    pub answer_wait: Duration,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            me: "watchdog".into(),
            every: Duration::from_secs(1),
            answer_wait: Duration::from_secs(180),
        }
    }
}

/// A group as formed.
#[derive(Debug, Clone)]
struct Formed {
    order: GroupOrder,
    layers: u32,
    need_mb: u64,
    /// When a member was first seen lost and not yet replaced.
    broken_since: Option<Instant>,
}

/// What a job's spec says about its group.
#[derive(Debug, Clone)]
struct SpecFacts {
    layers: u32,
    need_mb: u64,
    split: Vec<u32>,
}

/// What the former knows between passes.
struct Former {
    client: async_nats::Client,
    store: Arc<dyn ObjectStore>,
    view: Arc<View>,
    settings: GroupSettings,
    formed: HashMap<JobId, Formed>,
    /// Jobs' layers, memory need and asked split, from their specs.
    specs: HashMap<JobId, Option<SpecFacts>>,
    /// Workers that refused an order, kept out for a while.
    refused: HashMap<WorkerId, Instant>,
    /// Workers told to let a stray part go, and when.
    released: HashMap<WorkerId, Instant>,
    /// Each worker's last measured pace as a stage, ns per layer-token.
    paces: HashMap<WorkerId, u32>,
}

/// Forms and mends groups until `stop`.
pub async fn run(
    client: async_nats::Client,
    store: Arc<dyn ObjectStore>,
    view: Arc<View>,
    settings: GroupSettings,
    stop: CancellationToken,
) {
    let mut f = Former {
        client,
        store,
        view,
        settings,
        formed: HashMap::new(),
        specs: HashMap::new(),
        refused: HashMap::new(),
        released: HashMap::new(),
        paces: HashMap::new(),
    };
    let mut tick = tokio::time::interval(f.settings.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Some(schedule) = f.view.schedule() else {
            continue;
        };
        f.pass(&schedule).await;
    }
    // Members keep their layers: a watchdog that restarts finds them in
    // their heartbeats and lets them go, or forms the group again.
}

/// One idle worker's candidacy, and every worker's stage as its beat shows.
struct Fleet {
    idle: Vec<Candidate>,
    /// Workers that are alive, lending and not draining.
    able: HashSet<WorkerId>,
    /// Each worker's group, as its heartbeat shows.
    parts: Vec<(WorkerId, String)>,
    /// What each able worker lends (MB, 0 = unknown) and its device.
    lenders: Vec<(u64, String)>,
}

impl Former {
    /// Keeps the pace each member's heartbeat shows.
    fn note_paces(&mut self) {
        let reg = self.view.registry();
        for (id, t) in reg.iter() {
            if let Some(s) = &t.beat.stage
                && s.layer_ns > 0
            {
                self.paces.insert(id.clone(), s.layer_ns);
            }
        }
    }

    fn fleet(&self) -> Fleet {
        let in_groups: HashSet<&WorkerId> = self
            .formed
            .values()
            .flat_map(|g| g.order.members.iter().map(|m| &m.worker))
            .collect();
        let reg = self.view.registry();
        let mut idle = Vec::new();
        let mut able = HashSet::new();
        let mut parts = Vec::new();
        let mut lenders = Vec::new();
        for (id, t) in reg.iter() {
            if let Some(s) = &t.beat.stage {
                parts.push((id.clone(), s.group.clone()));
            }
            let alive = matches!(
                t.state,
                WorkerState::Idle | WorkerState::Busy | WorkerState::Joining
            );
            let lending = t.beat.owner.is_empty() || t.beat.owner == "available";
            let trusted = !self.view.is_quarantined(subjects::machine(id));
            if !(alive && lending && trusted) {
                continue;
            }
            able.insert(id.clone());
            let lend_mb = if t.beat.lend_mb > 0 {
                t.beat.lend_mb
            } else {
                t.beat.mem_budget_mb
            };
            lenders.push((lend_mb, t.beat.device.clone()));
            let refused = self
                .refused
                .get(id)
                .is_some_and(|at| at.elapsed() < Duration::from_secs(60));
            if t.state == WorkerState::Idle
                && t.beat.stage.is_none()
                && !in_groups.contains(id)
                && !refused
            {
                idle.push(Candidate {
                    worker: id.clone(),
                    lend_mb,
                    device: t.beat.device.clone(),
                    layer_ns: self.paces.get(id).copied().unwrap_or(0),
                });
            }
        }
        Fleet {
            idle,
            able,
            parts,
            lenders,
        }
    }

    async fn pass(&mut self, schedule: &Schedule) {
        // Jobs that run on groups: those that ask for one, those on one
        // already, and those no able worker can run alone (the smallest
        // group that holds them, when their model has layers to split).
        self.note_paces();
        let lenders = self.fleet().lenders;
        let wanted: HashMap<JobId, (Option<u32>, Requirements)> = schedule
            .jobs
            .iter()
            .filter(|j| j.pending + j.running > 0)
            .filter_map(|j| {
                let stages = if j.needs.stages > 1 {
                    Some(j.needs.stages)
                } else if let Some(g) = self.formed.get(&j.job) {
                    Some(g.order.members.len() as u32)
                } else if !lenders.is_empty() && !j.needs.met_by_any(&lenders) {
                    None
                } else {
                    return None;
                };
                Some((j.job.clone(), (stages, j.needs.clone())))
            })
            .collect();
        // Groups whose job is over.
        let over: Vec<JobId> = self
            .formed
            .keys()
            .filter(|j| !wanted.contains_key(*j))
            .cloned()
            .collect();
        for job in over {
            if let Some(g) = self.formed.remove(&job) {
                tracing::info!(job = %job, group = %g.order.group, "the job is over; its group is released");
                self.release(&g.order, &g.order.members).await;
            }
            self.view.set_on_group(&job, false);
            self.specs.remove(&job);
        }
        self.specs.retain(|j, _| wanted.contains_key(j));
        self.mend().await;
        for (job, (stages, needs)) in &wanted {
            if self.formed.contains_key(job) {
                continue;
            }
            let Some(SpecFacts {
                layers,
                need_mb,
                split,
            }) = self.spec(job, stages.is_some()).await
            else {
                continue;
            };
            let mut fleet = self.fleet();
            // Members run on the devices the job allows.
            let on_device = Requirements {
                devices: needs.devices.clone(),
                ..Requirements::default()
            };
            fleet.idle.retain(|c| on_device.met_by(0, &c.device));
            let formed = match stages {
                Some(n) => plan::form(*n as usize, layers, need_mb, &fleet.idle, &split),
                None => plan::smallest(layers, need_mb, &fleet.idle),
            };
            let members = match formed {
                Ok(m) => m,
                Err(why) => {
                    self.view.set_group_wait(job, Some(why));
                    continue;
                }
            };
            let order = GroupOrder {
                v: SCHEMA_VERSION,
                group: format!("g-{job}"),
                epoch: minions_schemas::time::now_ms(),
                job: job.clone(),
                model_hash: match schedule.jobs.iter().find(|j| &j.job == job) {
                    Some(j) => j.model_hash.clone(),
                    None => continue,
                },
                members,
                release: false,
                by: self.settings.me.clone(),
            };
            let started = Instant::now();
            if self.send_all(&order).await {
                tracing::info!(job = %job, group = %order.group, epoch = order.epoch,
                    members = %describe(&order.members), ms = started.elapsed().as_millis() as u64,
                    "group formed");
                self.view.set_group_wait(job, None);
                self.view.set_on_group(job, true);
                self.formed.insert(
                    job.clone(),
                    Formed {
                        order,
                        layers,
                        need_mb,
                        broken_since: None,
                    },
                );
            }
        }
        self.release_strays().await;
    }

    /// Replaces lost members of formed groups.
    async fn mend(&mut self) {
        let jobs: Vec<JobId> = self.formed.keys().cloned().collect();
        for job in jobs {
            let fleet = self.fleet();
            let Some(g) = self.formed.get(&job).cloned() else {
                continue;
            };
            let lost: Vec<usize> = g
                .order
                .members
                .iter()
                .enumerate()
                .filter(|(_, m)| !fleet.able.contains(&m.worker))
                .map(|(i, _)| i)
                .collect();
            if lost.is_empty() {
                continue;
            }
            let since = g.broken_since.unwrap_or_else(Instant::now);
            let mut members = g.order.members.clone();
            let mut idle = fleet.idle.clone();
            let mut short = false;
            for &i in &lost {
                let r = members[i].first_layer..members[i].end_layer;
                match plan::replacement(r, g.layers, g.need_mb, &idle) {
                    Some(w) => {
                        idle.retain(|c| c.worker != w);
                        members[i].worker = w;
                    }
                    None => short = true,
                }
            }
            if short {
                if g.broken_since.is_none() {
                    tracing::warn!(job = %job, group = %g.order.group, lost = lost.len(),
                        "a member of the group is lost and no idle worker can take its layers; waiting");
                    self.view.set_group_wait(
                        &job,
                        Some("a member of its group was lost; waiting for an idle worker to take its layers".to_owned()),
                    );
                }
                if let Some(f) = self.formed.get_mut(&job) {
                    f.broken_since = Some(since);
                }
                continue;
            }
            let order = GroupOrder {
                epoch: minions_schemas::time::now_ms().max(g.order.epoch + 1),
                members,
                ..g.order.clone()
            };
            if self.send_all(&order).await {
                tracing::warn!(job = %job, group = %order.group, epoch = order.epoch,
                    members = %describe(&order.members), replaced = lost.len(),
                    recovery_ms = since.elapsed().as_millis() as u64, "group re-formed");
                self.view.set_group_wait(&job, None);
                self.formed.insert(
                    job,
                    Formed {
                        order,
                        broken_since: None,
                        ..g
                    },
                );
            } else if let Some(f) = self.formed.get_mut(&job) {
                f.broken_since = Some(since);
            }
        }
    }

    /// The job's layers, memory need and asked split, from its spec (read
    /// once). A job that `asked` for a group and has no layer count is
    /// told why it waits; one formed for because nothing holds it alone
    /// (an embedding job, say) just is not.
    async fn spec(&mut self, job: &JobId, asked: bool) -> Option<SpecFacts> {
        if let Some(s) = self.specs.get(job) {
            return s.clone();
        }
        let spec: Option<JobSpec> = crate::orphans::read_spec(self.store.as_ref(), job).await;
        let got = spec.and_then(|s| {
            s.layers.map(|layers| SpecFacts {
                layers,
                need_mb: s.needs.memory_mb,
                split: s.stage_split,
            })
        });
        if got.is_none() && asked {
            tracing::warn!(job = %job, "a job asks for a group but its spec names no layer count");
            self.view.set_group_wait(
                job,
                Some("its spec names no layer count; push the model again and resubmit".into()),
            );
        }
        self.specs.insert(job.clone(), got.clone());
        got
    }

    /// Sends `order` to every member and waits for their answers, the
    /// later stages first and the leader last (it pulls the job's shards
    /// as soon as it holds its part); true when all hold their parts.
    /// Otherwise every member is told to let go and the refusing ones are
    /// kept out for a while. A member that dies while it loads is not
    /// waited for.
    async fn send_all(&mut self, order: &GroupOrder) -> bool {
        let (lead, later) = order.members.split_at(1.min(order.members.len()));
        let mut answers = self.ask_all(order, later).await;
        if answers.iter().all(|a| a.as_ref().is_ok_and(|a| a.ready)) {
            answers.splice(0..0, self.ask_all(order, lead).await);
        } else {
            answers.insert(
                0,
                Err("not asked: another member did not take its part".into()),
            );
        }
        let mut ok = true;
        for (m, a) in order.members.iter().zip(answers) {
            match a {
                Ok(a) if a.ready => {
                    tracing::info!(worker = %m.worker, group = %order.group, detail = %a.detail,
                        weight_mb = a.weight_bytes >> 20, "member ready");
                }
                Ok(a) => {
                    tracing::warn!(worker = %m.worker, group = %order.group, detail = %a.detail, "member refused");
                    self.refused.insert(m.worker.clone(), Instant::now());
                    ok = false;
                }
                Err(e) => {
                    tracing::warn!(worker = %m.worker, group = %order.group, error = %e, "member did not answer");
                    if !e.starts_with("not ") {
                        self.refused.insert(m.worker.clone(), Instant::now());
                    }
                    ok = false;
                }
            }
        }
        if !ok {
            self.release(order, &order.members).await;
        }
        ok
    }

    /// Asks `members` for their parts at once; stops waiting for those
    /// still loading when one of them stops being able (dies, leaves).
    async fn ask_all(
        &self,
        order: &GroupOrder,
        members: &[GroupMember],
    ) -> Vec<Result<GroupAnswer, String>> {
        let asks = members
            .iter()
            .map(|m| ask(&self.client, &m.worker, order, self.settings.answer_wait));
        let all = futures::future::join_all(asks);
        tokio::pin!(all);
        let mut check = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                answers = &mut all => return answers,
                _ = check.tick() => {
                    let able = self.fleet().able;
                    if let Some(gone) = members.iter().find(|m| !able.contains(&m.worker)) {
                        return members
                            .iter()
                            .map(|m| Err(if m.worker == gone.worker {
                                "it stopped while it loaded its layers".to_owned()
                            } else {
                                format!("not waited for: {} stopped", gone.worker)
                            }))
                            .collect();
                    }
                }
            }
        }
    }

    /// Tells `to` to let group `order` go.
    async fn release(&self, order: &GroupOrder, to: &[GroupMember]) {
        let release = GroupOrder {
            release: true,
            ..order.clone()
        };
        let asks = to
            .iter()
            .map(|m| ask(&self.client, &m.worker, &release, Duration::from_secs(5)));
        let _ = futures::future::join_all(asks).await;
    }

    /// Lets go parts held in groups that are not formed here.
    async fn release_strays(&mut self) {
        let fleet = self.fleet();
        for (worker, group) in fleet.parts {
            let counted = self.formed.values().any(|g| {
                g.order.group == group && g.order.members.iter().any(|m| m.worker == worker)
            });
            let recent = self
                .released
                .get(&worker)
                .is_some_and(|at| at.elapsed() < Duration::from_secs(10));
            if counted || recent {
                continue;
            }
            let Some(job) = group.strip_prefix("g-").and_then(|j| JobId::new(j).ok()) else {
                continue;
            };
            let Ok(model_hash) = minions_schemas::ModelHash::new("0".repeat(64)) else {
                continue;
            };
            self.released.insert(worker.clone(), Instant::now());
            tracing::info!(worker = %worker, group = %group, "a stray group part is let go");
            let order = GroupOrder {
                v: SCHEMA_VERSION,
                group,
                epoch: 0,
                job,
                model_hash,
                members: Vec::new(),
                release: true,
                by: self.settings.me.clone(),
            };
            let _ = ask(&self.client, &worker, &order, Duration::from_secs(5)).await;
        }
        self.released
            .retain(|_, at| at.elapsed() < Duration::from_secs(60));
    }
}

/// The members as `worker[a..b]`, for logs.
fn describe(members: &[GroupMember]) -> String {
    members
        .iter()
        .map(|m| format!("{}[{}..{}]", m.worker, m.first_layer, m.end_layer))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends `order` to `worker` and waits up to `wait` for its answer.
async fn ask(
    client: &async_nats::Client,
    worker: &WorkerId,
    order: &GroupOrder,
    wait: Duration,
) -> Result<GroupAnswer, String> {
    let bytes = encode("group order", order).map_err(|e| e.to_string())?;
    let req = async_nats::Request::new()
        .payload(bytes.into())
        .timeout(Some(wait));
    let m = client
        .send_request(subjects::group(worker), req)
        .await
        .map_err(|e| e.to_string())?;
    decode("group answer", &m.payload, limits::MAX_CONTROL_BYTES).map_err(|e| e.to_string())
}
