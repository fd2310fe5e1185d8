//! Judging a check run: reads the check run's output and the result it
//! checks (and, in the tie-break round, the first check run's) and rules
//! whether they agree, with [`compare`]'s tolerance. Reading only: what the
//! ruling leads to (a verdict event, a further round, a replaced output, a
//! strike) is the tracker's.

use minions_schemas::messages::ShardOutput;
use minions_schemas::{JobId, WorkerId, keys};
use object_store::ObjectStore;

use crate::trust::backing::{self, Backing, BackingError};
use crate::trust::compare::{Tolerance, Verdict, compare};

/// One result of a shard: who made it and its output's SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunResult {
    /// The worker that made it.
    pub worker: WorkerId,
    /// SHA-256 of its output object, hex.
    pub sha256: String,
}

/// What a check round is judged on.
#[derive(Debug, Clone)]
pub struct Case {
    /// The job.
    pub job: JobId,
    /// The shard.
    pub shard: u32,
    /// The check run's round (1 or 2).
    pub round: u8,
    /// Records in the shard.
    pub rows: u64,
    /// The check run's result (its output at [`keys::shard_check`]).
    pub check: RunResult,
    /// The shard's result (its output at [`keys::shard_output`]); None when
    /// it was withdrawn meanwhile.
    pub primary: Option<RunResult>,
    /// Round 1's check result, in round 2.
    pub earlier: Option<RunResult>,
    /// How close two outputs must be.
    pub tolerance: Tolerance,
}

/// What the judge ruled.
#[derive(Debug, Clone, PartialEq)]
pub enum Ruling {
    /// The check agrees with the shard's result.
    Agreed(String),
    /// Round 1 disagrees: a tie-break round decides.
    Disagreed(String),
    /// The tie-break sided with one result; `outvoted` made the other.
    /// `stands` is the result that replaces the shard's (None: the shard's
    /// result stands).
    Decided {
        /// The worker whose result lost.
        outvoted: WorkerId,
        /// The round-1 result that replaces the shard's, when the shard's
        /// lost.
        stands: Option<RunResult>,
        /// In words.
        detail: String,
    },
    /// Nothing can be decided.
    Undecided(String),
}

fn describe(v: &Verdict) -> String {
    match v {
        Verdict::Agree {
            rows,
            min_cosine: Some(c),
        } => format!("{rows} records agree (least cosine {c:.6})"),
        Verdict::Agree { rows, .. } => format!("{rows} records agree"),
        Verdict::Disagree { row, why } => format!("record {row} differs: {why}"),
        Verdict::NotComparable(why) => format!("not comparable: {why}"),
    }
}

/// Reads a result's output at `key` and checks it against its SHA-256;
/// Ok(None) when it is not there or not what the event said.
async fn read(
    store: &dyn ObjectStore,
    key: String,
    case: &Case,
    r: &RunResult,
) -> Result<Option<ShardOutput>, BackingError> {
    match backing::check_at(store, key, &case.job, case.shard, &r.sha256, case.rows).await? {
        Backing::Backed(o) => Ok(Some(*o)),
        Backing::Missing | Backing::Mismatch(_) => Ok(None),
    }
}

/// Judges `case`. Equal checksums agree without reading anything; else the
/// outputs are read and compared. An error means the store failed: judge
/// again later.
pub async fn judge(store: &dyn ObjectStore, case: &Case) -> Result<Ruling, BackingError> {
    let same_bytes = "the same output, byte for byte".to_owned();
    let Some(primary_result) = &case.primary else {
        return Ok(Ruling::Undecided(
            "the shard's result was withdrawn while it was checked".to_owned(),
        ));
    };
    let check_key = keys::shard_check(&case.job, case.shard, case.round);
    let primary_key = keys::shard_output(&case.job, case.shard);
    let Some(first) = &case.earlier else {
        if case.check.sha256 == primary_result.sha256 {
            return Ok(Ruling::Agreed(same_bytes));
        }
        let Some(check) = read(store, check_key, case, &case.check).await? else {
            return Ok(unbacked(case.round));
        };
        let Some(primary) = read(store, primary_key, case, primary_result).await? else {
            return Ok(Ruling::Undecided(
                "the shard's result changed while it was checked".to_owned(),
            ));
        };
        let v = compare(&primary, &check, case.tolerance);
        return Ok(match v {
            Verdict::Agree { .. } => Ruling::Agreed(describe(&v)),
            Verdict::Disagree { .. } => Ruling::Disagreed(describe(&v)),
            Verdict::NotComparable(_) => Ruling::Undecided(describe(&v)),
        });
    };
    // The tie-break. The shard's result may have been replaced since the
    // first check run disagreed with it (withdrawn from a quarantined
    // machine and run again): then the first check is judged anew against
    // it, and no one is outvoted when they agree.
    if first.sha256 == primary_result.sha256 {
        return Ok(Ruling::Agreed(format!(
            "the first check run made {same_bytes} as the shard's result as it stands now"
        )));
    }
    let Some(check) = read(store, check_key, case, &case.check).await? else {
        return Ok(unbacked(case.round));
    };
    let Some(primary) = read(store, primary_key, case, primary_result).await? else {
        return Ok(Ruling::Undecided(
            "the shard's result changed while it was checked".to_owned(),
        ));
    };
    let first_key = keys::shard_check(&case.job, case.shard, 1);
    let Some(first_out) = read(store, first_key, case, first).await? else {
        return Ok(Ruling::Undecided(
            "the first check run's output is gone".to_owned(),
        ));
    };
    let agrees = |v: &Verdict| matches!(v, Verdict::Agree { .. });
    let first_with_primary = compare(&primary, &first_out, case.tolerance);
    if agrees(&first_with_primary) {
        return Ok(Ruling::Agreed(format!(
            "the first check run agrees with the shard's result as it stands now ({})",
            describe(&first_with_primary)
        )));
    }
    let with_primary = compare(&primary, &check, case.tolerance);
    let with_first = compare(&first_out, &check, case.tolerance);
    Ok(match (agrees(&with_primary), agrees(&with_first)) {
        (true, false) => Ruling::Decided {
            outvoted: first.worker.clone(),
            stands: None,
            detail: format!(
                "the tie-break agrees with the shard's result ({}), not with the first check run ({})",
                describe(&with_primary),
                describe(&with_first)
            ),
        },
        (false, true) => Ruling::Decided {
            outvoted: primary_result.worker.clone(),
            stands: Some(first.clone()),
            detail: format!(
                "the tie-break agrees with the first check run ({}), not with the shard's result ({})",
                describe(&with_first),
                describe(&with_primary)
            ),
        },
        (true, true) => Ruling::Undecided(format!(
            "the tie-break is within tolerance of both, which disagree ({})",
            describe(&first_with_primary)
        )),
        (false, false) => Ruling::Undecided(format!(
            "all three differ: {}; {}",
            describe(&with_primary),
            describe(&with_first)
        )),
    })
}

fn unbacked(round: u8) -> Ruling {
    Ruling::Undecided(format!(
        "the check run's output (round {round}) is not what its event says"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::{OutputPayload, Precision};
    use minions_schemas::{ModelHash, SCHEMA_VERSION, encode};
    use object_store::path::Path as StorePath;
    use object_store::{ObjectStoreExt, memory::InMemory};
    use sha2::{Digest, Sha256};

    type Res = Result<(), Box<dyn std::error::Error>>;

    /// Writes an output of shard 0 of job `j` with one row `[x, 1 - x]`
    /// made by `worker` at `key`; returns its result.
    async fn put(
        store: &InMemory,
        key: String,
        worker: &str,
        x: f32,
    ) -> Result<RunResult, Box<dyn std::error::Error>> {
        let out = ShardOutput {
            v: SCHEMA_VERSION,
            job: JobId::new("j")?,
            shard: 0,
            first_row: 0,
            rows: 1,
            model_hash: ModelHash::new("ab".repeat(32))?,
            worker: WorkerId::new(worker)?,
            payload: OutputPayload::Embeddings {
                dim: 2,
                data: [x, 1.0 - x].iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
            made_by: None,
        };
        let bytes = encode("shard output", &out)?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        store.put(&StorePath::from(key), bytes.into()).await?;
        Ok(RunResult {
            worker: WorkerId::new(worker)?,
            sha256,
        })
    }

    fn case(round: u8, check: RunResult, primary: RunResult, earlier: Option<RunResult>) -> Case {
        Case {
            job: primary_job(),
            shard: 0,
            round,
            rows: 1,
            check,
            primary: Some(primary),
            earlier,
            tolerance: Tolerance::for_precision(Precision::F32),
        }
    }

    fn primary_job() -> JobId {
        JobId::new("j").unwrap_or_else(|_| unreachable!("a valid id"))
    }

    #[tokio::test]
    async fn a_wrong_result_is_outvoted_and_the_majority_stands() -> Res {
        let store = InMemory::new();
        let job = primary_job();
        // The shard's result is wrong; both check runs agree with each other.
        let primary = put(&store, keys::shard_output(&job, 0), "bad-1", 0.9).await?;
        let first = put(&store, keys::shard_check(&job, 0, 1), "good-1", 0.3).await?;
        let r1 = judge(&store, &case(1, first.clone(), primary.clone(), None)).await?;
        assert!(
            matches!(&r1, Ruling::Disagreed(why) if why.contains("record 0")),
            "{r1:?}"
        );
        // A tie-break that is not byte-equal but within tolerance.
        let second = put(&store, keys::shard_check(&job, 0, 2), "good-2", 0.300_000_1).await?;
        let r2 = judge(
            &store,
            &case(2, second, primary.clone(), Some(first.clone())),
        )
        .await?;
        match r2 {
            Ruling::Decided {
                outvoted, stands, ..
            } => {
                assert_eq!(outvoted.as_str(), "bad-1");
                assert_eq!(stands, Some(first));
            }
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_wrong_check_run_is_outvoted() -> Res {
        let store = InMemory::new();
        let job = primary_job();
        let primary = put(&store, keys::shard_output(&job, 0), "good-1", 0.3).await?;
        let first = put(&store, keys::shard_check(&job, 0, 1), "bad-1", 0.9).await?;
        let second = put(&store, keys::shard_check(&job, 0, 2), "good-2", 0.3).await?;
        let r = judge(&store, &case(2, second, primary, Some(first))).await?;
        assert!(
            matches!(&r, Ruling::Decided { outvoted, stands: None, .. } if outvoted.as_str() == "bad-1"),
            "{r:?}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn agreement_and_unbacked_checks() -> Res {
        let store = InMemory::new();
        let job = primary_job();
        let primary = put(&store, keys::shard_output(&job, 0), "a-1", 0.3).await?;
        let near = put(&store, keys::shard_check(&job, 0, 1), "b-1", 0.300_000_1).await?;
        let r = judge(&store, &case(1, near, primary.clone(), None)).await?;
        assert!(
            matches!(&r, Ruling::Agreed(why) if why.contains("cosine")),
            "{r:?}"
        );
        // A tie-break after the shard's result was replaced by one the
        // first check run agrees with: no one is outvoted.
        let again = put(&store, keys::shard_check(&job, 0, 2), "d-1", 0.3).await?;
        let first = RunResult {
            worker: WorkerId::new("e-1")?,
            sha256: primary.sha256.clone(),
        };
        let r = judge(&store, &case(2, again, primary.clone(), Some(first))).await?;
        assert!(matches!(&r, Ruling::Agreed(_)), "{r:?}");
        // A check event whose output is not there decides nothing.
        let forged = RunResult {
            worker: WorkerId::new("c-1")?,
            sha256: "00".repeat(32),
        };
        let r = judge(&store, &case(1, forged, primary, None)).await?;
        assert!(matches!(r, Ruling::Undecided(_)), "{r:?}");
        Ok(())
    }
}
