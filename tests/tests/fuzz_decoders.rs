//! Fuzzing every decoder of untrusted bytes: for each message kind, a
//! million inputs (`MINIONS_FUZZ_INPUTS` to change it) made by mutating
//! valid encodings (bit flips, byte sets, inserts, deletes, truncations,
//! splices, repeats, and wholly random bytes) go through [`decode`]. None may
//! panic; every input that decodes must hold only valid ids and re-encode to
//! bytes that decode to the same encoding; every refusal must be a typed
//! error. The mutator is [`minions_tests::fuzz`]. The text decoders of
//! credentials and claims (the dashboard's access file, `Authorization`,
//! `Cookie` and proxy user headers, submit subjects) get a million each too.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use minions_schemas::messages::{
    ActionKind, Admission, ChatTurn, Control, ControlCommand, ControlReply, DeadLetter, EventKind,
    FinishReason, Generation, GenerationRecord, Heartbeat, InFlight, InputDescription, JobAction,
    JobAnswer, JobManifest, JobRequest, JobSpec, ManifestShard, ModelFamily, ModelFile,
    ModelManifest, ModelRecord, OperatorAction, OutputPayload, Prompt, SamplingParams,
    ShardCheckpoint, ShardEvent, ShardInput, ShardOutput, ShardTask, StageOpen, StagePass,
    StageStep, SubmitClaim, WorkerRecord, WorkerState,
};
use minions_schemas::{
    CodecError, JobId, ModelHash, ModelName, SCHEMA_VERSION, WorkerId, decode, encode, limits,
    stage_frames,
};
use minions_tests::fuzz::{Rng, mutate};
use serde::Serialize;
use serde::de::DeserializeOwned;

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// What one decoder's run saw.
#[derive(Debug, Default)]
struct Tally {
    inputs: u64,
    decoded: u64,
    refused_size: u64,
    refused_version: u64,
    refused_shape: u64,
}

fn fuzz<T: Serialize + DeserializeOwned>(
    what: &'static str,
    limit: usize,
    seeds: Vec<Vec<u8>>,
    inputs: u64,
    seed: u64,
    check: fn(&T) -> bool,
) -> R<Tally> {
    let mut rng = Rng(seed);
    let mut buf = Vec::new();
    let mut t = Tally::default();
    for n in 0..inputs {
        mutate(&mut rng, &seeds, &mut buf);
        if limit <= 1 << 20 && rng.below(1000) == 0 {
            // Just over the limit: refused before a byte is looked at.
            let over = limit + 1 + rng.below(16);
            buf.resize(over, 0x90);
        }
        let r = catch_unwind(AssertUnwindSafe(|| decode::<T>(what, &buf, limit)));
        let decoded = r.map_err(|_| {
            format!("{what}: decode panicked on input {n} (seed {seed:#x}): {buf:02x?}")
        })?;
        t.inputs += 1;
        match decoded {
            Ok(v) => {
                t.decoded += 1;
                if !check(&v) {
                    return Err(
                        format!("{what}: input {n} decoded to invalid ids: {buf:02x?}").into(),
                    );
                }
                let again = encode(what, &v)?;
                let back: T = decode(what, &again, usize::MAX)?;
                if encode(what, &back)? != again {
                    return Err(format!("{what}: input {n} does not round-trip").into());
                }
            }
            Err(CodecError::TooLarge { .. }) => t.refused_size += 1,
            Err(CodecError::UnsupportedVersion { .. }) => t.refused_version += 1,
            Err(CodecError::Malformed { .. }) => t.refused_shape += 1,
            Err(e @ CodecError::Encode { .. }) => return Err(e.into()),
        }
    }
    Ok(t)
}

fn ok_job(j: &JobId) -> bool {
    JobId::new(j.to_string()).is_ok()
}
fn ok_worker(w: &WorkerId) -> bool {
    WorkerId::new(w.to_string()).is_ok()
}
fn ok_hash(h: &ModelHash) -> bool {
    ModelHash::new(h.to_string()).is_ok()
}

fn job() -> R<JobId> {
    Ok(JobId::new("01JC3Y5M0Q-embed_docs")?)
}
fn worker() -> R<WorkerId> {
    Ok(WorkerId::new("mac-17-01jc3y5m0q")?)
}
fn hash() -> R<ModelHash> {
    Ok(ModelHash::new("3f".repeat(32))?)
}

fn spec() -> R<JobSpec> {
    Ok(JobSpec {
        submitter: String::new(),
        verify_ppm: None,
        layers: None,
        stage_split: Vec::new(),
        v: SCHEMA_VERSION,
        job: job()?,
        model_name: ModelName::new("minilm")?,
        model_hash: hash()?,
        family: ModelFamily::BertEmbedding,
        input: InputDescription {
            source: "docs.jsonl".into(),
            sha256: "ab".repeat(32),
            bytes: 123_456,
            text_field: "text".into(),
            id_field: Some("id".into()),
        },
        shard_size: 256,
        max_batch: 32,
        precision: minions_schemas::messages::Precision::Int8,
        shards: 40,
        records: 10_000,
        skipped: 2,
        created_ms: 1_764_000_000_000,
        team: minions_schemas::messages::DEFAULT_TEAM.to_owned(),
        priority: Default::default(),
        preemptible: false,
        needs: Default::default(),
    })
}

fn event(kind: EventKind) -> R<ShardEvent> {
    Ok(ShardEvent {
        energy: None,
        v: SCHEMA_VERSION,
        job: job()?,
        shard: 7,
        worker: worker()?,
        host: "mac-17".into(),
        attempt: 2,
        at_ms: 1_764_000_000_123,
        kind,
    })
}

fn heartbeat(in_flight: usize) -> R<Heartbeat> {
    Ok(Heartbeat {
        power: None,
        chip: String::new(),
        lend_mb: 0,
        v: SCHEMA_VERSION,
        worker: worker()?,
        host: "mac-17".into(),
        device: "metal:0".into(),
        slots: 2,
        holds: 0,
        draining: false,
        leaving: false,
        owner: "yielded: input 3 s ago".into(),
        mem_total_mb: 32_768,
        mem_avail_mb: 12_000,
        mem_budget_mb: 16_384,
        in_flight: (0..in_flight)
            .map(|i| -> R<InFlight> {
                Ok(InFlight {
                    job: job()?,
                    shard: i as u32,
                    reply: format!("$JS.ACK.MINIONS_WORK.minions-workers.1.{i}.9.0.0"),
                    started_ms: 1_764_000_000_000,
                })
            })
            .collect::<R<_>>()?,
        done: 12,
        failed: 1,
        interval_ms: 1000,
        started_ms: 1_764_000_000_000,
        at_ms: 1_764_000_000_500,
        build: String::new(),
        kernel: String::new(),
        stage: None,
    })
}

fn seeds<T: Serialize>(what: &'static str, values: &[T]) -> R<Vec<Vec<u8>>> {
    Ok(values
        .iter()
        .map(|v| encode(what, v))
        .collect::<Result<_, _>>()?)
}

type Run = Box<dyn FnOnce(u64) -> R<Tally> + Send>;

fn runs() -> R<Vec<(&'static str, Run)>> {
    let mut v: Vec<(&'static str, Run)> = Vec::new();
    let s = seeds("job spec", &[spec()?])?;
    v.push((
        "job spec",
        Box::new(move |n| {
            fuzz::<JobSpec>("job spec", limits::MAX_SPEC_BYTES, s, n, 1, |x| {
                ok_job(&x.job) && ok_hash(&x.model_hash)
            })
        }),
    ));
    let task = ShardTask {
        v: SCHEMA_VERSION,
        job: job()?,
        shard: 3,
        shards: 40,
        rows: 256,
        first_row: 768,
        model_hash: hash()?,
        family: ModelFamily::BertEmbedding,
        max_batch: 0,
        precision: minions_schemas::messages::Precision::F32,
        check: 0,
        avoid: Vec::new(),
    };
    let s = seeds("shard task", &[task])?;
    v.push((
        "shard task",
        Box::new(move |n| {
            fuzz::<ShardTask>("shard task", limits::MAX_TASK_BYTES, s, n, 2, |x| {
                ok_job(&x.job) && ok_hash(&x.model_hash)
            })
        }),
    ));
    let s = seeds(
        "shard event",
        &[
            event(EventKind::Submitted { shards: 40 })?,
            event(EventKind::Started)?,
            event(EventKind::Done {
                rows: 256,
                output_bytes: 393_216,
                duration_ms: 812,
                compute_ms: 700,
                already_done: false,
                sha256: "cd".repeat(32),
                tokens: 0,
                audio_ms: 0,
                made_by: None,
            })?,
            event(EventKind::Requeued)?,
            event(EventKind::HandedBack {
                reason: "owner: input 0 s ago".into(),
            })?,
            event(EventKind::Failed {
                reason: "bad input".into(),
                permanent: true,
                stream_seq: None,
            })?,
        ],
    )?;
    v.push((
        "shard event",
        Box::new(move |n| {
            fuzz::<ShardEvent>("shard event", limits::MAX_EVENT_BYTES, s, n, 3, |x| {
                ok_job(&x.job) && ok_worker(&x.worker)
            })
        }),
    ));
    let s = seeds("heartbeat", &[heartbeat(0)?, heartbeat(3)?])?;
    v.push((
        "heartbeat",
        Box::new(move |n| {
            fuzz::<Heartbeat>("heartbeat", limits::MAX_HEARTBEAT_BYTES, s, n, 4, |x| {
                ok_worker(&x.worker) && x.in_flight.iter().all(|f| ok_job(&f.job))
            })
        }),
    ));
    let s = seeds(
        "control",
        &[
            Control {
                v: SCHEMA_VERSION,
                command: ControlCommand::Drain,
                by: "ops".into(),
            },
            Control {
                v: SCHEMA_VERSION,
                command: ControlCommand::Rejoin,
                by: "watchdog-1".into(),
            },
        ],
    )?;
    v.push((
        "control",
        Box::new(move |n| fuzz::<Control>("control", limits::MAX_CONTROL_BYTES, s, n, 5, |_| true)),
    ));
    let s = seeds(
        "control reply",
        &[ControlReply {
            v: SCHEMA_VERSION,
            worker: worker()?,
            status: "evicted".into(),
            handed_back: 2,
        }],
    )?;
    v.push((
        "control reply",
        Box::new(move |n| {
            fuzz::<ControlReply>("control reply", limits::MAX_CONTROL_BYTES, s, n, 6, |x| {
                ok_worker(&x.worker)
            })
        }),
    ));
    let input = ShardInput {
        v: SCHEMA_VERSION,
        job: job()?,
        shard: 3,
        first_row: 768,
        ids: Some(vec!["a1".into(), "a2".into()]),
        texts: vec!["a man eats food".into(), "the girl rides a horse".into()],
        records: vec![],
        audio: Vec::new(),
    };
    let record = GenerationRecord {
        prompt: Prompt::Messages(vec![ChatTurn {
            role: "user".into(),
            content: "Say hi".into(),
        }]),
        params: SamplingParams {
            max_tokens: 16,
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            seed: 7,
            stop: vec!["\n".into()],
        },
    };
    let prompts = ShardInput {
        texts: vec![],
        records: vec![
            record.clone(),
            GenerationRecord {
                prompt: Prompt::Text("Once upon".into()),
                ..record
            },
        ],
        ..input.clone()
    };
    let audio = ShardInput {
        texts: vec![],
        audio: vec![minions_schemas::messages::AudioRecord {
            key: "jobs/j/audio/ab.wav".into(),
            bytes: 48_044,
            name: "a.wav".into(),
            options: minions_schemas::messages::SpeechOptions::default(),
        }],
        ids: Some(vec!["a.wav".into()]),
        ..input.clone()
    };
    let s = seeds("shard input", &[input, prompts, audio])?;
    v.push((
        "shard input",
        Box::new(move |n| {
            fuzz::<ShardInput>("shard input", limits::MAX_SHARD_INPUT_BYTES, s, n, 7, |x| {
                ok_job(&x.job)
            })
        }),
    ));
    let output = ShardOutput {
        v: SCHEMA_VERSION,
        job: job()?,
        shard: 3,
        first_row: 768,
        rows: 2,
        model_hash: hash()?,
        worker: worker()?,
        payload: OutputPayload::Embeddings {
            dim: 4,
            data: (0..32).collect(),
        },
        made_by: None,
    };
    let generation = Generation {
        text: "Hi!".into(),
        finish_reason: FinishReason::Stop,
        prompt_tokens: 12,
        completion_tokens: 3,
        error: None,
    };
    let generated = ShardOutput {
        payload: OutputPayload::Generations {
            records: vec![generation.clone(), Generation::failed("too long")],
        },
        ..output.clone()
    };
    let s = seeds("shard output", &[output, generated])?;
    v.push((
        "shard output",
        Box::new(move |n| {
            fuzz::<ShardOutput>(
                "shard output",
                limits::MAX_SHARD_OUTPUT_BYTES,
                s,
                n,
                8,
                |x| ok_job(&x.job) && ok_worker(&x.worker) && ok_hash(&x.model_hash),
            )
        }),
    ));
    let checkpoint = ShardCheckpoint {
        v: SCHEMA_VERSION,
        job: job()?,
        shard: 3,
        rows: 2,
        model_hash: hash()?,
        done: vec![(1, generation)],
        transcripts: vec![(
            0,
            minions_schemas::messages::Transcription::failed("a.wav: not audio"),
        )],
        partial: vec![(
            1,
            minions_schemas::messages::PartialTranscription {
                seek: 3000,
                language: Some(50_259),
                windows: 1,
                segments: vec![minions_schemas::messages::TokenSegment {
                    start: 0.0,
                    end: 2.0,
                    tokens: vec![50_364, 11, 50_464],
                }],
            },
        )],
    };
    let s = seeds("shard checkpoint", &[checkpoint])?;
    v.push((
        "shard checkpoint",
        Box::new(move |n| {
            fuzz::<ShardCheckpoint>(
                "shard checkpoint",
                limits::MAX_SHARD_OUTPUT_BYTES,
                s,
                n,
                14,
                |x| ok_job(&x.job) && ok_hash(&x.model_hash),
            )
        }),
    ));
    let manifest = ModelManifest {
        v: SCHEMA_VERSION,
        family: ModelFamily::BertEmbedding,
        files: ["config.json", "tokenizer.json", "model.safetensors"]
            .iter()
            .map(|f| ModelFile {
                name: (*f).into(),
                bytes: 1234,
                sha256: "ef".repeat(32),
                chunks: vec!["12".repeat(32)],
            })
            .collect(),
    };
    let s = seeds("model manifest", &[manifest])?;
    v.push((
        "model manifest",
        Box::new(move |n| {
            fuzz::<ModelManifest>(
                "model manifest",
                limits::MAX_MANIFEST_BYTES,
                s,
                n,
                9,
                |_| true,
            )
        }),
    ));
    let record = ModelRecord {
        v: SCHEMA_VERSION,
        name: ModelName::new("minilm")?,
        hash: hash()?,
        family: ModelFamily::BertEmbedding,
        bytes: 90_000_000,
        pushed_ms: 1_764_000_000_000,
        context: None,
        layers: None,
    };
    let s = seeds("model record", &[record])?;
    v.push((
        "model record",
        Box::new(move |n| {
            fuzz::<ModelRecord>("model record", limits::MAX_MANIFEST_BYTES, s, n, 10, |x| {
                ok_hash(&x.hash)
            })
        }),
    ));
    let wr = WorkerRecord {
        v: SCHEMA_VERSION,
        worker: worker()?,
        host: "mac-17".into(),
        device: "metal:0".into(),
        state: WorkerState::Dead,
        reason: "no heartbeat for 3100 ms".into(),
        handed_back: 1,
        changed_ms: 1_764_000_000_000,
        by: "watchdog-1".into(),
    };
    let s = seeds("worker record", &[wr])?;
    v.push((
        "worker record",
        Box::new(move |n| {
            fuzz::<WorkerRecord>("worker record", limits::MAX_CONTROL_BYTES, s, n, 11, |x| {
                ok_worker(&x.worker)
            })
        }),
    ));
    let dl = DeadLetter {
        v: SCHEMA_VERSION,
        job: job()?,
        shard: 37,
        payload: vec![0x93, 0x01, 0x02, 0x03],
        reason: "gave up after 5 deliveries".into(),
        cause: "max_deliveries".into(),
        deliveries: 5,
        hosts: vec!["mac-17".into(), "mac-3".into()],
        stream_seq: 991,
        at_ms: 1_764_000_000_000,
    };
    let s = seeds("dead letter", &[dl])?;
    v.push((
        "dead letter",
        Box::new(move |n| {
            fuzz::<DeadLetter>(
                "dead letter",
                limits::MAX_TASK_BYTES + limits::MAX_EVENT_BYTES,
                s,
                n,
                12,
                |x| ok_job(&x.job),
            )
        }),
    ));
    let jm = JobManifest {
        v: SCHEMA_VERSION,
        job: job()?,
        model_hash: hash()?,
        records: 512,
        done: 1,
        failed: 1,
        rejected: 1,
        verified: 2,
        disagreements: 1,
        unverified: 1,
        shards: vec![
            ManifestShard {
                shard: 0,
                outcome: "done".into(),
                output_key: Some("jobs/x/outputs/00000000.msgpack".into()),
                sha256: Some("12".repeat(32)),
                worker: Some(worker()?),
                attempts: 1,
                duration_ms: 900,
                reason: None,
                made_by: None,
            },
            ManifestShard {
                shard: 1,
                outcome: "failed".into(),
                output_key: None,
                sha256: None,
                worker: None,
                attempts: 5,
                duration_ms: 0,
                reason: Some("bad input".into()),
                made_by: None,
            },
        ],
        completed_ms: 1_764_000_000_000,
    };
    let s = seeds(
        "submit claim",
        &[SubmitClaim {
            v: SCHEMA_VERSION,
            job: job()?,
        }],
    )?;
    v.push((
        "submit claim",
        Box::new(move |n| {
            fuzz::<SubmitClaim>("submit claim", limits::MAX_ADMISSION_BYTES, s, n, 14, |x| {
                ok_job(&x.job)
            })
        }),
    ));
    let s = seeds(
        "admission",
        &[Admission {
            v: SCHEMA_VERSION,
            admitted: false,
            detail: "its spec does not match the identity's claim".into(),
            by: "watchdog-1".into(),
        }],
    )?;
    v.push((
        "admission",
        Box::new(move |n| {
            fuzz::<Admission>("admission", limits::MAX_ADMISSION_BYTES, s, n, 15, |_| true)
        }),
    ));
    v.push(("credentials", Box::new(|n| fuzz_credentials(n, 16))));
    let s = seeds(
        "job request",
        &[
            JobRequest {
                v: SCHEMA_VERSION,
                job: job()?,
                action: JobAction::Cancel,
            },
            JobRequest {
                v: SCHEMA_VERSION,
                job: job()?,
                action: JobAction::Retry,
            },
        ],
    )?;
    v.push((
        "job request",
        Box::new(move |n| {
            fuzz::<JobRequest>("job request", limits::MAX_ADMISSION_BYTES, s, n, 18, |x| {
                ok_job(&x.job)
            })
        }),
    ));
    let s = seeds(
        "job answer",
        &[JobAnswer {
            v: SCHEMA_VERSION,
            done: false,
            detail: "job beta--01jr is team \"beta\"'s; ana asked for team \"alpha\"".into(),
            by: "watchdog-1".into(),
        }],
    )?;
    v.push((
        "job answer",
        Box::new(move |n| {
            fuzz::<JobAnswer>("job answer", limits::MAX_ADMISSION_BYTES, s, n, 19, |_| {
                true
            })
        }),
    ));
    let s = seeds(
        "operator action",
        &[
            OperatorAction {
                v: SCHEMA_VERSION,
                at_ms: 1_700_000_000_000,
                by: "ops".into(),
                via: "dashboard".into(),
                action: ActionKind::Drain,
                target: "w1-0a1b2c3d".into(),
                detail: String::new(),
            },
            OperatorAction {
                v: SCHEMA_VERSION,
                at_ms: 1_700_000_000_001,
                by: "watchdog-1".into(),
                via: "watchdog".into(),
                action: ActionKind::Quarantine,
                target: "w2".into(),
                detail: "outvoted 3 times".into(),
            },
        ],
    )?;
    v.push((
        "operator action",
        Box::new(move |n| {
            fuzz::<OperatorAction>("operator action", limits::MAX_EVENT_BYTES, s, n, 17, |_| {
                true
            })
        }),
    ));
    let pass = StagePass {
        v: SCHEMA_VERSION,
        group: "g-01jr".into(),
        epoch: 2,
        pass: 41,
        micro: 1,
        ended: vec![3, 8],
        steps: vec![
            StageStep {
                seq: 9,
                start: 0,
                tokens: 2,
                sample: true,
                open: Some(StageOpen {
                    capacity: 40,
                    params: SamplingParams {
                        max_tokens: 32,
                        temperature: 0.7,
                        top_p: 0.9,
                        top_k: 40,
                        seed: 5,
                        stop: vec!["\n".into()],
                    },
                    prefix_of: None,
                    shared: false,
                }),
            },
            StageStep {
                seq: 4,
                start: 17,
                tokens: 1,
                sample: false,
                open: None,
            },
        ],
        width: 2,
        hidden: StagePass::hidden_bytes(&[0.5, -1.0, 2.0, 0.25, 1e-3, -7.5]),
    };
    let s = seeds("stage pass", std::slice::from_ref(&pass))?;
    v.push((
        "stage pass",
        Box::new(move |n| {
            fuzz::<StagePass>("stage pass", limits::MAX_STAGE_PASS_BYTES, s, n, 23, |_| {
                true
            })
        }),
    ));
    let parts = stage_frames::cut(2, 41, &encode("stage pass", &pass)?)?;
    let s = parts;
    v.push((
        "stage part",
        Box::new(move |n| {
            fuzz::<stage_frames::StagePart>(
                "stage part",
                limits::MAX_STAGE_PART_BYTES,
                s,
                n,
                29,
                |_| true,
            )
        }),
    ));
    let s = seeds("job manifest", &[jm])?;
    v.push((
        "job manifest",
        Box::new(move |n| {
            fuzz::<JobManifest>("job manifest", limits::MAX_SPEC_BYTES * 64, s, n, 13, |x| {
                ok_job(&x.job)
                    && ok_hash(&x.model_hash)
                    && x.shards
                        .iter()
                        .all(|s| s.worker.as_ref().is_none_or(ok_worker))
            })
        }),
    ));
    Ok(v)
}

/// The text decoders of credentials and claims: the dashboard's access
/// file, `Authorization` and `Cookie` headers, a proxy's user header, a
/// posted token and a submit subject. None may panic; an accepted
/// credential has a token's shape, an accepted subject parses back.
fn fuzz_credentials(inputs: u64, seed: u64) -> R<Tally> {
    use minions_schemas::access::{self, AccessList, Role};
    let token = access::token_from(&[0x5a; 32]);
    let seeds: Vec<Vec<u8>> = [
        format!("Bearer {token}"),
        format!("theme=dark; {}={token}", access::COOKIE),
        "ana@corp.example".to_owned(),
        format!(
            "# access\n{}user operator bob\n",
            access::token_line(Role::Viewer, "ana", &token)
        ),
        "minions.submit.alpha.normal.ana".to_owned(),
        "minions.jobreq.alpha.ana@corp_example".to_owned(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    let mut rng = Rng(seed);
    let mut buf = Vec::new();
    let mut t = Tally::default();
    for n in 0..inputs {
        mutate(&mut rng, &seeds, &mut buf);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let text = String::from_utf8_lossy(&buf);
            let list = AccessList::parse(&text).is_ok();
            let tokens = [access::bearer(&buf), access::cookie_token(&buf)];
            let shaped = tokens
                .iter()
                .flatten()
                .all(|t| access::well_formed(t).is_some());
            let user = access::proxy_user(&buf).is_some();
            let subject = minions_schemas::subjects::parse_submit(&text).is_none_or(|(t, p, s)| {
                minions_schemas::subjects::submit(t, p, s) == text.as_ref()
            }) && minions_schemas::subjects::parse_job_request(&text)
                .is_none_or(|(t, s)| minions_schemas::subjects::job_request(t, s) == text.as_ref());
            (
                list || user || tokens.iter().any(Option::is_some),
                shaped && subject,
            )
        }));
        let (accepted, sound) = r.map_err(|_| {
            format!("credentials: a decoder panicked on input {n} (seed {seed:#x}): {buf:02x?}")
        })?;
        if !sound {
            return Err(
                format!("credentials: input {n} accepted in a wrong shape: {buf:02x?}").into(),
            );
        }
        t.inputs += 1;
        if accepted {
            t.decoded += 1;
        } else {
            t.refused_shape += 1;
        }
    }
    Ok(t)
}

#[test]
fn a_million_mutated_inputs_per_decoder_never_panic() -> R<()> {
    let inputs = minions_tests::fuzz::inputs();
    // Decoders run on every core; each prints its tally when done.
    let all = runs()?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let queue = std::sync::Mutex::new(all);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..cores {
            s.spawn(|| {
                loop {
                    let next = queue.lock().map(|mut q| q.pop()).unwrap_or(None);
                    let Some((what, run)) = next else { break };
                    let started = Instant::now();
                    let r = run(inputs);
                    if let Ok(mut out) = results.lock() {
                        out.push((what, started.elapsed().as_secs_f64(), r));
                    }
                }
            });
        }
    });
    let results = results.into_inner().map_err(|_| "a fuzz thread panicked")?;
    let mut failed = Vec::new();
    for (what, secs, r) in &results {
        match r {
            Ok(t) => eprintln!(
                "fuzz {what:>14}: {} inputs, 0 panics, {} decoded, refused: {} too large, {} wrong version, {} malformed ({secs:.1} s)",
                t.inputs, t.decoded, t.refused_size, t.refused_version, t.refused_shape
            ),
            Err(e) => failed.push(format!("{what}: {e}")),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(results.len(), 22, "every decoder was fuzzed");
    for (_, _, r) in &results {
        if let Ok(t) = r {
            assert_eq!(t.inputs, inputs);
            assert!(t.decoded > 0, "the mutator never produced a valid document");
        }
    }
    Ok(())
}
