//! Reading what the ledger counted, for `minions usage` and the watchdog's
//! dashboard alike: the device time, records, tokens, audio and energy of
//! `usage_hourly` (one row per worker, hour and job), summed per team,
//! worker, model or job (or all together) over a window of hours, with one
//! query shape and one row type. Teams and models come from `jobs` (NULL
//! for a job the ledger has no spec for), a worker's host from `workers`.
//! An hour counts when it begins inside the window.

use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

/// Joules in a kWh, and milliseconds in an hour.
pub const PER_KWH_OR_HOUR: f64 = 3.6e6;

/// How the ledger's rows are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Everything in one row (no name).
    Total,
    /// Per team (the job's).
    Team,
    /// Per worker, with its host.
    Worker,
    /// Per model (the job's).
    Model,
    /// Per job, with its team and model.
    Job,
}

/// Which hours are summed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Window {
    /// From `since_s` (included) to `until_s` (excluded), Unix seconds.
    Between {
        /// The window's start.
        since_s: f64,
        /// The window's end.
        until_s: f64,
    },
    /// The last this many days, by the database's clock.
    LastDays(u32),
}

/// One group's usage, as the ledger sums it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRow {
    /// The group: team, worker, model or job (None: a job the ledger has
    /// no spec for, grouped by team or model; always None for the total).
    pub name: Option<String>,
    /// The worker's host ([`Grouping::Worker`]).
    pub host: Option<String>,
    /// The job's team ([`Grouping::Job`]).
    pub team: Option<String>,
    /// The job's model ([`Grouping::Job`]).
    pub model: Option<String>,
    /// Device-busy time, ms.
    pub busy_ms: i64,
    /// Records processed.
    pub records: i64,
    /// Tokens generated.
    pub tokens: i64,
    /// Audio transcribed, ms (speech jobs).
    pub audio_ms: i64,
    /// Energy read from meters, joules.
    pub measured_j: f64,
    /// Energy estimated, joules.
    pub estimated_j: f64,
}

impl UsageRow {
    /// Device-hours: busy ms / 3.6e6.
    pub fn device_hours(&self) -> f64 {
        self.busy_ms as f64 / PER_KWH_OR_HOUR
    }

    /// Hours of audio transcribed: audio ms / 3.6e6.
    pub fn audio_hours(&self) -> f64 {
        self.audio_ms as f64 / PER_KWH_OR_HOUR
    }

    /// Measured energy, kWh.
    pub fn kwh_measured(&self) -> f64 {
        self.measured_j / PER_KWH_OR_HOUR
    }

    /// Estimated energy, kWh.
    pub fn kwh_estimated(&self) -> f64 {
        self.estimated_j / PER_KWH_OR_HOUR
    }

    /// (measured + estimated kWh) × `price_per_kwh`.
    pub fn cost(&self, price_per_kwh: f64) -> f64 {
        (self.kwh_measured() + self.kwh_estimated()) * price_per_kwh
    }
}

/// The sums every grouping reports: busy ms, records, tokens (bigint),
/// measured and estimated joules (double precision) and audio ms (bigint);
/// SUM of a bigint is numeric, hence the casts.
const SUMS: &str = "\
       COALESCE(SUM(u.busy_ms), 0)::bigint,
       COALESCE(SUM(u.records), 0)::bigint,
       COALESCE(SUM(u.tokens), 0)::bigint,
       COALESCE(SUM(u.energy_measured_j), 0)::double precision,
       COALESCE(SUM(u.energy_estimated_j), 0)::double precision,
       COALESCE(SUM(u.audio_ms), 0)::bigint";

/// The query for `grouping` over `window`, at most `limit` rows. Every
/// grouping returns the same ten columns: the group's name, host, team and
/// model (NULL where the grouping has none), then [`SUMS`], largest device
/// time first, then by name. [`Window::Between`] binds `$1` and `$2` (Unix
/// seconds, double precision), [`Window::LastDays`] `$1` (days, int).
pub fn sql(grouping: Grouping, window: &Window, limit: Option<u32>) -> String {
    let (columns, join, group) = match grouping {
        Grouping::Total => ("NULL::text, NULL::text, NULL::text, NULL::text", "", ""),
        Grouping::Team => (
            "j.team, NULL::text, NULL::text, NULL::text",
            "LEFT JOIN jobs j ON j.job = u.job",
            "j.team",
        ),
        Grouping::Worker => (
            "u.worker, w.host, NULL::text, NULL::text",
            "LEFT JOIN workers w ON w.worker = u.worker",
            "u.worker, w.host",
        ),
        Grouping::Model => (
            "j.model, NULL::text, NULL::text, NULL::text",
            "LEFT JOIN jobs j ON j.job = u.job",
            "j.model",
        ),
        Grouping::Job => (
            "u.job, NULL::text, j.team, j.model",
            "LEFT JOIN jobs j ON j.job = u.job",
            "u.job, j.team, j.model",
        ),
    };
    let hours = match window {
        Window::Between { .. } => {
            "u.hour >= to_timestamp($1::double precision)\n  \
             AND u.hour < to_timestamp($2::double precision)"
        }
        Window::LastDays(_) => "u.hour >= now() - make_interval(days => $1::int)",
    };
    let mut q = format!("SELECT {columns},\n{SUMS}\nFROM usage_hourly u\n{join}\nWHERE {hours}\n");
    if !group.is_empty() {
        q.push_str(&format!("GROUP BY {group}\nORDER BY 5 DESC, 1"));
    }
    if let Some(n) = limit {
        q.push_str(&format!("\nLIMIT {n}"));
    }
    q
}

/// Reads `grouping`'s rows over `window` from the ledger (at most `limit`).
/// Errors are the driver's: an undefined table means no watchdog has
/// written this ledger yet.
pub async fn read(
    client: &Client,
    grouping: Grouping,
    window: &Window,
    limit: Option<u32>,
) -> Result<Vec<UsageRow>, tokio_postgres::Error> {
    let q = sql(grouping, window, limit);
    let rows = match *window {
        Window::Between { since_s, until_s } => {
            let params: [&(dyn ToSql + Sync); 2] = [&since_s, &until_s];
            client.query(&q, &params).await?
        }
        Window::LastDays(days) => {
            let days = i32::try_from(days).unwrap_or(i32::MAX);
            let params: [&(dyn ToSql + Sync); 1] = [&days];
            client.query(&q, &params).await?
        }
    };
    rows.iter()
        .map(|r| {
            Ok(UsageRow {
                name: r.try_get(0)?,
                host: r.try_get(1)?,
                team: r.try_get(2)?,
                model: r.try_get(3)?,
                busy_ms: r.try_get(4)?,
                records: r.try_get(5)?,
                tokens: r.try_get(6)?,
                measured_j: r.try_get(7)?,
                estimated_j: r.try_get(8)?,
                audio_ms: r.try_get(9)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grouping_has_ten_columns_and_its_window() {
        let between = Window::Between {
            since_s: 0.0,
            until_s: 1.0,
        };
        for g in [
            Grouping::Total,
            Grouping::Team,
            Grouping::Worker,
            Grouping::Model,
            Grouping::Job,
        ] {
            let q = sql(g, &between, None);
            // Four name columns, then the six sums.
            let names = q.split("COALESCE").next().unwrap_or_default();
            assert_eq!(names.matches(',').count(), 4, "{q}");
            assert_eq!(q.matches("COALESCE(SUM(").count(), 6, "{q}");
            assert!(q.contains("$2") && !q.contains("LIMIT"), "{q}");
            assert_eq!(q.contains("GROUP BY"), g != Grouping::Total, "{q}");
        }
        let q = sql(Grouping::Worker, &Window::LastDays(30), Some(20));
        assert!(
            q.contains("make_interval(days => $1::int)") && !q.contains("$2"),
            "{q}"
        );
        assert!(q.ends_with("ORDER BY 5 DESC, 1\nLIMIT 20"), "{q}");
    }

    #[test]
    fn a_row_reads_in_hours_kwh_and_money() {
        let r = UsageRow {
            busy_ms: 7_200_000,
            measured_j: 3.6e6,
            estimated_j: 1.8e6,
            audio_ms: 5_400_000,
            ..Default::default()
        };
        assert_eq!((r.device_hours(), r.audio_hours()), (2.0, 1.5));
        assert_eq!((r.kwh_measured(), r.kwh_estimated()), (1.0, 0.5));
        assert!((r.cost(0.30) - 0.45).abs() < 1e-12);
    }
}
