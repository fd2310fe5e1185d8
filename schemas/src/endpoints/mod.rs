//! How every binary reaches the outside: NATS, object storage, and the
//! signals that ask it to stop.

pub mod config_file;
pub mod exit;
pub mod host;
pub mod ledger;
pub mod logging;
pub mod nats;
pub mod resilient;
pub mod signals;
pub mod snapshot;
pub mod store;
