//! Whether two outputs of one shard, made by different workers, agree,
//! with a tolerance that fits the model family and precision:
//!
//! - embeddings: the cosine of each pair of rows. Every CPU kernel path
//!   computes the same bits, but devices (Metal, CUDA, CPU) sum in different
//!   orders, so equal bits cannot be asked of them; a cosine of at least
//!   0.9999 (f32), 0.999 (int8, whose activations are quantised per
//!   product; also bf16) or 0.9995 (f16) can, and 0.98 for int8 between makers of different arithmetic
//!   ([`Provenance::same_arithmetic`]), which quantise differently. A faulty
//!   machine is outside: a single component off by 0.25 in a unit vector
//!   gives about 0.97.
//! - generations: the same text, token count and finish reason per record,
//!   between makers of the same arithmetic only. Decoding is deterministic
//!   there (sampled decoding too, with the record's seed), but a GPU's last
//!   bits turn near ties into other tokens and whole other answers: on the
//!   device path, 83 of 100 greedy answers of 64 tokens differed from the
//!   CPU's, each first at a near tie (llama.cpp's own two attention paths
//!   differ on 85). Outputs of different arithmetic are not comparable, so
//!   such a check decides nothing and strikes no one.

use minions_schemas::messages::{OutputPayload, Precision, Provenance, ShardOutput};

/// How close two runs of one shard must be to agree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// The least cosine between two embeddings of one record.
    pub min_cosine: f64,
    /// The same between makers of different arithmetic.
    pub min_cosine_across: f64,
}

impl Tolerance {
    /// The tolerance for embeddings made at `precision`.
    pub fn for_precision(precision: Precision) -> Self {
        Self {
            min_cosine: precision.min_cosine(),
            min_cosine_across: precision.min_cosine_across(),
        }
    }
}

/// The makers of `a` and `b` when both are known and differ in arithmetic
/// (outputs made before provenance was recorded count as the same).
fn different_arithmetic<'a>(
    a: &'a ShardOutput,
    b: &'a ShardOutput,
) -> Option<(&'a Provenance, &'a Provenance)> {
    match (&a.made_by, &b.made_by) {
        (Some(x), Some(y)) if !x.same_arithmetic(y) => Some((x, y)),
        _ => None,
    }
}

/// What a comparison found.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every record agrees; for embeddings, the least cosine seen.
    Agree {
        /// Records compared.
        rows: u64,
        /// The least cosine between two rows (embeddings only).
        min_cosine: Option<f64>,
    },
    /// The outputs differ: the first record that does, and how.
    Disagree {
        /// The record's index in the shard.
        row: u64,
        /// How it differs.
        why: String,
    },
    /// The two are not outputs of the same shard and model: nothing can
    /// be said about either worker.
    NotComparable(String),
}

/// Compares `a` and `b`, two outputs of one shard.
pub fn compare(a: &ShardOutput, b: &ShardOutput, tol: Tolerance) -> Verdict {
    if a.job != b.job || a.shard != b.shard || a.first_row != b.first_row || a.rows != b.rows {
        return Verdict::NotComparable(format!(
            "not the same shard: job {} shard {} ({} rows) against job {} shard {} ({} rows)",
            a.job, a.shard, a.rows, b.job, b.shard, b.rows
        ));
    }
    if a.model_hash != b.model_hash {
        return Verdict::NotComparable(format!(
            "made by different models: {} against {}",
            a.model_hash, b.model_hash
        ));
    }
    if let Err(e) = a.check_shape().and(b.check_shape()) {
        return Verdict::NotComparable(e);
    }
    match (&a.payload, &b.payload) {
        (
            OutputPayload::Embeddings { dim: da, data: xa },
            OutputPayload::Embeddings { dim: db, data: xb },
        ) => {
            if da != db {
                return Verdict::Disagree {
                    row: 0,
                    why: format!("vectors of {da} against {db} dimensions"),
                };
            }
            let least = match different_arithmetic(a, b) {
                Some(_) => tol.min_cosine_across,
                None => tol.min_cosine,
            };
            embeddings(*da as usize, xa, xb, least)
        }
        (
            OutputPayload::Generations { records: ga },
            OutputPayload::Generations { records: gb },
        ) => {
            if let Some((x, y)) = different_arithmetic(a, b) {
                return Verdict::NotComparable(format!(
                    "generations made with different arithmetic ({x} against {y}) part at near ties, so they are compared only between makers of the same"
                ));
            }
            for (row, (x, y)) in (0u64..).zip(ga.iter().zip(gb)) {
                if x.text != y.text
                    || x.completion_tokens != y.completion_tokens
                    || x.finish_reason != y.finish_reason
                {
                    return Verdict::Disagree {
                        row,
                        why: format!(
                            "generations differ: {} tokens ({:?}) against {} tokens ({:?})",
                            x.completion_tokens,
                            x.finish_reason,
                            y.completion_tokens,
                            y.finish_reason
                        ),
                    };
                }
            }
            Verdict::Agree {
                rows: a.rows,
                min_cosine: None,
            }
        }
        (
            OutputPayload::Transcripts { records: ta },
            OutputPayload::Transcripts { records: tb },
        ) => {
            if let Some((x, y)) = different_arithmetic(a, b) {
                return Verdict::NotComparable(format!(
                    "transcripts made with different arithmetic ({x} against {y}) part at near ties, so they are compared only between makers of the same"
                ));
            }
            for (row, (x, y)) in (0u64..).zip(ta.iter().zip(tb)) {
                if x != y {
                    return Verdict::Disagree {
                        row,
                        why: format!(
                            "transcripts differ: {} segments ({} characters) against {} ({})",
                            x.segments.len(),
                            x.text.len(),
                            y.segments.len(),
                            y.text.len()
                        ),
                    };
                }
            }
            Verdict::Agree {
                rows: a.rows,
                min_cosine: None,
            }
        }
        _ => Verdict::Disagree {
            row: 0,
            why: "the two outputs hold different kinds of results".into(),
        },
    }
}

fn embeddings(dim: usize, xa: &[u8], xb: &[u8], min_cosine: f64) -> Verdict {
    let stride = dim * 4;
    if stride == 0 {
        return Verdict::Agree {
            rows: 0,
            min_cosine: None,
        };
    }
    let mut least = 1.0f64;
    let mut rows = 0u64;
    for (row, (ra, rb)) in (0u64..).zip(xa.chunks_exact(stride).zip(xb.chunks_exact(stride))) {
        let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (ca, cb) in ra.chunks_exact(4).zip(rb.chunks_exact(4)) {
            let x = f64::from(f32::from_le_bytes([ca[0], ca[1], ca[2], ca[3]]));
            let y = f64::from(f32::from_le_bytes([cb[0], cb[1], cb[2], cb[3]]));
            dot += x * y;
            na += x * x;
            nb += y * y;
        }
        let cos = if na == 0.0 && nb == 0.0 {
            1.0
        } else if na == 0.0 || nb == 0.0 {
            0.0
        } else {
            dot / (na.sqrt() * nb.sqrt())
        };
        // A row with a NaN is a disagreement.
        if cos.is_nan() || cos < min_cosine {
            return Verdict::Disagree {
                row,
                why: format!("cosine {cos:.6}, below {min_cosine}"),
            };
        }
        least = least.min(cos);
        rows += 1;
    }
    Verdict::Agree {
        rows,
        min_cosine: Some(least),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::{FinishReason, Generation};
    use minions_schemas::{IdError, JobId, ModelHash, SCHEMA_VERSION, WorkerId};

    fn output(worker: &str, payload: OutputPayload, rows: u64) -> Result<ShardOutput, IdError> {
        Ok(ShardOutput {
            v: SCHEMA_VERSION,
            job: JobId::new("j")?,
            shard: 3,
            first_row: 30,
            rows,
            model_hash: ModelHash::new("ab".repeat(32))?,
            worker: WorkerId::new(worker)?,
            payload,
            made_by: None,
        })
    }

    fn vectors(rows: &[[f32; 2]]) -> OutputPayload {
        OutputPayload::Embeddings {
            dim: 2,
            data: rows
                .iter()
                .flatten()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        }
    }

    fn text(t: &str) -> Generation {
        Generation {
            text: t.into(),
            finish_reason: FinishReason::Stop,
            prompt_tokens: 4,
            completion_tokens: 2,
            error: None,
        }
    }

    #[test]
    fn close_embeddings_agree_and_a_perturbed_row_does_not() -> Result<(), IdError> {
        let tol = Tolerance::for_precision(Precision::F32);
        let a = output("w1", vectors(&[[0.6, 0.8], [1.0, 0.0]]), 2)?;
        let b = output("w2", vectors(&[[0.600_01, 0.8], [1.0, 0.0]]), 2)?;
        assert!(matches!(
            compare(&a, &b, tol),
            Verdict::Agree { rows: 2, min_cosine: Some(c) } if c > 0.9999
        ));
        let c = output("w3", vectors(&[[0.6, 0.8], [1.0, 0.25]]), 2)?;
        assert!(matches!(
            compare(&a, &c, tol),
            Verdict::Disagree { row: 1, .. }
        ));
        let nan = output("w4", vectors(&[[f32::NAN, 0.8], [1.0, 0.0]]), 2)?;
        assert!(matches!(
            compare(&a, &nan, tol),
            Verdict::Disagree { row: 0, .. }
        ));
        Ok(())
    }

    #[test]
    fn generations_must_match_exactly() -> Result<(), IdError> {
        let tol = Tolerance::for_precision(Precision::Int8);
        let gens = |t: &str| OutputPayload::Generations {
            records: vec![text("same"), text(t)],
        };
        let a = output("w1", gens("yes"), 2)?;
        let b = output("w2", gens("yes"), 2)?;
        assert_eq!(
            compare(&a, &b, tol),
            Verdict::Agree {
                rows: 2,
                min_cosine: None
            }
        );
        let c = output("w3", gens("no"), 2)?;
        assert!(matches!(
            compare(&a, &c, tol),
            Verdict::Disagree { row: 1, .. }
        ));
        Ok(())
    }

    fn made(device: &str, kernel: &str) -> Option<Provenance> {
        Some(Provenance {
            build: "0.1.0".into(),
            device: device.into(),
            kernel: kernel.into(),
        })
    }

    /// A GPU and a CPU: int8 rows are held to the looser cosine, which a
    /// perturbed row still fails; generations are not compared at all. Two
    /// CPU kernel paths are the same arithmetic.
    #[test]
    fn makers_of_different_arithmetic_are_held_to_what_they_can_meet() -> Result<(), IdError> {
        let tol = Tolerance::for_precision(Precision::Int8);
        // Cosine about 0.99 between the two.
        let mut cpu = output("w1", vectors(&[[0.6, 0.8]]), 1)?;
        let mut gpu = output("w2", vectors(&[[0.68, 0.73]]), 1)?;
        cpu.made_by = made("cpu", "avx2");
        gpu.made_by = made("cuda:0", "avx2");
        assert!(matches!(compare(&cpu, &gpu, tol), Verdict::Agree { .. }));
        let mut other_cpu = gpu.clone();
        other_cpu.made_by = made("cpu", "avx512");
        assert!(matches!(
            compare(&cpu, &other_cpu, tol),
            Verdict::Disagree { .. }
        ));
        let mut perturbed = output("w3", vectors(&[[0.6, 0.8], [1.0, 0.25]]), 2)?;
        let mut gpu2 = output("w2", vectors(&[[0.6, 0.8], [1.0, 0.0]]), 2)?;
        perturbed.made_by = made("cpu", "avx2");
        gpu2.made_by = made("metal:0", "portable");
        assert!(matches!(
            compare(&perturbed, &gpu2, tol),
            Verdict::Disagree { row: 1, .. }
        ));

        let gens = |t: &str| OutputPayload::Generations {
            records: vec![text(t)],
        };
        let mut a = output("w1", gens("yes"), 1)?;
        let mut b = output("w2", gens("no"), 1)?;
        a.made_by = made("cpu", "avx2");
        b.made_by = made("cpu", minions_schemas::messages::DEVICE_PATH_KERNEL);
        assert!(matches!(compare(&a, &b, tol), Verdict::NotComparable(_)));
        b.made_by = made("cpu", "portable");
        assert!(matches!(compare(&a, &b, tol), Verdict::Disagree { .. }));
        Ok(())
    }

    #[test]
    fn outputs_of_other_shards_or_shapes_are_not_compared() -> Result<(), IdError> {
        let tol = Tolerance::for_precision(Precision::F32);
        let a = output("w1", vectors(&[[0.6, 0.8]]), 1)?;
        let mut b = output("w2", vectors(&[[0.6, 0.8]]), 1)?;
        b.shard = 4;
        assert!(matches!(compare(&a, &b, tol), Verdict::NotComparable(_)));
        let short = output("w2", vectors(&[[0.6, 0.8]]), 2)?;
        assert!(matches!(
            compare(&a, &short, tol),
            Verdict::NotComparable(_)
        ));
        Ok(())
    }
}
