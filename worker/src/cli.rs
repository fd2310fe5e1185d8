//! Command-line flags of `minions-worker`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use minions_endpoints::nats::DEFAULT_NATS_URL;

use crate::config::WorkerConfig;
use crate::model::{Batching, DeviceChoice, EnginePath};

/// Lend this machine's GPU to a Minions fleet: pull shards, run them, write
/// their outputs to the store, acknowledge.
///
/// The worker runs until Ctrl-C or SIGTERM; then it pulls nothing new, lets
/// running shards finish for up to --drain-timeout, and hands back the rest.
#[derive(Debug, Parser)]
#[command(name = "minions-worker", version, about, long_about)]
pub struct WorkerArgs {
    /// Something other than running the worker.
    #[command(subcommand)]
    pub command: Option<WorkerCommand>,
    /// NATS server URL; a cluster's servers separated by commas
    /// (nats://a:4222,nats://b:4222,nats://c:4222): any one is used and the
    /// others take over when it is lost.
    #[arg(long, global = true, env = "MINIONS_NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub nats: String,
    /// Object store URL: file:///dir or s3://bucket[/prefix] (S3 uses the usual
    /// AWS_* variables; AWS_ENDPOINT_URL for S3-compatible servers).
    /// Default: a per-user data dir.
    #[arg(long, global = true, env = "MINIONS_STORE")]
    pub store: Option<String>,
    /// NATS credentials and TLS.
    #[command(flatten)]
    pub security: minions_endpoints::nats::NatsSecurity,
    /// Replicas of the streams, consumer and registry if this worker is the
    /// one that creates them.
    #[command(flatten)]
    pub replication: minions_endpoints::streams::Replication,
    /// Folder for cached model files. Default: a per-user cache dir.
    #[arg(long, env = "MINIONS_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Shards held at once (one computes, the others move data).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub slots: u16,
    /// Memory this machine lends to models, MB: jobs that need more (`minions
    /// submit --memory-mb`, or estimated from the model) are left to other
    /// workers, never pulled here. Default: the owner policy's memory cap,
    /// else the GPU's or the machine's memory.
    #[arg(long, env = "MINIONS_LEND_MEMORY_MB")]
    pub lend_memory_mb: Option<u64>,
    /// Compute device.
    #[arg(long, global = true, env = "MINIONS_DEVICE", default_value_t = DeviceChoice::Auto,
          value_parser = PossibleValuesParser::new(
              DeviceChoice::CHOICES.map(|(name, help)| PossibleValue::new(name).help(help)))
              .try_map(|s| s.parse::<DeviceChoice>()))]
    pub device: DeviceChoice,
    /// Which code models run on the CPU: `device` runs exactly what Metal
    /// and CUDA run, on candle's CPU backend, to check a GPU build's code on
    /// any machine (slower than `fast`; answers close to, not equal to,
    /// fast's).
    #[arg(long, global = true, env = "MINIONS_ENGINE_PATH", default_value_t = EnginePath::Fast,
          value_parser = PossibleValuesParser::new(
              EnginePath::CHOICES.map(|(name, help)| PossibleValue::new(name).help(help)))
              .try_map(|s| s.parse::<EnginePath>()))]
    pub engine_path: EnginePath,
    /// Texts per forward pass when the job does not set one.
    #[arg(long, default_value_t = Batching::DEFAULT_TEXTS as u32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_batch: u32,
    /// Tokens per forward pass, padding included: texts sorted by length go
    /// into a pass until it holds --max-batch texts or this many tokens, so
    /// short texts run in large passes and long ones in small. A text longer
    /// than this runs alone.
    #[arg(long, default_value_t = Batching::DEFAULT_TOKENS as u32, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub batch_tokens: u32,
    /// Generation shards: sequences generated at once (continuous batching:
    /// when one ends, the next record of the shard takes its place). More
    /// is faster until the device is saturated, and needs more KV memory.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024), help_heading = "Generation")]
    pub max_seqs: u32,
    /// Generation shards: memory, MB, the key/value caches of the sequences
    /// in flight may take together. A sequence reserves room for its prompt
    /// plus its max_tokens before it starts, so this bounds memory exactly.
    /// Counts with the model's size against --max-memory-pct: a model that
    /// does not fit with it goes to a machine that can hold it.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(16..), help_heading = "Generation")]
    pub kv_budget_mb: u32,
    /// How many shards the worker may hold at once to keep the device's
    /// passes full. While a pass has room and nothing else waits, it pulls
    /// another shard of the running model (beyond --slots). Generation: its
    /// records join the running batch, so the batch stays full as a shard's
    /// last records end. Embeddings: small shards waiting for the device
    /// share passes of up to --max-batch texts. Each shard is still written
    /// and acked on its own. 1 runs each shard alone.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub max_shards: u16,
    /// Generation shards: seconds between checkpoints of finished records.
    /// A shard redelivered after a crash resumes from its last checkpoint;
    /// one handed back (owner's return, drain) checkpoints first.
    #[arg(long, default_value_t = 10.0, help_heading = "Generation")]
    pub checkpoint_secs: f64,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 1.0)]
    pub heartbeat_secs: f64,
    /// Seconds between reads of the cancellation markers of the jobs this
    /// worker runs: a cancellation sent while it was disconnected stops its
    /// shards within this time.
    #[arg(long, default_value_t = 10.0)]
    pub cancel_check_secs: f64,
    /// Seconds running shards may take to finish on shutdown before they are handed back.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout_secs: f64,
    /// Ack wait in seconds, used only if this worker creates the work consumer.
    #[arg(long, default_value_t = 60.0)]
    pub ack_wait_secs: f64,
    /// Max deliveries per shard, used only if this worker creates the work consumer.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub max_deliver: i64,
    /// Owner-first policy file (TOML): when the GPU may be lent. Without one
    /// (and without --owner-signal) the worker lends whenever it runs.
    #[arg(long, global = true, env = "MINIONS_POLICY")]
    pub policy: Option<PathBuf>,
    /// Owner signal source, added to the policy's (repeatable): file:PATH,
    /// command:CMD, loadavg, logind, nvidia-smi.
    #[arg(long = "owner-signal", global = true)]
    pub owner_signals: Vec<String>,
    /// Worker id prefix (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// Watts this machine draws while it runs shards, for the energy
    /// estimate used when no meter can be read (RAPL, nvidia-smi, or
    /// powermetrics as root). Default: a figure for the device kind.
    #[arg(long, global = true, env = "MINIONS_POWER_WATTS")]
    pub power_watts: Option<f64>,
}

/// What `minions-worker` does besides running.
#[derive(Debug, clap::Subcommand)]
pub enum WorkerCommand {
    /// Report device, memory, every owner signal (or why it cannot be read),
    /// the policy, and whether NATS and the store are reachable.
    Doctor,
    /// Run this worker as a background service of the logged-in user (a
    /// systemd user unit on Linux, a launchd LaunchAgent on macOS) with the
    /// flags given here; with --system, one of the whole machine (a system
    /// unit, a LaunchDaemon: for machines lent by IT; run it as root).
    /// Then waits for the worker's canary and prints its verdict and where
    /// the logs are; exits non-zero if the worker stopped instead.
    Install {
        /// Folder for the service file (default: the platform's user
        /// folder, or its system folder with --system).
        #[arg(long)]
        unit_dir: Option<PathBuf>,
        /// Write the file only; do not load or start it.
        #[arg(long)]
        no_start: bool,
        /// A service of the whole machine, started at boot without anyone
        /// logged in (/etc/systemd/system, /Library/LaunchDaemons).
        #[arg(long)]
        system: bool,
        /// With --system: the account the worker runs as (default: root;
        /// a dedicated account is better).
        #[arg(long, requires = "system")]
        run_as: Option<String>,
        /// Seconds to wait, once the service started, for the worker's
        /// canary verdict (0: do not wait).
        #[arg(long, default_value_t = 120, value_name = "SECS")]
        wait: u64,
    },
    /// Stop and remove the background service.
    Uninstall {
        /// Folder of the service file (default: the platform's user
        /// folder, or its system folder with --system).
        #[arg(long)]
        unit_dir: Option<PathBuf>,
        /// Remove the file only; do not stop the service.
        #[arg(long)]
        no_stop: bool,
        /// The service of the whole machine (see `install --system`).
        #[arg(long)]
        system: bool,
    },
}

impl WorkerArgs {
    /// The flags to pass to a service-run worker: those given on this
    /// command line, minus the subcommand and its own flags.
    pub fn service_args() -> Vec<String> {
        let mut out = Vec::new();
        let mut skip_value = false;
        for a in std::env::args().skip(1) {
            if skip_value {
                skip_value = false;
                continue;
            }
            match a.as_str() {
                "install" | "uninstall" | "--no-start" | "--no-stop" | "--system" => {}
                "--unit-dir" | "--run-as" | "--wait" => skip_value = true,
                _ if ["--unit-dir=", "--run-as=", "--wait="]
                    .iter()
                    .any(|f| a.starts_with(f)) => {}
                _ => out.push(a),
            }
        }
        out
    }
}

fn secs(name: &str, v: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(v) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => anyhow::bail!("--{name} must be a positive number of seconds, got {v}"),
    }
}

impl WorkerArgs {
    /// Turns flags into a configuration; fails on nonsensical values.
    pub fn into_config(self) -> anyhow::Result<WorkerConfig> {
        let store = self
            .store
            .unwrap_or_else(minions_endpoints::store::default_store_url);
        let mut c = WorkerConfig::new(self.nats, store);
        c.nats_security = self.security;
        if let Some(dir) = self.cache_dir {
            c.cache_dir = dir;
        }
        c.slots = usize::from(self.slots);
        c.lend_memory_mb = self.lend_memory_mb;
        c.device = self.device;
        c.engine_path = self.engine_path;
        c.max_batch = self.max_batch as usize;
        c.batch_tokens = self.batch_tokens as usize;
        c.generation = crate::generation::GenSettings {
            max_seqs: self.max_seqs as usize,
            kv_budget_bytes: (self.kv_budget_mb as usize) << 20,
            checkpoint_every: secs("checkpoint-secs", self.checkpoint_secs)?,
            max_shards: usize::from(self.max_shards),
        };
        c.heartbeat_interval = secs("heartbeat-secs", self.heartbeat_secs)?;
        c.cancel_check = secs("cancel-check-secs", self.cancel_check_secs)?;
        c.drain_timeout = secs("drain-timeout-secs", self.drain_timeout_secs)?;
        c.work.ack_wait = secs("ack-wait-secs", self.ack_wait_secs)?;
        c.work.max_deliver = self.max_deliver;
        c.work.replicas = usize::from(self.replication.replicas);
        c.name = self.name;
        if let Some(w) = self.power_watts {
            if !(w.is_finite() && w >= 0.0) {
                anyhow::bail!("--power-watts must be a number of watts ≥ 0, got {w}");
            }
            c.power_watts = Some(w);
        }
        if self.policy.is_some() || !self.owner_signals.is_empty() {
            let mut p = match &self.policy {
                Some(path) => {
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        anyhow::anyhow!("cannot read policy {}: {e}", path.display())
                    })?;
                    crate::owner::Policy::from_toml(&text)
                        .map_err(|e| anyhow::anyhow!("policy {}: {e}", path.display()))?
                }
                None => crate::owner::Policy::default(),
            };
            for s in self.owner_signals {
                s.parse::<crate::owner::Source>()
                    .map_err(anyhow::Error::msg)?;
                p.signals.push(s);
            }
            c.policy = Some(p);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> anyhow::Result<WorkerConfig> {
        let mut argv = vec!["minions-worker", "--store", "file:///tmp/minions-cli-test"];
        argv.extend_from_slice(args);
        WorkerArgs::try_parse_from(argv)?.into_config()
    }

    #[test]
    fn power_watts_sets_the_estimate_figure() -> anyhow::Result<()> {
        assert_eq!(config(&["--power-watts", "35.5"])?.power_watts, Some(35.5));
        assert_eq!(config(&["--power-watts", "0"])?.power_watts, Some(0.0));
        assert!(config(&["--power-watts=-1"]).is_err());
        assert!(config(&["--power-watts", "NaN"]).is_err());
        assert!(config(&["--power-watts", "lots"]).is_err());
        Ok(())
    }
}
