//! What a new user meets first, without a fleet: an error exit prints one
//! message (no backtrace frames, no library log lines) unless `-v` asks for
//! more; the shell completion scripts parse; the man page renders.

use std::process::{Command, Output};

use minions_tests::{Result, bin};

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
