//! Connecting to NATS, with credentials and TLS, and checking the server is
//! new enough.

use std::path::{Path, PathBuf};
use std::time::Duration;

use minions_schemas::streams::check_server_version;

/// The default NATS URL.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// Why a NATS connection could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NatsConnectError {
    /// No connection could be made.
    #[error(
        "cannot connect to NATS at {url}: {source} (is nats-server running? `minions dev` starts one)"
    )]
    Connect {
        /// The URL.
        url: String,
        /// The client's complaint.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The server is too old or says something unreadable.
    #[error("{0}")]
    Version(String),
    /// A credentials or TLS file named by a flag cannot be read.
    #[error("{flag} {path}: {reason}")]
    File {
        /// The flag (or its environment variable) that names the file.
        flag: &'static str,
        /// The path given.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// The server refused the connection (TLS, credentials).
    #[error("{0}")]
    Refused(String),
    /// The settings contradict each other.
    #[error("{0}")]
    Settings(String),
    /// A server address in the URL list cannot be read.
    #[error(
        "NATS URL {given:?}: {reason} (give one URL or several separated by commas, e.g. nats://a:4222,nats://b:4222)"
    )]
    Url {
        /// The address that could not be read.
        given: String,
        /// Why.
        reason: String,
    },
    /// The server runs without JetStream.
    #[error(
        "nats-server at {url} runs without JetStream; start it with -js (or `jetstream {{}}` in its config)"
    )]
    NoJetStream {
        /// The URL.
        url: String,
    },
}

/// Who a program is to NATS and how it checks the server: credentials and
/// TLS. Every binary takes these as flags or environment variables; all are
/// optional (a development server needs none).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NatsSecurity {
    /// Settings file (TOML) with any of: nats, store, nats_creds, nats_nkey,
    /// nats_user, nats_password, nats_ca, nats_cert, nats_key, nats_tls.
    /// Flags and environment variables win over it. Default:
    /// minions/config.toml in the user's config dir, if it exists.
    #[arg(long, global = true, env = "MINIONS_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// NATS credentials file (a user JWT and its nkey seed, as `nsc` writes
    /// them) for servers in operator/JWT mode.
    #[arg(long, global = true, env = "MINIONS_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// File holding an nkey seed (`SU...`) for servers that list nkey users.
    #[arg(long, global = true, env = "MINIONS_NATS_NKEY", value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
    /// User name for servers that list users with passwords; the password is
    /// read from MINIONS_NATS_PASSWORD (never a flag: flags show in `ps`).
    #[arg(long, global = true, env = "MINIONS_NATS_USER", value_name = "NAME")]
    pub nats_user: Option<String>,
    /// The password of --nats-user.
    #[arg(skip = std::env::var("MINIONS_NATS_PASSWORD").ok())]
    pub nats_password: Option<String>,
    /// PEM file of the certificate authorities to trust for the server's TLS
    /// certificate (instead of the system's). Implies TLS.
    #[arg(long, global = true, env = "MINIONS_NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,
    /// PEM client certificate, for servers that verify clients (mutual TLS);
    /// needs --nats-key.
    #[arg(
        long,
        global = true,
        env = "MINIONS_NATS_CERT",
        value_name = "FILE",
        requires = "nats_key"
    )]
    pub nats_cert: Option<PathBuf>,
    /// PEM private key of --nats-cert.
    #[arg(
        long,
        global = true,
        env = "MINIONS_NATS_KEY",
        value_name = "FILE",
        requires = "nats_cert"
    )]
    pub nats_key: Option<PathBuf>,
    /// Require TLS even without --nats-ca (the system's authorities are
    /// trusted). A `tls://` URL does the same.
    #[arg(long, global = true, env = "MINIONS_NATS_TLS")]
    pub nats_tls: bool,
}

fn readable(flag: &'static str, path: &Path) -> Result<(), NatsConnectError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(NatsConnectError::File {
            flag,
            path: path.to_owned(),
            reason: "not a file".to_owned(),
        }),
        Err(e) => Err(NatsConnectError::File {
            flag,
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// Chooses rustls's `ring` backend (the one async-nats is built with) as the
/// process default. Other crates in the build enable a second backend, and
/// rustls then refuses to guess. Safe to call more than once.
pub fn init_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl NatsSecurity {
    /// Who this program is, for the record (a job's `submitter`): the NATS
    /// user, else the nkey or credentials file's name, else the OS user at
    /// this host. At most 128 characters.
    pub fn identity_name(&self) -> String {
        let file_stem =
            |p: &std::path::Path| p.file_stem().map(|s| s.to_string_lossy().into_owned());
        let name = self
            .nats_user
            .clone()
            .or_else(|| self.nats_nkey.as_deref().and_then(file_stem))
            .or_else(|| self.nats_creds.as_deref().and_then(file_stem))
            .unwrap_or_else(|| {
                let user = std::env::var("USER")
                    .or_else(|_| std::env::var("LOGNAME"))
                    .or_else(|_| std::env::var("USERNAME"))
                    .unwrap_or_else(|_| "unknown".to_owned());
                format!("{user}@{}", super::host::host_name())
            });
        name.chars().take(128).collect()
    }

    /// Whether TLS is required of the connection.
    pub fn tls(&self, url: &str) -> bool {
        self.nats_tls
            || self.nats_ca.is_some()
            || self.nats_cert.is_some()
            || url.split(',').any(|u| u.trim().starts_with("tls://"))
    }

    /// Connect options carrying these settings; every named file is checked
    /// first, so a wrong path fails with the flag and path named.
    pub async fn options(&self, url: &str) -> Result<async_nats::ConnectOptions, NatsConnectError> {
        init_tls();
        let ways = [
            self.nats_creds.is_some(),
            self.nats_nkey.is_some(),
            self.nats_user.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() > 1 {
            return Err(NatsConnectError::Settings(
                "give one of --nats-creds, --nats-nkey and --nats-user, not several".to_owned(),
            ));
        }
        let mut o = if let Some(path) = &self.nats_creds {
            readable("--nats-creds", path)?;
            async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| NatsConnectError::File {
                    flag: "--nats-creds",
                    path: path.clone(),
                    reason: format!("not a NATS credentials file: {e}"),
                })?
        } else if let Some(path) = &self.nats_nkey {
            readable("--nats-nkey", path)?;
            let seed = std::fs::read_to_string(path).map_err(|e| NatsConnectError::File {
                flag: "--nats-nkey",
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let seed = seed.trim().to_owned();
            if !seed.starts_with('S') {
                return Err(NatsConnectError::File {
                    flag: "--nats-nkey",
                    path: path.clone(),
                    reason: "does not hold an nkey seed (a line starting with S)".to_owned(),
                });
            }
            async_nats::ConnectOptions::with_nkey(seed)
        } else if let Some(user) = &self.nats_user {
            let Some(password) = &self.nats_password else {
                return Err(NatsConnectError::Settings(format!(
                    "--nats-user {user} needs its password in MINIONS_NATS_PASSWORD"
                )));
            };
            async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
        } else {
            async_nats::ConnectOptions::new()
        };
        if let Some(ca) = &self.nats_ca {
            readable("--nats-ca", ca)?;
            o = o.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.nats_cert, &self.nats_key) {
            readable("--nats-cert", cert)?;
            readable("--nats-key", key)?;
            o = o.add_client_certificate(cert.clone(), key.clone());
        }
        if self.tls(url) {
            o = o.require_tls(true);
        }
        Ok(o)
    }
}

/// Most servers one URL list may name.
pub const MAX_SERVERS: usize = 32;

/// Reads a server list: one URL, or several separated by commas (the
/// servers of one cluster; the client picks any and moves to another when
/// it is lost). Empty entries are refused, as are more than
/// [`MAX_SERVERS`].
pub fn server_addrs(url: &str) -> Result<Vec<async_nats::ServerAddr>, NatsConnectError> {
    let parts: Vec<&str> = url.split(',').map(str::trim).collect();
    if parts.len() > MAX_SERVERS {
        return Err(NatsConnectError::Url {
            given: url.to_owned(),
            reason: format!("{} servers named, at most {MAX_SERVERS}", parts.len()),
        });
    }
    parts
        .into_iter()
        .map(|part| {
            if part.is_empty() {
                return Err(NatsConnectError::Url {
                    given: url.to_owned(),
                    reason: "an empty entry".to_owned(),
                });
            }
            part.parse::<async_nats::ServerAddr>()
                .map_err(|e| NatsConnectError::Url {
                    given: part.to_owned(),
                    reason: e.to_string(),
                })
        })
        .collect()
}

fn refusal_feed() -> &'static tokio::sync::broadcast::Sender<String> {
    static FEED: std::sync::OnceLock<tokio::sync::broadcast::Sender<String>> =
        std::sync::OnceLock::new();
    FEED.get_or_init(|| tokio::sync::broadcast::channel(64).0)
}

/// The permission refusals ("Permissions Violation for Publish to ...") that
/// servers report to this process's connections made by [`connect`], from
/// the moment of the call on. A program checks with it that its identity
/// may do what it is about to rely on.
pub fn refusals() -> tokio::sync::broadcast::Receiver<String> {
    refusal_feed().subscribe()
}

/// How a request that watched for the server's refusal ended
/// ([`request_watched`]).
pub enum Asked {
    /// The answer.
    Answer(async_nats::Message),
    /// The server refused this identity the subject.
    Refused,
    /// Nobody listens on the subject.
    NoResponders,
    /// No answer within the time given.
    TimedOut,
    /// The request failed otherwise.
    Failed(String),
}

/// Sends `payload` as a request on `subject` and waits up to `within` for
/// the answer, or for the server's refusal of the subject to this
/// identity (which comes back on the connection, not as the answer).
pub async fn request_watched(
    client: &async_nats::Client,
    subject: String,
    payload: bytes::Bytes,
    within: Duration,
) -> Asked {
    // Listening before asking.
    let refusals = refusals();
    let request = client.request(subject.clone(), payload);
    let refused = refused_on(refusals, &subject);
    let answer = tokio::select! {
        a = tokio::time::timeout(within, request) => a,
        () = refused => return Asked::Refused,
    };
    match answer {
        Ok(Ok(m)) => Asked::Answer(m),
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => Asked::NoResponders,
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::TimedOut => Asked::TimedOut,
        Ok(Err(e)) => Asked::Failed(e.to_string()),
        Err(_) => Asked::TimedOut,
    }
}

/// Resolves once `refusals` (taken from [`refusals`] before publishing)
/// reports a refusal naming `subject`; never, if none comes.
async fn refused_on(mut refusals: tokio::sync::broadcast::Receiver<String>, subject: &str) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match refusals.recv().await {
            Ok(text) if text.contains(subject) => return,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Connects to `url` (one server, or a cluster's servers separated by
/// commas) as `name` (shown in the server's connection list) with
/// `security`, waits for the server's greeting, and refuses servers older
/// than [`minions_schemas::streams::MIN_SERVER_VERSION`] or without JetStream. A
/// refused TLS handshake or credential fails at once with its cause.
pub async fn connect(
    url: &str,
    security: &NatsSecurity,
    name: &str,
) -> Result<async_nats::Client, NatsConnectError> {
    let servers = server_addrs(url)?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(4);
    let client = security
        .options(url)
        .await?
        .name(name)
        .connection_timeout(Duration::from_secs(5))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ClientError(e) = &event {
                    let _ = tx.try_send(e.to_string());
                } else if let async_nats::Event::ServerError(e) = &event {
                    let text = e.to_string();
                    if text.to_lowercase().contains("permissions violation") {
                        let _ = refusal_feed().send(text.clone());
                        tracing::warn!(error = %text, "the NATS server refused an action to this identity: see its permissions in the server's config (a worker machine's identity works only with the --name it was issued for; a producer's only for its teams and priorities)");
                    }
                    let _ = tx.try_send(text);
                }
            }
        })
        .connect(servers)
        .await
        .map_err(|source| NatsConnectError::Connect {
            url: url.to_owned(),
            source,
        })?;
    // With retry_on_initial_connect, connect() returns before the greeting;
    // wait for it (bounded), so a wrong URL fails with a clear message.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The greeting usually comes within a millisecond on a LAN: poll from
    // 1 ms, backing off to 50 ms (a fixed 50 ms was most of a submit).
    let mut pause = Duration::from_millis(1);
    loop {
        let info = client.server_info();
        if !info.version.is_empty() {
            check_server_version(&info.version).map_err(NatsConnectError::Version)?;
            if !info.jetstream {
                return Err(NatsConnectError::NoJetStream {
                    url: url.to_owned(),
                });
            }
            return Ok(client);
        }
        if let Ok(problem) = rx.try_recv() {
            let hint = if problem.to_lowercase().contains("authorization") {
                "the server does not accept these credentials"
            } else if security.tls(url) {
                "check --nats-ca (the authority that signed the server's certificate) and the host name in the URL"
            } else {
                "if the server requires TLS, pass --nats-ca or use a tls:// URL"
            };
            return Err(NatsConnectError::Refused(format!(
                "NATS at {url} refused the connection: {problem} ({hint}; credentials are given with --nats-creds, --nats-nkey or --nats-user)"
            )));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(NatsConnectError::Version(format!(
                "no answer from NATS at {url} within 10 s (is nats-server running? `minions dev` starts one)"
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lists() {
        let one = server_addrs("nats://127.0.0.1:4222").map(|v| v.len());
        assert_eq!(one.ok(), Some(1));
        let three = server_addrs("nats://a:4222, nats://b:4223,tls://c:4224").map(|v| v.len());
        assert_eq!(three.ok(), Some(3));
        let empty = server_addrs("nats://a:4222,,nats://b:4222").err();
        assert!(
            empty.is_some_and(|e| e.to_string().contains("empty entry")),
            "an empty entry must be refused"
        );
        let bad = server_addrs("nats://a:4222,http://b:4222")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(bad.contains("http://b:4222"), "{bad}");
        let many = vec!["nats://a:4222"; MAX_SERVERS + 1].join(",");
        assert!(server_addrs(&many).is_err());
        let s = NatsSecurity::default();
        assert!(s.tls("nats://a:4222,tls://b:4222"));
        assert!(!s.tls("nats://a:4222,nats://b:4222"));
    }

    #[test]
    fn the_identity_is_the_user_then_the_key_file() {
        let mut s = NatsSecurity {
            nats_nkey: Some("keys/search-team.nk".into()),
            ..Default::default()
        };
        assert_eq!(s.identity_name(), "search-team");
        s.nats_user = Some("producer".into());
        assert_eq!(s.identity_name(), "producer");
        assert!(NatsSecurity::default().identity_name().contains('@'));
    }
}
