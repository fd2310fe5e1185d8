//! The watchdog's dashboard and metrics, looked at as an operator and as
//! Prometheus would: a job submitted before any worker exists is explained
//! ("no worker is connected"); a real headless Chromium shows both workers
//! and the job going to 100% without a reload; `/metrics`, read by a Prometheus
//! text-format parser, counts exactly the job's shards and records; the job
//! page says why nothing waits; `minions watch` follows the job to its end;
//! the dashboard's and `status`'s counts are the manifest's, and stay so
//! once the watchdog has forgotten the finished job (it keeps one here) and
//! reads its manifest instead; every metric the shipped Grafana dashboard
//! queries exists.
//!
//! `MINIONS_UPDATE_SCREENSHOT=1` also writes the screenshot taken midway to
//! docs/dashboard.png.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use minions_tests::web::{Browser, get};
use minions_tests::{Fleet, Result, bin, workspace_root, write_corpus};
use prometheus_parse::{Scrape, Value};

const RECORDS: usize = 1200;
const SHARD: u32 = 30;
const SHARDS: u32 = 40;

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_shows_two_workers_and_a_job_reaching_100_percent() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

fn wait_until<T>(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let until = Instant::now() + within;
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) if Instant::now() >= until => return Err(e),
            Err(_) => {}
        }
        if Instant::now() >= until {
            return Err(format!("{what}: not within {within:?}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    fleet.push_slow_model()?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, RECORDS)?;
    fleet.add_watchdog(&["--finished-jobs-kept", "1"])?;
    let base = fleet.dashboards[0].clone();
    wait_until("healthz", Duration::from_secs(20), || {
        Ok(get(&format!("{base}/healthz"))
            .ok()
            .filter(|(s, _)| *s == 200)
            .map(|_| ()))
    })?;

    // Submitted before any worker exists: the job page says why it waits.
    let job = fleet.submit("slow", &input, SHARD, "dash")?;
    let why = wait_until(
        "the job known to the watchdog",
        Duration::from_secs(10),
        || {
            let (code, body) = get(&format!("{base}/api/jobs/{job}"))?;
            if code != 200 {
                return Ok(None);
            }
            let v: serde_json::Value = serde_json::from_str(&body)?;
            Ok(Some(v["waiting_because"][0].clone()))
        },
    )?;
    eprintln!("before any worker: {}", why["text"]);
    assert_eq!(why["key"], "no_workers", "{why}");

    let browser = Browser::start(fleet.dir.path())?;
    browser.open(&format!("{base}/"))?;
    // A marker that a reload would wipe: the page must update in place.
    browser.eval("window.__minionsNoReload = 1; return 1;")?;
    fleet.add_worker(&["--slots", "1"])?;
    fleet.add_worker(&["--slots", "1"])?;
    let workers = wait_until("2 workers on the page", Duration::from_secs(30), || {
        let n = browser
            .eval("return document.querySelectorAll('#workers tr.worker').length;")?
            .as_u64()
            .unwrap_or(0);
        Ok((n == 2).then_some(n))
    })?;
    eprintln!("dashboard shows {workers} workers");
    // Each worker's build and kernel path, in `worker list` and on the
    // dashboard.
    let listed: serde_json::Value =
        serde_json::from_str(&fleet.cli(&["worker", "list", "--json"])?)?;
    let (_, fleet_json) = get(&format!("{base}/api/fleet"))?;
    let shown: serde_json::Value = serde_json::from_str(&fleet_json)?;
    for rows in [&listed, &shown["workers"]] {
        let rows = rows.as_array().ok_or("no worker rows")?;
        assert_eq!(rows.len(), 2, "{rows:?}");
        for w in rows {
            let (build, kernel) = (w["build"].as_str(), w["kernel"].as_str());
            assert!(
                build.is_some_and(|b| b.starts_with(env!("CARGO_PKG_VERSION"))),
                "{w}"
            );
            assert!(kernel.is_some_and(|k| !k.is_empty()), "{w}");
        }
    }
    let kernel = listed[0]["kernel"].as_str().unwrap_or_default().to_owned();
    let cell = browser.eval("return document.querySelector('#workers tr.worker').textContent;")?;
    assert!(cell.as_str().is_some_and(|t| t.contains(&kernel)), "{cell}");
    eprintln!(
        "worker list and dashboard: kernel {kernel}, build {}",
        listed[0]["build"]
    );

    let watch = std::process::Command::new(bin("minions")?)
        .args(["watch", &job, "--json", "--interval-ms", "250"])
        .envs(fleet.cli_env())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;

    let row = format!(
        "var r = document.querySelector('#jobs tr.job[data-job=\"{job}\"]'); return r ? r.getAttribute('data-pct') : null;"
    );
    let mut seen: Vec<f64> = Vec::new();
    let mut midway = None;
    let started = Instant::now();
    wait_until("job at 100% on the page", Duration::from_secs(240), || {
        if let Some(p) = browser
            .eval(&row)?
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            && seen.last() != Some(&p)
        {
            seen.push(p);
            if midway.is_none() && (50.0..100.0).contains(&p) {
                midway = Some(browser.screenshot(&fleet.dir.path().join("dashboard-midway.png"))?);
            }
        }
        Ok((seen.last() == Some(&100.0)).then_some(()))
    })?;
    eprintln!(
        "page showed the job at {seen:?} % over {:.1} s without a reload",
        started.elapsed().as_secs_f64()
    );
    assert!(
        seen.iter().any(|p| *p < 100.0),
        "the page never showed the job unfinished: {seen:?}"
    );
    let marker = browser.eval("return window.__minionsNoReload || 0;")?;
    assert_eq!(marker, 1, "the page was reloaded");
    let workers = browser.eval("return document.querySelectorAll('#workers tr.worker').length;")?;
    assert_eq!(workers, 2);
    let done_shot = browser.screenshot(&fleet.dir.path().join("dashboard.png"))?;
    let shot = midway.unwrap_or(done_shot);
    if std::env::var_os("MINIONS_UPDATE_SCREENSHOT").is_some() {
        let docs = workspace_root().join("docs");
        std::fs::create_dir_all(&docs)?;
        std::fs::copy(&shot, docs.join("dashboard.png"))?;
        eprintln!("screenshot written to docs/dashboard.png");
    }

    // The job page: nothing waits, and it says so.
    browser.open(&format!("{base}/jobs/{job}"))?;
    let reason = browser.eval(
        "var li = document.querySelector('#explain li'); return li ? li.getAttribute('data-reason') : null;",
    )?;
    assert_eq!(reason, "ended");

    // `minions watch` ended with the job, exit 0, last line done.
    let out = watch.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "watch failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    let last = lines.last().ok_or("watch printed nothing")?;
    assert_eq!(last["state"], "done", "{last}");
    assert_eq!(last["done"], SHARDS);
    eprintln!(
        "minions watch printed {} updates, the last: done",
        lines.len()
    );

    // /metrics as Prometheus reads it.
    let status = fleet.wait_job(&job, Duration::from_secs(30))?;
    let (code, text) = get(&format!("{base}/metrics"))?;
    assert_eq!(code, 200);
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))?;
    let value = |name: &str, label: Option<(&str, &str)>| -> Option<f64> {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .and_then(|s| match &s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
                Value::Histogram(b) => b
                    .iter()
                    .find(|c| c.less_than.is_infinite())
                    .map(|c| c.count),
                Value::Summary(_) => None,
            })
    };
    let done = value("minions_shards_total", Some(("outcome", "done")));
    let failed = value("minions_shards_total", Some(("outcome", "failed")));
    let records = value("minions_records_total", None);
    let durations = value("minions_shard_duration_seconds", None);
    let ratio = value("minions_job_progress_ratio", Some(("job", &job)));
    let idle = value("minions_workers", Some(("state", "idle"))).unwrap_or(0.0)
        + value("minions_workers", Some(("state", "busy"))).unwrap_or(0.0);
    eprintln!(
        "metrics: done={done:?} failed={failed:?} records={records:?} duration_count={durations:?} progress={ratio:?} live workers={idle}; status: {} done, {} records",
        status["done"], status["records_done"]
    );
    assert_eq!(done, Some(f64::from(SHARDS)));
    assert_eq!(status["done"], SHARDS);
    assert_eq!(failed, Some(0.0));
    assert_eq!(records, Some(RECORDS as f64));
    assert_eq!(status["records_done"], RECORDS);
    assert_eq!(durations, Some(f64::from(SHARDS)));
    assert_eq!(ratio, Some(1.0));
    assert_eq!(idle, 2.0);
    assert!(value("minions_heartbeats_total", None).unwrap_or(0.0) > 0.0);
    // The dashboard, `status` and the manifest tell the same counts; a
    // second job closes and the watchdog forgets the first (it keeps one
    // finished job), whose page then reads the manifest.
    let manifest = fleet.manifest(&job)?;
    let counts = |v: &serde_json::Value| (v["done"].as_u64(), v["failed"].as_u64());
    let page = |job: &str| -> Result<serde_json::Value> {
        let (code, body) = get(&format!("{base}/api/jobs/{job}"))?;
        assert_eq!(code, 200, "{body}");
        Ok(serde_json::from_str::<serde_json::Value>(&body)?["progress"].clone())
    };
    let want = (
        Some(u64::from(manifest.done)),
        Some(u64::from(manifest.failed)),
    );
    assert_eq!(counts(&page(&job)?), want);
    assert_eq!(counts(&status), want);
    let small = fleet.dir.path().join("one.jsonl");
    write_corpus(&small, 1)?;
    let second = fleet.submit("slow", &small, SHARD, "dash2")?;
    fleet.wait_job(&second, Duration::from_secs(60))?;
    let forgotten = wait_until("the first job forgotten", Duration::from_secs(10), || {
        let (_, fleet_json) = get(&format!("{base}/api/fleet"))?;
        Ok((!fleet_json.contains(&format!("\"{job}\""))).then_some(()))
    });
    forgotten?;
    let from_manifest = page(&job)?;
    assert_eq!(counts(&from_manifest), want);
    assert_eq!(from_manifest["state"], "done");
    assert_eq!(from_manifest["records_done"], RECORDS);
    eprintln!(
        "dashboard, status and manifest: {want:?} done/failed; the forgotten job's page reads its manifest"
    );

    // `minions jobs` lists both, newest first, with the same counts; its
    // filters narrow the list.
    let listed: serde_json::Value = serde_json::from_str(&fleet.cli(&["jobs", "--json"])?)?;
    let ids: Vec<&str> = listed
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["job"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, [second.as_str(), job.as_str()], "{listed}");
    assert_eq!(listed[1]["state"], "done");
    assert_eq!(
        (listed[1]["done"].as_u64(), listed[1]["failed"].as_u64()),
        want
    );
    assert_eq!(listed[1]["model"], "slow");
    let one: serde_json::Value =
        serde_json::from_str(&fleet.cli(&["jobs", "--json", "--limit", "1"])?)?;
    assert_eq!(one.as_array().map(Vec::len), Some(1));
    assert_eq!(one[0]["job"], second.as_str());
    let table = fleet.cli(&["jobs", "--state", "done", "--since", "1h"])?;
    eprintln!("minions jobs:\n{table}");
    assert!(table.starts_with("JOB ") && table.contains(&job), "{table}");
    assert_eq!(
        fleet.cli(&["jobs", "--state", "running"])?.trim(),
        "no jobs match (state running)"
    );

    // The queue empties once the last ack is read (polled every second).
    wait_until("queue depth 0 in /metrics", Duration::from_secs(10), || {
        let (_, t) = get(&format!("{base}/metrics"))?;
        Ok(t.lines()
            .any(|l| l == "minions_queue_depth 0")
            .then_some(()))
    })?;

    // Every metric the Grafana dashboard queries is exported.
    let exported: BTreeSet<String> = scrape.docs.keys().cloned().collect();
    let dashboard =
        std::fs::read_to_string(workspace_root().join("deploy/grafana/minions-dashboard.json"))?;
    let _: serde_json::Value = serde_json::from_str(&dashboard)?;
    let mut queried: HashMap<String, usize> = HashMap::new();
    for (i, _) in dashboard.match_indices("minions_") {
        let name: String = dashboard[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base_name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_owned();
        *queried.entry(base_name).or_default() += 1;
    }
    let missing: Vec<&String> = queried.keys().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "the Grafana dashboard queries metrics the watchdog does not export: {missing:?}"
    );
    eprintln!(
        "Grafana dashboard queries {} metrics, all exported",
        queried.len()
    );
    Ok(())
}

/// The first line `minions admin add-viewer|add-operator` prints: the token.
fn token_of(fleet: &Fleet, args: &[&str]) -> Result<String> {
    let said = fleet.cli(args)?;
    Ok(said.lines().next().ok_or("no token printed")?.to_owned())
}

/// A watchdog started with an access file and a trusted proxy: without a
/// credential a page answers 401 with a sign-in form (the API: 401 and
/// `WWW-Authenticate`), `/healthz` answers anyone; a viewer's token reads
/// pages and `/metrics`, a metrics token `/metrics` only; signing in with a
/// token in a real browser sets a cookie that the live page keeps using; a
/// proxy's user header is believed from the proxy's address only; a token
/// added to the access file while the watchdog runs works. A viewer
/// sees no action buttons and an action it posts is refused (403), as is
/// an operator's posted from another site; an operator signed in in the
/// browser drains the worker with its button, and `minions audit` and the
/// page's last actions show it under the operator's name.
#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_asks_for_a_credential() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let access = fleet.dir.path().join("access");
    let file = access.display().to_string();
    let ana = token_of(
        &fleet,
        &["admin", "add-viewer", "ana", "--access-file", &file],
    )?;
    let prom = token_of(
        &fleet,
        &[
            "admin",
            "add-viewer",
            "prom",
            "--metrics-only",
            "--access-file",
            &file,
        ],
    )?;
    let ops = token_of(
        &fleet,
        &["admin", "add-operator", "ops", "--access-file", &file],
    )?;
    let kept = std::fs::read_to_string(&access)?;
    assert!(
        !kept.contains(&ana[4..]) && !kept.contains(&prom[4..]) && !kept.contains(&ops[4..]),
        "{kept}"
    );
    fleet.add_watchdog(&[
        "--http-access",
        &file,
        "--http-trust-header",
        "X-Forwarded-User",
        "--http-trust-proxy",
        "127.0.0.2",
    ])?;
    fleet.add_worker(&["--slots", "1"])?;
    let base = fleet.dashboards[0].clone();
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse()?;
    let me: std::net::IpAddr = "127.0.0.1".parse()?;
    let proxy: std::net::IpAddr = "127.0.0.2".parse()?;
    let ask = |from, path: &str, headers: &[(&str, &str)]| {
        minions_tests::web::request_from(from, addr, "GET", path, headers, "")
    };

    let (code, page) = ask(me, "/", &[])?;
    assert_eq!(code, 401, "{page}");
    assert!(page.contains("action=\"/signin\""), "{page}");
    let (code, api) = ask(me, "/api/fleet", &[])?;
    assert_eq!(code, 401);
    assert!(
        api.to_lowercase().contains("www-authenticate: bearer"),
        "{api}"
    );
    assert_eq!(ask(me, "/healthz", &[])?.0, 200);
    let bearer = format!("Bearer {ana}");
    for path in ["/", "/api/fleet", "/metrics"] {
        let (code, body) = ask(me, path, &[("Authorization", &bearer)])?;
        assert_eq!(code, 200, "viewer {path}: {body:.300}");
    }
    let scraper = format!("Bearer {prom}");
    assert_eq!(ask(me, "/metrics", &[("Authorization", &scraper)])?.0, 200);
    assert_eq!(ask(me, "/", &[("Authorization", &scraper)])?.0, 403);
    let stranger = format!("Bearer mnt_{}", "0".repeat(64));
    assert_eq!(ask(me, "/", &[("Authorization", &stranger)])?.0, 401);
    // The proxy's word, from the proxy only.
    let user = [("X-Forwarded-User", "carol@corp")];
    assert_eq!(ask(proxy, "/api/fleet", &user)?.0, 200);
    assert_eq!(ask(me, "/api/fleet", &user)?.0, 401);
    // A wrong token at the form: 401 and the form again.
    let (code, again) = minions_tests::web::request_from(
        me,
        addr,
        "POST",
        "/signin",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        "token=mnt_nope",
    )?;
    assert_eq!(code, 401);
    assert!(again.contains("not known here"), "{again}");
    // A token added while the watchdog runs works without a restart.
    let late = token_of(
        &fleet,
        &["admin", "add-viewer", "late", "--access-file", &file],
    )?;
    let late = format!("Bearer {late}");
    wait_until(
        "a token added while the watchdog runs",
        Duration::from_secs(10),
        || Ok((ask(me, "/api/fleet", &[("Authorization", &late)])?.0 == 200).then_some(())),
    )?;
    eprintln!(
        "no credential: 401 and a sign-in page; viewer, metrics and proxy credentials as granted; a token added later works"
    );

    // A person signs in from a real browser, and the live page goes on.
    let browser = Browser::start(fleet.dir.path())?;
    browser.open(&format!("{base}/"))?;
    let form = browser.eval("return !!document.querySelector('form[action=\"/signin\"]');")?;
    assert_eq!(form, serde_json::Value::Bool(true));
    browser.eval(&format!(
        "document.querySelector('input[name=token]').value = '{ana}'; document.querySelector('form').submit(); return 1;"
    ))?;
    let workers =
        wait_until(
            "the fleet page after signing in",
            Duration::from_secs(15),
            || {
                Ok(browser
            .eval("return document.querySelector('#live') ? document.location.pathname : null;")?
            .as_str()
            .map(str::to_owned))
            },
        )?;
    assert_eq!(workers, "/");
    // The live refresh fetches with the cookie: the fragment keeps coming.
    let fetched = browser.eval("return fetch('/?fragment=1').then(r => r.status);")?;
    assert_eq!(fetched, serde_json::Value::from(200));
    eprintln!("signed in from the browser; the live page refreshes with the cookie");

    // Viewers see no action; operators act, and the action is on record.
    let worker = wait_until("the worker on the page", Duration::from_secs(30), || {
        Ok(browser
            .eval("const c = document.querySelector('#workers tr.worker .muted'); return c ? c.textContent : null;")?
            .as_str()
            .map(str::to_owned))
    })?;
    let buttons = "return document.querySelectorAll('form.act').length;";
    assert_eq!(browser.eval(buttons)?, serde_json::Value::from(0));
    let drain = format!("/act/worker/{worker}/drain");
    let post = |path: &str, headers: &[(&str, &str)]| {
        minions_tests::web::request_from(me, addr, "POST", path, headers, "")
    };
    let (code, said) = post(&drain, &[("Authorization", &bearer)])?;
    assert_eq!(code, 403, "{said}");
    let operator = format!("Bearer {ops}");
    let (code, said) = post(
        &drain,
        &[
            ("Authorization", &operator),
            ("Origin", "http://elsewhere.example"),
        ],
    )?;
    assert_eq!(code, 403, "{said}");
    assert!(said.contains("another site"), "{said}");
    browser.open(&format!("{base}/signin"))?;
    browser.eval(&format!(
        "document.querySelector('input[name=token]').value = '{ops}'; document.querySelector('form').submit(); return 1;"
    ))?;
    wait_until("the operator's buttons", Duration::from_secs(15), || {
        Ok((browser.eval(buttons)?.as_u64().unwrap_or(0) >= 2).then_some(()))
    })?;
    // The live page redraws its tables as it refreshes: the button is
    // clicked on a pass that finds it.
    let click = format!(
        "const b = document.querySelector('form.act[action=\"{drain}\"] button'); if (!b) return null; b.click(); return 1;"
    );
    wait_until("the drain button", Duration::from_secs(15), || {
        Ok(browser.eval(&click)?.as_u64().map(|_| ()))
    })?;
    let acted = wait_until("the action's outcome", Duration::from_secs(15), || {
        Ok(browser
            .eval("const a = document.querySelector('#acted'); return a ? a.textContent : null;")?
            .as_str()
            .map(str::to_owned))
    })?;
    assert!(
        acted.contains("draining") && acted.contains("asked by ops"),
        "{acted}"
    );
    let audit = fleet.cli(&["audit", "--by", "ops"])?;
    let line = audit
        .lines()
        .find(|l| l.contains(&worker))
        .ok_or_else(|| format!("no action on {worker} in `minions audit`:\n{audit}"))?;
    assert!(
        line.contains("dashboard") && line.contains("drain"),
        "{line}"
    );
    browser.open(&format!("{base}/"))?;
    wait_until(
        "the action among the last ones",
        Duration::from_secs(15),
        || {
            Ok(browser
            .eval("const t = document.querySelector('#actions'); return t && t.textContent.includes('ops') ? 1 : null;")?
            .as_u64())
        },
    )?;
    eprintln!(
        "viewer: no buttons, a posted action 403; operator drained {worker} from the browser:\n{acted}\n{line}"
    );

    // HTTPS from a certificate and key: curl trusts the test authority.
    let (ca, cert, key) = minions_tests::write_test_certs(fleet.dir.path())?;
    fleet.add_watchdog(&[
        "--http-access",
        &file,
        "--http-cert",
        &cert.display().to_string(),
        "--http-key",
        &key.display().to_string(),
    ])?;
    let https = fleet.dashboards[1].replacen("http://", "https://", 1);
    let curl = |path: &str, token: &str| -> Result<String> {
        let out = std::process::Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(&ca)
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("{https}{path}"))
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr))
    };
    assert_eq!(curl("/api/fleet", &ana)?, "200");
    assert_eq!(curl("/api/fleet", &prom)?, "403");
    let plain = get(&format!("{}/api/fleet", fleet.dashboards[1]));
    assert!(
        plain.is_err() || plain.as_ref().is_ok_and(|(code, _)| *code >= 400),
        "plain HTTP answered on the HTTPS port: {plain:?}"
    );
    eprintln!("HTTPS: the viewer reads /api/fleet through a verified certificate");
    Ok(())
}
