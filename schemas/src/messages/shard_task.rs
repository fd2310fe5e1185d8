use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash};
use crate::messages::{ModelFamily, Precision};

/// One shard to run: the payload of a work-stream message.
///
/// It carries ids only; the worker builds the input and output keys from them
/// ([`crate::keys`]), never from strings in the message. Limit:
/// [`crate::limits::MAX_TASK_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardTask {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The shard number, `0..shards`.
    pub shard: u32,
    /// The job's shard count.
    pub shards: u32,
    /// Records in this shard.
    pub rows: u32,
    /// Index of this shard's first record in the job's input order.
    pub first_row: u64,
    /// The model to run.
    pub model_hash: ModelHash,
    /// The model's family.
    pub family: ModelFamily,
    /// Most records per forward pass (0 = the worker's default).
    pub max_batch: u32,
    /// The number format the model runs in (absent in older tasks: f32).
    #[serde(default)]
    pub precision: Precision,
    /// 0: the shard's run (its output is the job's). n ≥ 1: the n-th check
    /// run, queued by a watchdog to compare with the first: its output goes
    /// to [`crate::keys::shard_check`] and it ends with a `checked` event,
    /// not `done` (absent in older tasks: 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub check: u8,
    /// Machines (as [`crate::subjects::machine`] names them) that must not
    /// run this task: those whose runs of the shard it checks. A worker on
    /// one of them hands it back untouched (absent in older tasks: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<String>,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

impl ShardTask {
    /// Where this run's output goes: the shard's output, or a check run's.
    pub fn output_key(&self) -> String {
        if self.check == 0 {
            crate::keys::shard_output(&self.job, self.shard)
        } else {
            crate::keys::shard_check(&self.job, self.shard, self.check)
        }
    }

    /// Where this run checkpoints a long shard: a check run never resumes
    /// from the shard's own run, nor that from a check's.
    pub fn checkpoint_key(&self) -> String {
        if self.check == 0 {
            crate::keys::shard_checkpoint(&self.job, self.shard)
        } else {
            crate::keys::shard_check_checkpoint(&self.job, self.shard, self.check)
        }
    }

    /// Whether the machine `machine` may run it (see [`ShardTask::avoid`]).
    pub fn may_run_on(&self, machine: &str) -> bool {
        !self.avoid.iter().any(|m| m == machine)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_check_run_writes_beside_the_output_and_avoids_its_machines()
    -> Result<(), Box<dyn std::error::Error>> {
        let spec = crate::messages::test_spec()?;
        let own = spec.task(2);
        assert_eq!(own.output_key(), "jobs/j/outputs/00000002.msgpack");
        assert_eq!(own.checkpoint_key(), "jobs/j/checkpoints/00000002.msgpack");
        assert!(own.may_run_on("w1"));
        let mut check = own.clone();
        check.check = 2;
        check.avoid = vec!["w1".into(), "w3".into()];
        assert_eq!(check.output_key(), "jobs/j/checks/00000002/2.msgpack");
        assert_eq!(
            check.checkpoint_key(),
            "jobs/j/checks/00000002/2.checkpoint.msgpack"
        );
        assert!(!check.may_run_on("w1") && !check.may_run_on("w3") && check.may_run_on("w2"));
        // The shard's own task encodes as before: no `check`, no `avoid`.
        let bytes = crate::encode("shard task", &own)?;
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("check") && !text.contains("avoid"));
        let back: super::ShardTask = crate::decode("shard task", &bytes, 1 << 16)?;
        assert_eq!(back, own);
        let back: super::ShardTask =
            crate::decode("shard task", &crate::encode("shard task", &check)?, 1 << 16)?;
        assert_eq!(back, check);
        Ok(())
    }
}
