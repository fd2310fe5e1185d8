//! Chaos: a 2,000-shard job on 4 workers while a loop kills (SIGKILL),
//! pauses (SIGSTOP/SIGCONT) and restarts random workers every few seconds
//! and restarts nats-server once. Every shard is done exactly once in the
//! outputs, and the outputs equal an undisturbed run.

use std::time::{Duration, Instant};

use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;
use nix::sys::signal::Signal;

/// A small deterministic generator (xorshift), seeded from the clock and printed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn chaos_loses_nothing_and_duplicates_nothing() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut rng = Rng(seed);
    let model = fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 30_000)?;
    fleet.add_watchdog(&[])?;
    for _ in 0..4 {
        fleet.add_worker(&["--slots", "1"])?;
    }
    let started = Instant::now();
    let job = fleet.submit("tiny", &input, 15, "chaos")?;
    let (mut kills, mut pauses, mut restarts, mut nats_restarts) = (0, 0, 0, 0);
    let mut paused: Option<(usize, Instant)> = None;
    let mut next_action = Instant::now() + Duration::from_secs(1);
    loop {
        if let Some((i, since)) = paused
            && since.elapsed() > Duration::from_secs(5)
        {
            fleet.workers[i].signal(Signal::SIGCONT)?;
            paused = None;
        }
        if Instant::now() >= next_action {
            let i = rng.next(4);
            if paused.map(|(p, _)| p) != Some(i) {
                // Each kind of disruption at least once, then at random.
                let action = if kills + pauses + restarts < 3 {
                    kills + pauses + restarts
                } else {
                    rng.next(3)
                };
                match action {
                    0 => {
                        fleet.workers[i].kill();
                        let extra = ["--slots", "1"];
                        fleet.add_worker(&extra)?;
                        let fresh = fleet.workers.pop().ok_or("no worker")?;
                        fleet.workers[i] = fresh;
                        kills += 1;
                    }
                    1 if paused.is_none() => {
                        fleet.workers[i].signal(Signal::SIGSTOP)?;
                        paused = Some((i, Instant::now()));
                        pauses += 1;
                    }
                    _ => {
                        fleet.workers[i].signal(Signal::SIGTERM)?;
                        let _ = fleet.workers[i].wait_timeout(Duration::from_secs(40));
                        let extra = ["--slots", "1"];
                        fleet.add_worker(&extra)?;
                        let fresh = fleet.workers.pop().ok_or("no worker")?;
                        fleet.workers[i] = fresh;
                        restarts += 1;
                    }
                }
            }
            if nats_restarts == 0 && kills + pauses + restarts >= 3 {
                fleet.nats.restart()?;
                nats_restarts += 1;
            }
            next_action = Instant::now() + Duration::from_millis(800 + rng.next(1200) as u64);
        }
        let s = match fleet.cli(&["status", &job, "--json"]) {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        let v: serde_json::Value = serde_json::from_str(&s)?;
        if v["state"] == "done" {
            break;
        }
        assert!(v["state"] != "failed", "{s}");
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "chaos job not done: {s}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if let Some((i, _)) = paused {
        fleet.workers[i].signal(Signal::SIGCONT)?;
    }
    let status = fleet.wait_job(&job, Duration::from_secs(60))?;
    assert_eq!(
        fleet.output_count(&job)?,
        2000,
        "every shard's output exactly once"
    );
    fleet.check_outputs(&job, &model, &texts)?;
    eprintln!(
        "chaos (seed {seed}): 2000 shards done once each; {kills} kills, {pauses} pauses, {restarts} restarts, \
         {nats_restarts} nats-server restart, {} redeliveries, {:.1} s",
        status["redeliveries"],
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
