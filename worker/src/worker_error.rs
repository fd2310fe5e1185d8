//! Why a worker stops before its shutdown asked it to: it could not start
//! (NATS, the store, the streams, the device), its canary failed, or its
//! identity does not match its machine name.

use minions_endpoints::{nats, store};

/// Why a worker could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// NATS is unreachable, too old, or lacks JetStream.
    #[error(transparent)]
    Nats(#[from] nats::NatsConnectError),
    /// The store URL is wrong.
    #[error(transparent)]
    Store(#[from] store::StoreUrlError),
    /// The streams or the work consumer could not be set up.
    #[error(transparent)]
    Streams(#[from] minions_endpoints::streams::EnsureError),
    /// The compute device could not be opened.
    #[error("cannot open compute device: {0}")]
    Device(#[from] candle_core::Error),
    /// The canary shard gave wrong answers on this machine (or could not
    /// run): its kernels are not trusted with real work.
    #[error(
        "this machine failed its canary, judged by {by}: {detail}. Its build, device or kernel path gives wrong answers, so it pulls no work. Check it with `minions-worker doctor` (a driver, a build, MINIONS_CPU_PATH); where a watchdog judged it, machine {machine:?} is quarantined too, until `minions worker release {machine}` once it is fixed"
    )]
    Canary {
        /// Who judged: a watchdog's name, or this worker.
        by: String,
        /// Which answer was wrong, and how.
        detail: String,
        /// The machine.
        machine: String,
    },
    /// The NATS identity may not publish this worker's heartbeats: it was
    /// issued for another machine name.
    #[error(
        "the NATS server refused this worker's heartbeats on {subject}: its identity was issued for another machine name (run it with the --name given to `minions admin add-worker`, here {name:?} was used)"
    )]
    Identity {
        /// The refused subject.
        subject: String,
        /// The name the worker ran with.
        name: String,
    },
}
