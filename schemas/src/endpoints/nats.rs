//! Connecting to NATS and checking the server is new enough.

use std::time::Duration;

use crate::streams::check_server_version;

/// The default NATS URL.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// Why a NATS connection could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NatsConnectError {
    /// No connection could be made.
    #[error(
        "cannot connect to NATS at {url}: {source} (is nats-server running? `minions dev` starts one)"
    )]
    Connect {
        /// The URL.
        url: String,
        /// The client's complaint.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The server is too old or says something unreadable.
    #[error("{0}")]
    Version(String),
    /// The server runs without JetStream.
    #[error(
        "nats-server at {url} runs without JetStream; start it with -js (or `jetstream {{}}` in its config)"
    )]
    NoJetStream {
        /// The URL.
        url: String,
    },
}

/// Connects to `url` as `name` (shown in the server's connection list), waits
/// for the server's greeting, and refuses servers older than
/// [`crate::streams::MIN_SERVER_VERSION`] or without JetStream.
pub async fn connect(url: &str, name: &str) -> Result<async_nats::Client, NatsConnectError> {
    let client = async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(Duration::from_secs(5))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(url)
        .await
        .map_err(|source| NatsConnectError::Connect {
            url: url.to_owned(),
            source,
        })?;
    // With retry_on_initial_connect, connect() returns before the greeting;
    // wait for it (bounded), so a wrong URL fails with a clear message.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = client.server_info();
        if !info.version.is_empty() {
            check_server_version(&info.version).map_err(NatsConnectError::Version)?;
            if !info.jetstream {
                return Err(NatsConnectError::NoJetStream {
                    url: url.to_owned(),
                });
            }
            return Ok(client);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(NatsConnectError::Version(format!(
                "no answer from NATS at {url} within 10 s (is nats-server running? `minions dev` starts one)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
