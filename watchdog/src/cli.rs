//! Command-line flags of `minions-watchdog`.

use std::time::Duration;

use clap::Parser;
use minions_endpoints::nats::DEFAULT_NATS_URL;

use crate::run::WatchdogConfig;

/// Watch a Minions fleet: follow worker heartbeats, declare silent workers
/// dead and hand their shards back at once, dead-letter shards that keep
/// failing, write a manifest when a job completes, and serve a live
/// dashboard (http://127.0.0.1:9464/ by default: workers, queue, jobs, and
/// why a job's shards wait) with Prometheus metrics at /metrics. Run one per
/// fleet (more is safe: each action is taken once).
#[derive(Debug, Parser)]
#[command(name = "minions-watchdog", version, about, long_about)]
pub struct WatchdogArgs {
    /// NATS server URL; a cluster's servers separated by commas
    /// (nats://a:4222,nats://b:4222,nats://c:4222): any one is used and the
    /// others take over when it is lost.
    #[arg(long, env = "MINIONS_NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub nats: String,
    /// Object store URL (job specs are read and manifests written there).
    /// Default: a per-user data dir.
    #[arg(long, env = "MINIONS_STORE")]
    pub store: Option<String>,
    /// NATS credentials and TLS.
    #[command(flatten)]
    pub security: minions_endpoints::nats::NatsSecurity,
    /// Replicas of the streams, consumer and registry if this watchdog is
    /// the one that creates them.
    #[command(flatten)]
    pub replication: minions_endpoints::streams::Replication,
    /// Heartbeat intervals a worker may miss before it is declared dead and
    /// its shards handed back. Lower moves work sooner and risks declaring a
    /// worker on a slow network dead (it then rejoins; nothing is lost).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub missed_beats: u32,
    /// A name for this watchdog (default: watchdog-<host>).
    #[arg(long)]
    pub name: Option<String>,
    /// Where to serve the live dashboard (/), job pages (/jobs/ID), JSON
    /// (/api/fleet), Prometheus metrics (/metrics) and /healthz, as
    /// HOST:PORT; `off` serves nothing. Loopback by default: the pages show
    /// host names and job ids, so expose them beyond this machine only
    /// behind an authenticating proxy.
    #[arg(long, env = "MINIONS_WATCHDOG_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// Serve the dashboard and /metrics to anyone who can reach them, as
    /// an operator (`minions dev` does, on loopback). Without it every
    /// request but /healthz needs a credential.
    #[arg(long)]
    pub http_open: bool,
    /// The access file: bearer tokens (kept as SHA-256) with their roles,
    /// written by `minions admin add-viewer` / `add-operator`; also the
    /// roles of users a trusted proxy names.
    #[arg(long, value_name = "FILE", env = "MINIONS_HTTP_ACCESS")]
    pub http_access: Option<std::path::PathBuf>,
    /// A header in which a trusted reverse proxy (single sign-on in front
    /// of the dashboard) names the signed-in user, e.g. X-Forwarded-User.
    /// Believed only from --http-trust-proxy addresses.
    #[arg(long, value_name = "HEADER", requires = "http_trust_proxy")]
    pub http_trust_header: Option<String>,
    /// The address the trusted proxy connects from (repeat for several).
    #[arg(long, value_name = "IP")]
    pub http_trust_proxy: Vec<std::net::IpAddr>,
    /// Serve HTTPS with this certificate chain (PEM; with --http-key).
    #[arg(long, value_name = "FILE", requires = "http_key")]
    pub http_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM; with --http-cert).
    #[arg(long, value_name = "FILE", requires = "http_cert")]
    pub http_key: Option<std::path::PathBuf>,
    /// Checkpoint the folded events (job progress, counters) to the store
    /// after this many events (at most every 30 s), after every
    /// --checkpoint-secs while events flow, once caught up and on a clean
    /// stop; a restart then reads only the events after the newest one.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_events: u64,
    /// Seconds between checkpoints while any event arrives.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_secs: u64,
    /// Neither read nor write checkpoints: every start replays the whole
    /// events stream.
    #[arg(long)]
    pub no_checkpoints: bool,
    /// Do not form groups for jobs split by layers (`minions submit
    /// --stages`). Where several watchdogs run, exactly one forms them:
    /// start the others with this.
    #[arg(long)]
    pub no_groups: bool,
    /// Count workers' `done` events without reading their outputs. Only
    /// for benchmarks of the watchdog itself on synthetic events: a fleet
    /// run this way counts a forged or corrupt result as done. By default
    /// each done is checked (output present, same SHA-256, that shard's)
    /// and one that fails is rejected and its shard run again.
    #[arg(long)]
    pub unchecked_results: bool,
    /// Half-life of a team's recent usage, in hours: a team that used many
    /// slots recently gets fewer while others wait, and this is how fast
    /// that fades (HTCondor's default is 24 h, Slurm's 7 days).
    #[arg(long, default_value_t = 24.0)]
    pub usage_half_life_hours: f64,
    /// Keep a usage ledger in PostgreSQL: jobs, every delivery of every
    /// shard, workers, and device time, records, tokens and energy per
    /// worker per hour, for `minions usage` and Grafana. A URL like
    /// postgres://minions:PASSWORD@db.example:5432/minions; the tables are
    /// created (and migrated) at start. The events stream stays the source
    /// of truth: a database that is down stops nothing, and the ledger
    /// catches up from where it stood when it returns. Several watchdogs
    /// may write one ledger. Also the settings file's `ledger` key.
    #[arg(long, env = "MINIONS_LEDGER")]
    pub ledger: Option<String>,
    /// Share of each job's shards run a second time on another machine to
    /// check the result, for jobs submitted without `minions submit
    /// --verify` (0 to 1; default 0, or the settings file's `verify`).
    /// Which shards is decided after each result arrives, by a keyed hash
    /// that workers cannot predict; a disagreement goes to a third machine
    /// and the majority decides.
    #[arg(long, env = "MINIONS_VERIFY")]
    pub verify: Option<f64>,
    /// The secret that picks checked shards: the same for every watchdog
    /// of the fleet, never given to workers (or the settings file's
    /// `verify_key`). Without one, a built-in key is used and a worker that
    /// knows it could tell which of its shards are checked.
    #[arg(long, env = "MINIONS_VERIFY_KEY", hide_env_values = true)]
    pub verify_key: Option<String>,
    /// Results outvoted by check runs (strikes) that quarantine a machine:
    /// its workers pull nothing until `minions worker release`, and its
    /// results in open jobs run again elsewhere.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub quarantine_after: u32,
    /// Hours a strike counts toward a quarantine: a machine is quarantined
    /// for results outvoted within this time, not for old ones.
    #[arg(long, default_value_t = crate::tracker::strikes::DEFAULT_EXPIRE_HOURS,
        value_parser = clap::value_parser!(u64).range(1..=87_600))]
    pub strikes_expire_hours: u64,
    /// Seconds a check run waits for a machine other than the one that made
    /// the result (a tie-break: a third). Past that the check closes
    /// `undecided`: the result stands, counted as unverified in `status`
    /// and the manifest, and the job can complete (a fleet of one machine
    /// never runs a check).
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub checks_wait_secs: u64,
    /// Finished jobs whose summary the dashboard keeps (the newest). A
    /// finished job's per-shard detail leaves memory once its manifest is
    /// written; older summaries go too, and the manifest answers for them.
    #[arg(long, default_value_t = crate::tracker::DEFAULT_FINISHED_KEPT as u64,
        value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub finished_jobs_kept: u64,
}

/// A flag value the watchdog cannot use.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// `--verify` outside 0..=1.
    #[error("--verify {0}: a share of shards, from 0 to 1 (0.02 checks 2 %)")]
    Verify(f64),
    /// The dashboard's access settings.
    #[error(transparent)]
    Access(#[from] crate::http::access::AccessSetupError),
}

/// The key used when the fleet gives none (see `--verify-key`).
const BUILT_IN_VERIFY_KEY: &str = "minions built-in verify key";

/// The dashboard's default address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

impl WatchdogArgs {
    /// The configuration these flags describe.
    pub fn into_config(self) -> Result<WatchdogConfig, ArgsError> {
        use minions_endpoints::host;
        let verify = self.verify.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&verify) {
            return Err(ArgsError::Verify(verify));
        }
        let verify_key = match self.verify_key.filter(|k| !k.is_empty()) {
            Some(k) => k.into_bytes(),
            None => {
                if verify > 0.0 {
                    tracing::warn!(
                        "no --verify-key (MINIONS_VERIFY_KEY): checked shards are picked with a built-in key that a worker could know"
                    );
                }
                BUILT_IN_VERIFY_KEY.as_bytes().to_vec()
            }
        };
        Ok(WatchdogConfig {
            verify_ppm: (verify * 1e6).round() as u32,
            verify_key,
            quarantine_after: self.quarantine_after,
            strikes_expire_ms: self.strikes_expire_hours.saturating_mul(3_600_000),
            checks_wait_ms: self.checks_wait_secs.saturating_mul(1000),
            finished_kept: usize::try_from(self.finished_jobs_kept).unwrap_or(usize::MAX),
            nats_url: self.nats,
            nats_security: self.security,
            replicas: usize::from(self.replication.replicas),
            store_url: self
                .store
                .unwrap_or_else(minions_endpoints::store::default_store_url),
            missed_beats: self.missed_beats,
            sweep_every: Duration::from_millis(100),
            listen: (self.listen != "off").then_some(self.listen),
            http_access: std::sync::Arc::new(crate::http::HttpAccess {
                tls: self.http_cert.zip(self.http_key),
                ..crate::http::HttpAccess::new(
                    self.http_open,
                    self.http_access.as_deref(),
                    self.http_trust_header.as_deref(),
                    self.http_trust_proxy,
                )?
            }),
            queue_poll: Duration::from_secs(1),
            schedule: crate::schedule::ScheduleSettings {
                usage_half_life: Duration::from_secs_f64(
                    (self.usage_half_life_hours.max(0.0) * 3600.0).min(1e12),
                ),
                ..Default::default()
            },
            ledger: self.ledger.map(crate::ledger::LedgerSettings::new),
            form_groups: !self.no_groups,
            check_results: !self.unchecked_results,
            checkpoints: crate::checkpoint::CheckpointPolicy {
                disabled: self.no_checkpoints,
                every_events: self.checkpoint_events,
                every: Duration::from_secs(self.checkpoint_secs),
                ..Default::default()
            },
            name: self.name.unwrap_or_else(|| {
                format!("watchdog-{}", host::id_prefix(&host::host_name(), "host"))
            }),
        })
    }
}
