//! The tracker's one queue of work that folded events asked for and that
//! could not be done yet because the store or NATS failed: dead-letter
//! records, output checks, judgements, check rounds and quarantines. Each
//! tick [`super::Tracker::retry`] takes the whole queue and tries each
//! entry again, in the order they were queued (dead-letter records only
//! before a checkpoint); what fails again goes back.
//!
//! Only dead-letter records are saved with a checkpoint (their events are
//! folded: a restart would not ask for them again). Any other entry stands
//! for an event not fully acted on, so no checkpoint is written while one
//! waits ([`Retries::unfinished`]): a restart folds that event again.

use minions_schemas::JobId;
use minions_schemas::messages::ShardEvent;

use super::PendingDead;

/// One piece of work waiting to be tried again.
#[derive(Debug, Clone)]
pub(crate) enum Retry {
    /// A dead-letter record not written yet.
    DeadLetter(PendingDead),
    /// A worker's done event whose output check could not be finished,
    /// or whose rejection could not be published.
    CheckOutput(ShardEvent),
    /// A check run's event whose judgement could not be finished or acted
    /// on.
    Judge(ShardEvent),
    /// A check round that could not be queued: the machines it avoids.
    QueueRound {
        /// The job.
        job: JobId,
        /// Its shard.
        shard: u32,
        /// The round.
        round: u8,
        /// Machines that must not run it.
        avoid: Vec<String>,
    },
    /// A machine whose quarantine could not be written.
    Quarantine(String),
}

impl Retry {
    /// The job it is about (None: a machine's quarantine).
    fn job(&self) -> Option<&JobId> {
        match self {
            Retry::DeadLetter(p) => Some(&p.job),
            Retry::CheckOutput(e) | Retry::Judge(e) => Some(&e.job),
            Retry::QueueRound { job, .. } => Some(job),
            Retry::Quarantine(_) => None,
        }
    }
}

/// The queue; see the module's documentation.
#[derive(Debug, Default)]
pub(crate) struct Retries(Vec<Retry>);

impl Retries {
    /// A queue holding the dead-letter records a checkpoint saved.
    pub(crate) fn restored(dead: Vec<PendingDead>) -> Self {
        Self(dead.into_iter().map(Retry::DeadLetter).collect())
    }

    /// Queues `r` behind what waits.
    pub(crate) fn push(&mut self, r: Retry) {
        self.0.push(r);
    }

    /// Takes everything queued, oldest first.
    pub(crate) fn take(&mut self) -> Vec<Retry> {
        std::mem::take(&mut self.0)
    }

    /// The dead-letter records waiting (what a checkpoint saves).
    pub(crate) fn dead_letters(&self) -> Vec<PendingDead> {
        self.0
            .iter()
            .filter_map(|r| match r {
                Retry::DeadLetter(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    /// Whether anything about `job` waits (its detail must stay).
    pub(crate) fn holds(&self, job: &JobId) -> bool {
        self.0.iter().any(|r| r.job() == Some(job))
    }

    /// How many entries stand for events not fully acted on: (output
    /// checks, judgements, rounds and quarantines).
    pub(crate) fn unfinished(&self) -> (usize, usize) {
        self.0.iter().fold((0, 0), |(c, j), r| match r {
            Retry::DeadLetter(_) => (c, j),
            Retry::CheckOutput(_) => (c + 1, j),
            _ => (c, j + 1),
        })
    }

    /// Whether an output check waits (a done event not counted yet).
    pub(crate) fn checks_wait(&self) -> bool {
        self.unfinished().0 > 0
    }

    /// Forgets every dead-letter record (tests of what the store holds).
    #[cfg(test)]
    pub(crate) fn clear_dead_letters(&mut self) {
        self.0.retain(|r| !matches!(r, Retry::DeadLetter(_)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::IdError;

    fn dead(job: &str, shard: u32) -> Result<PendingDead, IdError> {
        Ok(PendingDead {
            job: JobId::new(job)?,
            shard,
            reason: "bad".into(),
            attempt: 1,
            stream_seq: 0,
        })
    }

    #[test]
    fn only_dead_letters_are_saved_and_the_rest_counts_as_unfinished() -> Result<(), IdError> {
        let mut q = Retries::restored(vec![dead("a", 1)?]);
        q.push(Retry::Quarantine("m1".into()));
        q.push(Retry::QueueRound {
            job: JobId::new("b")?,
            shard: 2,
            round: 1,
            avoid: vec![],
        });
        assert_eq!(q.dead_letters(), vec![dead("a", 1)?]);
        assert_eq!(q.unfinished(), (0, 2));
        assert!(!q.checks_wait());
        assert!(q.holds(&JobId::new("a")?) && q.holds(&JobId::new("b")?));
        assert!(!q.holds(&JobId::new("c")?));
        let all = q.take();
        assert_eq!(all.len(), 3);
        assert!(matches!(all[0], Retry::DeadLetter(_)));
        assert_eq!(q.unfinished(), (0, 0));
        Ok(())
    }
}
