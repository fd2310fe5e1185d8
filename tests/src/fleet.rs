//! A fleet for one test: a NATS server (or cluster), a store, and the
//! workers and watchdogs started against them, with the CLI pointed at it
//! and helpers to wait for and check its jobs.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::{
    NatsServer, Proc, Result, S3Server, bin, cluster, dashboard_url, job_events, max_abs_diff,
    minions, minions_ok, minions_submit, read_npy_f32, role_password, scratch,
};

/// A fleet for one test: a temp dir for logs, store and caches, and the
/// processes started in it.
pub struct Fleet {
    /// Scratch space (logs, local store, caches).
    pub dir: tempfile::TempDir,
    /// The NATS server (on a cluster: its first node).
    pub nats: NatsServer,
    /// A cluster's other nodes (empty on one server).
    pub peers: Vec<NatsServer>,
    /// The store URL every process uses.
    pub store_url: String,
    /// Extra environment for every process (S3 settings).
    pub env: Vec<(String, String)>,
    /// Workers started with [`Fleet::add_worker`].
    pub workers: Vec<Proc>,
    /// Watchdogs started with [`Fleet::add_watchdog`].
    pub watchdogs: Vec<Proc>,
    /// Extra environment for workers only (their NATS identity).
    pub worker_env: Vec<(String, String)>,
    /// Whether checking a job's outputs also checks that its counts agree
    /// ([`Fleet::counts_agree`]); on unless a test turns it off.
    pub check_counts: bool,
    /// Each worker connects with its own machine identity (the nkey seed
    /// the server was started with for its name).
    pub worker_identities: bool,
    /// Extra environment for watchdogs only (their NATS identity).
    pub watchdog_env: Vec<(String, String)>,
    /// Each watchdog's dashboard base URL (`http://127.0.0.1:PORT`), in
    /// start order.
    pub dashboards: Vec<String>,
    spawned: usize,
}

impl Fleet {
    /// A fleet with a local-directory store.
    pub fn local() -> Result<Self> {
        Self::local_on(NatsServer::start()?, Vec::new())
    }

    /// A fleet with a local-directory store on a cluster of `n` routed
    /// nats-servers (see [`cluster`]); every process is given all of them.
    pub async fn cluster(n: usize) -> Result<Self> {
        let mut nodes = cluster::start(n).await?;
        if nodes.is_empty() {
            return Err("a cluster needs a node".into());
        }
        let first = nodes.remove(0);
        Self::local_on(first, nodes)
    }

    /// A fleet with a local-directory store on `nats` and its cluster
    /// `peers`.
    fn local_on(nats: NatsServer, peers: Vec<NatsServer>) -> Result<Self> {
        let dir = scratch("minions-fleet-")?;
        let store_url = format!("file://{}", dir.path().join("store").display());
        Ok(Self {
            nats,
            peers,
            dir,
            store_url,
            env: Vec::new(),
            workers: Vec::new(),
            watchdogs: Vec::new(),
            dashboards: Vec::new(),
            worker_env: Vec::new(),
            check_counts: true,
            worker_identities: false,
            watchdog_env: Vec::new(),
            spawned: 0,
        })
    }

    /// The NATS URL every process is given: the server, or all of a
    /// cluster's nodes separated by commas.
    pub fn nats_url(&self) -> String {
        std::iter::once(&self.nats)
            .chain(&self.peers)
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node named `server_name` (`n1`...) of a cluster.
    pub fn node(&mut self, server_name: &str) -> Result<&mut NatsServer> {
        std::iter::once(&mut self.nats)
            .chain(self.peers.iter_mut())
            .find(|n| n.server_name == server_name)
            .ok_or_else(|| format!("no node named {server_name:?}").into())
    }

    /// A client of the fleet's NATS (on a cluster: one that follows the
    /// nodes as they go and come).
    pub async fn client(&self) -> Result<async_nats::Client> {
        if self.peers.is_empty() {
            self.nats.client().await
        } else {
            cluster::client(&self.nats_url()).await
        }
    }

    /// A fleet with a local-directory store whose nats-server accepts TLS
    /// connections only; every process trusts its test authority through
    /// `MINIONS_NATS_CA`.
    pub fn local_tls() -> Result<Self> {
        let mut f = Self::local()?;
        f.nats = NatsServer::start_tls()?;
        let ca = f.nats.ca.clone().ok_or("no CA")?;
        f.env
            .push(("MINIONS_NATS_CA".into(), ca.display().to_string()));
        Ok(f)
    }

    /// A fleet on the shipped least-privilege nats-server config: the CLI
    /// runs as `producer`, watchdogs as `watchdog`, workers `w1`..`w8` each
    /// with its own machine identity (`minions admin add-worker`), all over
    /// TLS; `minions admin init` has run as `admin`.
    pub fn least_privilege() -> Result<Self> {
        let mut f = Self::local()?;
        let names: Vec<String> = (1..=8).map(|i| format!("w{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        f.nats = NatsServer::start_least_privilege(&names)?;
        f.worker_identities = true;
        let ca = f.nats.ca.clone().ok_or("no CA")?;
        let as_role = |role: &str| -> Vec<(String, String)> {
            vec![
                ("MINIONS_NATS_USER".into(), role.into()),
                ("MINIONS_NATS_PASSWORD".into(), role_password(role)),
            ]
        };
        f.env
            .push(("MINIONS_NATS_CA".into(), ca.display().to_string()));
        let mut admin = f.cli_env();
        admin.extend(as_role("admin"));
        f.nats.login = Some(("admin".into(), role_password("admin")));
        minions_ok(&["admin", "init"], &admin)?;
        f.env.extend(as_role("producer"));
        f.watchdog_env = as_role("watchdog");
        Ok(f)
    }

    /// A fleet whose store is `s3://bucket` on `s3`.
    pub fn s3(s3: &S3Server, bucket: &str) -> Result<Self> {
        let dir = scratch("minions-fleet-")?;
        Ok(Self {
            nats: NatsServer::start()?,
            dir,
            store_url: format!("s3://{bucket}"),
            env: s3.env(),
            workers: Vec::new(),
            watchdogs: Vec::new(),
            dashboards: Vec::new(),
            worker_env: Vec::new(),
            check_counts: true,
            worker_identities: false,
            watchdog_env: Vec::new(),
            peers: Vec::new(),
            spawned: 0,
        })
    }

    /// The environment that points a CLI run at this fleet.
    pub fn cli_env(&self) -> Vec<(String, String)> {
        let mut e = self.env.clone();
        e.push(("MINIONS_NATS_URL".into(), self.nats_url()));
        e.push(("MINIONS_STORE".into(), self.store_url.clone()));
        e
    }

    /// Starts a watchdog; `extra` flags are appended.
    pub fn add_watchdog(&mut self, extra: &[&str]) -> Result<()> {
        let i = self.watchdogs.len() + 1;
        let mut args: Vec<String> = vec![
            "--nats".into(),
            self.nats_url(),
            "--store".into(),
            self.store_url.clone(),
            "--name".into(),
            format!("watchdog{i}"),
            // Port 0: the system picks a free one (a port chosen here could
            // be taken by another connection before the watchdog binds it);
            // the watchdog logs where it listens.
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        // Open, as `minions dev` serves it on loopback, unless a test asks
        // for a credential (`--http-access`, `--http-trust-header`).
        if !extra.iter().any(|a| a.starts_with("--http-")) {
            args.push("--http-open".into());
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut env = self.env.clone();
        env.extend(self.watchdog_env.iter().cloned());
        env.push(("RUST_LOG".into(), "info".into()));
        let mut p = Proc::spawn(
            &format!("watchdog{i}"),
            &bin("minions-watchdog")?,
            &args,
            &env,
            self.dir.path(),
        )?;
        let url = dashboard_url(&mut p, Duration::from_secs(30))?;
        self.dashboards.push(url);
        self.watchdogs.push(p);
        Ok(())
    }

    /// Starts a worker with its own cache dir; `extra` flags are appended.
    /// Workers are numbered in start order (w1, w2, ...), also across restarts.
    pub fn add_worker(&mut self, extra: &[&str]) -> Result<()> {
        self.spawned += 1;
        let i = self.spawned;
        let mut args: Vec<String> = vec![
            "--nats".into(),
            self.nats_url(),
            "--store".into(),
            self.store_url.clone(),
            "--cache-dir".into(),
            self.dir
                .path()
                .join(format!("cache{i}"))
                .display()
                .to_string(),
            "--name".into(),
            format!("w{i}"),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut env = self.env.clone();
        env.extend(self.worker_env.iter().cloned());
        if self.worker_identities {
            env.retain(|(k, _)| {
                !k.starts_with("MINIONS_NATS_USER") && k != "MINIONS_NATS_PASSWORD"
            });
            env.push((
                "MINIONS_NATS_NKEY".into(),
                self.nats
                    .worker_seed(&format!("w{i}"))
                    .display()
                    .to_string(),
            ));
        }
        if !env.iter().any(|(k, _)| k == "RUST_LOG") {
            env.push(("RUST_LOG".into(), "info".into()));
        }
        let p = Proc::spawn(
            &format!("worker{i}"),
            &bin("minions-worker")?,
            &args,
            &env,
            self.dir.path(),
        )?;
        self.workers.push(p);
        Ok(())
    }

    /// Runs the CLI against this fleet and returns stdout, failing on error.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        minions_ok(args, &self.cli_env())
    }

    /// An owner policy read from a signal file (written `idle` now; write
    /// `active` for the owner's return), sampled every 100 ms, resuming
    /// `resume_after` seconds after the owner left: the policy's path (for
    /// `--policy`) and the signal file's.
    pub fn owner_policy(&self, resume_after: u32) -> Result<(String, std::path::PathBuf)> {
        let signal = self.dir.path().join("owner");
        std::fs::write(&signal, "idle\n")?;
        let policy = self.dir.path().join("policy.toml");
        std::fs::write(
            &policy,
            format!(
                "signals = [\"file:{}\"]\nmin_input_idle_secs = 60\nresume_after_secs = {resume_after}\nsample_every_ms = 100\n",
                signal.display()
            ),
        )?;
        Ok((policy.display().to_string(), signal))
    }

    /// Submits `input` (a path) as job `job` of `model` in shards of
    /// `shard_size`; returns the job id that `submit` printed.
    pub fn submit(&self, model: &str, input: &Path, shard_size: u32, job: &str) -> Result<String> {
        minions_submit(&self.cli_env(), model, input, shard_size, &["--job", job])
    }

    /// Submits the prompts in `input` to the generation model `model` as
    /// job `job`, in shards of `shard_size` with at most `max_tokens` new
    /// tokens each; returns the job id that `submit` printed.
    pub fn submit_prompts(
        &self,
        model: &str,
        input: &Path,
        shard_size: u64,
        max_tokens: u64,
        job: &str,
    ) -> Result<String> {
        self.cli(&[
            "submit",
            "--model",
            model,
            "--input",
            &input.display().to_string(),
            "--shard-size",
            &shard_size.to_string(),
            "--max-tokens",
            &max_tokens.to_string(),
            "--job",
            job,
        ])
    }

    /// Runs the CLI against this fleet and returns the whole output.
    pub fn cli_raw(&self, args: &[&str]) -> Result<Output> {
        minions(args, &self.cli_env())
    }

    /// Polls `minions status --json` until the job is done or failed, or
    /// `within` passes (a failing status call, e.g. while nats-server
    /// restarts, is retried).
    pub fn wait_job(&self, job: &str, within: Duration) -> Result<serde_json::Value> {
        self.wait_status(job, within, |v| {
            v["state"] == "done" || v["state"] == "failed"
        })
    }

    /// Polls `minions status JOB --json` until `ready` holds for it (the
    /// status is returned) or `within` passes (an error with the workers'
    /// and watchdogs' logs).
    pub fn wait_status(
        &self,
        job: &str,
        within: Duration,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        let until = Instant::now() + within;
        loop {
            let out = match self.cli(&["status", job, "--json"]) {
                Ok(o) => o,
                Err(e) if Instant::now() < until => {
                    eprintln!("status failed, retrying: {e}");
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let v: serde_json::Value = serde_json::from_str(&out)?;
            if ready(&v) {
                return Ok(v);
            }
            if Instant::now() > until {
                return Err(format!(
                    "job {job} not as awaited after {within:?}: {out}\n{}",
                    self.logs()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The tails of all worker and watchdog logs, for failure messages.
    pub fn logs(&self) -> String {
        self.workers
            .iter()
            .chain(&self.watchdogs)
            .map(|w| format!("--- {} ---\n{}", w.name, w.log_tail(30)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The manifest of `job` in this fleet's local-directory store: its
    /// newest revision.
    pub fn manifest(&self, job: &str) -> Result<minions_schemas::messages::JobManifest> {
        let id = minions_schemas::JobId::new(job)?;
        let mut n = 1;
        while self
            .dir
            .path()
            .join("store")
            .join(minions_schemas::keys::job_manifest_revision(&id, n + 1))
            .exists()
        {
            n += 1;
        }
        self.manifest_revision(job, n)
    }

    /// Revision `n` of `job`'s manifest (1: the first written).
    pub fn manifest_revision(
        &self,
        job: &str,
        n: u32,
    ) -> Result<minions_schemas::messages::JobManifest> {
        let id = minions_schemas::JobId::new(job)?;
        let key = minions_schemas::keys::job_manifest_revision(&id, n);
        let path = self.dir.path().join("store").join(key);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(minions_schemas::decode(
            "job manifest",
            &bytes,
            minions_schemas::limits::MAX_JOB_MANIFEST_BYTES,
        )?)
    }

    /// Every event of `job` so far, in stream order.
    pub async fn events(&self, job: &str) -> Result<Vec<minions_schemas::messages::ShardEvent>> {
        let js = async_nats::jetstream::new(self.client().await?);
        job_events(&js, job).await
    }

    /// Waits until a `started` event of `job`/`shard` satisfies `pred` (given
    /// the worker id); returns that worker id and when it was seen.
    pub async fn wait_started(
        &self,
        job: &str,
        shard: u32,
        within: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<(String, Instant)> {
        let until = Instant::now() + within;
        loop {
            for e in self.events(job).await? {
                if e.shard == shard
                    && matches!(e.kind, minions_schemas::messages::EventKind::Started)
                    && pred(e.worker.as_str())
                {
                    return Ok((e.worker.to_string(), Instant::now()));
                }
            }
            if Instant::now() > until {
                return Err(format!(
                    "shard {shard} of {job} did not start as expected within {within:?}\n{}",
                    self.logs()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Passes `r` through; on error first prints every process's log tail.
    pub fn explain(&self, r: Result<()>) -> Result<()> {
        if r.is_err() {
            eprintln!("{}", self.logs());
        }
        r
    }

    /// Writes a model folder of `spec` named `name`, pushes it under that
    /// name, and returns its folder.
    pub fn push_model(
        &self,
        name: &str,
        spec: minions_worker::model::tiny::TinySpec,
    ) -> Result<PathBuf> {
        Ok(self.push_model_hashed(name, spec)?.0)
    }

    /// [`Fleet::push_model`], also returning the hash `model push` printed.
    fn push_model_hashed(
        &self,
        name: &str,
        spec: minions_worker::model::tiny::TinySpec,
    ) -> Result<(PathBuf, String)> {
        let dir = self.dir.path().join(name);
        minions_worker::model::tiny::write_tiny_bert(&dir, spec)?;
        let hash = self.cli(&["model", "push", &dir.display().to_string(), "--name", name])?;
        Ok((dir, hash.trim().to_owned()))
    }

    /// Pushes [`crate::SLOW`] as `slow` and paces it: every worker started
    /// after this holds each record of it [`crate::SLOW_PACE_MS`] ms
    /// (the worker's test-only pace switch, `MINIONS_TEST_PACE`), so a
    /// shard of a few hundred records lasts seconds with the cores at rest.
    /// Returns the model's folder.
    pub fn push_slow_model(&mut self) -> Result<PathBuf> {
        let (dir, hash) = self.push_model_hashed("slow", crate::SLOW)?;
        self.worker_env.push((
            minions_worker::pace::PACE_VAR.to_owned(),
            format!("{hash}:{}", crate::SLOW_PACE_MS),
        ));
        Ok(dir)
    }

    /// The worker (index into `workers`) whose log says it joined `job`'s
    /// group as stage `stage` (0 leads); the first such when several did.
    pub fn stage_worker(&self, stage: usize, job: &str) -> Option<usize> {
        self.stage_workers(stage, job).into_iter().next()
    }

    /// Every worker (index into `workers`) whose log says it joined
    /// `job`'s group as stage `stage`, in worker order.
    pub fn stage_workers(&self, stage: usize, job: &str) -> Vec<usize> {
        let (at, of) = (format!("stage={stage} "), format!("job={job} "));
        (0..self.workers.len())
            .filter(|&i| {
                std::fs::read_to_string(&self.workers[i].log)
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.contains("joining a group") && l.contains(&at) && l.contains(&of))
            })
            .collect()
    }

    /// Pushes the real SmolLM2-135M-Instruct GGUF under `name`.
    pub fn push_smollm2(&self, name: &str) -> Result<()> {
        let gguf = crate::real_gguf()?;
        self.cli(&["model", "push", &gguf.display().to_string(), "--name", name])?;
        Ok(())
    }

    /// Collects `job` and compares it, row for row and bit for bit, with
    /// the model in `model` run in-process one text at a time (as the
    /// fleet runs shards of one record), at f32.
    pub fn collected_equals_in_process(
        &self,
        job: &str,
        model: &Path,
        texts: &[String],
    ) -> Result<()> {
        self.counts_agree(job)?;
        let npy = self.dir.path().join(format!("{job}.npy"));
        self.cli(&["collect", job, "--output", &npy.display().to_string()])?;
        let (rows, dim, got) = read_npy_f32(&npy)?;
        if rows != texts.len() {
            return Err(format!("collected {rows} rows for {} records", texts.len()).into());
        }
        let embedder = minions_worker::model::BertEmbedder::load(
            model,
            &candle_core::Device::Cpu,
            minions_worker::model::Precision::F32,
        )?;
        let want = embedder.embed(texts, minions_worker::model::Batching::texts(1))?;
        let differing: Vec<usize> = (0..rows)
            .filter(|&r| got[r * dim..(r + 1) * dim] != want[r * dim..(r + 1) * dim])
            .collect();
        if !differing.is_empty() {
            return Err(format!(
                "{} collected rows differ from the in-process result, the first {:?}",
                differing.len(),
                &differing[..differing.len().min(10)]
            )
            .into());
        }
        Ok(())
    }

    /// Checks that `job`'s counts agree wherever they are told: `minions
    /// status`, its manifest (when a watchdog runs on a local-directory
    /// store) and every watchdog dashboard that answers report the same
    /// shards done and failed. Waits up to 10 s for the manifest and the
    /// dashboards to catch up with the events.
    pub fn counts_agree(&self, job: &str) -> Result<()> {
        if self.watchdogs.is_empty() || !self.check_counts {
            return Ok(());
        }
        // A watchdog whose events consumer stalled replaces it within
        // a few seconds (`minions_endpoints::follow::STALL_AFTER`).
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let status: serde_json::Value =
                serde_json::from_str(&self.cli(&["status", job, "--json"])?)?;
            let want = (status["done"].as_u64(), status["failed"].as_u64());
            let mut seen = vec![("status".to_owned(), want)];
            if self.store_url.starts_with("file://") {
                let m = self.manifest(job).ok();
                let told = m.map_or((None, None), |m| {
                    (Some(u64::from(m.done)), Some(u64::from(m.failed)))
                });
                seen.push(("manifest".to_owned(), told));
            }
            for (i, base) in self.dashboards.iter().enumerate() {
                // A watchdog stopped or killed by the test does not answer.
                let Ok((200, body)) = crate::web::get_within(
                    &format!("{base}/api/jobs/{job}"),
                    Duration::from_secs(2),
                ) else {
                    continue;
                };
                let v: serde_json::Value = serde_json::from_str(&body)?;
                let told = (
                    v["progress"]["done"].as_u64(),
                    v["progress"]["failed"].as_u64(),
                );
                seen.push((format!("dashboard of watchdog {}", i + 1), told));
            }
            if seen.iter().all(|(_, told)| *told == want) {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(format!("job {job}'s counts (done, failed) disagree: {seen:?}").into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Collects `job` and checks every vector against the same model code
    /// run in-process on `texts` (max abs diff ≤ 1e-5): what an undisturbed
    /// run gives.
    pub fn check_outputs(&self, job: &str, model: &Path, texts: &[String]) -> Result<()> {
        self.check_outputs_in(job, model, texts, minions_worker::model::Precision::F32)
    }

    /// [`Fleet::check_outputs`] for a job run in `precision`.
    pub fn check_outputs_in(
        &self,
        job: &str,
        model: &Path,
        texts: &[String],
        precision: minions_worker::model::Precision,
    ) -> Result<()> {
        self.counts_agree(job)?;
        let npy = self.dir.path().join(format!("{job}.npy"));
        self.cli(&["collect", job, "--output", &npy.display().to_string()])?;
        let (rows, _, got) = read_npy_f32(&npy)?;
        if rows != texts.len() {
            return Err(format!("collected {rows} rows for {} records", texts.len()).into());
        }
        let want =
            minions_worker::model::BertEmbedder::load(model, &candle_core::Device::Cpu, precision)?
                .embed(texts, minions_worker::model::Batching::texts(32))?;
        let diff = max_abs_diff(&got, &want);
        if diff > 1e-5 {
            return Err(format!("collected vectors differ from in-process ones by {diff}").into());
        }
        Ok(())
    }

    /// Messages in `stream` whose subject matches `filter`.
    pub async fn count_messages(&self, stream: &str, filter: &str) -> Result<u64> {
        let js = async_nats::jetstream::new(self.client().await?);
        let stream = js.get_stream(stream).await?;
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: filter.to_owned(),
                ..Default::default()
            })
            .await?;
        Ok(consumer.cached_info().num_pending)
    }

    /// The dead-letter record of `job`'s `shard` (the last one written).
    pub async fn dead_letter(
        &self,
        job: &str,
        shard: u32,
    ) -> Result<minions_schemas::messages::DeadLetter> {
        let js = async_nats::jetstream::new(self.client().await?);
        let stream = js.get_stream(minions_schemas::streams::DEAD_STREAM).await?;
        let job = minions_schemas::JobId::new(job)?;
        let msg = stream
            .get_last_raw_message_by_subject(&minions_schemas::subjects::dead(&job, shard))
            .await?;
        Ok(minions_schemas::decode(
            "dead letter",
            &msg.payload,
            minions_schemas::limits::MAX_TASK_BYTES + minions_schemas::limits::MAX_EVENT_BYTES,
        )?)
    }

    /// Output objects stored for `job`.
    pub fn output_count(&self, job: &str) -> Result<usize> {
        let out = self.cli(&["status", job, "--json"])?;
        let _: serde_json::Value = serde_json::from_str(&out)?;
        let dir = self.dir.path().join("store/jobs").join(job).join("outputs");
        // Outputs only: a worker killed in the middle of a write leaves the
        // local store's staging file (`NAME#N`), which is not an output.
        let mut n = 0;
        for e in std::fs::read_dir(dir)? {
            if e?.file_name().to_string_lossy().ends_with(".msgpack") {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Messages left in the work stream.
    pub async fn work_stream_messages(&self) -> Result<u64> {
        let js = async_nats::jetstream::new(self.client().await?);
        let mut s = js.get_stream(minions_schemas::streams::WORK_STREAM).await?;
        Ok(s.info().await?.state.messages)
    }
}
