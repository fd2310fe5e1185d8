//! nats-server restarted mid-job (file storage): workers, watchdog and CLI
//! ride it out and the job completes with nothing lost.

use std::time::Duration;

use minions_tests::{Fleet, Result, max_abs_diff, read_npy_f32, tiny_model, write_corpus};

#[tokio::test(flavor = "multi_thread")]
async fn job_survives_a_nats_restart() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    if r.is_err() {
        eprintln!("{}", fleet.logs());
    }
    r
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let model = tiny_model(fleet.dir.path(), "tiny")?;
    fleet.cli(&[
        "model",
        "push",
        &model.display().to_string(),
        "--name",
        "tiny",
    ])?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 6000)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;
    let job = fleet.cli(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &input.display().to_string(),
        "--shard-size",
        "20",
        "--job",
        "restart",
    ])?;
    // Restart once some shards are done and many are left.
    loop {
        let s: serde_json::Value = serde_json::from_str(&fleet.cli(&["status", &job, "--json"])?)?;
        if s["done"].as_u64().unwrap_or(0) >= 20 {
            eprintln!(
                "restarting nats-server with {} of 300 shards done",
                s["done"]
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.nats.restart()?;
    let status = fleet.wait_job(&job, Duration::from_secs(300))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(fleet.output_count(&job)?, 300);
    let npy = fleet.dir.path().join("v.npy");
    fleet.cli(&["collect", &job, "--output", &npy.display().to_string()])?;
    let (_, _, got) = read_npy_f32(&npy)?;
    let want = minions_worker::model::BertEmbedder::load(&model, &candle_core::Device::Cpu)?
        .embed(&texts, 32)?;
    assert!(max_abs_diff(&got, &want) <= 1e-5);
    eprintln!(
        "job done after the restart: {} redeliveries",
        status["redeliveries"]
    );
    Ok(())
}
