//! The shipped least-privilege nats-server config
//! (`deploy/nats/least-privilege.conf`): the core-path job runs with every
//! program on its own identity over TLS (CLI as `producer`, each worker with
//! its own machine identity from `minions admin add-worker`, the watchdog as
//! `watchdog`, set up by `minions admin init` as `admin`) without one refused
//! action; and each identity is refused, by the server, every action beyond
//! its job, while what it needs works. On a real S3 server that judges
//! requests by policy, a team identity's store policy keeps it to its own
//! team's jobs.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use minions_schemas::streams;
use minions_tests::{Fleet, NatsServer, Result, core_job_scenario, role_password};

#[tokio::test(flavor = "multi_thread")]
async fn the_core_path_job_runs_with_one_identity_per_role() -> Result<()> {
    let mut fleet = Fleet::least_privilege()?;
    let r = core_job_scenario(&mut fleet).await;
    fleet.explain(r)?;
    // The rest of what teams and operators do, as `producer`.
    let listed = fleet.cli(&["worker", "list"])?;
    assert!(listed.contains("w1-") && listed.contains("w2-"), "{listed}");
    let reconciled = fleet.cli(&["reconcile", "core1"])?;
    assert!(
        reconciled.contains("100 shards done or queued"),
        "{reconciled}"
    );
    let retried = fleet.cli(&["retry", "core1"])?;
    eprintln!("retry as producer: {retried}");
    let cancelled = fleet.cli(&["cancel", "core1"])?;
    eprintln!("cancel as producer: {cancelled}");
    // A job with every shard checked, submitted while no watchdog runs:
    // its shards all get results, but the job is not done until a watchdog
    // has checked them. The watchdog, started then, makes the job's check
    // consumer and queues check runs on their subjects; the other machine
    // pulls and runs them.
    let input = fleet.dir.path().join("checked.jsonl");
    minions_tests::write_corpus(&input, 20)?;
    fleet.cli(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &input.display().to_string(),
        "--job",
        "checked1",
        "--shard-size",
        "1",
        "--verify",
        "1",
    ])?;
    let status = fleet.wait_status("checked1", Duration::from_secs(300), |v| v["done"] == 20)?;
    assert_eq!(
        (&status["done"], &status["state"], &status["verified"]),
        (&20.into(), &"running".into(), &0.into()),
        "{status}"
    );
    let said = fleet.cli(&["status", "checked1"])?;
    assert!(
        said.contains("when a watchdog has queued and judged"),
        "{said}"
    );
    fleet.add_watchdog(&[])?;
    let status = fleet.wait_job("checked1", Duration::from_secs(300))?;
    assert_eq!(status["done"], 20, "{status}");
    assert_eq!(status["verified"], 20, "{status}");
    eprintln!("20 shards, each checked on the other machine, as watchdog and workers");
    // Every program did all of the above without one refused action.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(&fleet.nats.proc.log)?;
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("Violation")).collect();
    assert!(
        refused.is_empty(),
        "the server refused actions the programs need:\n{}",
        refused.join("\n")
    );
    eprintln!("no permission violation in the server's log during the job");
    team_identity_submits_for_its_team_only(&fleet).await
}

/// `ana` (`minions admin add-producer ana --team alpha --max-priority
/// normal`) submits for alpha and the job runs, recorded under her name;
/// for team beta, or at high priority, the server refuses the claim and the
/// CLI says why; she may neither make a job consumer nor drain a worker.
async fn team_identity_submits_for_its_team_only(fleet: &Fleet) -> Result<()> {
    let seed = fleet.nats.producer_seed("ana");
    let mut env = fleet.cli_env();
    env.retain(|(k, _)| k != "MINIONS_NATS_USER" && k != "MINIONS_NATS_PASSWORD");
    env.push(("MINIONS_NATS_NKEY".into(), seed.display().to_string()));
    let input = fleet.dir.path().join("ana.jsonl");
    minions_tests::write_corpus(&input, 20)?;
    let input = input.display().to_string();
    let submit = |job: &str, extra: &[&str]| {
        let mut args = vec![
            "submit",
            "--model",
            "tiny",
            "--input",
            &input,
            "--job",
            job,
            "--shard-size",
            "5",
        ];
        args.extend_from_slice(extra);
        minions_tests::minions(&args, &env)
    };
    let out = submit("ana1", &["--team", "alpha"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = fleet.wait_job("ana1", Duration::from_secs(300))?;
    assert_eq!(status["done"], 4, "{status}");
    let listed = minions_tests::minions_ok(&["jobs", "--team", "alpha", "--json"], &env)?;
    let jobs: serde_json::Value = serde_json::from_str(&listed)?;
    let ana1 = jobs
        .as_array()
        .and_then(|a| a.iter().find(|j| j["job"] == "ana1"))
        .ok_or_else(|| format!("ana1 not listed: {listed}"))?;
    assert_eq!(
        (&ana1["submitter"], &ana1["team"]),
        (&"ana".into(), &"alpha".into()),
        "{ana1}"
    );
    eprintln!("ana submitted for alpha: done, recorded as submitted by ana");

    for (job, extra, subject) in [
        (
            "ana2",
            vec!["--team", "beta"],
            "minions.submit.beta.normal.ana",
        ),
        (
            "ana3",
            vec!["--team", "alpha", "--priority", "high"],
            "minions.submit.alpha.high.ana",
        ),
    ] {
        let out = submit(job, &extra)?;
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("ana {extra:?}: {}", err.trim());
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("the NATS server refused identity \"ana\" to submit for team"),
            "{err}"
        );
        assert!(err.contains("nothing was queued"), "{err}");
        // The server's own record of the refusal (its log is written a
        // moment after it answers).
        let mut logged = false;
        for _ in 0..40 {
            let log = std::fs::read_to_string(&fleet.nats.proc.log)?;
            logged = log
                .lines()
                .any(|l| l.contains("Violation") && l.contains(subject));
            if logged {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(logged, "no refusal of {subject} in the server's log");
    }
    let listed = minions_tests::minions_ok(&["jobs", "--json"], &env)?;
    assert!(
        !listed.contains("\"ana2\"") && !listed.contains("\"ana3\""),
        "a refused job is listed: {listed}"
    );

    let ana = Conn::machine(&fleet.nats, &seed).await?;
    assert!(
        ana.publish_refused("$JS.API.CONSUMER.CREATE.MINIONS_WORK.job-x.minions.work.x.*")
            .await?,
        "ana made a job consumer"
    );
    assert!(
        ana.publish_refused("minions.ctl.w1.w1-x").await?,
        "ana drained a worker"
    );
    assert!(
        ana.publish_refused("minions.submit.alpha.normal.bob")
            .await?,
        "ana claimed a job as bob"
    );

    // Actions on record: the shared role's cancel of core1 (above; its
    // retry found nothing to do and did nothing) and ana's cancel of her
    // own job, each under the identity that asked; she cannot put one on
    // record as someone else.
    let said = minions_tests::minions_ok(&["cancel", "ana1"], &env)?;
    assert!(said.contains("by watchdog"), "{said}");
    // Not another team's job: the server refuses her request on core1's
    // team, and she may neither purge the queue nor stop a job herself.
    let out = minions_tests::minions(&["cancel", "core1"], &env)?;
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "ana cancels core1 (team default): {}",
        err.lines()
            .find(|l| l.contains("refused identity"))
            .unwrap_or_default()
    );
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("refused identity \"ana\" to act on jobs of team \"default\""),
        "{err}"
    );
    assert!(
        ana.publish_refused("$JS.API.STREAM.PURGE.MINIONS_WORK")
            .await?,
        "ana purged the work queue"
    );
    assert!(
        ana.publish_refused("minions.cancel.core1").await?,
        "ana stopped core1"
    );
    let audit = minions_tests::minions_ok(&["audit", "--json"], &env)?;
    let actions: serde_json::Value = serde_json::from_str(&audit)?;
    let said: Vec<(String, String, String)> = actions
        .as_array()
        .ok_or("audit is not a list")?
        .iter()
        .map(|a| {
            (
                a["by"].as_str().unwrap_or_default().to_owned(),
                a["action"].as_str().unwrap_or_default().to_owned(),
                a["target"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for want in [("producer", "cancel", "core1"), ("ana", "cancel", "ana1")] {
        assert!(
            said.iter()
                .any(|(b, a, t)| (b.as_str(), a.as_str(), t.as_str()) == want),
            "{want:?} not on record: {said:?}"
        );
    }
    assert!(
        ana.publish_refused("minions.actions.producer").await?,
        "ana put an action on record as producer"
    );
    let table = minions_tests::minions_ok(&["audit", "--by", "ana"], &env)?;
    eprintln!("minions audit --by ana:\n{table}");
    assert!(
        table.contains("cancel") && !table.contains("producer"),
        "{table}"
    );

    // An operator drains a worker from the dashboard: the watchdog's
    // identity may ask it and put it on record under the operator's name.
    let base = fleet.dashboards.last().ok_or("no dashboard")?;
    let (_, fleet_json) = minions_tests::web::get(&format!("{base}/api/fleet"))?;
    let view: serde_json::Value = serde_json::from_str(&fleet_json)?;
    let worker = view["workers"][0]["id"]
        .as_str()
        .ok_or_else(|| format!("no worker in {fleet_json:.300}"))?
        .to_owned();
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse()?;
    let (code, page) = minions_tests::web::request_from(
        "127.0.0.1".parse()?,
        addr,
        "POST",
        &format!("/act/worker/{worker}/drain"),
        &[],
        "",
    )?;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("draining"), "{page}");
    let (code, page) = minions_tests::web::request_from(
        "127.0.0.1".parse()?,
        addr,
        "POST",
        "/act/job/checked1/cancel",
        &[],
        "",
    )?;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("cancelled by anyone"), "{page}");
    let table = minions_tests::minions_ok(&["audit", "--by", "anyone"], &env)?;
    assert!(
        table.contains("dashboard") && table.contains(&worker) && table.contains("checked1"),
        "{table}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(&fleet.nats.proc.log)?;
    assert!(
        !log.lines()
            .any(|l| l.contains("Violation") && l.contains("user:watchdog")),
        "the watchdog was refused:\n{log}"
    );
    eprintln!(
        "drained {worker} and cancelled checked1 from the (open) dashboard as the watchdog's identity"
    );
    Ok(())
}

/// A connection that records the server's permission refusals.
struct Conn {
    client: async_nats::Client,
    refusals: Arc<Mutex<Vec<String>>>,
}

impl Conn {
    async fn open(nats: &NatsServer, o: async_nats::ConnectOptions) -> Result<Self> {
        minions_endpoints::nats::init_tls();
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let seen = refusals.clone();
        let ca = nats.ca.clone().ok_or("no CA")?;
        let client = o
            .add_root_certificates(ca)
            .require_tls(true)
            .request_timeout(Some(Duration::from_secs(2)))
            .event_callback(move |e| {
                let seen = seen.clone();
                async move {
                    if let Ok(mut s) = seen.lock() {
                        s.push(e.to_string());
                    }
                }
            })
            .connect(nats.url())
            .await?;
        Ok(Self { client, refusals })
    }

    async fn user(nats: &NatsServer, user: &str) -> Result<Self> {
        let o =
            async_nats::ConnectOptions::with_user_and_password(user.into(), role_password(user));
        Self::open(nats, o).await
    }

    async fn machine(nats: &NatsServer, seed: &Path) -> Result<Self> {
        let seed = std::fs::read_to_string(seed)?;
        Self::open(
            nats,
            async_nats::ConnectOptions::with_nkey(seed.trim().to_owned()),
        )
        .await
    }

    /// Whether the server refused an action on `subject` (waits up to 2 s).
    async fn was_refused(&self, subject: &str) -> Result<bool> {
        self.client.flush().await?;
        let quoted = format!("\"{subject}\"");
        for _ in 0..40 {
            if self
                .refusals
                .lock()
                .map_err(|_| "poisoned")?
                .iter()
                .any(|r| r.to_lowercase().contains("permissions violation") && r.contains(&quoted))
            {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(false)
    }

    /// Publishes on `subject` and says whether the server refused it.
    async fn publish_refused(&self, subject: &str) -> Result<bool> {
        self.client.publish(subject.to_owned(), "{}".into()).await?;
        self.was_refused(subject).await
    }

    /// Subscribes to `subject` and says whether the server refused it.
    async fn subscribe_refused(&self, subject: &str) -> Result<bool> {
        let _sub = self.client.subscribe(subject.to_owned()).await?;
        self.was_refused(subject).await
    }

    fn refusal_count(&self) -> usize {
        self.refusals.lock().map(|r| r.len()).unwrap_or(usize::MAX)
    }
}

/// Whether publishes by `from` on `subject` reach a subscriber on `to`
/// within 3 s. `from` publishes every 100 ms until one arrives: a flush does
/// not wait for the server to register `to`'s subscription.
async fn arrives(from: &Conn, to: &Conn, subject: &str) -> Result<bool> {
    let mut sub = to.client.subscribe(subject.to_owned()).await?;
    to.client.flush().await?;
    for _ in 0..30 {
        from.client.publish(subject.to_owned(), "x".into()).await?;
        from.client.flush().await?;
        if tokio::time::timeout(Duration::from_millis(100), sub.next())
            .await
            .ok()
            .flatten()
            .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Checks that each (action, kind, subject) is refused by the server;
/// returns the actions for the report.
async fn all_refused(c: &Conn, role: &str, list: &[(&str, &str, &str)]) -> Result<Vec<String>> {
    let mut done = Vec::new();
    for (what, kind, subject) in list {
        let refused = match *kind {
            "sub" => c.subscribe_refused(subject).await?,
            _ => c.publish_refused(subject).await?,
        };
        assert!(refused, "{role} may {what} ({subject})");
        done.push((*what).to_owned());
    }
    Ok(done)
}

/// Forbidden to every role but the administrator.
const NO_ONE: &[(&str, &str, &str)] = &[
    ("create a stream", "pub", "$JS.API.STREAM.CREATE.EVIL"),
    (
        "delete the work stream",
        "pub",
        "$JS.API.STREAM.DELETE.MINIONS_WORK",
    ),
    (
        "change the work stream",
        "pub",
        "$JS.API.STREAM.UPDATE.MINIONS_WORK",
    ),
    (
        "delete the events stream",
        "pub",
        "$JS.API.STREAM.DELETE.MINIONS_EVENTS",
    ),
    (
        "add a consumer over every shard",
        "pub",
        "$JS.API.CONSUMER.CREATE.MINIONS_WORK.thief.minions.work.>",
    ),
    (
        "add a consumer without a filter",
        "pub",
        "$JS.API.CONSUMER.CREATE.MINIONS_WORK.thief",
    ),
    (
        "add a durable consumer to the work stream",
        "pub",
        "$JS.API.CONSUMER.DURABLE.CREATE.MINIONS_WORK.thief",
    ),
    (
        "publish a heartbeat as a worker of another machine",
        "pub",
        "minions.hb.w2.w2-0a1b2c3d",
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn each_worker_machine_may_do_its_job_and_nothing_else() -> Result<()> {
    let fleet = Fleet::least_privilege()?;
    let admin = Conn::user(&fleet.nats, "admin").await?;
    let w1 = Conn::machine(&fleet.nats, &fleet.nats.worker_seed("w1")).await?;
    let js = async_nats::jetstream::new(w1.client.clone());
    let work = js.get_stream(streams::WORK_STREAM).await?;

    let mut refused = all_refused(&w1, "a worker", NO_ONE).await?;
    refused.extend(
        all_refused(
            &w1,
            "a worker",
            &[
                ("publish a shard", "pub", "minions.work.forged.0"),
                (
                    "purge the work stream",
                    "pub",
                    "$JS.API.STREAM.PURGE.MINIONS_WORK",
                ),
                (
                    "delete a job's consumer",
                    "pub",
                    "$JS.API.CONSUMER.DELETE.MINIONS_WORK.job-x",
                ),
                (
                    "create a job's consumer",
                    "pub",
                    "$JS.API.CONSUMER.CREATE.MINIONS_WORK.job-x.minions.work.x.>",
                ),
                ("publish the schedule", "pub", "minions.sched"),
                ("make the schedulers reschedule", "pub", "minions.queued"),
                (
                    "lift its own quarantine",
                    "pub",
                    "$KV.MINIONS_QUARANTINE.w1",
                ),
                (
                    "read another machine's quarantine record",
                    "pub",
                    "$JS.API.DIRECT.GET.KV_MINIONS_QUARANTINE.$KV.MINIONS_QUARANTINE.w2",
                ),
                (
                    "read the events stream through a consumer",
                    "pub",
                    "$JS.API.CONSUMER.CREATE.MINIONS_EVENTS",
                ),
                (
                    "read the worker registry",
                    "pub",
                    "$JS.API.DIRECT.GET.KV_MINIONS_WORKERS.$KV.MINIONS_WORKERS.w2",
                ),
                (
                    "write the worker registry",
                    "pub",
                    "$KV.MINIONS_WORKERS.w2-0a1b2c3d",
                ),
                (
                    "read a shard by sequence",
                    "pub",
                    "$JS.API.STREAM.MSG.GET.MINIONS_WORK",
                ),
                (
                    "publish a shard event as another machine",
                    "pub",
                    "minions.events.j.0.w2",
                ),
                ("publish a dead letter", "pub", "minions.dead.j.0"),
                (
                    "send control to another worker",
                    "pub",
                    "minions.ctl.w2.w2-0a1b2c3d",
                ),
                ("cancel a job", "pub", "minions.cancel.somejob"),
                (
                    "receive another machine's control",
                    "sub",
                    "minions.ctl.w2.>",
                ),
                ("read shards off their subjects", "sub", "minions.work.>"),
                ("read other workers' heartbeats", "sub", "minions.hb.>"),
                ("read shard events", "sub", "minions.events.>"),
            ],
        )
        .await?,
    );
    assert_eq!(
        work.clone().info().await?.state.messages,
        0,
        "nothing was queued"
    );
    assert!(
        js.get_stream(streams::EVENTS_STREAM).await.is_ok(),
        "streams still exist"
    );
    let before = w1.refusal_count();

    // Allowed: what a worker does, each without a refusal.
    assert!(
        arrives(&w1, &admin, "minions.hb.w1.w1-0a1b2c3d").await?,
        "own heartbeat"
    );
    let event = js.publish("minions.events.j.0.w1", "x".into()).await?.await;
    assert!(
        event.is_ok(),
        "a worker cannot store its own shard event: {event:?}"
    );
    assert!(
        arrives(&admin, &w1, "minions.ctl.w1.w1-0a1b2c3d").await?,
        "own control"
    );
    assert!(
        arrives(&admin, &w1, "minions.cancel.somejob").await?,
        "cancellations"
    );
    // A job's consumer, as `minions submit` makes it.
    let job_id = minions_schemas::JobId::new("roles")?;
    let name = minions_schemas::scheduling::job_consumer(&job_id);
    async_nats::jetstream::new(admin.client.clone())
        .get_stream(streams::WORK_STREAM)
        .await?
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: minions_schemas::subjects::job_work(&job_id),
            ..Default::default()
        })
        .await?;
    let mut listed = work.consumers();
    assert!(
        listed.next().await.is_some(),
        "a worker lists job consumers"
    );
    assert!(
        arrives(&admin, &w1, minions_schemas::subjects::SCHEDULE).await?,
        "a worker follows the schedule"
    );
    let consumer: async_nats::jetstream::consumer::PullConsumer = work.get_consumer(&name).await?;
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_millis(200))
        .messages()
        .await?;
    assert!(batch.next().await.is_none(), "the queue is empty");
    for s in [
        streams::EVENTS_STREAM,
        streams::HEARTBEATS_STREAM,
        streams::DEAD_STREAM,
    ] {
        js.get_stream(s).await?;
    }
    // Its own machine's quarantine record (none here).
    let q = js.get_key_value(streams::QUARANTINE_BUCKET).await?;
    assert!(q.get("w1").await?.is_none());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        w1.refusal_count(),
        before,
        "{:?}",
        w1.refusals.lock().map(|r| r.clone())
    );
    // A worker run with another machine's identity stops at once, saying why.
    let mut env = fleet.cli_env();
    env.retain(|(k, _)| k != "MINIONS_NATS_USER" && k != "MINIONS_NATS_PASSWORD");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(minions_tests::bin("minions-worker")?)
            .args(["--name", "w2", "--cache-dir"])
            .arg(fleet.dir.path().join("cache-w2"))
            .env("MINIONS_NATS_NKEY", fleet.nats.worker_seed("w1"))
            .envs(env)
            .output(),
    )
    .await??;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    let line = said
        .lines()
        .find(|l| l.starts_with("error:"))
        .ok_or_else(|| format!("no error line: {said}"))?;
    assert!(
        line.contains("refused this worker's heartbeats on minions.hb.w2."),
        "{line}"
    );
    eprintln!("worker w2 run with w1's identity: {line}");

    // The server logs each refusal (what the core-path test relies on).
    let log = std::fs::read_to_string(&fleet.nats.proc.log)?;
    let logged = log.lines().filter(|l| l.contains("Violation")).count();
    assert!(logged >= refused.len(), "{logged} refusals logged:\n{log}");
    eprintln!(
        "worker machine w1 refused ({}): {}",
        refused.len(),
        refused.join(", ")
    );
    eprintln!(
        "worker machine w1 allowed: own heartbeat, own shard event, own control, cancellations, pull from the work consumer, stream and consumer info"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_producer_and_watchdog_identities_may_do_their_jobs_and_nothing_else() -> Result<()> {
    let fleet = Fleet::least_privilege()?;
    let admin = Conn::user(&fleet.nats, "admin").await?;

    let producer = Conn::user(&fleet.nats, "producer").await?;
    let mut refused = all_refused(&producer, "a producer", NO_ONE).await?;
    refused.extend(
        all_refused(
            &producer,
            "a producer",
            &[
                (
                    "pull a shard",
                    "pub",
                    "$JS.API.CONSUMER.MSG.NEXT.MINIONS_WORK.job-x",
                ),
                (
                    "ack a shard",
                    "pub",
                    "$JS.ACK.MINIONS_WORK.job-x.1.1.1.1.1.1",
                ),
                (
                    "send control to a worker",
                    "pub",
                    "minions.ctl.w1.w1-0a1b2c3d",
                ),
                (
                    "write the worker registry",
                    "pub",
                    "$KV.MINIONS_WORKERS.w1-0a1b2c3d",
                ),
                ("publish a dead letter", "pub", "minions.dead.j.0"),
                (
                    "publish a worker's shard event",
                    "pub",
                    "minions.events.j.0.w1",
                ),
                (
                    "delete a shard",
                    "pub",
                    "$JS.API.STREAM.MSG.DELETE.MINIONS_WORK",
                ),
                ("receive workers' control", "sub", "minions.ctl.>"),
            ],
        )
        .await?,
    );
    eprintln!(
        "producer refused ({}): {}",
        refused.len(),
        refused.join(", ")
    );

    let watchdog = Conn::user(&fleet.nats, "watchdog").await?;
    let mut refused = all_refused(&watchdog, "the watchdog", NO_ONE).await?;
    refused.extend(
        all_refused(
            &watchdog,
            "the watchdog",
            &[
                (
                    "pull a shard",
                    "pub",
                    "$JS.API.CONSUMER.MSG.NEXT.MINIONS_WORK.job-x",
                ),
                ("read shards off their subjects", "sub", "minions.work.>"),
            ],
        )
        .await?,
    );
    eprintln!(
        "watchdog refused ({}): {}",
        refused.len(),
        refused.join(", ")
    );

    // Allowed, each without a refusal (the CLI and watchdog use the rest in
    // the core-path test).
    let (p0, w0) = (producer.refusal_count(), watchdog.refusal_count());
    assert!(
        arrives(&producer, &admin, "minions.cancel.somejob").await?,
        "{:?}",
        producer.refusals.lock().map(|r| r.clone())
    );
    let pjs = async_nats::jetstream::new(producer.client.clone());
    let ack = pjs
        .publish("minions.work.allowed.0", "x".into())
        .await?
        .await;
    assert!(ack.is_ok(), "a producer cannot queue a shard: {ack:?}");
    let ack = pjs
        .publish("minions.events.allowed.0.cli", "x".into())
        .await?
        .await;
    assert!(ack.is_ok(), "a producer cannot store a job event: {ack:?}");
    assert!(
        arrives(&watchdog, &admin, "minions.ctl.w1.w1-0a1b2c3d").await?,
        "{:?}",
        watchdog.refusals.lock().map(|r| r.clone())
    );
    assert!(arrives(&admin, &watchdog, "minions.hb.w1.w1-0a1b2c3d").await?);
    // It cancels jobs for team identities and the dashboard's operators.
    assert!(arrives(&watchdog, &admin, "minions.cancel.somejob").await?);
    assert!(arrives(&producer, &watchdog, "minions.jobreq.alpha.producer").await?);
    // A shard whose result it rejected is queued again by the watchdog.
    let wjs0 = async_nats::jetstream::new(watchdog.client.clone());
    let ack = wjs0
        .publish("minions.work.rerun.0", "x".into())
        .await?
        .await;
    assert!(
        ack.is_ok(),
        "the watchdog cannot queue a shard again: {ack:?}"
    );
    assert!(
        !watchdog
            .publish_refused("$JS.ACK.MINIONS_WORK.job-x.1.1.1.1.1.1")
            .await?
    );
    let wjs = async_nats::jetstream::new(watchdog.client.clone());
    let kv = wjs.get_key_value(streams::WORKERS_BUCKET).await?;
    kv.put("w1-0a1b2c3d", "x".into()).await?;
    assert!(kv.get("w1-0a1b2c3d").await?.is_some());
    // It quarantines machines.
    let q = wjs.get_key_value(streams::QUARANTINE_BUCKET).await?;
    q.put("w9", "x".into()).await?;
    assert!(q.get("w9").await?.is_some());
    let ack = wjs
        .publish("minions.dead.allowed.0", "x".into())
        .await?
        .await;
    assert!(ack.is_ok(), "the watchdog cannot dead-letter: {ack:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        (producer.refusal_count(), watchdog.refusal_count()),
        (p0, w0)
    );
    eprintln!(
        "producer allowed: queue shards, job events as cli, cancel; watchdog allowed: control, heartbeats, NAK, registry, dead letters, queue a rejected shard again"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn programs_read_their_connection_settings_from_a_file() -> Result<()> {
    let mut fleet = Fleet::least_privilege()?;
    let conf_dir = fleet.dir.path().join("etc");
    std::fs::create_dir_all(&conf_dir)?;
    std::fs::copy(
        fleet.nats.ca.clone().ok_or("no CA")?,
        conf_dir.join("ca.pem"),
    )?;
    std::fs::copy(fleet.nats.worker_seed("w1"), conf_dir.join("w1.nk"))?;
    let common = format!(
        "nats = \"{}\"\nstore = \"{}\"\nnats_ca = \"ca.pem\"\n",
        fleet.nats.url(),
        fleet.store_url
    );
    let producer_conf = conf_dir.join("producer.toml");
    std::fs::write(
        &producer_conf,
        format!(
            "{common}nats_user = \"producer\"\nnats_password = \"{}\"\n",
            role_password("producer")
        ),
    )?;
    let worker_conf = conf_dir.join("w1.toml");
    std::fs::write(&worker_conf, format!("{common}nats_nkey = \"w1.nk\"\n"))?;

    // A worker with nothing but --config joins the fleet.
    fleet.worker_identities = false;
    fleet.env.clear();
    fleet.add_worker(&["--config", &worker_conf.display().to_string()])?;
    let minions = minions_tests::bin("minions")?;
    let list = |conf: &Path| {
        std::process::Command::new(&minions)
            .args(["worker", "list"])
            .env("MINIONS_CONFIG", conf)
            .output()
    };
    let mut listed = String::new();
    for _ in 0..100 {
        let out = list(&producer_conf)?;
        listed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if listed.contains("w1-") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(listed.contains("w1-"), "{listed}\n{}", fleet.logs());
    eprintln!(
        "worker list through MINIONS_CONFIG as producer: {}",
        listed.lines().last().unwrap_or("")
    );

    // A wrong file is named with what is wrong.
    let bad = conf_dir.join("bad.toml");
    std::fs::write(&bad, format!("{common}nats_usr = \"producer\"\n"))?;
    let out = list(&bad)?;
    let said = String::from_utf8_lossy(&out.stderr);
    let line = said.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    assert!(
        !out.status.success() && line.contains("bad.toml") && line.contains("nats_usr"),
        "{said}"
    );
    eprintln!("misspelt key: {line}");
    Ok(())
}

/// Per-team store policies on a real S3 server that judges every request
/// (moto with authentication on): `add-producer --s3-bucket` writes each
/// team identity's policy; team beta's producer and a worker (the shipped
/// worker policy) write beta's job, and team alpha's producer may write
/// and read its own job but can neither read beta's spec, inputs or
/// outputs nor write into beta's job, nor write a job whose id its team
/// does not head.
#[tokio::test(flavor = "multi_thread")]
async fn a_teams_store_policy_keeps_it_out_of_other_teams_jobs() -> Result<()> {
    use minions_schemas::{JobId, keys};
    use object_store::{ObjectStore, ObjectStoreExt, path::Path as Key};
    const BUCKET: &str = "minions-test";
    let dir = minions_tests::scratch("minions-team-store-")?;
    let conf = dir.path().join("server.conf");
    std::fs::copy(
        minions_tests::workspace_root().join("deploy/nats/least-privilege.conf"),
        &conf,
    )?;
    let policy = |name: &str, team: &str| -> Result<serde_json::Value> {
        let out = dir.path().join(format!("{name}-s3.json"));
        let said = minions_tests::minions_ok(
            &[
                "admin",
                "add-producer",
                name,
                "--team",
                team,
                "--server-config",
                &conf.display().to_string(),
                "--seed-out",
                &dir.path().join(format!("{name}.nk")).display().to_string(),
                "--s3-bucket",
                BUCKET,
                "--s3-policy-out",
                &out.display().to_string(),
            ],
            &[],
        )?;
        assert!(said.contains("S3 policy written to"), "{said}");
        Ok(serde_json::from_str(&std::fs::read_to_string(&out)?)?)
    };
    let (ana, bo) = (policy("ana", "alpha")?, policy("bo", "beta")?);
    let worker: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            minions_tests::workspace_root().join("deploy/s3/worker-policy.json"),
        )?
        .replace("BUCKET", BUCKET),
    )?;
    let (s3, users) = minions_tests::S3Server::start_with_users(
        BUCKET,
        &[("ana", ana), ("bo", bo), ("worker", worker)],
    )?;
    minions_endpoints::nats::init_tls();
    let store = |user: &str| -> Result<Box<dyn ObjectStore>> {
        let (key, secret) = users.get(user).ok_or("no such user")?;
        Ok(Box::new(
            object_store::aws::AmazonS3Builder::new()
                .with_endpoint(s3.endpoint())
                .with_bucket_name(BUCKET)
                .with_region("us-east-1")
                .with_access_key_id(key)
                .with_secret_access_key(secret)
                .with_allow_http(true)
                .build()?,
        ))
    };
    let (ana, bo, worker) = (store("ana")?, store("bo")?, store("worker")?);
    let tail = "01jxyzabcdefghjkmnpqrstvwx";
    let alpha_job = keys::made_job_id("alpha", tail)?;
    let beta_job = keys::made_job_id("beta", tail)?;
    let bytes = || bytes::Bytes::from_static(b"x");
    // Each team's own, and a worker's output.
    for (who, s, key) in [
        ("bo", &bo, keys::job_spec(&beta_job)),
        ("bo", &bo, keys::shard_input(&beta_job, 0)),
        ("worker", &worker, keys::shard_output(&beta_job, 0)),
        ("ana", &ana, keys::job_spec(&alpha_job)),
        ("ana", &ana, keys::shard_input(&alpha_job, 0)),
    ] {
        s.put(&Key::from(key.as_str()), bytes().into())
            .await
            .map_err(|e| format!("{who} may write {key}: {e}"))?;
    }
    ana.get(&Key::from(keys::shard_input(&alpha_job, 0)))
        .await
        .map_err(|e| format!("ana may read her own input: {e}"))?;
    // And not the other team's.
    let mut refused = Vec::new();
    for key in [
        keys::job_spec(&beta_job),
        keys::shard_input(&beta_job, 0),
        keys::shard_output(&beta_job, 0),
    ] {
        let e = ana
            .get(&Key::from(key.as_str()))
            .await
            .err()
            .ok_or_else(|| format!("ana read {key}"))?;
        refused.push((format!("ana reads {key}"), e));
    }
    let unprefixed = JobId::new("j1")?;
    for key in [
        keys::shard_input(&beta_job, 1),
        keys::job_cancelled(&beta_job),
        keys::job_spec(&unprefixed),
    ] {
        let e = ana
            .put(&Key::from(key.as_str()), bytes().into())
            .await
            .err()
            .ok_or_else(|| format!("ana wrote {key}"))?;
        refused.push((format!("ana writes {key}"), e));
    }
    let e = bo
        .get(&Key::from(keys::shard_input(&alpha_job, 0)))
        .await
        .err()
        .ok_or("bo read alpha's input")?;
    refused.push(("bo reads alpha's input".to_owned(), e));
    for (what, e) in &refused {
        assert!(
            matches!(e, object_store::Error::PermissionDenied { .. }),
            "{what}: {e}"
        );
        eprintln!("refused by the S3 server (403 Access Denied): {what}");
    }
    Ok(())
}
