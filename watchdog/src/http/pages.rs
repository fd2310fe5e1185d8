//! The dashboard's HTML: a page shell with inline style and script (works
//! offline), and the live fragments its script swaps in every second.
//! Every value from outside (hosts, reasons, job ids) is escaped.

use std::fmt::Write;

use minions_endpoints::ledger::amount;
use minions_schemas::progress::{Progress, human_secs};

use super::usage::{LedgerState, Sums, UsageReport};
use crate::explain::Reason;
use crate::view::{Snapshot, WorkerRow};
use minions_schemas::messages::OperatorAction;

const CSS: &str = include_str!("dashboard.css");
const JS: &str = include_str!("dashboard.js");

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What a page shows around its fragment.
#[derive(Debug, Clone, Copy)]
pub struct Shell<'a> {
    /// The page's title.
    pub title: &'a str,
    /// The watchdog's name.
    pub watchdog: &'a str,
    /// Where the page's fragment is fetched again from (None: a page that
    /// does not refresh).
    pub fragment_url: Option<&'a str>,
    /// Seconds between refreshes.
    pub every_secs: u32,
    /// The JSON the page shows, linked from the header.
    pub json_url: &'a str,
    /// The watchdog keeps a usage ledger: the header links to `/usage`.
    pub ledger: bool,
}

impl<'a> Shell<'a> {
    /// A live page refreshed every second, its JSON at `/api/fleet`.
    pub fn live(title: &'a str, watchdog: &'a str, fragment_url: &'a str, ledger: bool) -> Self {
        Self {
            title,
            watchdog,
            fragment_url: Some(fragment_url),
            every_secs: 1,
            json_url: "/api/fleet",
            ledger,
        }
    }
}

/// The sign-in page: a form for a token (from `minions admin add-viewer`
/// or `add-operator`), with `problem` above it when the last one failed.
pub fn sign_in(problem: Option<&str>) -> String {
    let problem = problem.map_or(String::new(), |p| {
        format!("<p class=\"problem\">{}</p>", esc(p))
    });
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
<title>Sign in · Minions</title><style>{CSS}</style></head><body>\
<header><h1>Minions</h1></header><main id=\"signin\"><h2>Sign in</h2>{problem}\
<p>This dashboard needs a token: ask an operator for one \
(<code>minions admin add-viewer NAME --access-file FILE</code>).</p>\
<form method=\"post\" action=\"/signin\"><label>Token \
<input name=\"token\" type=\"password\" autocomplete=\"off\" size=\"70\" required></label> \
<button type=\"submit\">Sign in</button></form></main></body></html>\n"
    )
}

/// A whole page around a fragment, live where `shell` has a fragment URL.
pub fn page(shell: &Shell<'_>, fragment: &str) -> String {
    let refresh = match (shell.fragment_url, shell.every_secs) {
        (None, _) => String::new(),
        (Some(_), 0 | 1) => "live, updated every second · ".to_owned(),
        (Some(_), n) => format!("live, updated every {n} seconds · "),
    };
    let live = shell.fragment_url.map_or(String::new(), |u| {
        format!(
            " data-fragment=\"{}\" data-every=\"{}\"",
            esc(u),
            1000 * shell.every_secs.max(1)
        )
    });
    let usage = if shell.ledger {
        "<a href=\"/usage\">usage</a> · "
    } else {
        ""
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
<title>{title}</title><style>{CSS}</style></head><body>\
<header><h1><a href=\"/\">Minions</a></h1><span class=\"meta\">watchdog {w} · {refresh}\
{usage}<a href=\"/metrics\">metrics</a> · <a href=\"{json}\">json</a></span></header>\
<div id=\"offline\">The watchdog does not answer; showing the last view.</div>\
<main id=\"live\"{live}>{fragment}</main><script>{JS}</script></body></html>\n",
        title = esc(shell.title),
        w = esc(shell.watchdog),
        json = esc(shell.json_url),
    )
}

fn state(word: &str) -> String {
    format!("<span class=\"state {w}\">{w}</span>", w = esc(word))
}

fn bar(p: &Progress) -> String {
    let done = 100.0 * p.fraction_done();
    let failed = if p.shards == 0 {
        0.0
    } else {
        100.0 * f64::from(p.failed) / f64::from(p.shards)
    };
    format!(
        "<span class=\"bar\" title=\"{done:.1}% done\"><i class=\"done\" style=\"width:{done:.2}%\"></i>\
<i class=\"failed\" style=\"left:{done:.2}%;width:{failed:.2}%\"></i></span> <b class=\"pct\">{done:.1}%</b>"
    )
}

fn eta(p: &Progress) -> String {
    match p.eta_secs {
        Some(e) if !p.state.is_final() => human_secs(e),
        _ => "–".to_owned(),
    }
}

fn mb(v: u64) -> String {
    if v == 0 {
        "–".to_owned()
    } else if v >= 10_240 {
        format!("{:.0} GB", v as f64 / 1024.0)
    } else {
        format!("{v} MB")
    }
}

/// A bar chart of records per minute, oldest first, as inline SVG.
pub fn chart(history: &[u64]) -> String {
    let max = history.iter().copied().max().unwrap_or(0).max(1);
    let n = history.len().max(1);
    let w = 1000.0 / n as f64;
    let mut s = format!(
        "<svg class=\"chart\" viewBox=\"0 0 1000 100\" preserveAspectRatio=\"none\" role=\"img\" aria-label=\"records per minute, last {n} minutes\">"
    );
    for (i, v) in history.iter().enumerate() {
        let h = 100.0 * *v as f64 / max as f64;
        let _ = write!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\"><title>{v} records</title></rect>",
            i as f64 * w,
            100.0 - h,
            (w - 1.0).max(0.5)
        );
    }
    s.push_str("</svg>");
    s
}

/// ", high priority" / ", preemptible" where the job is not a plain
/// normal one.
fn priority_note(p: &Progress) -> String {
    let mut s = String::new();
    if p.priority != minions_schemas::messages::Priority::Normal {
        let _ = write!(s, ", {} priority", p.priority);
    }
    if p.preemptible {
        s.push_str(", preemptible");
    }
    s
}

fn jobs_table(jobs: &[Progress]) -> String {
    if jobs.is_empty() {
        return "<p class=\"muted\">No jobs yet. Submit one with <code>minions submit --model NAME --input FILE.jsonl</code>.</p>".to_owned();
    }
    let mut s = String::from(
        "<table id=\"jobs\"><tr><th>job</th><th>state</th><th>progress</th><th class=\"num\">done</th><th class=\"num\">running</th>\
<th class=\"num\">pending</th><th class=\"num\">failed</th><th class=\"num\">redeliveries</th><th class=\"num\">records/s</th><th class=\"num\">ETA</th></tr>",
    );
    for p in jobs {
        let _ = write!(
            s,
            "<tr class=\"job\" data-job=\"{id}\" data-state=\"{st}\" data-pct=\"{pct:.1}\"><td><a href=\"/jobs/{id}\">{id}</a><br><span class=\"muted\">{model}, {records} records, team {team}{prio}</span></td>\
<td>{state}</td><td>{bar}</td><td class=\"num\">{done}/{shards}</td><td class=\"num\">{running}</td><td class=\"num\">{pending}</td>\
<td class=\"num\">{failed}</td><td class=\"num\">{redel}</td><td class=\"num\">{rate:.1}{tokens}</td><td class=\"num\">{eta}</td></tr>",
            id = esc(&p.job),
            tokens = tokens_note(p),
            st = p.state.as_str(),
            pct = 100.0 * p.fraction_done(),
            model = esc(&p.model),
            records = p.records,
            team = esc(&p.team),
            prio = priority_note(p),
            state = state(p.state.as_str()),
            bar = bar(p),
            done = p.done,
            shards = p.shards,
            running = p.running,
            pending = p.pending,
            failed = p.failed,
            redel = p.redeliveries,
            rate = p.rate,
            eta = eta(p),
        );
    }
    s.push_str("</table>");
    s
}

/// For generation jobs, the tokens generated and their rate, under the
/// records/s figure.
fn tokens_note(p: &Progress) -> String {
    if p.audio_secs > 0.0 {
        return format!(
            "<br><span class=\"muted\">{} of audio, {:.1}× real time</span>",
            minions_schemas::progress::human_secs(p.audio_secs),
            p.audio_rate
        );
    }
    if p.tokens == 0 {
        return String::new();
    }
    format!(
        "<br><span class=\"muted\">{} tokens, {:.1}/s</span>",
        p.tokens, p.token_rate
    )
}

/// A button that posts an action (operators only see them).
fn act_button(action: &str, label: &str, confirm: Option<&str>) -> String {
    let confirm = confirm.map_or(String::new(), |c| {
        format!(" onsubmit=\"return confirm('{}')\"", esc(c))
    });
    format!(
        "<form method=\"post\" action=\"{}\" class=\"act\"{confirm}><button type=\"submit\">{}</button></form>",
        esc(action),
        esc(label)
    )
}

/// The actions an operator may take on worker `w`.
fn worker_actions(w: &WorkerRow) -> String {
    let state = w.state.as_str();
    if matches!(state, "dead" | "left") {
        return String::new();
    }
    let base = format!("{}worker/{}", super::access::ACT_PREFIX, w.id);
    let mut s = String::new();
    if state == "draining" {
        s.push_str(&act_button(&format!("{base}/resume"), "resume", None));
    } else {
        s.push_str(&act_button(&format!("{base}/drain"), "drain", None));
    }
    s.push_str(&act_button(
        &format!("{base}/evict"),
        "evict",
        Some("Evict this worker? Its shards go back to the queue and it leaves."),
    ));
    s
}

fn workers_table(workers: &[WorkerRow], can_act: bool) -> String {
    if workers.is_empty() {
        return "<p class=\"muted\">No workers have reported. Start <code>minions-worker</code> on a machine, or <code>minions dev</code> here.</p>".to_owned();
    }
    let mut s = String::from(
        "<table id=\"workers\"><tr><th>worker</th><th>device</th><th>state</th><th>owner</th><th>running</th>\
<th class=\"num\">done</th><th class=\"num\">records/s</th><th class=\"num\">memory free / lent</th><th class=\"num\">last beat</th>",
    );
    if can_act {
        s.push_str("<th>act</th>");
    }
    s.push_str("</tr>");
    for w in workers {
        let owner_class = if w.lending() {
            ""
        } else {
            " class=\"owner-away\""
        };
        let running = if !w.stage.is_empty() {
            let held = format!("<span class=\"stage\">{}</span>", esc(&w.stage));
            if w.running.is_empty() {
                held
            } else {
                format!("{held}<br>{}", esc(&w.running.join(", ")))
            }
        } else if w.running.is_empty() {
            format!("<span class=\"muted\">0 of {}</span>", w.holds)
        } else {
            format!(
                "{} of {}: {}",
                w.running.len(),
                w.holds,
                esc(&w.running.join(", "))
            )
        };
        let _ = write!(
            s,
            "<tr class=\"worker\" data-state=\"{st}\"><td>{host}<br><span class=\"muted\">{id}</span></td><td>{device}<br><span class=\"muted\">{made}</span></td><td>{state}</td>\
<td{owner_class}>{owner}</td><td>{running}</td><td class=\"num\">{done}</td><td class=\"num\">{rate:.1}</td>\
<td class=\"num\">{avail} / {budget}</td><td class=\"num\">{beat:.1} s ago</td>{act}</tr>",
            st = w.state.as_str(),
            host = esc(&w.host),
            id = esc(&w.id),
            device = esc(&w.device),
            made = esc(&made_by(&w.kernel, &w.build)),
            state = state(w.state.as_str()),
            owner = esc(&w.owner),
            done = w.done,
            rate = w.rate,
            avail = mb(w.mem_avail_mb),
            budget = if w.mem_budget_mb == 0 {
                "all".to_owned()
            } else {
                mb(w.mem_budget_mb)
            },
            beat = w.last_beat_secs,
            act = if can_act {
                format!("<td>{}</td>", worker_actions(w))
            } else {
                String::new()
            },
        );
    }
    s.push_str("</table>");
    s
}

/// A worker's kernel path and build, as the workers table shows them.
fn made_by(kernel: &str, build: &str) -> String {
    match (kernel.is_empty(), build.is_empty()) {
        (true, true) => "build unknown".to_owned(),
        (false, true) => kernel.to_owned(),
        (true, false) => build.to_owned(),
        (false, false) => format!("{kernel} · {build}"),
    }
}

fn card(value: &str, label: &str) -> String {
    format!("<div class=\"card\"><b>{value}</b><span>{label}</span></div>")
}

/// The last actions on record, newest first.
fn actions_table(actions: &[OperatorAction]) -> String {
    if actions.is_empty() {
        return "<p class=\"muted\">None on record yet (drain, evict, resume, release, cancel, retry, team set, quarantine).</p>".to_owned();
    }
    let mut s = String::from(
        "<table id=\"actions\"><tr><th>when (UTC)</th><th>who</th><th>from</th><th>action</th><th>on</th><th>detail</th></tr>",
    );
    for a in actions {
        let when = chrono::DateTime::from_timestamp_millis(i64::try_from(a.at_ms).unwrap_or(0))
            .map_or_else(
                || a.at_ms.to_string(),
                |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
            );
        let _ = write!(
            s,
            "<tr class=\"action\"><td>{when}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&a.by),
            esc(&a.via),
            a.action.as_str(),
            esc(&a.target),
            esc(&a.detail)
        );
    }
    s.push_str("</table>");
    s
}

/// The page that says how a dashboard action went.
pub fn acted(text: &str, ok: bool) -> String {
    format!(
        "<section><h2>{}</h2><p class=\"{}\" id=\"acted\">{}</p><p><a href=\"/\">Back to the fleet</a> · <code>minions audit</code> lists it</p></section>",
        if ok { "Done" } else { "Not done" },
        if ok { "" } else { "owner-away" },
        esc(text)
    )
}

/// The fleet page's live part: counts, queue, throughput, jobs, workers and
/// the last actions; with `can_act` (an operator) the action buttons too.
pub fn fleet(s: &Snapshot, can_act: bool) -> String {
    let n = |k: &str| s.states.get(k).copied().unwrap_or(0);
    let alive = n("joining") + n("idle") + n("busy") + n("draining");
    let last_min = s.history.last().copied().unwrap_or(0);
    let q = &s.queue;
    let ack = if q.max_ack_pending > 0 {
        format!("{} / {}", q.ack_pending, q.max_ack_pending)
    } else {
        q.ack_pending.to_string()
    };
    let mut out = String::new();
    out.push_str("<section><h2>Fleet</h2><div class=\"cards\">");
    out.push_str(&card(&alive.to_string(), "workers alive"));
    for k in ["idle", "busy", "draining", "suspect", "dead"] {
        out.push_str(&card(&n(k).to_string(), k));
    }
    out.push_str(&card(&s.owner_active.to_string(), "owner using it"));
    out.push_str(&card(
        &s.quarantined.len().to_string(),
        "machines quarantined",
    ));
    out.push_str("</div>");
    for (machine, why) in &s.quarantined {
        let release = if can_act {
            act_button(
                &format!("{}machine/{machine}/release", super::access::ACT_PREFIX),
                "release",
                Some("Release this machine? Its workers pull again."),
            )
        } else {
            String::new()
        };
        let _ = write!(
            out,
            "<p class=\"owner-away\">Machine <b>{}</b> is quarantined: {} (its workers pull nothing until <code>minions worker release {}</code>) {release}</p>",
            esc(machine),
            esc(why),
            esc(machine)
        );
    }
    out.push_str("</section>");

    out.push_str("<section><h2>Queue</h2><div class=\"cards\">");
    if !q.ok {
        let _ = write!(
            out,
            "<p class=\"owner-away\">The work queue cannot be read: {}</p>",
            esc(q.error.as_deref().unwrap_or("not read yet"))
        );
    }
    out.push_str(&card(&q.depth.to_string(), "shards queued or running"));
    out.push_str(&card(&q.pending.to_string(), "not yet delivered"));
    out.push_str(&card(&ack, "unacked / limit"));
    out.push_str(&card(&q.waiting.to_string(), "idle slots asking"));
    out.push_str(&card(&s.counters.redeliveries.to_string(), "redeliveries"));
    out.push_str(&card(&s.counters.failed.to_string(), "dead letters"));
    out.push_str(&card(
        &s.counters.owner_handbacks.to_string(),
        "owner hand-backs",
    ));
    out.push_str("</div>");
    let _ = write!(
        out,
        "<h2 style=\"margin-top:12px\">Throughput: {last_min} records this minute</h2>{}<div class=\"muted\">records per minute, last hour</div></section>",
        chart(&s.history)
    );

    let _ = write!(
        out,
        "<section><h2>Jobs</h2>{}</section><section><h2>Workers</h2>{}</section><section><h2>Last actions</h2>{}</section>",
        jobs_table(&s.jobs),
        workers_table(&s.workers, can_act),
        actions_table(&s.actions)
    );
    out
}

/// The actions an operator may take on job `p`.
fn job_actions(p: &Progress) -> String {
    let base = format!("{}job/{}", super::access::ACT_PREFIX, p.job);
    let mut s = String::new();
    if !p.state.is_final() {
        s.push_str(&act_button(
            &format!("{base}/cancel"),
            "cancel",
            Some("Cancel this job? Its queued shards are dropped and running ones stopped."),
        ));
    }
    if !p.failed_shards.is_empty() {
        s.push_str(&act_button(
            &format!("{base}/retry"),
            "retry failed shards",
            None,
        ));
    }
    if s.is_empty() {
        s
    } else {
        format!("<p id=\"job-actions\">{s}</p>")
    }
}

/// A job page's live part: its progress, why waiting shards wait, and its
/// failed shards with reasons; with `can_act` (an operator) the action
/// buttons too.
pub fn job(p: &Progress, reasons: &[Reason], can_act: bool) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<section><h2>Job {id} {state}</h2><p class=\"muted\">model {model}, team {team}{prio}</p><p>{bar}</p><div class=\"cards\">{c1}{c2}{c3}{c4}{c5}{c6}{c7}{c8}</div></section>",
        id = esc(&p.job),
        model = esc(&p.model),
        team = esc(&p.team),
        prio = priority_note(p),
        state = state(p.state.as_str()),
        bar = bar(p),
        c1 = card(&format!("{}/{}", p.done, p.shards), "shards done"),
        c2 = card(&p.running.to_string(), "running"),
        c3 = card(&p.pending.to_string(), "pending"),
        c4 = card(&p.failed.to_string(), "failed"),
        c5 = card(&p.redeliveries.to_string(), "redeliveries"),
        c6 = card(&format!("{:.1}", p.rate), "records/s"),
        c7 = card(&eta(p), "ETA"),
        c8 = if p.tokens > 0 {
            card(&format!("{:.1}", p.token_rate), "tokens/s")
        } else if p.audio_secs > 0.0 {
            card(&format!("{:.1}×", p.audio_rate), "real time")
        } else {
            String::new()
        },
    );
    if can_act {
        let actions = job_actions(p);
        if let Some(at) = out.rfind("</section>") {
            out.insert_str(at, &actions);
        }
    }
    out.push_str("<section id=\"explain\"><h2>Why are shards waiting?</h2><ul class=\"reasons\">");
    for r in reasons {
        let _ = write!(out, "<li data-reason=\"{}\">{}</li>", r.key, esc(&r.text));
    }
    out.push_str("</ul></section>");
    if !p.failed_shards.is_empty() {
        out.push_str("<section><h2>Failed shards</h2><table><tr><th class=\"num\">shard</th><th class=\"num\">deliveries</th><th>reason</th></tr>");
        for f in p.failed_shards.iter().take(200) {
            let _ = write!(
                out,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                f.shard,
                f.attempts,
                esc(&f.reason)
            );
        }
        out.push_str("</table>");
        if p.failed_shards.len() > 200 {
            let _ = write!(
                out,
                "<p class=\"muted\">and {} more: <code>minions status {} --json</code> lists all</p>",
                p.failed_shards.len() - 200,
                esc(&p.job)
            );
        }
        let _ = write!(
            out,
            "<p>After fixing the cause, <code>minions retry {}</code> runs them again.</p></section>",
            esc(&p.job)
        );
    }
    out
}

/// The text of the page shown when the watchdog keeps no ledger.
pub const NO_LEDGER: &str = "no ledger: start the watchdog with --ledger URL";

/// The usage page's body on a watchdog without a ledger.
pub fn no_ledger() -> String {
    format!(
        "<section><h2>Usage</h2><p>{NO_LEDGER} (<code>minions-watchdog --ledger postgres://USER@HOST/DB</code>) \
to keep device time, records, tokens, audio and energy per team and per worker.</p></section>"
    )
}

fn sums_cells(s: &Sums) -> String {
    format!(
        "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>",
        amount(s.device_hours, 2),
        s.records,
        s.tokens,
        amount(s.audio_hours, 2),
        amount(s.kwh_measured, 3),
        amount(s.kwh_estimated, 3)
    )
}

const SUMS_HEADS: &str = "<th class=\"num\">device-hours</th><th class=\"num\">records</th>\
<th class=\"num\">tokens</th><th class=\"num\">audio-hours</th><th class=\"num\">kWh measured</th><th class=\"num\">kWh estimated</th>";

fn ledger_state(l: &LedgerState) -> String {
    let mut out = format!(
        "<section id=\"ledger\"><h2>Ledger</h2><p class=\"muted\">PostgreSQL at <code>{}</code>, \
folded from the events stream</p><div class=\"cards\">",
        esc(&l.url)
    );
    out.push_str(&card(
        &state(if l.connected {
            "connected"
        } else {
            "disconnected"
        }),
        "writer",
    ));
    out.push_str(&card(
        &l.cursor.to_string(),
        "cursor (events in the ledger)",
    ));
    out.push_str(&card(
        &l.lag.map_or("–".to_owned(), |n| n.to_string()),
        "events read, not yet written",
    ));
    out.push_str(&card(&l.applied.to_string(), "events applied here"));
    out.push_str(&card(&l.skipped.to_string(), "found applied already"));
    out.push_str("</div></section>");
    out
}

/// The usage page's live part: the window's totals, usage by team and by
/// worker (largest first), and the ledger's state; or why the ledger
/// cannot be read.
pub fn usage(r: &UsageReport) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<section id=\"usage\"><h2>Usage, last {} day{}</h2><p class=\"muted\">",
        r.days,
        if r.days == 1 { "" } else { "s" }
    );
    for (i, d) in [1u32, 7, 30, 90, 366].into_iter().enumerate() {
        if i > 0 {
            out.push_str(" · ");
        }
        let label = if d == 1 {
            "1 day".to_owned()
        } else {
            format!("{d} days")
        };
        if d == r.days {
            let _ = write!(out, "<b>{label}</b>");
        } else {
            let _ = write!(out, "<a href=\"/usage?days={d}\">{label}</a>");
        }
    }
    out.push_str("</p>");
    match (&r.usage, &r.error) {
        (Some(u), _) => {
            let t = &u.total;
            out.push_str("<div class=\"cards\">");
            out.push_str(&card(&amount(t.device_hours, 2), "device-hours"));
            out.push_str(&card(&t.records.to_string(), "records"));
            out.push_str(&card(&t.tokens.to_string(), "tokens"));
            out.push_str(&card(&amount(t.audio_hours, 2), "audio-hours"));
            out.push_str(&card(&amount(t.kwh_measured, 3), "kWh measured"));
            out.push_str(&card(&amount(t.kwh_estimated, 3), "kWh estimated"));
            out.push_str("</div></section>");

            let _ = write!(
                out,
                "<section><h2>By team</h2><table id=\"teams\"><tr><th>team</th>{SUMS_HEADS}</tr>"
            );
            for row in &u.teams {
                let team = row
                    .team
                    .as_deref()
                    .map_or("<span class=\"muted\">(unknown)</span>".to_owned(), esc);
                let _ = write!(
                    out,
                    "<tr class=\"team\"><td>{team}</td>{}</tr>",
                    sums_cells(&row.sums)
                );
            }
            out.push_str("</table>");
            if u.teams.is_empty() {
                out.push_str("<p class=\"muted\">No usage in this window.</p>");
            }
            out.push_str("</section>");

            let _ = write!(
                out,
                "<section><h2>By worker</h2><table id=\"usage-workers\"><tr><th>worker</th><th>host</th>{SUMS_HEADS}</tr>"
            );
            for row in &u.workers {
                let _ = write!(
                    out,
                    "<tr class=\"worker\"><td>{}</td><td>{}</td>{}</tr>",
                    esc(&row.worker),
                    row.host.as_deref().map_or("–".to_owned(), esc),
                    sums_cells(&row.sums)
                );
            }
            out.push_str("</table>");
            if u.workers.is_empty() {
                out.push_str("<p class=\"muted\">No usage in this window.</p>");
            }
            out.push_str("</section>");
        }
        (None, e) => {
            let _ = write!(
                out,
                "<p class=\"owner-away\">{}</p></section>",
                esc(e.as_deref().unwrap_or("the ledger was not read"))
            );
        }
    }
    out.push_str(&ledger_state(&r.ledger));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::usage::{TeamUsage, Usage, WorkerUsage};

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    fn report(usage: Option<Usage>, error: Option<&str>) -> UsageReport {
        UsageReport {
            days: 7,
            ledger: LedgerState {
                url: "postgres://u:***@db/<ledger>".into(),
                connected: true,
                cursor: 120,
                read: 125,
                lag: Some(5),
                applied: 100,
                skipped: 20,
            },
            usage,
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn usage_shows_teams_and_workers_escaped() {
        let sums = |h: f64| Sums {
            device_hours: h,
            records: 1200,
            tokens: 3400,
            audio_hours: 0.5,
            kwh_measured: 0.25,
            kwh_estimated: 0.0125,
        };
        let u = Usage {
            total: sums(3.5),
            teams: vec![
                TeamUsage {
                    team: Some("<script>".into()),
                    sums: sums(2.0),
                },
                TeamUsage {
                    team: None,
                    sums: sums(1.5),
                },
            ],
            workers: vec![WorkerUsage {
                worker: "w1-\"x\"".into(),
                host: Some("mac&01".into()),
                sums: sums(3.5),
            }],
        };
        let html = usage(&report(Some(u), None));
        assert!(html.contains("Usage, last 7 days"), "{html}");
        assert!(html.contains("<b>7 days</b>"), "{html}");
        assert!(html.contains("<a href=\"/usage?days=30\">"), "{html}");
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("<td>&lt;script&gt;</td><td class=\"num\">2.00</td><td class=\"num\">1200</td><td class=\"num\">3400</td><td class=\"num\">0.50</td><td class=\"num\">0.250</td><td class=\"num\">0.013</td>"), "{html}");
        assert!(html.contains("(unknown)"), "{html}");
        assert!(
            html.contains("<td>w1-&quot;x&quot;</td><td>mac&amp;01</td>"),
            "{html}"
        );
        assert_eq!(html.matches("<tr class=\"team\">").count(), 2, "{html}");
        assert!(
            html.contains("postgres://u:***@db/&lt;ledger&gt;"),
            "{html}"
        );
        assert!(html.contains("<b>120</b><span>cursor"), "{html}");
        assert!(html.contains("<b>5</b><span>events read"), "{html}");
        assert!(html.contains("state connected"), "{html}");
    }

    #[test]
    fn an_unreadable_ledger_is_said_and_its_state_still_shown() {
        let html = usage(&report(None, Some("cannot connect to <db>")));
        assert!(html.contains("cannot connect to &lt;db&gt;"), "{html}");
        assert!(!html.contains("By team"), "{html}");
        assert!(html.contains("id=\"ledger\""), "{html}");
        let html = usage(&report(Some(Usage::default()), None));
        assert_eq!(html.matches("No usage in this window").count(), 2, "{html}");
    }

    #[test]
    fn the_shell_links_usage_only_with_a_ledger_and_refreshes_as_asked() {
        let with = page(&Shell::live("t", "wd", "/?fragment=1", true), "x");
        assert!(with.contains("<a href=\"/usage\">usage</a>"), "{with}");
        assert!(with.contains("data-every=\"1000\""), "{with}");
        let without = page(&Shell::live("t", "wd", "/?fragment=1", false), "x");
        assert!(!without.contains("/usage"), "{without}");
        let slow = page(
            &Shell {
                every_secs: 30,
                json_url: "/api/usage?days=7",
                ..Shell::live("t", "<wd>", "/usage?days=7&fragment=1", true)
            },
            "x",
        );
        assert!(slow.contains("updated every 30 seconds"), "{slow}");
        assert!(
            slow.contains("data-fragment=\"/usage?days=7&amp;fragment=1\" data-every=\"30000\""),
            "{slow}"
        );
        assert!(slow.contains("watchdog &lt;wd&gt;"), "{slow}");
        let still = page(
            &Shell {
                fragment_url: None,
                ..Shell::live("t", "wd", "", false)
            },
            &no_ledger(),
        );
        assert!(
            !still.contains("data-fragment=") && !still.contains("live, updated"),
            "{still}"
        );
        assert!(still.contains(NO_LEDGER), "{still}");
    }

    #[test]
    fn operators_get_the_buttons_a_job_calls_for() -> Result<(), minions_schemas::IdError> {
        let spec = minions_schemas::messages::test_spec_of("alpha--j1", 4, 1)?;
        let mut p = minions_schemas::progress::fold(&spec, &[], 0);
        p.state = minions_schemas::progress::JobState::Running;
        assert!(!job(&p, &[], false).contains("form"));
        let page = job(&p, &[], true);
        assert!(
            page.contains("action=\"/act/job/alpha--j1/cancel\""),
            "{page}"
        );
        assert!(!page.contains("/retry"), "{page}");
        p.state = minions_schemas::progress::JobState::Failed;
        p.failed_shards
            .push(minions_schemas::progress::FailedShard {
                shard: 3,
                reason: "out of memory".into(),
                attempts: 3,
            });
        let page = job(&p, &[], true);
        assert!(!page.contains("/cancel"), "{page}");
        assert!(
            page.contains("action=\"/act/job/alpha--j1/retry\""),
            "{page}"
        );
        Ok(())
    }

    #[test]
    fn chart_scales_to_the_busiest_minute() {
        let svg = chart(&[0, 5, 10]);
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains("height=\"100.0\""), "{svg}");
        assert!(svg.contains("height=\"50.0\""), "{svg}");
    }
}
