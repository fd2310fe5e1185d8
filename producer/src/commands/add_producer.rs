//! `minions admin add-producer NAME --team T`: gives a team's program (or a
//! person) its own NATS identity, bound to its teams and a highest
//! priority, in a server config shaped like
//! `deploy/nats/least-privilege.conf`.
//!
//! The entry grants what the shared `producer` role does, except that it
//! may make no job consumer and may claim jobs (`minions.submit.<team>.<priority>.<name>`)
//! only for its own teams, priorities up to its highest, and its own name;
//! it cancels and retries only through a watchdog, for its own teams
//! (`minions.jobreq.<team>.<name>`).
//! A watchdog admits a claimed job and makes its consumer, taking team,
//! priority and submitter from the subject the server allowed: the server,
//! not our client, decides what an identity may submit for. The seed file's
//! name is the identity's name (`NAME.nk`): `minions --nats-nkey NAME.nk`
//! submits as NAME. With `--s3-bucket` it also writes the identity's store
//! policy ([`super::team_policy`]): its teams' jobs only.

use std::fmt::Write as _;
use std::path::PathBuf;

use minions_endpoints::host;
use minions_schemas::messages::Priority;
use minions_schemas::subjects;

use super::identity_file::{IdentityError, file_name, new_seed, read_with_entry, replace};
use crate::cli::AddProducerArgs;

/// What the shared `producer` role may publish that a team's identity may
/// too: everything but making job consumers (a watchdog does, on
/// admission), claims and job requests for any team, cancelling jobs
/// itself (purging the queue, telling workers; a watchdog does, for its
/// own teams' jobs) and actions on record as `producer` (its own go under
/// its own name).
const PUBLISH: &[&str] = &[
    "minions.work.>",
    "minions.events.*.*.cli",
    "minions.queued",
    "$JS.API.INFO",
    "$JS.API.STREAM.INFO.>",
    "$JS.API.STREAM.MSG.GET.MINIONS_WORK",
    "$JS.API.DIRECT.GET.MINIONS_WORK.>",
    "$JS.API.STREAM.MSG.GET.MINIONS_DEAD",
    "$JS.API.DIRECT.GET.MINIONS_DEAD.>",
    "$JS.API.DIRECT.GET.KV_MINIONS_WORKERS.>",
    "$JS.API.CONSUMER.CREATE.MINIONS_EVENTS",
    "$JS.API.CONSUMER.CREATE.MINIONS_EVENTS.>",
    "$JS.API.CONSUMER.MSG.NEXT.MINIONS_EVENTS.>",
    "$JS.API.CONSUMER.DELETE.MINIONS_EVENTS.>",
    "$JS.API.CONSUMER.CREATE.MINIONS_DEAD",
    "$JS.API.CONSUMER.CREATE.MINIONS_DEAD.>",
    "$JS.API.CONSUMER.MSG.NEXT.MINIONS_DEAD.>",
    "$JS.API.CONSUMER.DELETE.MINIONS_DEAD.>",
    "$JS.API.CONSUMER.CREATE.KV_MINIONS_WORKERS",
    "$JS.API.CONSUMER.CREATE.KV_MINIONS_WORKERS.>",
    "$JS.API.CONSUMER.MSG.NEXT.KV_MINIONS_WORKERS.>",
    "$JS.API.CONSUMER.DELETE.KV_MINIONS_WORKERS.>",
    "$JS.API.CONSUMER.CREATE.MINIONS_HEARTBEATS",
    "$JS.API.CONSUMER.CREATE.MINIONS_HEARTBEATS.>",
    "$JS.API.CONSUMER.MSG.NEXT.MINIONS_HEARTBEATS.>",
    "$JS.API.CONSUMER.DELETE.MINIONS_HEARTBEATS.>",
    "$JS.API.CONSUMER.INFO.MINIONS_WORK.*",
    "$JS.API.CONSUMER.LIST.MINIONS_WORK",
    "$JS.API.CONSUMER.DELETE.MINIONS_WORK.*",
    "$JS.API.STREAM.MSG.GET.KV_MINIONS_TEAMS",
    "$JS.API.DIRECT.GET.KV_MINIONS_TEAMS.>",
    "$JS.API.DIRECT.GET.KV_MINIONS_QUARANTINE.>",
    "$JS.API.CONSUMER.CREATE.KV_MINIONS_QUARANTINE",
    "$JS.API.CONSUMER.CREATE.KV_MINIONS_QUARANTINE.>",
    "$JS.API.CONSUMER.DELETE.KV_MINIONS_QUARANTINE.>",
    "$JS.API.CONSUMER.CREATE.MINIONS_ACTIONS",
    "$JS.API.CONSUMER.CREATE.MINIONS_ACTIONS.>",
    "$JS.API.CONSUMER.MSG.NEXT.MINIONS_ACTIONS.>",
    "$JS.API.CONSUMER.DELETE.MINIONS_ACTIONS.>",
];

/// What was added.
#[derive(Debug)]
pub struct Added {
    /// The identity's public key (`U…`).
    pub public_key: String,
    /// Where the seed was written.
    pub seed_file: PathBuf,
    /// A report for the operator.
    pub report: String,
}

/// The priorities up to and including `max`.
fn priorities_up_to(max: Priority) -> Vec<Priority> {
    [Priority::Low, Priority::Normal, Priority::High]
        .into_iter()
        .filter(|p| *p <= max)
        .collect()
}

/// The config entry of producer `name` (public key `public_key`) for
/// `teams` up to priority `max`.
pub fn entry(name: &str, public_key: &str, teams: &[String], max: Priority) -> String {
    let mut claims = Vec::new();
    for team in teams {
        for p in priorities_up_to(max) {
            claims.push(format!("\"{}\"", subjects::submit(team, p, name)));
        }
    }
    // Cancel and retry of its teams' jobs, through a watchdog.
    for team in teams {
        claims.push(format!("\"{}\"", subjects::job_request(team, name)));
    }
    // Its actions go on record under its own name only.
    claims.push(format!("\"{}\"", subjects::action(name)));
    let rest: Vec<String> = PUBLISH.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "      # producer {name} (minions admin add-producer: teams {teams}; priority up to {max})\n      \
         {{ nkey: {public_key}, permissions: {{\n          \
         publish: {{ allow: [ {claims},\n            {rest} ] }}\n          \
         subscribe: {{ allow: [ \"_INBOX.>\" ] }} }} }}\n",
        teams = teams.join(", "),
        claims = claims.join(", "),
        rest = rest.join(", "),
    )
}

/// Adds producer `args.name` to `args.server_config` and writes its seed.
pub fn add_producer(args: &AddProducerArgs) -> Result<Added, IdentityError> {
    let name = args.name.clone();
    let fixed = host::id_prefix(&name, "producer");
    if fixed != name || subjects::submitter_token(&name) != name {
        return Err(IdentityError::BadName(
            name,
            "a producer",
            format!(" (for example {fixed})"),
        ));
    }
    if args.team.is_empty() {
        return Err(IdentityError::Flag(
            "give the identity at least one --team".into(),
        ));
    }
    for team in &args.team {
        minions_schemas::ids::validate("team", team)
            .map_err(|e| IdentityError::Flag(format!("--team {team:?}: {e}")))?;
    }
    let max: Priority = args.max_priority.into();
    // The store policy is made first: a refused team leaves nothing behind.
    let policy = match &args.s3_bucket {
        None => None,
        Some(bucket) => {
            let text = super::team_policy::render(super::team_policy::TEMPLATE, bucket, &args.team)
                .map_err(|e| IdentityError::Flag(e.to_string()))?;
            let path = args
                .s3_policy_out
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{name}-s3-policy.json")));
            if path.exists() {
                return Err(IdentityError::Flag(format!(
                    "--s3-policy-out {} exists; choose another or remove it first",
                    path.display()
                )));
            }
            Some((path, text))
        }
    };
    let conf = &args.server_config;
    let seed_file = args
        .seed_out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{name}.nk")));
    if seed_file.file_stem().and_then(|s| s.to_str()) != Some(name.as_str()) {
        return Err(IdentityError::Flag(format!(
            "--seed-out {}: the seed file's name is the identity's (its stem must be {name}, as in {name}.nk)",
            seed_file.display()
        )));
    }
    let label = format!("producer {name}");
    read_with_entry(conf, &label, String::new)?;
    let public_key = new_seed(&seed_file)?;
    let (updated, _) =
        read_with_entry(conf, &label, || entry(&name, &public_key, &args.team, max))?;
    replace(conf, &updated)?;
    let mut report = String::new();
    if let Some((path, text)) = &policy {
        std::fs::write(path, format!("{text}\n")).map_err(super::identity_file::io(path))?;
        let _ = writeln!(
            report,
            "S3 policy written to {}: attach it to {name}'s S3 identity (its teams' jobs are jobs/<team>--*, the ids `minions submit` makes)",
            path.display()
        );
    }
    let _ = writeln!(
        report,
        "producer {name}: identity {public_key} added to {}, for team(s) {} at priority up to {max}",
        conf.display(),
        args.team.join(", ")
    );
    let _ = writeln!(
        report,
        "seed written to {} (secret: give it to {name} only; its file name is the identity's name)",
        seed_file.display()
    );
    let _ = writeln!(
        report,
        "next: reload the server (`nats-server --signal reload`); {name} then submits with"
    );
    let _ = write!(
        report,
        "  minions --nats-nkey {} --nats-ca CA.pem --nats tls://SERVER:4222 submit --team {} ...",
        file_name(&seed_file),
        args.team[0]
    );
    Ok(Added {
        public_key,
        seed_file,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn args(dir: &Path, name: &str, teams: &[&str], max: Priority) -> AddProducerArgs {
        AddProducerArgs {
            name: name.into(),
            team: teams.iter().map(|t| (*t).to_owned()).collect(),
            max_priority: max.into(),
            server_config: dir.join("server.conf"),
            seed_out: Some(dir.join(format!("{name}.nk"))),
            s3_bucket: None,
            s3_policy_out: None,
        }
    }

    fn shipped() -> Result<String, std::io::Error> {
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nats/least-privilege.conf"),
        )
    }

    #[test]
    fn the_entry_claims_only_its_teams_and_priorities() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("server.conf"), shipped()?)?;
        let a = add_producer(&args(
            dir.path(),
            "ana",
            &["alpha", "gamma"],
            Priority::Normal,
        ))?;
        let conf = std::fs::read_to_string(dir.path().join("server.conf"))?;
        for ok in [
            "minions.submit.alpha.low.ana",
            "minions.submit.alpha.normal.ana",
            "minions.submit.gamma.normal.ana",
        ] {
            assert!(conf.contains(&format!("\"{ok}\"")), "{ok}");
        }
        assert!(!conf.contains("minions.submit.alpha.high.ana"));
        assert!(conf.contains("\"minions.jobreq.gamma.ana\""));
        assert!(conf.contains("\"minions.actions.ana\""));
        assert!(conf.contains(&format!("nkey: {}", a.public_key)));
        let seed = std::fs::read_to_string(&a.seed_file)?;
        assert_eq!(
            nkeys::KeyPair::from_seed(seed.trim())?.public_key(),
            a.public_key
        );
        // Twice: refused.
        std::fs::remove_file(&a.seed_file)?;
        assert!(matches!(
            add_producer(&args(dir.path(), "ana", &["alpha"], Priority::Normal)),
            Err(IdentityError::Exists(..))
        ));
        for bad in ["a.b", "*", "", "x y"] {
            assert!(matches!(
                add_producer(&args(dir.path(), bad, &["alpha"], Priority::Low)),
                Err(IdentityError::BadName(..))
            ));
        }
        assert!(matches!(
            add_producer(&args(dir.path(), "bo", &[], Priority::Low)),
            Err(IdentityError::Flag(_))
        ));
        assert!(matches!(
            add_producer(&args(dir.path(), "bo", &["a.b"], Priority::Low)),
            Err(IdentityError::Flag(_))
        ));
        Ok(())
    }

    /// What a team's identity may publish is what the shipped producer
    /// role may, less making job consumers and claims for any team.
    #[test]
    fn its_grants_are_the_producer_roles_less_consumers() -> Result<(), Box<dyn std::error::Error>>
    {
        let conf = shipped()?;
        let role_at = conf.find("{ user: producer").ok_or("no producer role")?;
        let role = &conf[role_at..];
        let role = &role[..role.find("subscribe:").ok_or("no subscribe")?];
        let granted: Vec<&str> = role
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|s| !s.starts_with("$MINIONS"))
            .collect();
        let withheld = [
            "minions.submit.>",
            "minions.jobreq.>",
            "minions.cancel.>",
            "$JS.API.STREAM.PURGE.MINIONS_WORK",
            "minions.actions.producer",
            "$JS.API.CONSUMER.CREATE.MINIONS_WORK.*.minions.work.*.>",
        ];
        let mut expected: Vec<&str> = granted
            .iter()
            .copied()
            .filter(|s| !withheld.contains(s))
            .collect();
        let mut ours = PUBLISH.to_vec();
        expected.sort_unstable();
        ours.sort_unstable();
        assert_eq!(ours, expected);
        Ok(())
    }
}
