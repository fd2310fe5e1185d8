//! `minions usage`: what the fleet's work used (device-hours, records,
//! tokens, hours of audio, energy and its cost) per team, worker, model or job, read from
//! the ledger that `minions-watchdog --ledger postgres://...` writes
//! (watchdog/migrations/ holds its tables).
//!
//! Everything comes from `usage_hourly` (one row per worker, hour and job),
//! joined to `jobs` for team and model and to `workers` for the host. An
//! hour is counted when it begins inside the window `[since, until)`.
//!
//! The parsing of `--since`/`--until` and the rendering of the report
//! (table, CSV, JSON) are pure functions, unit-tested here; only
//! [`read_usage`] talks to PostgreSQL.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, SecondsFormat, TimeDelta, Utc};
use minions_endpoints::config_file::{self, ConfigFileError};
use minions_endpoints::ledger::amount;
pub use minions_endpoints::usage::UsageRow;
use minions_endpoints::usage::{self, Grouping, Window};

use crate::cli::{Endpoints, UsageArgs, UsageBy};

/// The price of one kWh when neither `--price-per-kwh` nor the settings
/// file's `price_per_kwh` says.
pub const DEFAULT_PRICE_PER_KWH: f64 = 0.30;

/// How long connecting to the ledger may take, unless its URL sets
/// `connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest duration `--since`/`--until` accept (100 years, in seconds).
pub const MAX_AGO_SECS: u64 = 100 * 365 * 86_400;

/// The ledger's grouping for `--by`.
pub fn grouping(by: UsageBy) -> Grouping {
    match by {
        UsageBy::Team => Grouping::Team,
        UsageBy::Worker => Grouping::Worker,
        UsageBy::Model => Grouping::Model,
        UsageBy::Job => Grouping::Job,
    }
}

/// Why `minions usage` could not answer.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// No ledger URL from the flag, the environment or the settings file.
    #[error(
        "no ledger given: pass --ledger postgres://USER@HOST/DB, set MINIONS_LEDGER, or put `ledger = \"postgres://...\"` in the settings file (the database a watchdog started with `minions-watchdog --ledger URL` writes)"
    )]
    NoLedger,
    /// The settings file could not be read.
    #[error(transparent)]
    Settings(#[from] ConfigFileError),
    /// The price per kWh is negative or not a number.
    #[error("{origin} is {value}: a price per kWh is a number, 0 or more")]
    BadPrice {
        /// Where it came from (the flag or the settings file).
        origin: &'static str,
        /// The value given.
        value: f64,
    },
    /// `--since` is not before `--until`.
    #[error("the window is empty: --since is {since} and --until {until}; --since must be earlier")]
    EmptyWindow {
        /// The window's start.
        since: String,
        /// The window's end.
        until: String,
    },
    /// The ledger URL cannot be parsed.
    #[error(
        "the ledger URL {url} is not a PostgreSQL connection string ({cause}); write postgres://USER[:PASSWORD]@HOST[:PORT]/DB"
    )]
    BadUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong.
        cause: String,
    },
    /// The ledger's server could not be reached or refused us.
    #[error(
        "cannot connect to the ledger at {url}: {cause} (is PostgreSQL running there? the ledger is the database that `minions-watchdog --ledger {url}` writes)"
    )]
    Connect {
        /// The URL, password redacted.
        url: String,
        /// Why, as the driver and server say.
        cause: String,
    },
    /// The authorities to trust for the ledger's certificate are not usable.
    #[error("{0}")]
    Tls(String),
    /// The database has no ledger tables: no watchdog has written to it.
    #[error("no ledger tables at {url}: start a watchdog with --ledger {url} once")]
    NotMigrated {
        /// The URL, password redacted.
        url: String,
    },
    /// The query failed.
    #[error("reading the ledger at {url}: {cause}")]
    Query {
        /// The URL, password redacted.
        url: String,
        /// Why, as the driver and server say.
        cause: String,
    },
    /// The JSON output could not be written.
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// A `--since`/`--until` value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// Neither a duration, a date nor an RFC 3339 time.
    #[error(
        "{0:?} is neither a duration back from now (30d, 12h, 90m, 45s, 2w), a date (2025-01-31) nor an RFC 3339 time (2025-01-31T09:00:00Z)"
    )]
    Unrecognized(String),
    /// Shaped like one of them but not valid.
    #[error("{value:?}: {reason}")]
    Invalid {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A point in time as `--since`/`--until` give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// This many seconds before now.
    Ago(u64),
    /// This moment.
    At(DateTime<Utc>),
}

impl When {
    /// The moment this is, with `now` as now. A duration reaching before
    /// the earliest representable time is that time.
    pub fn resolve(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Self::At(t) => t,
            Self::Ago(secs) => i64::try_from(secs)
                .ok()
                .and_then(TimeDelta::try_seconds)
                .and_then(|d| now.checked_sub_signed(d))
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
        }
    }
}

/// Parses a `--since`/`--until` value: a duration back from now (a whole
/// number and a unit: `s`, `m` minutes, `h`, `d`, `w`), a date
/// (`YYYY-MM-DD`, midnight UTC) or an RFC 3339 time.
pub fn parse_when(value: &str) -> Result<When, TimeError> {
    let v = value.trim();
    let invalid = |reason: String| TimeError::Invalid {
        value: value.to_owned(),
        reason,
    };
    if let Some(unit) = v.chars().last()
        && v.len() > 1
        && v[..v.len() - unit.len_utf8()]
            .bytes()
            .all(|b| b.is_ascii_digit())
        && unit.is_ascii_alphabetic()
    {
        let digits = &v[..v.len() - 1];
        let per: u64 = match unit.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => {
                return Err(invalid(format!(
                    "unknown unit {unit:?}; use s, m (minutes), h, d or w"
                )));
            }
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| invalid("too large a number".to_owned()))?;
        let secs = n
            .checked_mul(per)
            .filter(|s| *s <= MAX_AGO_SECS)
            .ok_or_else(|| invalid("more than 100 years back".to_owned()))?;
        if secs == 0 {
            return Err(invalid(
                "a duration back from now must be above 0".to_owned(),
            ));
        }
        return Ok(When::Ago(secs));
    }
    let b = v.as_bytes();
    let date_shaped = b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit);
    if !date_shaped {
        return Err(TimeError::Unrecognized(value.to_owned()));
    }
    if b.len() == 10 {
        let d = NaiveDate::parse_from_str(v, "%Y-%m-%d")
            .map_err(|e| invalid(format!("not a valid date ({e})")))?;
        return d
            .and_hms_opt(0, 0, 0)
            .map(|t| When::At(t.and_utc()))
            .ok_or_else(|| invalid("not a valid date".to_owned()));
    }
    DateTime::parse_from_rfc3339(v)
        .map(|t| When::At(t.with_timezone(&Utc)))
        .map_err(|e| {
            invalid(format!(
                "not an RFC 3339 time ({e}); write e.g. 2025-01-31T09:00:00Z or 2025-01-31T09:00:00+01:00"
            ))
        })
}

/// A usage report: the rows of one grouping over one window, most
/// device-hours first.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The grouping.
    pub by: UsageBy,
    /// The window's start (included).
    pub since: DateTime<Utc>,
    /// The window's end (excluded).
    pub until: DateTime<Utc>,
    /// What one kWh costs.
    pub price_per_kwh: f64,
    /// One row per group, sorted.
    pub rows: Vec<UsageRow>,
}

impl Report {
    /// A report of `rows`, sorted by device-hours (most first), then name.
    pub fn new(
        by: UsageBy,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        price_per_kwh: f64,
        mut rows: Vec<UsageRow>,
    ) -> Self {
        rows.sort_by(|a, b| b.busy_ms.cmp(&a.busy_ms).then_with(|| a.name.cmp(&b.name)));
        Self {
            by,
            since,
            until,
            price_per_kwh,
            rows,
        }
    }

    /// Every row summed (named `total`).
    pub fn total(&self) -> UsageRow {
        let mut t = UsageRow {
            name: Some("total".to_owned()),
            ..UsageRow::default()
        };
        for r in &self.rows {
            t.busy_ms = t.busy_ms.saturating_add(r.busy_ms);
            t.records = t.records.saturating_add(r.records);
            t.tokens = t.tokens.saturating_add(r.tokens);
            t.audio_ms = t.audio_ms.saturating_add(r.audio_ms);
            t.measured_j += r.measured_j;
            t.estimated_j += r.estimated_j;
        }
        t
    }
}

/// The name columns of a grouping: table headers and CSV/JSON field names.
fn key_columns(by: UsageBy) -> &'static [(&'static str, &'static str)] {
    match by {
        UsageBy::Team => &[("TEAM", "team")],
        UsageBy::Worker => &[("WORKER", "worker"), ("HOST", "host")],
        UsageBy::Model => &[("MODEL", "model")],
        UsageBy::Job => &[("JOB", "job"), ("TEAM", "team"), ("MODEL", "model")],
    }
}

/// A row's values for [`key_columns`].
fn key_values(by: UsageBy, r: &UsageRow) -> Vec<Option<&str>> {
    let name = r.name.as_deref();
    match by {
        UsageBy::Team | UsageBy::Model => vec![name],
        UsageBy::Worker => vec![name, r.host.as_deref()],
        UsageBy::Job => vec![name, r.team.as_deref(), r.model.as_deref()],
    }
}

/// The grouping's word, for messages and logs.
fn by_word(by: UsageBy) -> &'static str {
    match by {
        UsageBy::Team => "team",
        UsageBy::Worker => "worker",
        UsageBy::Model => "model",
        UsageBy::Job => "job",
    }
}

/// The number columns: table header, CSV/JSON field name.
const NUMBER_COLUMNS: [(&str, &str); 7] = [
    ("DEVICE-H", "device_hours"),
    ("RECORDS", "records"),
    ("TOKENS", "tokens"),
    ("AUDIO-H", "audio_hours"),
    ("KWH MEASURED", "kwh_measured"),
    ("KWH ESTIMATED", "kwh_estimated"),
    ("COST", "cost"),
];

/// What a group without a name (a job the ledger has no spec for) shows
/// as in the table.
const UNKNOWN: &str = "(unknown)";

fn minute(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

/// The report as an aligned table: a line saying the window and price,
/// a header, one line per group and a `total` line.
pub fn render_table(report: &Report) -> String {
    let window = format!("{} to {} UTC", minute(report.since), minute(report.until));
    if report.rows.is_empty() {
        return format!(
            "no usage in the ledger from {window} (it fills as a watchdog started with --ledger sees shards end)"
        );
    }
    let keys = key_columns(report.by);
    let mut lines: Vec<Vec<String>> = Vec::with_capacity(report.rows.len() + 2);
    lines.push(
        keys.iter()
            .map(|k| k.0)
            .chain(NUMBER_COLUMNS.iter().map(|c| c.0))
            .map(str::to_owned)
            .collect(),
    );
    let total = report.total();
    for (i, r) in report
        .rows
        .iter()
        .chain(std::iter::once(&total))
        .enumerate()
    {
        let names: Vec<String> = if i == report.rows.len() {
            let mut v = vec!["total".to_owned()];
            v.resize(keys.len(), String::new());
            v
        } else {
            key_values(report.by, r)
                .into_iter()
                .map(|v| v.unwrap_or(UNKNOWN).to_owned())
                .collect()
        };
        let mut line = names;
        line.extend([
            amount(r.device_hours(), 2),
            r.records.to_string(),
            r.tokens.to_string(),
            amount(r.audio_hours(), 2),
            amount(r.kwh_measured(), 3),
            amount(r.kwh_estimated(), 3),
            format!("{:.2}", r.cost(report.price_per_kwh)),
        ]);
        lines.push(line);
    }
    let columns = keys.len() + NUMBER_COLUMNS.len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            lines
                .iter()
                .map(|l| l.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!(
        "usage by {} from {window}; cost at {} per kWh (measured and estimated)\n",
        by_word(report.by),
        report.price_per_kwh
    );
    for line in &lines {
        let mut text = String::new();
        for (c, (cell, width)) in line.iter().zip(&widths).enumerate() {
            if c > 0 {
                text.push_str("  ");
            }
            if c < keys.len() {
                let _ = write!(text, "{cell:<width$}");
            } else {
                let _ = write!(text, "{cell:>width$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out.trim_end().to_owned()
}

/// One CSV field, quoted when it holds a comma, quote, or line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The report as CSV: a header line, then one line per group (no total;
/// an unknown name is an empty field). Numbers at full precision.
pub fn render_csv(report: &Report) -> String {
    let keys = key_columns(report.by);
    let header: Vec<&str> = keys
        .iter()
        .map(|k| k.1)
        .chain(NUMBER_COLUMNS.iter().map(|c| c.1))
        .collect();
    let mut out = header.join(",");
    out.push('\n');
    for r in &report.rows {
        let mut fields: Vec<String> = key_values(report.by, r)
            .into_iter()
            .map(|v| csv_field(v.unwrap_or("")))
            .collect();
        fields.extend([
            r.device_hours().to_string(),
            r.records.to_string(),
            r.tokens.to_string(),
            r.audio_hours().to_string(),
            r.kwh_measured().to_string(),
            r.kwh_estimated().to_string(),
            r.cost(report.price_per_kwh).to_string(),
        ]);
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out.trim_end().to_owned()
}

/// A group's name fields in `--json`, by grouping.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum JsonKeys<'a> {
    Team {
        team: Option<&'a str>,
    },
    Worker {
        worker: Option<&'a str>,
        host: Option<&'a str>,
    },
    Model {
        model: Option<&'a str>,
    },
    Job {
        job: Option<&'a str>,
        team: Option<&'a str>,
        model: Option<&'a str>,
    },
}

/// One object of `--json`.
#[derive(serde::Serialize)]
struct JsonRow<'a> {
    #[serde(flatten)]
    keys: JsonKeys<'a>,
    device_hours: f64,
    records: i64,
    tokens: i64,
    audio_hours: f64,
    kwh_measured: f64,
    kwh_estimated: f64,
    cost: f64,
}

/// The report as a JSON array, one object per group (no total): the
/// grouping's name fields (`team`; `worker`, `host`; `model`; `job`,
/// `team`, `model`; null when unknown), then `device_hours`, `records`,
/// `tokens`, `audio_hours`, `kwh_measured`, `kwh_estimated`, `cost`.
pub fn render_json(report: &Report) -> Result<String, serde_json::Error> {
    let rows: Vec<JsonRow<'_>> = report
        .rows
        .iter()
        .map(|r| {
            let name = r.name.as_deref();
            JsonRow {
                keys: match report.by {
                    UsageBy::Team => JsonKeys::Team { team: name },
                    UsageBy::Worker => JsonKeys::Worker {
                        worker: name,
                        host: r.host.as_deref(),
                    },
                    UsageBy::Model => JsonKeys::Model { model: name },
                    UsageBy::Job => JsonKeys::Job {
                        job: name,
                        team: r.team.as_deref(),
                        model: r.model.as_deref(),
                    },
                },
                device_hours: r.device_hours(),
                records: r.records,
                tokens: r.tokens,
                audio_hours: r.audio_hours(),
                kwh_measured: r.kwh_measured(),
                kwh_estimated: r.kwh_estimated(),
                cost: r.cost(report.price_per_kwh),
            }
        })
        .collect();
    serde_json::to_string_pretty(&rows)
}

pub use minions_endpoints::ledger::{describe, redact};

/// Reads one grouping's usage in `[since, until)` from the ledger at
/// `url`.
pub async fn read_usage(
    url: &str,
    by: UsageBy,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<UsageRow>, UsageError> {
    let shown = redact(url);
    tracing::debug!(ledger = %shown, by = by_word(by), %since, %until, "reading usage from the ledger");
    use minions_endpoints::ledger::{self, LedgerConnectError};
    let client = ledger::connect(url, "minions usage")
        .await
        .map_err(|e| match e {
            LedgerConnectError::Url { url, cause } => UsageError::BadUrl { url, cause },
            LedgerConnectError::Connect { url, cause } => UsageError::Connect { url, cause },
            e @ LedgerConnectError::Ca { .. } => UsageError::Tls(e.to_string()),
        })?;
    let seconds = |t: DateTime<Utc>| t.timestamp_micros() as f64 / 1e6;
    let window = Window::Between {
        since_s: seconds(since),
        until_s: seconds(until),
    };
    let out = usage::read(&client, grouping(by), &window, None)
        .await
        .map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
                UsageError::NotMigrated { url: shown.clone() }
            } else {
                UsageError::Query {
                    url: shown.clone(),
                    cause: describe(&e),
                }
            }
        })?;
    tracing::debug!(ledger = %shown, groups = out.len(), "usage read");
    Ok(out)
}

/// Checks a price per kWh.
fn check_price(origin: &'static str, value: f64) -> Result<f64, UsageError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(UsageError::BadPrice { origin, value })
    }
}

/// Runs `minions usage`, returning what to print.
pub async fn run(endpoints: &Endpoints, args: &UsageArgs) -> Result<String, UsageError> {
    let file = config_file::usage_defaults(endpoints.security.config.as_deref())?;
    let ledger = args
        .ledger
        .clone()
        .or(file.ledger)
        .filter(|l| !l.trim().is_empty())
        .ok_or(UsageError::NoLedger)?;
    let price = match (args.price_per_kwh, file.price_per_kwh) {
        (Some(p), _) => check_price("--price-per-kwh", p)?,
        (None, Some(p)) => check_price("the settings file's price_per_kwh", p)?,
        (None, None) => DEFAULT_PRICE_PER_KWH,
    };
    let now = Utc::now();
    let since = args.since.resolve(now);
    let until = args.until.map_or(now, |w| w.resolve(now));
    if since >= until {
        return Err(UsageError::EmptyWindow {
            since: since.to_rfc3339_opts(SecondsFormat::Secs, true),
            until: until.to_rfc3339_opts(SecondsFormat::Secs, true),
        });
    }
    let rows = read_usage(&ledger, args.by, since, until).await?;
    let report = Report::new(args.by, since, until, price, rows);
    Ok(if args.json {
        render_json(&report)?
    } else if args.csv {
        render_csv(&report)
    } else {
        render_table(&report)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn durations_count_back_from_now() -> Result<(), TimeError> {
        assert_eq!(parse_when("30d")?, When::Ago(30 * 86_400));
        assert_eq!(parse_when("12h")?, When::Ago(12 * 3_600));
        assert_eq!(parse_when("90m")?, When::Ago(90 * 60));
        assert_eq!(parse_when("45s")?, When::Ago(45));
        assert_eq!(parse_when("2w")?, When::Ago(14 * 86_400));
        assert_eq!(parse_when(" 1H ")?, When::Ago(3_600));
        let now = at("2025-03-01T00:00:00Z");
        assert_eq!(parse_when("1d")?.resolve(now), at("2025-02-28T00:00:00Z"));
        Ok(())
    }

    #[test]
    fn dates_and_rfc3339_times_are_moments() -> Result<(), TimeError> {
        assert_eq!(
            parse_when("2025-01-31")?,
            When::At(at("2025-01-31T00:00:00Z"))
        );
        assert_eq!(
            parse_when("2025-01-31T09:30:00+01:00")?,
            When::At(at("2025-01-31T08:30:00Z"))
        );
        assert_eq!(
            parse_when("2025-01-31T09:30:00.5Z")?,
            When::At(at("2025-01-31T09:30:00.500Z"))
        );
        let now = at("2030-01-01T00:00:00Z");
        assert_eq!(
            parse_when("2025-01-31")?.resolve(now),
            at("2025-01-31T00:00:00Z")
        );
        Ok(())
    }

    #[test]
    fn bad_values_are_named_with_what_is_wrong() {
        let err = |v: &str| match parse_when(v) {
            Ok(w) => panic!("{v} accepted as {w:?}"),
            Err(e) => e.to_string(),
        };
        for (value, says) in [
            ("30x", "unknown unit"),
            ("0d", "above 0"),
            ("99999999999999999999d", "too large"),
            ("6000w", "100 years"),
            ("yesterday", "neither a duration"),
            ("", "neither a duration"),
            ("d", "neither a duration"),
            ("-3d", "neither a duration"),
            ("2025-02-30", "not a valid date"),
            ("2025-01-31T25:00:00Z", "not an RFC 3339 time"),
            ("2025-01-31T09:00", "not an RFC 3339 time"),
        ] {
            let e = err(value);
            assert!(e.contains(&format!("{value:?}")), "{value}: {e}");
            assert!(e.contains(says), "{value}: {e}");
        }
    }

    fn report(by: UsageBy, rows: Vec<UsageRow>) -> Report {
        Report::new(
            by,
            at("2025-01-01T00:00:00Z"),
            at("2025-01-31T12:00:00Z"),
            0.5,
            rows,
        )
    }

    fn row(name: Option<&str>, busy_ms: i64, measured_kwh: f64, estimated_kwh: f64) -> UsageRow {
        UsageRow {
            name: name.map(str::to_owned),
            busy_ms,
            records: busy_ms / 1000,
            tokens: busy_ms / 100,
            audio_ms: busy_ms / 2,
            measured_j: measured_kwh * 3.6e6,
            estimated_j: estimated_kwh * 3.6e6,
            ..UsageRow::default()
        }
    }

    fn teams() -> Report {
        report(
            UsageBy::Team,
            vec![
                row(Some("search"), 3_600_000, 1.0, 0.0),
                row(None, 1_800_000, 0.0, 0.3),
                row(Some("ads"), 7_200_000, 2.0, 1.0),
            ],
        )
    }

    #[test]
    fn the_table_is_aligned_sorted_and_totalled() {
        let text = render_table(&teams());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert_eq!(
            lines[0],
            "usage by team from 2025-01-01 00:00 to 2025-01-31 12:00 UTC; cost at 0.5 per kWh (measured and estimated)"
        );
        assert_eq!(
            lines[1..].join("\n"),
            "\
TEAM       DEVICE-H  RECORDS  TOKENS  AUDIO-H  KWH MEASURED  KWH ESTIMATED  COST
ads            2.00     7200   72000     1.00         2.000          1.000  1.50
search         1.00     3600   36000     0.50         1.000          0.000  0.50
(unknown)      0.50     1800   18000     0.25         0.000          0.300  0.15
total          3.50    12600  126000     1.75         3.000          1.300  2.15"
        );
    }

    #[test]
    fn job_and_worker_tables_have_their_name_columns() {
        let mut r = row(Some("job-1"), 3_600_000, 0.0, 0.0);
        r.team = Some("search".into());
        r.model = Some("minilm".into());
        let text = render_table(&report(UsageBy::Job, vec![r]));
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("JOB    TEAM    MODEL   DEVICE-H"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("job-1  search  minilm      1.00"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("total                      1.00"),
            "{text}"
        );
        let mut r = row(Some("w-1"), 60_000, 0.0, 0.0);
        r.host = Some("mac-01".into());
        let text = render_table(&report(UsageBy::Worker, vec![r]));
        assert!(text.contains("WORKER  HOST    DEVICE-H"), "{text}");
        assert!(text.contains("w-1     mac-01      0.02"), "{text}");
    }

    #[test]
    fn an_empty_window_says_so() {
        let text = render_table(&report(UsageBy::Model, vec![]));
        assert!(
            text.starts_with("no usage in the ledger from 2025-01-01 00:00"),
            "{text}"
        );
        assert_eq!(
            render_csv(&report(UsageBy::Model, vec![])),
            "model,device_hours,records,tokens,audio_hours,kwh_measured,kwh_estimated,cost"
        );
        assert_eq!(
            render_json(&report(UsageBy::Model, vec![])).unwrap_or_else(|e| panic!("{e}")),
            "[]"
        );
    }

    #[test]
    fn csv_has_a_header_and_quotes_what_needs_it() {
        let mut rows = vec![row(Some("a,\"b\""), 3_600_000, 1.0, 1.0)];
        rows.push(row(None, 0, 0.0, 0.0));
        let text = render_csv(&report(UsageBy::Team, rows));
        assert_eq!(
            text,
            "\
team,device_hours,records,tokens,audio_hours,kwh_measured,kwh_estimated,cost
\"a,\"\"b\"\"\",1,3600,36000,0.5,1,1,1
,0,0,0,0,0,0,0"
        );
        let mut r = row(Some("w-1"), 0, 0.0, 0.0);
        r.host = Some("mac".into());
        let text = render_csv(&report(UsageBy::Worker, vec![r]));
        assert!(text.starts_with("worker,host,device_hours,"), "{text}");
        assert!(text.ends_with("\nw-1,mac,0,0,0,0,0,0,0"), "{text}");
    }

    #[test]
    fn json_is_an_array_with_stable_fields() -> Result<(), serde_json::Error> {
        let v: serde_json::Value = serde_json::from_str(&render_json(&teams())?)?;
        let rows = v.as_array().map(Vec::as_slice).unwrap_or_default();
        assert_eq!(rows.len(), 3, "no total row: {v}");
        assert_eq!(rows[0]["team"], "ads");
        assert_eq!(rows[0]["device_hours"], 2.0);
        assert_eq!(rows[0]["records"], 7200);
        assert_eq!(rows[0]["tokens"], 72000);
        assert_eq!(rows[0]["audio_hours"], 1.0);
        assert_eq!(rows[0]["kwh_measured"], 2.0);
        assert_eq!(rows[0]["kwh_estimated"], 1.0);
        assert_eq!(rows[0]["cost"], 1.5);
        assert!(rows[2]["team"].is_null(), "{v}");
        let mut r = row(Some("job-1"), 0, 0.0, 0.0);
        r.team = Some("search".into());
        let text = render_json(&report(UsageBy::Job, vec![r]))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let at = |field: &str| text.find(&format!("\"{field}\":")).unwrap_or(usize::MAX);
        let order = [
            "job",
            "team",
            "model",
            "device_hours",
            "records",
            "tokens",
            "audio_hours",
            "kwh_measured",
            "kwh_estimated",
            "cost",
        ];
        for pair in order.windows(2) {
            assert!(at(pair[0]) < at(pair[1]), "{pair:?} in {text}");
        }
        assert!(at(order[9]) < usize::MAX, "{text}");
        assert_eq!(v[0].as_object().map(|o| o.len()), Some(order.len()), "{v}");
        assert!(v[0]["model"].is_null(), "{v}");
        Ok(())
    }

    #[test]
    fn passwords_never_show() {
        for (url, shown) in [
            (
                "postgres://minions:s3cret@db:5432/ledger",
                "postgres://minions:***@db:5432/ledger",
            ),
            (
                "postgresql://minions@db/ledger",
                "postgresql://minions@db/ledger",
            ),
            ("postgres://db/ledger", "postgres://db/ledger"),
            (
                "postgres://u:p@ss/w?rd@db/ledger?sslmode=disable",
                "postgres://u:***@db/ledger?sslmode=disable",
            ),
            (
                "postgres://db/ledger?user=u&password=p&connect_timeout=5",
                "postgres://db/ledger?user=u&password=***&connect_timeout=5",
            ),
            (
                "host=db user=u password=s3cret dbname=ledger",
                "host=db user=u password=*** dbname=ledger",
            ),
            (
                "host=db password = 'a \\' b' dbname=ledger",
                "host=db password=*** dbname=ledger",
            ),
            ("host=db mypassword=x", "host=db mypassword=x"),
            ("password=x", "password=***"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_ledger_is_named_without_its_password() {
        // Port 1 on loopback: nothing listens there.
        let url = "postgres://minions:s3cret@127.0.0.1:1/ledger?connect_timeout=2";
        let now = at("2025-01-01T00:00:00Z");
        let e = match read_usage(url, UsageBy::Team, now, now).await {
            Ok(rows) => panic!("read {rows:?}"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("cannot connect to the ledger at postgres://minions:***@127.0.0.1:1/ledger"),
            "{e}"
        );
        assert!(e.contains("minions-watchdog --ledger"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        let e = match read_usage("postgres://u:s3cret@db:notaport/x", UsageBy::Team, now, now).await
        {
            Ok(rows) => panic!("read {rows:?}"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("not a PostgreSQL connection string") && !e.contains("s3cret"),
            "{e}"
        );
    }

    #[test]
    fn the_settings_file_gives_ledger_and_price() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            "ledger = \"postgres://minions@db/ledger\"\nprice_per_kwh = 0.25\n",
        )?;
        let d = config_file::usage_defaults(Some(&path))?;
        assert_eq!(d.ledger.as_deref(), Some("postgres://minions@db/ledger"));
        assert_eq!(d.price_per_kwh, Some(0.25));
        Ok(())
    }
}
