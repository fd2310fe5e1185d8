//! Every binary refuses a nats-server older than 2.11 with a clear message.
//! Uses Debian's nats-server 2.9 package, which `tests/run.sh` unpacks into
//! .tools/ where apt is available.

use std::process::{Command, Stdio};
use std::time::Duration;

use minions_tests::ports::wait_nats;
use minions_tests::{Proc, Result, bin, scratch};

#[test]
fn binaries_refuse_servers_older_than_2_11() -> Result<()> {
    let Some(old) = std::env::var_os("MINIONS_OLD_NATS_BIN") else {
        if std::env::var_os("CI").is_some() {
            return Err("MINIONS_OLD_NATS_BIN is not set; tests/run.sh sets it from Debian's nats-server package".into());
        }
        eprintln!("skipped: no old nats-server (MINIONS_OLD_NATS_BIN) on this machine");
        return Ok(());
    };
    let dir = scratch("minions-old-nats-")?;
    // It binds a port of its own choosing, which its ports file names.
    let args: Vec<String> = vec![
        "-js".into(),
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        "-1".into(),
        "-sd".into(),
        dir.path().join("js").display().to_string(),
        "--server_name".into(),
        "old".into(),
        "--ports_file_dir".into(),
        dir.path().display().to_string(),
    ];
    let mut server = Proc::spawn(
        "old-nats",
        std::path::Path::new(&old),
        &args,
        &[],
        dir.path(),
    )?;
    let port = wait_nats(&mut server, dir.path(), "old", Duration::from_secs(15))?.client;
    let url = format!("nats://127.0.0.1:{port}");
    let store = format!("file://{}", dir.path().join("store").display());
    for (name, args) in [
        ("minions-worker", vec!["--nats", &url, "--store", &store]),
        ("minions-watchdog", vec!["--nats", &url]),
        (
            "minions",
            vec!["--nats", &url, "--store", &store, "status", "somejob"],
        ),
    ] {
        let out = Command::new(bin(name)?)
            .args(&args)
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} ran against nats-server 2.9");
        let line = err
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default();
        assert!(
            line.contains("too old") && line.contains("2.11"),
            "{name}: {err}"
        );
        eprintln!("{name}: {line}");
    }
    Ok(())
}
