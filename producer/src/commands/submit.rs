//! `minions submit`: stream the input, cut it into shards, upload the shard
//! inputs, write the job spec, then publish one message per shard.
//!
//! Nothing is published until the whole input has been read and accepted, so
//! a malformed line at the end of a 5 GB file leaves no half-queued job.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use async_nats::jetstream;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use minions_endpoints::resilient;
use minions_schemas::messages::{
    EventKind, GenerationRecord, InputDescription, JobSpec, ShardInput,
};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, ModelName, SCHEMA_VERSION, encode, keys, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};

use crate::cli::{Endpoints, SubmitArgs};
use crate::input::{Input, ReadOptions, RecordSource};
use crate::jsonl::{ReadError, Record};
use crate::prompts::GenDefaults;
use crate::store_io::{get_doc, model_record};

/// Records per shard unless `--shard-size` says.
const DEFAULT_SHARD_SIZE: u32 = 256;
/// Audio files per shard unless `--shard-size` says: a shard of files of a
/// few minutes takes a CPU worker minutes, a GPU seconds.
const DEFAULT_SPEECH_SHARD_SIZE: u32 = 8;

/// Uploads in flight at once.
const UPLOAD_WINDOW: usize = 16;
/// Publishes awaiting their stream ack at once.
const PUBLISH_WINDOW: usize = 1024;

/// What a submit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitReport {
    /// The job.
    pub job: JobId,
    /// Records accepted.
    pub records: u64,
    /// Shards in the job.
    pub shards: u32,
    /// Shard messages newly stored in the work stream.
    pub published: u64,
    /// Shard messages the stream already held (duplicate message ids).
    pub duplicates: u64,
    /// Shards not published because their output exists.
    pub already_done: u64,
    /// Malformed lines skipped.
    pub skipped: u64,
}

/// Runs `minions submit` on the file `--input` names: a local path, or an
/// `s3://bucket/key` URL, copied first to a temporary file (read with the
/// same AWS_* settings as the store).
pub async fn run(endpoints: &Endpoints, args: SubmitArgs) -> anyhow::Result<SubmitReport> {
    let named = args.input.to_string_lossy().into_owned();
    // A folder of audio files is listed where it is, not copied whole.
    let folder = named.ends_with('/') || args.glob.is_some();
    if crate::input::is_remote(&named) && !folder {
        let local = crate::input::fetch_remote(&named).await?;
        let input = Input::Named {
            path: local.to_path_buf(),
            source: named,
        };
        return submit(endpoints, &args, input).await;
    }
    let input = Input::File(args.input.clone());
    submit(endpoints, &args, input).await
}

/// A job's place in the fleet's sharing: team, priority and needs.
struct Sharing {
    team: String,
    priority: minions_schemas::messages::Priority,
    needs: minions_schemas::messages::Requirements,
}

/// Resolves `--team`, `--priority`, `--memory-mb` and `--devices` against
/// the settings file and the model's size.
fn sharing(endpoints: &Endpoints, args: &SubmitArgs, model_bytes: u64) -> anyhow::Result<Sharing> {
    let (file_team, file_priority) =
        minions_endpoints::config_file::submit_defaults(endpoints.security.config.as_deref())?;
    let team = args
        .team
        .clone()
        .or(file_team)
        .unwrap_or_else(|| minions_schemas::messages::DEFAULT_TEAM.to_owned());
    minions_schemas::ids::validate("team", &team).context("--team")?;
    let priority = match (args.priority, file_priority) {
        (Some(p), _) => p.into(),
        (None, Some(p)) => minions_schemas::messages::Priority::parse(&p).with_context(|| {
            format!("the settings file's priority is {p:?}; use low, normal or high")
        })?,
        (None, None) => Default::default(),
    };
    // Weights and a fifth for what a forward pass holds besides them.
    let estimate = (model_bytes.saturating_mul(6) / 5).div_ceil(1 << 20);
    Ok(Sharing {
        team,
        priority,
        needs: minions_schemas::messages::Requirements {
            memory_mb: args.memory_mb.unwrap_or(estimate),
            devices: args.devices.iter().map(|d| d.as_str().to_owned()).collect(),
            stages: stages(args)?,
        },
    })
}

/// The stages `--stages` and `--split` ask for (0: one worker).
fn stages(args: &SubmitArgs) -> anyhow::Result<u32> {
    let split = u32::try_from(args.split.len()).unwrap_or(u32::MAX);
    match (args.stages, split) {
        (s, 0) => Ok(s.unwrap_or(0)),
        (_, 1) | (_, 5..) => anyhow::bail!(
            "--split {}: give 2 to 4 shares, one per stage",
            join(&args.split)
        ),
        (Some(s), n) if s != n => anyhow::bail!(
            "--split {} names {n} stages but --stages is {s}",
            join(&args.split)
        ),
        (_, n) => Ok(n),
    }
}

fn join(shares: &[u32]) -> String {
    shares
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Submits a job whose records come from `input` (`args.input` is not
/// read): reads and cuts it, uploads the shard inputs, writes the spec,
/// then publishes. Nothing is published unless the whole input is accepted.
pub async fn submit(
    endpoints: &Endpoints,
    args: &SubmitArgs,
    input: Input,
) -> anyhow::Result<SubmitReport> {
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
    let model_name = ModelName::new(&args.model).context("--model")?;
    let record = model_record(store.as_ref(), &model_name).await?;
    let speech = record.family == minions_schemas::messages::ModelFamily::WhisperSpeech;
    if !speech
        && (args.glob.is_some()
            || args.language.is_some()
            || args.beam_size != 1
            || args.initial_prompt.is_some())
    {
        anyhow::bail!(
            "--glob, --language, --beam-size and --initial-prompt are for speech models; model {} is a {} model",
            args.model,
            record.family
        );
    }
    let shard_size = args.shard_size.unwrap_or(if speech {
        DEFAULT_SPEECH_SHARD_SIZE
    } else {
        DEFAULT_SHARD_SIZE
    });
    let sharing = sharing(endpoints, args, record.bytes)?;
    if sharing.needs.stages > 1 {
        if record.family != minions_schemas::messages::ModelFamily::LlmGeneration {
            anyhow::bail!(
                "--stages: model {} is a {} model; only language models (llm-generation) run split over a group",
                args.model,
                record.family
            );
        }
        match record.layers {
            None => anyhow::bail!(
                "--stages: model {}'s record does not say how many layers it has (it was pushed by an older release); push it again",
                args.model
            ),
            Some(l) if l < sharing.needs.stages => anyhow::bail!(
                "--stages {}: model {} has {l} layers; each stage holds at least one",
                sharing.needs.stages,
                args.model
            ),
            Some(_) => {}
        }
    }
    // A generation job's layer count lets the watchdog split it over a
    // group: asked for, or when no one worker lends enough.
    let split_layers = if record.family == minions_schemas::messages::ModelFamily::LlmGeneration {
        record.layers
    } else {
        None
    };
    let job = match &args.job {
        Some(j) => JobId::new(j).context("--job")?,
        None => minions_schemas::keys::made_job_id(
            &sharing.team,
            &ulid::Ulid::new().to_string().to_lowercase(),
        )?,
    };

    let generates = record.family.generates();
    let opts = ReadOptions {
        text_field: args.text_field.clone(),
        id_field: args.id_field.clone(),
        max_line_bytes: args.max_line_bytes,
        generation: if generates {
            Some(gen_defaults(args, record.context)?)
        } else {
            None
        },
    };
    let source = input.source();
    let mut input_bytes = input.bytes();
    let table = input.is_parquet() || matches!(input, Input::Texts { .. });
    // Texts in memory with ids keep them as a JSON file's id field would.
    let id_field = match &input {
        Input::Texts { ids: Some(_), .. } => Some(args.id_field.clone().unwrap_or("id".into())),
        Input::Texts { ids: None, .. } => None,
        Input::File(_) | Input::Named { .. } if speech => Some("id".into()),
        Input::File(_) | Input::Named { .. } => args.id_field.clone(),
    };
    let mut reader: Box<dyn crate::input::RecordSource> = match &input {
        Input::File(p) | Input::Named { path: p, .. } if speech => {
            let defaults = speech_defaults(args)?;
            let glob = args.glob.as_deref();
            let r =
                crate::speech_input::open(store.clone(), &job, &source, p, glob, &defaults).await?;
            input_bytes = r.bytes_read();
            Box::new(r)
        }
        _ if speech => anyhow::bail!(
            "a speech model transcribes audio files: give --input a folder, an s3:// folder or a JSON Lines list of files"
        ),
        _ => input
            .open(&opts)
            .map_err(|e| anyhow::anyhow!("{e}; nothing was published"))?,
    };
    // A list of audio files is read (and its files checked) before the
    // fleet is reached, so a bad line is told without a server.
    let (client, js) = endpoints.connect("minions submit").await?;
    let settings =
        minions_endpoints::streams::ensure(&js, &endpoints.replication.work_settings()).await?;
    tracing::info!(job = %job, input = %source, bytes = input_bytes, shard_size, "reading input");

    // A job id given again: its inputs are in the store already (its spec
    // is written only after they all are). Overwrite none of them, so that
    // a different input under that id, refused below, changes nothing that
    // the job's shards read; inputs found missing are kept aside and put
    // back only once the spec shows the input is the same.
    let mut missing = Vec::new();
    let known = store
        .head(&StorePath::from(keys::job_spec(&job)))
        .await
        .is_ok();

    // Pass: read, cut, upload. Nothing is published yet.
    let started = Instant::now();
    let mut uploads = FuturesUnordered::new();
    let mut cutter = Cutter::new(&job, shard_size, id_field.is_some() || generates || speech);
    let mut skipped: u64 = 0;
    let mut last_report = Instant::now();
    loop {
        let rec = match reader.next_record() {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e @ (ReadError::Line(_) | ReadError::Row { .. })) if args.skip_bad => {
                tracing::warn!(input = %source, problem = %e, "skipping malformed record");
                skipped += 1;
                continue;
            }
            Err(e @ (ReadError::Line(_) | ReadError::Row { .. })) => {
                let what = if table { "row" } else { "line" };
                bail!(
                    "{source}: {e}; nothing was published (fix the {what}, or pass --skip-bad to skip such {what}s)"
                )
            }
            Err(ReadError::Input(e)) => bail!("{source}: {e}; nothing was published"),
            Err(ReadError::Io(e)) => bail!("{source}: cannot read: {e}"),
        };
        if let Some(input) = cutter.push(rec)? {
            if !known {
                uploads.push(upload(store.clone(), input));
                while uploads.len() >= UPLOAD_WINDOW {
                    if let Some(r) = uploads.next().await {
                        r?;
                    }
                }
            } else if !input_exists(store.as_ref(), &input).await {
                missing.push(input);
            }
        }
        if last_report.elapsed().as_secs() >= 2 {
            last_report = Instant::now();
            tracing::info!(
                records = cutter.records,
                shards = cutter.shard,
                mb_read = reader.bytes_read() / 1_000_000,
                "reading input"
            );
        }
    }
    if let Some(input) = cutter.finish()? {
        if !known {
            uploads.push(upload(store.clone(), input));
        } else if !input_exists(store.as_ref(), &input).await {
            missing.push(input);
        }
    }
    let (records, shard) = (cutter.records, cutter.shard);
    while let Some(r) = uploads.next().await {
        r?;
    }
    if records == 0 {
        bail!(
            "{source}: no records (the file is empty or every line was skipped); nothing was published"
        );
    }
    let shards = shard;
    let sha256 = reader.sha256_hex();

    let spec = JobSpec {
        submitter: endpoints.security.identity_name(),
        v: SCHEMA_VERSION,
        job: job.clone(),
        model_name: model_name.clone(),
        model_hash: record.hash.clone(),
        family: record.family,
        input: InputDescription {
            source,
            sha256,
            bytes: input_bytes,
            text_field: if speech {
                "audio".into()
            } else if generates && !table {
                "prompt|messages".into()
            } else {
                args.text_field.clone()
            },
            id_field,
        },
        shard_size,
        max_batch: args.max_batch,
        precision: args.precision.into(),
        shards,
        records,
        skipped,
        created_ms: now_ms(),
        team: sharing.team,
        priority: sharing.priority,
        preemptible: args.preemptible,
        needs: sharing.needs,
        verify_ppm: args.verify.map(|v| (v * 1e6).round() as u32),
        layers: split_layers,
        stage_split: args.split.clone(),
    };
    // A resubmit goes on with the stored spec, as retry, reconcile and the
    // watchdog do: its tasks and its consumer are the job's first ones.
    let (spec, resubmit) = match write_spec(store.as_ref(), &spec).await? {
        Some(stored) => {
            let changed = settings_changed(&stored, &spec);
            if !changed.is_empty() {
                tracing::warn!(job = %job, "the job exists: its shards run with its first submit's {} (not this one's)", changed.join(", "));
            }
            (stored, true)
        }
        None => (spec, false),
    };
    // The job's own consumer, before any of its shards is queued: made by
    // the watchdog that admits the job, else (none running) here.
    admit(&client, &js, &settings, &spec).await?;
    if !missing.is_empty() {
        tracing::info!(job = %job, shards = missing.len(), "putting back shard inputs missing from the store");
        for input in missing {
            upload(store.clone(), input).await?;
        }
    }
    // Dashboards learn of the job now, before any shard starts.
    minions_endpoints::job_control::publish_event(
        &js,
        &spec.job,
        0,
        EventKind::Submitted { shards },
    )
    .await?;

    // Publish.
    let mut published = 0u64;
    let mut duplicates = 0u64;
    let mut already_done = 0u64;
    let mut acks = FuturesUnordered::new();
    // A resubmit queues no shard the work stream still holds: message ids
    // stop catching repeats after the stream's duplicate window.
    let queued = if resubmit {
        queued_subjects(&js, &job).await?
    } else {
        std::collections::HashSet::new()
    };
    for s in 0..shards {
        if resubmit
            && store
                .head(&StorePath::from(keys::shard_output(&job, s)))
                .await
                .is_ok()
        {
            already_done += 1;
            continue;
        }
        if queued.contains(&subjects::work(&job, s)) {
            duplicates += 1;
            continue;
        }
        let task = spec.task(s);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            subjects::msg_id(&job, s).as_str(),
        );
        let payload = bytes::Bytes::from(encode("shard task", &task)?);
        let subject = subjects::work(&job, s);
        match js
            .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
            .await
        {
            Ok(ack) => {
                let ack = ack.into_future();
                acks.push(async move {
                    Unconfirmed {
                        subject,
                        headers,
                        payload,
                        ack: ack.await,
                    }
                });
            }
            Err(e) if resilient::transient_publish(&e) => {
                let ack = resilient::publish_confirmed(
                    &js,
                    &subject,
                    headers,
                    payload,
                    resilient::PATIENCE,
                )
                .await;
                count(ack, &mut published, &mut duplicates)?;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("publishing shard {s} of job {job}"));
            }
        }
        if last_report.elapsed().as_secs() >= 2 {
            last_report = Instant::now();
            tracing::info!(job = %job, shard = s, shards, "publishing");
        }
        while acks.len() >= PUBLISH_WINDOW {
            if let Some(a) = acks.next().await {
                count(a.settle(&js).await, &mut published, &mut duplicates)?;
            }
        }
    }
    while let Some(a) = acks.next().await {
        count(a.settle(&js).await, &mut published, &mut duplicates)?;
    }
    if published > 0 {
        // Schedulers read the queue now rather than at their next tick; a
        // lost nudge costs only that wait.
        let told = match client
            .publish(subjects::QUEUED, job.to_string().into())
            .await
        {
            Ok(()) => client.flush().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = told {
            tracing::debug!(job = %job, error = %e, "schedulers not told of the new shards");
        }
    }
    let report = SubmitReport {
        job,
        records,
        shards,
        published,
        duplicates,
        already_done,
        skipped,
    };
    tracing::info!(job = %report.job, records, shards, published, duplicates, already_done, skipped,
        model = %model_name, model_hash = record.hash.short(), secs = started.elapsed().as_secs_f64(),
        "job submitted");
    Ok(report)
}

/// Has `spec`'s job admitted by a watchdog (which makes its consumer), or
/// where none answers makes the consumer here. An identity that may not
/// make consumers (one made by `minions admin add-producer`) needs a
/// watchdog, and is told so.
async fn admit(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    settings: &minions_schemas::streams::WorkSettings,
    spec: &JobSpec,
) -> anyhow::Result<()> {
    use minions_endpoints::admission::{self, Admitted};
    match admission::ask(client, spec).await? {
        Admitted::ByWatchdog { by } => {
            tracing::debug!(job = %spec.job, by = %by, "job admitted");
            Ok(())
        }
        Admitted::NoWatchdog => minions_endpoints::queue::ensure_job_consumer(js, settings, spec)
            .await
            .map(drop)
            .with_context(|| {
                format!(
                    "no watchdog admitted job {} (none answered), so its consumer was made here, which failed; an identity made by `minions admin add-producer` may not make consumers itself: start a watchdog",
                    spec.job
                )
            }),
    }
}

/// The subjects of `job`'s shards that the work stream holds now (queued
/// or running).
async fn queued_subjects(
    js: &async_nats::jetstream::Context,
    job: &JobId,
) -> anyhow::Result<std::collections::HashSet<String>> {
    let stream = js
        .get_stream(minions_schemas::streams::WORK_STREAM)
        .await
        .context("reading the work stream")?;
    let mut held = stream
        .info_with_subjects(subjects::job_work(job))
        .await
        .context("reading the job's queued shards")?;
    let mut out = std::collections::HashSet::new();
    while let Some(s) = held.next().await {
        let (subject, n) = s.context("reading the job's queued shards")?;
        if n > 0 {
            out.insert(subject);
        }
    }
    Ok(out)
}

/// The job-level options of a speech job, checked.
fn speech_defaults(args: &SubmitArgs) -> anyhow::Result<minions_schemas::messages::SpeechOptions> {
    let o = minions_schemas::messages::SpeechOptions {
        language: args
            .language
            .as_deref()
            .map(crate::speech_input::language)
            .transpose()
            .context("--language")?,
        task: args.task.into(),
        timestamps: args.timestamps == crate::cli::TimestampsArg::Segment,
        beam_size: args.beam_size,
        temperatures: args.temperature.clone(),
        initial_prompt: args.initial_prompt.clone(),
    };
    o.check().map_err(|why| anyhow::anyhow!("{why}"))?;
    Ok(o)
}

/// The job-level defaults of a generation job, checked.
fn gen_defaults(args: &SubmitArgs, context: Option<u32>) -> anyhow::Result<GenDefaults> {
    let temperature = match args.temperature[..] {
        [t] => t,
        _ => {
            bail!("--temperature takes one value for a generation job (a list is for speech jobs)")
        }
    };
    if !(temperature >= 0.0 && temperature.is_finite()) {
        bail!("--temperature {temperature} must be 0 or more");
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--top-p {} must be above 0 and at most 1", args.top_p);
    }
    if let Some(ctx) = context
        && args.max_tokens > ctx
    {
        bail!(
            "--max-tokens {} exceeds the model's context of {ctx} tokens",
            args.max_tokens
        );
    }
    if args.stop.iter().any(String::is_empty) {
        bail!("--stop needs a non-empty string");
    }
    Ok(GenDefaults {
        max_tokens: args.max_tokens,
        temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        stop: args.stop.clone(),
        context,
    })
}

/// A shard task published, with what it takes to publish it again.
struct Unconfirmed {
    subject: String,
    headers: async_nats::HeaderMap,
    payload: bytes::Bytes,
    ack: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
}

impl Unconfirmed {
    /// The stream's confirmation; one lost to a leader election or a
    /// reconnect is sought again (the message id keeps the shard from being
    /// stored twice).
    async fn settle(
        self,
        js: &jetstream::Context,
    ) -> Result<jetstream::publish::PublishAck, jetstream::context::PublishError> {
        match self.ack {
            Err(e) if resilient::transient_publish(&e) => {
                tracing::debug!(subject = %self.subject, error = %e, "shard not confirmed; publishing it again");
                resilient::publish_confirmed(
                    js,
                    &self.subject,
                    self.headers,
                    self.payload,
                    resilient::PATIENCE,
                )
                .await
            }
            other => other,
        }
    }
}

fn count(
    ack: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
    published: &mut u64,
    duplicates: &mut u64,
) -> anyhow::Result<()> {
    let ack = ack.context("the work stream did not confirm a shard")?;
    if ack.duplicate {
        *duplicates += 1;
    } else {
        *published += 1;
    }
    Ok(())
}

/// Cuts records into shard inputs of `shard_size`, numbering them in order.
struct Cutter {
    job: JobId,
    shard_size: usize,
    with_ids: bool,
    /// Shards cut so far (the next shard's number).
    shard: u32,
    /// Records taken so far.
    records: u64,
    texts: Vec<String>,
    gens: Vec<GenerationRecord>,
    audio: Vec<minions_schemas::messages::AudioRecord>,
    ids: Vec<String>,
}

impl Cutter {
    fn new(job: &JobId, shard_size: u32, with_ids: bool) -> Self {
        Self {
            job: job.clone(),
            shard_size: shard_size as usize,
            with_ids,
            shard: 0,
            records: 0,
            texts: Vec::new(),
            gens: Vec::new(),
            audio: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// Records in the shard being filled.
    fn pending(&self) -> usize {
        self.texts.len() + self.gens.len() + self.audio.len()
    }

    /// Takes a record; returns a shard input when one is full.
    fn push(&mut self, rec: Record) -> anyhow::Result<Option<ShardInput>> {
        let row = self.records;
        self.records += 1;
        if let Some(a) = rec.audio {
            self.audio.push(a);
            self.ids.push(rec.id.unwrap_or_else(|| row.to_string()));
            if self.pending() == self.shard_size {
                return self.cut().map(Some);
            }
            return Ok(None);
        }
        match rec.generation {
            Some(g) => {
                self.gens.push(g);
                // Every generation record has an id: its own, else its row.
                self.ids.push(rec.id.unwrap_or_else(|| row.to_string()));
            }
            None => {
                self.texts.push(rec.text);
                if let Some(id) = rec.id {
                    self.ids.push(id);
                }
            }
        }
        if self.pending() == self.shard_size {
            return self.cut().map(Some);
        }
        Ok(None)
    }

    /// The last, partly filled shard input, if any.
    fn finish(&mut self) -> anyhow::Result<Option<ShardInput>> {
        if self.pending() == 0 {
            return Ok(None);
        }
        self.cut().map(Some)
    }

    fn cut(&mut self) -> anyhow::Result<ShardInput> {
        let input = ShardInput {
            v: SCHEMA_VERSION,
            job: self.job.clone(),
            shard: self.shard,
            first_row: self.records - self.pending() as u64,
            ids: self.with_ids.then(|| std::mem::take(&mut self.ids)),
            texts: std::mem::take(&mut self.texts),
            records: std::mem::take(&mut self.gens),
            audio: std::mem::take(&mut self.audio),
        };
        self.shard = self
            .shard
            .checked_add(1)
            .context("more than 2^32 shards; raise --shard-size")?;
        Ok(input)
    }
}

async fn upload(store: Arc<dyn ObjectStore>, input: ShardInput) -> anyhow::Result<()> {
    let key = StorePath::from(keys::shard_input(&input.job, input.shard));
    let bytes = encode("shard input", &input)?;
    store
        .put(&key, bytes.into())
        .await
        .map_err(|e| refused(e, &input.job))
        .with_context(|| format!("uploading {key}"))?;
    Ok(())
}

/// A store error, with what to do when the store refused the write: under
/// a team's store policy only `jobs/<team>--*` may be written.
fn refused(e: object_store::Error, job: &JobId) -> anyhow::Error {
    let denied = matches!(
        e,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    );
    let e = anyhow::Error::new(e);
    if denied {
        e.context(format!(
            "the store refused to write job {job}: under a team's store policy (deploy/s3/team-producer-policy.json) a job id begins with the team and \"--\", as `minions submit` makes them when --job is left out"
        ))
    } else {
        e
    }
}

/// Whether a shard's input is in the store.
async fn input_exists(store: &dyn ObjectStore, input: &ShardInput) -> bool {
    store
        .head(&StorePath::from(keys::shard_input(&input.job, input.shard)))
        .await
        .is_ok()
}

/// What a resubmit asked differently from the stored spec, in flag names
/// (the settings that do not make it another job).
fn settings_changed(stored: &JobSpec, asked: &JobSpec) -> Vec<String> {
    let mut changed = Vec::new();
    if stored.precision != asked.precision {
        changed.push(format!("--precision {}", stored.precision));
    }
    if stored.max_batch != asked.max_batch {
        changed.push(format!("--max-batch {}", stored.max_batch));
    }
    if stored.team != asked.team {
        changed.push(format!("--team {}", stored.team));
    }
    if stored.priority != asked.priority {
        changed.push(format!("--priority {}", stored.priority));
    }
    if stored.preemptible != asked.preemptible || stored.needs != asked.needs {
        changed.push("preemptibility and needs".to_owned());
    }
    if stored.verify_ppm != asked.verify_ppm {
        changed.push("--verify".to_owned());
    }
    changed
}

/// Writes the job spec create-only. Returns the stored spec when the same
/// job was submitted before (same input, model and shard size); refuses a
/// different job under an existing id.
async fn write_spec(store: &dyn ObjectStore, spec: &JobSpec) -> anyhow::Result<Option<JobSpec>> {
    let key = StorePath::from(keys::job_spec(&spec.job));
    let bytes = encode("job spec", spec)?;
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store.put_opts(&key, bytes.into(), opts).await {
        Ok(_) => Ok(None),
        Err(object_store::Error::AlreadyExists { .. }) => {
            let old: JobSpec = get_doc(
                store,
                &key,
                "job spec",
                minions_schemas::limits::MAX_SPEC_BYTES,
            )
            .await?
            .with_context(|| format!("job spec {key} vanished"))?;
            let same = old.input.sha256 == spec.input.sha256
                && old.model_hash == spec.model_hash
                && old.shard_size == spec.shard_size
                && old.input.text_field == spec.input.text_field
                && old.records == spec.records;
            if !same {
                bail!(
                    "job {} already exists with a different input, model or shard size \
                     (it has {} records of {} with model {}); choose another --job",
                    spec.job,
                    old.records,
                    old.input.source,
                    old.model_name
                );
            }
            tracing::info!(job = %spec.job, "job exists with the same input; publishing only shards not yet done");
            Ok(Some(old))
        }
        Err(e) => Err(refused(e, &spec.job)).with_context(|| format!("writing {key}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_shares_set_the_stages_and_must_agree_with_them() -> anyhow::Result<()> {
        use clap::Parser as _;
        let parse = |extra: &[&str]| -> anyhow::Result<SubmitArgs> {
            let mut args = vec!["minions", "submit", "--model", "m", "--input", "x.jsonl"];
            args.extend(extra);
            match crate::cli::Cli::try_parse_from(args)?.command {
                crate::cli::Command::Submit(a) => Ok(*a),
                _ => bail!("not a submit"),
            }
        };
        assert_eq!(stages(&parse(&[])?)?, 0);
        assert_eq!(stages(&parse(&["--stages", "3"])?)?, 3);
        assert_eq!(stages(&parse(&["--split", "7,23"])?)?, 2);
        assert_eq!(stages(&parse(&["--split", "1,1,1", "--stages", "3"])?)?, 3);
        let e = stages(&parse(&["--split", "1,1,1", "--stages", "2"])?)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("names 3 stages but --stages is 2"), "{e}");
        let e = stages(&parse(&["--split", "30"])?)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("give 2 to 4 shares"), "{e}");
        assert!(
            parse(&["--split", "0,30"]).is_err(),
            "a share of 0 is refused"
        );
        Ok(())
    }

    #[test]
    fn cuts_records_into_numbered_shards() -> anyhow::Result<()> {
        let job = JobId::new("j")?;
        let mut c = Cutter::new(&job, 2, true);
        let mut cut = Vec::new();
        for i in 0..5 {
            let rec = Record {
                generation: None,
                audio: None,
                id: Some(i.to_string()),
                text: format!("t{i}"),
            };
            cut.extend(c.push(rec)?);
        }
        cut.extend(c.finish()?);
        let shape: Vec<(u32, u64, usize)> = cut
            .iter()
            .map(|s| (s.shard, s.first_row, s.texts.len()))
            .collect();
        assert_eq!(shape, vec![(0, 0, 2), (1, 2, 2), (2, 4, 1)]);
        assert_eq!(cut[2].ids, Some(vec!["4".to_owned()]));
        assert_eq!((c.records, c.shard), (5, 3));
        assert!(c.finish()?.is_none());
        Ok(())
    }
}
