//! What `minions dev` tells a person once its fleet runs: where the
//! dashboard is and the commands to try next, in another terminal.

/// The dashboard address for the watchdog's `--listen`: `listen` itself, or
/// with port 0 a free loopback port picked now, so that it can be printed
/// before the watchdog starts (None: `off`).
pub(super) fn dashboard_listen(listen: &str) -> std::io::Result<Option<String>> {
    if listen == "off" {
        return Ok(None);
    }
    match listen.strip_suffix(":0") {
        Some(host) => {
            let port = std::net::TcpListener::bind((host, 0))?.local_addr()?.port();
            Ok(Some(format!("{host}:{port}")))
        }
        None => Ok(Some(listen.to_owned())),
    }
}

/// The block printed (on stderr: stdout carries the `export` lines scripts
/// read) once the fleet is started.
pub(super) fn text(nats_url: &str, dashboard: Option<&str>, workers: u16) -> String {
    let dash = dashboard.map_or_else(
        || "off (--dashboard HOST:PORT serves one)".to_owned(),
        |d| format!("http://{d}/"),
    );
    format!(
        "\nminions dev: a fleet of {workers} worker{} is starting.\n\
         \x20 dashboard  {dash}\n\
         \x20 stop       Ctrl-C\n\
         \nTry, in another terminal:\n\
         \x20 export MINIONS_NATS_URL={nats_url}\n\
         \x20 minions model push ./all-MiniLM-L6-v2 --name minilm     # a sentence-embedding model folder\n\
         \x20 JOB=$(minions submit --model minilm --input docs.jsonl)  # one {{\"text\": ...}} per line\n\
         \x20 minions watch $JOB                                       # live progress until it ends\n\
         \x20 minions jobs                                             # every job, newest first\n\
         \x20 minions collect $JOB --output vectors.npy\n",
        if workers == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_of_zero_is_picked_and_printed() -> std::io::Result<()> {
        assert_eq!(dashboard_listen("off")?, None);
        assert_eq!(
            dashboard_listen("127.0.0.1:8080")?.as_deref(),
            Some("127.0.0.1:8080")
        );
        let picked = dashboard_listen("127.0.0.1:0")?.unwrap_or_default();
        assert!(
            picked.starts_with("127.0.0.1:") && !picked.ends_with(":0"),
            "{picked}"
        );
        let t = text("nats://127.0.0.1:4222", Some(&picked), 2);
        assert!(t.contains(&format!("http://{picked}/")));
        assert!(t.contains("export MINIONS_NATS_URL=nats://127.0.0.1:4222"));
        Ok(())
    }
}
