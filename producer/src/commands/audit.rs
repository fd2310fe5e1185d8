//! Operator actions on record: [`record`] is what every command that
//! changes the fleet (worker drain, evict, resume, release; cancel; retry;
//! team set) calls before it acts, and `minions audit` lists what is on
//! record, oldest first.

use std::fmt::Write as _;

use minions_endpoints::actions;
use minions_schemas::messages::{ActionKind, OperatorAction};

use crate::cli::{AuditArgs, Endpoints};

/// Puts `action` on `target` on record as this program's identity, from
/// the command line; an action that cannot be recorded is not done.
pub async fn record(
    endpoints: &Endpoints,
    js: &async_nats::jetstream::Context,
    action: ActionKind,
    target: &str,
    detail: &str,
) -> anyhow::Result<()> {
    let by = endpoints.security.identity_name();
    actions::record(js, &by, "cli", action, target, detail).await?;
    tracing::debug!(by = %by, action = action.as_str(), target, "action on record");
    Ok(())
}

/// `minions audit`: the actions on record since `--since` (default 7
/// days), as a table or JSON.
pub async fn run(endpoints: &Endpoints, args: &AuditArgs) -> anyhow::Result<String> {
    let (_, js) = endpoints.connect("minions audit").await?;
    let since = args.since.resolve(chrono::Utc::now()).timestamp_millis();
    let mut rows = actions::since(&js, u64::try_from(since).unwrap_or(0)).await?;
    if let Some(by) = &args.by {
        rows.retain(|a| &a.by == by);
    }
    if rows.len() > args.limit {
        rows.drain(..rows.len() - args.limit);
    }
    if args.json {
        return Ok(serde_json::to_string_pretty(&rows)?);
    }
    Ok(render(&rows))
}

fn render(rows: &[OperatorAction]) -> String {
    if rows.is_empty() {
        return "no actions on record in that time".into();
    }
    let mut out = format!(
        "{:<20} {:<16} {:<9} {:<10} {:<28} {}\n",
        "WHEN (UTC)", "WHO", "FROM", "ACTION", "ON", "DETAIL"
    );
    for a in rows {
        let when = chrono::DateTime::from_timestamp_millis(i64::try_from(a.at_ms).unwrap_or(0))
            .map_or_else(
                || a.at_ms.to_string(),
                |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
            );
        let _ = writeln!(
            out,
            "{when:<20} {:<16} {:<9} {:<10} {:<28} {}",
            a.by,
            a.via,
            a.action.as_str(),
            a.target,
            a.detail
        );
    }
    out.trim_end().to_owned()
}
