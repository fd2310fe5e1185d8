//! `minions admin add-worker NAME`: gives one worker machine its own NATS
//! identity in a server config shaped like `deploy/nats/least-privilege.conf`.
//!
//! It makes a fresh nkey pair, writes the seed (the machine's secret) to a
//! file, and inserts an entry with the public key into the config above its
//! marker line. The entry grants exactly what a worker does, with heartbeats,
//! shard events and control messages under the machine's own name, so a
//! stolen seed cannot speak for any other machine. Nothing connects to NATS:
//! the operator reloads the server afterwards.

use std::fmt::Write as _;
use std::path::PathBuf;

use minions_endpoints::host;
use minions_schemas::streams;

use crate::cli::AddWorkerArgs;

pub use super::identity_file::{IdentityError as AddWorkerError, MARKER};
use super::identity_file::{file_name, new_seed, read_with_entry, replace};

/// What was added.
#[derive(Debug)]
pub struct Added {
    /// The machine name (the worker's `--name`).
    pub name: String,
    /// The identity's public key (`U…`).
    pub public_key: String,
    /// Where the seed was written.
    pub seed_file: PathBuf,
    /// A report for the operator.
    pub report: String,
}

/// The config entry of machine `name` with public key `public_key`.
pub fn entry(name: &str, public_key: &str) -> String {
    let w = streams::WORK_STREAM;
    // A key-value bucket is stored in the stream `KV_<bucket>`.
    let registry = format!("KV_{}", streams::WORKERS_BUCKET);
    let teams = format!("KV_{}", streams::TEAMS_BUCKET);
    let quarantine = format!("KV_{}", streams::QUARANTINE_BUCKET);
    let info: Vec<String> = [
        streams::WORK_STREAM,
        streams::EVENTS_STREAM,
        streams::HEARTBEATS_STREAM,
        streams::DEAD_STREAM,
        streams::ACTIONS_STREAM,
        registry.as_str(),
        teams.as_str(),
        quarantine.as_str(),
    ]
    .iter()
    .map(|s| format!("\"$JS.API.STREAM.INFO.{s}\""))
    .collect();
    format!(
        "      # worker machine {name} (minions admin add-worker)\n      \
         {{ nkey: {public_key}, permissions: {{\n          \
         publish: {{ allow: [ {info},\n            \
         \"$JS.API.CONSUMER.LIST.{w}\", \"$JS.API.CONSUMER.INFO.{w}.*\", \"$JS.API.CONSUMER.MSG.NEXT.{w}.*\",\n            \
         \"$JS.API.DIRECT.GET.{teams}.>\", \"$JS.API.STREAM.MSG.GET.{teams}\",\n            \
         \"$JS.API.DIRECT.GET.{quarantine}.$KV.{q}.{name}\",\n            \
         \"$JS.ACK.{w}.*.>\", \"minions.hb.{name}.>\", \"minions.events.*.*.{name}\",\n            \
         \"minions.canary.{name}\", \"minions.stage.*.*.in\", \"minions.stage.*.*.back\" ] }}\n          \
         subscribe: {{ allow: [ \"_INBOX.>\", \"minions.ctl.{name}.>\", \"minions.cancel.>\", \"minions.sched\",\n            \"minions.queued\", \"minions.group.{name}.>\", \"minions.stage.{name}.>\" ] }}\n          \
         allow_responses: true }} }}\n",
        info = info.join(", "),
        q = streams::QUARANTINE_BUCKET,
    )
}

/// Adds machine `args.name` to `args.server_config` and writes its seed.
/// The config is rewritten through a temporary file and a rename, so it is
/// never left half-written; the seed is written first, readable by its owner
/// only, and never overwrites a file.
pub fn add_worker(args: &AddWorkerArgs) -> Result<Added, AddWorkerError> {
    let name = args.name.clone();
    let fixed = host::id_prefix(&name, "worker");
    if fixed != name || minions_schemas::WorkerId::new(format!("{name}-x")).is_err() {
        return Err(AddWorkerError::BadName(
            name,
            "a worker machine",
            format!(" (the worker is then run with `--name {fixed}`)"),
        ));
    }
    let conf = &args.server_config;
    let seed_file = args
        .seed_out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{name}.nk")));
    let label = format!("worker machine {name}");
    // Refusals first: nothing is written for a config that would not take it.
    read_with_entry(conf, &label, String::new)?;
    let public_key = new_seed(&seed_file)?;
    let (updated, _) = read_with_entry(conf, &label, || entry(&name, &public_key))?;
    replace(conf, &updated)?;
    let mut report = String::new();
    let _ = writeln!(
        report,
        "worker machine {name}: identity {public_key} added to {}",
        conf.display()
    );
    let _ = writeln!(
        report,
        "seed written to {} (secret: copy it to {name} only, then delete it here)",
        seed_file.display()
    );
    let _ = writeln!(
        report,
        "next: reload the server (`nats-server --signal reload`), then on {name} run"
    );
    let _ = write!(
        report,
        "  minions-worker --name {name} --nats-nkey {} --nats-ca CA.pem --nats tls://SERVER:4222",
        file_name(&seed_file)
    );
    Ok(Added {
        name,
        public_key,
        seed_file,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn args(dir: &Path, name: &str) -> AddWorkerArgs {
        AddWorkerArgs {
            name: name.into(),
            server_config: dir.join("server.conf"),
            seed_out: Some(dir.join(format!("{name}.nk"))),
        }
    }

    #[test]
    fn adds_an_entry_above_the_marker_and_writes_the_seed() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nats/least-privilege.conf"),
        )?;
        std::fs::write(dir.path().join("server.conf"), &shipped)?;
        let a = add_worker(&args(dir.path(), "mac-01"))?;
        let conf = std::fs::read_to_string(dir.path().join("server.conf"))?;
        let entry_at = conf.find("# worker machine mac-01").ok_or("no entry")?;
        assert!(entry_at < conf.find(MARKER).ok_or("marker gone")?);
        assert!(conf.contains(&format!("nkey: {}", a.public_key)));
        assert!(conf.contains("\"minions.hb.mac-01.>\""));
        assert_eq!(
            conf.len(),
            shipped.len() + entry("mac-01", &a.public_key).len()
        );
        let seed = std::fs::read_to_string(&a.seed_file)?;
        let pair = nkeys::KeyPair::from_seed(seed.trim())?;
        assert_eq!(pair.public_key(), a.public_key);
        // Twice: refused, and nothing changes.
        std::fs::remove_file(&a.seed_file)?;
        assert!(matches!(
            add_worker(&args(dir.path(), "mac-01")),
            Err(AddWorkerError::Exists(..))
        ));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("server.conf"))?,
            conf
        );
        assert!(!a.seed_file.exists());
        // A second machine goes in beside it.
        add_worker(&args(dir.path(), "mac-02"))?;
        // A seed file is never overwritten.
        assert!(matches!(
            add_worker(&args(dir.path(), "mac-02")),
            Err(AddWorkerError::Exists(..))
        ));
        std::fs::write(dir.path().join("mac-03.nk"), "keep")?;
        assert!(matches!(
            add_worker(&args(dir.path(), "mac-03")),
            Err(AddWorkerError::SeedExists(_))
        ));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("mac-03.nk"))?,
            "keep"
        );
        Ok(())
    }

    #[test]
    fn names_must_be_machine_tokens() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("server.conf"), MARKER)?;
        for bad in ["mac.01", "a>b", "*", "", "-x", "Ann's Mac", "w_1"] {
            let e = add_worker(&args(dir.path(), bad));
            assert!(
                matches!(e, Err(AddWorkerError::BadName(..))),
                "{bad}: {e:?}"
            );
        }
        std::fs::write(dir.path().join("server.conf"), "no marker")?;
        assert!(matches!(
            add_worker(&args(dir.path(), "ok")),
            Err(AddWorkerError::NoMarker(_))
        ));
        Ok(())
    }
}
