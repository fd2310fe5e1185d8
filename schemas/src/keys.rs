//! The object-store key layout.
//!
//! ```text
//! jobs/<job>/spec.msgpack                 job spec (written once by submit)
//! jobs/<job>/manifest.msgpack             job manifest (written create-only when every shard is settled)
//! jobs/<job>/manifest.<n>.msgpack         its revision n ≥ 2 (create-only: a retry, verdict or quarantine changed it)
//! jobs/<job>/cancelled                    present once the job is cancelled
//! jobs/<job>/inputs/<shard:08>.msgpack    shard input
//! jobs/<job>/outputs/<shard:08>.msgpack   shard output (create-only)
//! jobs/<job>/checkpoints/<shard:08>.msgpack  records a long shard has finished so far
//! models/blobs/<hash>/manifest.msgpack    model manifest (its SHA-256 is <hash>)
//! models/blobs/<hash>/files/<name>        model files
//! models/names/<name>.msgpack             name -> hash record (mutable)
//! watchdog/checkpoints/<seq:020>.msgpack   a watchdog's folded events up to stream sequence <seq>
//! ```
//! Keys are built only from validated ids and checked file names.
//!
//! A job id made by `minions submit` begins with its team and `--`
//! ([`team_job_prefix`]), so `jobs/<team>--*` holds one team's jobs and a
//! store policy can grant a team's identity its own jobs only
//! (`deploy/s3/team-producer-policy.json`).

use crate::ids::{JobId, MAX_ID_LEN, ModelHash, ModelName};

/// What follows a team's name at the head of its job ids.
pub const TEAM_JOB_SEPARATOR: &str = "--";

/// Characters a made job id keeps after its team's prefix (a ULID).
const MADE_ID_TAIL: usize = 26;

/// The longest team name that heads its job ids.
pub const MAX_PREFIXED_TEAM_LEN: usize = MAX_ID_LEN - TEAM_JOB_SEPARATOR.len() - MADE_ID_TAIL;

/// The head of team `team`'s job ids (`<team>--`), or why it cannot have
/// one: a prefix must name one team only, so the name may not hold `--`
/// or end in `-` (`a-` would claim `a---x`, which `a--*` also matches), and
/// must leave room for the rest of an id.
pub fn team_job_prefix(team: &str) -> Result<String, String> {
    crate::ids::validate("team", team).map_err(|e| e.to_string())?;
    if team.contains(TEAM_JOB_SEPARATOR) || team.ends_with('-') {
        return Err(format!(
            "team {team:?} cannot head job ids: a team's name may not hold \"--\" or end in \"-\" (its jobs are jobs/<team>--*)"
        ));
    }
    if team.len() > MAX_PREFIXED_TEAM_LEN {
        return Err(format!(
            "team {team:?} is {} characters long; a team that heads job ids has at most {MAX_PREFIXED_TEAM_LEN}",
            team.len()
        ));
    }
    Ok(format!("{team}{TEAM_JOB_SEPARATOR}"))
}

/// A new job id for `team` ending in `tail` (a lowercase ULID): the team's
/// prefix and `tail`, or `job-<tail>` when the team cannot head ids.
pub fn made_job_id(team: &str, tail: &str) -> Result<JobId, crate::ids::IdError> {
    match team_job_prefix(team) {
        Ok(prefix) => JobId::new(format!("{prefix}{tail}")),
        Err(_) => JobId::new(format!("job-{tail}")),
    }
}

/// The job spec's key.
pub fn job_spec(job: &JobId) -> String {
    format!("jobs/{job}/spec.msgpack")
}

/// The job manifest's key.
pub fn job_manifest(job: &JobId) -> String {
    format!("jobs/{job}/manifest.msgpack")
}

/// The key of revision `n` of the job's manifest: the first is
/// [`job_manifest`], later ones (n ≥ 2) sit beside it.
pub fn job_manifest_revision(job: &JobId, n: u32) -> String {
    if n <= 1 {
        job_manifest(job)
    } else {
        format!("jobs/{job}/manifest.{n}.msgpack")
    }
}

/// The job's cancellation marker.
pub fn job_cancelled(job: &JobId) -> String {
    format!("jobs/{job}/cancelled")
}

/// The folder of a job's shard inputs.
pub fn job_inputs(job: &JobId) -> String {
    format!("jobs/{job}/inputs")
}

/// A shard input's key.
pub fn shard_input(job: &JobId, shard: u32) -> String {
    format!("jobs/{job}/inputs/{shard:08}.msgpack")
}

/// A shard output's key. Written with create-only semantics: if it exists, an
/// earlier delivery of the same shard finished it.
pub fn shard_output(job: &JobId, shard: u32) -> String {
    format!("jobs/{job}/outputs/{shard:08}.msgpack")
}

/// A shard's checkpoint: the records a delivery of a long (generation)
/// shard has finished so far, overwritten as it goes, so that a redelivery
/// resumes instead of starting over.
pub fn shard_checkpoint(job: &JobId, shard: u32) -> String {
    format!("jobs/{job}/checkpoints/{shard:08}.msgpack")
}

/// The output of check run `round` (≥ 1) of a shard: another worker's run
/// of it, compared with the shard's output by a watchdog.
pub fn shard_check(job: &JobId, shard: u32, round: u8) -> String {
    format!("jobs/{job}/checks/{shard:08}/{round}.msgpack")
}

/// The checkpoint of check run `round` of a long shard (see
/// [`shard_checkpoint`]).
pub fn shard_check_checkpoint(job: &JobId, shard: u32, round: u8) -> String {
    format!("jobs/{job}/checks/{shard:08}/{round}.checkpoint.msgpack")
}

/// The folder of a job's outputs.
pub fn job_outputs(job: &JobId) -> String {
    format!("jobs/{job}/outputs")
}

/// A model manifest's key.
pub fn model_manifest(hash: &ModelHash) -> String {
    format!("models/blobs/{hash}/manifest.msgpack")
}

/// A model file's key; `file` must pass [`valid_model_file_name`].
pub fn model_file(hash: &ModelHash, file: &str) -> String {
    format!("models/blobs/{hash}/files/{file}")
}

/// A model name record's key.
pub fn model_name(name: &ModelName) -> String {
    format!("models/names/{name}.msgpack")
}

/// The folder of model name records.
pub const MODEL_NAMES: &str = "models/names";

/// The folder of the watchdogs' checkpoints of their folded event state.
pub const WATCHDOG_CHECKPOINTS: &str = "watchdog/checkpoints";

/// The key of a watchdog checkpoint that covers the events stream up to
/// sequence `seq` (zero-padded, so that names sort as sequences do).
pub fn watchdog_checkpoint(seq: u64) -> String {
    format!("{WATCHDOG_CHECKPOINTS}/{seq:020}.msgpack")
}

/// The sequence a watchdog checkpoint key names, if it is one.
pub fn watchdog_checkpoint_seq(key: &str) -> Option<u64> {
    let name = key.strip_prefix(WATCHDOG_CHECKPOINTS)?.strip_prefix('/')?;
    let digits = name.strip_suffix(".msgpack")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `name` may be a model file name: one path segment of letters,
/// digits, `.`, `-`, `_`, not starting with `.`, at most 128 bytes.
pub fn valid_model_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_job_id_begins_with_its_team_only_when_that_is_unambiguous()
    -> Result<(), Box<dyn std::error::Error>> {
        let tail = "01jxyzabcdefghjkmnpqrstvwx";
        assert_eq!(
            made_job_id("alpha", tail)?.as_str(),
            format!("alpha--{tail}")
        );
        assert_eq!(
            made_job_id("ml-ops", tail)?.as_str(),
            format!("ml-ops--{tail}")
        );
        for bad in ["a--b", "a-", "x".repeat(MAX_PREFIXED_TEAM_LEN + 1).as_str()] {
            assert!(team_job_prefix(bad).is_err(), "{bad}");
            assert_eq!(made_job_id(bad, tail)?.as_str(), format!("job-{tail}"));
        }
        let longest = "x".repeat(MAX_PREFIXED_TEAM_LEN);
        assert_eq!(made_job_id(&longest, tail)?.as_str().len(), MAX_ID_LEN);
        Ok(())
    }

    #[test]
    fn layout() -> Result<(), crate::IdError> {
        let j = JobId::new("j")?;
        assert_eq!(shard_output(&j, 3), "jobs/j/outputs/00000003.msgpack");
        assert_eq!(shard_input(&j, 12), "jobs/j/inputs/00000012.msgpack");
        let k = watchdog_checkpoint(42);
        assert_eq!(k, "watchdog/checkpoints/00000000000000000042.msgpack");
        assert_eq!(watchdog_checkpoint_seq(&k), Some(42));
        assert_eq!(
            watchdog_checkpoint_seq("watchdog/checkpoints/42.msgpack"),
            None
        );
        assert_eq!(watchdog_checkpoint_seq("jobs/j/spec.msgpack"), None);
        Ok(())
    }

    #[test]
    fn file_names() {
        assert!(valid_model_file_name("model.safetensors"));
        assert!(!valid_model_file_name("../x"));
        assert!(!valid_model_file_name(".hidden"));
        assert!(!valid_model_file_name("a/b"));
    }
}
