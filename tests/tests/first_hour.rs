//! What a new user meets first: an error exit prints one message (no
//! backtrace frames, no library log lines) unless `-v` asks for more; the
//! shell completion scripts parse; the man page renders; the worker
//! service installs, starts under systemd and reports its canary.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::Duration;

use minions_tests::{Fleet, PrivateSystemd, Result, bin};

/// `minions ARGS` with `env` set, against a NATS URL nothing listens on.
fn minions(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(Command::new(bin("minions")?)
        .args(args)
        .env("MINIONS_NATS_URL", format!("nats://127.0.0.1:{port}"))
        .env_remove("RUST_LOG")
        .env_remove("MINIONS_DEBUG")
        .envs(env.iter().copied())
        .output()?)
}

#[test]
fn an_error_is_one_message_unless_verbose() -> Result<()> {
    let out = minions(&["status", "nope"], &[("RUST_BACKTRACE", "1")])?;
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("plain:\n{err}");
    assert!(!out.status.success());
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].starts_with("error: NATS at nats://127.0.0.1:"),
        "{err}"
    );
    assert!(lines[0].contains("refused the connection"), "{err}");

    for (args, env) in [
        (vec!["-v", "status", "nope"], vec![("RUST_BACKTRACE", "1")]),
        (
            vec!["status", "nope"],
            vec![("RUST_BACKTRACE", "1"), ("MINIONS_DEBUG", "1")],
        ),
    ] {
        let out = minions(&args, &env)?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        // The library's own lines, our debug lines and the backtrace.
        assert!(err.contains("async_nats"), "{err}");
        assert!(err.contains("backtrace:\n"), "{err}");
        assert!(err.contains("error: NATS at"), "{err}");
    }
    Ok(())
}

#[test]
fn completion_scripts_parse_and_the_man_page_renders() -> Result<()> {
    for (shell, checker) in [("bash", "bash"), ("zsh", "zsh")] {
        let out = minions(&["completions", shell], &[])?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script =
            std::env::temp_dir().join(format!("minions-completion-{}.{shell}", std::process::id()));
        std::fs::write(&script, &out.stdout)?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("submit") && text.contains("collect"),
            "{shell}"
        );
        // zsh may not be installed; bash always is where the tests run.
        match Command::new(checker).arg("-n").arg(&script).output() {
            Ok(check) => assert!(
                check.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&check.stderr)
            ),
            Err(e) if shell != "bash" => eprintln!("{shell} not checked: {e}"),
            Err(e) => return Err(e.into()),
        }
        std::fs::remove_file(&script)?;
    }
    for shell in ["fish", "powershell"] {
        let out = minions(&["completions", shell], &[])?;
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let out = minions(&["man"], &[])?;
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(page.contains(".TH minions 1"), "{page}");
    for sub in ["submit", "status", "collect", "completions"] {
        assert!(page.contains(sub), "the man page names {sub}");
    }
    Ok(())
}

/// `text` of `out`'s stdout and stderr, for messages.
fn said(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `minions-worker install --system` under a real systemd (a private one,
/// see [`PrivateSystemd`]): a worker that cannot reach NATS is reported as
/// stopped, with why; one that can runs its canary, judged by the fleet's
/// watchdog, as the account asked for, with its logs where install said;
/// `uninstall` stops and removes it.
#[test]
fn the_installed_service_starts_under_systemd_and_reports_its_canary() -> Result<()> {
    if let Some(why) = PrivateSystemd::unavailable() {
        eprintln!("the service is not started under systemd here: {why}");
        return Ok(());
    }
    let mut fleet = Fleet::local()?;
    fleet.add_watchdog(&[])?;
    // The service runs as `daemon`: let it reach the store.
    let store = fleet.dir.path().join("store");
    std::fs::create_dir_all(&store)?;
    for dir in [fleet.dir.path(), store.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    }
    let systemd = PrivateSystemd::boot(
        &fleet.dir.path().join("systemd-console.log"),
        Duration::from_secs(30),
    )?;
    let worker = bin("minions-worker")?.display().to_string();
    let install = |nats: &str| {
        systemd.run(&[
            &worker,
            "--nats",
            nats,
            "--store",
            &fleet.store_url,
            "--name",
            "svc",
            "install",
            "--system",
            "--run-as",
            "daemon",
            "--wait",
            "60",
        ])
    };
    let unit = "minions-worker.service";

    // Nothing listens there: the worker stops, and install says why.
    let nowhere = format!(
        "nats://127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port()
    );
    let out = install(&nowhere)?;
    let text = said(&out);
    eprintln!("no NATS:\n{text}");
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("the service started, but the worker stopped: NATS at"),
        "{text}"
    );
    assert!(text.contains("refused the connection"), "{text}");
    assert!(text.contains(&format!("journalctl -u {unit} -f")), "{text}");

    // Installed again with the fleet's NATS: restarted with the new flags,
    // its canary passes, judged by the watchdog.
    let out = install(&fleet.nats_url())?;
    let text = said(&out);
    eprintln!("with NATS:\n{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("(a service of this machine, run as daemon) and started it"),
        "{text}"
    );
    assert!(text.contains("canary passed, judged by watchdog"), "{text}");
    let active = systemd.run(&["systemctl", "is-active", unit])?;
    assert_eq!(String::from_utf8_lossy(&active.stdout).trim(), "active");
    let owner = systemd.run(&[
        "stat",
        "-c",
        "%U",
        "/var/cache/minions-worker/last-start.json",
    ])?;
    assert_eq!(String::from_utf8_lossy(&owner.stdout).trim(), "daemon");
    let journal = systemd.run(&["journalctl", "-u", unit, "--no-pager"])?;
    let log = String::from_utf8_lossy(&journal.stdout);
    assert!(log.contains("canary passed"), "journal:\n{log}");

    let out = systemd.run(&[&worker, "uninstall", "--system"])?;
    let text = said(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("removed /etc/systemd/system/minions-worker.service"),
        "{text}"
    );
    let active = systemd.run(&["systemctl", "is-active", unit])?;
    assert_ne!(String::from_utf8_lossy(&active.stdout).trim(), "active");
    Ok(())
}
