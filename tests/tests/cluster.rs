//! The fleet on a three-server nats-server cluster with every stream, the
//! work consumer and the registry at three replicas: jobs complete with
//! every output present once and equal to in-process vectors while servers
//! are killed (the leaders of the work stream and of the work consumer),
//! restarted one by one, or asked to step down as leaders every few
//! seconds; a killed worker's shard still runs elsewhere within 4 s.
//!
//! The scenarios share the machine's two cores, so they run one at a time.

use std::time::{Duration, Instant};

use minions_schemas::messages::EventKind;
use minions_schemas::streams::WORK_STREAM;
use minions_schemas::time::now_ms;
use minions_tests::{Fleet, Result, cluster, write_corpus};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fleet on three servers, everything created with three replicas.
async fn r3_fleet() -> Result<Fleet> {
    let mut fleet = Fleet::cluster(3).await?;
    let init = fleet.cli(&["admin", "init", "--replicas", "3"])?;
    assert!(
        init.lines()
            .filter(|l| l.starts_with("stream ") || l.starts_with("consumer "))
            .all(|l| l.contains("3 replica(s)")),
        "admin init --replicas 3 must make everything R3:\n{init}"
    );
    // Whatever a program creates is R3 too.
    fleet.env.push(("MINIONS_REPLICAS".into(), "3".into()));
    Ok(fleet)
}

/// Shards of `job` done so far, from `minions status` (0 while it cannot
/// answer, e.g. during an election).
fn done(fleet: &Fleet, job: &str) -> u64 {
    fleet
        .cli(&["status", job, "--json"])
        .ok()
        .and_then(|o| serde_json::from_str::<serde_json::Value>(&o).ok())
        .and_then(|v| v["done"].as_u64())
        .unwrap_or(0)
}

/// Waits until at least `n` shards of `job` are done.
async fn wait_done(fleet: &Fleet, job: &str, n: u64, within: Duration) -> Result<u64> {
    let until = Instant::now() + within;
    loop {
        let d = done(fleet, job);
        if d >= n {
            return Ok(d);
        }
        if Instant::now() > until {
            return Err(format!("{job}: {d} shards done, {n} expected within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every replica of the work stream is current again (a
/// restarted server has caught up).
async fn wait_current(fleet: &Fleet, within: Duration) -> Result<()> {
    let js = async_nats::jetstream::new(fleet.client().await?);
    cluster::wait_current(&js, WORK_STREAM, within).await
}

/// The longest pause between consecutive first-delivery `done` events of
/// `job` from `from_ms` to `to_ms` (event times, ms since the epoch), and
/// how many shards were done on a later delivery in that window (sent
/// again after the ack wait: in flight from a killed server, or their ack
/// lost with it).
async fn longest_gap(fleet: &Fleet, job: &str, from_ms: u64, to_ms: u64) -> Result<(u64, usize)> {
    let done: Vec<(u64, u64)> = fleet
        .events(job)
        .await?
        .into_iter()
        .filter(|e| matches!(e.kind, EventKind::Done { .. }))
        .filter(|e| (from_ms..=to_ms).contains(&e.at_ms))
        .map(|e| (e.at_ms, e.attempt))
        .collect();
    let mut at: Vec<u64> = done.iter().filter(|d| d.1 == 1).map(|d| d.0).collect();
    at.sort_unstable();
    let gap = at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    Ok((gap, done.iter().filter(|d| d.1 > 1).count()))
}

/// Redeliveries of `job`: deliveries after a shard's first.
async fn redeliveries(fleet: &Fleet, job: &str) -> Result<usize> {
    Ok(fleet
        .events(job)
        .await?
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Started) && e.attempt > 1)
        .count())
}

/// Checks a finished job: done, one output per shard, vectors equal to
/// in-process ones.
fn check_job(
    fleet: &Fleet,
    job: &str,
    shards: usize,
    model: &std::path::Path,
    texts: &[String],
) -> Result<()> {
    let status = fleet.wait_job(job, Duration::from_secs(300))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["done"].as_u64(), Some(shards as u64), "{status}");
    assert_eq!(fleet.output_count(job)?, shards, "one output per shard");
    fleet.check_outputs(job, model, texts)
}

/// Pushes the paced [`minions_tests::SLOW`] model, writes `2 × shards` records and submits them
/// as `job` in two-record shards to a watchdog and two one-slot workers
/// (paced shards keep a job running while servers come and go).
/// Returns the model folder and the texts.
fn slow_job(
    fleet: &mut Fleet,
    shards: usize,
    job: &str,
) -> Result<(std::path::PathBuf, Vec<String>)> {
    let model = fleet.push_slow_model()?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 2 * shards)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1"])?;
    fleet.add_worker(&["--slots", "1"])?;
    let submitted = fleet.submit("slow", &input, 2, job)?;
    assert_eq!(submitted, job);
    Ok((model, texts))
}

#[tokio::test(flavor = "multi_thread")]
async fn job_survives_losing_the_leaders() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut fleet = r3_fleet().await?;
    let r = leaders_killed(&mut fleet).await;
    fleet.explain(r)
}

async fn leaders_killed(fleet: &mut Fleet) -> Result<()> {
    const SHARDS: usize = 1_200;
    let job = "leaders".to_owned();
    let (model, texts) = slow_job(fleet, SHARDS, &job)?;
    let js = async_nats::jetstream::new(fleet.client().await?);

    let mut kills = Vec::new();
    for (what, at) in [("work stream", SHARDS / 10), ("work consumer", SHARDS / 2)] {
        wait_done(fleet, &job, at as u64, Duration::from_secs(120)).await?;
        let leader = cluster::work_leader(&js, what, &job).await?;
        let before = done(fleet, &job);
        let killed_ms = now_ms();
        fleet.node(&leader)?.proc.kill();
        eprintln!(
            "kill -9 of {leader}, leader of the {what}, with {before} of {SHARDS} shards done"
        );
        assert!(
            before < SHARDS as u64,
            "the job ended before the {what}'s leader was killed"
        );
        // Dispatch resumes on the two left; then the server comes back.
        wait_done(fleet, &job, before + 50, Duration::from_secs(60)).await?;
        let resumed_ms = now_ms();
        fleet.node(&leader)?.start_again()?;
        wait_current(fleet, Duration::from_secs(60)).await?;
        eprintln!(
            "{leader} restarted and current again after {:.1} s",
            (now_ms() - killed_ms) as f64 / 1000.0
        );
        kills.push((what, leader, killed_ms, resumed_ms));
    }
    check_job(fleet, &job, SHARDS, &model, &texts)?;
    for (what, leader, killed_ms, resumed_ms) in kills {
        let (gap, again) =
            longest_gap(fleet, &job, killed_ms.saturating_sub(2_000), resumed_ms).await?;
        eprintln!(
            "longest gap in done events around the kill of {leader} ({what} leader): {:.2} s \
             ({again} shards done on a later delivery meanwhile)",
            gap as f64 / 1000.0
        );
    }
    eprintln!(
        "{SHARDS} shards done, each output once; {} redeliveries",
        redeliveries(fleet, &job).await?
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn job_survives_a_rolling_restart() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut fleet = r3_fleet().await?;
    let r = rolling_restart(&mut fleet).await;
    fleet.explain(r)
}

async fn rolling_restart(fleet: &mut Fleet) -> Result<()> {
    const SHARDS: usize = 1_500;
    let job = "rolling".to_owned();
    let (model, texts) = slow_job(fleet, SHARDS, &job)?;
    wait_done(fleet, &job, 100, Duration::from_secs(120)).await?;
    for name in ["n1", "n2", "n3"] {
        let started = Instant::now();
        let before = done(fleet, &job);
        {
            // As an operator restarts a server: SIGTERM, wait for it to exit.
            let node = fleet.node(name)?;
            node.proc.signal(nix::sys::signal::Signal::SIGTERM)?;
            node.proc.wait_timeout(Duration::from_secs(30))?;
            node.start_again()?;
        }
        wait_current(fleet, Duration::from_secs(60)).await?;
        eprintln!(
            "{name} restarted and current in {:.1} s ({before} of {SHARDS} shards done before)",
            started.elapsed().as_secs_f64()
        );
        // Shards keep flowing through the restarted server before the next goes.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    assert!(
        done(fleet, &job) < SHARDS as u64,
        "the job ended before the rolling restart did; make it longer"
    );
    check_job(fleet, &job, SHARDS, &model, &texts)?;
    eprintln!(
        "rolling restart: {SHARDS} shards done, each output once; {} redeliveries",
        redeliveries(fleet, &job).await?
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn job_survives_leader_step_downs() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut fleet = r3_fleet().await?;
    let r = step_downs(&mut fleet).await;
    fleet.explain(r)
}

async fn step_downs(fleet: &mut Fleet) -> Result<()> {
    const SHARDS: usize = 800;
    let job = "stepdown".to_owned();
    let (model, texts) = slow_job(fleet, SHARDS, &job)?;
    let client = fleet.client().await?;
    let subjects = [
        format!("$JS.API.STREAM.LEADER.STEPDOWN.{WORK_STREAM}"),
        format!(
            "$JS.API.CONSUMER.LEADER.STEPDOWN.{WORK_STREAM}.{}",
            job_consumer(&job)?
        ),
        format!(
            "$JS.API.STREAM.LEADER.STEPDOWN.{}",
            minions_schemas::streams::EVENTS_STREAM
        ),
    ];
    let mut fired = 0usize;
    let mut accepted = 0usize;
    while done(fleet, &job) < SHARDS as u64 * 9 / 10 && fired < 30 {
        let subject = subjects[fired % subjects.len()].clone();
        fired += 1;
        match tokio::time::timeout(
            Duration::from_secs(5),
            client.request(subject.clone(), bytes::Bytes::new()),
        )
        .await
        {
            Ok(Ok(reply)) => {
                let text = String::from_utf8_lossy(&reply.payload).into_owned();
                if text.contains("\"success\":true") {
                    accepted += 1;
                } else {
                    eprintln!("{subject}: {text}");
                }
            }
            Ok(Err(e)) => eprintln!("{subject}: {e}"),
            Err(_) => eprintln!("{subject}: no answer within 5 s"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!(
        "{fired} step-down requests fired ({accepted} accepted) with {} of {SHARDS} shards done",
        done(fleet, &job)
    );
    assert!(accepted >= 3, "too few step-downs took effect: {accepted}");
    check_job(fleet, &job, SHARDS, &model, &texts)?;
    eprintln!(
        "step-downs: {SHARDS} shards done, each output once; {} redeliveries",
        redeliveries(fleet, &job).await?
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_worker_shard_runs_elsewhere_on_the_cluster() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut fleet = r3_fleet().await?;
    let r = worker_failover(&mut fleet).await;
    fleet.explain(r)
}

async fn worker_failover(fleet: &mut Fleet) -> Result<()> {
    let shard = fleet
        .worker_failover("kill9", 1, "on the cluster: ")
        .await?;
    check_job(fleet, &shard.job, 1, &shard.model, &shard.texts)
}

/// The work-stream consumer of job `job`.
fn job_consumer(job: &str) -> std::result::Result<String, minions_schemas::IdError> {
    Ok(minions_schemas::scheduling::job_consumer(
        &minions_schemas::JobId::new(job)?,
    ))
}
