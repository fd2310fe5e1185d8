//! The worker's energy meter: one task that reads the chosen meter about
//! once a second, and the bookkeeping that gives each delivery its share.
//!
//! Every sample, and every delivery's begin and end, reads the meter's
//! cumulative counter and hands the energy since the last read to the
//! [`Ledger`], which splits it evenly between the deliveries in flight (so
//! a delivery shorter than one sample gets its part of the partial
//! interval). The running total and the last second's power feed the
//! heartbeat. A meter that keeps failing is replaced by the estimate for
//! the rest of the run (its deliveries then report `measured: false`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use minions_schemas::messages::{Energy, PowerReading};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::lock::lock;

use super::choose::{Choice, Meter, choose};
use super::error::EnergyError;
use super::estimate::Estimate;
use super::ledger::Ledger;
use super::nvidia::NvidiaSmi;
use super::powermetrics::Powermetrics;
use super::rapl::{POWERCAP_ROOT, Rapl};
use super::source::Source;
use super::track::{Reading, Track};

/// How often the meter is read for the heartbeat's power.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// How often `nvidia-smi` is run at most.
pub const NVIDIA_EVERY: Duration = Duration::from_secs(3);

/// Consecutive failed reads after which the estimate takes over.
const MAX_FAILURES: u32 = 3;

/// How far a sampled meter's counter is carried forward past its last
/// sample: a little more than the time between samples.
const NVIDIA_HORIZON: Duration = Duration::from_secs(5);
const POWERMETRICS_HORIZON: Duration = Duration::from_secs(3);

/// One delivery of a shard: job, shard and delivery count (a redelivery is
/// another delivery, with its own share).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryKey {
    /// The job.
    pub job: String,
    /// The shard.
    pub shard: u32,
    /// Which delivery (1 = first).
    pub attempt: u64,
}

impl DeliveryKey {
    /// The key of delivery `attempt` of `job`'s `shard`.
    pub fn new(job: impl Into<String>, shard: u32, attempt: u64) -> Self {
        Self {
            job: job.into(),
            shard,
            attempt,
        }
    }
}

/// The meter as a counter readable at any moment.
#[derive(Debug)]
enum Counter {
    Rapl(Rapl),
    /// A sampled meter, fed by the task.
    Tracked(Source, Track),
    Estimate(Estimate),
}

impl Counter {
    fn source(&self) -> Source {
        match self {
            Self::Rapl(_) => Source::Rapl,
            Self::Tracked(s, _) => *s,
            Self::Estimate(_) => Source::Estimate,
        }
    }
}

/// What the task feeds the counter from.
enum Feed {
    None,
    Nvidia(NvidiaSmi),
    Powermetrics(Box<Powermetrics>),
}

#[derive(Debug)]
struct State {
    counter: Counter,
    ledger: Ledger<DeliveryKey>,
    /// The last periodic sample: when, and the total then.
    last_tick: Option<(Instant, f64)>,
    /// Mean power between the last two periodic samples.
    watts: Option<f64>,
    /// Consecutive failed reads.
    failures: u32,
    /// The estimate's figure, should the meter fail.
    fallback_watts: f64,
}

impl State {
    /// Reads the counter and gives the energy since the last read to the
    /// open deliveries; false when the read failed (nothing is counted; the
    /// next good read counts it all).
    fn settle(&mut self, now: Instant) -> bool {
        let busy = self.ledger.busy();
        let source = self.counter.source();
        let read = match &mut self.counter {
            Counter::Rapl(r) => r.read().map(Some),
            Counter::Tracked(_, t) => Ok(t.read(now)),
            Counter::Estimate(e) => Ok(Some(e.read(now, busy))),
        };
        match read {
            Ok(Some(joules)) => {
                if matches!(self.counter, Counter::Rapl(_)) {
                    self.failures = 0;
                }
                self.ledger.advance(joules, source.measured());
                true
            }
            Ok(None) => false,
            Err(e) => {
                self.failed(&e, now);
                false
            }
        }
    }

    fn failed(&mut self, e: &EnergyError, now: Instant) {
        self.failures += 1;
        if self.failures == 1 {
            tracing::warn!(source = %self.counter.source(), error = %e, "energy meter read failed");
        }
        if self.failures >= MAX_FAILURES {
            self.degrade(now, &e.to_string());
        }
    }

    /// Replaces the meter with the estimate for the rest of the run.
    fn degrade(&mut self, now: Instant, reason: &str) {
        if matches!(self.counter, Counter::Estimate(_)) {
            return;
        }
        tracing::warn!(source = %self.counter.source(), reason, watts = self.fallback_watts,
            "energy meter stopped working; estimating from now on");
        let mut e = Estimate::new(self.fallback_watts);
        let start = e.read(now, false);
        self.counter = Counter::Estimate(e);
        self.ledger.rebase(start);
        self.failures = 0;
    }
}

/// The worker's energy meter: started once by the worker's run loop,
/// shared by its slots (which [`EnergyMeter::begin`] and
/// [`EnergyMeter::end`] each delivery) and its heartbeat (which reads
/// [`EnergyMeter::reading`]).
#[derive(Debug)]
pub struct EnergyMeter {
    choice: Choice,
    state: Mutex<State>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl EnergyMeter {
    /// Chooses the meter for `device` (see [`super::describe`]), logs the
    /// choice and why, and starts the sampling task, which runs until
    /// `stop` is cancelled (then [`EnergyMeter::join`] waits for it).
    /// `power_watts` is `--power-watts`, the estimate's figure.
    pub async fn start(
        device: &str,
        power_watts: Option<f64>,
        stop: CancellationToken,
    ) -> Arc<Self> {
        Self::start_with(device, power_watts, Path::new(POWERCAP_ROOT), stop).await
    }

    /// [`EnergyMeter::start`] with RAPL looked for under `powercap`.
    pub(crate) async fn start_with(
        device: &str,
        power_watts: Option<f64>,
        powercap: &Path,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let (choice, meter) = choose(device, power_watts, powercap).await;
        for p in &choice.passed_over {
            if p.needs_permission {
                tracing::warn!(meter = %p.source, reason = %p.reason,
                    "RAPL energy counters need root: run the worker as root, or make them readable with a udev rule or chmod");
            } else {
                tracing::debug!(meter = %p.source, reason = %p.reason, "energy meter not used");
            }
        }
        tracing::info!(source = %choice.source, measured = choice.source.measured(),
            reason = %choice.reason, "energy meter chosen");
        let now = Instant::now();
        let (counter, feed) = match meter {
            Meter::Rapl(r) => (Counter::Rapl(r), Feed::None),
            Meter::Nvidia(smi, first) => (
                tracked(Source::NvidiaSmi, NVIDIA_HORIZON, first),
                Feed::Nvidia(smi),
            ),
            Meter::Powermetrics(pm, first) => (
                tracked(Source::Powermetrics, POWERMETRICS_HORIZON, first),
                Feed::Powermetrics(pm),
            ),
            Meter::Estimate => (
                Counter::Estimate(Estimate::new(choice.model.watts)),
                Feed::None,
            ),
        };
        let meter = Arc::new(Self::new(choice, counter, now));
        let task = tokio::spawn(run(meter.clone(), feed, stop));
        *lock(&meter.task) = Some(task);
        meter
    }

    fn new(choice: Choice, counter: Counter, now: Instant) -> Self {
        let mut state = State {
            counter,
            ledger: Ledger::new(),
            last_tick: None,
            watts: None,
            failures: 0,
            fallback_watts: choice.model.watts,
        };
        if state.settle(now) {
            state.last_tick = Some((now, state.ledger.total()));
        }
        Self {
            choice,
            state: Mutex::new(state),
            task: Mutex::new(None),
        }
    }

    /// The meter chosen at start, and why.
    pub fn choice(&self) -> &Choice {
        &self.choice
    }

    /// The meter read now: the one chosen, or the estimate once that
    /// stopped working.
    pub fn source(&self) -> Source {
        lock(&self.state).counter.source()
    }

    /// A delivery starts: from now it shares the machine's energy.
    pub fn begin(&self, key: DeliveryKey) {
        self.begin_at(key, Instant::now());
    }

    /// A delivery ends: its share up to now (the meter is read once more),
    /// as its events report it. `None` when it was not begun, or no meter
    /// reading has been had yet.
    pub fn end(&self, key: &DeliveryKey) -> Option<Energy> {
        self.end_at(key, Instant::now())
    }

    /// The machine's power over the last sample and its energy since the
    /// worker started, for the heartbeat; `None` before the first sample.
    pub fn reading(&self) -> Option<PowerReading> {
        let st = lock(&self.state);
        let source = st.counter.source();
        Some(PowerReading {
            watts: st.watts?,
            joules: st.ledger.total(),
            measured: source.measured(),
            source: source.name().to_owned(),
        })
    }

    /// Waits for the sampling task to end (after `stop` was cancelled).
    pub async fn join(&self) {
        let task = lock(&self.task).take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            tracing::warn!(error = %e, "energy sampler ended abnormally");
        }
    }

    fn begin_at(&self, key: DeliveryKey, now: Instant) {
        let mut st = lock(&self.state);
        st.settle(now);
        st.ledger.open(key);
    }

    fn end_at(&self, key: &DeliveryKey, now: Instant) -> Option<Energy> {
        let mut st = lock(&self.state);
        st.settle(now);
        let share = st.ledger.close(key)?;
        if !st.ledger.started() {
            return None;
        }
        let source = st.counter.source();
        let measured = share.measured && source.measured();
        Some(Energy {
            joules: share.joules,
            measured,
            source: if measured { source } else { Source::Estimate }
                .name()
                .to_owned(),
        })
    }

    /// The periodic sample: settles the open deliveries and updates the
    /// heartbeat's power.
    fn tick_at(&self, now: Instant) {
        let mut st = lock(&self.state);
        if !st.settle(now) {
            return;
        }
        let total = st.ledger.total();
        if let Some((at, before)) = st.last_tick {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            if dt > 0.0 {
                st.watts = Some((total - before).max(0.0) / dt);
            }
        }
        st.last_tick = Some((now, total));
    }

    /// A sampled meter's new reading.
    fn feed(&self, r: Reading) {
        let mut st = lock(&self.state);
        if let Counter::Tracked(_, t) = &mut st.counter {
            t.update(r);
            st.failures = 0;
        }
    }

    fn fail(&self, e: &EnergyError, now: Instant) {
        lock(&self.state).failed(e, now);
    }

    fn degrade(&self, now: Instant, reason: &str) {
        lock(&self.state).degrade(now, reason);
    }
}

fn tracked(source: Source, horizon: Duration, first: Reading) -> Counter {
    let mut t = Track::new(horizon);
    t.update(first);
    Counter::Tracked(source, t)
}

/// The next `powermetrics` sample, or never without one.
async fn next_sample(feed: &mut Feed) -> Result<Option<Reading>, EnergyError> {
    match feed {
        Feed::Powermetrics(pm) => pm.next().await,
        _ => std::future::pending().await,
    }
}

/// The sampling task: reads the meter every [`SAMPLE_EVERY`], runs
/// `nvidia-smi` every [`NVIDIA_EVERY`] or takes `powermetrics`' samples as
/// they come, until `stop`; a last read at the end.
async fn run(meter: Arc<EnergyMeter>, mut feed: Feed, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.reset();
    // The choice read `nvidia-smi` once already.
    let mut smi_due = Instant::now() + NVIDIA_EVERY;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                if let Feed::Nvidia(smi) = &mut feed
                    && Instant::now() >= smi_due
                {
                    smi_due = Instant::now() + NVIDIA_EVERY;
                    let sampled = tokio::select! {
                        r = smi.sample() => r,
                        _ = stop.cancelled() => break,
                    };
                    match sampled {
                        Ok(r) => meter.feed(r),
                        Err(e) => meter.fail(&e, Instant::now()),
                    }
                }
                meter.tick_at(Instant::now());
            }
            r = next_sample(&mut feed) => match r {
                Ok(Some(r)) => meter.feed(r),
                Ok(None) => meter.degrade(Instant::now(), "powermetrics ended"),
                Err(e) => meter.degrade(Instant::now(), &e.to_string()),
            },
        }
        if !matches!(feed, Feed::None) && meter.source() == Source::Estimate {
            // The estimate took over: stop feeding (kills powermetrics).
            feed = Feed::None;
        }
    }
    meter.tick_at(Instant::now());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::estimate::PowerModel;

    fn choice(source: Source, watts: f64) -> Choice {
        Choice {
            source,
            reason: "test".into(),
            passed_over: Vec::new(),
            model: PowerModel {
                watts,
                basis: "test".into(),
            },
        }
    }

    fn key(shard: u32) -> DeliveryKey {
        DeliveryKey::new("j1", shard, 1)
    }

    fn joules(e: Option<Energy>) -> f64 {
        e.map_or(f64::NAN, |e| e.joules)
    }

    #[test]
    fn the_estimate_splits_busy_time_evenly() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let m = EnergyMeter::new(
            choice(Source::Estimate, 60.0),
            Counter::Estimate(Estimate::new(60.0)),
            t0,
        );
        // Idle for 10 s: nothing counted.
        m.begin_at(key(0), s(10));
        m.tick_at(s(11)); // shard 0 alone: 60 J
        m.begin_at(key(1), s(12)); // shard 0 alone: 60 J more
        m.begin_at(key(2), s(14)); // 0 and 1: 60 J each
        let e0 = m.end_at(&key(0), s(17)); // 0, 1, 2: 60 J each
        m.tick_at(s(18)); // 1 and 2: 30 J each
        let e1 = m.end_at(&key(1), s(19)); // 30 J each
        let e2 = m.end_at(&key(2), s(19) + Duration::from_millis(500)); // 2 alone: 30 J
        assert!((joules(e0.clone()) - 240.0).abs() < 1e-6, "{e0:?}");
        assert!((joules(e1.clone()) - 180.0).abs() < 1e-6, "{e1:?}");
        assert!((joules(e2.clone()) - 150.0).abs() < 1e-6, "{e2:?}");
        let e0 = e0.unwrap_or_else(|| panic!("no energy"));
        assert!(!e0.measured);
        assert_eq!(e0.source, "estimate");
        // Idle again: the total stays at what the shards used.
        m.tick_at(s(20));
        m.tick_at(s(30));
        let r = m.reading().unwrap_or_else(|| panic!("no reading"));
        assert!((r.joules - 570.0).abs() < 1e-6, "{r:?}");
        assert_eq!(r.watts, 0.0);
        assert!(!r.measured);
        assert_eq!(r.source, "estimate");
        // Unknown deliveries have no share.
        assert_eq!(m.end_at(&key(9), s(31)), None);
    }

    #[test]
    fn a_delivery_shorter_than_a_sample_gets_its_part() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let m = EnergyMeter::new(
            choice(Source::Estimate, 10.0),
            Counter::Estimate(Estimate::new(10.0)),
            t0,
        );
        m.tick_at(ms(1000));
        m.begin_at(key(0), ms(1100));
        m.begin_at(key(1), ms(1200));
        let e1 = m.end_at(&key(1), ms(1300));
        m.tick_at(ms(2000));
        // 0.1 s alone (1 J), 0.1 s with shard 1 (0.5 J), 0.7 s alone (7 J).
        assert!((joules(e1) - 0.5).abs() < 1e-9);
        assert!((joules(m.end_at(&key(0), ms(2000))) - 8.5).abs() < 1e-9);
        let r = m.reading().unwrap_or_else(|| panic!("no reading"));
        assert!((r.watts - 9.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn rapl_energy_is_split_and_idle_energy_counted() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let d = tmp.path().join("intel-rapl:0");
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join("name"), "package-0\n")?;
        std::fs::write(d.join("max_energy_range_uj"), "262143328850\n")?;
        let set = |uj: u64| std::fs::write(d.join("energy_uj"), format!("{uj}\n"));
        set(1_000_000)?;
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let m = EnergyMeter::new(
            choice(Source::Rapl, 10.0),
            Counter::Rapl(Rapl::open(tmp.path())?),
            t0,
        );
        set(6_000_000)?; // 5 J idle
        m.begin_at(key(0), s(1));
        set(16_000_000)?; // 10 J, shard 0 alone
        m.begin_at(key(1), s(2));
        set(36_000_000)?; // 20 J, 10 each
        let e0 = m.end_at(&key(0), s(3));
        set(41_000_000)?; // 5 J, shard 1 alone
        let e1 = m.end_at(&key(1), s(4));
        assert!((joules(e0.clone()) - 20.0).abs() < 1e-9);
        assert!((joules(e1) - 15.0).abs() < 1e-9);
        let e0 = e0.unwrap_or_else(|| panic!("no energy"));
        assert!(e0.measured);
        assert_eq!(e0.source, "rapl");
        m.tick_at(s(5));
        let r = m.reading().unwrap_or_else(|| panic!("no reading"));
        assert!((r.joules - 40.0).abs() < 1e-9);
        assert!((r.watts - 8.0).abs() < 1e-9, "{r:?}");
        assert!(r.measured);

        // The counter becomes unreadable: after a few failures the
        // estimate takes over, and a share that saw it is estimated.
        m.begin_at(key(2), s(6));
        std::fs::write(d.join("energy_uj"), "garbage\n")?;
        for n in 7..10 {
            m.tick_at(s(n));
        }
        assert_eq!(m.source(), Source::Estimate);
        let e2 = m
            .end_at(&key(2), s(11))
            .unwrap_or_else(|| panic!("no energy"));
        assert!(!e2.measured);
        assert_eq!(e2.source, "estimate");
        // 2 s of the estimate's 10 W since it took over at 9 s.
        assert!((e2.joules - 20.0).abs() < 1e-9, "{e2:?}");
        Ok(())
    }

    #[test]
    fn a_sampled_meter_is_carried_between_samples() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let first = Reading {
            at: t0,
            joules: 1000.0,
            watts: 100.0,
        };
        let m = EnergyMeter::new(
            choice(Source::NvidiaSmi, 10.0),
            tracked(Source::NvidiaSmi, NVIDIA_HORIZON, first),
            t0,
        );
        m.begin_at(key(0), s(1)); // counter carried to 1100
        m.feed(Reading {
            at: s(3),
            joules: 1300.0,
            watts: 100.0,
        });
        let e = m
            .end_at(&key(0), s(4))
            .unwrap_or_else(|| panic!("no energy"));
        assert!((e.joules - 300.0).abs() < 1e-9, "{e:?}");
        assert!(e.measured);
        assert_eq!(e.source, "nvidia-smi");
    }

    /// The whole path on a machine without a meter (as the one these tests
    /// were written on): start, the task's samples, begin, end, stop.
    #[tokio::test]
    async fn the_task_samples_the_estimate_until_stopped() -> Result<(), Box<dyn std::error::Error>>
    {
        let tmp = tempfile::tempdir()?;
        let stop = CancellationToken::new();
        let m = EnergyMeter::start_with("cpu", Some(50.0), &tmp.path().join("none"), stop.clone())
            .await;
        if m.choice().source != Source::Estimate {
            return Ok(()); // a Mac running the tests as root
        }
        assert_eq!(m.reading(), None);
        m.begin(key(0));
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let r = m
            .reading()
            .unwrap_or_else(|| panic!("the task took no sample"));
        assert!((r.watts - 50.0).abs() < 5.0, "{r:?}");
        let e = m.end(&key(0)).unwrap_or_else(|| panic!("no energy"));
        assert!(e.joules > 50.0 && e.joules < 100.0, "{e:?}");
        assert!(!e.measured);
        assert_eq!(e.source, "estimate");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(2), m.join()).await?;
        Ok(())
    }
}
