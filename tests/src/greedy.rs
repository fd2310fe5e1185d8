//! SmolLM2's greedy chat fixture (tests/fixtures/smollm2/greedy.json:
//! llama.cpp's answers to 100 chat prompts, recorded once by
//! tests/fixtures/make_smollm2_reference.py) as generation records, and a
//! way to run records through a generator with a given width.

use minions_schemas::messages::{ChatTurn, Generation, GenerationRecord, Prompt, SamplingParams};
use minions_worker::model::Model;
use minions_worker::model::llm::{GenControl, GenLimits, GgufGenerator};

use crate::{Result, workspace_root};

/// The fixture's cases: each with `messages`, llama.cpp's `prompt`,
/// `tokens`, `text` and `top2_gap` per generated token.
pub fn greedy_cases() -> Result<Vec<serde_json::Value>> {
    let path = workspace_root().join("tests/fixtures/smollm2/greedy.json");
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?,
    )?;
    Ok(cases
        .as_array()
        .ok_or("greedy fixture is not a list")?
        .clone())
}

/// Each case's chat as a record of at most `max_tokens` greedy tokens.
pub fn chat_records(cases: &[serde_json::Value], max_tokens: u32) -> Result<Vec<GenerationRecord>> {
    cases
        .iter()
        .map(|c| {
            let turns = c["messages"]
                .as_array()
                .ok_or("case without messages")?
                .iter()
                .map(|m| ChatTurn {
                    role: m["role"].as_str().unwrap_or_default().to_owned(),
                    content: m["content"].as_str().unwrap_or_default().to_owned(),
                })
                .collect();
            Ok(GenerationRecord {
                prompt: Prompt::Messages(turns),
                params: SamplingParams {
                    max_tokens,
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: 0,
                    seed: 0,
                    stop: vec![],
                },
            })
        })
        .collect()
}

/// Runs `records` with at most `width` sequences in flight; results in
/// input order.
pub fn generate_all(
    generator: &GgufGenerator,
    records: &[GenerationRecord],
    width: usize,
) -> Result<Vec<Generation>> {
    let indexed: Vec<(usize, &GenerationRecord)> = records.iter().enumerate().collect();
    let mut out: Vec<Option<Generation>> = vec![None; records.len()];
    let limits = GenLimits {
        max_seqs: width,
        ..GenLimits::default()
    };
    generator.generate(&indexed, limits, &GenControl::default(), &mut |i, g| {
        out[i] = Some(g)
    })?;
    out.into_iter()
        .enumerate()
        .map(|(i, g)| g.ok_or_else(|| format!("record {i} got no result").into()))
        .collect()
}

/// `n` one-turn chat prompts ("Explain the moon in two sentences.", …):
/// 80 distinct, repeated past that; the generation benchmarks' prompts.
pub fn chat_prompts(n: usize) -> Vec<String> {
    let topics = [
        "the moon",
        "coffee",
        "volcanoes",
        "jazz",
        "honeybees",
        "winter",
        "bread",
        "the ocean",
        "binary search",
        "lighthouses",
        "friendship",
        "electricity",
        "maps",
        "tea",
        "snow",
        "rivers",
        "the Roman Empire",
        "photosynthesis",
        "a rainy day",
        "the number zero",
    ];
    let asks = [
        "Explain {} in two sentences.",
        "Give me three facts about {}.",
        "Write a short poem about {}.",
        "Describe {} to a child.",
    ];
    (0..n)
        .map(|i| asks[(i / topics.len()) % asks.len()].replace("{}", topics[i % topics.len()]))
        .collect()
}
