//! Every nats-server config shipped under deploy/nats (its folders
//! included) is accepted by the real server (`nats-server -t` checks a
//! config and exits).

use minions_tests::{Result, tool, workspace_root};

#[test]
fn shipped_nats_configs_are_valid() -> Result<()> {
    let bin = tool("NATS_SERVER_BIN", "nats-server")?;
    let dir = workspace_root().join("deploy/nats");
    // What the configs take from the environment: passwords and TLS files.
    let scratch = minions_tests::scratch("minions-conf-")?;
    let (_, cert, key) = minions_tests::write_test_certs(scratch.path())?;
    let env = minions_tests::role_passwords()
        .into_iter()
        .chain([
            ("MINIONS_TLS_CERT".to_owned(), cert.display().to_string()),
            ("MINIONS_TLS_KEY".to_owned(), key.display().to_string()),
            ("MINIONS_SYS_PASSWORD".to_owned(), "sys-secret".to_owned()),
            ("MINIONS_LEAF_PASSWORD".to_owned(), "leaf-secret".to_owned()),
        ])
        .collect::<Vec<_>>();
    let mut checked = 0;
    // deploy/nats and its folders (the cluster's servers, the leaf).
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path)? {
                paths.push(inner?.path());
            }
        } else {
            paths.push(path);
        }
    }
    for path in paths {
        if path.extension().is_none_or(|e| e != "conf") {
            continue;
        }
        let out = std::process::Command::new(&bin)
            .arg("-c")
            .arg(&path)
            .arg("-t")
            .envs(env.clone())
            .output()?;
        assert!(
            out.status.success(),
            "{} is refused: {}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked > 0, "no configs found under {}", dir.display());
    Ok(())
}

/// Whether an IAM-style pattern (`*` any run of characters, `?` one)
/// matches `text`.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `policy` allows `action` on object `key` (for `s3:ListBucket`,
/// `key` is the listed prefix).
fn allows(policy: &serde_json::Value, action: &str, key: &str) -> bool {
    policy["Statement"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|st| {
            st["Effect"] == "Allow"
                && strings(&st["Action"]).iter().any(|a| a == action)
                && if action == "s3:ListBucket" {
                    strings(&st["Resource"])
                        .iter()
                        .any(|r| r == "arn:aws:s3:::BUCKET")
                        && strings(&st["Condition"]["StringLike"]["s3:prefix"])
                            .iter()
                            .any(|p| glob(p, &format!("{key}/")))
                } else {
                    strings(&st["Resource"])
                        .iter()
                        .any(|r| glob(r, &format!("arn:aws:s3:::BUCKET/{key}")))
                }
        })
}

#[test]
fn shipped_s3_policies_allow_each_role_what_it_needs_and_no_more() -> Result<()> {
    use minions_schemas::{JobId, ModelHash, ModelName, keys};
    let load = |name: &str| -> Result<serde_json::Value> {
        let path = workspace_root().join("deploy/s3").join(name);
        Ok(serde_json::from_str(&std::fs::read_to_string(&path)?)?)
    };
    let (worker, watchdog, producer) = (
        load("worker-policy.json")?,
        load("watchdog-policy.json")?,
        load("producer-policy.json")?,
    );
    let job = JobId::new("j1")?;
    let hash = ModelHash::new("ab".repeat(32))?;
    let name = ModelName::new("minilm")?;
    let (get, put, list) = ("s3:GetObject", "s3:PutObject", "s3:ListBucket");
    let spec = keys::job_spec(&job);
    let input = keys::shard_input(&job, 3);
    let output = keys::shard_output(&job, 3);
    let manifest = keys::job_manifest(&job);
    let revision = keys::job_manifest_revision(&job, 2);
    let cancelled = keys::job_cancelled(&job);
    let model_manifest = keys::model_manifest(&hash);
    let model_file = keys::model_file(&hash, "model.safetensors");
    let model_name = keys::model_name(&name);
    let outputs = keys::job_outputs(&job);
    let checkpoint = keys::shard_checkpoint(&job, 3);
    let check = keys::shard_check(&job, 3, 1);
    let check_checkpoint = keys::shard_check_checkpoint(&job, 3, 1);
    let folded = keys::watchdog_checkpoint(42);
    // (policy, action, key, allowed?)
    let cases: Vec<(&str, &serde_json::Value, &str, &str, bool)> = vec![
        ("worker", &worker, get, &spec, true),
        ("worker", &worker, get, &input, true),
        ("worker", &worker, get, &output, true),
        ("worker", &worker, get, &model_manifest, true),
        ("worker", &worker, get, &model_file, true),
        ("worker", &worker, put, &output, true),
        ("worker", &worker, get, &checkpoint, true),
        ("worker", &worker, put, &checkpoint, true),
        ("worker", &worker, "s3:DeleteObject", &checkpoint, true),
        ("worker", &worker, "s3:DeleteObject", &output, false),
        ("worker", &worker, list, keys::MODEL_NAMES, true),
        ("worker", &worker, put, &spec, false),
        ("worker", &worker, put, &input, false),
        ("worker", &worker, put, &manifest, false),
        ("worker", &worker, put, &cancelled, false),
        ("worker", &worker, put, &model_file, false),
        ("worker", &worker, put, &model_name, false),
        ("worker", &worker, list, "jobs", false),
        ("watchdog", &watchdog, get, &spec, true),
        ("watchdog", &watchdog, get, &manifest, true),
        ("watchdog", &watchdog, get, &cancelled, true),
        // A team identity's cancel, and the dashboard's, are the watchdog's.
        ("watchdog", &watchdog, put, &cancelled, true),
        ("watchdog", &watchdog, get, &model_manifest, true),
        ("watchdog", &watchdog, put, &manifest, true),
        ("watchdog", &watchdog, get, &revision, true),
        ("watchdog", &watchdog, put, &revision, true),
        ("worker", &worker, put, &revision, false),
        ("watchdog", &watchdog, get, &input, false),
        // A done is checked against its output and a check run's output
        // against the shard's; an outvoted output is replaced by the
        // majority's, a quarantined machine's is removed.
        ("watchdog", &watchdog, get, &output, true),
        ("watchdog", &watchdog, get, &check, true),
        ("watchdog", &watchdog, put, &output, true),
        ("watchdog", &watchdog, "s3:DeleteObject", &output, true),
        ("watchdog", &watchdog, put, &check, false),
        ("worker", &worker, put, &check, true),
        ("worker", &worker, get, &check, true),
        ("worker", &worker, put, &check_checkpoint, true),
        (
            "worker",
            &worker,
            "s3:DeleteObject",
            &check_checkpoint,
            true,
        ),
        ("watchdog", &watchdog, put, &spec, false),
        ("watchdog", &watchdog, get, &folded, true),
        ("watchdog", &watchdog, put, &folded, true),
        ("watchdog", &watchdog, "s3:DeleteObject", &folded, true),
        (
            "watchdog",
            &watchdog,
            list,
            keys::WATCHDOG_CHECKPOINTS,
            true,
        ),
        ("watchdog", &watchdog, "s3:DeleteObject", &manifest, false),
        ("watchdog", &watchdog, list, "jobs", false),
        ("worker", &worker, put, &folded, false),
        ("producer", &producer, put, &folded, false),
        ("producer", &producer, put, &spec, true),
        ("producer", &producer, put, &input, true),
        ("producer", &producer, put, &cancelled, true),
        ("producer", &producer, put, &model_manifest, true),
        ("producer", &producer, put, &model_file, true),
        ("producer", &producer, put, &model_name, true),
        ("producer", &producer, get, &output, true),
        ("producer", &producer, list, &outputs, true),
        ("producer", &producer, list, keys::MODEL_NAMES, true),
        ("producer", &producer, put, &output, false),
        ("producer", &producer, put, &checkpoint, false),
        ("producer", &producer, put, &check, false),
        ("producer", &producer, put, &manifest, false),
    ];
    let mut wrong = Vec::new();
    for (role, policy, action, key, want) in &cases {
        if allows(policy, action, key) != *want {
            wrong.push(format!(
                "{role} {action} {key}: expected {}",
                if *want { "allowed" } else { "denied" }
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    eprintln!(
        "S3 policies: {} checks against the key layout hold",
        cases.len()
    );
    assert!(
        glob("jobs/*/outputs/*", "jobs/a/outputs/1")
            && !glob("jobs/*/outputs/*", "jobs/a/inputs/1")
    );
    Ok(())
}

/// A team's store policy (`add-producer --s3-bucket`, from
/// `deploy/s3/team-producer-policy.json`): its own jobs, as `minions
/// submit` names them, and reading models; nothing of another team's.
#[test]
fn a_teams_s3_policy_covers_its_own_jobs_only() -> Result<()> {
    use minions::commands::team_policy;
    use minions_schemas::{JobId, ModelHash, ModelName, keys};
    let text = team_policy::render(team_policy::TEMPLATE, "BUCKET", &["alpha".to_owned()])?;
    let alpha: serde_json::Value = serde_json::from_str(&text)?;
    let tail = "01jxyzabcdefghjkmnpqrstvwx";
    let own = keys::made_job_id("alpha", tail)?;
    let other = keys::made_job_id("beta", tail)?;
    let alike = keys::made_job_id("alpha-ml", tail)?;
    let unprefixed = JobId::new("j1")?;
    let hash = ModelHash::new("ab".repeat(32))?;
    let (get, put, list) = ("s3:GetObject", "s3:PutObject", "s3:ListBucket");
    for (action, key, allowed) in [
        (put, keys::job_spec(&own), true),
        (put, keys::shard_input(&own, 3), true),
        (put, keys::job_cancelled(&own), true),
        (get, keys::shard_output(&own, 3), true),
        (get, keys::job_manifest(&own), true),
        (list, keys::job_outputs(&own), true),
        (get, keys::model_file(&hash, "model.safetensors"), true),
        (put, keys::shard_output(&own, 3), false),
        (put, keys::model_file(&hash, "model.safetensors"), false),
        (put, keys::model_name(&ModelName::new("minilm")?), false),
    ]
    .into_iter()
    .chain([other, alike, unprefixed].iter().flat_map(|job| {
        [
            (get, keys::job_spec(job), false),
            (get, keys::shard_input(job, 3), false),
            (get, keys::shard_output(job, 3), false),
            (put, keys::shard_input(job, 3), false),
            (put, keys::job_cancelled(job), false),
            (list, keys::job_outputs(job), false),
        ]
    })) {
        assert_eq!(
            allows(&alpha, action, &key),
            allowed,
            "team alpha's policy: {action} {key} should be {}",
            if allowed { "allowed" } else { "refused" }
        );
    }
    Ok(())
}
