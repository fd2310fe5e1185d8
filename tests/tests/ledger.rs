//! The usage ledger, in a real PostgreSQL, written by two watchdogs at once
//! while a 2,000-shard job runs on two workers: one worker is SIGKILLed,
//! one watchdog restarted, and PostgreSQL stopped for 30 s. The job does
//! not notice the outage; the ledger catches up from the events stream and
//! holds every shard done exactly once, the killed delivery as a failed
//! attempt, and device time that `minions usage --by worker` sums to the
//! job's device time from the events, within 1 %.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use minions_schemas::messages::EventKind;
use minions_tests::{Fleet, PgServer, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

const SHARDS: u32 = 2_000;

#[tokio::test(flavor = "multi_thread")]
async fn ledger_counts_every_shard_once_through_a_kill_a_restart_and_an_outage() -> Result<()> {
    let mut pg = PgServer::start()?;
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet, &mut pg).await;
    fleet.explain(r)
}

fn done_count(fleet: &Fleet, job: &str) -> Result<u64> {
    let out = fleet.cli(&["status", job, "--json"])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v["done"].as_u64().unwrap_or(0))
}

/// Waits until the job has at least `n` shards done.
async fn wait_done_at_least(fleet: &Fleet, job: &str, n: u64) -> Result<u64> {
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let d = done_count(fleet, job)?;
        if d >= n {
            return Ok(d);
        }
        if Instant::now() > until {
            return Err(format!(
                "{job}: only {d} shards done, waited for {n}\n{}",
                fleet.logs()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGKILLs the first worker at a moment when it is running a shard: it is
/// paused, and killed if its last event is a start, else let go and tried
/// again.
async fn kill_mid_shard(fleet: &mut Fleet, job: &str) -> Result<()> {
    use nix::sys::signal::Signal;
    for _ in 0..100 {
        fleet.workers[0].signal(Signal::SIGSTOP)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let last = fleet
            .events(job)
            .await?
            .into_iter()
            .rfind(|e| e.worker.as_str().starts_with("w1-"));
        if last.is_some_and(|e| matches!(e.kind, EventKind::Started)) {
            fleet.workers[0].kill();
            return Ok(());
        }
        fleet.workers[0].signal(Signal::SIGCONT)?;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    Err("the first worker was never caught mid-shard".into())
}

async fn scenario(fleet: &mut Fleet, pg: &mut PgServer) -> Result<()> {
    let url = pg.url();
    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, SHARDS as usize)?;
    fleet.add_watchdog(&["--ledger", &url])?;
    fleet.add_watchdog(&["--ledger", &url])?;
    fleet.add_worker(&["--slots", "1"])?;
    fleet.add_worker(&["--slots", "1"])?;
    let job = fleet.submit("tiny", &input, 1, "ledger")?;
    // An operator action, on record, reaches the ledger's actions table.
    fleet.cli(&["team", "set", "ledger", "--weight", "2"])?;

    // A worker is killed mid-shard and replaced.
    wait_done_at_least(fleet, &job, 300).await?;
    kill_mid_shard(fleet, &job).await?;
    let killed = "w1-";
    fleet.add_worker(&["--slots", "1"])?;
    // A watchdog is killed and started again.
    wait_done_at_least(fleet, &job, 700).await?;
    fleet.watchdogs[0].kill();
    fleet.add_watchdog(&["--ledger", &url])?;
    // PostgreSQL is down for 30 s; the job goes on.
    let before = wait_done_at_least(fleet, &job, 1_000).await?;
    pg.stop()?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = done_count(fleet, &job)? - before;
    pg.start_again()?;
    eprintln!("PostgreSQL down for 30 s: {during} shards done meanwhile");
    assert!(during > 0, "the job stopped while PostgreSQL was down");

    let status = fleet.wait_job(&job, Duration::from_secs(300))?;
    assert_eq!(status["done"], SHARDS, "{status}");

    // The ledger catches up.
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let caught_up = Instant::now();
    loop {
        let row = client
            .query_opt(
                "SELECT state, shards_done FROM jobs WHERE job = $1",
                &[&job],
            )
            .await?;
        let state: Option<(String, i64)> = row.map(|r| (r.get(0), r.get(1)));
        if state.as_ref().is_some_and(|s| s.0 == "done") {
            eprintln!(
                "ledger: job done in the ledger {:.1} s after the job finished",
                caught_up.elapsed().as_secs_f64()
            );
            break;
        }
        if caught_up.elapsed() > Duration::from_secs(60) {
            return Err(format!("the ledger did not catch up: {state:?}\n{}", fleet.logs()).into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // What the events stream says.
    let events = fleet.events(&job).await?;
    let mut deliveries = BTreeSet::new();
    let mut done_events = 0i64;
    let mut started_at = std::collections::HashMap::new();
    let mut busy_ms = 0u64;
    for e in &events {
        let key = (e.shard, e.attempt, e.worker.to_string());
        match &e.kind {
            EventKind::Started => {
                started_at.insert(key.clone(), e.at_ms);
                deliveries.insert(key);
            }
            EventKind::Done { duration_ms, .. } => {
                done_events += 1;
                busy_ms += duration_ms;
                deliveries.insert(key);
            }
            EventKind::Failed { .. } | EventKind::HandedBack { .. } => {
                if let Some(s) = started_at.get(&key) {
                    busy_ms += e.at_ms.saturating_sub(*s);
                }
                deliveries.insert(key);
            }
            _ => {}
        }
    }

    let one = |sql: &'static str| {
        let client = &client;
        let job = job.clone();
        async move {
            let r = client.query_one(sql, &[&job]).await?;
            Ok::<i64, tokio_postgres::Error>(r.get(0))
        }
    };
    let shards_done =
        one("SELECT count(*) FROM shards WHERE job = $1 AND outcome = 'done'").await?;
    let job_done = one("SELECT shards_done FROM jobs WHERE job = $1").await?;
    let job_failed = one("SELECT shards_failed FROM jobs WHERE job = $1").await?;
    let attempts = one("SELECT count(*) FROM attempts WHERE job = $1").await?;
    let attempts_done =
        one("SELECT count(*) FROM attempts WHERE job = $1 AND outcome IN ('done', 'duplicate')")
            .await?;
    let lost = client
        .query(
            "SELECT worker, reason FROM attempts WHERE job = $1 AND outcome = 'failed'",
            &[&job],
        )
        .await?;
    let job_busy = one("SELECT busy_ms FROM jobs WHERE job = $1").await?;
    eprintln!(
        "ledger: {shards_done} shards done (job row {job_done} done, {job_failed} failed), \
         {attempts} deliveries ({} in the events), {attempts_done} done deliveries ({done_events} done events), \
         {} failed deliveries, device time {job_busy} ms (events: {busy_ms} ms)",
        deliveries.len(),
        lost.len()
    );
    assert_eq!(shards_done, i64::from(SHARDS));
    assert_eq!(job_done, i64::from(SHARDS));
    assert_eq!(job_failed, 0);
    assert_eq!(
        attempts,
        deliveries.len() as i64,
        "a delivery counted twice or missed"
    );
    assert_eq!(attempts_done, done_events);
    assert_eq!(job_busy, busy_ms as i64);
    let killed_rows: Vec<String> = lost
        .iter()
        .filter(|r| r.get::<_, String>(0).starts_with(killed))
        .map(|r| r.get::<_, Option<String>>(1).unwrap_or_default())
        .collect();
    let last_of_killed: Vec<String> = client
        .query(
            "SELECT shard, attempt, worker, outcome, reason FROM attempts
             WHERE job = $1 AND worker LIKE 'w1-%' ORDER BY started DESC NULLS FIRST LIMIT 3",
            &[&job],
        )
        .await?
        .iter()
        .map(|r| {
            format!(
                "shard {} attempt {} {} {} {:?}",
                r.get::<_, i64>(0),
                r.get::<_, i64>(1),
                r.get::<_, String>(2),
                r.get::<_, String>(3),
                r.get::<_, Option<String>>(4)
            )
        })
        .collect();
    eprintln!(
        "the killed worker's failed deliveries in the ledger: {killed_rows:?}; its last: {last_of_killed:?}"
    );
    assert!(
        killed_rows.iter().any(|r| r.contains("worker was lost")),
        "the killed delivery is not a failed attempt: {killed_rows:?}"
    );

    // `minions usage --by worker` sums to the job's device time.
    let out = fleet.cli(&[
        "usage", "--ledger", &url, "--since", "1d", "--by", "worker", "--json",
    ])?;
    let rows: serde_json::Value = serde_json::from_str(&out)?;
    let hours: f64 = rows
        .as_array()
        .ok_or("usage --json is not an array")?
        .iter()
        .filter_map(|r| r["device_hours"].as_f64())
        .sum();
    let usage_ms = hours * 3.6e6;
    let off = (usage_ms - busy_ms as f64).abs() / busy_ms.max(1) as f64;
    eprintln!(
        "minions usage --by worker: {usage_ms:.0} ms of device time over {} workers; the job's events: {busy_ms} ms ({:.3} % apart)",
        rows.as_array().map_or(0, Vec::len),
        off * 100.0
    );
    assert!(off <= 0.01, "usage {usage_ms} ms, events {busy_ms} ms");
    eprintln!(
        "{}",
        fleet.cli(&["usage", "--ledger", &url, "--since", "1d", "--by", "worker"])?
    );

    // Energy: measured where this machine has RAPL, estimated otherwise.
    let rapl = std::path::Path::new("/sys/class/powercap/intel-rapl:0/energy_uj");
    let readable = std::fs::read_to_string(rapl).is_ok();
    let sources: Vec<String> = client
        .query("SELECT DISTINCT energy_source FROM workers", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let measured = one(
        "SELECT count(*) FROM attempts WHERE job = $1 AND energy_measured AND outcome IN ('done', 'duplicate')",
    )
    .await?;
    let estimated = one(
        "SELECT count(*) FROM attempts WHERE job = $1 AND NOT energy_measured AND outcome IN ('done', 'duplicate')",
    )
    .await?;
    if readable {
        eprintln!(
            "energy: RAPL is readable here; sources {sources:?}, {measured} done deliveries measured"
        );
        assert_eq!(measured, attempts_done);
    } else {
        eprintln!(
            "energy: no readable RAPL here ({} absent or not readable): estimated; sources {sources:?}, {estimated} done deliveries estimated",
            rapl.display()
        );
        assert_eq!(estimated, attempts_done);
        assert!(sources.iter().any(|s| s == "estimate"), "{sources:?}");
    }
    let chips: Vec<(String, String, i64)> = client
        .query(
            "SELECT worker, chip, memory_lent_mb FROM workers ORDER BY worker",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    eprintln!("workers in the ledger (worker, chip, memory lent MB): {chips:?}");
    let live: Vec<_> = chips.iter().filter(|c| !c.0.starts_with(killed)).collect();
    assert!(
        !live.is_empty() && live.iter().all(|c| !c.1.is_empty() && c.2 > 0),
        "{chips:?}"
    );

    let actions: Vec<(String, String, String)> = client
        .query("SELECT via, action, target FROM actions ORDER BY seq", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    eprintln!("actions in the ledger (via, action, target): {actions:?}");
    assert_eq!(
        actions,
        [("cli".to_owned(), "team_set".to_owned(), "ledger".to_owned())]
    );

    // A live watchdog's dashboard shows the usage by team and worker, and
    // its /metrics a ledger cursor at the events stream's end.
    let base = fleet.dashboards.last().ok_or("no dashboard")?.clone();
    let (code, page) = minions_tests::web::get(&format!("{base}/usage"))?;
    assert_eq!(code, 200, "{page}");
    let workers = client
        .query("SELECT DISTINCT worker FROM usage_hourly", &[])
        .await?;
    assert!(!workers.is_empty(), "no worker in usage_hourly");
    for name in std::iter::once("default".to_owned()).chain(workers.iter().map(|r| r.get(0))) {
        assert!(
            page.contains(&format!("<td>{name}</td>")),
            "{name} not on /usage:\n{page}"
        );
    }
    let js = async_nats::jetstream::new(fleet.client().await?);
    let last = js
        .get_stream(minions_schemas::streams::EVENTS_STREAM)
        .await?
        .info()
        .await?
        .state
        .last_sequence;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = minions_tests::web::get(&format!("{base}/metrics"))?;
        let cursor = metrics
            .lines()
            .find_map(|l| l.strip_prefix("minions_ledger_cursor "))
            .and_then(|v| v.parse::<f64>().ok());
        if cursor.is_some_and(|c| c >= last as f64) {
            eprintln!(
                "dashboard: /usage lists {} workers; ledger cursor {cursor:?}, stream's last {last}",
                workers.len()
            );
            break;
        }
        if Instant::now() > until {
            return Err(
                format!("minions_ledger_cursor {cursor:?} below {last}:\n{metrics}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
