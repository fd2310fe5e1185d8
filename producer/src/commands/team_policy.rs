//! A team identity's store policy: `deploy/s3/team-producer-policy.json`
//! with `BUCKET` made the bucket (and prefix) and each entry naming `TEAM`
//! repeated once per team. It grants the team's jobs (`jobs/<team>--*`,
//! the ids `minions submit` makes) and reading models; nothing of other
//! teams' jobs, and no model pushes (a model name is shared by every team).

use serde_json::Value;

/// The shipped template.
pub const TEMPLATE: &str = include_str!("../../../deploy/s3/team-producer-policy.json");

/// Why a policy could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A team whose name cannot head job ids.
    #[error("--team {0}")]
    Team(String),
    /// A bucket that cannot be one.
    #[error(
        "--s3-bucket {0:?}: give the bucket's name, with the store's prefix after a '/' if it has one (as in s3://BUCKET/PREFIX)"
    )]
    Bucket(String),
    /// The template is not JSON (a defect in the build).
    #[error("the policy template: {0}")]
    Template(#[from] serde_json::Error),
}

/// `template` for `teams` in `bucket` (`BUCKET` or `BUCKET/PREFIX`), as
/// pretty JSON.
pub fn render(template: &str, bucket: &str, teams: &[String]) -> Result<String, PolicyError> {
    let bucket = bucket.trim_matches('/');
    if bucket.is_empty()
        || bucket
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || "-._/".contains(c)))
    {
        return Err(PolicyError::Bucket(bucket.to_owned()));
    }
    for team in teams {
        minions_schemas::keys::team_job_prefix(team).map_err(PolicyError::Team)?;
    }
    let mut policy: Value = serde_json::from_str(template)?;
    expand(&mut policy, bucket, teams);
    Ok(serde_json::to_string_pretty(&policy)?)
}

/// Replaces `BUCKET` in every string, and repeats each list entry that
/// names `TEAM` once per team.
fn expand(v: &mut Value, bucket: &str, teams: &[String]) {
    match v {
        Value::String(s) => *s = s.replace("BUCKET", bucket),
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items.drain(..) {
                match &item {
                    Value::String(s) if s.contains("TEAM") => {
                        for team in teams {
                            out.push(Value::String(
                                s.replace("TEAM", team).replace("BUCKET", bucket),
                            ));
                        }
                    }
                    _ => {
                        let mut item = item;
                        expand(&mut item, bucket, teams);
                        out.push(item);
                    }
                }
            }
            *items = out;
        }
        Value::Object(map) => {
            for value in map.values_mut() {
                expand(value, bucket, teams);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_team_gets_its_own_jobs_and_the_bucket_is_named()
    -> Result<(), Box<dyn std::error::Error>> {
        let teams = ["alpha".to_owned(), "gamma".to_owned()];
        let text = render(TEMPLATE, "fleet-data/minions", &teams)?;
        assert!(!text.contains("TEAM") && !text.contains("BUCKET"), "{text}");
        for want in [
            "arn:aws:s3:::fleet-data/minions/jobs/alpha--*/inputs/*",
            "arn:aws:s3:::fleet-data/minions/jobs/gamma--*/spec.msgpack",
            "arn:aws:s3:::fleet-data/minions/models/*",
            "jobs/gamma--*",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
        let v: Value = serde_json::from_str(&text)?;
        assert_eq!(
            v["Statement"][0]["Resource"].as_array().map(Vec::len),
            Some(6)
        );
        assert!(matches!(
            render(TEMPLATE, "b", &["a--b".to_owned()]),
            Err(PolicyError::Team(_))
        ));
        assert!(matches!(
            render(TEMPLATE, "b\"x", &teams),
            Err(PolicyError::Bucket(_))
        ));
        Ok(())
    }
}
