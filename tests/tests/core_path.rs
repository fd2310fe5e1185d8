//! The core path end to end on a local-directory store, then an int8 job on
//! the same fleet; small shards packed into shared passes.

use std::time::Duration;

use minions_tests::{Fleet, Result, core_job_scenario, read_npy_f32, write_corpus};
use minions_worker::model::{Batching, BertEmbedder, Precision};

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_records_on_two_workers_with_a_local_store() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let mut r = core_job_scenario(&mut fleet).await;
    if r.is_ok() {
        r = int8_job(&fleet);
    }
    if r.is_err() {
        eprintln!("{}", fleet.logs());
    }
    r
}

/// `minions submit --precision int8`: the workers give what the int8 model
/// gives in-process, which is close to f32 but not equal to it.
fn int8_job(fleet: &Fleet) -> Result<()> {
    let model = fleet.push_model("tiny8", Default::default())?;
    let input = fleet.dir.path().join("int8.jsonl");
    let texts = write_corpus(&input, 1_000)?;
    let job = fleet.cli(&[
        "submit",
        "--model",
        "tiny8",
        "--input",
        &input.display().to_string(),
        "--job",
        "int8",
        "--shard-size",
        "100",
        "--precision",
        "int8",
    ])?;
    let status = fleet.wait_job(&job, Duration::from_secs(300))?;
    assert_eq!(status["state"], "done", "{status}");
    fleet.check_outputs_in(&job, &model, &texts, Precision::Int8)?;

    let (rows, dim, got) = read_npy_f32(&fleet.dir.path().join("int8.npy"))?;
    assert_eq!(rows, 1_000);
    let f32s = BertEmbedder::load(&model, &candle_core::Device::Cpu, Precision::F32)?
        .embed(&texts, Batching::texts(64))?;
    // Unit vectors: the dot product is the cosine.
    let cosines: Vec<f32> = got
        .chunks_exact(dim)
        .zip(f32s.chunks_exact(dim))
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
        .collect();
    let worst = cosines.iter().fold(1f32, |m, &c| m.min(c));
    let mean = cosines.iter().sum::<f32>() / cosines.len() as f32;
    eprintln!("int8 job against f32: mean cosine {mean:.6}, worst {worst:.6}");
    assert!(worst < 0.999_999, "int8 gave the f32 vectors");
    assert!(mean > 0.99 && worst > 0.95, "mean {mean}, worst {worst}");
    Ok(())
}

/// Shards far smaller than a pass, on one worker that holds up to four at
/// once: they share passes, and each gets what its texts give in-process
/// (today's tolerance, max abs diff 1e-5).
#[tokio::test(flavor = "multi_thread")]
async fn small_shards_share_passes_and_give_what_they_give_alone() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = packed_job(&mut fleet).await;
    fleet.explain(r)
}

async fn packed_job(fleet: &mut Fleet) -> Result<()> {
    // The paced model holds the device 20 ms a record, as a slower
    // machine would, so that shards wait for it side by side.
    let model = fleet.push_slow_model()?;
    let input = fleet.dir.path().join("small.jsonl");
    let texts = write_corpus(&input, 200)?;
    fleet.add_watchdog(&[])?;
    fleet
        .worker_env
        .push(("RUST_LOG".into(), "info,minions_worker::pack=debug".into()));
    fleet.add_worker(&["--slots", "1", "--max-shards", "4"])?;
    let job = fleet.submit("slow", &input, 5, "small")?;
    let status = fleet.wait_job(&job, Duration::from_secs(120))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["done"], 40, "{status}");
    fleet.check_outputs(&job, &model, &texts)?;
    let log = std::fs::read_to_string(&fleet.workers[0].log)?;
    let packs: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("embedding pack ran"))
        .filter_map(|l| {
            let at = l.find("shards=")? + "shards=".len();
            l[at..].split(' ').next()?.parse().ok()
        })
        .collect();
    let packed: u64 = packs.iter().sum();
    eprintln!(
        "40 shards of 5 records: {} passes shared by {packed} shards (most {}), {} alone",
        packs.len(),
        packs.iter().max().unwrap_or(&0),
        40 - packed
    );
    assert!(
        packs.iter().any(|&s| s >= 3),
        "no pass shared by 3 shards: {packs:?}"
    );
    Ok(())
}
