//! Bad input gets a clear error naming the problem, and other work goes on:
//! a malformed JSONL line, an unknown model, a model whose files do not match
//! their hash, and a shard message that does not decode.

use std::io::Write;
use std::time::Duration;

use minions_tests::{Fleet, Result, tiny_model, write_corpus};

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_named_and_isolated() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let good = tiny_model(fleet.dir.path(), "good")?;
    let bad = tiny_model(fleet.dir.path(), "bad")?;
    fleet.cli(&[
        "model",
        "push",
        &good.display().to_string(),
        "--name",
        "good",
    ])?;
    let bad_hash = fleet.cli(&["model", "push", &bad.display().to_string(), "--name", "bad"])?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 300)?;
    let input_s = input.display().to_string();

    // 1. A malformed line: refused with its line number, nothing published.
    let broken = fleet.dir.path().join("broken.jsonl");
    {
        let text = std::fs::read_to_string(&input)?;
        let mut f = std::fs::File::create(&broken)?;
        for (i, line) in text.lines().enumerate() {
            if i == 56 {
                writeln!(f, "{{\"id\": 56, \"text\": \"unterminated}}")?;
            } else {
                writeln!(f, "{line}")?;
            }
        }
    }
    let out = fleet.cli_raw(&[
        "submit",
        "--model",
        "good",
        "--input",
        &broken.display().to_string(),
        "--shard-size",
        "10",
    ])?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("line 57") && err.contains("nothing was published"),
        "{err}"
    );
    assert_eq!(fleet.work_stream_messages().await?, 0);
    eprintln!(
        "malformed line: {}",
        err.lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default()
    );
    // With --skip-bad the same file is accepted minus that line.
    let job = fleet.cli(&[
        "submit",
        "--model",
        "good",
        "--input",
        &broken.display().to_string(),
        "--shard-size",
        "50",
        "--skip-bad",
        "--job",
        "skipping",
    ])?;
    assert_eq!(job, "skipping");

    // 2. An unknown model: refused, known models listed.
    let out = fleet.cli_raw(&["submit", "--model", "nope", "--input", &input_s])?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("unknown model \"nope\"") && err.contains("bad, good"),
        "{err}"
    );
    eprintln!(
        "unknown model: {}",
        err.lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default()
    );

    // 3. A model whose stored file no longer matches its hash.
    let stored = fleet
        .dir
        .path()
        .join("store/models/blobs")
        .join(&bad_hash)
        .join("files/model.safetensors");
    let mut bytes = std::fs::read(&stored)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&stored, bytes)?;
    fleet.submit("bad", &input, 100, "tampered")?;

    // 4. Shard messages that do not decode, beside good work: one on a
    // job's subject (its worker terminates it), one of no job at all (the
    // watchdog removes it).
    let js = async_nats::jetstream::new(fleet.nats.client().await?);
    for subject in ["minions.work.garbage.0", "minions.work.fine.9999"] {
        js.publish(subject, bytes::Bytes::from_static(b"\xc1 not msgpack"))
            .await?
            .await?;
    }
    fleet.submit("good", &input, 100, "fine")?;
    fleet.add_watchdog(&[])?;

    fleet.add_worker(&[])?;
    let fine = fleet.wait_job("fine", Duration::from_secs(120))?;
    assert_eq!(fine["state"], "done", "{fine}");
    let skipping = fleet.wait_job("skipping", Duration::from_secs(120))?;
    assert_eq!(skipping["state"], "done", "{skipping}");
    assert_eq!(skipping["records"], 299);
    let tampered = fleet.wait_job("tampered", Duration::from_secs(120))?;
    assert_eq!(tampered["state"], "failed", "{tampered}");
    assert_eq!(tampered["failed"], 3);
    let reason = tampered["failed_shards"][0]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("model.safetensors does not match its hash"),
        "{reason}"
    );
    eprintln!("tampered model: {reason}");
    let status = fleet.cli(&["status", "tampered"])?;
    assert!(
        status.contains("completed with 3 failed") && status.contains("does not match its hash"),
        "{status}"
    );

    // The undecodable messages were removed and named in the logs.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while fleet.work_stream_messages().await? != 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        fleet.work_stream_messages().await?,
        0,
        "every message settled"
    );
    let log = std::fs::read_to_string(&fleet.workers[0].log)?;
    let line = log
        .lines()
        .find(|l| l.contains("shard message does not decode"))
        .ok_or("worker did not report the undecodable message")?;
    assert!(line.contains("minions.work.fine.9999"), "{line}");
    eprintln!("undecodable message: {line}");
    let log = std::fs::read_to_string(&fleet.watchdogs[0].log)?;
    let line = log
        .lines()
        .find(|l| l.contains("belongs to no job"))
        .ok_or("the watchdog did not report the message of no job")?;
    assert!(line.contains("minions.work.garbage.0"), "{line}");
    eprintln!("message of no job: {line}");

    // collect refuses an incomplete job and says why.
    let out = fleet.cli_raw(&[
        "collect",
        "tampered",
        "--output",
        &fleet.dir.path().join("t.npy").display().to_string(),
    ])?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("3 of 3 shards have no output"),
        "{err}"
    );
    Ok(())
}

/// A job id given again with another input is refused, and the first job's
/// shard inputs stay as they were (its shards still read what was submitted).
#[tokio::test(flavor = "multi_thread")]
async fn a_reused_job_id_leaves_the_first_inputs_alone() -> Result<()> {
    let fleet = Fleet::local()?;
    let r = reused_id(&fleet);
    fleet.explain(r)
}

fn reused_id(fleet: &Fleet) -> Result<()> {
    let model = tiny_model(fleet.dir.path(), "tiny")?;
    fleet.cli(&[
        "model",
        "push",
        &model.display().to_string(),
        "--name",
        "tiny",
    ])?;
    let first = fleet.dir.path().join("first.jsonl");
    write_corpus(&first, 40)?;
    let other = fleet.dir.path().join("other.jsonl");
    {
        let mut f = std::fs::File::create(&other)?;
        for i in 0..40 {
            writeln!(
                f,
                "{{\"id\": {i}, \"text\": \"something else entirely {i}\"}}"
            )?;
        }
    }
    fleet.submit("tiny", &first, 10, "reused")?;
    let inputs = fleet.dir.path().join("store/jobs/reused/inputs");
    let read_all = || -> Result<Vec<(std::ffi::OsString, Vec<u8>)>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(&inputs)? {
            let e = e?;
            v.push((e.file_name(), std::fs::read(e.path())?));
        }
        v.sort();
        Ok(v)
    };
    let before = read_all()?;
    assert_eq!(before.len(), 4, "4 shards of 10 records");
    // One input lost from the store: a refused submit must not fill it in.
    std::fs::remove_file(inputs.join(&before[0].0))?;
    let rest = read_all()?;
    let out = fleet.cli_raw(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &other.display().to_string(),
        "--shard-size",
        "10",
        "--job",
        "reused",
    ])?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a different input under a used id must be refused"
    );
    assert!(
        said.contains("already exists with a different input"),
        "{said}"
    );
    assert!(
        read_all()? == rest,
        "the refused submit changed the first job's shard inputs"
    );
    // The same input again is a resubmit: it puts back the lost input and
    // leaves the others alone. Asked in int8, it keeps the job's f32 (its
    // tasks and consumer are the stored spec's) and says so.
    let out = fleet.cli_raw(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &first.display().to_string(),
        "--shard-size",
        "10",
        "--job",
        "reused",
        "--precision",
        "int8",
    ])?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("first submit's --precision f32"), "{said}");
    assert!(read_all()? == before);
    Ok(())
}
