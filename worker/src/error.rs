//! How a shard delivery ends when it does not succeed. The kind decides how
//! the message is settled: see [`Settle`].

use std::time::Duration;

use crate::model::ModelError;

/// How a failed delivery is settled with JetStream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Terminate: never redelivered (bad input, unknown model).
    Term,
    /// Nak with this delay: redelivered, to this or another worker.
    Nak(Duration),
    /// Hand back at once (nak without delay): this worker is stopping or
    /// yielding, the shard itself is fine.
    HandBack,
}

/// Why a shard delivery failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ShardError {
    /// The message or its input can never be processed.
    #[error("{0}")]
    Permanent(String),
    /// A passing failure (store, network, device); retry later.
    #[error("{0}")]
    Transient(String),
    /// This machine cannot run the shard (its model is larger than the memory
    /// the machine lends); another machine may. Retried like a transient
    /// failure, and the slot rests so a larger machine's pull comes first.
    #[error("{0}")]
    WrongMachine(String),
    /// The worker is stopping or yielding; the shard goes back to the queue.
    #[error("worker is stopping; shard handed back")]
    Stopping,
    /// The shard's job was cancelled.
    #[error("job cancelled")]
    Cancelled,
}

impl ShardError {
    /// Chooses how to settle this failure on delivery number `attempt`
    /// (1-based): naks back off exponentially from 1 s up to 30 s, or from
    /// 5 s up to 60 s for a machine too small for the shard's model, so the
    /// shard's deliveries last long enough for a larger machine to take it.
    pub fn settle(&self, attempt: u64) -> Settle {
        match self {
            Self::Permanent(_) | Self::Cancelled => Settle::Term,
            Self::Transient(_) => Settle::Nak(backoff(attempt)),
            Self::WrongMachine(_) => Settle::Nak(wrong_machine_backoff(attempt)),
            Self::Stopping => Settle::HandBack,
        }
    }
}

/// Nak delay for delivery number `attempt` (1-based).
pub fn backoff(attempt: u64) -> Duration {
    let exp = attempt.saturating_sub(1).min(5) as u32;
    Duration::from_secs(1u64 << exp).min(Duration::from_secs(30))
}

/// Nak delay after delivery number `attempt` (1-based) reached a machine too
/// small for the model: 5 s, 10 s, 20 s, 40 s, then 60 s. With the default
/// five deliveries a shard waits 75 s for a larger machine before it fails.
pub fn wrong_machine_backoff(attempt: u64) -> Duration {
    let exp = attempt.saturating_sub(1).min(4) as u32;
    Duration::from_secs(5u64 << exp).min(Duration::from_secs(60))
}

impl From<ModelError> for ShardError {
    fn from(e: ModelError) -> Self {
        if e.is_permanent() {
            Self::Permanent(e.to_string())
        } else if matches!(e, ModelError::TooLarge { .. }) {
            Self::WrongMachine(e.to_string())
        } else {
            Self::Transient(e.to_string())
        }
    }
}

impl From<object_store::Error> for ShardError {
    fn from(e: object_store::Error) -> Self {
        Self::Transient(format!("object store: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_settle() {
        assert_eq!(ShardError::Permanent("x".into()).settle(1), Settle::Term);
        assert_eq!(ShardError::Stopping.settle(3), Settle::HandBack);
        assert_eq!(
            ShardError::WrongMachine("x".into()).settle(2),
            Settle::Nak(Duration::from_secs(10))
        );
        let too_large = ShardError::from(ModelError::TooLarge {
            needs_mb: 10,
            budget_mb: 1,
        });
        assert!(matches!(too_large, ShardError::WrongMachine(_)));
        assert_eq!(
            ShardError::Transient("x".into()).settle(1),
            Settle::Nak(Duration::from_secs(1))
        );
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(50), Duration::from_secs(30));
        assert_eq!(wrong_machine_backoff(1), Duration::from_secs(5));
        assert_eq!(wrong_machine_backoff(50), Duration::from_secs(60));
    }
}
