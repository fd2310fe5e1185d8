//! Command-line flags of `minions-watchdog`.

use clap::Parser;
use minions_schemas::endpoints::nats::DEFAULT_NATS_URL;

use crate::run::WatchdogConfig;

/// Watch a Minions fleet: follow worker heartbeats and keep the registry of
/// who is alive. Run one per fleet.
#[derive(Debug, Parser)]
#[command(name = "minions-watchdog", version, about, long_about)]
pub struct WatchdogArgs {
    /// NATS server URL.
    #[arg(long, env = "MINIONS_NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub nats: String,
    /// Heartbeat intervals a worker may miss before it is considered gone.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub missed_beats: u32,
}

impl WatchdogArgs {
    /// The configuration these flags describe.
    pub fn into_config(self) -> WatchdogConfig {
        WatchdogConfig {
            nats_url: self.nats,
            missed_beats: self.missed_beats,
        }
    }
}
