//! `schemas/WIRE.md` and the code agree: a sample of every message and
//! document type is encoded with the crate's own encoder, read back as a
//! schema-less MessagePack value, and every map key and every enum tag in it
//! must appear in WIRE.md as code (`` `name` ``, or `"name"` inside a code
//! span or a code block), as must the name of each type.
//!
//! The samples are struct literals, with every `Option` set, and every enum
//! is listed next to an exhaustive `match`, so a new field or a new variant
//! does not compile until it is added here, and then fails until WIRE.md
//! documents it.
//!
//! Settings WIRE.md states are checked against the code that makes them:
//! the key-value bucket table (§3.5) against `streams::*_kv_config`; the
//! job consumer's table, metadata keys and create subjects (§3.4) against
//! `queue::*_consumer_config`, `streams::work_stream_config` (those three
//! in minions-endpoints, which makes what the contract names) and
//! `deploy/nats/least-privilege.conf`. And its numbered sections run in
//! order, with every `§` reference naming one of them.

use std::collections::BTreeSet;
use std::fmt;

use minions_schemas::messages::{
    ActionKind, Admission, ChatTurn, Control, ControlCommand, ControlReply, DeadLetter, EventKind,
    FinishReason, Generation, GenerationRecord, GroupAnswer, GroupMember, GroupOrder, Heartbeat,
    InFlight, InputDescription, JobManifest, JobSpec, ManifestShard, ModelFamily, ModelFile,
    ModelManifest, ModelRecord, OperatorAction, OutputPayload, Precision, Priority, Prompt,
    Provenance, Quarantine, QueuedJob, Requirements, SamplingParams, Schedule, ShardCheckpoint,
    ShardEvent, ShardInput, ShardOutput, ShardTask, StageOpen, StagePass, StageReply, StageStep,
    SubmitClaim, TeamPolicy, TeamShare, VerdictOutcome, WorkerRecord, WorkerState,
};
use minions_schemas::messages::{
    AudioRecord, PartialTranscription, SpeechOptions, SpeechTask, TokenSegment, TranscriptSegment,
    Transcription,
};
use minions_schemas::{JobId, ModelHash, ModelName, SCHEMA_VERSION, WorkerId, codec};
use serde::Serialize;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Map keys whose string values are enum tags (internally or adjacently
/// tagged enums' tags, and fields holding a plain string enum).
const TAG_KEYS: [&str; 9] = [
    "kind",
    "task",
    "outcome",
    "type",
    "family",
    "precision",
    "command",
    "finish_reason",
    "state",
];

// ---------------------------------------------------------------------------
// A MessagePack value as the encoder wrote it, read without any schema.

enum Wire {
    Map(Vec<(Wire, Wire)>),
    Seq(Vec<Wire>),
    Str(String),
    Other,
}

impl<'de> Deserialize<'de> for Wire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WireVisitor)
    }
}

struct WireVisitor;

impl<'de> Visitor<'de> for WireVisitor {
    type Value = Wire;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any MessagePack value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Wire, E> {
        Ok(Wire::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Wire, E> {
        Ok(Wire::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Wire, E> {
        Ok(Wire::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Wire, E> {
        Ok(Wire::Other)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Wire, E> {
        Ok(Wire::Str(s.to_owned()))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Wire, E> {
        Ok(Wire::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Wire, E> {
        Ok(Wire::Other)
    }
    fn visit_none<E: de::Error>(self) -> Result<Wire, E> {
        Ok(Wire::Other)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Wire, D::Error> {
        Wire::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Wire, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Wire::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Wire, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Wire::Map(entries))
    }
}

/// Every map key, and every string under a [`TAG_KEYS`] key (or standing
/// alone, as a plain enum encodes), in a value.
#[derive(Default)]
struct Found {
    keys: BTreeSet<String>,
    tags: BTreeSet<String>,
}

impl Found {
    fn walk(&mut self, value: &Wire) {
        match value {
            Wire::Map(entries) => {
                for (k, v) in entries {
                    if let Wire::Str(key) = k {
                        self.keys.insert(key.clone());
                        if let (true, Wire::Str(tag)) = (TAG_KEYS.contains(&key.as_str()), v) {
                            self.tags.insert(tag.clone());
                        }
                    }
                    self.walk_inner(v);
                }
            }
            Wire::Seq(items) => items.iter().for_each(|i| self.walk_inner(i)),
            // A plain enum on its own encodes as its tag.
            Wire::Str(tag) => {
                self.tags.insert(tag.clone());
            }
            Wire::Other => {}
        }
    }

    /// Below the top level a bare string is data, not a tag.
    fn walk_inner(&mut self, value: &Wire) {
        if !matches!(value, Wire::Str(_)) {
            self.walk(value);
        }
    }
}

// ---------------------------------------------------------------------------
// What WIRE.md shows as code.

/// Every inline code span (trimmed) and every `"quoted"` string inside a code
/// span or a fenced code block.
fn documented_names(markdown: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut prose = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced {
            quoted(line, &mut names);
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Inline spans may run over a line break, so split the whole prose.
    for span in prose.split('`').skip(1).step_by(2) {
        names.insert(span.trim().to_owned());
        quoted(span, &mut names);
    }
    names
}

fn quoted(code: &str, names: &mut BTreeSet<String>) {
    for s in code.split('"').skip(1).step_by(2) {
        names.insert(s.to_owned());
    }
}

/// What one sample shows that WIRE.md does not.
#[derive(Debug, Default, PartialEq)]
struct Missing {
    type_name: String,
    type_undocumented: bool,
    keys: Vec<String>,
    tags: Vec<String>,
}

impl Missing {
    fn is_empty(&self) -> bool {
        !self.type_undocumented && self.keys.is_empty() && self.tags.is_empty()
    }
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.type_name)?;
        if self.type_undocumented {
            write!(f, " the type name is not in WIRE.md;")?;
        }
        if !self.keys.is_empty() {
            write!(f, " fields not in WIRE.md: {:?};", self.keys)?;
        }
        if !self.tags.is_empty() {
            write!(f, " enum tags not in WIRE.md: {:?};", self.tags)?;
        }
        Ok(())
    }
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Encodes `value` as the programs do and lists what of it `documented`
/// lacks.
fn missing<T: Serialize>(documented: &BTreeSet<String>, value: &T) -> Res<Missing> {
    let type_name = short_type_name::<T>();
    let bytes = codec::encode("sample", value)?;
    let wire: Wire = rmp_serde::from_slice(&bytes)?;
    let mut found = Found::default();
    found.walk(&wire);
    Ok(Missing {
        type_name: type_name.to_owned(),
        type_undocumented: !documented.contains(type_name),
        keys: found.keys.difference(documented).cloned().collect(),
        tags: found.tags.difference(documented).cloned().collect(),
    })
}

struct Checker {
    documented: BTreeSet<String>,
    problems: Vec<String>,
    checked: BTreeSet<&'static str>,
}

impl Checker {
    fn new() -> Res<Self> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/WIRE.md");
        let markdown = std::fs::read_to_string(path)?;
        Ok(Self {
            documented: documented_names(&markdown),
            problems: Vec::new(),
            checked: BTreeSet::new(),
        })
    }

    fn check<T: Serialize>(&mut self, value: &T) -> Res {
        self.checked.insert(short_type_name::<T>());
        let m = missing(&self.documented, value)?;
        if !m.is_empty() {
            let line = m.to_string();
            if !self.problems.contains(&line) {
                self.problems.push(line);
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Samples. Struct literals only (no `Default`), so a new field breaks the
// build here; every enum's list sits beside an exhaustive match.

struct Ids {
    job: JobId,
    worker: WorkerId,
    name: ModelName,
    hash: ModelHash,
}

fn ids() -> Res<Ids> {
    Ok(Ids {
        job: JobId::new("j1")?,
        worker: WorkerId::new("mac-01-3f9a2b7c")?,
        name: ModelName::new("minilm")?,
        hash: ModelHash::new("3b".repeat(32))?,
    })
}

fn every_family() -> Vec<ModelFamily> {
    let all = vec![
        ModelFamily::BertEmbedding,
        ModelFamily::LlmGeneration,
        ModelFamily::WhisperSpeech,
    ];
    for f in &all {
        match f {
            ModelFamily::BertEmbedding
            | ModelFamily::LlmGeneration
            | ModelFamily::WhisperSpeech => {}
        }
    }
    all
}

fn every_precision() -> Vec<Precision> {
    let all = vec![
        Precision::F32,
        Precision::Int8,
        Precision::F16,
        Precision::Bf16,
    ];
    for p in &all {
        match p {
            Precision::F32 | Precision::Int8 | Precision::F16 | Precision::Bf16 => {}
        }
    }
    all
}

fn every_priority() -> Vec<Priority> {
    let all = vec![Priority::Low, Priority::Normal, Priority::High];
    for p in &all {
        match p {
            Priority::Low | Priority::Normal | Priority::High => {}
        }
    }
    all
}

fn requirements() -> Requirements {
    Requirements {
        memory_mb: 16_384,
        devices: vec!["metal".into(), "cuda".into()],
        stages: 2,
    }
}

fn every_command() -> Vec<ControlCommand> {
    let all = vec![
        ControlCommand::Drain,
        ControlCommand::Evict,
        ControlCommand::Resume,
        ControlCommand::Rejoin,
    ];
    for c in &all {
        match c {
            ControlCommand::Drain
            | ControlCommand::Evict
            | ControlCommand::Resume
            | ControlCommand::Rejoin => {}
        }
    }
    all
}

fn every_finish_reason() -> Vec<FinishReason> {
    let all = vec![
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Error,
    ];
    for r in &all {
        match r {
            FinishReason::Stop | FinishReason::Length | FinishReason::Error => {}
        }
    }
    all
}

fn every_worker_state() -> Vec<WorkerState> {
    let all = vec![
        WorkerState::Joining,
        WorkerState::Idle,
        WorkerState::Busy,
        WorkerState::Draining,
        WorkerState::Suspect,
        WorkerState::Dead,
        WorkerState::Left,
    ];
    for s in &all {
        match s {
            WorkerState::Joining
            | WorkerState::Idle
            | WorkerState::Busy
            | WorkerState::Draining
            | WorkerState::Suspect
            | WorkerState::Dead
            | WorkerState::Left => {}
        }
    }
    all
}

fn every_event_kind() -> Vec<EventKind> {
    let all = vec![
        EventKind::Submitted { shards: 40 },
        EventKind::Started,
        EventKind::Done {
            rows: 256,
            output_bytes: 393_344,
            duration_ms: 1830,
            compute_ms: 1502,
            already_done: false,
            sha256: "3b".repeat(32),
            tokens: 12,
            audio_ms: 61_250,
            made_by: Some(provenance()),
        },
        EventKind::Progress {
            records: 100,
            tokens: 3000,
            audio_ms: 30_000,
        },
        EventKind::Requeued,
        EventKind::HandedBack {
            reason: "worker stopping".into(),
        },
        EventKind::Failed {
            reason: "unknown model".into(),
            permanent: true,
            stream_seq: Some(4711),
        },
        EventKind::Checked {
            round: 1,
            rows: 256,
            output_bytes: 393_344,
            duration_ms: 1830,
            compute_ms: 1502,
            sha256: "3b".repeat(32),
            made_by: Some(provenance()),
        },
        EventKind::Rejected {
            by: WorkerId::new("m1-0a1b2c3d").unwrap_or_else(|e| panic!("{e}")),
            sha256: "3b".repeat(32),
            reason: "its output is not in the store".into(),
        },
        EventKind::CheckQueued {
            round: 1,
            avoid: vec!["m1".into()],
        },
        EventKind::Verdict {
            round: 2,
            outcome: VerdictOutcome::Decided,
            outvoted: vec![WorkerId::new("m1-0a1b2c3d").unwrap_or_else(|e| panic!("{e}"))],
            stands: Some(WorkerId::new("m2-4e5f6a7b").unwrap_or_else(|e| panic!("{e}"))),
            sha256: "3b".repeat(32),
            detail: "the tie-break agrees with the first check run".into(),
        },
    ];
    let mut all = all;
    for outcome in [
        VerdictOutcome::Agreed,
        VerdictOutcome::Disagreed,
        VerdictOutcome::Undecided,
    ] {
        match outcome {
            VerdictOutcome::Agreed
            | VerdictOutcome::Disagreed
            | VerdictOutcome::Decided
            | VerdictOutcome::Undecided => {}
        }
        all.push(EventKind::Verdict {
            round: 1,
            outcome,
            outvoted: Vec::new(),
            stands: None,
            sha256: "3b".repeat(32),
            detail: "the same output, byte for byte".into(),
        });
    }
    for k in &all {
        match k {
            EventKind::Submitted { .. }
            | EventKind::Started
            | EventKind::Done { .. }
            | EventKind::Progress { .. }
            | EventKind::Requeued
            | EventKind::HandedBack { .. }
            | EventKind::Failed { .. }
            | EventKind::Rejected { .. }
            | EventKind::Checked { .. }
            | EventKind::CheckQueued { .. }
            | EventKind::Verdict { .. } => {}
        }
    }
    all
}

fn every_prompt() -> Vec<Prompt> {
    let all = vec![
        Prompt::Text("<|im_start|>user\nhi<|im_end|>\n".into()),
        Prompt::Messages(vec![chat_turn()]),
    ];
    for p in &all {
        match p {
            Prompt::Text(_) | Prompt::Messages(_) => {}
        }
    }
    all
}

fn audio_record(task: SpeechTask) -> AudioRecord {
    AudioRecord {
        key: format!("jobs/j/audio/{}.mp3", "ab".repeat(32)),
        bytes: 1_234_567,
        name: "0016.mp3".into(),
        options: SpeechOptions {
            language: Some("de".into()),
            task,
            timestamps: true,
            beam_size: 5,
            temperatures: vec![0.0, 0.2, 0.4],
            initial_prompt: Some("Minions, JetStream.".into()),
        },
    }
}

fn transcription() -> Transcription {
    Transcription {
        text: "Hello there.".into(),
        language: Some("en".into()),
        segments: vec![TranscriptSegment {
            start: 0.0,
            end: 1.52,
            text: " Hello there.".into(),
        }],
        duration: 1.6,
        error: Some("none: every Option is set in samples".into()),
    }
}

fn every_payload() -> Vec<OutputPayload> {
    let all = vec![
        OutputPayload::Embeddings {
            dim: 2,
            data: vec![0; 2 * 2 * 4],
        },
        OutputPayload::Generations {
            records: every_finish_reason().into_iter().map(generation).collect(),
        },
        OutputPayload::Transcripts {
            records: vec![transcription(), Transcription::failed("bad.wav: not audio")],
        },
    ];
    for p in &all {
        match p {
            OutputPayload::Embeddings { .. }
            | OutputPayload::Generations { .. }
            | OutputPayload::Transcripts { .. } => {}
        }
    }
    all
}

fn chat_turn() -> ChatTurn {
    ChatTurn {
        role: "user".into(),
        content: "Say hello.".into(),
    }
}

fn sampling() -> SamplingParams {
    SamplingParams {
        max_tokens: 64,
        temperature: 0.7,
        top_p: 0.9,
        top_k: 40,
        seed: 42,
        stop: vec!["\n\n".into()],
    }
}

fn generation(finish_reason: FinishReason) -> Generation {
    Generation {
        text: "Hello.".into(),
        finish_reason,
        prompt_tokens: 9,
        completion_tokens: 3,
        error: Some("prompt exceeds the context".into()),
    }
}

fn input_description() -> InputDescription {
    InputDescription {
        source: "docs.jsonl".into(),
        sha256: "ab".repeat(32),
        bytes: 123_456,
        text_field: "text".into(),
        id_field: Some("id".into()),
    }
}

fn in_flight(ids: &Ids) -> InFlight {
    InFlight {
        job: ids.job.clone(),
        shard: 7,
        reply: "$JS.ACK.MINIONS_WORK.minions-workers.1.2.3.4.5.6.7".into(),
        started_ms: 1_767_225_600_000,
    }
}

fn model_file() -> ModelFile {
    ModelFile {
        name: "model.safetensors".into(),
        bytes: 90_868_376,
        sha256: "cd".repeat(32),
        chunks: vec!["ab".repeat(32); 6],
    }
}

fn provenance() -> Provenance {
    Provenance {
        build: "0.1.0+3fa2c81b09de".into(),
        device: "metal:0".into(),
        kernel: "portable".into(),
    }
}

fn manifest_shard(ids: &Ids) -> ManifestShard {
    ManifestShard {
        shard: 0,
        outcome: "done".into(),
        output_key: Some("jobs/j1/outputs/00000000.msgpack".into()),
        sha256: Some("ef".repeat(32)),
        worker: Some(ids.worker.clone()),
        attempts: 1,
        duration_ms: 1830,
        reason: Some("unknown model".into()),
        made_by: Some(provenance()),
    }
}

fn job_spec(ids: &Ids, family: ModelFamily, precision: Precision) -> JobSpec {
    JobSpec {
        submitter: "ana@mac-07".into(),
        verify_ppm: None,
        layers: Some(30),
        stage_split: vec![7, 23],
        v: SCHEMA_VERSION,
        job: ids.job.clone(),
        model_name: ids.name.clone(),
        model_hash: ids.hash.clone(),
        family,
        input: input_description(),
        shard_size: 256,
        max_batch: 32,
        precision,
        shards: 40,
        records: 10_000,
        skipped: 2,
        created_ms: 1_767_225_600_000,
        team: "search".into(),
        priority: Priority::High,
        preemptible: true,
        needs: requirements(),
    }
}

fn generation_record(prompt: Prompt) -> GenerationRecord {
    GenerationRecord {
        prompt,
        params: sampling(),
    }
}

/// Checks a sample of every type that crosses a process boundary.
fn every_action_kind() -> Vec<ActionKind> {
    use ActionKind as A;
    let all = vec![
        A::Drain,
        A::Evict,
        A::Resume,
        A::Release,
        A::Cancel,
        A::Retry,
        A::TeamSet,
        A::Quarantine,
    ];
    for a in &all {
        match a {
            A::Drain
            | A::Evict
            | A::Resume
            | A::Release
            | A::Cancel
            | A::Retry
            | A::TeamSet
            | A::Quarantine => {}
        }
    }
    all
}

fn check_all(c: &mut Checker) -> Res {
    let ids = ids()?;
    let v = SCHEMA_VERSION;

    // Plain string enums, every variant, on their own.
    for x in every_family() {
        c.check(&x)?;
    }
    for x in every_precision() {
        c.check(&x)?;
    }
    for x in every_command() {
        c.check(&x)?;
    }
    for x in every_finish_reason() {
        c.check(&x)?;
    }
    for x in every_worker_state() {
        c.check(&x)?;
    }
    for x in [
        VerdictOutcome::Agreed,
        VerdictOutcome::Disagreed,
        VerdictOutcome::Decided,
        VerdictOutcome::Undecided,
    ] {
        c.check(&x)?;
    }

    // ShardTask, in every family and precision.
    for family in every_family() {
        for precision in every_precision() {
            c.check(&ShardTask {
                v,
                job: ids.job.clone(),
                shard: 7,
                shards: 40,
                rows: 256,
                first_row: 1792,
                model_hash: ids.hash.clone(),
                family,
                max_batch: 32,
                precision,
                check: 1,
                avoid: vec!["m1".into()],
            })?;
        }
    }

    // ShardEvent with every kind, and each kind on its own.
    for kind in every_event_kind() {
        c.check(&kind)?;
        c.check(&ShardEvent {
            energy: Some(minions_schemas::messages::Energy {
                joules: 41.5,
                measured: true,
                source: "rapl".into(),
            }),
            v,
            job: ids.job.clone(),
            shard: 7,
            worker: ids.worker.clone(),
            host: "mac-01.local".into(),
            attempt: 1,
            at_ms: 1_767_225_612_345,
            kind,
        })?;
    }

    // Heartbeat and InFlight.
    c.check(&in_flight(&ids))?;
    c.check(&Heartbeat {
        chip: "Apple M2 Pro".into(),
        lend_mb: 12_288,
        power: Some(minions_schemas::messages::PowerReading {
            watts: 18.2,
            joules: 5120.0,
            measured: false,
            source: "estimate".into(),
        }),
        v,
        worker: ids.worker.clone(),
        host: "mac-01.local".into(),
        device: "metal:0".into(),
        slots: 2,
        holds: 4,
        draining: false,
        leaving: false,
        owner: "available".into(),
        mem_total_mb: 32_768,
        mem_avail_mb: 16_384,
        mem_budget_mb: 8192,
        in_flight: vec![in_flight(&ids)],
        done: 3,
        failed: 1,
        interval_ms: 1000,
        started_ms: 1_767_225_600_000,
        at_ms: 1_767_225_612_345,
        build: "0.1.0+3fa2c81b09de".into(),
        kernel: "avx512".into(),
        stage: Some(minions_schemas::messages::HeldStage {
            group: "g-search--01jr".into(),
            epoch: 1_767_225_600_000,
            index: 1,
            of: 2,
            first_layer: 15,
            end_layer: 30,
            layer_ns: 41_250,
        }),
    })?;

    // Control, with every command, and ControlReply.
    for command in every_command() {
        c.check(&Control {
            v,
            command,
            by: "cli".into(),
        })?;
    }
    c.check(&ControlReply {
        v,
        worker: ids.worker.clone(),
        status: "draining".into(),
        handed_back: 1,
    })?;

    // JobSpec and InputDescription.
    c.check(&input_description())?;
    for family in every_family() {
        for precision in every_precision() {
            c.check(&job_spec(&ids, family, precision))?;
        }
    }

    // Scheduling: priorities, requirements, team policies, the schedule.
    for p in every_priority() {
        c.check(&p)?;
    }
    c.check(&requirements())?;
    let policy = TeamPolicy {
        v,
        weight: 3.0,
        quota: 16,
    };
    c.check(&policy)?;
    c.check(&minions_schemas::scheduling::Teams {
        v,
        teams: [("search".to_owned(), policy)].into_iter().collect(),
    })?;
    let queued = QueuedJob {
        job: ids.job.clone(),
        team: "search".into(),
        priority: Priority::Normal,
        preemptible: false,
        needs: requirements(),
        model_hash: ids.hash.clone(),
        created_ms: 1_767_225_600_000,
        pending: 1_200,
        running: 8,
        checks: 0,
    };
    c.check(&queued)?;
    let share = TeamShare {
        team: "search".into(),
        weight: 3.0,
        quota: 16,
        usage: 7.5,
    };
    c.check(&share)?;
    c.check(&Schedule {
        v,
        at_ms: 1_767_225_612_345,
        jobs: vec![queued],
        teams: vec![share],
        preempt: 0.25,
        idle: 3,
    })?;

    // ShardInput with texts, and with generation records of every prompt kind.
    c.check(&ShardInput {
        v,
        job: ids.job.clone(),
        shard: 7,
        first_row: 1792,
        ids: Some(vec!["doc-1792".into(), "doc-1793".into()]),
        texts: vec!["first text".into(), "second text".into()],
        records: Vec::new(),
        audio: Vec::new(),
    })?;
    c.check(&chat_turn())?;
    c.check(&sampling())?;
    for prompt in every_prompt() {
        c.check(&prompt)?;
        c.check(&generation_record(prompt))?;
    }
    c.check(&ShardInput {
        v,
        job: ids.job.clone(),
        shard: 7,
        first_row: 1792,
        ids: Some(vec!["req-1".into(), "req-2".into()]),
        texts: Vec::new(),
        records: every_prompt().into_iter().map(generation_record).collect(),
        audio: Vec::new(),
    })?;
    for task in [SpeechTask::Transcribe, SpeechTask::Translate] {
        c.check(&audio_record(task))?;
    }
    c.check(&ShardInput {
        v,
        job: ids.job.clone(),
        shard: 7,
        first_row: 16,
        ids: Some(vec!["calls/0016.mp3".into(), "calls/0017.mp3".into()]),
        texts: Vec::new(),
        records: Vec::new(),
        audio: vec![
            audio_record(SpeechTask::Transcribe),
            audio_record(SpeechTask::Translate),
        ],
    })?;

    // ShardOutput with every payload; Generation with every finish reason.
    for reason in every_finish_reason() {
        c.check(&generation(reason))?;
    }
    for payload in every_payload() {
        c.check(&payload)?;
        c.check(&ShardOutput {
            v,
            job: ids.job.clone(),
            shard: 7,
            first_row: 1792,
            rows: 2,
            model_hash: ids.hash.clone(),
            worker: ids.worker.clone(),
            payload,
            made_by: Some(provenance()),
        })?;
    }

    // ShardCheckpoint.
    c.check(&ShardCheckpoint {
        v,
        job: ids.job.clone(),
        shard: 7,
        rows: 3,
        model_hash: ids.hash.clone(),
        done: every_finish_reason()
            .into_iter()
            .zip(0u32..)
            .map(|(r, i)| (i, generation(r)))
            .collect(),
        transcripts: Vec::new(),
        partial: Vec::new(),
    })?;
    c.check(&ShardCheckpoint {
        v,
        job: ids.job.clone(),
        shard: 7,
        rows: 3,
        model_hash: ids.hash.clone(),
        done: Vec::new(),
        transcripts: vec![(0, transcription())],
        partial: vec![(
            2,
            PartialTranscription {
                seek: 2_860,
                language: Some(50_259),
                windows: 1,
                segments: vec![TokenSegment {
                    start: 0.0,
                    end: 4.2,
                    tokens: vec![50_364, 440, 50_574],
                }],
            },
        )],
    })?;

    // ModelManifest, ModelFile, ModelRecord.
    c.check(&model_file())?;
    for family in every_family() {
        c.check(&ModelManifest {
            v,
            family,
            files: vec![model_file()],
        })?;
        c.check(&ModelRecord {
            v,
            name: ids.name.clone(),
            hash: ids.hash.clone(),
            family,
            bytes: 90_868_376,
            pushed_ms: 1_767_225_600_000,
            context: Some(8192),
            layers: Some(30),
        })?;
    }

    // DeadLetter.
    c.check(&DeadLetter {
        v,
        job: ids.job.clone(),
        shard: 7,
        payload: vec![0x80],
        reason: "unknown model".into(),
        cause: "terminated".into(),
        deliveries: 1,
        hosts: vec!["mac-01.local".into()],
        stream_seq: 0,
        at_ms: 1_767_225_612_345,
    })?;

    // JobManifest and ManifestShard.
    c.check(&manifest_shard(&ids))?;
    c.check(&JobManifest {
        v,
        job: ids.job.clone(),
        model_hash: ids.hash.clone(),
        records: 10_000,
        done: 39,
        failed: 1,
        rejected: 2,
        verified: 3,
        disagreements: 1,
        unverified: 1,
        shards: vec![manifest_shard(&ids)],
        completed_ms: 1_767_225_700_000,
    })?;

    // WorkerRecord, in every state.
    for state in every_worker_state() {
        c.check(&WorkerRecord {
            v,
            worker: ids.worker.clone(),
            host: "mac-01.local".into(),
            device: "cpu".into(),
            state,
            reason: "missed 3 heartbeats".into(),
            handed_back: 1,
            changed_ms: 1_767_225_612_345,
            by: "watchdog-ops".into(),
        })?;
    }

    // Quarantine, held and released.
    for quarantined in [true, false] {
        c.check(&Quarantine {
            v,
            machine: "mac-07".into(),
            quarantined,
            strikes: 2,
            reason: "2 of its results outvoted by check runs on other machines".into(),
            by: "watchdog-ops".into(),
            at_ms: 1_767_225_612_345,
        })?;
    }
    for action in every_action_kind() {
        c.check(&OperatorAction {
            v,
            at_ms: 1_767_225_612_345,
            by: "ana".into(),
            via: "cli".into(),
            action,
            target: "mac-07".into(),
            detail: "weight 3".into(),
        })?;
    }
    c.check(&SubmitClaim {
        v,
        job: ids.job.clone(),
    })?;
    for admitted in [true, false] {
        c.check(&Admission {
            v,
            admitted,
            detail: String::new(),
            by: "watchdog-ops".into(),
        })?;
    }
    let params = SamplingParams {
        max_tokens: 64,
        temperature: 0.7,
        top_p: 0.9,
        top_k: 40,
        seed: 7,
        stop: vec!["\n\n".into()],
    };
    c.check(&StagePass {
        v,
        group: "g-01jr".into(),
        epoch: 3,
        pass: 120,
        micro: 1,
        ended: vec![4],
        steps: vec![StageStep {
            seq: 9,
            start: 12,
            tokens: 1,
            sample: true,
            open: Some(StageOpen {
                capacity: 80,
                params,
                prefix_of: Some(2),
                shared: true,
            }),
        }],
        width: 2,
        hidden: StagePass::hidden_bytes(&[0.5, -1.0]),
    })?;
    c.check(&StageReply {
        v,
        group: "g-01jr".into(),
        epoch: 3,
        pass: 120,
        micro: 1,
        tokens: vec![42],
        error: Some("stage 1 (layers 15..30): garbled".into()),
    })?;
    c.check(&GroupOrder {
        v,
        group: "g-search--01jr".into(),
        epoch: 1_767_225_600_000,
        job: ids.job.clone(),
        model_hash: ids.hash.clone(),
        members: vec![GroupMember {
            worker: ids.worker.clone(),
            first_layer: 0,
            end_layer: 15,
        }],
        release: false,
        by: "watchdog-ops".into(),
    })?;
    c.check(&GroupAnswer {
        v,
        worker: ids.worker.clone(),
        group: "g-search--01jr".into(),
        epoch: 1_767_225_600_000,
        ready: true,
        detail: "stage 1 of 2: layers 15..30".into(),
        weight_bytes: 40_000_000,
    })?;
    c.check(&minions_schemas::stage_frames::StagePart {
        v,
        epoch: 3,
        pass: 120,
        part: 0,
        parts: 1,
        total: 3,
        crc: 0,
        bytes: b"abc".to_vec(),
    })?;
    Ok(())
}

#[test]
fn wire_md_documents_every_field_and_tag() -> Res {
    let mut c = Checker::new()?;
    check_all(&mut c)?;
    // Every type WIRE.md §4 describes was sampled (a guard against a sample
    // being dropped from `check_all`).
    let expected = [
        "ShardTask",
        "ShardEvent",
        "EventKind",
        "Heartbeat",
        "InFlight",
        "Control",
        "ControlCommand",
        "ControlReply",
        "JobSpec",
        "InputDescription",
        "ShardInput",
        "GenerationRecord",
        "Prompt",
        "ChatTurn",
        "SamplingParams",
        "ShardOutput",
        "OutputPayload",
        "Generation",
        "FinishReason",
        "ShardCheckpoint",
        "ModelManifest",
        "ModelFile",
        "ModelRecord",
        "ModelFamily",
        "Precision",
        "DeadLetter",
        "JobManifest",
        "ManifestShard",
        "WorkerRecord",
        "WorkerState",
        "Quarantine",
        "VerdictOutcome",
        "Priority",
        "Requirements",
        "TeamPolicy",
        "Teams",
        "QueuedJob",
        "TeamShare",
        "Schedule",
        "StagePass",
        "StageReply",
        "GroupOrder",
        "GroupAnswer",
        "StagePart",
    ];
    let unsampled: Vec<&str> = expected
        .iter()
        .copied()
        .filter(|t| !c.checked.contains(t))
        .collect();
    assert!(unsampled.is_empty(), "types not sampled: {unsampled:?}");
    assert!(
        c.problems.is_empty(),
        "schemas/WIRE.md lacks names the code puts on the wire (write each as `name` \
         in the section of its type):\n{}",
        c.problems.join("\n")
    );
    Ok(())
}

/// The check can fail: a field, a tag and a type WIRE.md does not name are
/// each reported.
#[test]
fn walker_reports_what_wire_md_lacks() -> Res {
    #[derive(Serialize)]
    struct UndocumentedThing {
        v: u16,
        no_such_field_in_wire_md: u32,
        kind: &'static str,
        nested: Vec<Inner>,
    }
    #[derive(Serialize)]
    struct Inner {
        nor_this_one: &'static str,
    }
    let documented = documented_names(
        "A `v` here, `{\"kind\": \"submitted\"}` there,\nand `UndocumentedThing` as a type.\n",
    );
    let thing = UndocumentedThing {
        v: 1,
        no_such_field_in_wire_md: 3,
        kind: "no-such-tag",
        nested: vec![Inner {
            nor_this_one: "data, not a tag",
        }],
    };
    let m = missing(&documented, &thing)?;
    assert_eq!(
        m,
        Missing {
            type_name: "UndocumentedThing".into(),
            type_undocumented: false,
            keys: vec![
                "nested".into(),
                "no_such_field_in_wire_md".into(),
                "nor_this_one".into()
            ],
            tags: vec!["no-such-tag".into()],
        }
    );
    let m = missing(&BTreeSet::new(), &thing)?;
    assert!(m.type_undocumented, "{m}");
    assert!(m.to_string().contains("no_such_field_in_wire_md"), "{m}");

    // Fenced code blocks count by their quoted strings only.
    let documented = documented_names("```json\n{\"a\": 1, \"b\": [\"c\"]}\nbare\n```\n");
    let want: BTreeSet<String> = ["a", "b", "c"].into_iter().map(String::from).collect();
    assert_eq!(documented, want);
    Ok(())
}

// ---------------------------------------------------------------------------
// Settings, subjects and section numbers WIRE.md states, against the code
// (and the permission file) they come from.

fn wire_md() -> Res<String> {
    Ok(std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/WIRE.md"
    ))?)
}

/// Every inline code span outside fenced blocks, trimmed, a line break in
/// it read as a space.
fn code_spans(markdown: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.trim().replace('\n', " "))
        .collect()
}

/// The paragraph (text between blank lines) that starts with `start`.
fn paragraph<'a>(markdown: &'a str, start: &str) -> Option<&'a str> {
    markdown.split("\n\n").find(|p| p.starts_with(start))
}

/// The rows of the first table whose header starts with `| <first> |`, each
/// as column name → trimmed cell.
fn table(markdown: &str, first: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let cells = |row: &str| -> Vec<String> {
        row.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect()
    };
    let head = format!("| {first} |");
    let mut lines = markdown.lines().skip_while(|l| !l.starts_with(&head));
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let names = cells(header);
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| names.iter().cloned().zip(cells(l)).collect())
        .collect()
}

/// A duration as WIRE.md's tables write it: `none` for zero, else in its
/// largest whole unit (`7 days`, `1 hour`, `30 min`, `90 s`).
fn duration_words(d: std::time::Duration) -> String {
    let unit = |n: u64, one: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {one}s")
        }
    };
    match d.as_secs() {
        0 => "none".into(),
        s if s % 86_400 == 0 => unit(s / 86_400, "day"),
        s if s % 3600 == 0 => unit(s / 3600, "hour"),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// A size limit as WIRE.md's tables write it: `none` when unset (0) or
/// unlimited (negative), else bytes in KiB or MiB when whole.
fn size_words(bytes: i64) -> String {
    match bytes {
        b if b <= 0 => "none".into(),
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % 1024 == 0 => format!("{} KiB", b >> 10),
        b => b.to_string(),
    }
}

/// §3.5's bucket table states every setting `streams::*_kv_config` makes,
/// and the configurations set nothing else.
#[test]
fn kv_bucket_table_matches_the_code() -> Res {
    use minions_endpoints::streams;
    let md = wire_md()?;
    let rows = table(&md, "Bucket");
    let configs = [
        streams::workers_kv_config(1),
        streams::teams_kv_config(1),
        streams::quarantine_kv_config(1),
    ];
    let mut problems = Vec::new();
    let listed: BTreeSet<&str> = rows.iter().map(|r| r["Bucket"].trim_matches('`')).collect();
    let made: BTreeSet<&str> = configs.iter().map(|c| c.bucket.as_str()).collect();
    if listed != made {
        problems.push(format!(
            "buckets in WIRE.md: {listed:?}; made by the code: {made:?}"
        ));
    }
    for c in &configs {
        let Some(row) = rows
            .iter()
            .find(|r| r["Bucket"] == format!("`{}`", c.bucket))
        else {
            continue;
        };
        let storage = serde_json::to_string(&c.storage)?;
        let want = [
            ("Description", format!("\"{}\"", c.description)),
            ("History", c.history.to_string()),
            ("Max age", duration_words(c.max_age)),
            ("Max value size", size_words(c.max_value_size.into())),
            ("Max bytes", size_words(c.max_bytes)),
            ("Storage", storage.trim_matches('"').to_owned()),
        ];
        for (column, value) in want {
            let got = row.get(column).map_or("(no such column)", String::as_str);
            if got != value {
                problems.push(format!(
                    "{} {column}: WIRE.md says {got:?}, the code sets {value:?}",
                    c.bucket
                ));
            }
        }
        // "Nothing else is set in those configurations."
        let unset = c.republish.is_none()
            && c.mirror.is_none()
            && c.sources.is_none()
            && !c.mirror_direct
            && !c.compression
            && c.placement.is_none()
            && c.limit_markers.is_none()
            && c.num_replicas == 1;
        if !unset {
            problems.push(format!("{} sets more than WIRE.md §3.5 lists", c.bucket));
        }
    }
    assert!(
        problems.is_empty(),
        "WIRE.md §3.5 and streams::*_kv_config disagree:\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// Whether a subject matches a NATS permission pattern (`*` one token, `>`
/// one or more last ones).
fn nats_match(pattern: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for p in pattern.split('.') {
        match (p, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (p, Some(t)) if p == t => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

/// The quoted subjects of `user`'s `publish: { allow: [...] }` in a
/// nats-server configuration.
fn publish_allowed(conf: &str, user: &str) -> Vec<String> {
    let Some(at) = conf.find(&format!("user: {user},")) else {
        return Vec::new();
    };
    let Some(open) = conf[at..].find("publish: { allow: [") else {
        return Vec::new();
    };
    let list = &conf[at + open..];
    let list = &list[..list.find(']').unwrap_or(list.len())];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// §3.4's create subjects are those async-nats builds from the code's
/// consumer configurations, and `deploy/nats/least-privilege.conf` lets
/// the producer and watchdog use them and refuses the forms WIRE.md says
/// it refuses.
#[test]
fn consumer_create_subjects_match_the_code_and_permissions() -> Res {
    use minions_endpoints::queue;
    use minions_schemas::streams;
    let spans = code_spans(&wire_md()?);
    let conf = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/nats/least-privilege.conf"
    ))?;
    let ids = ids()?;
    let spec = job_spec(&ids, ModelFamily::BertEmbedding, Precision::F32);
    let settings = streams::WorkSettings::default();
    let mut problems = Vec::new();
    let cases = [
        (
            queue::job_consumer_config(&settings, &spec),
            "job-",
            &["producer", "watchdog"][..],
        ),
        (
            queue::check_consumer_config(&settings, &spec),
            "checks-",
            &["watchdog"][..],
        ),
    ];
    for (config, prefix, users) in cases {
        // What async-nats 0.51 sends (`Context::create_consumer_on_stream_action`):
        // the name (`name`, else `durable_name`), then the filter subject.
        let name = config.name.or(config.durable_name).unwrap_or_default();
        let sent = format!(
            "$JS.API.CONSUMER.CREATE.{}.{name}.{}",
            streams::WORK_STREAM,
            config.filter_subject
        );
        let template = format!("$JS.API.CONSUMER.CREATE.MINIONS_WORK.{prefix}<job>.");
        let stated: Vec<String> = spans
            .iter()
            .filter(|s| s.starts_with(&template))
            .map(|s| s.replace("<job>", ids.job.as_str()))
            .collect();
        if stated.is_empty() {
            problems.push(format!("WIRE.md names no `{template}…` subject"));
        }
        for s in stated.iter().filter(|s| **s != sent) {
            problems.push(format!("WIRE.md says `{s}`; the code creates on `{sent}`"));
        }
        for user in users {
            if !publish_allowed(&conf, user)
                .iter()
                .any(|p| nats_match(p, &sent))
            {
                problems.push(format!("{user} may not publish on `{sent}`"));
            }
        }
    }
    let producer = publish_allowed(&conf, "producer");
    let watchdog = publish_allowed(&conf, "watchdog");
    // The permission WIRE.md quotes is the producer's and the watchdog's.
    let permissions: Vec<&String> = spans
        .iter()
        .filter(|s| s.starts_with("$JS.API.CONSUMER.CREATE.MINIONS_WORK.*"))
        .collect();
    if permissions.is_empty() {
        problems.push("WIRE.md quotes no consumer-creation permission".into());
    }
    for p in permissions {
        if !producer.contains(p) || !watchdog.contains(p) {
            problems.push(format!("`{p}` is not the producer's and the watchdog's"));
        }
    }
    // The forms WIRE.md says are refused: without a filter, the older
    // DURABLE.CREATE, and a filter of fewer than four tokens.
    let mut refused: Vec<String> = spans
        .iter()
        .filter(|s| s.starts_with("$JS.API.CONSUMER.") && s.ends_with(".<name>"))
        .map(|s| s.replace("<name>", "job-j1"))
        .collect();
    if refused.len() < 2 {
        problems.push("WIRE.md names fewer than two refused forms".into());
    }
    refused.push("$JS.API.CONSUMER.CREATE.MINIONS_WORK.job-j1.minions.work.>".into());
    for r in &refused {
        if producer.iter().any(|p| nats_match(p, r)) {
            problems.push(format!("the producer may publish on `{r}`"));
        }
    }
    assert!(
        problems.is_empty(),
        "WIRE.md §3.4, the consumer configurations and least-privilege.conf disagree:\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// §3.4's consumer table and metadata lists are what
/// `queue::job_consumer_config` and `streams::work_stream_config` (minions-endpoints) set.
#[test]
fn job_consumer_settings_and_metadata_match_the_code() -> Res {
    use minions_endpoints::queue;
    use minions_schemas::streams;
    let md = wire_md()?;
    let ids = ids()?;
    let spec = job_spec(&ids, ModelFamily::BertEmbedding, Precision::F32);
    let settings = streams::WorkSettings::default();
    let job = queue::job_consumer_config(&settings, &spec);
    let checks = queue::check_consumer_config(&settings, &spec);
    let work = minions_endpoints::streams::work_stream_config(&settings);
    let named = |start: &str| -> BTreeSet<String> {
        paragraph(&md, start)
            .map(code_spans)
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.starts_with("minions.") && !s.contains(' '))
            .collect()
    };
    let keys = |m: &std::collections::HashMap<String, String>| -> BTreeSet<String> {
        m.keys().cloned().collect()
    };
    let mut problems = Vec::new();
    let pairs = [
        ("Consumer metadata", keys(&job.metadata)),
        ("The work stream carries", keys(&work.metadata)),
    ];
    for (start, set) in pairs {
        let stated = named(start);
        if stated != set {
            problems.push(format!(
                "the paragraph \"{start}…\" names {stated:?}; the code sets {set:?}"
            ));
        }
    }
    let extra: BTreeSet<String> = keys(&checks.metadata)
        .difference(&keys(&job.metadata))
        .cloned()
        .collect();
    if !extra.is_subset(&named("**Check runs**")) {
        problems.push(format!(
            "check consumers' own metadata {extra:?} not in \"**Check runs**…\""
        ));
    }
    // The table's name, description and filter, with `<job>` and `<team>` filled in.
    let rows = table(&md, "Setting");
    let cell = |setting: &str| -> String {
        let raw = rows
            .iter()
            .find(|r| r["Setting"] == setting)
            .map_or("", |r| r["Value"].as_str());
        // A quoted value whole, else the first code span.
        let value = match raw.strip_prefix('"') {
            Some(q) => q.rsplit_once('"').map_or(q, |(v, _)| v),
            None => raw.split('`').nth(1).unwrap_or_default(),
        };
        value
            .replace('`', "")
            .replace("<job>", ids.job.as_str())
            .replace("<team>", &spec.team)
    };
    let want = [
        ("Durable name", job.durable_name.clone().unwrap_or_default()),
        ("Description", job.description.clone().unwrap_or_default()),
        ("Filter subject", job.filter_subject.clone()),
    ];
    for (setting, value) in want {
        let got = cell(setting);
        if got != value {
            problems.push(format!(
                "{setting}: WIRE.md says {got:?}, the code sets {value:?}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "WIRE.md §3.4 and the job consumer's configuration disagree:\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// A section number (`3.4.1`) at the start of `s`, if any.
fn section_number(s: &str) -> Option<Vec<u32>> {
    let n: String = s
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let n = n.trim_end_matches('.');
    (!n.is_empty())
        .then(|| {
            n.split('.')
                .map(str::parse)
                .collect::<Result<Vec<u32>, _>>()
                .ok()
        })
        .flatten()
}

fn dotted(number: &[u32]) -> String {
    let parts: Vec<String> = number.iter().map(u32::to_string).collect();
    parts.join(".")
}

/// Whether heading `next` may follow heading `prev`: a first child (`.0` or
/// `.1`), or the next sibling of `prev` or of one of its ancestors.
fn follows(prev: &[u32], next: &[u32]) -> bool {
    let first_child = next.len() == prev.len() + 1
        && next.starts_with(prev)
        && next.last().is_some_and(|n| *n <= 1);
    let sibling = (1..=prev.len()).any(|k| {
        next.len() == k && next[..k - 1] == prev[..k - 1] && next[k - 1] == prev[k - 1] + 1
    });
    first_child || sibling
}

/// WIRE.md's numbered headings run in order without gaps, and every `§`
/// reference, in WIRE.md and in the Python producer written from it,
/// names one of them.
#[test]
fn sections_run_in_order_and_references_resolve() -> Res {
    let md = wire_md()?;
    let mut problems = Vec::new();
    let mut headings: Vec<Vec<u32>> = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let title = line
            .strip_prefix("## ")
            .or_else(|| line.strip_prefix("### "));
        if let (false, Some(number)) = (fenced, title.and_then(section_number)) {
            let prev = headings.last().cloned().unwrap_or_default();
            if !follows(&prev, &number) {
                problems.push(format!(
                    "heading {line:?} does not follow section {}",
                    dotted(&prev)
                ));
            }
            headings.push(number);
        }
    }
    let producer = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/python/wire_producer.py"
    ))?;
    for (file, text) in [
        ("WIRE.md", &md),
        ("tests/python/wire_producer.py", &producer),
    ] {
        for after in text.split('§').skip(1) {
            let n = section_number(after).unwrap_or_default();
            if !headings.contains(&n) {
                problems.push(format!(
                    "{file}: §{} names no section of WIRE.md",
                    dotted(&n)
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// The rules the checks above apply report what they should: section order,
/// NATS subject matching, and the words of the settings tables.
#[test]
fn settings_and_section_rules_tell_right_from_wrong() {
    assert!(follows(&[], &[1]) && follows(&[3, 4], &[3, 4, 1]) && follows(&[3, 4, 1], &[3, 5]));
    assert!(follows(&[4, 12], &[4, 13]) && follows(&[6, 5], &[7]) && follows(&[7], &[7, 0]));
    assert!(
        !follows(&[4, 12], &[4, 15]) && !follows(&[4, 16], &[4, 13]) && !follows(&[3], &[3, 2])
    );
    assert!(
        nats_match("a.*.>", "a.b.c.d")
            && !nats_match("a.*.>", "a.b")
            && !nats_match("a.*", "a.b.c")
    );
    assert_eq!(
        duration_words(std::time::Duration::from_secs(7 * 86_400)),
        "7 days"
    );
    assert_eq!(size_words(65_536), "64 KiB");
}
