//! The core path end to end on a local-directory store, then an int8 job on
//! the same fleet.

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
