//! NATS over TLS: a server that requires TLS refuses a plain connection;
//! a client that does not trust the server's authority is refused with a
//! message that says what to pass; the whole core-path job (10,000 records,
//! 2 workers, a watchdog) runs with every process on TLS.

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use minions_tests::{Fleet, Result, bin, core_job_scenario};

#[test]
fn a_tls_only_server_refuses_plain_connections() -> Result<()> {
    let fleet = Fleet::local_tls()?;
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", fleet.nats.port))?;
    plain.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(plain.try_clone()?);
    let mut info = String::new();
    reader.read_line(&mut info)?;
    assert!(info.contains("\"tls_required\":true"), "{info}");
    plain.write_all(b"CONNECT {\"verbose\":false}\r\nPING\r\n")?;
    let mut rest = String::new();
    let _ = reader.read_line(&mut rest);
    eprintln!("plain client got: {}", rest.trim());
    assert!(!rest.contains("PONG"), "a plain client was served: {rest}");

    // A Minions client that does not trust the server's authority.
    let env: Vec<(String, String)> = fleet
        .cli_env()
        .into_iter()
        .filter(|(k, _)| k != "MINIONS_NATS_CA")
        .collect();
    let out = std::process::Command::new(bin("minions")?)
        .args(["status", "nope"])
        .env_remove("MINIONS_NATS_CA")
        .env("RUST_BACKTRACE", "0")
        .envs(env)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("untrusting client: {}", err.trim());
    assert!(!out.status.success());
    assert!(err.contains("--nats-ca"), "{err}");

    // A CA file that is not there is named.
    let out = std::process::Command::new(bin("minions")?)
        .args(["status", "nope", "--nats-ca", "/nonexistent/ca.pem"])
        .env("RUST_BACKTRACE", "0")
        .envs(fleet.cli_env())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--nats-ca /nonexistent/ca.pem"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_core_path_job_runs_over_tls() -> Result<()> {
    let mut fleet = Fleet::local_tls()?;
    eprintln!("nats-server at {} (TLS only)", fleet.nats.url());
    let r = core_job_scenario(&mut fleet).await;
    fleet.explain(r)
}

#[test]
fn credentials_are_checked_and_wrong_ones_named() -> Result<()> {
    let nats = minions_tests::NatsServer::start_with(&["--user", "bob", "--pass", "s3cret"])?;
    let run = |user: Option<&str>, password: &str| -> Result<(bool, String)> {
        let mut cmd = std::process::Command::new(bin("minions")?);
        cmd.args(["worker", "list", "--nats", &nats.url()])
            .env("RUST_BACKTRACE", "0")
            .env("MINIONS_STORE", "file:///nonexistent-minions-store")
            .env("MINIONS_NATS_PASSWORD", password);
        if let Some(u) = user {
            cmd.args(["--nats-user", u]);
        }
        let out = cmd.output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (ok, err) = run(None, "")?;
    eprintln!("no credentials: {}", err.lines().last().unwrap_or_default());
    assert!(!ok && err.contains("refused the connection"), "{err}");
    let (ok, err) = run(Some("bob"), "wrong")?;
    eprintln!("wrong password: {}", err.lines().last().unwrap_or_default());
    assert!(!ok && err.contains("refused the connection"), "{err}");
    assert!(err.to_lowercase().contains("authorization"), "{err}");
    let (ok, err) = run(Some("bob"), "s3cret")?;
    assert!(ok, "right credentials refused: {err}");
    // Listing reads: it made no registry (one made here would have the
    // CLI's replica count, not the work stream's).
    let url = nats.url();
    let registry = tokio::runtime::Runtime::new()?.block_on(async move {
        let client =
            async_nats::ConnectOptions::with_user_and_password("bob".into(), "s3cret".into())
                .connect(url)
                .await?;
        let js = async_nats::jetstream::new(client);
        Ok::<_, Box<dyn std::error::Error>>(
            js.get_key_value(minions_schemas::streams::WORKERS_BUCKET)
                .await
                .is_ok(),
        )
    });
    assert!(
        !registry.map_err(|e| e.to_string())?,
        "`minions worker list` created the worker registry"
    );
    Ok(())
}
