//! Connecting to the usage ledger (PostgreSQL): the watchdog writes it,
//! `minions usage` and the dashboard read it.
//!
//! The URL is libpq's (`postgres://user:password@host:5432/db?sslmode=…`,
//! or `host=… user=…`). TLS is rustls, trusting the system's roots plus the
//! PEM certificates in the file named by `MINIONS_LEDGER_CA` (for a private
//! authority); `sslmode=prefer` (libpq's default) uses TLS when the server
//! offers it, `require` refuses a server without it. A connect timeout of
//! 10 s applies unless the URL sets `connect_timeout`.

use std::fmt::Write as _;
use std::time::Duration;

use tokio_postgres::Client;

/// The variable naming extra PEM authorities to trust for the ledger.
pub const LEDGER_CA_ENV: &str = "MINIONS_LEDGER_CA";

/// The largest authorities file read.
const MAX_CA_BYTES: u64 = 1 << 20;

/// Why the ledger could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum LedgerConnectError {
    /// The URL does not parse.
    #[error(
        "the ledger URL {url} is not a PostgreSQL connection string ({cause}); write postgres://USER[:PASSWORD]@HOST[:PORT]/DB"
    )]
    Url {
        /// The URL, password hidden.
        url: String,
        /// Why, as the driver says.
        cause: String,
    },
    /// `MINIONS_LEDGER_CA` could not be used.
    #[error("{LEDGER_CA_ENV}={path}: {reason}")]
    Ca {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to the ledger at {url}: {cause}")]
    Connect {
        /// The URL, password hidden.
        url: String,
        /// Why, as the driver and server say.
        cause: String,
    },
}

/// `url` with its password replaced by `***`, for messages: the
/// `USER:PASSWORD@` of a URL and a `password=` query parameter, or the
/// `password=` of a `key=value` connection string.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return redact_key_value(url);
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    // The last `@` ends the user info (a password with a raw `@`, `/` or
    // `?` in it is then still hidden).
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => {
            let info = &rest[..at];
            let info = match info.split_once(':') {
                Some((user, _)) => format!("{user}:***@"),
                None => format!("{info}@"),
            };
            (info, &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let after = match after.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => after.to_owned(),
    };
    format!("{head}{userinfo}{after}")
}

/// [`redact`] for `host=... password=...` connection strings (values may
/// be single-quoted with backslash escapes).
fn redact_key_value(s: &str) -> String {
    const KEY: &str = "password";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    loop {
        // ASCII lowercasing keeps byte offsets.
        let Some(i) = rest.to_ascii_lowercase().find(KEY) else {
            out.push_str(rest);
            return out;
        };
        let after_key = &rest[i + KEY.len()..];
        let at_start = i == 0 || rest[..i].ends_with(char::is_whitespace);
        let Some(value) = after_key
            .trim_start()
            .strip_prefix('=')
            .filter(|_| at_start)
        else {
            out.push_str(&rest[..i + KEY.len()]);
            rest = after_key;
            continue;
        };
        let value = value.trim_start();
        let len = match value.strip_prefix('\'') {
            Some(quoted) => {
                let mut escaped = false;
                let mut end = quoted.len();
                for (j, c) in quoted.char_indices() {
                    match c {
                        _ if escaped => escaped = false,
                        '\\' => escaped = true,
                        '\'' => {
                            end = j + 1;
                            break;
                        }
                        _ => {}
                    }
                }
                end + 1
            }
            None => value.find(char::is_whitespace).unwrap_or(value.len()),
        };
        out.push_str(&rest[..i]);
        out.push_str("password=***");
        rest = &value[len.min(value.len())..];
    }
}

/// The driver's error with its causes, or the server's message and code.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let _ = write!(text, ": {c}");
        cause = c.source();
    }
    text
}

/// A ledger figure for people: `v` with `decimals` decimals, or with two
/// significant digits where that would show a small value as 0 (a short
/// job's device time is a few thousandths of an hour).
pub fn amount(v: f64, decimals: usize) -> String {
    if v <= 0.0 || !v.is_finite() || v >= 10f64.powi(-i32::try_from(decimals).unwrap_or(9)) {
        return format!("{v:.decimals$}");
    }
    let d = (-v.log10()).ceil() as usize + 1;
    format!("{v:.d$}")
}

/// The TLS settings: the system's roots and `MINIONS_LEDGER_CA`'s.
fn tls() -> Result<tokio_postgres_rustls::MakeRustlsConnect, LedgerConnectError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = std::env::var_os(LEDGER_CA_ENV) {
        let shown = path.to_string_lossy().into_owned();
        let ca_err = |reason: String| LedgerConnectError::Ca {
            path: shown.clone(),
            reason,
        };
        let size = std::fs::metadata(&path)
            .map_err(|e| ca_err(e.to_string()))?
            .len();
        if size > MAX_CA_BYTES {
            return Err(ca_err(format!(
                "{size} bytes, more than the {MAX_CA_BYTES} an authorities file may have"
            )));
        }
        let bytes = std::fs::read(&path).map_err(|e| ca_err(e.to_string()))?;
        use rustls_pki_types::pem::PemObject;
        let mut added = 0;
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&bytes) {
            let cert = cert.map_err(|e| ca_err(format!("not PEM certificates: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| ca_err(format!("a certificate is not usable: {e}")))?;
            added += 1;
        }
        if added == 0 {
            return Err(ca_err("holds no certificate".to_owned()));
        }
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Connects to the ledger at `url` as `app` (its `application_name`); the
/// connection runs on a task of its own and ends when the client is
/// dropped.
pub async fn connect(url: &str, app: &str) -> Result<Client, LedgerConnectError> {
    connect_within(url, app, Duration::from_secs(10)).await
}

/// [`connect`], giving up after `timeout` unless the URL sets its own
/// `connect_timeout`.
pub async fn connect_within(
    url: &str,
    app: &str,
    timeout: Duration,
) -> Result<Client, LedgerConnectError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| LedgerConnectError::Url {
        url: redact(url),
        cause: describe(&e),
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(timeout);
    }
    if config.get_application_name().is_none() {
        config.application_name(app);
    }
    let (client, conn) = config
        .connect(tls()?)
        .await
        .map_err(|e| LedgerConnectError::Connect {
            url: redact(url),
            cause: describe(&e),
        })?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %describe(&e), "ledger connection ended");
        }
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_amounts_keep_two_significant_digits() {
        assert_eq!(amount(0.0, 2), "0.00");
        assert_eq!(amount(3.456, 2), "3.46");
        assert_eq!(amount(3.5, 2), "3.50");
        assert_eq!(amount(0.01, 2), "0.01");
        assert_eq!(amount(0.0012, 2), "0.0012");
        assert_eq!(amount(0.00087, 2), "0.00087");
        assert_eq!(amount(0.012, 3), "0.012");
        assert_eq!(amount(0.00012, 3), "0.00012");
        assert_eq!(amount(0.0000033, 3), "0.0000033");
        assert_eq!(amount(0.25, 3), "0.250");
    }

    #[test]
    fn redaction_hides_the_password_only() {
        assert_eq!(
            redact("postgres://ledger:s3cret@db.example:5432/minions"),
            "postgres://ledger:***@db.example:5432/minions"
        );
        assert_eq!(
            redact("postgres://ledger@127.0.0.1:5433/postgres"),
            "postgres://ledger@127.0.0.1:5433/postgres"
        );
        assert_eq!(
            redact("host=db user=ledger password=s3cret"),
            "host=db user=ledger password=***"
        );
    }

    #[tokio::test]
    async fn a_bad_url_and_an_unreachable_server_say_where() {
        let e = connect("postgres://u:pw@db:notaport/x", "test").await.err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("ledger URL") && !text.contains("pw@"),
            "{text}"
        );
        let e = connect("postgres://u:pw@127.0.0.1:1/x?connect_timeout=2", "test")
            .await
            .err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("cannot connect to the ledger at postgres://u:***@127.0.0.1:1/x"),
            "{text}"
        );
    }
}
