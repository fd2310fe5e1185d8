//! `/usage` and `/api/usage`: what the usage ledger (PostgreSQL) says of
//! the last days, by team and by worker, read on request.
//!
//! The dashboard keeps one connection to the ledger, opened on the first
//! request and kept behind a mutex for the next ones; a request that finds
//! it closed, or whose query fails, drops it and the next request connects
//! again. Connecting may take [`CONNECT_TIMEOUT`] (unless the URL sets
//! `connect_timeout`) and a whole read [`READ_TIMEOUT`]; a database that is
//! down or slow makes the usage page say so and delays nothing else: no
//! other route touches the ledger.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use tokio_postgres::Client;

use crate::ledger::{LedgerStatus, redact};
use minions_endpoints::ledger::describe;
use minions_endpoints::usage::{self, Grouping, UsageRow, Window};

/// Days shown unless `days` says otherwise.
pub const DEFAULT_DAYS: u32 = 30;

/// The most days `days` may ask for.
pub const MAX_DAYS: u32 = 366;

/// Rows in each table (the largest first).
pub const TOP: u32 = 50;

/// How long connecting to the ledger may take, unless its URL sets
/// `connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one read (connecting included) may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(8);

/// Why `days` was refused (the text names the parameter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("days must be a whole number from 1 to {MAX_DAYS}, not {0:?}")]
pub struct BadDays(pub String);

/// The `days` parameter of a query string: [`DEFAULT_DAYS`] when absent,
/// else a whole number from 1 to [`MAX_DAYS`]. Other parameters are ignored.
pub fn parse_days(query: Option<&str>) -> Result<u32, BadDays> {
    let Some(value) = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("days="))
    else {
        return Ok(DEFAULT_DAYS);
    };
    match value.parse::<u32>() {
        Ok(d) if (1..=MAX_DAYS).contains(&d) && !value.starts_with('+') => Ok(d),
        _ => Err(BadDays(value.to_owned())),
    }
}

/// Device time, records, tokens, audio and energy of a group.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sums {
    /// Device-busy hours.
    pub device_hours: f64,
    /// Records done.
    pub records: i64,
    /// Tokens generated.
    pub tokens: i64,
    /// Hours of audio transcribed.
    pub audio_hours: f64,
    /// Energy read from meters, kWh.
    pub kwh_measured: f64,
    /// Energy estimated from the device kind, kWh.
    pub kwh_estimated: f64,
}

impl Sums {
    /// A ledger row's sums, in hours and kWh.
    fn of(row: &UsageRow) -> Self {
        Self {
            device_hours: row.device_hours(),
            records: row.records,
            tokens: row.tokens,
            audio_hours: row.audio_hours(),
            kwh_measured: row.kwh_measured(),
            kwh_estimated: row.kwh_estimated(),
        }
    }
}

/// A team's usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TeamUsage {
    /// The team (None: jobs the ledger has no spec for).
    pub team: Option<String>,
    /// What it used.
    #[serde(flatten)]
    pub sums: Sums,
}

/// A worker's usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkerUsage {
    /// The worker's id.
    pub worker: String,
    /// Its host (None: the ledger has no row for the worker).
    pub host: Option<String>,
    /// What it did.
    #[serde(flatten)]
    pub sums: Sums,
}

/// The ledger's usage over a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    /// Everything in the window.
    pub total: Sums,
    /// The teams that used the most device time, largest first.
    pub teams: Vec<TeamUsage>,
    /// The workers that were busy the longest, largest first.
    pub workers: Vec<WorkerUsage>,
}

/// What the ledger writer is doing (from [`LedgerStatus`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LedgerState {
    /// The ledger's URL, password hidden.
    pub url: String,
    /// Connected and migrated.
    pub connected: bool,
    /// The last events-stream sequence the ledger holds.
    pub cursor: u64,
    /// The newest sequence this watchdog read.
    pub read: u64,
    /// Events read and not yet in the ledger (when connected).
    pub lag: Option<u64>,
    /// Events this watchdog applied.
    pub applied: u64,
    /// Events found applied already.
    pub skipped: u64,
}

impl LedgerState {
    /// The state of the ledger at `url` as `status` says.
    pub fn of(url: &str, status: &LedgerStatus) -> Self {
        let connected = status.connected.load(Ordering::Relaxed);
        let cursor = status.cursor.load(Ordering::Relaxed);
        let read = status.read.load(Ordering::Relaxed);
        Self {
            url: redact(url),
            connected,
            cursor,
            read,
            lag: connected.then(|| read.saturating_sub(cursor)),
            applied: status.applied.load(Ordering::Relaxed),
            skipped: status.skipped.load(Ordering::Relaxed),
        }
    }
}

/// What `/api/usage` answers and `/usage` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageReport {
    /// The window: the last this many days.
    pub days: u32,
    /// The writer's state.
    pub ledger: LedgerState,
    /// The usage, when the ledger could be read.
    #[serde(flatten)]
    pub usage: Option<Usage>,
    /// Why the ledger could not be read.
    pub error: Option<String>,
}

/// Why the ledger could not be read (passwords never show).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The URL is not a connection string.
    #[error("the ledger URL {url} is not a PostgreSQL connection string ({cause})")]
    BadUrl {
        /// The URL, password hidden.
        url: String,
        /// What is wrong.
        cause: String,
    },
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to the ledger at {url}: {cause} (is PostgreSQL running there?)")]
    Connect {
        /// The URL, password hidden.
        url: String,
        /// Why.
        cause: String,
    },
    /// No watchdog has created the ledger's tables yet.
    #[error(
        "the ledger at {url} has no tables yet: the watchdog creates them when it first connects"
    )]
    NotMigrated {
        /// The URL, password hidden.
        url: String,
    },
    /// A query failed.
    #[error("cannot read the ledger at {url}: {cause}")]
    Query {
        /// The URL, password hidden.
        url: String,
        /// Why.
        cause: String,
    },
    /// The ledger did not answer in time.
    #[error("the ledger at {url} did not answer within {secs} s")]
    Timeout {
        /// The URL, password hidden.
        url: String,
        /// The limit.
        secs: u64,
    },
}

/// The dashboard's reader of the ledger: its URL, the writer's status and
/// a connection kept between requests.
pub struct LedgerReader {
    url: String,
    shown: String,
    status: Arc<LedgerStatus>,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl LedgerReader {
    /// A reader of the ledger at `url`; connects on the first read.
    pub fn new(url: String, status: Arc<LedgerStatus>) -> Self {
        Self {
            shown: redact(&url),
            url,
            status,
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// What the ledger writer is doing now.
    pub fn state(&self) -> LedgerState {
        LedgerState::of(&self.url, &self.status)
    }

    /// The ledger's state and the usage of the last `days` days, or why it
    /// could not be read.
    pub async fn report(&self, days: u32) -> UsageReport {
        let (usage, error) = match self.read(days).await {
            Ok(u) => (Some(u), None),
            Err(e) => (None, Some(e.to_string())),
        };
        UsageReport {
            days,
            ledger: self.state(),
            usage,
            error,
        }
    }

    /// The usage of the last `days` days, within [`READ_TIMEOUT`].
    pub async fn read(&self, days: u32) -> Result<Usage, ReadError> {
        match tokio::time::timeout(READ_TIMEOUT, self.read_now(days)).await {
            Ok(r) => r,
            Err(_) => {
                // A connection stuck in a query is not kept.
                if let Ok(mut kept) = self.client.try_lock() {
                    *kept = None;
                }
                tracing::warn!(ledger = %self.shown, secs = READ_TIMEOUT.as_secs(), "usage read timed out");
                Err(ReadError::Timeout {
                    url: self.shown.clone(),
                    secs: READ_TIMEOUT.as_secs(),
                })
            }
        }
    }

    async fn read_now(&self, days: u32) -> Result<Usage, ReadError> {
        let mut kept = self.client.lock().await;
        let client = match kept.take() {
            Some(c) if !c.is_closed() => c,
            _ => self.connect().await?,
        };
        let usage = query(&client, days).await.map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
                ReadError::NotMigrated {
                    url: self.shown.clone(),
                }
            } else {
                ReadError::Query {
                    url: self.shown.clone(),
                    cause: describe(&e),
                }
            }
        });
        match &usage {
            // Kept for the next request only after a good read.
            Ok(_) => *kept = Some(client),
            Err(e) => tracing::debug!(error = %e, "usage not read; reconnecting next time"),
        }
        usage
    }

    async fn connect(&self) -> Result<Client, ReadError> {
        use minions_endpoints::ledger::{self, LedgerConnectError};
        let client =
            ledger::connect_within(&self.url, "minions-watchdog dashboard", CONNECT_TIMEOUT)
                .await
                .map_err(|e| match e {
                    LedgerConnectError::Url { url, cause } => ReadError::BadUrl { url, cause },
                    LedgerConnectError::Connect { url, cause } => ReadError::Connect { url, cause },
                    e @ LedgerConnectError::Ca { .. } => ReadError::Connect {
                        url: self.shown.clone(),
                        cause: e.to_string(),
                    },
                })?;
        tracing::debug!(ledger = %self.shown, "dashboard connected to the ledger");
        Ok(client)
    }
}

/// The three reads (the total, the top teams, the top workers), pipelined
/// on one connection.
async fn query(client: &Client, days: u32) -> Result<Usage, tokio_postgres::Error> {
    let window = Window::LastDays(days);
    let (total, teams, workers) = futures::try_join!(
        usage::read(client, Grouping::Total, &window, None),
        usage::read(client, Grouping::Team, &window, Some(TOP)),
        usage::read(client, Grouping::Worker, &window, Some(TOP)),
    )?;
    Ok(Usage {
        total: total.first().map(Sums::of).unwrap_or_default(),
        teams: teams
            .iter()
            .map(|r| TeamUsage {
                team: r.name.clone(),
                sums: Sums::of(r),
            })
            .collect(),
        workers: workers
            .iter()
            .map(|r| WorkerUsage {
                worker: r.name.clone().unwrap_or_default(),
                host: r.host.clone(),
                sums: Sums::of(r),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_defaults_to_30_and_takes_1_to_366() {
        assert_eq!(parse_days(None), Ok(30));
        assert_eq!(parse_days(Some("")), Ok(30));
        assert_eq!(parse_days(Some("fragment=1")), Ok(30));
        assert_eq!(parse_days(Some("days=1")), Ok(1));
        assert_eq!(parse_days(Some("days=7&fragment=1")), Ok(7));
        assert_eq!(parse_days(Some("fragment=1&days=366")), Ok(366));
        assert_eq!(parse_days(Some("weekdays=3")), Ok(30));
    }

    #[test]
    fn bad_days_are_refused_by_name() {
        for bad in [
            "0",
            "367",
            "-1",
            "+5",
            "",
            "7d",
            "1.5",
            "99999999999",
            "%33",
        ] {
            let e = parse_days(Some(&format!("days={bad}"))).map_err(|e| e.to_string());
            let Err(text) = e else {
                panic!("days={bad} accepted: {e:?}");
            };
            assert!(text.starts_with("days must be"), "{text}");
            assert!(text.contains(&format!("{bad:?}")), "{text}");
        }
    }

    #[test]
    fn lag_is_shown_only_when_connected() {
        let status = LedgerStatus::default();
        status.cursor.store(90, Ordering::Relaxed);
        status.read.store(100, Ordering::Relaxed);
        let s = LedgerState::of("postgres://u:secret@db/ledger", &status);
        assert_eq!(s.lag, None);
        assert_eq!(s.url, "postgres://u:***@db/ledger");
        status.connected.store(true, Ordering::Relaxed);
        assert_eq!(LedgerState::of("x", &status).lag, Some(10));
        status.cursor.store(120, Ordering::Relaxed);
        assert_eq!(LedgerState::of("x", &status).lag, Some(0));
    }

    #[test]
    fn the_json_has_flat_rows_and_an_error_field() -> Result<(), serde_json::Error> {
        let report = UsageReport {
            days: 7,
            ledger: LedgerState::default(),
            usage: Some(Usage {
                total: Sums::default(),
                teams: vec![TeamUsage {
                    team: Some("search".into()),
                    sums: Sums {
                        device_hours: 1.5,
                        ..Sums::default()
                    },
                }],
                workers: vec![],
            }),
            error: None,
        };
        let v = serde_json::to_value(&report)?;
        assert_eq!(v["days"], 7);
        assert_eq!(v["teams"][0]["team"], "search");
        assert_eq!(v["teams"][0]["device_hours"], 1.5);
        assert!(v["workers"].is_array() && v["error"].is_null(), "{v}");
        let v = serde_json::to_value(UsageReport {
            usage: None,
            error: Some("down".into()),
            ..report
        })?;
        assert!(v.get("teams").is_none() && v["error"] == "down", "{v}");
        Ok(())
    }

    #[tokio::test]
    async fn a_ledger_that_is_down_is_an_error_without_its_password() {
        // Port 1 on loopback: nothing listens there.
        let reader = LedgerReader::new(
            "postgres://minions:s3cret@127.0.0.1:1/ledger".into(),
            Arc::new(LedgerStatus::default()),
        );
        let report = reader.report(30).await;
        let e = report.error.unwrap_or_default();
        assert!(
            e.contains("cannot connect to the ledger at postgres://minions:***@127.0.0.1:1/ledger"),
            "{e}"
        );
        assert!(!e.contains("s3cret") && report.usage.is_none(), "{e}");
    }
}
