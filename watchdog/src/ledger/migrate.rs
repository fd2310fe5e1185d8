//! The ledger's schema migrations: the SQL files in `watchdog/migrations/`,
//! built into the binary, applied in order, each once, at start.
//!
//! A transaction-scoped advisory lock makes watchdogs that start together
//! take turns; `ledger_migrations` records what is applied. A ledger
//! migrated by a newer release (a version this build does not know) is
//! refused rather than written with the wrong shape.

use tokio_postgres::Client;

use super::LedgerError;

/// (version, name, SQL), in order. Versions only grow; a file, once
/// released, never changes.
pub(crate) const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "0001_ledger",
        include_str!("../../migrations/0001_ledger.sql"),
    ),
    (
        2,
        "0002_forged",
        include_str!("../../migrations/0002_forged.sql"),
    ),
    (
        3,
        "0003_actions",
        include_str!("../../migrations/0003_actions.sql"),
    ),
    (
        4,
        "0004_audio",
        include_str!("../../migrations/0004_audio.sql"),
    ),
    (
        5,
        "0005_audio_hourly",
        include_str!("../../migrations/0005_audio_hourly.sql"),
    ),
];

/// The advisory lock's key: any constant the fleet's other users of the
/// database do not take ("minions" in ASCII).
const LOCK_KEY: i64 = 0x006d_696e_696f_6e73;

/// Applies the migrations not applied yet; returns how many it applied.
pub(crate) async fn apply(client: &mut Client) -> Result<usize, LedgerError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS ledger_migrations (
             version integer PRIMARY KEY,
             name    text NOT NULL,
             applied timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    let rows = tx
        .query("SELECT version FROM ledger_migrations", &[])
        .await?;
    let have: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    let newest = MIGRATIONS.last().map_or(0, |m| m.0);
    if let Some(v) = have.iter().copied().find(|v| *v > newest) {
        return Err(LedgerError::TooNew {
            found: v,
            known: newest,
        });
    }
    let mut applied = 0;
    for (version, name, sql) in MIGRATIONS {
        if have.contains(version) {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO ledger_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await?;
        tracing::info!(version, name, "ledger migration applied");
        applied += 1;
    }
    tx.commit().await?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_grow_and_names_match_their_files() {
        let mut last = 0;
        for (v, name, sql) in MIGRATIONS {
            assert!(*v > last, "migration {name}: version {v} after {last}");
            assert!(name.starts_with(&format!("{v:04}_")), "{name}");
            assert!(!sql.trim().is_empty());
            last = *v;
        }
    }
}
