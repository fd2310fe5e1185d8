//! LLM generation through the fleet with the real SmolLM2-135M-Instruct
//! Q4_1: a 500-prompt job in 10 shards on 2 workers, collected in input
//! order (the same job at 2,000 prompts and more is `bench_llm --prompts`); a
//! worker killed (SIGKILL) mid-shard and an owner's return mid-shard, both
//! resumed elsewhere from the shard's checkpoint with every record once (the
//! killed one on the device path, `MINIONS_ENGINE_PATH=device`, where the
//! resumed shard equals the same records run whole); OpenAI batch files in
//! and out; bad records, bad models.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use minions_schemas::messages::{ChatTurn, GenerationRecord, Prompt, SamplingParams};
use minions_tests::{Fleet, Result, log_count, log_value, real_gguf};
use minions_worker::model::llm::{GenControl, GenLimits, GgufGenerator};
use minions_worker::model::{EnginePath, Model};

/// Prompt `i` of [`write_prompts`]: short raw prompts, every fifth a chat.
fn prompt(i: usize) -> Prompt {
    let subjects = [
        "cats", "rain", "rust", "tea", "maps", "snow", "bees", "jazz",
    ];
    let s = subjects[i % subjects.len()];
    if i % 5 == 4 {
        Prompt::Messages(vec![ChatTurn {
            role: "user".into(),
            content: format!("One word for {s}?"),
        }])
    } else {
        Prompt::Text(format!("{i} {s} are"))
    }
}

/// Short raw prompts and chat prompts, each with its id.
fn write_prompts(path: &Path, n: usize) -> Result<Vec<String>> {
    let mut ids = Vec::with_capacity(n);
    let mut out = String::new();
    for i in 0..n {
        let id = format!("p{i}");
        let line = match prompt(i) {
            Prompt::Messages(turns) => {
                let m: Vec<_> = turns
                    .iter()
                    .map(|t| serde_json::json!({"role": t.role, "content": t.content}))
                    .collect();
                serde_json::json!({"id": id, "messages": m})
            }
            Prompt::Text(t) => serde_json::json!({"id": id, "prompt": t}),
        };
        out.push_str(&line.to_string());
        out.push('\n');
        ids.push(id);
    }
    std::fs::write(path, out)?;
    Ok(ids)
}

fn read_lines(path: &Path) -> Result<Vec<serde_json::Value>> {
    std::fs::read_to_string(path)?
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_500_prompt_job_completes_in_input_order() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = big_job(&mut fleet).await;
    fleet.explain(r)
}

/// The big job's prompts: ten shards of 50, so that both workers take
/// several and finish them out of order.
const PROMPTS: usize = 500;

async fn big_job(fleet: &mut Fleet) -> Result<()> {
    fleet.push_smollm2("smollm2")?;
    let input = fleet.dir.path().join("prompts.jsonl");
    let ids = write_prompts(&input, PROMPTS)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1"])?;
    fleet.add_worker(&["--slots", "1"])?;
    let started = Instant::now();
    let job = fleet.submit_prompts("smollm2", &input, 50, 4, "gen500")?;
    let status = fleet.wait_job(&job, Duration::from_secs(1500))?;
    eprintln!(
        "{PROMPTS} prompts done in {:.0} s; status: {} tokens, {:.1} tokens/s",
        started.elapsed().as_secs_f64(),
        status["tokens"],
        status["token_rate"].as_f64().unwrap_or(0.0)
    );
    assert_eq!(status["state"], "done");
    fleet.counts_agree(&job)?;
    assert!(
        status["tokens"].as_u64().unwrap_or(0) > 0,
        "no tokens counted: {status}"
    );
    let out = fleet.dir.path().join("answers.jsonl");
    fleet.cli(&["collect", &job, "--output", &out.display().to_string()])?;
    let lines = read_lines(&out)?;
    assert_eq!(lines.len(), PROMPTS);
    for (l, id) in lines.iter().zip(&ids) {
        assert_eq!(l["id"], id.as_str());
        let reason = l["finish_reason"].as_str().unwrap_or_default();
        assert!(reason == "stop" || reason == "length", "{l}");
        assert!(l["prompt_tokens"].as_u64().unwrap_or(0) > 0, "{l}");
    }
    Ok(())
}

/// The disrupted shard's size and where its disruption lands.
struct Shard {
    /// Records: enough that the disruption, soon after the first
    /// checkpoint of `checkpointed` or more, lands well inside the shard.
    records: usize,
    /// Tokens generated per record.
    max_tokens: u32,
    /// Records checkpointed before the disruption.
    checkpointed: u64,
    /// The code the workers run (the device path is several times slower
    /// on the CPU, so its shard is smaller).
    path: EnginePath,
}

/// A one-shard job whose worker is disrupted by `disrupt` once it has
/// checkpointed some records; a second worker finishes it. Returns the
/// collected answers, in input order.
async fn disrupted_shard(
    fleet: &mut Fleet,
    job: &str,
    shard: &Shard,
    first_worker: &[&str],
    disrupt: impl FnOnce(&mut Fleet) -> Result<()>,
) -> Result<Vec<serde_json::Value>> {
    fleet.push_smollm2("smollm2")?;
    let input = fleet.dir.path().join(format!("{job}.jsonl"));
    let ids = write_prompts(&input, shard.records)?;
    fleet.add_watchdog(&[])?;
    fleet.worker_env = vec![
        (
            "RUST_LOG".into(),
            "info,minions_worker::generation=debug".into(),
        ),
        (
            minions_worker::model::ENGINE_PATH_ENV.into(),
            shard.path.to_string(),
        ),
    ];
    let mut args = vec!["--slots", "1", "--checkpoint-secs", "1", "--max-seqs", "8"];
    args.extend_from_slice(first_worker);
    fleet.add_worker(&args)?;
    let job = fleet.submit_prompts(
        "smollm2",
        &input,
        shard.records as u64,
        u64::from(shard.max_tokens),
        job,
    )?;
    let log1 = fleet.workers[0].log.clone();
    let until = Instant::now() + Duration::from_secs(600);
    while log_value(&log1, "checkpoint written", "records").unwrap_or(0) < shard.checkpointed {
        assert!(
            Instant::now() < until,
            "no checkpoint written:\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    disrupt(fleet)?;
    let finished_by_first = log_count(&log1, "record finished");
    let checkpointed = log_value(&log1, "checkpoint written", "records").unwrap_or(0);
    fleet.add_worker(&["--slots", "1", "--checkpoint-secs", "1"])?;
    let status = fleet.wait_job(&job, Duration::from_secs(900))?;
    assert_eq!(status["state"], "done");
    fleet.counts_agree(&job)?;
    let log2 = fleet.workers.last().ok_or("no worker")?.log.clone();
    let resumed = log_value(&log2, "generation shard finished", "resumed").unwrap_or(0);
    let recomputed = finished_by_first.saturating_sub(resumed as usize);
    eprintln!(
        "{job}: the first worker finished {finished_by_first} of {} records and checkpointed {checkpointed}; \
         the second resumed with {resumed}: {recomputed} records recomputed ({} path)",
        shard.records, shard.path
    );
    assert!(
        resumed >= checkpointed,
        "resumed {resumed} < checkpointed {checkpointed}"
    );
    assert!(resumed > 0);
    let out = fleet.dir.path().join(format!("{job}.out.jsonl"));
    fleet.cli(&["collect", &job, "--output", &out.display().to_string()])?;
    let lines = read_lines(&out)?;
    assert_eq!(lines.len(), shard.records, "each record once");
    let mut seen = HashMap::new();
    for (l, id) in lines.iter().zip(&ids) {
        assert_eq!(l["id"], id.as_str());
        *seen.entry(l["id"].to_string()).or_insert(0) += 1;
    }
    assert!(seen.values().all(|&n| n == 1));
    Ok(lines)
}

/// The shard's records run whole, in this process, on `path`, greedy as
/// `minions submit` asks by default: their texts in input order.
fn run_whole(shard: &Shard) -> Result<Vec<String>> {
    let g = GgufGenerator::load_with(&real_gguf()?, &candle_core::Device::Cpu, shard.path)?;
    let records: Vec<GenerationRecord> = (0..shard.records)
        .map(|i| GenerationRecord {
            prompt: prompt(i),
            params: SamplingParams {
                max_tokens: shard.max_tokens,
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                seed: 0,
                stop: vec![],
            },
        })
        .collect();
    let indexed: Vec<(usize, &GenerationRecord)> = records.iter().enumerate().collect();
    let mut texts = vec![String::new(); records.len()];
    let limits = GenLimits {
        max_seqs: 8,
        ..GenLimits::default()
    };
    g.generate(&indexed, limits, &GenControl::default(), &mut |i, r| {
        texts[i] = r.text
    })?;
    Ok(texts)
}

/// On the device path: the candle code a GPU runs (device caches, slots
/// refilled), checkpointed, killed and resumed elsewhere, gives the answers
/// the same records give run whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_worker_resumes_from_the_checkpoint() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let shard = Shard {
        records: 24,
        max_tokens: 3,
        checkpointed: 6,
        path: EnginePath::Device,
    };
    let r = async {
        let lines = disrupted_shard(&mut fleet, "killed", &shard, &[], |f| {
            // Past a checkpoint, with records finished since: those are lost.
            let log = f.workers[0].log.clone();
            let until = Instant::now() + Duration::from_secs(60);
            while log_count(&log, "record finished")
                < log_value(&log, "checkpoint written", "records").unwrap_or(0) as usize + 2
                && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            f.workers[0].kill();
            Ok(())
        })
        .await?;
        let whole = tokio::task::spawn_blocking(move || run_whole(&shard)).await??;
        for (i, (l, w)) in lines.iter().zip(&whole).enumerate() {
            assert_eq!(
                l["text"].as_str(),
                Some(w.as_str()),
                "record {i}: resumed and run whole differ"
            );
        }
        Ok(())
    }
    .await;
    fleet.explain(r)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_owners_return_hands_back_after_a_checkpoint() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let (policy, _) = fleet.owner_policy(600)?;
    let shard = Shard {
        records: 120,
        max_tokens: 12,
        checkpointed: 16,
        path: EnginePath::Fast,
    };
    let r = disrupted_shard(&mut fleet, "owned", &shard, &["--policy", &policy], |f| {
        std::fs::write(f.dir.path().join("owner"), "active\n")?;
        let log = f.workers[0].log.clone();
        let until = Instant::now() + Duration::from_secs(10);
        while log_count(&log, "shard handed back") == 0 {
            if Instant::now() > until {
                return Err("the shard was not handed back".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    })
    .await
    .map(drop);
    fleet.explain(r)
}

/// Shards of `job` that `log` shows as `needle` (`shard=N` fields).
fn shards_in(log: &Path, needle: &str) -> HashSet<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| {
            let at = l.find(" shard=")? + " shard=".len();
            l[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The shards a worker holds now: started, not yet finished or handed back.
fn held(log: &Path) -> HashSet<u64> {
    let mut held = shards_in(log, "shard started");
    for gone in [
        shards_in(log, "generation shard finished"),
        shards_in(log, "shard handed back"),
    ] {
        held.retain(|s| !gone.contains(s));
    }
    held
}

/// Waits until the worker whose log is `log` holds at least two shards in
/// one batch; returns them.
async fn holding_several(fleet: &Fleet, log: &Path) -> Result<HashSet<u64>> {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let h = held(log);
        if h.len() >= 2 && log_count(log, "joined the running batch") > 0 {
            return Ok(h);
        }
        if Instant::now() > until {
            return Err(format!("no worker held two shards:\n{}", fleet.logs()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Continuous batching across shards: a worker pulls further shards of the
/// running model while its batch has free sequences, and their records
/// join it. An owner's return hands every shard it holds back within 1 s;
/// a worker holding several is killed -9 and loses none; every record
/// comes out once, equal to the same records run whole in one batch.
#[tokio::test(flavor = "multi_thread")]
async fn shards_sharing_a_batch_equal_shards_run_alone() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = sharing(&mut fleet).await;
    fleet.explain(r)
}

async fn sharing(fleet: &mut Fleet) -> Result<()> {
    let shard = Shard {
        records: 48,
        max_tokens: 16,
        checkpointed: 0,
        path: EnginePath::Fast,
    };
    fleet.push_smollm2("smollm2")?;
    let input = fleet.dir.path().join("shared.jsonl");
    let ids = write_prompts(&input, shard.records)?;
    let (policy, signal) = fleet.owner_policy(1)?;
    fleet.add_watchdog(&[])?;
    fleet.worker_env = vec![(
        "RUST_LOG".into(),
        "info,minions_worker::generation=debug,minions_worker::shard=debug".into(),
    )];
    let flags = ["--slots", "1", "--max-shards", "3", "--max-seqs", "8"];
    let mut first = flags.to_vec();
    first.extend(["--policy", policy.as_str()]);
    fleet.add_worker(&first)?;
    let job = fleet.submit_prompts("smollm2", &input, 4, u64::from(shard.max_tokens), "shared")?;

    // The owner returns while the first worker holds several shards.
    let log1 = fleet.workers[0].log.clone();
    let holding = holding_several(fleet, &log1).await?;
    let list: serde_json::Value = serde_json::from_str(&fleet.cli(&["worker", "list", "--json"])?)?;
    assert_eq!(list[0]["holds"], 3, "the bound is not shown: {list}");
    eprintln!(
        "worker list: running {} of at most {}",
        list[0]["running"], list[0]["holds"]
    );
    std::fs::write(&signal, "active\n")?;
    let returned = Instant::now();
    while !holding.iter().all(|s| !held(&log1).contains(s)) {
        if returned.elapsed() > Duration::from_secs(10) {
            return Err(format!("shards {holding:?} not handed back:\n{}", fleet.logs()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = returned.elapsed();
    eprintln!(
        "owner active -> the {} shards held ({holding:?}) handed back or finished after {:.2} s",
        holding.len(),
        took.as_secs_f64()
    );
    assert!(took <= Duration::from_secs(1), "hand-back took {took:?}");

    // A second worker holding several is killed; the first, back, finishes.
    fleet.add_worker(&flags)?;
    let log2 = fleet.workers[1].log.clone();
    let holding = holding_several(fleet, &log2).await?;
    fleet.workers[1].kill();
    eprintln!("killed a worker holding shards {holding:?}");
    std::fs::write(&signal, "idle\n")?;
    let status = fleet.wait_job(&job, Duration::from_secs(600))?;
    assert_eq!(status["state"], "done");
    fleet.counts_agree(&job)?;
    let out = fleet.dir.path().join("shared.out.jsonl");
    fleet.cli(&["collect", &job, "--output", &out.display().to_string()])?;
    let lines = read_lines(&out)?;
    assert_eq!(lines.len(), shard.records, "each record once");
    let whole = tokio::task::spawn_blocking(move || run_whole(&shard)).await??;
    for (i, ((l, w), id)) in lines.iter().zip(&whole).zip(&ids).enumerate() {
        assert_eq!(l["id"], id.as_str());
        assert_eq!(
            l["text"].as_str(),
            Some(w.as_str()),
            "record {i}: run in a shared batch and run whole differ"
        );
    }
    eprintln!(
        "{} records, each once, equal to the same records run whole; joins: {} and {}",
        lines.len(),
        log_count(&log1, "joined the running batch"),
        log_count(&log2, "joined the running batch")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_batch_files_round_trip_and_bad_input_is_named() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = openai_and_bad_input(&mut fleet).await;
    fleet.explain(r)
}

async fn openai_and_bad_input(fleet: &mut Fleet) -> Result<()> {
    fleet.push_smollm2("smollm2")?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1"])?;
    let dir = fleet.dir.path().to_owned();
    let path = |n: &str| dir.join(n).display().to_string();

    // An OpenAI batch file, as OpenAI's docs shape it, submitted unchanged.
    let mut batch = String::new();
    for i in 0..12 {
        let line = serde_json::json!({
            "custom_id": format!("request-{}", 100 - i), "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": format!("Say hello number {i}.")}],
                "max_tokens": 6}});
        batch.push_str(&line.to_string());
        batch.push('\n');
    }
    // One record too long for the model's context: it fails alone.
    let long = "word ".repeat(9000);
    batch.push_str(&serde_json::json!({"custom_id": "too-long", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": long}], "max_tokens": 4}}).to_string());
    batch.push('\n');
    std::fs::write(dir.join("batch.jsonl"), batch)?;
    let job = fleet.cli(&[
        "submit",
        "--model",
        "smollm2",
        "--input",
        &path("batch.jsonl"),
        "--shard-size",
        "5",
        "--job",
        "openai",
    ])?;
    assert_eq!(
        fleet.wait_job(&job, Duration::from_secs(600))?["state"],
        "done"
    );
    fleet.counts_agree(&job)?;
    fleet.cli(&[
        "collect",
        &job,
        "--output",
        &path("batch_out.jsonl"),
        "--format",
        "openai",
    ])?;
    let lines = read_lines(&dir.join("batch_out.jsonl"))?;
    assert_eq!(lines.len(), 13);
    for (i, l) in lines.iter().take(12).enumerate() {
        assert_eq!(l["custom_id"], format!("request-{}", 100 - i));
        assert_eq!(l["response"]["status_code"], 200);
        let content = &l["response"]["body"]["choices"][0]["message"]["content"];
        assert!(content.is_string(), "{l}");
        assert!(
            l["response"]["body"]["usage"]["completion_tokens"]
                .as_u64()
                .unwrap_or(0)
                > 0,
            "{l}"
        );
    }
    let last = &lines[12];
    assert_eq!(last["custom_id"], "too-long");
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("exceeds the model's context"), "{last}");
    eprintln!(
        "OpenAI round trip: 12 answers with their custom_id; the over-long record: {message}"
    );

    // Bad records stop the submit at their line; nothing is published.
    let cases = [
        (
            r#"{"id": 1, "text": "no prompt here"}"#,
            "no \"prompt\" or \"messages\"",
        ),
        (
            r#"{"id": 2, "messages": [{"role": "wizard", "content": "hi"}]}"#,
            "role \"wizard\"",
        ),
        (
            r#"{"id": 3, "prompt": "hi", "max_tokens": 100000}"#,
            "exceeds the model's context of 8192",
        ),
    ];
    for (i, (line, want)) in cases.iter().enumerate() {
        let file = format!("bad{i}.jsonl");
        std::fs::write(
            dir.join(&file),
            format!("{{\"id\": 0, \"prompt\": \"fine\"}}\n{line}\n"),
        )?;
        let out = fleet.cli_raw(&[
            "submit",
            "--model",
            "smollm2",
            "--input",
            &path(&file),
            "--job",
            &format!("bad{i}"),
        ])?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("line 2") && err.contains(want), "{err}");
        eprintln!(
            "bad record refused: {}",
            err.lines().last().unwrap_or_default()
        );
    }

    // Bad models are refused at push, naming the file.
    let real = std::fs::read(real_gguf()?)?;
    std::fs::write(dir.join("truncated.gguf"), &real[..real.len() / 3])?;
    let other = dir.join("mamba.gguf");
    {
        use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
        let t = QTensor::quantize(
            &candle_core::Tensor::zeros(
                (4, 32),
                candle_core::DType::F32,
                &candle_core::Device::Cpu,
            )?,
            GgmlDType::F32,
        )?;
        let mut f = std::fs::File::create(&other)?;
        gguf_file::write(
            &mut f,
            &[(
                "general.architecture",
                &gguf_file::Value::String("mamba".into()),
            )],
            &[("token_embd.weight", &t)],
        )?;
    }
    for (file, want) in [
        ("truncated.gguf", "truncated"),
        ("mamba.gguf", "architecture \"mamba\" is not supported"),
    ] {
        let out = fleet.cli_raw(&["model", "push", &path(file), "--name", "bad"])?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(file) && err.contains(want), "{err}");
        eprintln!(
            "bad model refused: {}",
            err.lines().last().unwrap_or_default()
        );
    }
    // The fleet still runs a good job after all that.
    std::fs::write(dir.join("ok.jsonl"), "{\"prompt\": \"Hello\"}\n")?;
    let job = fleet.cli(&[
        "submit",
        "--model",
        "smollm2",
        "--input",
        &path("ok.jsonl"),
        "--max-tokens",
        "3",
        "--job",
        "after",
    ])?;
    assert_eq!(
        fleet.wait_job(&job, Duration::from_secs(300))?["state"],
        "done"
    );
    fleet.counts_agree(&job)?;
    Ok(())
}
