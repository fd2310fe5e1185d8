//! `minions team set|list`: the fleet's team policies (weights, quotas) and
//! what each team has queued and running.

use std::fmt::Write as _;

use anyhow::{Context, bail};
use minions_schemas::messages::TeamPolicy;
use minions_schemas::scheduling::{self, TEAMS_KEY, Teams};
use minions_schemas::{SCHEMA_VERSION, encode};

use crate::cli::{Endpoints, TeamSetArgs};

/// Sets a team's weight and quota; returns what the team's policy now is.
/// A concurrent change is detected (the record's revision) and retried.
pub async fn set(endpoints: &Endpoints, args: &TeamSetArgs) -> anyhow::Result<String> {
    minions_schemas::ids::validate("team", &args.team).context("team name")?;
    if let Some(w) = args.weight
        && !(w.is_finite() && w > 0.0 && w <= 1e6)
    {
        bail!("--weight {w}: a weight is a number above 0 (at most 1000000)");
    }
    let (_, js) = endpoints.connect("minions team set").await?;
    let settings =
        minions_endpoints::streams::ensure(&js, &endpoints.replication.work_settings()).await?;
    let kv = minions_endpoints::streams::teams_kv(&js, settings.replicas).await?;
    let mut said = Vec::new();
    if let Some(w) = args.weight {
        said.push(format!("weight {w}"));
    }
    if let Some(q) = args.quota {
        said.push(format!("quota {q}"));
    }
    super::audit::record(
        endpoints,
        &js,
        minions_schemas::messages::ActionKind::TeamSet,
        &args.team,
        &said.join(", "),
    )
    .await?;
    for _ in 0..10 {
        let (mut teams, revision) = minions_endpoints::queue::read_teams(&js).await?;
        teams.v = SCHEMA_VERSION;
        let p = teams
            .teams
            .entry(args.team.clone())
            .or_insert_with(TeamPolicy::default);
        if let Some(w) = args.weight {
            p.weight = w;
        }
        if let Some(q) = args.quota {
            p.quota = q;
        }
        let shown = describe(&args.team, p);
        let bytes = bytes::Bytes::from(encode("team policies", &teams)?);
        let written = if revision == 0 {
            kv.create(TEAMS_KEY, bytes)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else {
            kv.update(TEAMS_KEY, bytes, revision)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        match written {
            Ok(()) => {
                tracing::info!(team = %args.team, "team policy set");
                return Ok(shown);
            }
            Err(e) => tracing::debug!(error = %e, "team policies changed meanwhile; reading again"),
        }
    }
    bail!("the team policies kept changing under this command; try again")
}

fn describe(team: &str, p: &TeamPolicy) -> String {
    let quota = if p.quota == 0 {
        "no quota".to_owned()
    } else {
        format!("quota {} slots", p.quota)
    };
    format!("team {team}: weight {}, {quota}", p.weight)
}

/// Every team's policy, and its jobs queued and running now.
pub async fn list(endpoints: &Endpoints, json: bool) -> anyhow::Result<String> {
    let (_, js) = endpoints.connect("minions team list").await?;
    let (teams, _): (Teams, u64) = minions_endpoints::queue::read_teams(&js).await?;
    let jobs = minions_endpoints::queue::list_jobs(&js).await?;
    let schedule = scheduling::build(
        minions_schemas::time::now_ms(),
        jobs,
        &teams,
        &Default::default(),
    );
    if json {
        return Ok(serde_json::to_string_pretty(&schedule)?);
    }
    let mut out = String::new();
    if schedule.teams.is_empty() {
        out.push_str("no teams set and no jobs queued (every team has weight 1 until set)");
    }
    for t in &schedule.teams {
        let p = TeamPolicy {
            v: SCHEMA_VERSION,
            weight: t.weight,
            quota: t.quota,
        };
        let jobs: Vec<_> = schedule.jobs.iter().filter(|j| j.team == t.team).collect();
        let pending: u64 = jobs.iter().map(|j| j.pending).sum();
        let running: u64 = jobs.iter().map(|j| j.running).sum();
        writeln!(
            out,
            "{}; {} job(s), {pending} shards queued, {running} running",
            describe(&t.team, &p),
            jobs.len()
        )?;
        for j in jobs {
            writeln!(
                out,
                "  {} {}{}: {} queued, {} running",
                j.job,
                j.priority,
                if j.preemptible { " preemptible" } else { "" },
                j.pending,
                j.running
            )?;
        }
    }
    Ok(out.trim_end().to_owned())
}
