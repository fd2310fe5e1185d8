//! `minions-worker doctor` on this machine prints every signal it can read
//! and says plainly which it cannot, and whether NATS and the store work.

use std::process::{Command, Stdio};

use minions_tests::{NatsServer, Result, bin, scratch};

fn doctor(args: &[&str]) -> Result<String> {
    let out = Command::new(bin("minions-worker")?)
        .arg("doctor")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()?;
    assert!(
        out.status.success(),
        "doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn doctor_reports_every_signal_and_endpoint() -> Result<()> {
    let nats = NatsServer::start()?;
    let dir = scratch("minions-doctor-")?;
    let signal = dir.path().join("owner");
    std::fs::write(&signal, "input_idle_secs=42\n")?;
    let store = format!("file://{}", dir.path().join("store").display());
    let owner = format!("file:{}", signal.display());
    let report = doctor(&[
        "--nats",
        &nats.url(),
        "--store",
        &store,
        "--owner-signal",
        &owner,
    ])?;
    eprintln!("{report}");
    let line = |needle: &str| {
        report
            .lines()
            .find(|l| l.contains(needle))
            .map(str::to_owned)
    };
    for source in ["loadavg", "logind", "nvidia-smi"] {
        let l = line(&format!(" {source}")).ok_or(format!("no line for {source}"))?;
        assert!(l.contains("ok:") || l.contains("cannot read"), "{l}");
    }
    assert!(
        line("input idle 42 s").is_some_and(|l| l.contains("ok:")),
        "{report}"
    );
    assert!(
        line("nats ").is_some_and(|l| l.contains("ok:") && l.contains("JetStream")),
        "{report}"
    );
    assert!(
        line("store ").is_some_and(|l| l.contains("ok:")),
        "{report}"
    );
    assert!(
        line("device ").is_some_and(|l| l.contains("ok: cpu")),
        "{report}"
    );
    // The CPU kernels' path, chosen at run time; a cap holds it lower.
    assert!(
        line("cpu kernels ").is_some_and(|l| l.contains("ok:")
            && ["portable", "avx2", "vnni", "avx512"]
                .iter()
                .any(|p| l.contains(p))),
        "{report}"
    );
    assert!(
        line("engine path ").is_some_and(|l| l.contains("fast:")),
        "{report}"
    );
    assert!(
        line("canary ").is_some_and(|l| l.contains("ok:")),
        "{report}"
    );
    // A cap on the kernels' path, and the device path: the canary runs the
    // code a GPU runs, on this CPU, and passes.
    let out = Command::new(bin("minions-worker")?)
        .args(["doctor", "--nats", &nats.url(), "--store", &store])
        .env("RUST_LOG", "warn")
        .env("MINIONS_CPU_PATH", "portable")
        .env("MINIONS_ENGINE_PATH", "device")
        .stdin(Stdio::null())
        .output()?;
    let capped = String::from_utf8_lossy(&out.stdout).into_owned();
    let has = |start: &str, part: &str| {
        capped
            .lines()
            .any(|l| l.starts_with(start) && l.contains(part))
    };
    assert!(has("cpu kernels", "ok: portable"), "{capped}");
    assert!(has("engine path", "device:"), "{capped}");
    assert!(has("canary", "ok:"), "{capped}");

    drop(nats);
    let report = doctor(&["--nats", "nats://127.0.0.1:1", "--store", &store])?;
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("nats") && l.contains("cannot")),
        "{report}"
    );
    Ok(())
}

#[test]
fn install_writes_a_user_service_and_uninstall_removes_it() -> Result<()> {
    let dir = scratch("minions-service-")?;
    let units = dir.path().join("units");
    let units_s = units.display().to_string();
    let run = |args: &[&str]| -> Result<()> {
        let out = Command::new(bin("minions-worker")?)
            .args(args)
            .env("RUST_LOG", "warn")
            .output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    run(&[
        "--slots",
        "3",
        "install",
        "--unit-dir",
        &units_s,
        "--no-start",
        "--nats",
        "nats://fleet:4222",
        "--store",
        "s3://bucket",
    ])?;
    let files: Vec<_> = std::fs::read_dir(&units)?.collect::<std::result::Result<_, _>>()?;
    assert_eq!(files.len(), 1);
    let text = std::fs::read_to_string(files[0].path())?;
    eprintln!("{text}");
    let exec = text
        .lines()
        .find(|l| l.starts_with("ExecStart=") || l.contains("<string>--nats</string>"))
        .ok_or("no command line in the service file")?;
    if exec.starts_with("ExecStart=") {
        assert!(
            exec.contains(" --slots 3 --nats nats://fleet:4222 --store s3://bucket --cache-dir /"),
            "{exec}"
        );
    }
    run(&["uninstall", "--unit-dir", &units_s, "--no-stop"])?;
    assert_eq!(std::fs::read_dir(&units)?.count(), 0);
    Ok(())
}
